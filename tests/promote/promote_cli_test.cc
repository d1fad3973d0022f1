// `moelab promote` end to end: a sweep database with a known law and real (tiny) configs, a
// stored fit, the refusals, and a promoted run launched on CPU that finishes linked to its
// promotion.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>
#include <utility>

#ifdef MOELAB_PROMOTE_HAVE_GUI
#include <stb_image.h>
#endif

#include "core/flops.h"
#include "core/run_shape.h"
#include "db/promotions.h"
#include "db/reader.h"
#include "db/schema.h"
#include "db/writer.h"
#include "promote/db.h"
#include "promote/plan.h"
#include "tests/common/test_util.h"
#include "tests/common/tiny_configs.h"

namespace moelab {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string Bin() { return test::BinPath("moelab"); }

RunConfig Tiny(int d) {
  RunConfig c;
  c.model = {
      .vocab_size = 64, .d_model = d, .layers = 1, .heads = 2, .ffn_hidden = 2 * d, .seq_len = 16};
  test::UseMoe(&c.moe, {.experts = 4, .top_k = 2, .hidden = d});
  test::UseShortMarkovRun(&c, /*batch_size=*/4, /*steps=*/40);
  c.train.threads = 1;
  c.eval.every = 10;
  c.eval.batches = 1;
  c.optimizer.name = "adamw";
  c.optimizer.lr = 1e-2;
  return c;
}

// The output (stdout and stderr) of a shell command line, and its exit code.
std::string Capture(const fs::path& dir, const std::string& cmd, int* code) {
  const std::string log = (dir / "capture.log").string();
  *code = test::Run({"/bin/sh", "-c", cmd}, log);
  return test::Slurp(log);
}

// A sweep database at `path` with a known law L = 3.2 + 2·(C/1e6)^−0.3 over five runs of
// growing width (sweep 'law', family sparsity=2) and an empty sweep; returns the law's id.
int64_t MakeLawDatabase(const std::string& path) {
  int64_t sweep_id = 0;
  {
    db::Connection c = db::OpenForWrite(path);
    c.Exec("INSERT INTO sweeps (name, created_at) VALUES ('law', 0), ('empty', 0)");
    sweep_id = c.QueryInt("SELECT id FROM sweeps WHERE name = 'law'");
  }
  for (int r = 0; r < 5; ++r) {
    const RunConfig cfg = Tiny(8 + 4 * r);
    db::RunInfo info;
    info.name = "r" + std::to_string(r);
    info.config_json = ConfigToJson(cfg).dump();
    info.config_hash = ConfigHash(cfg);
    info.sweep_id = sweep_id;
    info.shape.params_active = CountParams(cfg).active;
    auto w = db::RunWriter::Create(path, info);
    db::RunWriter::SetRunVar(path, w->run_id(), "sparsity", "2");
    for (int k = 1; k <= 4; ++k) {
      const double flops = 1e6 * std::pow(2.0, r * 1.2 + k * 0.3);
      const double loss =
          (3.2 + 2 * std::pow(flops / 1e6, -0.3)) * (1 + 0.004 * ((r * 7 + k * 3) % 5 - 2));
      w->OnEval(k * 10, static_cast<int64_t>(flops / ForwardFlopsPerToken(cfg).training()), flops,
                loss);
    }
    w->OnEnd(RunStatus::kDone, "");
  }
  return sweep_id;
}

// MakeLawDatabase(db) with its fits stored: `moelab fit` (50 resamples) run in `work`.
void MakeFittedLawDatabase(const fs::path& work, const std::string& db) {
  MakeLawDatabase(db);
  int code = 0;
  const std::string out =
      Capture(work, Bin() + " fit --db " + db + " --sweep law --by sparsity --resamples 50", &code);
  ASSERT_EQ(code, 0) << out;
}

TEST(PromoteCli, RefusesThenPlansWritesLaunchesAndLinks) {
  const test::TempDir tmp("promote");  // kept when the test fails (or MOELAB_KEEP_TEST_DIR is set)
  const fs::path& dir = tmp.path();
  const auto Capture = [&dir](const std::string& cmd, int* code) {
    return ::moelab::Capture(dir, cmd, code);
  };
  const std::string path = (dir / "p.db").string();
  const int64_t sweep_id = MakeLawDatabase(path);
  const std::string base = Bin() + " promote --db " + path;
  int code = 0;
  // A sweep without fits.
  std::string out = Capture(base + " --sweep empty --family sparsity=2 --budget-flops 1e8", &code);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("no stored fits"), std::string::npos) << out;
  out = Capture(Bin() + " fit --db " + path + " --sweep law --by sparsity --resamples 100", &code);
  ASSERT_EQ(code, 0) << out;
  // Unknown family, unknown run, target outside the supported range: each refused, saying why.
  const std::pair<const char*, const char*> refusals[] = {
      {"--family sparsity=7 --budget-flops 1e8", "unknown family"},
      {"--run 999 --budget-flops 1e8", "unknown run"},
      {"--family sparsity=2 --budget-flops 1e13", "--max-extrapolation"},
      {"--family sparsity=2 --target-loss 3.0", "irreducible"}};
  for (const auto& [args, why] : refusals) {
    out = Capture(base + " --sweep law " + args, &code);
    EXPECT_NE(code, 0) << args;
    EXPECT_NE(out.find(why), std::string::npos) << out;
  }

  // The promotion: planned, written, recorded, launched on CPU.
  const fs::path pdir = dir / "promo";
  out = Capture(base + " --sweep law --family sparsity=2 --budget-flops 1.5e8 --threads 1 --out " +
                    pdir.string() + " --launch",
                &code);
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("memory / device"), std::string::npos) << out;
  EXPECT_NE(out.find("predicted loss"), std::string::npos) << out;
  for (const char* f :
       {"config.json", "plan.json", "launch_local.sh", "launch_mpirun.sh", "launch_slurm.sbatch"})
    EXPECT_TRUE(fs::exists(pdir / f)) << f;
  const auto promos = db::ListPromotions(path);
  ASSERT_EQ(promos.size(), 1u);
  const db::PromotionRecord& p = promos.front();
  ASSERT_TRUE(p.run_id.has_value());
  EXPECT_EQ(p.sweep_id, sweep_id);
  EXPECT_EQ(p.family, "2");
  EXPECT_LT(p.band_lo, p.predicted_loss);
  EXPECT_GT(p.band_hi, p.predicted_loss);
  const json plan = json::parse(p.plan_json);
  EXPECT_GE(plan["curve"].size(), 2u);
  EXPECT_EQ(db::PromotionOfRun(path, *p.run_id)->id, p.id);
  // The run row carries the full shape (expert matrices too), the same as `moelab train` records.
  {
    const RunShape want = RunShapeOf(ConfigFromJson(json::parse(p.config_json)));
    const RunShape got = db::Reader(path).GetRun(*p.run_id)->shape;
    EXPECT_EQ(got.moe_layers, want.moe_layers);
    EXPECT_GT(got.moe_layers, 0);
    EXPECT_EQ(got.experts, want.experts);
    EXPECT_EQ(got.layers, want.layers);
    EXPECT_EQ(got.heads, want.heads);
    EXPECT_EQ(got.params_total, want.params_total);
    EXPECT_EQ(got.params_active, want.params_active);
    EXPECT_EQ(got.flops_per_token, want.flops_per_token);
  }

  // Wait for the launched run (a few seconds of CPU).
  RunStatus status = RunStatus::kQueued;
  for (int i = 0; i < 1200; ++i) {
    db::Reader reader(path);
    status = reader.GetRun(*p.run_id)->status;
    if (IsTerminal(status) && status != RunStatus::kStopped) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(status, RunStatus::kDone) << test::Slurp((pdir / "train.log").string());
  db::Reader reader(path);
  const db::Series val = reader.GetSeries(*p.run_id, "val_loss");
  const db::Series flops = reader.GetSeries(*p.run_id, "eval_flops");
  ASSERT_FALSE(val.values.empty());
  EXPECT_NEAR(flops.values.back() / plan["flops"].get<double>(), 1.0, 0.02);
  EXPECT_TRUE(std::isfinite(promote::BandUnits(plan, flops.values.back(), val.values.back())));

#ifdef MOELAB_PROMOTE_HAVE_GUI
  // The Full runs view under Xvfb: the promoted run's curve (orange) over its band.
  if (std::system("command -v xvfb-run > /dev/null 2>&1") == 0) {
    const std::string png = (dir / "full-runs.png").string();
    const std::string gui = Bin() + "-gui";
    const std::string cmd = "xvfb-run -a -s \"-screen 0 1280x800x24\" " + gui + " --db " + path +
                            " --view full-runs --screenshot " + png + " --frames 3";
    int rc = -1;
    for (int attempt = 0; attempt < 3 && rc != 0; ++attempt) rc = std::system(cmd.c_str());
    ASSERT_EQ(rc, 0) << cmd;
    int w = 0, h = 0, n = 0;
    unsigned char* img = stbi_load(png.c_str(), &w, &h, &n, 3);
    ASSERT_NE(img, nullptr);
    int orange = 0, band = 0;
    for (int i = 0; i < w * h; ++i) {
      const unsigned char* px = img + 3 * i;
      orange +=
          std::abs(px[0] - 255) < 12 && std::abs(px[1] - 170) < 12 && std::abs(px[2] - 60) < 12;
      band += px[2] > px[0] + 25 && px[2] > 60 && px[1] > px[0];  // blue-ish fill and law line
    }
    stbi_image_free(img);
    EXPECT_GT(orange, 100) << "no promoted-run curve in " << png;
    EXPECT_GT(band, 1000) << "no predicted band in " << png;
    if (const char* docs = std::getenv("MOELAB_PROMOTE_DOCS_DIR"))
      fs::copy_file(png, fs::path(docs) / "promote-full-runs.png",
                    fs::copy_options::overwrite_existing);
  }
#endif
}

// Issue 19, path 3: every launcher promote writes trains or continues the promoted run. Run in a
// folder that is then moved (another path, as on another machine): the scripts name everything
// relative to it. Stopped at step 5, launch_local.sh continues from that checkpoint (before,
// it restarted at step 0 and deleted the recorded rows); the Slurm script asks for what the
// options say, requeues itself after the time-limit signal, and continues too; run again
// after the end, a launcher changes nothing.
TEST(PromoteCli, LaunchersTrainOrContinueTheirRun) {
  const test::TempDir tmp("promote_launchers");
  const fs::path work = tmp.path() / "work";
  fs::create_directories(work);
  const std::string db = (work / "p.db").string();
  ASSERT_NO_FATAL_FAILURE(MakeFittedLawDatabase(work, db));
  int code = 0;
  std::string out =
      Capture(work,
              "cd '" + work.string() + "' && " + Bin() +
                  " promote --db p.db --sweep law --family sparsity=2 --budget-flops 1.5e8 "
                  "--threads 1 --out promo --time 01:00:00 --partition cpu --mem 4G "
                  "--account proj --gres gpu:1",
              &code);
  ASSERT_EQ(code, 0) << out;
  const int64_t run_id = db::ListPromotions(db).front().run_id.value();
  const std::string sbatch = test::Slurp((work / "promo" / "launch_slurm.sbatch").string());
  for (const char* line :
       {"#SBATCH --time=01:00:00\n", "#SBATCH --partition=cpu\n", "#SBATCH --mem=4G\n",
        "#SBATCH --account=proj\n", "#SBATCH --gres=gpu:1\n", "#SBATCH --requeue\n",
        "#SBATCH --signal=B:USR1@120\n", "#SBATCH --output=promo/slurm-%j.out",
        "cd \"${MOELAB_ROOT:-${SLURM_SUBMIT_DIR:-.}}\"", "--resume"}) {
    EXPECT_NE(sbatch.find(line), std::string::npos) << line << "\n" << sbatch;
  }
  for (const char* f : {"launch_local.sh", "launch_mpirun.sh", "launch_slurm.sbatch"}) {
    const std::string text = test::Slurp((work / "promo" / f).string());
    EXPECT_EQ(text.find(work.string()), std::string::npos) << f << " names the folder:\n" << text;
  }
  const fs::path moved = tmp.path() / "moved";
  fs::rename(work, moved);
  const std::string mdb = (moved / "p.db").string();
  const fs::path tools = tmp.path() / "bin";
  fs::create_directories(tools);
  const auto tool = [&](const std::string& name, const std::string& body) {
    std::ofstream(tools / name) << "#!/bin/bash\n" << body;
    fs::permissions(tools / name, fs::perms::owner_all);
  };
  tool("stop5", "exec '" + Bin() + "' \"$@\" --stop-at-step 5\n");
  tool("srun", "while [[ \"$1\" == --* ]]; do shift; done\nexec \"$@\"\n");
  tool("scontrol", "echo \"scontrol $*\" >> '" + (tools / "calls").string() + "'\n");
  // Leaves the signals to bash's defaults until it is up, tells the batch shell "time limit
  // near", and stops like the trainer does (exit 4) when the shell passes USR1 on (through srun,
  // which forwards USR1 but SIGKILLs the ranks on TERM) or a TERM arrives.
  tool("fake_trainer",
       "trap 'exit 4' TERM USR1\nsleep 0.3\nkill -USR1 $PPID\nwhile :; do sleep 0.05; done\n");
  const std::string env = "cd / && PATH='" + tools.string() + "':$PATH ";
  const std::string local = "bash '" + (moved / "promo" / "launch_local.sh").string() + "'";
  const std::string slurm = "SLURM_JOB_ID=77 SLURM_SUBMIT_DIR='" + moved.string() + "' bash '" +
                            (moved / "promo" / "launch_slurm.sbatch").string() + "'";
  out = Capture(moved, env + "MOELAB='" + (tools / "stop5").string() + "' " + local, &code);
  ASSERT_EQ(code, 4) << out;
  EXPECT_EQ(db::Reader(mdb).GetRun(run_id)->last_step, 5);
  out = Capture(moved, env + "MOELAB='" + (tools / "fake_trainer").string() + "' " + slurm, &code);
  EXPECT_EQ(code, 4) << out;
  EXPECT_EQ(test::Slurp((tools / "calls").string()), "scontrol requeue 77\n");
  out = Capture(moved, env + slurm, &code);  // the requeued job
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("from step 5"), std::string::npos) << out;
  db::Reader reader(mdb);
  const db::RunRow row = *reader.GetRun(run_id);
  EXPECT_EQ(row.status, RunStatus::kDone);
  const db::Series loss = reader.GetSeries(run_id, "loss");
  ASSERT_EQ(static_cast<int64_t>(loss.steps.size()), row.shape.total_steps);
  for (size_t i = 0; i < loss.steps.size(); ++i) EXPECT_EQ(loss.steps[i], int64_t(i + 1));
  // Run again after the end (local, and under a stand-in mpirun): nothing changes.
  tool("mpirun",
       "while [[ $# -gt 0 && $1 == -* ]]; do case $1 in -np|--bind-to|-x) shift 2;; *) shift;; "
       "esac; done\nexec \"$@\"\n");
  for (const char* script : {"launch_local.sh", "launch_mpirun.sh"}) {
    out = Capture(moved, env + "bash '" + (moved / "promo" / script).string() + "'", &code);
    EXPECT_EQ(code, 0) << script << "\n" << out;
    EXPECT_NE(out.find("is already done"), std::string::npos) << script << "\n" << out;
  }
  EXPECT_EQ(db::Reader(mdb).GetSeries(run_id, "loss").values, loss.values);
}

// Issue 39: promoting the same plan twice. The second identical `promote --launch` records and
// starts nothing and names the existing run with the command that continues it; `--again`
// records a new run with another seed in a folder of its own; no promotion's folder is shared
// or rewritten (not even one an older database at the same path left behind), and promotion
// 1's launchers start only its own run.
TEST(PromoteCli, SamePlanTwiceStartsNoSecondRunAndEachPromotionOwnsItsFolder) {
  const test::TempDir tmp("promote_twice");
  const fs::path work = tmp.path();
  const std::string db = (work / "p.db").string();
  ASSERT_NO_FATAL_FAILURE(MakeFittedLawDatabase(work, db));
  int code = 0;
  std::string out;
  const std::string promote = "cd '" + work.string() + "' && " + Bin() +
                              " promote --db p.db --sweep law --family sparsity=2 "
                              "--budget-flops 1.5e8 --threads 1";
  const auto count_runs = [&] { return db::OpenForRead(db).QueryInt("SELECT COUNT(*) FROM runs"); };
  const int64_t runs_before = count_runs();
  out = Capture(work, promote, &code);
  ASSERT_EQ(code, 0) << out;
  ASSERT_EQ(db::ListPromotions(db).size(), 1u);
  const db::PromotionRecord first = db::ListPromotions(db).front();
  const int64_t run1 = first.run_id.value();
  const fs::path dir1 = first.out_dir;
  EXPECT_EQ(dir1, fs::path(work / "p.db.promotions" / std::to_string(first.id)));
  const std::vector<std::string> files = {"config.json",      "plan.json",
                                          "plan.txt",         "launch_local.sh",
                                          "launch_mpirun.sh", "launch_slurm.sbatch"};
  std::map<std::string, std::string> before;
  for (const auto& f : files) before[f] = test::Slurp((dir1 / f).string());
  const auto expect_first_untouched = [&](const std::string& when) {
    for (const auto& f : files)
      EXPECT_EQ(test::Slurp((dir1 / f).string()), before[f]) << f << " rewritten " << when;
  };

  // The same plan again, with --launch: nothing recorded, nothing started, the run named.
  out = Capture(work, promote + " --launch", &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find(fmt::format("run {} '", run1)), std::string::npos) << out;
  EXPECT_NE(out.find(fmt::format("of promotion {}", first.id)), std::string::npos) << out;
  EXPECT_NE(out.find("resumable (queued"), std::string::npos) << out;
  EXPECT_NE(out.find("continue it: bash " + dir1.string() + "/launch_local.sh"), std::string::npos)
      << out;
  EXPECT_NE(out.find("Nothing new was recorded or started"), std::string::npos) << out;
  EXPECT_EQ(out.find("launched"), std::string::npos) << out;
  EXPECT_EQ(db::ListPromotions(db).size(), 1u);
  EXPECT_EQ(count_runs(), runs_before + 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(fs::exists(dir1 / "train.log"));
  EXPECT_EQ(db::Reader(db).GetRun(run1)->status, RunStatus::kQueued);
  expect_first_untouched("by the second promote");

  // --out naming promotion 1's folder: refused before anything (exit 2), whatever else is asked.
  out = Capture(work, promote + " --again --out '" + dir1.string() + "'", &code);
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("--out"), std::string::npos) << out;
  EXPECT_NE(out.find(fmt::format("promotion {} wrote that folder", first.id)), std::string::npos)
      << out;
  const fs::path full = work / "full";
  fs::create_directories(full);
  std::ofstream(full / "keep.txt") << "not a promotion's";
  out = Capture(work, promote + " --again --out full", &code);
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("holds files already"), std::string::npos) << out;
  EXPECT_EQ(db::ListPromotions(db).size(), 1u);

  // An older database at this path left the folder the next id would take: it is kept.
  const fs::path stale = work / "p.db.promotions" / std::to_string(first.id + 1);
  fs::create_directories(stale);
  std::ofstream(stale / "launch_local.sh") << "# an older database's promotion\n";

  // --again: a new run with another seed, in a folder of its own.
  out = Capture(work, promote + " --again", &code);
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("--again: seed 2 instead of 1"), std::string::npos) << out;
  const auto promos = db::ListPromotions(db);
  ASSERT_EQ(promos.size(), 2u);
  const db::PromotionRecord& second = promos.front();
  const int64_t run2 = second.run_id.value();
  EXPECT_NE(run2, run1);
  EXPECT_EQ(count_runs(), runs_before + 2);
  const fs::path dir2 = second.out_dir;
  EXPECT_NE(dir2, dir1);
  EXPECT_NE(dir2, stale);
  EXPECT_EQ(test::Slurp((stale / "launch_local.sh").string()), "# an older database's promotion\n");
  EXPECT_EQ(ConfigFromJson(json::parse(second.config_json)).train.seed, 2u);
  EXPECT_NE(db::Reader(db).GetRun(run2)->config_hash, db::Reader(db).GetRun(run1)->config_hash);
  expect_first_untouched("by --again");
  for (const char* f : {"launch_local.sh", "launch_mpirun.sh", "launch_slurm.sbatch"}) {
    const std::string one = test::Slurp((dir1 / f).string());
    const std::string two = test::Slurp((dir2 / f).string());
    EXPECT_NE(one.find(fmt::format("--run-id {} ", run1)), std::string::npos) << f << one;
    EXPECT_EQ(one.find(fmt::format("--run-id {} ", run2)), std::string::npos) << f << one;
    EXPECT_NE(two.find(fmt::format("--run-id {} ", run2)), std::string::npos) << f << two;
    EXPECT_EQ(two.find(fmt::format("--run-id {} ", run1)), std::string::npos) << f << two;
  }

  // Each promotion's own launcher trains its own run (stopped at once by a stand-in binary
  // that records its arguments).
  const fs::path args = work / "args.txt";
  std::ofstream(work / "fake_moelab") << "#!/bin/bash\necho \"$@\" >> '" << args.string() << "'\n";
  fs::permissions(work / "fake_moelab", fs::perms::owner_all);
  out = Capture(work,
                "MOELAB='" + (work / "fake_moelab").string() + "' bash '" +
                    (dir1 / "launch_local.sh").string() + "'",
                &code);
  ASSERT_EQ(code, 0) << out;
  const std::string called = test::Slurp(args.string());
  EXPECT_NE(called.find(fmt::format("--run-id {} ", run1)), std::string::npos) << called;
  EXPECT_NE(called.find(fs::relative(dir1, work).string() + "/config.json"), std::string::npos)
      << called;
}

// What the report says for each state of the existing run: a finished one is only named, a live
// one is left to its process, a diverged one is not offered again, a multi-rank one is
// continued by its mpirun launcher.
TEST(PromoteCli, DescribesTheExistingRunByItsState) {
  promote::PromotedRun e;
  e.promotion.id = 3;
  e.promotion.out_dir = "/w/p.db.promotions/3";
  e.promotion.plan_json = R"({"layout": {"ranks": 4}})";
  e.run.id = 9;
  e.run.name = "promoted-3-sparsity2";
  e.run.config_hash = "0123456789abcdef0123";
  e.run.shape.total_steps = 100;
  e.run.last_step = 100;
  e.run.last_val_loss = 3.25;
  e.state = "done";
  std::string text = promote::DescribePromotedRun(e, "p.db");
  EXPECT_NE(text.find("run 9 'promoted-3-sparsity2' of promotion 3, done at step 100 of 100, "
                      "final validation loss 3.2500"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("(0123456789abcdef)"), std::string::npos) << text;
  EXPECT_EQ(text.find("continue it"), std::string::npos) << text;
  // The report once the run is in `state` with `status` (and what the test set on e.run).
  const auto describe_as = [&](const char* state, RunStatus status) {
    e.state = state;
    e.run.status = status;
    return promote::DescribePromotedRun(e, "p.db");
  };
  e.run.pid = 4242;
  e.run.host = "node1";
  e.run.last_step = 40;
  text = describe_as("running", RunStatus::kRunning);
  EXPECT_NE(text.find("running (pid 4242 on node1), step 40 of 100"), std::string::npos) << text;
  EXPECT_EQ(text.find("continue it"), std::string::npos) << text;
  e.run.diverged_step = 41;
  text = describe_as("diverged", RunStatus::kDiverged);
  EXPECT_NE(text.find("diverged at step 41"), std::string::npos) << text;
  EXPECT_EQ(text.find("continue it"), std::string::npos) << text;
  e.run.checkpoint_step = 30;
  text = describe_as("resumable", RunStatus::kStopped);
  EXPECT_NE(text.find("resumable (stopped, step 40 of 100; newest checkpoint at step 30)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("continue it: bash /w/p.db.promotions/3/launch_mpirun.sh   (or: moelab "
                      "train --db p.db --resume 9)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("`--again`"), std::string::npos) << text;
}

}  // namespace
}  // namespace moelab
