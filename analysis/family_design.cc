// The family checks `moelab fit`, `moelab promote` and `moelab sweep plan` share (see
// family_design.h).
#include "analysis/family_design.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>

#include "analysis/fit_common.h"
#include "db/reader.h"

namespace moelab::analysis {

namespace {

std::string ValueOf(const DesignRun& r, const std::string& key) {
  const auto it = r.vars.find(key);
  return it == r.vars.end() ? "(unset)" : it->second;
}

// The treatment axes that split one family: keys whose values differ between its runs, grouped
// when they partition the runs identically (a derived field and its source), less the groups
// that hold a model-size key.
std::vector<std::vector<std::string>> TreatmentAxes(const std::vector<const DesignRun*>& runs,
                                                    const std::string& family_key) {
  std::set<std::string> keys;
  for (const DesignRun* r : runs)
    for (const auto& [k, v] : r->vars)
      if (k != family_key && !IsBudgetOrSeedKey(k)) keys.insert(k);
  std::map<std::vector<int>, std::vector<std::string>> by_partition;
  for (const std::string& key : keys) {
    std::map<std::string, int> class_of;
    std::vector<int> partition;
    for (const DesignRun* r : runs)
      partition.push_back(
          class_of.emplace(ValueOf(*r, key), static_cast<int>(class_of.size())).first->second);
    if (class_of.size() > 1) by_partition[partition].push_back(key);
  }
  std::vector<std::vector<std::string>> axes;
  for (auto& [partition, group] : by_partition) {
    if (std::any_of(group.begin(), group.end(), IsModelSizeKey)) continue;
    // The spec's own variables (no dot: "sparsity") name an axis before config paths.
    std::stable_partition(group.begin(), group.end(),
                          [](const std::string& k) { return k.find('.') == std::string::npos; });
    axes.push_back(group);
  }
  std::sort(axes.begin(), axes.end());
  return axes;
}

}  // namespace

bool IsModelSizeKey(const std::string& key) {
  return key == "model.d_model" || key == "model.layers" || key == "model.ffn_hidden" ||
         key == "moe.expert_hidden";
}

bool IsBudgetOrSeedKey(const std::string& key) {
  const std::string leaf = key.substr(key.rfind('.') + 1);
  return leaf == "seed" || leaf.ends_with("steps") || leaf.ends_with("tokens");
}

std::vector<MixedFamily> MixedFamilies(const std::map<std::string, DesignRun>& runs,
                                       const std::string& family_key,
                                       const std::vector<std::string>& pool) {
  std::map<std::string, std::vector<const DesignRun*>> families;
  for (const auto& [id, r] : runs) families[r.family].push_back(&r);
  std::vector<MixedFamily> out;
  for (const auto& [family, members] : families) {
    MixedFamily m{family, {}};
    for (const auto& axis : TreatmentAxes(members, family_key)) {
      const bool pooled = std::any_of(axis.begin(), axis.end(), [&](const std::string& k) {
        return std::find(pool.begin(), pool.end(), k) != pool.end();
      });
      if (!pooled) m.axes.push_back(fmt::format("{}", fmt::join(axis, " = ")));
    }
    if (!m.axes.empty()) out.push_back(std::move(m));
  }
  return out;
}

void RequireUnmixedFamilies(const std::map<std::string, DesignRun>& runs,
                            const std::string& family_key, const std::vector<std::string>& pool,
                            const std::string& what) {
  const std::vector<MixedFamily> mixed = MixedFamilies(runs, family_key, pool);
  if (mixed.empty()) return;
  std::string list;
  std::set<std::string> keys;
  for (const MixedFamily& m : mixed) {
    list += fmt::format("\n  {}={}: its runs differ in {}", family_key, m.family,
                        fmt::join(m.axes, ", "));
    for (const std::string& axis : m.axes) keys.insert(axis.substr(0, axis.find(' ')));
  }
  std::string flags;
  for (const std::string& k : keys) flags += " --pool " + k;
  throw AnalysisError(fmt::format(
      "{}: {} of {} families by '{}' hold runs that differ in another swept key (a family is the "
      "runs that share every swept key but '{}', the budget and the seed; keys that change the "
      "model size are pooled as the frontier's sizes):{}\nPooling them would take the better arm "
      "at each compute and give several trunks per seed. Fit one value of the other key at a "
      "time (--where KEY=VALUE), fit --by that key, or pool on purpose with{}",
      what, mixed.size(),
      [&] {
        std::set<std::string> f;
        for (const auto& [id, r] : runs) f.insert(r.family);
        return f.size();
      }(),
      family_key, family_key, list, flags));
}

std::map<std::string, DesignRun> DesignRunsOf(
    const std::vector<Observation>& obs,
    const std::map<std::string, std::map<std::string, std::string>>& run_vars) {
  std::map<std::string, DesignRun> out;
  for (const Observation& o : obs) {
    auto [it, inserted] = out.emplace(o.run, DesignRun{});
    if (!inserted) continue;
    it->second.family = o.family;
    if (const auto v = run_vars.find(o.run); v != run_vars.end()) it->second.vars = v->second;
  }
  return out;
}

void RequireUnmixedStoredFamily(const std::string& db_path, const std::vector<Observation>& obs,
                                const std::string& family_key, const std::string& family,
                                const nlohmann::json& fit_options) {
  db::Reader reader(db_path);
  std::map<std::string, DesignRun> runs;
  for (const Observation& o : obs) {
    if (o.family != family || runs.count(o.run)) continue;
    DesignRun& r = runs[o.run];
    r.family = o.family;
    char* end = nullptr;
    const long long id = std::strtoll(o.run.c_str(), &end, 10);
    if (*end == '\0' && !o.run.empty()) r.vars = reader.RunVars(id);
  }
  std::vector<std::string> pool;
  if (fit_options.contains("pool")) pool = fit_options["pool"].get<std::vector<std::string>>();
  RequireUnmixedFamilies(runs, family_key, pool, "moelab promote");
}

std::string FamilyReadiness::FitText() const {
  if (!fit_error.empty()) return "no law: " + fit_error;
  if (!interval_note.empty()) return "law, point estimate only (" + interval_note + ")";
  return fmt::format("law with an interval ({} {}{})", units, paired ? "seed" : "trunk",
                     units == 1 ? "" : "s");
}

std::string FamilyReadiness::PromoteText() const {
  if (!fit_error.empty()) return "refused: no law to scale";
  // PlanFromPowerLaw's refusal: a plan's band needs the law's bootstrap draws.
  if (!interval_note.empty())
    return "refused: the fit has no bootstrap draws (" + interval_note + ")";
  return "yes";
}

std::vector<FamilyReadiness> AssessFamilies(const std::vector<Observation>& obs,
                                            const FitOptions& options) {
  std::vector<std::string> dropped;
  std::map<std::string, std::vector<Observation>> by_family, usable;
  for (const Observation& o : obs) by_family[o.family];
  for (const Observation& o : internal::CleanObservations(obs, false, &dropped))
    by_family[o.family].push_back(o);
  for (const auto& [family, fobs] : by_family)
    if (!fobs.empty()) usable[family] = fobs;
  const internal::ClusterPlan plan = internal::MakeClusterPlan(usable);
  std::vector<FamilyReadiness> out;
  for (const auto& [family, fobs] : by_family) {
    FamilyReadiness r;
    r.family = family;
    r.paired = plan.paired_by_seed;
    r.units = plan.units.count(family) ? plan.units.at(family) : 0;
    r.units_needed = internal::UnitsNeeded(plan, options.min_units);
    if (!fobs.empty())
      r.frontier_points =
          static_cast<int>(internal::SeedFrontiers(fobs, options.final_only).size());
    try {
      internal::CheckFamily(family, fobs, kMinFrontierPoints, options.final_only);
    } catch (const AnalysisError& e) {
      r.fit_error = e.what();
    }
    r.interval_note = internal::TooFewUnits(r.units, r.units_needed, r.paired);
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace moelab::analysis
