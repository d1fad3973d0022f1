#include "promote/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "analysis/bootstrap.h"
#include "analysis/compute_optimal.h"
#include "core/flops.h"

namespace moelab::promote {

using analysis::ChinchillaFit;
using analysis::ComputeOptimal;
using analysis::Estimate;
using analysis::FitComputeOptimal;
using analysis::FitOptions;
using analysis::Observation;
using analysis::PowerLawFit;
using nlohmann::json;

namespace {

int RoundTo(double v, int multiple) {
  return std::max(multiple, static_cast<int>(std::lround(v / multiple)) * multiple);
}

// Standard normal quantile (Acklam's rational approximation, |error| < 1.2e-9).
double NormalQuantile(double p) {
  static const double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,  -2.759285104469687e+02,
                             1.383577518672690e+02,  -3.066479806614716e+01, 2.506628277459239e+00};
  static const double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                             6.680131188771972e+01, -1.328068155288572e+01};
  static const double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                             -2.549732539343734e+00, 4.374664141464968e+00,  2.938163982698783e+00};
  static const double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                             3.754408661907416e+00};
  const double pl = 0.02425;
  if (p < pl) {
    const double q = std::sqrt(-2 * std::log(p));
    return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
           ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  }
  if (p > 1 - pl) return -NormalQuantile(1 - p);
  const double q = p - 0.5, r = q * q;
  return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
         (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
}

// The law's interval widened by the scatter of single runs around it (log residual sd), the two
// combined in quadrature on the log scale: the band a single new run is expected to fall in.
Estimate WidenBand(const Estimate& law, double sd_log, double level) {
  const double z = NormalQuantile(0.5 + level / 2);
  const double e = law.estimate;
  const double lo_w = std::log(e / law.lo), hi_w = std::log(law.hi / e);
  Estimate b;
  b.estimate = e;
  b.lo = e * std::exp(-std::sqrt(lo_w * lo_w + z * z * sd_log * sd_log));
  b.hi = e * std::exp(std::sqrt(hi_w * hi_w + z * z * sd_log * sd_log));
  return b;
}

double GpuPeak(const std::string& gpu) {  // dense bf16 FLOP/s, vendor data sheets
  if (gpu == "a100") return 312e12;
  if (gpu == "h100" || gpu == "h200") return 989e12;
  if (gpu == "l40s") return 362e12;
  if (gpu == "b200") return 2250e12;
  throw PromotionRefused(fmt::format("unknown GPU '{}' (a100, h100, h200, l40s, b200)", gpu));
}

std::string HumanBytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  return fmt::format("{:.1f} {}", b, units[u]);
}

std::string HumanTime(double s) {
  if (!std::isfinite(s) || s <= 0) return "unknown";
  if (s < 120) return fmt::format("{:.0f} s", s);
  if (s < 7200) return fmt::format("{:.1f} min", s / 60);
  if (s < 172800) return fmt::format("{:.1f} h", s / 3600);
  return fmt::format("{:.1f} days", s / 86400);
}

// Fills steps/tokens/flops, schedule, eval/checkpoint cadence, LR rule, memory, time.
void Finish(PromotionPlan& p, double budget, const PromoteOptions& o) {
  RunConfig& c = p.config;
  p.flops_per_token = ForwardFlopsPerToken(c).training();
  p.batch = c.train.batch_size;
  const double per_step = static_cast<double>(TokensPerStep(c));
  const double steps = std::round(budget / p.flops_per_token / per_step);
  if (steps > 2e9)
    throw PromotionRefused(fmt::format(
        "{:.3g} steps of batch {} × seq {} would be needed: more than a run can count; raise "
        "train.batch_size in the source config",
        steps, p.batch, c.model.seq_len));
  p.steps = std::max(1, static_cast<int>(steps));
  p.tokens = p.steps * per_step;
  p.flops = p.tokens * p.flops_per_token;
  const int src_steps = std::max(1, p.source.total_steps());
  c.train.steps = p.steps;
  c.train.tokens = 0;
  c.train.threads = p.layout.threads;
  c.schedule.warmup_steps = std::min(
      p.steps - 1,
      std::max(0, static_cast<int>(std::lround(static_cast<double>(p.source.schedule.warmup_steps) /
                                               src_steps * p.steps))));
  c.eval.every = std::max(1, p.steps / std::max(1, o.curve_points));
  c.checkpoint.every = std::max(1, p.steps / 10);
  const ParamCounts pc = CountParams(c);
  p.params_total = pc.total;
  p.params_active = pc.active;

  const std::string& opt = c.optimizer.name;
  if (opt != "adamw" && c.optimizer.muon_scale == "rms_match") {
    p.lr_rule = fmt::format(
        "{}: learning rate kept at {:g} — Muon's RMS matching (update scaled by 0.2·√max(n,m)) "
        "gives every hidden matrix AdamW's update RMS whatever its width, so the sweep's rate "
        "transfers (Moonlight, K2); embeddings/head/norms use AdamW at the same rate",
        opt, c.optimizer.lr);
  } else {
    const double ratio = static_cast<double>(p.source.model.d_model) / c.model.d_model;
    c.optimizer.lr = p.source.optimizer.lr * ratio;
    p.lr_rule = fmt::format(
        "{}: learning rate {:g} × d_source/d_promoted ({}/{}) = {:g} (the 1/width rule of μP for "
        "hidden matrices applied to the single rate; not fitted by the sweep)",
        opt, p.source.optimizer.lr, p.source.model.d_model, c.model.d_model, c.optimizer.lr);
  }
  p.memory = EstimateMemory(c, p.layout);
  if (!o.gpu.empty()) {
    const double rate = GpuPeak(o.gpu) * o.mfu * p.layout.ranks;
    p.time_s = p.flops / rate;
    p.time_basis = fmt::format("{} × {} at {:.0f}% MFU of the {:.0f} TFLOP/s bf16 dense peak",
                               p.layout.ranks, o.gpu, 100 * o.mfu, GpuPeak(o.gpu) / 1e12);
  } else if (o.measured_flops_per_s > 0) {
    p.time_s = p.flops / (o.measured_flops_per_s * p.layout.ranks);
    p.time_basis =
        fmt::format("{:.3g} FLOP/s per rank measured on this machine{}{}", o.measured_flops_per_s,
                    o.rate_basis.empty() ? "" : ": ", o.rate_basis);
    if (p.layout.ranks > 1)
      p.time_basis += fmt::format(", × {} ranks (ideal scaling)", p.layout.ranks);
  } else {
    p.time_basis = "no rate measured (use --measure or --gpu)";
  }
  ValidateConfig(c);
}

CurvePoint PowerPoint(const PowerLawFit& fit, double flops, double level, double sd) {
  CurvePoint cp;
  cp.flops = flops;
  cp.loss.estimate = fit.LossAtCompute(flops);
  std::vector<double> v;
  v.reserve(fit.draws.size());
  const double x = std::log(flops / fit.flops_unit);
  for (const auto& d : fit.draws) {
    if (!std::isfinite(d[0])) continue;
    v.push_back(d[0] + std::exp(d[1] - d[2] * x));
  }
  const auto [lo, hi] = analysis::internal::PercentileInterval(v, level);
  cp.loss.lo = std::isfinite(lo) ? std::min(lo, cp.loss.estimate) : cp.loss.estimate;
  cp.loss.hi = std::isfinite(hi) ? std::max(hi, cp.loss.estimate) : cp.loss.estimate;
  cp.band = WidenBand(cp.loss, sd, level);
  return cp;
}

std::vector<double> Geometric(double lo, double hi, int n) {
  std::vector<double> out;
  if (n < 2 || !(hi > lo)) return {hi};
  for (int i = 0; i < n; ++i)
    out.push_back(lo * std::pow(hi / lo, static_cast<double>(i) / (n - 1)));
  return out;
}

void CheckRange(double budget, double min_flops, double max_flops, const PromoteOptions& o,
                const std::string& what) {
  if (!(budget > 0) || !std::isfinite(budget))
    throw PromotionRefused(fmt::format("{}: no finite budget", what));
  if (budget < min_flops)
    throw PromotionRefused(fmt::format(
        "{}: budget {:.3g} FLOPs is below the smallest compute the fit saw ({:.3g}); promotion "
        "scales up from the sweep",
        what, budget, min_flops));
  if (budget > max_flops * o.max_extrapolation)
    throw PromotionRefused(fmt::format(
        "{}: budget {:.3g} FLOPs is {:.0f}× the largest compute the fit saw ({:.3g}); the fit "
        "supports at most {:g}× (--max-extrapolation)",
        what, budget, budget / max_flops, max_flops, o.max_extrapolation));
}

}  // namespace

RunConfig ScaleShape(const RunConfig& source, double target_active, std::string* rule) {
  const ModelConfig& m = source.model;
  const bool mla = m.attention == "mla";
  const int group = std::max(1, m.heads / m.kv_heads_effective());
  const int hd = std::max(2, m.d_model / m.heads);  // d_model per head (kept)
  const double aspect = static_cast<double>(m.d_model) / m.layers;
  const double ffn_ratio = static_cast<double>(m.ffn_hidden) / m.d_model;
  const double exp_ratio = static_cast<double>(source.moe.expert_hidden) / m.d_model;
  RunConfig best = source;
  double best_cost = std::numeric_limits<double>::infinity();
  const int max_layers = std::max(64, 4 * m.layers);
  for (int L = 1; L <= max_layers; ++L) {
    if (source.moe.enabled() && source.moe.dense_layers >= L) continue;
    for (int h = group; h * hd <= 32768; h += group) {
      const int d = h * hd;
      const double shape_cost = 0.5 * std::abs(std::log(d / static_cast<double>(L) / aspect));
      if (shape_cost >= best_cost) continue;
      RunConfig c = source;
      c.model.layers = L;
      c.model.d_model = d;
      c.model.heads = h;
      if (m.kv_heads > 0) c.model.kv_heads = h / group;
      c.model.ffn_hidden = RoundTo(ffn_ratio * d, 8);
      c.moe.expert_hidden = RoundTo(exp_ratio * d, 8);
      if (mla) {
        const double r = static_cast<double>(d) / m.d_model;
        if (m.q_lora_rank > 0) c.model.q_lora_rank = RoundTo(m.q_lora_rank * r, 8);
        c.model.kv_lora_rank = RoundTo(m.kv_lora_rank * r, 8);
      }
      const double n = static_cast<double>(CountParams(c).active);
      const double cost = std::abs(std::log(n / target_active)) + shape_cost;
      if (cost < best_cost) {
        try {
          ValidateConfig(c);
        } catch (const ConfigError&) {
          continue;
        }
        best_cost = cost;
        best = c;
      }
    }
  }
  if (rule) {
    *rule = fmt::format(
        "layers × width searched for active parameters closest to {:.3g} (log distance) plus "
        "½·|log aspect ratio change|; kept: d_model/heads = {}, ffn_hidden/d_model = {:.3g}, "
        "expert_hidden/d_model = {:.3g}, {} query heads per KV head, experts {} total / {} "
        "active / {} shared (sparsity unchanged), vocab, seq_len, batch; source aspect d/L = "
        "{:.3g}",
        target_active, hd, ffn_ratio, exp_ratio, group, source.moe.experts_total,
        source.moe.experts_active, source.moe.shared_experts, aspect);
  }
  return best;
}

PromotionPlan PlanFromPowerLaw(const PowerLawFit& fit, const RunConfig& source,
                               const std::string& source_run, double source_params,
                               double source_tokens, const PromoteTarget& target,
                               const PromoteLayout& layout, const PromoteOptions& o) {
  const std::string what = fmt::format("family {}", fit.family);
  if (fit.draws.empty()) {
    throw PromotionRefused(what + ": the fit has no bootstrap draws" +
                           (fit.interval_note.empty() ? "" : " (" + fit.interval_note + ")"));
  }
  PromotionPlan p;
  p.law = "power";
  p.family = fit.family;
  p.source = source;
  p.source_run = source_run;
  p.layout = layout;
  p.fit_min_flops = fit.min_flops;
  p.fit_max_flops = fit.max_flops;
  p.residual_sd_log = fit.diagnostics.rmse_log;
  double budget = target.budget_flops;
  if (target.target_loss > 0) {
    const double E = fit.E();
    if (target.target_loss <= E * (1 + o.loss_margin))
      throw PromotionRefused(fmt::format(
          "{}: target loss {:.4f} is at or below the fitted irreducible loss E = {:.4f} "
          "(+{:.0f}% margin): no budget reaches it",
          what, target.target_loss, E, 100 * o.loss_margin));
    budget = fit.ComputeAtLoss(target.target_loss);
    if (budget < fit.min_flops)
      throw PromotionRefused(fmt::format(
          "{}: target loss {:.4f} is already reached inside the sweep (at {:.3g} FLOPs)", what,
          target.target_loss, budget));
  }
  CheckRange(budget, fit.min_flops, fit.max_flops, o, what);
  // Shape rule: keep D/N of the family's largest frontier run, so N and D both grow as √C.
  const double src_flops = fit.frontier.empty() ? fit.max_flops : fit.frontier.back().flops;
  if (!(source_params > 0) || !(source_tokens > 0))
    throw PromotionRefused(what + ": the source run has no parameter or token count");
  p.target_params = source_params * std::sqrt(budget / src_flops);
  p.target_tokens = source_tokens * std::sqrt(budget / src_flops);
  p.config = ScaleShape(source, p.target_params, &p.shape_rule);
  p.shape_rule =
      fmt::format(
          "no Chinchilla/IsoFLOP fit: N and D scale as √(C/C_source) from the family's "
          "largest frontier run (run {}: N {:.3g}, D {:.3g}, C {:.3g}; D/N = {:.3g} "
          "kept). ",
          source_run, source_params, source_tokens, src_flops, source_tokens / source_params) +
      p.shape_rule;
  Finish(p, budget, o);
  for (double c : Geometric(fit.min_flops, std::max(p.flops, fit.min_flops), o.curve_points))
    p.curve.push_back(PowerPoint(fit, c, o.level, p.residual_sd_log));
  const CurvePoint end = PowerPoint(fit, p.flops, o.level, p.residual_sd_log);
  p.loss = end.loss;
  p.band = end.band;
  p.band_rule = fmt::format(
      "{:.0f}% band = the law's bootstrap interval (over runs, {} resamples) ⊕ the runs' RMS log "
      "residual {:.4f} around the frontier (quadrature on log L): the bootstrap interval alone is "
      "for the mean law, not for one new run",
      100 * o.level, fit.draws.size(), p.residual_sd_log);
  p.notes.push_back(
      "L(C) is the family's compute-optimal frontier; a single run's curve sits above it before "
      "its schedule ends (the cosine tail is where it catches up): compare the final point");
  if (p.flops > fit.max_flops)
    p.notes.push_back(fmt::format("extrapolation: {:.1f}× the largest FLOPs of the sweep",
                                  p.flops / fit.max_flops));
  return p;
}

PromotionPlan PlanFromChinchilla(const std::vector<Observation>& obs, const FitOptions& fo,
                                 const RunConfig& source, const std::string& source_run,
                                 const PromoteTarget& target, const PromoteLayout& layout,
                                 const PromoteOptions& o) {
  double min_flops = INFINITY, max_flops = 0;
  for (const Observation& ob : obs) {
    if (!(ob.flops > 0) || !std::isfinite(ob.loss)) continue;
    min_flops = std::min(min_flops, ob.flops);
    max_flops = std::max(max_flops, ob.flops);
  }
  if (!(max_flops > 0)) throw PromotionRefused("Chinchilla fit: no usable observations");
  PromotionPlan p;
  p.law = "chinchilla";
  p.source = source;
  p.source_run = source_run;
  p.layout = layout;
  p.fit_min_flops = min_flops;
  p.fit_max_flops = max_flops;
  double budget = target.budget_flops;
  if (target.target_loss > 0) {
    // Compute-optimal loss on a grid across the supported range, then log-interpolated.
    const std::vector<double> grid = Geometric(min_flops, max_flops * o.max_extrapolation, 40);
    FitOptions quick = fo;
    quick.bootstrap_resamples = std::min(fo.bootstrap_resamples, 20);
    const ChinchillaFit f = FitComputeOptimal(obs, quick, grid);
    double E = NAN;
    for (const auto& pe : f.params)
      if (pe.name == "E") E = pe.value.estimate;
    if (target.target_loss <= E * (1 + o.loss_margin))
      throw PromotionRefused(fmt::format(
          "Chinchilla fit: target loss {:.4f} is at or below the fitted irreducible loss E = "
          "{:.4f} (+{:.0f}% margin)",
          target.target_loss, E, 100 * o.loss_margin));
    budget = NAN;
    for (size_t i = 1; i < f.optimal.size(); ++i) {
      const double l0 = f.optimal[i - 1].loss.estimate, l1 = f.optimal[i].loss.estimate;
      if (l0 >= target.target_loss && l1 <= target.target_loss) {
        const double t =
            (std::log(l0) - std::log(target.target_loss)) / (std::log(l0) - std::log(l1));
        budget = std::exp(std::log(grid[i - 1]) + t * (std::log(grid[i]) - std::log(grid[i - 1])));
        break;
      }
    }
    if (std::isnan(budget)) {
      if (!f.optimal.empty() && f.optimal.front().loss.estimate < target.target_loss)
        throw PromotionRefused(
            fmt::format("Chinchilla fit: target loss {:.4f} is already reached inside the sweep",
                        target.target_loss));
      throw PromotionRefused(fmt::format(
          "Chinchilla fit: target loss {:.4f} needs more than {:g}× the sweep's largest compute "
          "(--max-extrapolation)",
          target.target_loss, o.max_extrapolation));
    }
  }
  CheckRange(budget, min_flops, max_flops, o, "Chinchilla fit");
  std::vector<double> budgets = Geometric(min_flops, budget, o.curve_points);
  budgets.back() = budget;
  const ChinchillaFit f = FitComputeOptimal(obs, fo, budgets);
  const ComputeOptimal& at = f.optimal.back();
  p.residual_sd_log = f.diagnostics.rmse_log;
  p.target_params = at.params.estimate;
  p.target_tokens = at.tokens.estimate;
  p.config = ScaleShape(source, p.target_params, &p.shape_rule);
  p.shape_rule = fmt::format(
                     "compute-optimal law: N_opt {:.3g} [{:.3g}, {:.3g}], D_opt {:.3g} at C = "
                     "{:.3g} under C = {:.3g}·N·D (k measured from the runs); tokens then set so "
                     "the promoted shape spends C exactly. ",
                     at.params.estimate, at.params.lo, at.params.hi, at.tokens.estimate, budget,
                     f.flops_per_param_token) +
                 p.shape_rule;
  Finish(p, budget, o);
  for (const ComputeOptimal& c : f.optimal) {
    CurvePoint cp;
    cp.flops = c.flops;
    cp.loss = c.loss;
    cp.band = WidenBand(c.loss, p.residual_sd_log, o.level);
    p.curve.push_back(cp);
  }
  p.curve.back().flops = p.flops;
  p.loss = at.loss;
  p.band = p.curve.back().band;
  p.band_rule = fmt::format(
      "{:.0f}% band = L(N_opt, D_opt)'s bootstrap interval ⊕ the fit's RMS log residual {:.4f} "
      "(quadrature on log L)",
      100 * o.level, p.residual_sd_log);
  for (const auto& w : f.warnings) p.notes.push_back(w);
  if (p.flops > max_flops)
    p.notes.push_back(
        fmt::format("extrapolation: {:.1f}× the largest FLOPs of the sweep", p.flops / max_flops));
  return p;
}

double BandUnits(const json& plan, double flops, double loss) {
  const json& curve = plan.at("curve");
  if (!curve.is_array() || curve.empty() || !(flops > 0)) return NAN;
  auto at = [&](size_t i, const char* part) { return curve[i].at("band").at(part).get<double>(); };
  size_t i = 0;
  while (i + 1 < curve.size() && curve[i + 1].at("flops").get<double>() < flops) ++i;
  double est, lo, hi;
  if (i + 1 >= curve.size() || curve[i].at("flops").get<double>() >= flops) {
    est = at(i, "estimate"), lo = at(i, "lo"), hi = at(i, "hi");
  } else {
    const double f0 = std::log(curve[i].at("flops").get<double>()),
                 f1 = std::log(curve[i + 1].at("flops").get<double>());
    const double t = (std::log(flops) - f0) / (f1 - f0);
    auto lerp = [&](const char* part) { return (1 - t) * at(i, part) + t * at(i + 1, part); };
    est = lerp("estimate"), lo = lerp("lo"), hi = lerp("hi");
  }
  if (loss >= est) return hi > est ? (loss - est) / (hi - est) : INFINITY;
  return est > lo ? -(est - loss) / (est - lo) : -INFINITY;
}

double BandUnits(const PromotionPlan& plan, double flops, double loss) {
  return BandUnits(json(plan), flops, loss);
}

std::string FormatPlan(const PromotionPlan& p) {
  const RunConfig& c = p.config;
  std::string s;
  s += fmt::format("Promotion plan ({} law{})\n", p.law,
                   p.family.empty() ? "" : ", family " + p.family_key + "=" + p.family);
  s += fmt::format("  source run       {} (d_model {}, layers {}, heads {})\n", p.source_run,
                   p.source.model.d_model, p.source.model.layers, p.source.model.heads);
  s += fmt::format("  shape            d_model {}, layers {}, heads {} (kv {}), ffn {}, ",
                   c.model.d_model, c.model.layers, c.model.heads, c.model.kv_heads_effective(),
                   c.model.ffn_hidden);
  if (c.moe.enabled())
    s += fmt::format("experts {}/{} (+{} shared) × {}\n", c.moe.experts_total, c.moe.experts_active,
                     c.moe.shared_experts, c.moe.expert_hidden);
  else
    s += "dense\n";
  s += fmt::format("  parameters       {:.4g} total, {:.4g} active (law asked N = {:.4g})\n",
                   static_cast<double>(p.params_total), static_cast<double>(p.params_active),
                   p.target_params);
  s += fmt::format(
      "  tokens           {:.4g} (law asked D = {:.4g}); {} steps × batch {} × seq {}\n", p.tokens,
      p.target_tokens, p.steps, p.batch, c.model.seq_len);
  s += fmt::format("  FLOPs            {:.4g} ({:.4g}/token; sweep range {:.3g} .. {:.3g})\n",
                   p.flops, p.flops_per_token, p.fit_min_flops, p.fit_max_flops);
  s += fmt::format(
      "  layout           {} rank(s) on {}, {} data parallel × {} expert parallel, {} "
      "threads/rank\n",
      p.layout.ranks, p.layout.device, std::max(1, p.layout.ranks / std::max(1, p.layout.ep)),
      p.layout.ep, p.layout.threads);
  s += fmt::format("  memory / device  params {}, grads {}, optimizer {}, activations {}{} = {}\n",
                   HumanBytes(p.memory.params), HumanBytes(p.memory.grads),
                   HumanBytes(p.memory.optimizer), HumanBytes(p.memory.activations),
                   p.memory.runtime > 0
                       ? fmt::format(", CUDA runtime {}", HumanBytes(p.memory.runtime))
                       : std::string(),
                   HumanBytes(p.memory.total()));
  s += fmt::format("  time             {} ({})\n", HumanTime(p.time_s), p.time_basis);
  s += fmt::format(
      "  predicted loss   {:.4f}, law interval [{:.4f}, {:.4f}], band [{:.4f}, {:.4f}]\n",
      p.loss.estimate, p.loss.lo, p.loss.hi, p.band.lo, p.band.hi);
  s += "  predicted curve  FLOPs → loss [band]\n";
  const size_t step = std::max<size_t>(1, p.curve.size() / 6);
  for (size_t i = 0; i < p.curve.size(); i += step) {
    const CurvePoint& cp = p.curve[i];
    s += fmt::format("    {:.3g} → {:.4f} [{:.4f}, {:.4f}]\n", cp.flops, cp.loss.estimate,
                     cp.band.lo, cp.band.hi);
  }
  if (!p.curve.empty() && (p.curve.size() - 1) % step != 0) {
    const CurvePoint& cp = p.curve.back();
    s += fmt::format("    {:.3g} → {:.4f} [{:.4f}, {:.4f}]\n", cp.flops, cp.loss.estimate,
                     cp.band.lo, cp.band.hi);
  }
  s += "  shape rule       " + p.shape_rule + "\n";
  s += "  lr rule          " + p.lr_rule + "\n";
  s += "  band             " + p.band_rule + "\n";
  for (const auto& n : p.notes) s += "  note             " + n + "\n";
  return s;
}

void to_json(json& j, const MemoryEstimate& v) {
  j = {{"params_bytes", v.params},       {"grads_bytes", v.grads},
       {"optimizer_bytes", v.optimizer}, {"activations_bytes", v.activations},
       {"runtime_bytes", v.runtime},     {"basis", v.basis},
       {"total_bytes", v.total()}};
}

void to_json(json& j, const CurvePoint& v) {
  j = {{"flops", v.flops}, {"loss", v.loss}, {"band", v.band}};
}

void to_json(json& j, const PromotionPlan& v) {
  j = {{"law", v.law},
       {"family_key", v.family_key},
       {"family", v.family},
       {"source_run", v.source_run},
       {"config", ConfigToJson(v.config)},
       {"params_total", v.params_total},
       {"params_active", v.params_active},
       {"target_params", v.target_params},
       {"target_tokens", v.target_tokens},
       {"flops_per_token", v.flops_per_token},
       {"flops", v.flops},
       {"tokens", v.tokens},
       {"steps", v.steps},
       {"batch", v.batch},
       {"layout",
        {{"ranks", v.layout.ranks},
         {"ep", v.layout.ep},
         {"dp", std::max(1, v.layout.ranks / std::max(1, v.layout.ep))},
         {"device", v.layout.device},
         {"threads", v.layout.threads}}},
       {"memory", v.memory},
       {"time_s", v.time_s},
       {"time_basis", v.time_basis},
       {"loss", v.loss},
       {"band", v.band},
       {"residual_sd_log", v.residual_sd_log},
       {"curve", v.curve},
       {"fit_min_flops", v.fit_min_flops},
       {"fit_max_flops", v.fit_max_flops},
       {"shape_rule", v.shape_rule},
       {"lr_rule", v.lr_rule},
       {"band_rule", v.band_rule},
       {"notes", v.notes}};
}

}  // namespace moelab::promote
