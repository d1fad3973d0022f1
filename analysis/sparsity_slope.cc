#include "analysis/sparsity_slope.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "analysis/fit_common.h"
#include "analysis/frontier.h"

namespace moelab::analysis {

namespace {

double SparsityOf(const std::string& family, const std::map<std::string, double>& sparsity_of) {
  auto it = sparsity_of.find(family);
  if (it != sparsity_of.end()) return it->second;
  char* end = nullptr;
  const double v = std::strtod(family.c_str(), &end);
  return !family.empty() && *end == '\0' && v > 0 ? v : internal::kNaN;
}

}  // namespace

SparsitySlope EstimateSparsitySlope(const ModelFreeTable& table,
                                    const std::map<std::string, double>& sparsity_of, double level,
                                    int min_seeds) {
  SparsitySlope out;
  out.reference_sparsity = SparsityOf(table.reference, sparsity_of);
  if (std::isnan(out.reference_sparsity)) {
    throw AnalysisError(
        fmt::format("sparsity slope: the reference family '{}' has no sparsity", table.reference));
  }
  std::set<double> compared;
  std::map<std::string, std::map<double, double>> beta_by_seed;  // seed -> L* -> β
  for (double target : table.targets) {
    // seed -> [(x = log2(S_ref/S), y = log(C_S/C_ref))]
    std::map<std::string, std::vector<std::pair<double, double>>> xy;
    int families = 0;
    for (const auto& r : table.rows) {
      if (r.target_loss != target) continue;
      const double s = SparsityOf(r.family, sparsity_of);
      if (std::isnan(s) || s == out.reference_sparsity) continue;
      families++;
      compared.insert(s);
      for (size_t i = 0; i < r.seeds.size(); ++i) {
        xy[r.seeds[i]].push_back({std::log2(out.reference_sparsity / s),
                                  std::log(r.flops_family[i] / r.flops_reference[i])});
      }
    }
    if (families == 0) continue;
    SparsitySlopeAtTarget at;
    at.target_loss = target;
    for (const auto& [seed, points] : xy) {
      if (static_cast<int>(points.size()) != families) {
        out.notes.push_back(fmt::format(
            "L* = {:.4g}: seed {} lacks a sparsity at this target (left out of β)", target, seed));
        continue;
      }
      double sxy = 0, sxx = 0;
      for (const auto& [x, y] : points) sxy += x * y, sxx += x * x;
      at.seeds.push_back(seed);
      at.beta_per_seed.push_back(sxy / sxx);
      beta_by_seed[seed][target] = sxy / sxx;
    }
    at.beta = DescribeSeeds(at.beta_per_seed, level, false, min_seeds);
    at.per_doubling = std::exp(at.beta.t.estimate);
    at.per_doubling_lo = std::exp(at.beta.t.lo);
    at.per_doubling_hi = std::exp(at.beta.t.hi);
    out.targets.push_back(std::move(at));
  }
  if (compared.empty()) {
    throw AnalysisError("sparsity slope: no family other than the reference has a sparsity");
  }
  out.sparsities.assign(compared.begin(), compared.end());
  for (const auto& [seed, by_target] : beta_by_seed) {
    if (by_target.size() < 2) continue;
    double mx = 0, my = 0;
    for (const auto& [x, y] : by_target) mx += x, my += y;
    mx /= by_target.size(), my /= by_target.size();
    double sxy = 0, sxx = 0;
    for (const auto& [x, y] : by_target) sxy += (x - mx) * (y - my), sxx += (x - mx) * (x - mx);
    out.trend_seeds.push_back(seed);
    out.trend_per_seed.push_back(sxy / sxx);
  }
  out.trend = DescribeSeeds(out.trend_per_seed, level, false, min_seeds);
  return out;
}

std::string FormatSparsitySlope(const SparsitySlope& s, const std::string& estimand) {
  std::vector<std::string> sp;
  for (double v : s.sparsities) sp.push_back(fmt::format("{:g}", v));
  std::string out = fmt::format(
      "\nSparsity slope (pre-registered estimand): log(C_S / C_{:g}) = beta * log2({:g} / S), "
      "per seed through the origin over S in {{{}}}; exp(beta) = FLOPs factor per doubling of "
      "sparsity (K2: 1.69x from S = 8 to 48 = 1.22x per doubling)\n",
      s.reference_sparsity, s.reference_sparsity, fmt::join(sp, ", "));
  if (estimand.rfind("fixed size", 0) == 0) {
    out += fmt::format(
        "estimand: {}: a single-size training curve (one model size per S), not the report's "
        "compute-optimal frontier\n",
        estimand);
  } else if (estimand.rfind("frontier", 0) == 0) {
    out += fmt::format(
        "estimand: {}: C_S read on each (S, seed)'s lower envelope over model sizes, the "
        "report's estimand\n",
        estimand);
  } else if (!estimand.empty()) {
    out += fmt::format("estimand: {}\n", estimand);
  }
  for (const auto& t : s.targets) {
    std::vector<std::string> per;
    for (size_t i = 0; i < t.seeds.size(); ++i)
      per.push_back(fmt::format("s{} {:+.3f}", t.seeds[i], t.beta_per_seed[i]));
    out += fmt::format("L* = {:.4f}: beta {}\n", t.target_loss, FormatStatement(t.beta, "{:+.3f}"));
    if (t.beta.note.empty()) {
      out += fmt::format("  per doubling {:.3f}x [{:.3f}, {:.3f}]; per seed: {}\n", t.per_doubling,
                         t.per_doubling_lo, t.per_doubling_hi, fmt::join(per, ", "));
    } else {
      out += fmt::format("  per doubling {:.3f}x; per seed: {}\n", t.per_doubling,
                         fmt::join(per, ", "));
    }
  }
  if (!s.trend_per_seed.empty()) {
    std::vector<std::string> per;
    for (size_t i = 0; i < s.trend_seeds.size(); ++i)
      per.push_back(fmt::format("s{} {:+.3f}", s.trend_seeds[i], s.trend_per_seed[i]));
    out += fmt::format("trend dbeta/dL*: {}; per seed: {}\n", FormatStatement(s.trend, "{:+.3f}"),
                       fmt::join(per, ", "));
  }
  for (const auto& n : s.notes) out += "  note: " + n + "\n";
  return out;
}

std::string SparsitySlopeReport(const ModelFreeTable& table, const std::vector<Observation>& points,
                                const std::map<std::string, double>& sparsity_of, double level,
                                int min_seeds) {
  // The table's own label (set from the same observations' model sizes), so the β block and the
  // table above it always name the same estimand.
  std::string estimand = table.estimand;
  if (estimand.empty()) estimand = EstimandLabel(EstimandOf(points));
  try {
    return FormatSparsitySlope(EstimateSparsitySlope(table, sparsity_of, level, min_seeds),
                               estimand);
  } catch (const AnalysisError&) {
    return "";  // not a sparsity comparison
  }
}

void to_json(nlohmann::json& j, const SparsitySlopeAtTarget& v) {
  j = {{"target_loss", v.target_loss},
       {"seeds", v.seeds},
       {"beta_per_seed", v.beta_per_seed},
       {"beta", v.beta},
       {"per_doubling", v.per_doubling},
       {"per_doubling_interval", {v.per_doubling_lo, v.per_doubling_hi}}};
}

void to_json(nlohmann::json& j, const SparsitySlope& v) {
  j = {{"reference_sparsity", v.reference_sparsity},
       {"sparsities", v.sparsities},
       {"targets", v.targets},
       {"trend_seeds", v.trend_seeds},
       {"trend_per_seed", v.trend_per_seed},
       {"trend", v.trend},
       {"notes", v.notes},
       {"model", "log(C_S / C_ref) = beta * log2(S_ref / S), per seed, through the origin"}};
}

}  // namespace moelab::analysis
