#include "sweeps/runner.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "core/flops.h"
#include "core/host.h"
#include "core/run_shape.h"
#include "core/train/checkpoint.h"
#include "core/train/progress.h"
#include "core/train/trainer.h"
#include "db/reader.h"
#include "db/writer.h"
#include "sweeps/launch.h"
#include "sweeps/plan.h"
#include "sweeps/slurm.h"
#include "sweeps/store.h"
#include "sweeps/trainer_process.h"

namespace moelab::sweeps {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string Sanitize(const std::string& name) {
  std::string s = name;
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '_' && ch != '.')
      ch = '_';
  return s;
}

double TrainingFlops(const RunConfig& c) {
  return ForwardFlopsPerToken(c).training() * static_cast<double>(c.total_steps()) *
         static_cast<double>(TokensPerStep(c));
}

enum class State { kQueued, kRunning, kAdopted, kDone, kFailed, kDiverged, kStopped };

// The database status a scheduler state stands for: an adopted trainer is a running run that
// another process started.
RunStatus DbStatusOf(State s) {
  switch (s) {
    case State::kQueued:
      return RunStatus::kQueued;
    case State::kRunning:
    case State::kAdopted:
      return RunStatus::kRunning;
    case State::kDone:
      return RunStatus::kDone;
    case State::kFailed:
      return RunStatus::kFailed;
    case State::kDiverged:
      return RunStatus::kDiverged;
    case State::kStopped:
      return RunStatus::kStopped;
  }
  return RunStatus::kFailed;
}

// The live view's name: the database's spelling, with adopted trainers marked "running*".
std::string StateName(State s) {
  const std::string name = ToString(DbStatusOf(s));
  return s == State::kAdopted ? name + "*" : name;
}

struct Job {
  const SweepRun* run = nullptr;
  int64_t run_id = 0;
  std::string ckpt_dir;
  State state = State::kQueued;
  bool reused = false;
  int failures = 0;
  bool retryable = true;
  pid_t pid = -1;
  double launched_at = 0;
  std::string log;
  // The run row's recorded name: another sweep's when the row is shared (`moelab train` checks
  // --name against it), else run->name.
  std::string row_name;
  // WSD branching: this run starts its decay from parent's checkpoint at branch_step; or, when
  // `extends`, its stable phase from the parent's (a done shorter run of its family: the
  // parent's checkpoint at the parent's own decay start).
  bool extends = false;
  int parent = -1;
  int64_t branch_step = -1;
  std::vector<int64_t> branch_steps;  // as a parent: keep checkpoints at these steps
  double flops_total = 0;
};

class Scheduler {
 public:
  Scheduler(const Sweep& sweep, const RunOptions& options)
      : sweep_(sweep), opt_(options), store_(options.db_path) {
    bin_ = opt_.moelab_bin.empty() ? SelfExe() : opt_.moelab_bin;
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    cores_ = cores;
    opt_.parallel = std::max(1, opt_.parallel);
    // The same default `sweep plan` estimates with, so its times are for these runs.
    threads_ = opt_.threads_per_run > 0 ? opt_.threads_per_run : ThreadsPerRun(opt_.parallel);
    if (opt_.parallel * threads_ > cores) {
      fmt::print(opt_.out,
                 "moelab sweep: note: {} parallel runs × {} threads = {} threads on {} cores "
                 "(oversubscribed: runs slow each other down)\n",
                 opt_.parallel, threads_, opt_.parallel * threads_, cores);
    }
    live_ = opt_.live >= 0 ? opt_.live == 1 : isatty(fileno(opt_.out));
    dir_ = SweepDir(opt_.db_path, sweep_.name);
    fs::create_directories(fs::path(dir_) / "logs");
  }

  // The lock dies with the object, not only with the process: an adaptive sweep runs one
  // Scheduler per batch in one process (a leaked flock would refuse its second batch).
  ~Scheduler() {
    if (lock_fd_ >= 0) ::close(lock_fd_);
  }
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  RunSummary Run() {
    Lock();
    sweep_id_ = store_.UpsertSweep(sweep_.name, sweep_.spec.dump());
    {
      // Sweeps of one database prepare one at a time, so a second sweep started at the same
      // moment sees the first one's run rows and shares them instead of making its own.
      const int fd = LockFile(fs::path(dir_).parent_path() / "prepare.lock", /*wait=*/true);
      Prepare();
      ::close(fd);
    }
    PlanBranches();
    start_ = Now();
    Loop();
    return Summarise();
  }

 private:
  static double Now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  // Opens and flocks `path` (created if missing); returns the descriptor, or -1 when `wait` is
  // false and another process holds the lock.
  static int LockFile(const fs::path& path, bool wait) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) throw std::runtime_error(fmt::format("cannot open {}", path.string()));
    while (flock(fd, LOCK_EX | (wait ? 0 : LOCK_NB)) != 0) {
      if (!wait || errno != EINTR) {
        ::close(fd);
        return -1;
      }
    }
    return fd;
  }

  // Marks the run as started by this process unless a live process already runs it (another
  // sweep sharing the row): one atomic UPDATE, so two sweeps never both launch a run.
  bool Claim(const Job& job) {
    db::Statement st = store_.connection().Prepare(R"sql(
UPDATE runs SET status = 'running', pid = ?2, host = ?3, heartbeat_at = ?4
WHERE id = ?1 AND NOT (status = 'running' AND heartbeat_at > ?4 - ?5))sql");
    st.BindAll(job.run_id, static_cast<int64_t>(getpid()), HostName(), db::UnixNow(), kStaleAfterS)
        .Run();
    return store_.connection().changes() == 1;
  }

  void Lock() {
    const std::string path = dir_ + "/lock";
    lock_fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock_fd_ < 0) throw std::runtime_error(fmt::format("cannot open {}", path));
    // flock dies with the process, so a sweep killed with -9 never leaves a stale lock.
    if (flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
      std::string owner;
      std::ifstream(path) >> owner;
      throw SweepBusyError(fmt::format(
          "sweep '{}' is already being run by another process (pid {}); wait for it or stop "
          "it with Ctrl-C / kill -INT",
          sweep_.name, owner.empty() ? "?" : owner));
    }
    if (ftruncate(lock_fd_, 0) == 0) {
      const std::string pid = std::to_string(getpid()) + "\n";
      if (::write(lock_fd_, pid.data(), pid.size()) < 0) {
        // The pid is only informational.
      }
    }
  }

  // The checkpoint folder another sweep keeps `run_id` in; "" when no other sweep has it.
  std::string OtherSweepCheckpointDir(int64_t run_id) {
    db::Statement st = store_.connection().Prepare(
        "SELECT checkpoint_dir FROM sweep_runs WHERE run_id = ?1 AND sweep_id != ?2 AND "
        "checkpoint_dir IS NOT NULL AND checkpoint_dir != '' LIMIT 1");
    st.Bind(1, run_id).Bind(2, sweep_id_);
    return st.Step() ? st.Text(0) : "";
  }

  // Finds or creates the run row of every unique config and decides its initial state.
  void Prepare() {
    db::Reader reader(opt_.db_path);
    std::map<std::string, std::vector<Member>> members_by_hash;
    std::map<int64_t, Member> members;
    for (const Member& m : store_.Members(sweep_id_)) members[m.run_id] = m;
    for (const RunRow& row : reader.ListRuns(kStaleAfterS)) {
      rows_by_hash_[row.config_hash].push_back(row);
    }
    const std::string host = HostName();
    for (const SweepRun* run : sweep_.Unique()) {
      Job job;
      job.run = run;
      job.flops_total = TrainingFlops(run->config);
      const std::vector<RunRow>& same = rows_by_hash_[run->hash];
      // 1) This sweep's own (newest) run of the config, whatever its state: resume continues it.
      const RunRow* mine = nullptr;
      for (const RunRow& r : same)
        if (members.count(r.id)) mine = &r;
      // 2) Otherwise a done run anywhere in the database is reused.
      const RunRow* done = nullptr;
      for (const RunRow& r : same)
        if (r.status == RunStatus::kDone) done = &r;
      if (opt_.rerun && mine && mine->status == RunStatus::kDone &&
          !rerun_created_.count(run->hash)) {
        mine = nullptr;  // --rerun: a fresh run next to the done one
      }
      if (!mine && done && !opt_.rerun) {
        // A done run of another sweep, reused. Its checkpoint folder (that sweep's link) comes
        // with it, so a longer run of its family here extends it from its kept decay-start
        // checkpoint (PlanExtensions) as it would in its own sweep.
        Member m;
        m.checkpoint_dir = OtherSweepCheckpointDir(done->id);
        store_.Link(sweep_id_, done->id, run->index, m.checkpoint_dir);
        mine = done;
        members[done->id] = m;
      }
      // 3) Otherwise the config queued, running, stopped or failed in another sweep of this
      // database is shared: both sweeps follow one run row (and its checkpoint folder), and
      // whichever launches it first trains it (Claim) while the other waits for it.
      if (!mine && !opt_.rerun) {
        for (const RunRow& r : same) {
          if (r.status == RunStatus::kDone || r.status == RunStatus::kDiverged) continue;
          const std::string ckpt = OtherSweepCheckpointDir(r.id);
          if (ckpt.empty()) continue;
          Member m;
          m.checkpoint_dir = ckpt;
          members[r.id] = m;
          mine = &r;
        }
      }
      if (mine) {
        job.run_id = mine->id;
        job.row_name = mine->name;
        const Member& m = members[mine->id];
        job.failures = m.failures;
        job.retryable = m.retryable;
        job.ckpt_dir = m.checkpoint_dir;
        if (mine->status == RunStatus::kDone) {
          job.state = State::kDone;
          job.reused = true;
        } else if (mine->status == RunStatus::kDiverged) {
          job.state = State::kDiverged;
          job.reused = true;
        } else if (mine->status == RunStatus::kFailed) {
          job.state =
              job.retryable && job.failures <= opt_.max_retries ? State::kQueued : State::kFailed;
        } else if (mine->status == RunStatus::kRunning) {
          // A live trainer (its sweep process was killed, or it was started by another sweep
          // invocation) is adopted and waited for, never started twice.
          const bool alive = mine->pid && mine->host == host && !mine->stale &&
                             ProcessAlive(static_cast<pid_t>(*mine->pid));
          if (alive) {
            job.state = State::kAdopted;
            job.pid = static_cast<pid_t>(*mine->pid);
          } else {
            job.state = State::kQueued;  // crashed with the sweep: resume from its checkpoint
          }
        } else {
          job.state = State::kQueued;  // queued or stopped
        }
      } else {
        db::RunInfo info;
        info.name = run->name;
        info.config_json = ConfigToJson(run->config).dump();
        info.config_hash = run->hash;
        info.sweep_id = sweep_id_;
        info.shape = RunShapeOf(run->config);
        info.host = host;
        job.run_id = db::RunWriter::CreateRun(opt_.db_path, info, RunStatus::kQueued);
        for (auto it = run->vars.begin(); it != run->vars.end(); ++it) {
          db::RunWriter::SetRunVar(opt_.db_path, job.run_id, it.key(), ShortValue(it.value()));
        }
        rerun_created_.insert(run->hash);
        job.state = State::kQueued;
      }
      if (job.ckpt_dir.empty() && !job.reused) {
        // One folder per run row, named by its UUID (<checkpoint.dir>/<hash16>/<uuid>): a rerun,
        // a second sweep's run of the same config, or a deleted database's run whose
        // checkpoints are still on disk never shares it; the trainer adopts only checkpoints
        // carrying the run's UUID anyway.
        const std::optional<RunRow> row = reader.GetRun(job.run_id);
        job.ckpt_dir = fs::absolute(DefaultCheckpointDir(run->config, row ? row->uuid : ""))
                           .lexically_normal()
                           .string();
      }
      store_.Link(sweep_id_, job.run_id, run->index, job.ckpt_dir);
      job.log = fmt::format("{}/logs/run{}.log", dir_, job.run_id);
      jobs_.push_back(std::move(job));
    }
  }

  // WSD branching: within a family (same BranchHash, WSD schedule) the longest run keeps a
  // checkpoint at every shorter run's decay start; the shorter runs start there.
  void PlanBranches() {
    const std::vector<BranchPlan> plan = PlanWsdBranches(sweep_);
    std::map<int, int> job_of_run;
    for (size_t i = 0; i < jobs_.size(); ++i) job_of_run[jobs_[i].run->index] = i;
    for (Job& child : jobs_) {
      const BranchPlan& b = plan[child.run->index];
      // A child already finished needs no branch point.
      if (b.parent < 0 || child.state == State::kDone || child.state == State::kDiverged) {
        continue;
      }
      child.parent = job_of_run.at(b.parent);
      child.branch_step = b.step;
      Job& parent = jobs_[child.parent];
      if (std::find(parent.branch_steps.begin(), parent.branch_steps.end(), b.step) ==
          parent.branch_steps.end()) {
        parent.branch_steps.push_back(b.step);
      }
      store_.SetBranch(sweep_id_, child.run_id, parent.run_id, b.step);
    }
    PlanExtensions();
    for (Job& job : jobs_) std::sort(job.branch_steps.begin(), job.branch_steps.end());
  }

  // WSD extension (RunOptions::extendable): the longest run of a family, not yet started,
  // continues the stable phase of a done shorter run whose checkpoint at its own decay start
  // was kept (the latest such), when every shorter run still to train branches at or after
  // that step. Its steps up to there are the shorter run's, bit for bit (as for a branch).
  void PlanExtensions() {
    std::map<std::string, std::vector<int>> family;  // branch hash -> WSD jobs
    for (size_t i = 0; i < jobs_.size(); ++i) {
      const RunConfig& c = jobs_[i].run->config;
      if (sweep_.branching && c.schedule.type == "wsd") {
        family[jobs_[i].run->branch_hash].push_back(static_cast<int>(i));
      }
    }
    db::Reader reader(opt_.db_path);
    for (const auto& [hash, members] : family) {
      for (int j : members) {
        Job& job = jobs_[j];
        if (job.parent >= 0 || job.state != State::kQueued) continue;
        const std::optional<RunRow> row = reader.GetRun(job.run_id);
        if (!row || row->last_step > 0) continue;  // it has its own start already
        const int64_t own_decay = WsdDecayStart(job.run->config);
        int from = -1;
        int64_t step = -1;
        for (int k : members) {
          const Job& done = jobs_[k];
          const int64_t at = WsdDecayStart(done.run->config);
          if (k == j || done.state != State::kDone || done.ckpt_dir.empty() || at > own_decay ||
              at <= step || done.run->config.total_steps() >= job.run->config.total_steps() ||
              CheckpointAtStep(BranchCheckpointDir(done.ckpt_dir), at).empty()) {
            continue;
          }
          from = k;
          step = at;
        }
        if (from < 0) continue;
        bool children_later = true;  // every branch of this run still to train starts >= step
        for (const Job& child : jobs_) {
          if (child.parent == j && !child.extends && child.branch_step < step) {
            children_later = false;
          }
        }
        if (!children_later) continue;
        job.parent = from;
        job.branch_step = step;
        job.extends = true;
        store_.SetBranch(sweep_id_, job.run_id, jobs_[from].run_id, step);
      }
    }
  }

  // The branch checkpoint a child starts from, "" while it should wait, or "-" to train it
  // from scratch (the parent ended without reaching the branch point).
  std::string BranchSource(const Job& job, db::Reader& reader) {
    if (job.parent < 0) return "-";
    const Job& parent = jobs_[job.parent];
    const std::string ckpt =
        parent.ckpt_dir.empty()
            ? ""
            : CheckpointAtStep(BranchCheckpointDir(parent.ckpt_dir), job.branch_step);
    const auto row = reader.GetRun(parent.run_id, kStaleAfterS);
    const bool recorded = row && row->last_step >= job.branch_step;
    if (!ckpt.empty() && recorded) return ckpt;
    const bool parent_over = parent.state == State::kDone || parent.state == State::kFailed ||
                             parent.state == State::kDiverged || parent.state == State::kStopped;
    return parent_over ? "-" : "";
  }

  void Launch(Job& job, const std::string& init_from) {
    const RunConfig& c = job.run->config;
    json config = ConfigToJson(c);
    // Not hashed: the run's identity is unchanged. A run continuing from a checkpoint keeps the
    // thread count it trained with: another would leave its recorded trajectory, which `moelab
    // train` refuses (--allow-nondeterministic-resume).
    int run_threads = threads_;
    if (const std::optional<RunRow> row = db::Reader(opt_.db_path).GetRun(job.run_id);
        row && row->threads && row->checkpoint_step.value_or(0) > 0) {
      run_threads = *row->threads;
    }
    config["train"]["threads"] = run_threads;
    const std::string cfg_path = fmt::format("{}/{}.json", dir_, job.run->hash.substr(0, 16));
    {
      const std::string tmp = cfg_path + ".tmp" + std::to_string(getpid());
      std::ofstream(tmp) << config.dump(2) << "\n";
      fs::rename(tmp, cfg_path);
    }
    std::vector<std::string> args;
    args.insert(args.end(), {bin_, "train", cfg_path, "--db", opt_.db_path, "--run-id",
                             std::to_string(job.run_id), "--name",
                             job.row_name.empty() ? job.run->name : job.row_name, "--no-progress",
                             "--checkpoint-dir", job.ckpt_dir, "--resume"});
    if (!init_from.empty()) {
      args.insert(args.end(), {"--init-from", init_from});
      store_.CopyRowsUpTo(jobs_[job.parent].run_id, job.run_id, job.branch_step);
    }
    std::vector<int64_t> keep = job.branch_steps;
    if (opt_.extendable && sweep_.branching && c.schedule.type == "wsd") {
      // Its own decay start, for a longer run of its family to extend (PlanExtensions).
      const int64_t own = WsdDecayStart(c);
      if (own >= c.schedule.warmup_steps && own >= 1 && own < c.total_steps() &&
          std::find(keep.begin(), keep.end(), own) == keep.end()) {
        keep.push_back(own);
        std::sort(keep.begin(), keep.end());
      }
    }
    if (!keep.empty()) {
      args.push_back("--branch-steps");
      args.push_back(fmt::format("{}", fmt::join(keep, ",")));
    }
    // A multi-rank run is one `mpirun -np N moelab train ...`: one run row, rank 0 records.
    const bool as_root = ::geteuid() == 0;
    args = MpirunCommand(job.run->ranks, args, cores_, as_root);
    const auto mpi_env = job.run->ranks > 1 ? MpirunEnvironment(as_root)
                                            : std::vector<std::pair<std::string, std::string>>{};
    const pid_t parent_pid = getpid();
    const std::string threads = std::to_string(run_threads);
    const pid_t pid = fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      // Own process group: a terminal Ctrl-C reaches only the sweep, which forwards it, so
      // every trainer gets exactly one SIGINT. If the sweep dies (even by kill -9) the trainers
      // get SIGTERM, checkpoint and stop: `sweep resume` continues them.
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != parent_pid) _exit(kExitStopped);
      const int fd = ::open(job.log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
      }
      // The run row carries this sweep's pid since Claim: the trainer takes over from it
      // (cli/train_resume.cc) instead of refusing a run "being trained right now".
      setenv("MOELAB_CLAIMED_BY", std::to_string(parent_pid).c_str(), 1);
      setenv("OMP_NUM_THREADS", threads.c_str(), 1);
      setenv("OPENBLAS_NUM_THREADS", threads.c_str(), 1);
      for (const auto& [k, v] : mpi_env) setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execvp(argv[0], argv.data());
      fmt::print(stderr, "moelab sweep: cannot execute {}: {}\n", argv[0], strerror(errno));
      _exit(127);
    }
    job.pid = pid;
    job.state = State::kRunning;
    job.launched_at = Now();
    Event(fmt::format("start  #{:<3} run {:<5} {}{}{}", job.run->index, job.run_id, job.run->name,
                      job.run->ranks > 1 ? fmt::format(" ({} ranks)", job.run->ranks) : "",
                      init_from.empty() ? ""
                      : job.extends ? fmt::format(" (extends run {}: its stable phase to step {})",
                                                  jobs_[job.parent].run_id, job.branch_step)
                                    : fmt::format(" (branch of run {} at step {})",
                                                  jobs_[job.parent].run_id, job.branch_step)));
  }

  void Finished(Job& job, int wait_status, db::Reader& reader) {
    job.pid = -1;
    const auto row = reader.GetRun(job.run_id, kStaleAfterS);
    const int code = WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -1;
    const std::optional<RunStatus> recorded =
        row ? std::optional<RunStatus>(row->status) : std::nullopt;
    if (code == kExitDone && recorded == RunStatus::kDone) {
      job.state = State::kDone;
      Event(fmt::format("done   #{:<3} run {:<5} {} loss {:.4f}", job.run->index, job.run_id,
                        job.run->name, row->last_loss.value_or(NAN)));
      return;
    }
    if (code == kExitDiverged || recorded == RunStatus::kDiverged) {
      job.state = State::kDiverged;
      Event(fmt::format("DIVERGED #{} run {} {}: {}", job.run->index, job.run_id, job.run->name,
                        row ? row->error : ""));
      return;
    }
    if (code == kExitStopped) {
      job.state = State::kStopped;
      Event(fmt::format("stopped #{} run {} {} (resumable)", job.run->index, job.run_id,
                        job.run->name));
      return;
    }
    std::string error;
    if (WIFSIGNALED(wait_status)) {
      error = fmt::format("trainer process killed by signal {} ({})", WTERMSIG(wait_status),
                          strsignal(WTERMSIG(wait_status)));
    } else if (recorded == RunStatus::kFailed && row && !row->error.empty()) {
      error = row->error;
    } else {
      error = fmt::format("trainer exited with code {}: {}", code, LastLine(job.log));
    }
    // A config error (exit 2) fails the same way every time: retrying it only wastes time.
    const bool retryable = code != kExitConfig;
    if (recorded != RunStatus::kFailed || (row && row->error.empty())) {
      db::RunWriter::SetRunStatus(opt_.db_path, job.run_id, RunStatus::kFailed, error);
    }
    store_.RecordFailure(sweep_id_, job.run_id, error, retryable);
    ++job.failures;
    job.retryable = retryable;
    if (retryable && job.failures <= opt_.max_retries && !Stopping()) {
      job.state = State::kQueued;
      Event(
          fmt::format("failed #{} run {} {} (attempt {}), retrying from its last checkpoint: "
                      "{}",
                      job.run->index, job.run_id, job.run->name, job.failures, error));
    } else {
      job.state = State::kFailed;
      Event(fmt::format("FAILED #{} run {} {}: {}", job.run->index, job.run_id, job.run->name,
                        error));
    }
  }

  bool Stopping() const { return opt_.stop_flag && opt_.stop_flag->load(); }

  int Slots(const Job& job) const { return std::min(opt_.parallel, std::max(1, job.run->ranks)); }

  void Loop() {
    db::Reader reader(opt_.db_path);
    bool forwarded = false;
    double last_view = 0;
    for (;;) {
      // Reap our children.
      for (;;) {
        int status = 0;
        const pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0) break;
        for (Job& job : jobs_) {
          if (job.state == State::kRunning && job.pid == pid) Finished(job, status, reader);
        }
      }
      // Adopted trainers (not our children) are watched through their pid and the database.
      for (Job& job : jobs_) {
        if (job.state != State::kAdopted) continue;
        const auto row = reader.GetRun(job.run_id, kStaleAfterS);
        const std::optional<RunStatus> s =
            row ? std::optional<RunStatus>(row->status) : std::nullopt;
        // Over when the process is gone, or when it has recorded its end (it may linger a
        // moment after), or when its heartbeat went stale (hung).
        if (ProcessAlive(job.pid) && s == RunStatus::kRunning && !(row && row->stale)) continue;
        // A hung trainer must not write beside the one that continues its run.
        if (row && row->stale && ProcessAlive(job.pid)) ::kill(job.pid, SIGKILL);
        job.pid = -1;
        job.state = s == RunStatus::kDone       ? State::kDone
                    : s == RunStatus::kDiverged ? State::kDiverged
                    : s == RunStatus::kFailed && (job.failures > opt_.max_retries || !job.retryable)
                        ? State::kFailed
                        : State::kQueued;
      }
      if (Stopping()) {
        if (!forwarded) {
          forwarded = true;
          Event(
              "stopping: asking running trainers to checkpoint and stop (Ctrl-C again waits "
              "too; kill -9 of the sweep makes them stop as well)");
          for (Job& job : jobs_)
            if (job.state == State::kRunning) ::kill(job.pid, SIGINT);
        }
      } else {
        // Slots: a run of N ranks takes N of the --parallel slots (all of them when N is
        // larger, then it runs alone). First come, first served: a wide run is not starved.
        int running = 0;
        for (const Job& job : jobs_)
          if (job.state == State::kRunning || job.state == State::kAdopted) running += Slots(job);
        for (Job& job : jobs_) {
          if (running >= opt_.parallel) break;
          if (job.state != State::kQueued) continue;
          if (running > 0 && running + Slots(job) > opt_.parallel) break;
          std::string init_from;
          if (job.parent >= 0) {
            const std::string src = BranchSource(job, reader);
            if (src.empty()) continue;  // parent has not reached the branch point yet
            if (src != "-") init_from = src;
          }
          if (!Claim(job)) {
            // Another sweep's process is training this shared run: wait for it like for a
            // trainer left running by a killed sweep.
            const auto row = reader.GetRun(job.run_id, kStaleAfterS);
            if (row && row->pid && row->host == HostName() &&
                ProcessAlive(static_cast<pid_t>(*row->pid))) {
              job.state = State::kAdopted;
              job.pid = static_cast<pid_t>(*row->pid);
              Event(fmt::format("#{} run {} {} is being trained by another sweep: waiting for it",
                                job.run->index, job.run_id, job.run->name));
              running += Slots(job);
            }
            continue;
          }
          Launch(job, init_from);
          running += Slots(job);
        }
      }
      bool active = false, waiting = false;
      for (const Job& job : jobs_) {
        active |= job.state == State::kRunning || job.state == State::kAdopted;
        waiting |= job.state == State::kQueued;
      }
      const double now = Now();
      if (now - last_view >= (live_ ? 1.0 : 10.0) || (!active && !waiting)) {
        View(reader, !active && (!waiting || Stopping()));
        last_view = now;
      }
      if (!active && (!waiting || Stopping())) break;
      std::this_thread::sleep_for(std::chrono::duration<double>(opt_.poll_s));
    }
  }

  void Event(const std::string& line) {
    if (live_ && drawn_ > 0) {
      fmt::print(opt_.out, "\x1b[{}A\x1b[J", drawn_);
      drawn_ = 0;
    }
    fmt::print(opt_.out, "{}\n", line);
    std::fflush(opt_.out);
  }

  void View(db::Reader& reader, bool final_view) {
    std::map<State, int> counts;
    double remaining = 0, done_here = 0;
    std::vector<std::string> lines;
    for (Job& job : jobs_) {
      counts[job.state]++;
      std::optional<RunRow> row;
      if (job.state == State::kRunning || job.state == State::kAdopted ||
          job.state == State::kQueued) {
        row = reader.GetRun(job.run_id, kStaleAfterS);
      }
      const double flops_now = row ? row->flops : 0;
      if (job.state == State::kQueued) remaining += std::max(0.0, job.flops_total - flops_now);
      if (job.state == State::kRunning || job.state == State::kAdopted) {
        remaining += std::max(0.0, job.flops_total - flops_now);
        if (row) {
          const std::string loss =
              row->last_loss ? fmt::format("{:.4f}", *row->last_loss) : std::string("-");
          lines.push_back(fmt::format("  {:<8} #{:<3} {:<40} step {:>6}/{:<6} loss {:>7}",
                                      StateName(job.state), job.run->index,
                                      job.run->name.substr(0, 40), row->last_step,
                                      row->shape.total_steps, loss));
        }
      }
      if (job.launched_at > 0) {
        const auto r = row ? row : reader.GetRun(job.run_id, kStaleAfterS);
        if (r) done_here += r->flops;
      }
    }
    const double elapsed = Now() - start_;
    const double rate = elapsed > 2 ? done_here / elapsed : 0;
    const std::string eta = rate > 0 ? ProgressBar::FormatDuration(remaining / rate) : "--";
    const std::string head = fmt::format(
        "sweep {}: {} queued, {} running, {} done, {} failed, {} diverged, {} stopped — "
        "elapsed {}, ETA {}",
        sweep_.name, counts[State::kQueued], counts[State::kRunning] + counts[State::kAdopted],
        counts[State::kDone], counts[State::kFailed], counts[State::kDiverged],
        counts[State::kStopped], ProgressBar::FormatDuration(elapsed), final_view ? "0s" : eta);
    if (live_) {
      if (drawn_ > 0) fmt::print(opt_.out, "\x1b[{}A\x1b[J", drawn_);
      fmt::print(opt_.out, "{}\n", head);
      for (const std::string& l : lines) fmt::print(opt_.out, "{}\n", l);
      drawn_ = final_view ? 0 : static_cast<int>(lines.size()) + 1;
    } else {
      fmt::print(opt_.out, "{}\n", head);
    }
    std::fflush(opt_.out);
  }

  RunSummary Summarise() {
    RunSummary s;
    s.total = static_cast<int>(jobs_.size());
    for (const Job& job : jobs_) {
      switch (job.state) {
        case State::kDone:
          ++s.done;
          s.reused += job.reused;
          break;
        case State::kFailed:
          ++s.failed;
          break;
        case State::kDiverged:
          ++s.diverged;
          break;
        default:
          ++s.stopped;
          break;
      }
    }
    s.exit_code = Stopping() || s.stopped > 0 ? kExitStopped : s.failed > 0 ? 1 : 0;
    fmt::print(opt_.out,
               "sweep {}: {} runs: {} done ({} reused from the database), {} failed, {} "
               "diverged, {} stopped/unfinished\n",
               sweep_.name, s.total, s.done, s.reused, s.failed, s.diverged, s.stopped);
    if (s.stopped > 0 || s.failed > 0) {
      fmt::print(opt_.out, "  continue with: moelab sweep resume {} --db {}\n", sweep_.name,
                 opt_.db_path);
    }
    fmt::print(opt_.out, "  details: moelab sweep status {} --db {}\n", sweep_.name, opt_.db_path);
    return s;
  }

  using RunRow = db::RunRow;

  const Sweep& sweep_;
  RunOptions opt_;
  Store store_;
  std::string bin_;
  std::string dir_;
  int threads_ = 1;
  int cores_ = 1;
  bool live_ = false;
  int drawn_ = 0;
  int lock_fd_ = -1;
  int64_t sweep_id_ = 0;
  double start_ = 0;
  std::vector<Job> jobs_;
  std::map<std::string, std::vector<RunRow>> rows_by_hash_;
  std::set<std::string> rerun_created_;
};

}  // namespace

std::string SweepDir(const std::string& db_path, const std::string& sweep_name) {
  return db_path + ".sweeps/" + Sanitize(sweep_name);
}

RunSummary RunSweep(const Sweep& sweep, const RunOptions& options) {
  Scheduler scheduler(sweep, options);
  return scheduler.Run();
}

Sweep LoadSweepFromArg(const std::string& arg, const std::string& db_path,
                       const ExpandOptions& options) {
  if (fs::is_regular_file(arg)) return LoadSweep(arg, options);
  if (!fs::exists(db_path)) {
    throw SpecError(
        fmt::format("'{}' is not a spec file, and database '{}' does not exist", arg, db_path));
  }
  Store store(db_path);
  const auto row = store.FindSweep(arg);
  if (!row) {
    std::string names;
    for (const SweepRow& s : store.ListSweeps()) names += (names.empty() ? "" : ", ") + s.name;
    throw SpecError(fmt::format("'{}' is neither a spec file nor a sweep in {} (sweeps: {})", arg,
                                db_path, names.empty() ? "none" : names));
  }
  return ExpandSpec(ojson::parse(row->spec_json), options);
}

}  // namespace moelab::sweeps
