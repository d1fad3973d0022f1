#include "analysis/model_free.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "analysis/bootstrap.h"
#include "analysis/fit_common.h"
#include "analysis/frontier.h"
#include "analysis/seed_stats.h"

namespace moelab::analysis {

namespace {

using internal::kNaN;

struct Reach {
  double flops = kNaN, tokens = kNaN;
};

// One seed's frontier with tokens: points on the lower envelope of loss over compute (over all
// the family's model sizes: the compute-optimal frontier when it has several).
struct SeedCurve {
  std::vector<double> flops, tokens, loss;  // compute order, loss decreasing
};

using Curves = std::map<std::string, std::map<std::string, SeedCurve>>;  // family -> seed ->

Curves BuildCurves(const std::vector<Observation>& obs, bool final_only) {
  std::vector<std::string> warnings;
  std::map<std::string, std::map<std::string, std::vector<Observation>>> groups;
  for (const auto& o : internal::CleanObservations(obs, true, &warnings)) {
    groups[o.family][o.seed].push_back(o);
  }
  Curves out;
  for (const auto& [family, seeds] : groups) {
    for (const auto& [seed, g] : seeds) {
      std::map<std::string, double> tokens_of;  // (run, flops) -> tokens
      for (const auto& o : g) tokens_of[fmt::format("{}@{}", o.run, o.flops)] = o.tokens;
      SeedCurve c;
      for (const auto& p : internal::FrontierOf(g, final_only)) {
        c.flops.push_back(p.flops);
        c.tokens.push_back(tokens_of.at(fmt::format("{}@{}", p.run, p.flops)));
        c.loss.push_back(p.loss);
      }
      out[family][seed] = std::move(c);
    }
  }
  return out;
}

// Log-log interpolation between the two frontier points that bracket `target`.
Reach ReachAt(const SeedCurve& c, double target) {
  for (size_t i = 0; i + 1 < c.loss.size(); ++i) {
    if (c.loss[i] >= target && target >= c.loss[i + 1]) {
      const double t = (std::log(c.loss[i]) - std::log(target)) /
                       (std::log(c.loss[i]) - std::log(c.loss[i + 1]));
      auto at = [&](const std::vector<double>& v) {
        return std::exp(std::log(v[i]) + t * (std::log(v[i + 1]) - std::log(v[i])));
      };
      return {at(c.flops), at(c.tokens)};
    }
  }
  return {};
}

}  // namespace

std::pair<double, double> SharedLossRange(const std::vector<Observation>& obs, bool final_only) {
  const Curves curves = BuildCurves(obs, final_only);
  double lo = -INFINITY, hi = INFINITY;
  for (const auto& [family, seeds] : curves) {
    for (const auto& [seed, c] : seeds) {
      if (c.loss.size() < 2) continue;  // a single budget brackets nothing
      lo = std::max(lo, c.loss.back());
      hi = std::min(hi, c.loss.front());
    }
  }
  if (!(lo < hi)) {
    throw AnalysisError(fmt::format(
        "model-free estimate: the (family, seed) frontiers share no loss range (highest final "
        "loss {:.4g} above lowest first loss {:.4g}); give --target-loss inside the data",
        lo, hi));
  }
  return {lo, hi};
}

ModelFreeTable ModelFreeMultipliers(const std::vector<Observation>& obs,
                                    const std::string& reference, std::vector<double> targets,
                                    const ModelFreeOptions& opt) {
  ModelFreeTable t;
  t.reference = reference;
  t.estimand = EstimandLabel(EstimandOf(obs));
  const Curves curves = BuildCurves(obs, opt.final_only);
  if (!curves.count(reference)) {
    throw AnalysisError(fmt::format("model-free estimate: no reference family '{}'", reference));
  }
  std::tie(t.range_lo, t.range_hi) = SharedLossRange(obs, opt.final_only);
  if (targets.empty()) {
    const int n = std::max(1, opt.default_targets);
    // Log-spaced inside the range, away from its ends (where one seed's end point decides).
    for (int k = 1; k <= n; ++k) {
      targets.push_back(std::exp(std::log(t.range_lo) +
                                 (std::log(t.range_hi) - std::log(t.range_lo)) * k / (n + 1)));
    }
  }
  t.targets = targets;
  for (double target : targets) {
    for (const auto& [family, seeds] : curves) {
      if (family == reference) continue;
      ModelFreeRow row;
      row.family = family;
      row.target_loss = target;
      std::vector<double> flops_ratio, tokens_ratio;
      for (const auto& [seed, c] : seeds) {
        auto ref = curves.at(reference).find(seed);
        if (ref == curves.at(reference).end()) continue;
        const Reach a = ReachAt(c, target), b = ReachAt(ref->second, target);
        if (std::isnan(a.flops) || std::isnan(b.flops)) {
          t.notes.push_back(
              fmt::format("L* = {:.4g}: seed {} of '{}' or '{}' does not bracket it (left out)",
                          target, seed.empty() ? "?" : seed, family, reference));
          continue;
        }
        row.seeds.push_back(seed);
        row.flops_family.push_back(a.flops);
        row.flops_reference.push_back(b.flops);
        row.tokens_family.push_back(a.tokens);
        row.tokens_reference.push_back(b.tokens);
        flops_ratio.push_back(a.flops / b.flops);
        tokens_ratio.push_back(a.tokens / b.tokens);
      }
      const int n = static_cast<int>(row.seeds.size());
      // The primary statement: t interval on the mean log ratio over seeds (df = seeds − 1) and
      // the exact sign-flip p; the seed bootstrap (enumerated when small) rides along, named
      // "seed range" below 8 seeds (its percentile ends are then the extreme seeds).
      row.flops_stats = DescribeSeeds(flops_ratio, opt.level, true, opt.min_seeds, opt.resamples,
                                      internal::StreamSeed(opt.seed, family));
      row.tokens_stats = DescribeSeeds(tokens_ratio, opt.level, true, opt.min_seeds, opt.resamples,
                                       internal::StreamSeed(opt.seed, family));
      row.flops_ratio = row.flops_stats.t;
      row.tokens_ratio = row.tokens_stats.t;
      row.interval_note = row.flops_stats.note;
      t.rows.push_back(std::move(row));
    }
  }
  return t;
}

void to_json(nlohmann::json& j, const ModelFreeRow& v) {
  j = {{"family", v.family},
       {"target_loss", v.target_loss},
       {"seeds", v.seeds},
       {"flops_family", v.flops_family},
       {"flops_reference", v.flops_reference},
       {"tokens_family", v.tokens_family},
       {"tokens_reference", v.tokens_reference},
       {"flops_ratio", v.flops_ratio},
       {"tokens_ratio", v.tokens_ratio},
       {"flops_stats", v.flops_stats},
       {"tokens_stats", v.tokens_stats},
       {"interval_note", v.interval_note}};
}

void to_json(nlohmann::json& j, const ModelFreeTable& v) {
  j = {
      {"reference", v.reference},
      {"estimand", v.estimand},
      {"targets", v.targets},
      {"loss_range", {v.range_lo, v.range_hi}},
      {"rows", v.rows},
      {"notes", v.notes},
      {"method",
       "FLOPs/tokens to L* by log-log interpolation on each seed's frontier; ratio = geometric "
       "mean over seeds of C_family,s / C_reference,s (paired by seed); interval: Student t on the "
       "mean log ratio, df = seeds - 1; p: exact sign-flip over seeds; bootstrap over seeds "
       "(exact enumeration when small) labelled 'seed range' below 8 seeds"}};
}

ModelFreeOptions ModelFreeOptionsOf(const FitOptions& fit) {
  ModelFreeOptions o;
  o.resamples = fit.bootstrap_resamples;
  o.seed = fit.seed;
  o.level = fit.level;
  o.min_seeds = fit.min_units;
  o.final_only = fit.final_only;
  return o;
}

}  // namespace moelab::analysis
