// `moelab sweep plan`'s fit and promote section (see fit_plan.h).
#include "sweeps/fit_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>

#include "core/flops.h"

namespace moelab::sweeps {

namespace {

std::string VarText(const ojson& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// The key that names an axis: the one the spec assigns (not a derived field), else the first.
std::string AxisKey(const std::string& axis, const SweepRun& r) {
  std::vector<std::string> keys;
  for (size_t at = 0; at != std::string::npos;) {
    const size_t end = axis.find(" = ", at);
    keys.push_back(axis.substr(at, end == std::string::npos ? end : end - at));
    at = end == std::string::npos ? end : end + 3;
  }
  for (const std::string& k : keys)
    if (std::find(r.assigned_keys.begin(), r.assigned_keys.end(), k) != r.assigned_keys.end())
      return k;
  return keys.front();
}

// The family label of a run: its values of the treatment axes.
std::string LabelOf(const SweepRun& r, const std::vector<std::string>& keys) {
  std::string label;
  for (const std::string& key : keys)
    label += fmt::format("{}{}={}", label.empty() ? "" : ",", key,
                         r.vars.contains(key) ? ShortValue(r.vars[key]) : "-");
  return label.empty() ? "the sweep" : label;
}

// Each planned evaluation of `r` as an observation whose loss falls with compute: the frontier
// then holds every distinct budget, the most a fit can get from the design.
void AddPlannedPoints(const SweepRun& r, const std::string& family,
                      std::vector<analysis::Observation>* out) {
  const double tokens_per_step = static_cast<double>(TokensPerStep(r.config));
  const double per_step = ForwardFlopsPerToken(r.config).training() * tokens_per_step;
  const int64_t total = r.config.total_steps(), every = r.config.eval.every;
  std::vector<int64_t> steps;
  for (int64_t s = every > 0 ? every : total; s < total; s += every) steps.push_back(s);
  steps.push_back(total);
  analysis::Observation o;
  o.run = std::to_string(r.index);
  o.family = family;
  o.params = static_cast<double>(CountParams(r.config).active);
  o.seed = fmt::format("{}", r.config.train.seed);
  o.unit = fmt::format("seed {}, trunk {}", o.seed, r.branch_hash.substr(0, 12));
  for (int64_t s : steps) {
    o.flops = per_step * static_cast<double>(s);
    o.tokens = tokens_per_step * static_cast<double>(s);
    o.loss = 1 + 1 / std::log(std::max(o.flops, 10.0));
    out->push_back(o);
  }
}

// "sparsity=8" before "sparsity=16": runs of digits compare by value.
bool NaturalLess(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) &&
        std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t ei = i, ej = j;
      while (ei < a.size() && std::isdigit(static_cast<unsigned char>(a[ei]))) ++ei;
      while (ej < b.size() && std::isdigit(static_cast<unsigned char>(b[ej]))) ++ej;
      const std::string na = a.substr(i, ei - i), nb = b.substr(j, ej - j);
      if (na.size() != nb.size()) return na.size() < nb.size();
      if (na != nb) return na < nb;
      i = ei, j = ej;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i, ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

std::string ListFamilies(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < 6; ++i) s += (i ? "; " : "") + v[i];
  if (v.size() > 6) s += fmt::format("; ... {} more", v.size() - 6);
  return s;
}

void AddWarnings(FitPlan* plan) {
  std::vector<std::string> no_law, no_interval;
  for (const auto& f : plan->families) {
    if (!f.Fits()) no_law.push_back(fmt::format("{} has {}", f.family, f.frontier_points));
    if (!f.interval_note.empty())
      no_interval.push_back(fmt::format("{} has {}", f.family, f.units));
  }
  const size_t n = plan->families.size();
  if (!no_interval.empty()) {
    const auto& f = plan->families.front();
    plan->warnings.push_back(fmt::format(
        "`moelab fit` gives no interval for {} of {} families and `moelab promote` refuses them: "
        "the replicate is the seed (a trunk with its branches); an interval needs {} {} per "
        "family ({}); fewer give point estimates only ({}). Add seeds (train.seed values)",
        no_interval.size(), n, f.units_needed, f.paired ? "seeds" : "trunks",
        f.paired ? "--min-seeds; seeds paired across families"
                 : "several trunks per seed: not paired by seed",
        ListFamilies(no_interval)));
  }
  if (!no_law.empty()) {
    plan->warnings.push_back(fmt::format(
        "`moelab fit` needs at least {} points on each family's loss-over-compute frontier and "
        "fails for {} of {} families ({}): add budgets or evaluate more often (eval.every)",
        analysis::kMinFrontierPoints, no_law.size(), n, ListFamilies(no_law)));
  }
}

}  // namespace

FitPlan PlanFits(const Sweep& sweep) {
  FitPlan plan;
  const auto unique = sweep.Unique();
  if (unique.empty()) return plan;
  // Treatment axes: the keys `fit` refuses to pool, found by the same check it runs.
  std::map<std::string, analysis::DesignRun> design;
  for (const SweepRun* r : unique) {
    analysis::DesignRun& d = design[std::to_string(r->index)];
    for (auto it = r->vars.begin(); it != r->vars.end(); ++it)
      d.vars[it.key()] = VarText(it.value());
  }
  const auto mixed = analysis::MixedFamilies(design, "", {});
  if (!mixed.empty()) plan.axes = mixed.front().axes;
  std::vector<std::string> keys;
  for (const std::string& axis : plan.axes) keys.push_back(AxisKey(axis, *unique.front()));

  std::vector<analysis::Observation> obs;
  bool wsd = false;
  for (const SweepRun* r : unique) {
    AddPlannedPoints(*r, LabelOf(*r, keys), &obs);
    wsd = wsd || r->config.schedule.type == "wsd";
  }
  analysis::FitOptions fo;
  fo.final_only = wsd;  // fit's default for WSD runs
  plan.families = analysis::AssessFamilies(obs, fo);
  std::stable_sort(plan.families.begin(), plan.families.end(),
                   [](const auto& a, const auto& b) { return NaturalLess(a.family, b.family); });
  AddWarnings(&plan);
  if (keys.size() > 1) {
    for (const std::string& key : keys) {
      std::vector<std::string> others;
      for (const std::string& o : keys)
        if (o != key) others.push_back(o);
      plan.notes.push_back(fmt::format(
          "`moelab fit --by {}` and `moelab promote` refuse to pool {} (add --where {}=VALUE to "
          "fit one arm, or --pool {} on purpose)",
          key, fmt::join(others, ", "), others.front(), fmt::join(others, " --pool ")));
    }
  }
  return plan;
}

}  // namespace moelab::sweeps
