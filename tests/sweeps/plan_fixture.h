// Shared by the plan tests (tests/sweeps/plan_fit_test.cc, plan_cpu_time_test.cc,
// tests/experiments/experiments_test.cc): what `moelab sweep plan` prints, as a string.
#pragma once

#include <cstdio>
#include <string>

#include "sweeps/plan.h"

namespace moelab::sweeps::test_plans {

// PrintPlan writes to a FILE*; a temporary file collects it so the tests can search the text.
inline std::string PlanText(const Sweep& s, const PlanOptions& po) {
  std::FILE* f = std::tmpfile();
  if (f == nullptr) return "";
  PrintPlan(s, po, f);
  std::rewind(f);
  std::string text;
  char buf[4096];
  while (std::fgets(buf, sizeof(buf), f)) text += buf;
  std::fclose(f);
  return text;
}

}  // namespace moelab::sweeps::test_plans
