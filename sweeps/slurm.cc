#include "sweeps/slurm.h"

#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/flops.h"
#include "sweeps/launch.h"
#include "sweeps/runner.h"
#include "sweeps/store.h"

namespace moelab::sweeps {

namespace fs = std::filesystem;

namespace {

// Single-quoted for bash.
std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

std::string Safe(const std::string& name) {
  std::string safe = name;
  for (char& ch : safe)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '_') ch = '_';
  return safe;
}

// Runs argv (looked up on PATH) and returns its exit code (127: not runnable), its stdout in
// *out and, when `err` is given, its stderr in *err. Without `err` the stderr is dropped: what
// squeue and sacct complain about (sacct's "Slurm accounting storage is disabled" on a cluster
// without accounting) must not garble `sweep status`, whose caller falls back on the other tool.
int Capture(const std::vector<std::string>& argv, std::string* out, std::string* err = nullptr) {
  int fds[2];
  if (pipe(fds) != 0) return 127;
  std::FILE* err_file = std::tmpfile();  // a file, not a pipe: no deadlock on a chatty stderr
  if (err_file == nullptr) {
    close(fds[0]);
    close(fds[1]);
    return 127;
  }
  const pid_t pid = fork();
  if (pid < 0) {
    std::fclose(err_file);
    close(fds[0]);
    close(fds[1]);
    return 127;
  }
  if (pid == 0) {
    dup2(fds[1], 1);
    dup2(fileno(err_file), 2);
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> a;
    std::vector<std::string> copy = argv;
    for (std::string& s : copy) a.push_back(s.data());
    a.push_back(nullptr);
    execvp(a[0], a.data());
    _exit(127);
  }
  close(fds[1]);
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) out->append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (err != nullptr) {
    std::rewind(err_file);
    size_t got;
    while ((got = std::fread(buf, 1, sizeof buf, err_file)) > 0) err->append(buf, got);
  }
  std::fclose(err_file);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

std::string JobsFile(const std::string& local_db, const std::string& sweep_name) {
  return SweepDir(local_db, sweep_name) + "/slurm-jobs.json";
}

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A path as the script names it: relative to the current folder (the submit folder) when it
// lies inside it, else absolute.
std::string ScriptPath(const fs::path& p) {
  const fs::path abs = fs::absolute(p).lexically_normal();
  const fs::path rel = abs.lexically_relative(fs::current_path());
  return rel.empty() || *rel.begin() == ".." ? abs.string() : rel.string();
}

}  // namespace

std::string SlurmDirectives(const SlurmResources& r) {
  std::string s;
  const auto line = [&](const char* key, const std::string& v) {
    if (!v.empty()) s += fmt::format("#SBATCH --{}={}\n", key, v);
  };
  line("partition", r.partition);
  line("time", r.time_limit);
  line("mem", r.mem);
  line("account", r.account);
  line("gres", r.gres);
  // A preempted task is requeued and resumes from its checkpoint instead of starting over.
  s += "#SBATCH --requeue\n";
  s += fmt::format("#SBATCH --signal=B:USR1@{}\n", r.signal_lead_s);
  // A requeued job writes its log again from the start (Slurm truncates by default): keep the
  // earlier attempts' output, which says where and why they stopped.
  s += "#SBATCH --open-mode=append\n";
  return s;
}

std::string SlurmTrainStep(const std::string& srun_command) {
  return fmt::format(
      "# USR1 (Slurm's warning before the time limit) and TERM (preemption, requeue, scancel)\n"
      "# reach the trainer as USR1, which srun forwards to every rank (a TERM to srun would\n"
      "# SIGKILL them): it checkpoints and exits 4. After USR1 the task requeues itself and\n"
      "# continues from that checkpoint (the command trains or continues). The task is named\n"
      "# <array job>_<index>: an array task's SLURM_JOB_ID can equal the array's id, which\n"
      "# names every task of the array.\n"
      "requeue=0\n"
      "step=\n"
      "trap 'requeue=1; kill -USR1 \"$step\" 2>/dev/null || true' USR1\n"
      "trap 'kill -USR1 \"$step\" 2>/dev/null || true' TERM\n"
      "{} &\n"
      "step=$!\n"
      "while :; do\n"
      "  wait \"$step\" && rc=0 || rc=$?\n"
      "  kill -0 \"$step\" 2>/dev/null || break  # a trap interrupted wait: the step still runs\n"
      "done\n"
      "if [ \"$requeue\" = 1 ] && [ \"$rc\" = 4 ] && [ -n \"${{SLURM_JOB_ID:-}}\" ]; then\n"
      "  if [ -n \"${{SLURM_ARRAY_JOB_ID:-}}\" ]; then\n"
      "    scontrol requeue \"${{SLURM_ARRAY_JOB_ID}}_${{SLURM_ARRAY_TASK_ID}}\"\n"
      "  else\n"
      "    scontrol requeue \"$SLURM_JOB_ID\"\n"
      "  fi\n"
      "fi\n"
      "exit \"$rc\"\n",
      srun_command);
}

std::string SlurmWsdNote(const Sweep& sweep) {
  const std::vector<BranchPlan> branches = PlanWsdBranches(sweep);
  double full = 0, saved = 0;
  int branched = 0;
  for (const SweepRun* r : sweep.Unique()) {
    const double per_step =
        ForwardFlopsPerToken(r->config).training() * static_cast<double>(TokensPerStep(r->config));
    full += per_step * r->config.total_steps();
    if (branches[r->index].parent >= 0) {
      ++branched;
      saved += per_step * branches[r->index].step;
    }
  }
  if (branched == 0) return "";
  return fmt::format(
      "WSD branching is not done on Slurm: {} shorter run(s) train from scratch instead of "
      "branching from their family's longest run, {:.3g} training FLOPs instead of the {:.3g} "
      "`sweep run` plans ({:.2f}x); run the sweep with `moelab sweep run` to branch",
      branched, full, full - saved, full / std::max(1.0, full - saved));
}

std::vector<SlurmScript> WriteSlurmScripts(const Sweep& sweep, const SlurmOptions& o) {
  if (o.db_path.empty()) throw SpecError("slurm: a database path (--db) is required");
  const auto all = sweep.Unique();
  if (all.empty()) throw SpecError("slurm: the sweep has no runs");
  // Runs grouped by rank count: an array job has one --ntasks for all its tasks.
  std::map<int, std::vector<const SweepRun*>> groups;
  for (const SweepRun* r : all) {
    const int ranks = o.ranks > 0 ? o.ranks : r->ranks;
    LayoutOrigin origin;
    origin.ranks = o.ranks > 0 ? "--ranks" : KeyOrigin(sweep.spec, "ranks", r->runs_index);
    origin.expert_parallel = KeyOrigin(sweep.spec, "dist.expert_parallel", r->runs_index);
    if (const std::string e = LayoutError(r->config, ranks, origin); !e.empty()) {
      throw SpecError(fmt::format("slurm: run #{} ({}): {}", r->index, r->name, e));
    }
    groups[ranks].push_back(r);
  }
  const fs::path dir = fs::absolute(o.out_dir.empty() ? "." : o.out_dir).lexically_normal();
  const std::string rel_dir = ScriptPath(dir);
  fs::create_directories(dir / "configs");
  fs::create_directories(dir / "logs");
  const std::string safe = Safe(sweep.name);
  const std::string wsd_note = SlurmWsdNote(sweep);
  std::vector<SlurmScript> out;
  for (const auto& [ranks, runs] : groups) {
    std::string configs, names;
    for (const SweepRun* r : runs) {
      nlohmann::json c = ConfigToJson(r->config);
      c["train"]["threads"] = o.threads_per_run;
      const fs::path path = dir / "configs" / (r->hash.substr(0, 16) + ".json");
      std::ofstream(path) << c.dump(2) << "\n";
      configs += "  " + Quote(ScriptPath(path)) + "\n";
      names += "  " + Quote(r->name) + "\n";
    }
    const std::string stem = groups.size() == 1 ? safe : fmt::format("{}.r{}", safe, ranks);
    const fs::path script = dir / (stem + ".sbatch");
    std::string s = "#!/bin/bash\n";
    s += fmt::format("# moelab sweep '{}': {} runs of {} rank(s), one Slurm array task each.\n",
                     sweep.name, runs.size(), ranks);
    s += "# Submit: sbatch " + script.filename().string() +
         "   (or: moelab sweep slurm ... --submit)\n";
    s += "# Merge back: moelab db merge <cluster db> --db <your db>   (docs/distributed.md)\n";
    s += "# Paths are relative to the submit folder (or $MOELAB_ROOT). Each task trains or\n"
         "# continues its run: running the script again never restarts a recorded run.\n";
    if (!wsd_note.empty()) s += "# Note: " + wsd_note + ".\n";
    s += fmt::format("#SBATCH --job-name={}\n", stem);
    s += fmt::format("#SBATCH --array=0-{}{}\n", runs.size() - 1,
                     o.max_parallel > 0 ? fmt::format("%{}", o.max_parallel) : "");
    s += fmt::format("#SBATCH --ntasks={}\n", ranks);
    if (o.ntasks_per_node > 0)
      s += fmt::format("#SBATCH --ntasks-per-node={}\n", o.ntasks_per_node);
    s += fmt::format("#SBATCH --cpus-per-task={}\n", o.threads_per_run);
    s += fmt::format("#SBATCH --output={}/logs/%x_%A_%a.log\n", rel_dir);
    s += SlurmDirectives(o.resources);
    if (!o.extra.empty()) s += o.extra + (o.extra.back() == '\n' ? "" : "\n");
    s += "set -euo pipefail\n";
    s += "cd \"${MOELAB_ROOT:-${SLURM_SUBMIT_DIR:-.}}\"\n";
    s += fmt::format("MOELAB=${{MOELAB:-{}}}\n", Quote(o.moelab_bin));
    s += fmt::format("DB_TEMPLATE=${{MOELAB_DB:-{}}}\n", Quote(o.db_path));
    s += "TASK=${SLURM_ARRAY_TASK_ID:?run me with sbatch (or set SLURM_ARRAY_TASK_ID)}\n";
    // One database per task stays unique across the scripts of different rank counts.
    s += groups.size() == 1 ? "DB=${DB_TEMPLATE//\\{task\\}/$TASK}\n"
                            : fmt::format("DB=${{DB_TEMPLATE//\\{{task\\}}/r{}_$TASK}}\n", ranks);
    s += "CONFIGS=(\n" + configs + ")\n";
    s += "NAMES=(\n" + names + ")\n";
    s += "export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-" + std::to_string(o.threads_per_run) +
         "}\nexport OPENBLAS_NUM_THREADS=$OMP_NUM_THREADS\n";
    // One job step of `ranks` tasks is one run (rank 0 records it); srun forwards the trainer's
    // SIGTERM to every rank.
    s += SlurmTrainStep(fmt::format(
        "srun --ntasks={} --cpus-per-task=$OMP_NUM_THREADS --kill-on-bad-exit=1{} "
        "\"$MOELAB\" train \"${{CONFIGS[$TASK]}}\" --db \"$DB\" --name \"${{NAMES[$TASK]}}\" "
        "--resume --no-progress",
        ranks, o.srun_mpi.empty() ? "" : " --mpi=" + o.srun_mpi));
    std::ofstream(script) << s;
    fs::permissions(script, fs::perms::owner_exec | fs::perms::group_exec | fs::perms::others_exec,
                    fs::perm_options::add);
    out.push_back({script.string(), ranks, static_cast<int>(runs.size())});
  }
  return out;
}

std::string WriteSlurmScript(const Sweep& sweep, const SlurmOptions& options) {
  return WriteSlurmScripts(sweep, options).front().path;
}

std::vector<SlurmJob> LoadSlurmJobs(const std::string& local_db, const std::string& sweep_name) {
  std::vector<SlurmJob> jobs;
  std::ifstream in(JobsFile(local_db, sweep_name));
  if (!in) return jobs;
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (!j.is_array()) return jobs;
  for (const auto& e : j) {
    jobs.push_back({e.value("job_id", ""), e.value("script", ""), e.value("ranks", 1),
                    e.value("tasks", 0), e.value("submitted_at", 0.0)});
  }
  return jobs;
}

std::vector<SlurmJob> SubmitSlurmScripts(const Sweep& sweep,
                                         const std::vector<SlurmScript>& scripts,
                                         const std::string& local_db) {
  if (FindOnPath("sbatch").empty()) {
    throw std::runtime_error(
        "sbatch is not on PATH: submit the scripts on the cluster's login node (sbatch FILE)");
  }
  // The sweep is known locally before its runs come back: `db merge` then joins them to it.
  Store(local_db).UpsertSweep(sweep.name, sweep.spec.dump());
  std::vector<SlurmJob> jobs = LoadSlurmJobs(local_db, sweep.name);
  std::vector<SlurmJob> submitted;
  for (const SlurmScript& s : scripts) {
    std::string out, err;
    const int code = Capture({"sbatch", "--parsable", s.path}, &out, &err);
    std::string id = out.substr(0, out.find_first_of(";\n"));
    if (code != 0 || id.empty() || id.find_first_not_of("0123456789") != std::string::npos) {
      // sbatch says why on stderr ("sbatch: error: invalid partition specified: cpu").
      throw std::runtime_error(
          fmt::format("sbatch {} failed (exit {}): {}{}", s.path, code, err, out));
    }
    submitted.push_back({id, s.path, s.ranks, s.tasks, UnixNow()});
  }
  jobs.insert(jobs.end(), submitted.begin(), submitted.end());
  nlohmann::json j = nlohmann::json::array();
  for (const SlurmJob& job : jobs) {
    j.push_back({{"job_id", job.job_id},
                 {"script", job.script},
                 {"ranks", job.ranks},
                 {"tasks", job.tasks},
                 {"submitted_at", job.submitted_at}});
  }
  const std::string path = JobsFile(local_db, sweep.name);
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path + ".tmp") << j.dump(2) << "\n";
  fs::rename(path + ".tmp", path);
  return submitted;
}

void PrintSlurmJobs(const std::string& local_db, const std::string& sweep_name, std::FILE* out) {
  const std::vector<SlurmJob> jobs = LoadSlurmJobs(local_db, sweep_name);
  if (jobs.empty()) return;
  std::string ids;
  for (const SlurmJob& j : jobs) ids += (ids.empty() ? "" : ",") + j.job_id;
  // job id -> array task ("3", or "[4-7]" for pending tasks sacct has not split) -> state.
  std::map<std::string, std::map<std::string, std::string>> states;
  auto parse = [&](const std::string& text, char sep) {
    size_t start = 0;
    while (start < text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      const std::string line = text.substr(start, end - start);
      start = end + 1;
      const size_t cut = line.find(sep);
      if (cut == std::string::npos) continue;
      const std::string id = line.substr(0, cut);
      std::string state = line.substr(cut + 1);
      state = state.substr(0, state.find_first_of(" |\t"));  // "CANCELLED by 0" -> CANCELLED
      const size_t us = id.find('_');
      const std::string job = id.substr(0, us);
      states[job][us == std::string::npos ? "" : id.substr(us + 1)] = state;
    }
  };
  const bool have_sacct = !FindOnPath("sacct").empty();
  const bool have_squeue = !FindOnPath("squeue").empty();
  std::string text;
  if (have_sacct &&
      Capture({"sacct", "-n", "-X", "-P", "-j", ids, "-o", "JobID,State"}, &text) == 0) {
    parse(text, '|');
  }
  text.clear();
  // squeue wins: it is the live view (sacct may lag behind the controller). `-t all` keeps the
  // tasks that ended within the controller's MinJobAge (5 min by default): on a cluster without
  // accounting (sacct fails) they are all that tells a finished task from a lost one.
  if (have_squeue &&
      Capture({"squeue", "-h", "-r", "-t", "all", "-j", ids, "-o", "%i %T"}, &text) == 0) {
    parse(text, ' ');
  }
  for (const SlurmJob& j : jobs) {
    std::string line = fmt::format("  slurm job {} ({}, {} task(s) x {} rank(s)): ", j.job_id,
                                   fs::path(j.script).filename().string(), j.tasks, j.ranks);
    if (!have_sacct && !have_squeue) {
      fmt::print(out, "{}squeue/sacct not on PATH: cannot follow it from here\n", line);
      continue;
    }
    std::map<std::string, int> counts;
    for (const auto& [task, state] : states[j.job_id]) counts[state]++;
    if (counts.empty()) {
      fmt::print(out, "{}unknown to squeue/sacct (finished long ago, or another cluster)\n", line);
      continue;
    }
    std::string summary;
    for (const auto& [state, n] : counts)
      summary += fmt::format("{}{} {}", summary.empty() ? "" : ", ", n, state);
    fmt::print(out, "{}{}\n", line, summary);
  }
  fmt::print(out, "  when the jobs are done: moelab db merge <cluster db> --db {}\n", local_db);
}

}  // namespace moelab::sweeps
