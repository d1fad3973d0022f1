#include "sweeps/adaptive_spec.h"

#include <fmt/format.h>

#include <cmath>
#include <set>

#include "sweeps/adaptive_estimand.h"
#include "sweeps/spec.h"

namespace moelab::sweeps {

namespace {

using ojson = nlohmann::ordered_json;

[[noreturn]] void Fail(const std::string& path, const std::string& why) {
  throw SpecError(fmt::format("adaptive.{}: {}", path, why));
}

void CheckKeys(const ojson& o, const std::string& path, const std::set<std::string>& known) {
  for (auto it = o.begin(); it != o.end(); ++it) {
    if (!known.count(it.key())) {
      Fail(path.empty() ? it.key() : path + "." + it.key(),
           fmt::format("unknown key (known: {})", fmt::join(known, ", ")));
    }
  }
}

double PositiveNumber(const ojson& o, const std::string& key, const std::string& path) {
  if (!o[key].is_number() || !(o[key].get<double>() > 0) || !std::isfinite(o[key].get<double>())) {
    Fail(path, fmt::format("expected a positive number, got {}", o[key].dump()));
  }
  return o[key].get<double>();
}

int PositiveInt(const ojson& o, const std::string& key, const std::string& path) {
  if (!o[key].is_number_integer() || o[key].get<int64_t>() < 1 || o[key].get<int64_t>() > 100000) {
    Fail(path, fmt::format("expected a positive integer, got {}", o[key].dump()));
  }
  return o[key].get<int>();
}

void ParseEstimand(const ojson& e, AdaptiveSpec* a) {
  if (!e.is_object())
    Fail("estimand", "expected an object {kind, key, arm (or arms), reference, target_loss}");
  CheckKeys(e, "estimand", {"kind", "key", "arm", "arms", "reference", "target_loss"});
  if (e.contains("kind")) {
    if (!e["kind"].is_string()) Fail("estimand.kind", "expected a string");
    a->kind = e["kind"].get<std::string>();
  }
  if (a->kind != "flops_ratio" && a->kind != "tokens_ratio" && a->kind != "slope") {
    Fail("estimand.kind",
         fmt::format("'{}' is not an estimand the adaptive runner resolves (flops_ratio, "
                     "tokens_ratio: the model-free multiplier at a target loss; slope: its "
                     "per-doubling slope over several arms)",
                     a->kind));
  }
  const char* arms_key = a->IsSlope() ? "arms" : "arm";
  const char* other_key = a->IsSlope() ? "arm" : "arms";
  if (e.contains(other_key)) {
    Fail(fmt::format("estimand.{}", other_key),
         a->IsSlope() ? "a slope compares several arms: give \"arms\": [..]"
                      : "a ratio compares one arm: give \"arm\" (or kind \"slope\" for several)");
  }
  for (const char* k : {"key", arms_key, "reference", "target_loss"}) {
    if (!e.contains(k)) Fail(fmt::format("estimand.{}", k), "missing");
  }
  if (!e["key"].is_string() || e["key"].get<std::string>().empty()) {
    Fail("estimand.key", "expected the name of the sweep key whose values are the arms");
  }
  a->key = e["key"].get<std::string>();
  a->reference = e["reference"];
  if (a->IsSlope()) {
    if (!e["arms"].is_array() || e["arms"].empty()) {
      Fail("estimand.arms", "expected a non-empty list of the key's values");
    }
    if (!a->reference.is_number() || !(a->reference.get<double>() > 0)) {
      Fail("estimand.reference", "a slope needs a positive number (its doublings are log2 ratios)");
    }
    for (size_t i = 0; i < e["arms"].size(); ++i) {
      const ojson& v = e["arms"][i];
      const std::string path = fmt::format("estimand.arms[{}]", i);
      if (!v.is_number() || !(v.get<double>() > 0)) {
        Fail(path, fmt::format("expected a positive number, got {}", v.dump()));
      }
      if (v.get<double>() == a->reference.get<double>()) Fail(path, "equals the reference");
      for (const ojson& w : a->arms)
        if (w == v) Fail(path, fmt::format("{} is listed twice", v.dump()));
      a->arms.push_back(v);
    }
  } else {
    a->arms = {e["arm"]};
    if (e["arm"] == a->reference) Fail("estimand.reference", "equals the arm: nothing to compare");
  }
  a->target_loss = PositiveNumber(e, "target_loss", "estimand.target_loss");
}

void ParseStop(const ojson& s, AdaptiveSpec* a) {
  if (!s.is_object()) Fail("stop", "expected an object {excludes, width}");
  CheckKeys(s, "stop", {"excludes", "width"});
  if (s.contains("excludes")) a->excludes = PositiveNumber(s, "excludes", "stop.excludes");
  if (s.contains("width")) a->width = PositiveNumber(s, "width", "stop.width");
  if (!a->excludes && !a->width)
    Fail("stop", "give excludes (a ratio) or width (hi/lo − 1), or both");
}

// The expanded runs must hold the space the block names.
void CheckSpace(const Sweep& sweep, AdaptiveSpec* a) {
  if (!sweep.spec.contains("seeds")) {
    Fail("min_seeds", "an adaptive sweep draws seeds from the spec's \"seeds\" list; it has none");
  }
  for (const auto& s : sweep.spec["seeds"]) a->seeds.push_back(s.get<int64_t>());
  a->max_seeds = static_cast<int>(a->seeds.size());
  if (a->max_seeds < a->min_seeds) {
    Fail("min_seeds", fmt::format("{} seeds needed before the first look, the spec's \"seeds\" "
                                  "list has {}",
                                  a->min_seeds, a->max_seeds));
  }
  std::vector<bool> has(a->Sides(), false);
  std::set<std::string> budgets;
  for (const SweepRun& r : sweep.runs) {
    if (!r.vars.contains(a->key))
      Fail("estimand.key", fmt::format("'{}' is not a key the sweep's axes assign", a->key));
    if (!r.vars.contains(a->budget_key)) {
      Fail("budget_key", fmt::format("'{}' is not a key the sweep's axes assign", a->budget_key));
    }
    for (int side = 0; side < a->Sides(); ++side)
      has[side] = has[side] || r.vars[a->key] == a->SideValue(side);
    budgets.insert(r.vars[a->budget_key].dump());
  }
  for (int side = 1; side < a->Sides(); ++side) {
    if (!has[side]) {
      Fail(a->IsSlope() ? fmt::format("estimand.arms[{}]", side - 1) : "estimand.arm",
           fmt::format("no run has {} = {}", a->key, a->SideValue(side).dump()));
    }
  }
  if (!has[0]) {
    Fail("estimand.reference", fmt::format("no run has {} = {}", a->key, a->reference.dump()));
  }
  if (budgets.size() < 2) {
    Fail("budget_key", fmt::format("'{}' takes one value: a target needs two budgets to bracket it",
                                   a->budget_key));
  }
}

}  // namespace

AdaptiveSpec ParseAdaptiveSpec(const ojson& block, const Sweep& sweep) {
  AdaptiveSpec a;
  if (!block.is_object())
    throw SpecError("adaptive: expected an object (see docs/sweeps-adaptive.md)");
  CheckKeys(block, "",
            {"estimand", "budget_key", "budget", "stop", "alpha", "min_seeds", "seeds_per_batch"});
  if (!block.contains("estimand")) Fail("estimand", "missing: the question the sweep answers");
  ParseEstimand(block["estimand"], &a);
  if (block.contains("budget_key")) {
    if (!block["budget_key"].is_string()) Fail("budget_key", "expected a key name");
    a.budget_key = block["budget_key"].get<std::string>();
  }
  if (!block.contains("budget")) Fail("budget", "missing: {\"flops\": N}");
  if (!block["budget"].is_object()) Fail("budget", "expected an object {\"flops\": N}");
  CheckKeys(block["budget"], "budget", {"flops", "cpu_hours", "gpu_hours"});
  for (const char* hours : {"cpu_hours", "gpu_hours"}) {
    if (block["budget"].contains(hours)) {
      Fail(fmt::format("budget.{}", hours),
           "not supported yet: the chooser prices runs in training FLOPs (give \"flops\"; "
           "`moelab sweep plan` converts FLOPs to time on this machine)");
    }
  }
  if (!block["budget"].contains("flops")) Fail("budget.flops", "missing");
  a.budget_flops = PositiveNumber(block["budget"], "flops", "budget.flops");
  if (!block.contains("stop")) Fail("stop", "missing: the stopping rule");
  ParseStop(block["stop"], &a);
  if (block.contains("alpha")) {
    a.alpha = PositiveNumber(block, "alpha", "alpha");
    if (a.alpha >= 0.5) Fail("alpha", fmt::format("{} is not an error rate below 0.5", a.alpha));
  }
  if (block.contains("min_seeds")) {
    a.min_seeds = PositiveInt(block, "min_seeds", "min_seeds");
    if (a.min_seeds < 2) Fail("min_seeds", "an interval over seeds needs at least 2");
  }
  if (block.contains("seeds_per_batch")) {
    a.seeds_per_batch = PositiveInt(block, "seeds_per_batch", "seeds_per_batch");
  }
  CheckSpace(sweep, &a);
  BuildSpace(sweep, a);  // one run per arm, seed and budget, or a SpecError naming why not
  return a;
}

std::string DescribeQuestion(const AdaptiveSpec& a) {
  std::string stop;
  if (a.excludes) stop = fmt::format("interval excludes {:g}", *a.excludes);
  if (a.width) stop += fmt::format("{}relative width < {:g}", stop.empty() ? "" : " or ", *a.width);
  std::string what;
  if (a.IsSlope()) {
    std::vector<std::string> arms;
    for (const auto& v : a.arms) arms.push_back(ShortValue(v));
    what = fmt::format("slope: FLOPs factor per doubling of {} in {{{}}} against {}={}", a.key,
                       fmt::join(arms, ", "), a.key, ShortValue(a.reference));
  } else {
    what = fmt::format("{} {}={} / {}={}", a.kind, a.key, ShortValue(a.arms.at(0)), a.key,
                       ShortValue(a.reference));
  }
  return fmt::format("{} at loss {:g}; stop: {}; alpha {:g} over every look; budget {:.3g} FLOPs",
                     what, a.target_loss, stop, a.alpha, a.budget_flops);
}

}  // namespace moelab::sweeps
