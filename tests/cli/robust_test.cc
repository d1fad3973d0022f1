// Issue 37: what `moelab config check` promises, the `--db` rule, damaged checkpoints on
// resume, and `db show RUN`.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "core/train/checkpoint.h"
#include "db/reader.h"
#include "tests/cli/cli_fixture.h"
#include "tests/common/test_util.h"

namespace moelab {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::Slurp;
using test::Wait;

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)
#define EXPECT_LACKS(text, part) EXPECT_EQ((text).find(part), std::string::npos) << (text)

class RobustTest : public CliTest {
 protected:
  // Runs a two-run sweep (moe.experts_total 4 and 8) named `name` into db_; returns its spec.
  std::string RunTwoRunSweep(const std::string& name) {
    json spec = {{"name", name},
                 {"base", json::parse(Slurp(WriteConfig(4)))},
                 {"grid", {{"moe.experts_total", {4, 8}}}}};
    const std::string spec_path = (dir_ / "spec.json").string();
    std::ofstream(spec_path) << spec.dump(2);
    EXPECT_EQ(Wait(Spawn({"sweep", "run", spec_path, "--db", db_, "--no-live"}, Log())), 0)
        << Slurp(Log());
    return spec_path;
  }
};

// `config check` runs the checks `train` runs before training and exits 2 on the same errors:
// before, it said "ok" for a corpus config without data.path and for a model vocabulary below
// the tokenizer's, both of which `train` refused.
TEST_F(RobustTest, ConfigCheckRefusesWhatTrainRefuses) {
  const std::string no_path = WriteConfig(5, {{"data", {{"source", "corpus"}}}});
  EXPECT_EQ(Wait(Spawn({"config", "check", no_path}, Log())), 2) << Slurp(Log());
  EXPECT_HAS(Slurp(Log()), "data.path");
  EXPECT_EQ(Wait(Spawn({"train", no_path, "--db", db_}, Log())), 2) << Slurp(Log());
  EXPECT_HAS(Slurp(Log()), "data.path");

  const std::string data = ImportedData();
  const std::string small = WriteConfig(
      5, {{"model", {{"vocab_size", 32}}}, {"data", {{"source", "corpus"}, {"path", data}}}});
  const std::string too_small =
      "model.vocab_size 32 is smaller than the vocabulary 64 of the "
      "imported token shards";
  EXPECT_EQ(Wait(Spawn({"config", "check", small}, Log())), 2) << Slurp(Log());
  EXPECT_HAS(Slurp(Log()), too_small);
  // Imported shards have no tokenizer: no hint to prepare one with a smaller vocabulary.
  EXPECT_LACKS(Slurp(Log()), "tokenizer");
  EXPECT_LACKS(Slurp(Log()), "ok: hash");
  EXPECT_EQ(Wait(Spawn({"train", small, "--db", db_}, Log())), 2) << Slurp(Log());
  EXPECT_HAS(Slurp(Log()), too_small);

  const std::string fits = WriteConfig(5, {{"data", {{"source", "corpus"}, {"path", data}}}});
  EXPECT_EQ(Wait(Spawn({"config", "check", fits}, Log())), 0) << Slurp(Log());
  EXPECT_HAS(Slurp(Log()), "ok: hash");
  EXPECT_FALSE(fs::exists(db_));  // nothing was recorded by any refusal
}

// `--db` in a folder that does not exist: created, as the help says (every README example
// uses runs/...). Before, SQLite failed with "unable to open database file" (code 14).
TEST_F(RobustTest, DbFolderIsCreatedByEveryWriter) {
  const std::string db = (dir_ / "runs" / "deeper" / "my.db").string();
  ASSERT_EQ(Wait(Spawn({"train", WriteConfig(3), "--db", db, "--name", "try1"}, Log())), 0)
      << Slurp(Log());
  EXPECT_EQ(db::Reader(db).ListRuns().size(), 1u);
  // The sweep engine's writer too.
  json spec = {{"name", "tiny"}, {"base", json::parse(Slurp(WriteConfig(4)))}, {"seeds", {1}}};
  const std::string spec_path = (dir_ / "spec.json").string();
  std::ofstream(spec_path) << spec.dump(2);
  const std::string sweep_db = (dir_ / "sweeps" / "law.db").string();
  ASSERT_EQ(Wait(Spawn({"sweep", "run", spec_path, "--db", sweep_db, "--no-live"}, Log())), 0)
      << Slurp(Log());
  EXPECT_EQ(db::Reader(sweep_db).ListRuns().size(), 1u);
  // Readers do not create anything: a missing file is named.
  const std::string missing = (dir_ / "nowhere" / "x.db").string();
  EXPECT_NE(Wait(Spawn({"db", "runs", "--db", missing}, Log())), 0);
  EXPECT_HAS(Slurp(Log()), "does not exist");
  EXPECT_FALSE(fs::exists(dir_ / "nowhere"));
}

// Every command's --db has the same default and says so in its help.
TEST_F(RobustTest, DbOptionIsTheSameEverywhere) {
  for (const std::vector<std::string>& cmd : {std::vector<std::string>{"train"},
                                              {"sweep", "run"},
                                              {"sweep", "resume"},
                                              {"sweep", "status"},
                                              {"sweep", "plan"},
                                              {"db", "runs"},
                                              {"db", "show"},
                                              {"db", "export"},
                                              {"db", "merge"},
                                              {"fit"},
                                              {"promote"}}) {
    std::vector<std::string> args = cmd;
    args.push_back("--help");
    ASSERT_EQ(Wait(Spawn(args, Log())), 0) << Slurp(Log());
    const std::string help = Slurp(Log());
    EXPECT_TRUE(std::regex_search(help, std::regex("--db TEXT(:FILE)?=moelab\\.db")))
        << cmd[0] << ": " << help;
  }
}

// `db show NAME` takes what `--resume NAME` takes (before: "run: Value try1 could not be
// converted").
TEST_F(RobustTest, DbShowTakesARunName) {
  ASSERT_EQ(Wait(Spawn({"train", WriteConfig(3), "--db", db_, "--name", "try1"}, Log())), 0)
      << Slurp(Log());
  ASSERT_EQ(Wait(Spawn({"db", "show", "try1", "--db", db_}, Log())), 0) << Slurp(Log());
  EXPECT_HAS(Slurp(Log()), "run 1 'try1'");
  ASSERT_EQ(Wait(Spawn({"db", "show", "1", "--db", db_}, Log())), 0) << Slurp(Log());
  EXPECT_HAS(Slurp(Log()), "run 1 'try1'");
  EXPECT_NE(Wait(Spawn({"db", "show", "nope", "--db", db_}, Log())), 0);
  EXPECT_HAS(Slurp(Log()), "no run 'nope'");
}

// Damaged checkpoints on resume: a header with overwritten bytes is reported corrupt (not "the
// database recorded this run only up to step 30 ... (step 6365935208268562672)"), one with a
// damaged payload fails its checksum, each is named, and the run resumes from its newest valid
// checkpoint, announced once that one has been read, never the rejected one's step.
TEST_F(RobustTest, DamagedCheckpointsAreNamedAndResumeAnnouncesTheOneItUses) {
  const std::string cfg = WriteConfig(40, {{"checkpoint", {{"every", 10}, {"keep", 3}}}});
  ASSERT_EQ(
      Wait(Spawn({"train", cfg, "--db", db_, "--stop-at-step", "30", "--no-progress"}, Log())), 4)
      << Slurp(Log());
  const fs::path dir = fs::path(db::Reader(db_).ListRuns().at(0).checkpoint_path).parent_path();
  const std::string at30 = CheckpointAtStep(dir.string(), 30);
  const std::string at20 = CheckpointAtStep(dir.string(), 20);
  ASSERT_FALSE(at30.empty());
  ASSERT_FALSE(at20.empty());
  {  // the step field of step 30's header (after the magic and three length-prefixed strings)
    const CheckpointHeader h = ReadCheckpointHeader(at30);
    std::fstream f(at30, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(8 + 8 + h.config_hash.size() + 8 + h.branch_hash.size() +
                                        8 + h.run_uuid.size()));
    f.write("XXXXXXXX", 8);
  }
  {  // the middle of step 20's parameters
    std::fstream f(at20, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(at20) / 2));
    f.write("corrupt!", 8);
  }
  ASSERT_EQ(Wait(Spawn({"train", "--db", db_, "--resume", "--no-progress"}, Log())), 0)
      << Slurp(Log());
  const std::string log = Slurp(Log());
  EXPECT_HAS(log, at30 + ": checkpoint header is corrupt");
  EXPECT_LACKS(log, "recorded this run only up to");
  EXPECT_HAS(log, at20 + ": checkpoint checksum mismatch");
  EXPECT_HAS(log, "resuming run 1 'run' from step 10");
  EXPECT_LACKS(log, "from step 20");
  EXPECT_LACKS(log, "from step 30");
  EXPECT_LT(log.find("checksum mismatch"), log.find("resuming run 1 'run' from step 10")) << log;
  db::Reader reader(db_);
  EXPECT_EQ(reader.ListRuns().at(0).effective_status, RunStatus::kDone);
  const db::Series loss = reader.GetSeries(1, "loss");
  ASSERT_EQ(loss.steps.size(), 40u);  // steps 11..30 trained again, each recorded once
  for (size_t i = 0; i < loss.steps.size(); ++i) EXPECT_EQ(loss.steps[i], int64_t(i + 1));
}

// `train --no-progress` ends with a summary: the mean loss of the last steps (named as such)
// beside the last batch's, not the last batch's noisy loss alone.
TEST_F(RobustTest, TrainEndsWithASmoothedSummary) {
  ASSERT_EQ(Wait(Spawn({"train", WriteConfig(20), "--db", db_, "--no-progress"}, Log())), 0)
      << Slurp(Log());
  const std::string log = Slurp(Log());
  const db::Series loss = db::Reader(db_).GetSeries(1, "loss");
  ASSERT_EQ(loss.values.size(), 20u);
  const double mean = (loss.values[18] + loss.values[19]) / 2;
  EXPECT_HAS(log, fmt::format("train loss {:.4f} (mean of the last 2 steps; last batch {:.4f})",
                              mean, loss.values[19]));
  EXPECT_HAS(log, "done: 20 steps (20 trained in ");
}

// The per-step export carries each run's sweep variables as columns: users no longer parse them
// out of run_name.
TEST_F(RobustTest, StepExportHasSweepVariableColumns) {
  RunTwoRunSweep("vars");
  const std::string csv = (dir_ / "steps.csv").string(), jsonl = (dir_ / "steps.jsonl").string();
  ASSERT_EQ(Wait(Spawn({"db", "export", "--db", db_, "--steps", "-o", csv}, Log())), 0)
      << Slurp(Log());
  std::istringstream in(Slurp(csv));
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line.rfind("run_id,run_name,moe.experts_total,step,tokens,", 0), 0u) << line;
  EXPECT_LACKS(line, "build.commit");
  std::set<std::string> experts;
  while (std::getline(in, line)) {
    std::string rest = line.substr(line.find(',') + 1);
    rest = rest.substr(rest.find(',') + 1);
    experts.insert(rest.substr(0, rest.find(',')));
  }
  EXPECT_EQ(experts, (std::set<std::string>{"4", "8"}));
  ASSERT_EQ(Wait(Spawn({"db", "export", "--db", db_, "--steps", "--format", "jsonl", "-o", jsonl},
                       Log())),
            0)
      << Slurp(Log());
  std::istringstream jl(Slurp(jsonl));
  ASSERT_TRUE(std::getline(jl, line));
  const json row = json::parse(line);
  ASSERT_TRUE(row.contains("moe.experts_total")) << line;
  EXPECT_TRUE(row["moe.experts_total"].is_number()) << line;
}

// scripts/slim-db.sh: a database of the done runs without per-step rows, small enough to commit,
// from which `db export` gives the same final points and a sweep resumes without training them
// again (the long experiments carry their progress across machines with it).
TEST_F(RobustTest, SlimDatabaseExportsTheSamePointsAndResumesTheSweep) {
  const std::string spec_path = RunTwoRunSweep("slim");
  const std::string slim = (dir_ / "slim.db").string();
  const std::string cmd = fmt::format("bash {}/scripts/slim-db.sh {} {} > {} 2>&1",
                                      test::SourceDir(), db_, slim, Log());
  ASSERT_EQ(std::system(cmd.c_str()), 0) << Slurp(Log());
  EXPECT_HAS(Slurp(Log()), "slim-db: 2 done runs");
  const std::string count = (dir_ / "count.txt").string();
  ASSERT_EQ(std::system(fmt::format("sqlite3 {} 'SELECT count(*) FROM steps' > {}; sqlite3 {} "
                                    "'SELECT count(*) FROM steps' >> {}",
                                    db_, count, slim, count)
                            .c_str()),
            0);
  std::istringstream counts(Slurp(count));
  int full_steps = 0, slim_steps = -1;
  counts >> full_steps >> slim_steps;
  EXPECT_GT(full_steps, 0);
  EXPECT_EQ(slim_steps, 0);  // no per-step rows: what makes it small
  auto points = [&](const std::string& db) {
    const std::string out = (dir_ / "points.json").string();
    EXPECT_EQ(Wait(Spawn({"db", "export", "--db", db, "--sweep", "slim", "-o", out}, Log())), 0)
        << Slurp(Log());
    return json::parse(Slurp(out))["points"];
  };
  const json full = points(db_), small = points(slim);
  ASSERT_EQ(full.size(), 2u);
  EXPECT_EQ(small, full);
  // The sweep on the slim copy finds both runs done and trains nothing.
  ASSERT_EQ(Wait(Spawn({"sweep", "run", spec_path, "--db", slim, "--no-live"}, Log())), 0)
      << Slurp(Log());
  const std::string log = Slurp(Log());
  EXPECT_LACKS(log, "start ");
  EXPECT_HAS(log, "2 done");
}

// docs/sweeps.md's synopsis names every option each `sweep` subcommand takes (it missed
// --max-runs, --live, --no-data-check and the --gpu-* options).
TEST_F(RobustTest, SweepsSynopsisNamesEveryOption) {
  const std::string doc = Slurp(test::SourceDir() + "/docs/sweeps.md");
  const size_t open = doc.find("```\nmoelab sweep plan");
  ASSERT_NE(open, std::string::npos);
  const std::string block = doc.substr(open, doc.find("```", open + 3) - open);
  const std::regex option("--[a-z][a-z0-9-]*");
  for (const std::string sub : {"plan", "run", "resume", "status", "slurm"}) {
    // The subcommand's lines: its own and the indented continuations after it.
    const size_t at = block.find("moelab sweep " + sub);
    ASSERT_NE(at, std::string::npos) << sub;
    size_t end = block.find("\nmoelab sweep", at + 1);
    if (end == std::string::npos) end = block.size();
    const std::string synopsis = block.substr(at, end - at);
    ASSERT_EQ(Wait(Spawn({"sweep", sub, "--help"}, Log())), 0) << Slurp(Log());
    const std::string help = Slurp(Log());
    // The options are the heads of the help's option lines ("  -t,--threads-per-run INT  ...");
    // descriptions may quote srun's own flags.
    std::string heads;
    std::istringstream lines(help);
    for (std::string l; std::getline(lines, l);) {
      const size_t first = l.find_first_not_of(' ');
      if (first == std::string::npos || l[first] != '-') continue;
      heads += l.substr(first, l.find("  ", first) - first) + "\n";
    }
    for (std::sregex_iterator it(heads.begin(), heads.end(), option), stop; it != stop; ++it) {
      const std::string name = it->str();
      if (name == "--help") continue;
      EXPECT_TRUE(std::regex_search(synopsis, std::regex(name + "(?![a-z0-9-])")))
          << "docs/sweeps.md: `moelab sweep " << sub << "` lacks " << name;
    }
  }
}

}  // namespace
}  // namespace moelab
