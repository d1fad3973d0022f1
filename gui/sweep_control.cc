#include "gui/sweep_control.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "gui/plan_calibration.h"
#include "sweeps/plan.h"
#include "sweeps/runner.h"
#include "sweeps/spec.h"

namespace moelab::gui {

namespace fs = std::filesystem;

void SplitSpecError(const std::string& message, std::string* path, std::string* reason) {
  path->clear();
  *reason = message;
  // "sweep 'x': N of M runs are invalid; ...\n  run #i (vars): config.path: reason": the first
  // invalid run's config path.
  const size_t run = message.find("\n  run #");
  if (run != std::string::npos) {
    const size_t end = message.find('\n', run + 1);
    const std::string line =
        message.substr(run + 3, end == std::string::npos ? end : end - run - 3);
    const size_t close = line.find("): ");
    if (close != std::string::npos) {
      const std::string rest = line.substr(close + 3);
      const size_t colon = rest.find(": ");
      if (colon != std::string::npos && rest.find(' ') > colon) {
        *path = rest.substr(0, colon);
        *reason = line.substr(0, close + 1) + ": " + rest.substr(colon + 2);
        return;
      }
    }
    *reason = line;
    return;
  }
  // "file: not valid JSON (line L, column C): detail"
  const size_t json = message.find("not valid JSON (line ");
  if (json != std::string::npos) {
    const size_t open = message.find('(', json);
    const size_t close = message.find(')', open);
    *path = message.substr(open + 1, close - open - 1);
    *reason = "not valid JSON" + message.substr(close + 1);
    return;
  }
  // "where: reason" with `where` a JSON path (grid.moe.x, runs[2], derived[0] 'a = b').
  const size_t colon = message.find(": ");
  if (colon != std::string::npos && message.find('\n') > colon) {
    *path = message.substr(0, colon);
    *reason = message.substr(colon + 2);
  }
}

SpecCheck CheckSpecText(const std::string& text, const std::string& path,
                        const std::string& db_path, int parallel, PlanCalibrator* calibrator) {
  SpecCheck c;
  try {
    const sweeps::ojson spec = sweeps::ParseSpecText(text, path);
    if (spec.contains("name") && spec["name"].is_string()) c.name = spec["name"];
    sweeps::ExpandOptions eo;
    eo.check_data = true;
    const sweeps::Sweep sweep = sweeps::ExpandSpec(spec, eo);
    c.name = sweep.name;
    c.runs = static_cast<int>(sweep.runs.size());
    c.unique = static_cast<int>(sweep.Unique().size());
    c.warnings = sweep.warnings;
    sweeps::PlanOptions po;
    po.calibrate = false;  // never here, on the UI thread: the calibrator measures
    po.db_path = db_path;
    po.parallel = c.parallel = std::max(1, parallel);
    po.threads_per_run = sweeps::ThreadsPerRun(po.parallel);
    if (calibrator) {
      if (const sweeps::SweepRun* largest = sweeps::CalibrationRun(sweep)) {
        po.throughput = calibrator->Rate(largest->hash, po.threads_per_run, largest->config);
        c.calibrating = !po.throughput.has_value();
        if (po.throughput) c.time_estimate = po.throughput->how;
        po.uncalibrated = "measuring the rate in the background";
      }
    }
    char* buf = nullptr;
    size_t len = 0;
    if (std::FILE* f = open_memstream(&buf, &len)) {
      sweeps::PrintPlan(sweep, po, f);
      std::fclose(f);
      c.plan.assign(buf, len);
      std::free(buf);
    }
    c.ok = true;
  } catch (const std::exception& e) {
    c.error = e.what();
    SplitSpecError(c.error, &c.error_path, &c.error_reason);
    // A syntax error names the file first: drop it, the editor shows which file it is.
    if (c.error_path.rfind(path + ": ", 0) == 0) c.error_path.erase(0, path.size() + 2);
    if (std::sscanf(c.error_path.c_str(), "line %d, column %d", &c.line, &c.column) != 2) {
      c.line = c.column = 0;
    }
  }
  return c;
}

std::string MoelabBinary() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path next = self.parent_path() / "moelab";
    if (fs::exists(next, ec)) return next.string();
  }
  return "moelab";
}

namespace {

std::string LaunchesPath(const std::string& db_path) {
  return db_path + ".sweeps/gui-launches.jsonl";
}

// Reads exactly sizeof(int) bytes; false at EOF.
bool ReadInt(int fd, int* out) {
  size_t got = 0;
  char* p = reinterpret_cast<char*>(out);
  while (got < sizeof(int)) {
    const ssize_t n = ::read(fd, p + got, sizeof(int) - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    got += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

Launched LaunchDetached(const std::vector<std::string>& argv, const std::string& db_path,
                        const std::string& action, const std::string& log_path) {
  Launched out;
  out.log = log_path;
  std::error_code ec;
  fs::create_directories(fs::path(log_path).parent_path(), ec);
  fs::create_directories(fs::path(LaunchesPath(db_path)).parent_path(), ec);
  // Everything the children use is prepared before fork: after it only async-signal-safe calls.
  std::vector<std::string> args = argv;
  std::vector<char*> cargs;
  for (std::string& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    out.error = std::string("pipe: ") + std::strerror(errno);
    return out;
  }
  const pid_t child = ::fork();
  if (child < 0) {
    out.error = std::string("fork: ") + std::strerror(errno);
    ::close(fds[0]);
    ::close(fds[1]);
    return out;
  }
  if (child == 0) {
    ::setsid();  // its own session: no terminal, not in the GUI's process group
    const pid_t grandchild = ::fork();
    if (grandchild != 0) {
      int pid = static_cast<int>(grandchild);
      if (::write(fds[1], &pid, sizeof pid) < 0) _exit(1);
      _exit(0);  // the grandchild is reparented to init: never a zombie of the GUI
    }
    const int in = ::open("/dev/null", O_RDONLY);
    const int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (in >= 0) ::dup2(in, 0);
    if (log >= 0) {
      ::dup2(log, 1);
      ::dup2(log, 2);
    }
    ::execvp(cargs[0], cargs.data());
    int err = errno;
    if (::write(fds[1], &err, sizeof err) < 0) _exit(127);
    _exit(127);
  }
  ::close(fds[1]);
  int pid = -1, err = 0;
  const bool have_pid = ReadInt(fds[0], &pid);
  const bool exec_failed = have_pid && ReadInt(fds[0], &err);  // EOF: exec closed the pipe
  ::close(fds[0]);
  while (::waitpid(child, nullptr, 0) < 0 && errno == EINTR) {
  }
  if (!have_pid) {
    out.error = "could not start the process";
  } else if (exec_failed) {
    out.error = "cannot execute " + argv[0] + ": " + std::strerror(err);
  } else {
    out.pid = pid;
  }
  nlohmann::json rec = {
      {"time",
       std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()},
      {"action", action},
      {"argv", argv},
      {"pid", out.pid},
      {"log", log_path}};
  if (!out.error.empty()) rec["error"] = out.error;
  std::ofstream(LaunchesPath(db_path), std::ios::app) << rec.dump() << "\n";
  return out;
}

void RecordAction(const std::string& db_path, const std::string& action, int pid,
                  const std::string& target) {
  std::error_code ec;
  fs::create_directories(fs::path(LaunchesPath(db_path)).parent_path(), ec);
  const nlohmann::json rec = {
      {"time",
       std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()},
      {"action", action},
      {"pid", pid},
      {"target", target}};
  std::ofstream(LaunchesPath(db_path), std::ios::app) << rec.dump() << "\n";
}

std::vector<std::string> LaunchRecords(const std::string& db_path) {
  std::vector<std::string> out;
  std::ifstream in(LaunchesPath(db_path));
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(line);
  }
  return out;
}

bool ProcessAlive(int pid) {
  if (pid <= 0 || ::kill(pid, 0) != 0) return false;
  // kill(pid, 0) also succeeds for a zombie.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string s;
  std::getline(stat, s);
  const size_t close = s.rfind(')');
  return close == std::string::npos || close + 2 >= s.size() || s[close + 2] != 'Z';
}

int SweepRunnerPid(const std::string& db_path, const std::string& sweep_name) {
  std::ifstream lock(sweeps::SweepDir(db_path, sweep_name) + "/lock");
  int pid = -1;
  if (!(lock >> pid) || !ProcessAlive(pid)) return -1;
  // The lock file keeps the last runner's pid: make sure that pid is still a sweep runner.
  std::ifstream cmd("/proc/" + std::to_string(pid) + "/cmdline");
  std::stringstream ss;
  ss << cmd.rdbuf();
  std::string c = ss.str();
  for (char& ch : c) ch = ch == '\0' ? ' ' : ch;
  return c.find(" sweep ") != std::string::npos ? pid : -1;
}

bool Terminate(int pid, std::string* error) {
  if (!ProcessAlive(pid)) {
    if (error) *error = "process " + std::to_string(pid) + " is not running";
    return false;
  }
  if (::kill(pid, SIGTERM) != 0) {
    if (error) *error = "kill " + std::to_string(pid) + ": " + std::strerror(errno);
    return false;
  }
  return true;
}

}  // namespace moelab::gui
