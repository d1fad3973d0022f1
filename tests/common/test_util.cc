#include "tests/common/test_util.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>

namespace moelab::test {

namespace fs = std::filesystem;

std::string BinDir() {
  const char* dir = std::getenv("MOELAB_BIN_DIR");
  return dir && *dir ? dir : MOELAB_BIN_DIR_DEFAULT;
}

std::string SourceDir() {
  const char* dir = std::getenv("MOELAB_SOURCE_DIR");
  return dir && *dir ? dir : MOELAB_SOURCE_DIR_DEFAULT;
}

std::string BinPath(const std::string& name) { return BinDir() + "/" + name; }

pid_t Spawn(const std::vector<std::string>& argv, const std::string& log) {
  std::vector<std::string> args = argv;
  if (!args.empty() && args[0].find('/') == std::string::npos) args[0] = BinPath(args[0]);
  std::vector<char*> cargs;
  for (std::string& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (!log.empty()) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
    }
    ::execv(cargs[0], cargs.data());
    _exit(127);
  }
  return pid;
}

pid_t SpawnFunction(const std::function<int()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    int code = 99;
    try {
      code = body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child %d: %s\n", ::getpid(), e.what());
    }
    _exit(code);
  }
  return pid;
}

int Wait(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

int Run(const std::vector<std::string>& argv, const std::string& log) {
  return Wait(Spawn(argv, log));
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string RunCapture(const std::string& cmd, int* exit_code) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = pclose(p);
  *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

TempDir::TempDir(const std::string& prefix) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = info ? std::string(info->test_suite_name()) + "." + info->name() : "none";
  for (char& c : name) {
    if (c == '/') c = '_';
  }
  path_ = fs::temp_directory_path() /
          ("moelab_" + prefix + "_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(path_);
  fs::create_directories(path_);
}

TempDir::~TempDir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  if (info && info->result()->Failed()) return;
  if (std::getenv("MOELAB_KEEP_TEST_DIR")) return;
  std::error_code ec;
  fs::remove_all(path_, ec);
}

nlohmann::json TinyRunConfig(const std::string& ckpt_dir, int steps, int ckpt_every, bool slow) {
  const int d = slow ? 64 : 16;
  return {{"model",
           {{"vocab_size", 32},
            {"d_model", d},
            {"layers", 1},
            {"heads", 2},
            {"ffn_hidden", 32},
            {"seq_len", slow ? 64 : 16}}},
          {"moe", {{"experts_total", 4}, {"experts_active", 2}, {"expert_hidden", d}}},
          {"data", {{"source", "markov"}}},
          {"train", {{"batch_size", slow ? 8 : 2}, {"steps", steps}, {"threads", 1}}},
          {"schedule", {{"warmup_steps", 2}}},
          {"eval", {{"every", 0}, {"batches", 1}}},
          {"checkpoint", {{"every", ckpt_every}, {"dir", ckpt_dir}}}};
}

}  // namespace moelab::test
