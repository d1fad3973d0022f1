#include "sweeps/adaptive_chooser.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "analysis/seed_stats.h"
#include "analysis/sequential.h"

namespace moelab::sweeps {

namespace {

// One way to gain a seed that brackets the target in every arm and the reference.
struct Gain {
  int64_t seed = 0;
  int seed_order = 0;  // position in the spec's seeds (ties)
  std::vector<int> runs;
  double cost = 0;
  std::string why;
};

std::string SideName(const AdaptiveSpec& spec, int side) {
  return fmt::format("{}={}", spec.key, ShortValue(spec.SideValue(side)));
}

std::string Rungs(const AdaptiveSpace& space, const AdaptiveSpec& spec, int lo, int hi) {
  if (lo == hi) return fmt::format("{}={}", spec.budget_key, space.ladder[lo]);
  return fmt::format("{} {}..{}", spec.budget_key, space.ladder[lo], space.ladder[hi]);
}

// The rungs a new seed of `side` trains: from the lowest to the highest rung pair where the seeds
// so far crossed the target, or the whole ladder before any seed has shown it. No margin: a seed
// that crosses elsewhere is completed by one extension or one shorter branch, cheaper than
// training every seed wider.
std::pair<int, int> NewSeedRungs(const AdaptiveSpace& space, const EstimandReading& reading,
                                 int side, bool* explore) {
  int lo = INT32_MAX, hi = -1;
  for (const auto& [key, c] : reading.crossing) {
    if (key.first != side) continue;
    lo = std::min(lo, c.first);
    hi = std::max(hi, c.second);
  }
  const int top = static_cast<int>(space.ladder.size()) - 1;
  *explore = hi < 0;
  if (*explore) return {0, top};
  return {lo, std::min(top, hi)};
}

// The order choices are listed in: the arms in the spec's order, then the reference.
std::vector<int> SidesArmsFirst(const AdaptiveSpec& spec) {
  std::vector<int> sides;
  for (int side = 1; side < spec.Sides(); ++side) sides.push_back(side);
  sides.push_back(0);
  return sides;
}

}  // namespace

double BatchCost(const AdaptiveSpace& space, const std::vector<int>& runs,
                 const std::set<int>& chosen) {
  std::map<std::pair<int, int64_t>, std::vector<const SpaceRun*>> groups;
  std::map<std::pair<int, int64_t>, int> longest_chosen;
  for (const SpaceRun& r : space.runs) {
    if (std::find(runs.begin(), runs.end(), r.index) != runs.end()) {
      groups[{r.side, r.seed}].push_back(&r);
    } else if (chosen.count(r.index)) {
      int& l = longest_chosen.try_emplace({r.side, r.seed}, -1).first->second;
      l = std::max(l, r.rung);
    }
  }
  double cost = 0;
  for (auto& [key, g] : groups) {
    std::sort(g.begin(), g.end(), [](auto* a, auto* b) { return a->rung > b->rung; });
    const auto it = longest_chosen.find(key);
    // The sweep runner branches from the family's longest run: a new one (its checkpoints at
    // the branch points are kept while it trains), or a done one (whose are not: full price).
    const bool new_trunk = it == longest_chosen.end() || g.front()->rung > it->second;
    // A new trunk longer than a trained run extends it (RunOptions::extendable: the trained
    // run kept its checkpoint at its decay start) when no new shorter run branches earlier:
    // only its steps after that checkpoint are trained.
    double continued = 0;
    if (new_trunk && it != longest_chosen.end()) {
      const SpaceRun* trained = space.At(key.first, key.second, it->second);
      bool later = trained != nullptr;
      for (size_t k = 1; k < g.size(); ++k) later = later && g[k]->rung >= it->second;
      if (later) continued = trained->flops - trained->decay_flops;
    }
    for (size_t k = 0; k < g.size(); ++k) {
      cost += (k == 0 || !new_trunk) ? g[k]->flops : g[k]->decay_flops;
    }
    cost -= continued;
  }
  return cost;
}

AdaptiveBatch ChooseBatch(const AdaptiveSpace& space, const AdaptiveSpec& spec,
                          const EstimandReading& reading, const std::set<int>& chosen,
                          double spent_flops) {
  AdaptiveBatch batch;
  const int top = static_cast<int>(space.ladder.size()) - 1;
  const int have = static_cast<int>(reading.seeds.size());
  std::vector<Gain> gains;
  std::vector<std::string> dead;
  bool any_started = false;
  for (size_t order = 0; order < space.seeds.size(); ++order) {
    const int64_t seed = space.seeds[order];
    if (std::find(reading.seeds.begin(), reading.seeds.end(), seed) != reading.seeds.end()) {
      continue;
    }
    std::map<int, std::vector<int>> rungs;  // side -> chosen rungs
    for (const SpaceRun& r : space.runs)
      if (r.seed == seed && chosen.count(r.index)) rungs[r.side].push_back(r.rung);
    if (rungs.empty()) continue;  // a new seed: below
    any_started = true;
    Gain g;
    g.seed = seed;
    g.seed_order = static_cast<int>(order);
    std::vector<std::string> parts;
    bool ok = true;
    for (int side : SidesArmsFirst(spec)) {
      const auto cover_it = reading.cover.find({side, seed});
      const Cover cover = cover_it == reading.cover.end() ? Cover::kNone : cover_it->second;
      if (cover == Cover::kBracketed) continue;
      const auto& rs = rungs[side];
      int next = -1;
      std::string how;
      if (cover == Cover::kAbove) {
        next = *std::max_element(rs.begin(), rs.end()) + 1;
        how = "every loss above the target: extend to";
      } else if (cover == Cover::kBelow) {
        next = *std::min_element(rs.begin(), rs.end()) - 1;
        how = "every loss below the target: add the shorter";
      }
      const SpaceRun* run = next >= 0 && next <= top ? space.At(side, seed, next) : nullptr;
      if (!run) {
        ok = false;
        dead.push_back(
            fmt::format("seed {} of {} is left out: {}, and the ladder has no further "
                        "rung",
                        seed, SideName(spec, side), CoverName(cover)));
        break;
      }
      g.runs.push_back(run->index);
      parts.push_back(
          fmt::format("{} {} {}", SideName(spec, side), how, Rungs(space, spec, next, next)));
    }
    if (!ok || g.runs.empty()) continue;
    g.cost = BatchCost(space, g.runs, chosen);
    g.why = fmt::format("seed {}: {} — completes a seed for {:.3g} FLOPs", seed,
                        fmt::join(parts, "; "), g.cost);
    gains.push_back(std::move(g));
  }
  // New seeds, in the spec's order.
  int wanted = std::max(spec.seeds_per_batch, spec.min_seeds - have);
  bool explore_any = false;
  for (size_t order = 0; order < space.seeds.size(); ++order) {
    const int64_t seed = space.seeds[order];
    bool started = false;
    for (const SpaceRun& r : space.runs) started |= r.seed == seed && chosen.count(r.index);
    if (started) continue;
    Gain g;
    g.seed = seed;
    g.seed_order = static_cast<int>(order);
    std::vector<std::string> parts;
    for (int side : SidesArmsFirst(spec)) {
      bool explore = false;
      const auto [lo, hi] = NewSeedRungs(space, reading, side, &explore);
      explore_any |= explore;
      for (int rung = lo; rung <= hi; ++rung) {
        if (const SpaceRun* run = space.At(side, seed, rung)) g.runs.push_back(run->index);
      }
      parts.push_back(fmt::format("{} on {} ({})", SideName(spec, side), Rungs(space, spec, lo, hi),
                                  explore ? "no seed has shown where the target lies yet"
                                          : "where the seeds so far crossed it"));
    }
    std::sort(g.runs.begin(), g.runs.end());
    g.cost = BatchCost(space, g.runs, chosen);
    g.why = fmt::format(
        "seed {}: a new seed, {} — one trunk per arm, shorter rungs branch from "
        "it; {:.3g} FLOPs",
        seed, fmt::join(parts, "; "), g.cost);
    gains.push_back(std::move(g));
  }
  // Exploring the whole ladder is dear: one seed shows the crossing, the rest follow narrowly.
  if (explore_any && !any_started) wanted = 1;
  std::stable_sort(gains.begin(), gains.end(), [](const Gain& a, const Gain& b) {
    if (a.cost != b.cost) return a.cost < b.cost;
    return a.seed_order < b.seed_order;
  });
  const double left = spec.budget_flops - spent_flops;
  for (const Gain& g : gains) {
    if (static_cast<int>(batch.why.size()) >= wanted) break;
    // Later gains are priced alone; within one batch the seeds never share a family.
    if (batch.cost_flops + g.cost > left) break;
    batch.runs.insert(batch.runs.end(), g.runs.begin(), g.runs.end());
    batch.why.push_back(g.why);
    batch.cost_flops += g.cost;
  }
  std::sort(batch.runs.begin(), batch.runs.end());
  for (const std::string& d : dead) batch.why.push_back(d);
  if (batch.runs.empty()) {
    batch.exhausted =
        gains.empty()
            ? std::string("the space is exhausted: no seed left to add or complete")
            : fmt::format(
                  "the budget is spent: the cheapest next step costs {:.3g} FLOPs, {:.3g} "
                  "are left of {:.3g}",
                  gains.front().cost, std::max(0.0, left), spec.budget_flops);
  }
  return batch;
}

GridComparison CompareWithGrid(const AdaptiveSpace& space, const AdaptiveSpec& spec, int seeds,
                               double critical) {
  GridComparison g;
  g.seeds = seeds;
  std::vector<int> one;
  for (const SpaceRun& r : space.runs)
    if (r.seed == space.seeds.front()) one.push_back(r.index);
  g.per_seed_flops = BatchCost(space, one, {});
  g.same_seeds_flops = g.per_seed_flops * seeds;
  g.full_flops = g.per_seed_flops * static_cast<double>(space.seeds.size());
  if (seeds >= 2 && std::isfinite(critical)) {
    const double target = critical / std::sqrt(static_cast<double>(seeds));
    for (int n = 2; n <= 10000; ++n) {
      const double t = analysis::StudentTQuantile(1 - spec.alpha / 2, n - 1);
      if (t / std::sqrt(static_cast<double>(n)) <= target) {
        g.equal_width_seeds = n;
        break;
      }
    }
    g.equal_width_flops = g.per_seed_flops * g.equal_width_seeds;
  }
  return g;
}

std::string FormatGridComparison(const GridComparison& g, double spent_flops) {
  std::string out = fmt::format(
      "charged {:.3g} FLOPs for {} seeds; the fixed grid (every seed on every rung, {:.3g} FLOPs "
      "a seed) costs {:.3g} for the same {} seeds ({:.2f}×) and {:.3g} for all of the space's "
      "seeds",
      spent_flops, g.seeds, g.per_seed_flops, g.same_seeds_flops, g.seeds,
      g.same_seeds_flops / spent_flops, g.full_flops);
  if (g.equal_width_seeds > 0) {
    out += fmt::format(
        "; a fixed grid whose one-look t interval is as narrow needs {} seeds, {:.3g} FLOPs "
        "({:.2f}×)",
        g.equal_width_seeds, g.equal_width_flops, g.equal_width_flops / spent_flops);
  }
  return out;
}

std::string CostAgainstGrids(const AdaptiveSpace& space, const AdaptiveSpec& spec,
                             const AdaptiveLookRow& last) {
  if (last.decision == "continue" || last.seeds < 1) return "";
  return FormatGridComparison(CompareWithGrid(space, spec, last.seeds, last.critical),
                              last.spent_flops);
}

std::string DescribeAdaptivePlan(const Sweep& sweep, const AdaptiveSpace& space,
                                 const AdaptiveSpec& spec) {
  std::string out = fmt::format("adaptive sweep '{}': {}\n", sweep.name, DescribeQuestion(spec));
  const AdaptiveBatch first = ChooseBatch(space, spec, EstimandReading{}, {}, 0);
  out += fmt::format("first batch: {} runs, {:.3g} FLOPs\n", first.runs.size(), first.cost_flops);
  for (int i : first.runs) out += fmt::format("  #{} {}\n", i, sweep.runs[i].name);
  for (const std::string& w : first.why) out += "  why: " + w + "\n";
  if (!first.exhausted.empty()) out += "  " + first.exhausted + "\n";
  std::vector<int> all;
  for (const SpaceRun& r : space.runs) all.push_back(r.index);
  const double grid = BatchCost(space, all, {});
  out += fmt::format(
      "cost bound: {:.3g} FLOPs (the budget); the full grid of the {} arms ({} "
      "runs, {} seeds) costs {:.3g}\n",
      spec.budget_flops, spec.IsSlope() ? fmt::format("{} + 1", spec.arms.size()) : "two",
      all.size(), space.seeds.size(), grid);
  // At best every seed after the first trains only the two cheapest consecutive rungs per arm.
  double cheapest_pair = INFINITY;
  for (size_t rung = 0; rung + 1 < space.ladder.size(); ++rung) {
    std::vector<int> two;
    for (int side = 0; side < spec.Sides(); ++side) {
      for (int k : {0, 1}) {
        if (const SpaceRun* r = space.At(side, space.seeds.front(), rung + k)) {
          two.push_back(r->index);
        }
      }
    }
    cheapest_pair = std::min(cheapest_pair, BatchCost(space, two, {}));
  }
  const int best_n = std::min<int>(
      spec.max_seeds,
      1 + static_cast<int>(std::max(0.0, (spec.budget_flops - first.cost_flops) / cheapest_pair)));
  out += fmt::format(
      "the budget buys at most {} of the {} seeds (the first on the whole ladder, "
      "the rest on two rungs per arm at {:.3g} FLOPs)\n",
      best_n, spec.max_seeds, cheapest_pair);
  if (best_n < spec.min_seeds) {
    out += fmt::format("  fewer than min_seeds {}: the budget cannot give an interval\n",
                       spec.min_seeds);
    return out;
  }
  std::vector<int> looks;
  for (int n = spec.min_seeds; n <= best_n; ++n) looks.push_back(n);
  analysis::SequentialDesign design;
  design.alpha = spec.alpha;
  design.max_seeds = spec.max_seeds;
  const double c = analysis::RepeatedTBoundaries(looks, design).back();
  const double k = c / std::sqrt(static_cast<double>(best_n));
  const char* what = spec.IsSlope() ? "a factor per doubling" : "a ratio";
  const char* sd =
      spec.IsSlope() ? "the seed SD of β (the log factor)" : "the seed SD of the log ratio";
  out += fmt::format(
      "at best it resolves {} beyond exp(±{:.3f}·σ) at {} seeds (repeated "
      "t, c = {:.3f}), σ {}, unknown before the runs: "
      "σ = 0.05 → [{:.3f}, {:.3f}], σ = 0.10 → [{:.3f}, {:.3f}] around 1\n",
      what, k, best_n, c, sd, std::exp(-0.05 * k), std::exp(0.05 * k), std::exp(-0.10 * k),
      std::exp(0.10 * k));
  return out;
}

}  // namespace moelab::sweeps
