// `moelab sweep plan` calibrates in CPU time, not wall time (issue 35): a loaded machine stretches
// the wall clock of the timed steps but not their CPU seconds, so it must not inflate the plan.
// The plan prints CPU-hours and the wall time at --parallel N separately.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <thread>
#include <vector>

#include "core/config.h"
#include "core/flops.h"
#include "sweeps/plan.h"
#include "tests/sweeps/plan_fixture.h"
#include "tests/sweeps/spec_fixture.h"

namespace moelab::sweeps {
namespace {

using test_plans::PlanText;

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

// The spec tests' tiny base, larger so that calibration has steps worth timing.
ojson Spec() {
  ojson s = ojson::parse(R"({"grid": {"train.steps": [100, 200]}, "seeds": [1, 2]})");
  s["name"] = "cpu";
  s["base"] = test_specs::Base();
  s["base"]["model"]["seq_len"] = 32;
  s["base"]["moe"]["experts_total"] = 8;
  s["base"]["moe"]["expert_hidden"] = 32;
  s["base"]["train"]["batch_size"] = 4;
  s["base"]["train"]["steps"] = 100;
  s["base"]["eval"]["every"] = 0;
  return s;
}

TEST(PlanCpuTime, WallSecondsDivideByTheCoresTheRunsKeepBusy) {
  EXPECT_DOUBLE_EQ(WallSeconds(3600, 2, 1, 2), 1800);   // two 1-thread runs on 2 cores
  EXPECT_DOUBLE_EQ(WallSeconds(3600, 1, 1, 16), 3600);  // one 1-thread run uses one core
  EXPECT_DOUBLE_EQ(WallSeconds(3600, 4, 2, 4), 900);    // oversubscribed: the cores bound it
  EXPECT_DOUBLE_EQ(WallSeconds(3600, 0, 0, 0), 3600);   // nonsense counts read as 1
}

TEST(PlanCpuTime, CpuRateFallsBackToTheWallRatePerThread) {
  Throughput t;
  t.flops_per_s = 4e9;
  t.threads = 2;
  EXPECT_DOUBLE_EQ(t.CpuRate(), 2e9);
  t.flops_per_cpu_s = 1.5e9;
  EXPECT_DOUBLE_EQ(t.CpuRate(), 1.5e9);
}

// A rate given, nothing measured: the totals are arithmetic on the CPU rate, and the wall
// time is the CPU time over the cores the parallel runs keep busy.
TEST(PlanCpuTime, TotalsAreCpuHoursAndWallAtParallelSeparately) {
  const Sweep s = ExpandSpec(Spec());
  PlanOptions po;
  po.parallel = 2;
  po.threads_per_run = 1;
  Throughput t;
  t.threads = 1;
  t.flops_per_s = 1;  // a wall rate that, if used, would give absurd hours
  double flops = 0;
  for (const SweepRun* r : s.Unique())
    flops += ForwardFlopsPerToken(r->config).training() * TokensPerStep(r->config) *
             r->config.total_steps();
  t.flops_per_cpu_s = flops / 7200;  // the whole sweep is 2 CPU-hours
  t.how = "given";
  po.throughput = t;
  const std::string text = PlanText(s, po);
  EXPECT_HAS(text, "CPU time 2h00m (2.00 CPU-hours) at 1 thread(s) per run");
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  EXPECT_HAS(text, cores >= 2 ? "about 1h00m wall with --parallel 2" : "about 2h00m wall");
  EXPECT_HAS(text, "CPU time");
  EXPECT_EQ(text.find("est. time"), std::string::npos) << text;
}

// Starts `n` processes that spin until killed: load that is not this process's.
std::vector<pid_t> StartBurners(int n) {
  std::vector<pid_t> pids;
  for (int i = 0; i < n; ++i) {
    const pid_t pid = fork();
    if (pid == 0) {
      volatile unsigned long x = 0;
      for (;;) x = x + 1;
    }
    if (pid > 0) pids.push_back(pid);
  }
  return pids;
}

void StopBurners(const std::vector<pid_t>& pids) {
  for (pid_t pid : pids) kill(pid, SIGKILL);
  for (pid_t pid : pids) waitpid(pid, nullptr, 0);
}

// The measurement: CPU seconds of the timed steps, never more than threads × wall, and a CPU
// rate that load from other processes leaves about where it was while the wall rate drops. On an
// otherwise idle machine a wall-time calibration fails the last check (with 2 burners per core
// it gets about a third of each core).
TEST(PlanCpuTime, LoadFromOtherProcessesDoesNotInflateTheCpuTime) {
  const Sweep s = ExpandSpec(Spec());
  const RunConfig& c = CalibrationRun(s)->config;
  const Throughput quiet = MeasureThroughput(c, 1, 3, 1.0);
  ASSERT_GT(quiet.cpu_s, 0) << quiet.how;
  EXPECT_LE(quiet.cpu_s, 1.05 * quiet.wall_s + 0.05) << quiet.how;
  EXPECT_NEAR(quiet.flops_per_cpu_s * quiet.cpu_s, quiet.flops_per_s * quiet.wall_s,
              1e-6 * quiet.flops_per_s * quiet.wall_s);
  EXPECT_HAS(quiet.how, "CPU time");

  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const std::vector<pid_t> burners = StartBurners(2 * cores);
  const Throughput loaded = MeasureThroughput(c, 1, 3, 1.0);
  StopBurners(burners);
  std::printf("quiet: %s\nloaded: %s\n", quiet.how.c_str(), loaded.how.c_str());
  ASSERT_GT(loaded.cpu_s, 0) << loaded.how;
  EXPECT_GT(loaded.flops_per_cpu_s, 0.6 * quiet.flops_per_cpu_s)
      << "quiet: " << quiet.how << "\nloaded: " << loaded.how;
}

}  // namespace
}  // namespace moelab::sweeps
