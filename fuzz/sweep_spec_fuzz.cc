// libFuzzer target: the sweep spec (sweeps/spec.h), as `moelab sweep plan SPEC` reads it: the
// text through ParseSpecText, then ExpandSpec (axes, random samples, seeds and the muParser
// derived expressions, every run's config validated).
// Findings: a crash, a hang, a sanitizer report, or any exception other than SpecError (the
// command turns SpecError, and only it, into a clear message and exit code 2).
#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "fuzz/fuzz_util.h"
#include "sweeps/spec.h"

namespace {

// Keeps one input's work small: the size guard refuses specs above this many runs (the spec's
// own "max_runs" is capped to it; the guard itself is exercised).
constexpr int64_t kMaxRuns = 24;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  // A "base" given as a path names a file to read; the fuzzer must not read the machine's files
  // (a FIFO or a device would block), so such specs are only parsed by nlohmann here.
  try {
    const auto probe = moelab::sweeps::ojson::parse(text, nullptr, false, true);
    if (probe.is_object() && probe.contains("base") && probe["base"].is_string()) return 0;
  } catch (...) {
  }
  try {
    moelab::sweeps::ojson spec = moelab::sweeps::ParseSpecText(text, "fuzz.json");
    if (spec.contains("max_runs") && spec["max_runs"].is_number_integer() &&
        spec["max_runs"].get<int64_t>() > kMaxRuns) {
      spec["max_runs"] = kMaxRuns;
    }
    moelab::sweeps::ExpandOptions options;
    options.max_runs = kMaxRuns;
    const moelab::sweeps::Sweep sweep = moelab::sweeps::ExpandSpec(spec, options);
    moelab::sweeps::PlanWsdBranches(sweep);
    for (const auto& run : sweep.runs) moelab::sweeps::WsdDecayStart(run.config);
    // The stored spec re-expands to the same runs (`sweep status|resume NAME` rely on it).
    const moelab::sweeps::Sweep again = moelab::sweeps::ExpandSpec(sweep.spec, options);
    if (again.runs.size() != sweep.runs.size()) {
      moelab::fuzz::Finding("the stored spec expands to a different number of runs");
    }
    for (size_t i = 0; i < sweep.runs.size(); ++i) {
      if (again.runs[i].hash != sweep.runs[i].hash) {
        moelab::fuzz::Finding("the stored spec expands to different configs");
      }
    }
  } catch (const moelab::sweeps::SpecError& e) {
    moelab::fuzz::ExpectClear(e);
  }
  return 0;
}
