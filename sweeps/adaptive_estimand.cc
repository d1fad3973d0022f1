#include "sweeps/adaptive_estimand.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "analysis/model_free.h"
#include "analysis/sparsity_slope.h"

namespace moelab::sweeps {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The family name a side's runs carry in the model-free table.
std::string SideFamily(int side) { return side == 0 ? "reference" : fmt::format("arm{}", side); }

}  // namespace

const char* CoverName(Cover c) {
  switch (c) {
    case Cover::kNone:
      return "no result yet";
    case Cover::kBracketed:
      return "brackets the target";
    case Cover::kAbove:
      return "every loss above the target (needs a longer run)";
    case Cover::kBelow:
      return "every loss below the target (needs a shorter run)";
  }
  return "?";
}

EstimandReading ReadEstimand(const AdaptiveSpace& space, const AdaptiveSpec& spec,
                             const Results& results, const std::vector<int>& looks) {
  EstimandReading out;
  out.ratio = out.lo = out.hi = kNaN;
  // Per (side, seed): the done runs' final points, as the model-free table reads them.
  std::map<std::pair<int, int64_t>, std::vector<analysis::Observation>> groups;
  for (const SpaceRun& r : space.runs) {
    auto it = results.find(r.index);
    if (it == results.end() || !std::isfinite(it->second.loss)) continue;
    analysis::Observation o;
    o.run = std::to_string(r.index);
    o.family = SideFamily(r.side);
    o.flops = it->second.flops;
    o.tokens = it->second.tokens;
    o.params = 1;  // not used by the model-free reading
    o.loss = it->second.loss;
    o.seed = std::to_string(r.seed);
    o.unit = fmt::format("seed {}, {}", r.seed, o.family);
    groups[{r.side, r.seed}].push_back(o);
  }
  const double target = spec.target_loss;
  for (const auto& [key, g] : groups) {
    // The model-free frontier runs from the cheapest run's loss down to the lowest loss.
    const auto cheapest = std::min_element(
        g.begin(), g.end(), [](const auto& a, const auto& b) { return a.flops < b.flops; });
    double lowest = INFINITY;
    for (const auto& o : g) lowest = std::min(lowest, o.loss);
    Cover c = Cover::kBracketed;
    if (lowest > target) {
      c = Cover::kAbove;
    } else if (cheapest->loss < target) {
      c = Cover::kBelow;
    }
    out.cover[key] = c;
    if (c == Cover::kBracketed) {
      std::map<int, double> by_rung;
      for (const SpaceRun& r : space.runs) {
        if (r.side == key.first && r.seed == key.second && results.count(r.index)) {
          by_rung[r.rung] = results.at(r.index).loss;
        }
      }
      int above = by_rung.begin()->first, below = by_rung.rbegin()->first;
      for (const auto& [rung, loss] : by_rung) {
        if (loss >= target) above = rung;
      }
      for (auto it = by_rung.rbegin(); it != by_rung.rend(); ++it) {
        if (it->second < target && it->first > above) below = it->first;
      }
      out.crossing[key] = {above, std::max(above, below)};
    }
  }
  std::vector<analysis::Observation> obs;
  for (int64_t seed : space.seeds) {
    bool all = true;
    for (int side = 0; side < spec.Sides(); ++side) {
      auto c = out.cover.find({side, seed});
      all = all && c != out.cover.end() && c->second == Cover::kBracketed;
    }
    if (!all) continue;
    for (int side = 0; side < spec.Sides(); ++side) {
      const auto& g = groups.at({side, seed});
      obs.insert(obs.end(), g.begin(), g.end());
    }
  }
  if (!obs.empty()) {
    analysis::ModelFreeOptions opt;
    opt.min_seeds = 2;
    opt.resamples = 200;
    const analysis::ModelFreeTable table =
        analysis::ModelFreeMultipliers(obs, "reference", {target}, opt);
    // Per seed, the estimand on its log scale: the arm's log ratio, or the slope's β as
    // `moelab fit` reads it (analysis/sparsity_slope.h: every arm of the seed, through the origin).
    std::map<int64_t, double> by_seed;
    if (spec.IsSlope()) {
      std::map<std::string, double> sparsity_of;
      for (int side = 0; side < spec.Sides(); ++side)
        sparsity_of[SideFamily(side)] = spec.SideValue(side).get<double>();
      const analysis::SparsitySlope slope =
          analysis::EstimateSparsitySlope(table, sparsity_of, 1 - spec.alpha, 2);
      for (const auto& at : slope.targets)
        for (size_t i = 0; i < at.seeds.size(); ++i)
          by_seed[std::stoll(at.seeds[i])] = at.beta_per_seed[i];
      out.notes.insert(out.notes.end(), slope.notes.begin(), slope.notes.end());
    } else {
      const bool flops = spec.kind == "flops_ratio";
      for (const auto& row : table.rows) {
        for (size_t i = 0; i < row.seeds.size(); ++i) {
          const double num = flops ? row.flops_family[i] : row.tokens_family[i];
          const double den = flops ? row.flops_reference[i] : row.tokens_reference[i];
          by_seed[std::stoll(row.seeds[i])] = std::log(num / den);
        }
      }
    }
    for (int64_t seed : space.seeds) {
      if (by_seed.count(seed)) {
        out.seeds.push_back(seed);
        out.log_value.push_back(by_seed[seed]);
      }
    }
    out.notes.insert(out.notes.end(), table.notes.begin(), table.notes.end());
  }
  const int n = static_cast<int>(out.seeds.size());
  if (n >= spec.min_seeds) {
    std::vector<int> schedule = looks;
    if (schedule.empty() || n > schedule.back()) schedule.push_back(n);
    if (schedule.back() == n) {
      analysis::SequentialDesign design;
      design.alpha = spec.alpha;
      design.max_seeds = spec.max_seeds;
      out.interval = analysis::RepeatedTInterval(out.log_value, schedule, design);
      out.has_interval = true;
      out.ratio = std::exp(out.interval.value.estimate);
      out.lo = std::exp(out.interval.value.lo);
      out.hi = std::exp(out.interval.value.hi);
    } else {
      out.notes.push_back(
          fmt::format("{} seeds now, fewer than at an earlier look ({})", n, schedule.back()));
    }
  } else {
    out.notes.push_back(
        fmt::format("{} of the {} seeds needed before the first look bracket "
                    "the target in every arm",
                    n, spec.min_seeds));
  }
  return out;
}

std::string StopReason(const AdaptiveSpec& spec, const EstimandReading& r) {
  if (!r.has_interval) return "";
  if (spec.excludes && (r.lo > *spec.excludes || r.hi < *spec.excludes)) {
    return fmt::format("the repeated interval [{:.4g}, {:.4g}] excludes {:g}", r.lo, r.hi,
                       *spec.excludes);
  }
  if (spec.width && r.hi / r.lo - 1 < *spec.width) {
    return fmt::format(
        "the repeated interval [{:.4g}, {:.4g}] is narrower than {:g} (hi/lo − 1 "
        "= {:.4g})",
        r.lo, r.hi, *spec.width, r.hi / r.lo - 1);
  }
  return "";
}

}  // namespace moelab::sweeps
