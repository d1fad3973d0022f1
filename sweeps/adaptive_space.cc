// The space an adaptive sweep draws from (sweeps/adaptive_estimand.h AdaptiveSpace): each
// run of the expanded sweep as (arm side, seed, budget rung) with its training FLOPs. Apart from
// the estimand's reading so the spec check (sweeps/adaptive_spec.cc) needs no analysis code.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "core/flops.h"
#include "sweeps/adaptive_estimand.h"

namespace moelab::sweeps {

namespace {

// Budget values sort numerically when they are numbers (train.steps), else as text.
bool BudgetLess(const ojson& a, const ojson& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() < b.get<double>();
  return ShortValue(a) < ShortValue(b);
}

}  // namespace

const SpaceRun* AdaptiveSpace::At(int side, int64_t seed, int rung) const {
  for (const SpaceRun& r : runs)
    if (r.side == side && r.seed == seed && r.rung == rung) return &r;
  return nullptr;
}

AdaptiveSpace BuildSpace(const Sweep& sweep, const AdaptiveSpec& spec) {
  AdaptiveSpace space;
  space.seeds = spec.seeds;
  std::vector<ojson> budgets;
  for (const SweepRun& r : sweep.runs) {
    const ojson& b = r.vars.at(spec.budget_key);
    if (std::none_of(budgets.begin(), budgets.end(), [&](const ojson& x) { return x == b; })) {
      budgets.push_back(b);
    }
  }
  std::stable_sort(budgets.begin(), budgets.end(), BudgetLess);
  for (const ojson& b : budgets) space.ladder.push_back(ShortValue(b));
  std::map<std::tuple<int, int64_t, int>, int> seen;
  for (const SweepRun* r : sweep.Unique()) {
    const ojson& v = r->vars.at(spec.key);
    int side = -1;
    for (int k = 0; k < spec.Sides(); ++k)
      if (v == spec.SideValue(k)) side = k;
    if (side < 0) continue;
    SpaceRun s;
    s.index = r->index;
    s.side = side;
    s.seed = r->config.train.seed;
    const ojson& b = r->vars.at(spec.budget_key);
    s.rung = static_cast<int>(std::find(budgets.begin(), budgets.end(), b) - budgets.begin());
    const double per_step =
        ForwardFlopsPerToken(r->config).training() * static_cast<double>(TokensPerStep(r->config));
    const int64_t steps = r->config.total_steps();
    s.flops = per_step * static_cast<double>(steps);
    s.decay_flops = r->config.schedule.type == "wsd"
                        ? per_step * static_cast<double>(steps - WsdDecayStart(r->config))
                        : s.flops;
    auto [it, fresh] = seen.emplace(std::make_tuple(side, s.seed, s.rung), r->index);
    if (!fresh) {
      throw SpecError(fmt::format(
          "adaptive.estimand.key: runs #{} and #{} are both {}={}, seed {}, {}={}: another swept "
          "key varies, and an adaptive comparison needs one run per arm, seed and budget",
          it->second, r->index, spec.key, ShortValue(v), s.seed, spec.budget_key,
          space.ladder[s.rung]));
    }
    space.runs.push_back(s);
  }
  return space;
}

}  // namespace moelab::sweeps
