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

#include "analysis/bootstrap.h"
#include "core/flops.h"

namespace moelab::analysis {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

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

  // Per budget, the bootstrap draws of the equal-token delta (empty: one run per arm). The mean
  // over budgets resamples these too, so seed noise is in its interval (resampling only the
  // budget means ignored it: ±0.3 % around a mean whose budgets each had ±10 %).
  std::vector<std::vector<double>> budget_draws;
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
    double point = d.treatment_loss / d.base_loss - 1;
    d.replicated = bg->size() >= 2 && tg.size() >= 2;
    if (d.replicated) {
      // Replicates (seeds) of each arm are resampled independently.
      std::vector<int> sb(bg->size()), st(tg.size());
      std::iota(sb.begin(), sb.end(), 0);
      std::iota(st.begin(), st.end(), static_cast<int>(bg->size()));
      const int n = static_cast<int>(bg->size() + tg.size());
      const uint64_t budget_seed =
          internal::StreamSeed(opt.seed, fmt::format("budget-{}", budget_draws.size()));
      auto rows = internal::Bootstrap({sb, st}, n, opt.bootstrap_resamples, budget_seed, 1, 1,
                                      [&](int, const std::vector<int>& c) -> std::vector<double> {
                                        double lb = 0, lt = 0, nb = 0, nt = 0;
                                        for (size_t i = 0; i < bg->size(); ++i)
                                          lb += c[i] * (*bg)[i].loss, nb += c[i];
                                        for (size_t i = 0; i < tg.size(); ++i) {
                                          lt += c[bg->size() + i] * tg[i].loss,
                                              nt += c[bg->size() + i];
                                        }
                                        return {(lt / nt) / (lb / nb) - 1};
                                      });
      std::vector<double> v;
      for (const auto& r : rows) v.push_back(r[0]);
      auto [lo, hi] = internal::PercentileInterval(v, opt.level);
      d.delta_equal_tokens = {point, lo, hi};
      budget_draws.push_back(v);
    } else {
      budget_draws.push_back({});
      d.delta_equal_tokens = {point, point, point};
      d.note =
          "one run per arm at this budget: no replicate spread, interval collapses to the "
          "point; add seeds for an interval";
    }
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
        d.note +=
            (d.note.empty() ? "" : "; ") +
            fmt::format("equal-FLOPs base loss extrapolated from the '{}' frontier", base_family);
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
  // Mean over budgets with a bootstrap over budgets (and replicates, for equal tokens).
  const int nb = static_cast<int>(out.budgets.size());
  std::vector<int> all(nb);
  std::iota(all.begin(), all.end(), 0);
  // Two levels: resample budgets, and within each drawn budget take its replicate bootstrap
  // draw of the same index (when it has replicates), so both budget and seed noise count.
  auto mean_of = [&](auto get, bool with_replicates) {
    double s = 0;
    for (const auto& b : out.budgets) s += get(b);
    double point = s / nb;
    auto rows = internal::Bootstrap({all}, nb, opt.bootstrap_resamples, opt.seed, 1, 1,
                                    [&](int b, const std::vector<int>& c) -> std::vector<double> {
                                      double t = 0;
                                      for (int i = 0; i < nb; ++i) {
                                        const auto& dr = budget_draws[i];
                                        const double v = with_replicates && !dr.empty()
                                                             ? dr[b % dr.size()]
                                                             : get(out.budgets[i]);
                                        t += c[i] * v;
                                      }
                                      return {t / nb};
                                    });
    std::vector<double> v;
    for (const auto& r : rows) v.push_back(r[0]);
    auto [lo, hi] = internal::PercentileInterval(v, opt.level);
    return Estimate{point, lo, hi};
  };
  out.mean_delta_equal_tokens =
      mean_of([](const HeadsBudgetDelta& b) { return b.delta_equal_tokens.estimate; }, true);
  out.mean_delta_equal_flops =
      mean_of([](const HeadsBudgetDelta& b) { return b.delta_equal_flops.estimate; }, false);
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
