// Sweep specs: a JSON document describing a family of runs (a base config plus axes, explicit
// runs, random samples, seeds and derived fields) expanded into fully validated run configs.
// docs/sweeps.md is the reference for the format and the evaluation order.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"
#include "core/printable.h"
#include "sweeps/adaptive_spec.h"

namespace moelab::sweeps {

using ojson = nlohmann::ordered_json;

// Any problem with a spec. The message says where (the spec key, the run with its variables,
// the config path) and why; a sweep with a SpecError never starts anything. Control characters
// that came from the spec are escaped (a NUL in a key would otherwise cut the message short).
class SpecError : public std::runtime_error {
 public:
  explicit SpecError(const std::string& what)
      : std::runtime_error(PrintableText(what, /*keep_line_breaks=*/true)) {}
};

// One expanded run.
struct SweepRun {
  int index = 0;  // position in the expansion order (0-based)
  // What defines this run, in order: the assignments from runs/zip/grid/random/seeds (sweep
  // variables and config paths), then the derived fields. Recorded as the run's variables.
  ojson vars = ojson::object();
  std::vector<std::string> assigned_keys;  // the non-derived keys of vars (used in names)
  RunConfig config;                        // validated
  std::string hash;                        // ConfigHash(config)
  std::string branch_hash;                 // BranchHash(config)
  std::string name;                        // "<sweep>/<key=value,...>"
  int duplicate_of = -1;  // index of an earlier run of the sweep with the same hash
  // Processes that train this run (the spec's "ranks", per run or for the sweep; not hashed:
  // the trajectory does not depend on it). sweeps/launch.h checks it against the layout.
  int ranks = 1;
  int runs_index = -1;  // which entry of the spec's "runs" list made this run (-1: none)
};

struct Sweep {
  std::string name;
  // The normalised spec (base inlined), stored in the database so `sweep status|resume NAME`
  // can re-expand it without the spec file.
  ojson spec;
  int ranks = 1;          // the spec's top-level "ranks" (a run's own "ranks" wins)
  bool branching = true;  // WSD branching of runs that differ only in length
  std::vector<SweepRun> runs;
  std::vector<std::string> warnings;
  // The "adaptive" block (sweeps/adaptive_spec.h): the sweep answers a question by training a
  // chosen subset of its runs. Unset for an ordinary sweep.
  std::optional<AdaptiveSpec> adaptive;

  // The runs to train: every run that is not a duplicate of an earlier one.
  std::vector<const SweepRun*> Unique() const;
};

// Reads a spec file; a "base" given as a path is resolved relative to the spec file and
// inlined. Throws SpecError.
ojson LoadSpecFile(const std::string& path);
// The same from the spec's text (an editor's buffer); `path` names it in messages, gives the
// default name (its stem) and the folder a "base" path is resolved in. A JSON syntax error says
// "line L, column C". Throws SpecError.
ojson ParseSpecText(const std::string& text, const std::string& path);

struct ExpandOptions {
  // Check that corpus data (data.source "corpus") exists and fits the vocabulary.
  bool check_data = false;
  // Check that train.device can be used on this machine (`sweep plan` / `sweep run`: a "cuda"
  // run without a usable GPU is refused before anything starts; `sweep slurm` targets another
  // machine and does not check).
  bool check_device = false;
  // How many invalid runs an error message lists before summarising the rest.
  int max_errors_listed = 12;
  // Refuse, before expanding anything, a spec whose runs × zip × grid × random × seeds product
  // exceeds this (a typo in a grid can ask for millions of runs). The spec's "max_runs" raises
  // it; so does `--max-runs` (this field) on the command line. 0 = the default, 10,000.
  int64_t max_runs = 0;
};

constexpr int64_t kDefaultMaxRuns = 10000;

// The number of runs a spec expands to (before dedupe), from the axis lengths alone: nothing is
// expanded. Saturates at INT64_MAX. Throws SpecError for malformed axes.
int64_t CountSpecRuns(const ojson& spec, std::string* breakdown = nullptr);

// Expands and validates every run. Throws SpecError naming every invalid run.
Sweep ExpandSpec(const ojson& spec, const ExpandOptions& options = {});
inline Sweep LoadSweep(const std::string& path, const ExpandOptions& options = {}) {
  return ExpandSpec(LoadSpecFile(path), options);
}

// The WSD decay start of a run: steps 1..DecayStart(c) follow the stable phase, so a longer run
// of the same family (same BranchHash) passes through the same state at that step.
int64_t WsdDecayStart(const RunConfig& c);

// WSD branching plan: within each family of unique runs with a "wsd" schedule and the same
// BranchHash, the longest run is trained in full and every shorter run starts at its own decay
// start from the longest run's checkpoint there. One entry per run of sweep.runs (by index);
// parent = -1 for runs trained from scratch (and for every run when branching is off).
struct BranchPlan {
  int parent = -1;  // index of the run whose checkpoint this run starts from
  int64_t step = -1;
};
std::vector<BranchPlan> PlanWsdBranches(const Sweep& sweep);

// A compact "k=v" rendering of a JSON value for names and tables.
std::string ShortValue(const ojson& v);

}  // namespace moelab::sweeps
