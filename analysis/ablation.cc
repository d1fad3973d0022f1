// Heads-ablation deltas, IsoFLOP pitfall checks and analytic inference FLOPs.
#include "analysis/ablation.h"

#include <fmt/format.h>

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <set>

#include "analysis/bootstrap.h"
#include "analysis/fit_common.h"
#include "core/flops.h"

namespace moelab::analysis {
namespace {

using internal::kNaN;

// Last evaluation (largest token count) of every run of a family with a finite loss.
std::map<std::string, Observation> FinalPoints(const std::vector<Observation>& obs,
                                               const std::string& family) {
  std::map<std::string, Observation> last;
  for (const auto& o : obs) {
    if (o.family != family || !std::isfinite(o.loss) || !(o.tokens > 0)) continue;
    auto it = last.find(o.run);
    if (it == last.end() || o.tokens > it->second.tokens) last[o.run] = o;
  }
  return last;
}

// Groups runs whose token budgets agree within `tol` (relative), smallest budget first.
std::vector<std::vector<Observation>> GroupByTokens(const std::map<std::string, Observation>& runs,
                                                    double tol) {
  std::vector<Observation> v;
  for (const auto& [name, o] : runs) v.push_back(o);
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.tokens < b.tokens; });
  std::vector<std::vector<Observation>> groups;
  for (const auto& o : v) {
    if (groups.empty() || o.tokens > groups.back().front().tokens * (1 + tol)) groups.push_back({});
    groups.back().push_back(o);
  }
  return groups;
}

double MeanLoss(const std::vector<Observation>& g) {
  double s = 0;
  for (const auto& o : g) s += o.loss;
  return s / g.size();
}

double MeanFlops(const std::vector<Observation>& g) {
  double s = 0;
  for (const auto& o : g) s += o.flops;
  return s / g.size();
}

}  // namespace

HeadsAblation CompareHeads(const std::vector<Observation>& obs, const std::string& base_family,
                           const std::string& treatment_family, const FitOptions& opt,
                           double token_tolerance) {
  HeadsAblation out;
  out.base_family = base_family;
  out.treatment_family = treatment_family;
  auto base_runs = FinalPoints(obs, base_family);
  auto treat_runs = FinalPoints(obs, treatment_family);
  if (base_runs.empty() || treat_runs.empty()) {
    throw AnalysisError(fmt::format(
        "heads ablation: family '{}' has {} run(s) and '{}' has {} with finite losses; both arms "
        "are needed",
        base_family, base_runs.size(), treatment_family, treat_runs.size()));
  }
  auto base_groups = GroupByTokens(base_runs, token_tolerance);
  auto treat_groups = GroupByTokens(treat_runs, token_tolerance);

  // The equal-FLOPs comparison needs the base arm's frontier law; without it only the
  // equal-token deltas are reported.
  std::vector<Observation> base_obs;
  for (const auto& o : obs) {
    if (o.family == base_family) base_obs.push_back(o);
  }
  std::optional<PowerLawFit> base_fit;
  try {
    FamilyFits ff = FitFamilies(base_obs, opt);
    base_fit = ff.families.at(0);
    for (const auto& w : ff.warnings) out.warnings.push_back(w);
  } catch (const AnalysisError& e) {
    out.warnings.push_back(fmt::format("equal-FLOPs deltas unavailable: {}", e.what()));
  }

  // Equal tokens: arms are paired by seed (the same data order); the replicate is a seed, whose
  // budgets are branches of one trunk and share its noise, so every interval resamples whole
  // seeds with both arms and all budgets together. Runs without a seed pair only when a budget
  // has one run per arm (seed "").
  struct Pair {
    std::string seed;
    double delta;
  };
  std::vector<std::vector<Pair>> pairs;  // per budget
  for (const auto& tg : treat_groups) {
    const std::vector<Observation>* bg = nullptr;
    for (const auto& g : base_groups) {
      double r = g.front().tokens / tg.front().tokens;
      if (std::abs(r - 1) <= token_tolerance) bg = &g;
    }
    if (!bg) {
      out.warnings.push_back(fmt::format("no '{}' run with {:.3g} tokens to pair with '{}'",
                                         base_family, tg.front().tokens, treatment_family));
      continue;
    }
    HeadsBudgetDelta d;
    d.tokens = tg.front().tokens;
    d.base_loss = MeanLoss(*bg);
    d.treatment_loss = MeanLoss(tg);
    d.base_flops = MeanFlops(*bg);
    d.treatment_flops = MeanFlops(tg);
    // Within a seed, runs of one arm that differ in other ways (model sizes) pair with the
    // other arm's by rank of size; runs without a seed pair only one-to-one.
    std::vector<Pair> p;
    std::map<std::string,
             std::pair<std::vector<const Observation*>, std::vector<const Observation*>>>
        by_seed;
    for (const auto& t : tg) by_seed[t.seed].first.push_back(&t);
    for (const auto& b : *bg) by_seed[b.seed].second.push_back(&b);
    for (auto& [seed, arms] : by_seed) {
      auto& [ts, bs] = arms;
      if (seed.empty() && (ts.size() != 1 || bs.size() != 1)) continue;
      auto by_size = [](const Observation* x, const Observation* y) {
        return x->params < y->params;
      };
      std::stable_sort(ts.begin(), ts.end(), by_size);
      std::stable_sort(bs.begin(), bs.end(), by_size);
      for (size_t k = 0; k < std::min(ts.size(), bs.size()); ++k) {
        p.push_back({seed, ts[k]->loss / bs[k]->loss - 1});
      }
    }
    if (p.empty()) {
      out.warnings.push_back(fmt::format(
          "{:.3g} tokens: no run of '{}' shares a seed with one of '{}' (unpaired; skipped)",
          d.tokens, treatment_family, base_family));
      continue;
    }
    double s = 0;
    for (const auto& x : p) s += x.delta;
    d.delta_equal_tokens = {s / p.size(), kNaN, kNaN};
    d.replicated = p.size() >= 2;
    pairs.push_back(p);
    if (base_fit) {
      const PowerLawFit& f = *base_fit;
      double c = d.treatment_flops;
      std::vector<double> v;
      for (const auto& dr : f.draws) {
        if (std::isnan(dr[0])) continue;
        double lb = dr[0] + std::exp(dr[1] - dr[2] * std::log(c / f.flops_unit));
        v.push_back(d.treatment_loss / lb - 1);
      }
      auto [lo, hi] = internal::PercentileInterval(v, opt.level);
      d.delta_equal_flops = {d.treatment_loss / f.LossAtCompute(c) - 1, lo, hi};
      if (c > f.max_flops || c < f.min_flops) {
        d.note =
            fmt::format("equal-FLOPs base loss extrapolated from the '{}' frontier", base_family);
      }
      if (!f.interval_note.empty()) {
        d.note += (d.note.empty() ? "" : "; ") + ("equal FLOPs: " + f.interval_note);
      }
    } else {
      d.delta_equal_flops = {kNaN, kNaN, kNaN};
    }
    out.budgets.push_back(d);
  }
  if (out.budgets.empty()) {
    throw AnalysisError(fmt::format("heads ablation: no token budget shared by '{}' and '{}'",
                                    base_family, treatment_family));
  }
  const int nb = static_cast<int>(out.budgets.size());
  // The replicate is the seed: a budget's statement is over the seeds' paired deltas (a seed
  // with several pairs at a budget, e.g. model sizes, contributes their mean), and the mean over
  // budgets is over each seed's mean across the budgets it trained (budgets are branches of one
  // trunk, not replicates). t interval (df = seeds − 1), exact sign-flip p, seed bootstrap.
  const int needed = std::max(opt.min_units, 2);
  std::map<std::string, std::pair<double, int>> seed_total;  // seed -> (sum of budget means, n)
  for (int i = 0; i < nb; ++i) {
    auto& d = out.budgets[i];
    std::map<std::string, std::pair<double, int>> per_seed;
    for (const auto& x : pairs[i]) per_seed[x.seed].first += x.delta, per_seed[x.seed].second++;
    std::vector<double> v;
    for (const auto& [seed, sn] : per_seed) {
      v.push_back(sn.first / sn.second);
      seed_total[seed].first += v.back();
      seed_total[seed].second++;
    }
    d.equal_tokens_stats = DescribeSeeds(v, opt.level, false, needed, opt.bootstrap_resamples,
                                         internal::StreamSeed(opt.seed, std::to_string(i)));
    d.delta_equal_tokens = d.equal_tokens_stats.t;
    if (!d.equal_tokens_stats.note.empty()) {
      d.note += (d.note.empty() ? "" : "; ") + ("equal tokens: " + d.equal_tokens_stats.note);
    }
  }
  std::vector<double> seed_means;
  for (const auto& [seed, sn] : seed_total) seed_means.push_back(sn.first / sn.second);
  out.mean_equal_tokens_stats =
      DescribeSeeds(seed_means, opt.level, false, needed, opt.bootstrap_resamples, opt.seed);
  out.mean_delta_equal_tokens = out.mean_equal_tokens_stats.t;
  if (!out.mean_equal_tokens_stats.note.empty()) {
    out.warnings.push_back("mean over budgets at equal tokens: " +
                           out.mean_equal_tokens_stats.note);
  }
  // Equal FLOPs: the base arm's law at the treatment's FLOPs; its interval comes from that fit's
  // seed-level draws (budgets are not independent replicates, so they are not resampled).
  double mf = 0;
  for (const auto& b : out.budgets) mf += b.delta_equal_flops.estimate;
  out.mean_delta_equal_flops = {mf / nb, kNaN, kNaN};
  if (base_fit && !base_fit->draws.empty()) {
    std::vector<double> v;
    for (const auto& dr : base_fit->draws) {
      if (std::isnan(dr[0])) continue;
      double s = 0;
      for (const auto& b : out.budgets) {
        const double c = b.treatment_flops;
        s += b.treatment_loss /
                 (dr[0] + std::exp(dr[1] - dr[2] * std::log(c / base_fit->flops_unit))) -
             1;
      }
      v.push_back(s / nb);
    }
    auto [lo, hi] = internal::PercentileInterval(v, opt.level);
    out.mean_delta_equal_flops.lo = lo;
    out.mean_delta_equal_flops.hi = hi;
  }
  if (nb < 3) {
    out.warnings.push_back(fmt::format(
        "only {} budget(s): the interval of the mean over budgets is not meaningful", nb));
  }
  return out;
}

IsoFlopReport CheckIsoFlop(const std::vector<Observation>& obs, double budget_tolerance,
                           double max_vertex_offset) {
  // One point per run: its final evaluation (an IsoFLOP profile compares finished runs).
  std::map<std::string, Observation> last;
  for (const auto& o : obs) {
    if (!std::isfinite(o.loss) || !(o.flops > 0) || !(o.params > 0)) continue;
    auto it = last.find(o.run);
    if (it == last.end() || o.flops > it->second.flops) last[o.run] = o;
  }
  if (last.empty()) throw AnalysisError("IsoFLOP check: no finite observations");
  std::vector<Observation> v;
  for (const auto& [run, o] : last) v.push_back(o);
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.flops < b.flops; });
  std::vector<std::vector<Observation>> groups;
  for (const auto& o : v) {
    if (groups.empty() || o.flops > groups.back().front().flops * (1 + budget_tolerance)) {
      groups.push_back({});
    }
    groups.back().push_back(o);
  }
  IsoFlopReport rep;
  for (auto& g : groups) {
    std::sort(g.begin(), g.end(), [](const auto& a, const auto& b) { return a.params < b.params; });
    IsoFlopProfile p;
    double lc = 0;
    for (const auto& o : g) lc += std::log(o.flops);
    p.flops = std::exp(lc / g.size());
    p.n_sizes = static_cast<int>(g.size());
    p.min_params = g.front().params;
    p.max_params = g.back().params;
    auto best = std::min_element(g.begin(), g.end(),
                                 [](const auto& a, const auto& b) { return a.loss < b.loss; });
    p.best_params = best->params;
    p.vertex_params = kNaN;
    if (g.size() < 3 || p.min_params == p.max_params) {
      p.issues.push_back(
          fmt::format("budget {:.3g}: {} model size(s); a parabola in log N needs at least 3",
                      p.flops, g.size()));
      rep.profiles.push_back(p);
      continue;
    }
    p.minimum_at_edge = best == g.begin() || best == g.end() - 1;
    Eigen::MatrixXd X(g.size(), 3);
    Eigen::VectorXd y(g.size());
    for (size_t i = 0; i < g.size(); ++i) {
      double ln = std::log(g[i].params);
      X.row(i) << ln * ln, ln, 1.0;
      y(i) = g[i].loss;
    }
    Eigen::Vector3d c = X.colPivHouseholderQr().solve(y);
    double lmin = std::log(p.min_params), lmax = std::log(p.max_params);
    double centre = 0.5 * (lmin + lmax), half = 0.5 * (lmax - lmin);
    if (!(c(0) > 0)) {
      p.not_convex = true;
      p.issues.push_back(fmt::format(
          "budget {:.3g}: loss is not convex in log N over the grid (no interior minimum); the "
          "grid does not bracket the optimum",
          p.flops));
    } else {
      double lv = -c(1) / (2 * c(0));
      p.vertex_params = std::exp(lv);
      p.vertex_offset = (lv - centre) / half;
      p.vertex_outside_grid = std::abs(p.vertex_offset) > 1;
    }
    if (p.minimum_at_edge) {
      p.issues.push_back(fmt::format(
          "budget {:.3g}: lowest loss at the {} model size ({:.3g} params): the optimum is not "
          "bracketed; extend the grid {}",
          p.flops, best == g.begin() ? "smallest" : "largest", p.best_params,
          best == g.begin() ? "downwards" : "upwards"));
    }
    if (p.vertex_outside_grid) {
      p.issues.push_back(
          fmt::format("budget {:.3g}: parabola vertex N* = {:.3g} lies outside the sampled sizes "
                      "[{:.3g}, {:.3g}]; N* is an extrapolation",
                      p.flops, p.vertex_params, p.min_params, p.max_params));
    } else if (std::abs(p.vertex_offset) > max_vertex_offset) {
      p.issues.push_back(fmt::format(
          "budget {:.3g}: off-centre grid: the vertex sits {:.0f}% of the half-width from the "
          "grid centre; parabola vertices are biased on off-centre grids when α ≠ β",
          p.flops, 100 * std::abs(p.vertex_offset)));
    }
    rep.profiles.push_back(p);
  }
  for (const auto& p : rep.profiles) {
    bool bad = p.minimum_at_edge || p.vertex_outside_grid || p.not_convex ||
               std::abs(p.vertex_offset) > max_vertex_offset;
    rep.pitfall = rep.pitfall || bad;
    for (const auto& i : p.issues) rep.issues.push_back(i);
  }
  return rep;
}

InferenceFlops InferenceFlopsPerToken(const ModelConfig& m, const MoEConfig& moe, int64_t context,
                                      const InferenceFlopsOptions& opt) {
  if (context < 1) throw AnalysisError("inference FLOPs: context must be ≥ 1");
  if (opt.mode != "decode" && opt.mode != "prefill") {
    throw AnalysisError(
        fmt::format("inference FLOPs: mode '{}' (expected decode|prefill)", opt.mode));
  }
  // Keys attended per token: all of them when decoding at `context`; on average half of them
  // (the causal triangle) over a prefill of `context` tokens.
  const double keys = opt.mode == "decode" ? double(context) : 0.5 * (double(context) + 1);
  const double d = m.d_model, L = m.layers;
  // The projections and the as-trained scores are core's (the same count as the training
  // FLOPs). Absorbing W_uk into the query and W_uv into the output moves the per-head
  // up-projections (h·nope·r_kv + h·r_kv·v, the same multiply-adds) and makes attention run
  // on the latent, which changes only the scores.
  const AttentionMacs attn = AttentionMacsPerToken(m, keys);
  double scores = attn.scores;
  if (m.attention == "mla" && opt.mla_absorbed) {
    const double h = m.heads, r_kv = m.kv_lora_rank, rope = m.qk_rope_head_dim;
    scores = keys * h * ((r_kv + rope) + r_kv);
  }
  InferenceFlops f;
  f.attention_projections = 2 * L * attn.proj;
  f.attention_scores = 2 * L * scores;
  const double swiglu = 3;  // gate, up, down
  const double sparse = MoeLayers(m, moe), dense = L - sparse;
  f.dense_ffn = 2 * dense * swiglu * d * m.ffn_hidden;
  if (moe.enabled()) {
    f.routed_experts = 2 * sparse * moe.experts_active * swiglu * d * moe.expert_hidden;
    f.shared_experts = 2 * sparse * moe.shared_experts * swiglu * d * moe.expert_hidden;
    f.router = 2 * sparse * d * moe.experts_total;
  }
  f.lm_head = 2 * d * m.vocab_size;
  f.total = f.attention_projections + f.attention_scores + f.dense_ffn + f.routed_experts +
            f.shared_experts + f.router + f.lm_head;
  f.conventions = fmt::format(
      "forward FLOPs for one token, 2 per multiply-accumulate; matmuls only (norms, softmax, "
      "RoPE, activations and embedding lookup ignored); SwiGLU FFNs (3 matrices); {} ({} keys "
      "per token at context {}); {}",
      opt.mode, keys, context,
      m.attention == "mla" ? (opt.mla_absorbed ? "MLA with absorbed up-projections"
                                               : "MLA with per-head K/V cached (naive)")
                           : "MHA/GQA");
  return f;
}

}  // namespace moelab::analysis
