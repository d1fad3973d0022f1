// The text of `moelab fit` (see fit_report.h).
#include "cli/fit_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

namespace moelab::cli {

namespace {

using analysis::Estimate;

const analysis::ParamEstimate* Param(const std::vector<analysis::ParamEstimate>& ps,
                                     const std::string& name) {
  for (const auto& p : ps)
    if (p.name == name) return &p;
  return nullptr;
}

void PrintWarnings(const std::vector<std::string>& warnings) {
  for (const auto& w : warnings) fmt::print("  warning: {}\n", w);
}

// "1.133 [1.05, 1.21]", or the point with why there is no interval.
std::string RatioText(const Estimate& e, const std::string& note) {
  if (!note.empty()) return fmt::format("{:.3f} (no interval)", e.estimate);
  return Interval(e, "{:.3f}");
}

void PrintPower(const analysis::PowerFormResult& p, const std::string& by,
                const std::string& after_model_free, const analysis::FrontierReport* frontier) {
  if (p.model_free) {
    PrintModelFree(*p.model_free, by);
    fmt::print("{}", after_model_free);
  } else
    fmt::print("\nmodel-free estimate unavailable: {}\n", p.model_free_error);
  if (p.law_error.empty()) {
    PrintFittedLaws(p, by);
    PrintMisfit(p);
    const std::string& note = p.fits.Get(p.reference).interval_note;
    if (!note.empty()) fmt::print("intervals: {}\n", note);
    PrintFittedMultipliers(p, by);
  } else {
    fmt::print("\nFitted law (secondary): not fitted, the model-free table stands alone: {}\n",
               p.law_error);
  }
  fmt::print("\nverdict rests on: {}{}\n", p.verdict_basis,
             p.model_free && !p.model_free->estimand.empty()
                 ? fmt::format("; estimand: {}", p.model_free->estimand)
                 : "");
  PrintWarnings(p.fits.warnings);
  if (frontier) PrintFrontier(*frontier, by);
}

void PrintJoint(const analysis::JointSparsityFit& fit) {
  for (const auto& form : fit.forms) {
    fmt::print("\n{}: {}\n  held-out RMSE(log) {:.4f} on {} points ({})\n", form.form, form.formula,
               form.holdout_rmse_log, form.holdout_points, fit.holdout_rule);
    for (const auto& p : form.params)
      fmt::print("  {:<8} {}{}\n", p.name, Interval(p.value), p.at_bound ? "  (at bound)" : "");
  }
  fmt::print("\nbetter on held-out points: {}\n", fit.better_form);
  PrintWarnings(fit.warnings);
}

void PrintChinchilla(const analysis::ChinchillaFit& fit) {
  fmt::print("\nL(N, D) = E + A/N^alpha + B/D^beta\n");
  for (const auto& p : fit.params) fmt::print("  {:<8} {}\n", p.name, Interval(p.value));
  fmt::print("  N_opt ∝ C^{}   D_opt ∝ C^{}\n", Interval(fit.exponent_n, "{:.3f}"),
             Interval(fit.exponent_d, "{:.3f}"));
  if (!fit.optimal.empty())
    fmt::print("  compute-optimal under C = {:.3g}·N·D (k measured from the runs' FLOPs)\n",
               fit.flops_per_param_token);
  for (const auto& o : fit.optimal)
    fmt::print("  C = {:.3g}: N_opt {}  D_opt {}  L {}\n", o.flops, Interval(o.params, "{:.3g}"),
               Interval(o.tokens, "{:.3g}"), Interval(o.loss, "{:.4f}"));
  PrintWarnings(fit.warnings);
}

void PrintHeads(const analysis::HeadsAblation& h, const std::string& by) {
  fmt::print("\nrelative loss difference ({} {} vs {}), (L_t - L_b)/L_b\n", by, h.treatment_family,
             h.base_family);
  for (const auto& b : h.budgets)
    fmt::print("  tokens {:.3g}: equal tokens {}  equal FLOPs {}{}\n", b.tokens,
               Interval(b.delta_equal_tokens, "{:+.4f}"), Interval(b.delta_equal_flops, "{:+.4f}"),
               b.replicated ? "" : "  (one run per arm)");
  fmt::print("  mean: equal tokens {}  equal FLOPs {}\n",
             Interval(h.mean_delta_equal_tokens, "{:+.4f}"),
             Interval(h.mean_delta_equal_flops, "{:+.4f}"));
  PrintWarnings(h.warnings);
}

void PrintIsoFlop(const analysis::IsoFlopReport& r) {
  fmt::print("\nIsoFLOP check: {}\n", r.pitfall ? "PITFALL" : "no pitfall found");
  for (const auto& issue : r.issues) fmt::print("  {}\n", issue);
}

}  // namespace

std::string Interval(const Estimate& e, const char* spec) {
  if (std::isnan(e.lo) && std::isnan(e.hi)) {
    return fmt::format(fmt::runtime(spec), e.estimate) + " (no interval)";
  }
  return fmt::format("{} [{}, {}]", fmt::format(fmt::runtime(spec), e.estimate),
                     fmt::format(fmt::runtime(spec), e.lo), fmt::format(fmt::runtime(spec), e.hi));
}

void PrintFitResult(const analysis::FitResult& r, const std::string& by,
                    const std::string& after_model_free, const analysis::FrontierReport* frontier) {
  if (r.power) PrintPower(*r.power, by, after_model_free, frontier);
  if (r.joint) PrintJoint(*r.joint);
  if (r.chinchilla) PrintChinchilla(*r.chinchilla);
  if (r.heads) PrintHeads(*r.heads, by);
  if (r.isoflop) PrintIsoFlop(*r.isoflop);
}

void PrintModelFree(const analysis::ModelFreeTable& t, const std::string& by,
                    const std::string& what) {
  const bool frontier = t.estimand == analysis::EstimandLabel(analysis::Estimand::kFrontier);
  fmt::print(
      "\nModel-free ({}){}{}: FLOPs and tokens to reach L*, log-log interpolated on each "
      "seed's {}; ratio to {} = {} (geometric mean over seeds, paired by seed); interval: "
      "t on the mean log ratio (df = seeds - 1); p: exact sign-flip over seeds\n",
      what.empty() ? "primary" : "contrast", t.estimand.empty() ? "" : ", estimand " + t.estimand,
      what.empty() ? "" : " " + what,
      frontier ? "lower envelope over the family's model sizes" : "points", by, t.reference);
  fmt::print("loss range every (family, seed) covers: [{:.4f}, {:.4f}]\n", t.range_lo, t.range_hi);
  fmt::print("{:<8} {:<10} {:>5}  {:<26} {:>7}  {:<30} {:<26} {}\n", "L*", by, "seeds",
             "FLOPs ratio (t)", "p", "bootstrap", "tokens ratio (t)", "per seed (FLOPs ratio)");
  std::set<std::string> notes;
  std::vector<analysis::ModelFreeRow> rows = t.rows;
  std::stable_sort(rows.begin(), rows.end(), [](const auto& x, const auto& y) {
    if (x.target_loss != y.target_loss) return x.target_loss < y.target_loss;
    return analysis::FamilyLess(x.family, y.family);
  });
  for (const auto& r : rows) {
    std::vector<std::string> per_seed;
    for (size_t i = 0; i < r.seeds.size(); ++i)
      per_seed.push_back(
          fmt::format("s{} {:.3f}", r.seeds[i], r.flops_family[i] / r.flops_reference[i]));
    const auto& st = r.flops_stats;
    const std::string boot = st.note.empty()
                                 ? fmt::format("{} [{:.3f}, {:.3f}]", st.bootstrap_label,
                                               st.bootstrap.lo, st.bootstrap.hi)
                                 : "-";
    fmt::print("{:<8.4f} {:<10} {:>5}  {:<26} {:>7}  {:<30} {:<26} {}\n", r.target_loss, r.family,
               r.seeds.size(), RatioText(r.flops_ratio, r.interval_note),
               st.note.empty() ? fmt::format("{:.3g}", st.sign_flip_p) : "-", boot,
               RatioText(r.tokens_ratio, r.interval_note), fmt::join(per_seed, ", "));
    if (!r.interval_note.empty()) notes.insert(r.interval_note);
  }
  for (const auto& n : notes) fmt::print("intervals: {}\n", n);
  for (const auto& n : t.notes) fmt::print("  note: {}\n", n);
}

void PrintFittedLaws(const analysis::PowerFormResult& p, const std::string& by) {
  fmt::print(
      "\nFitted law (secondary, smoothed): L(C) = E + A·(C/1e15)^(-alpha) on each "
      "family's {}\n",
      p.single_size ? "loss-compute curve (one model size per family: a training "
                      "curve, not a compute-optimal frontier)"
                    : "compute frontier (lower envelope over its model sizes)");
  fmt::print("{:<10} {:>5} {:>6}  {:<26} {:<26} {:<26} {:>9} {:>6}\n", by, "seeds", "points", "E",
             "A", "alpha", "rmse(log)", "start");
  for (const std::string& name : p.families) {
    const auto& f = p.fits.Get(name);
    fmt::print("{:<10} {:>5} {:>6}  {:<26} {:<26} {:<26} {:>9.4f} {:>6}{}\n", name, f.n_units,
               f.diagnostics.n_points, Interval(Param(f.params, "E")->value),
               Interval(Param(f.params, "A")->value), Interval(Param(f.params, "alpha")->value),
               f.diagnostics.rmse_log, f.diagnostics.winning_start,
               f.diagnostics.params_at_bound.empty()
                   ? ""
                   : fmt::format("  at bound: {}", fmt::join(f.diagnostics.params_at_bound, ",")));
  }
}

void PrintMisfit(const analysis::PowerFormResult& p) {
  fmt::print("misfit (runs test on residual signs by budget; unconstrained E):\n");
  for (const std::string& name : p.families) {
    const auto& m = p.fits.Get(name).misfit;
    fmt::print("{:<10} {} +/{} - in {} runs, p = {:.3f}; unconstrained E = {:.3g}: {}\n", name,
               m.positives, m.negatives, m.runs, m.runs_p, m.unconstrained_E,
               m.rejected ? "REJECTED (" + m.reason + ")" : "not rejected");
  }
}

void PrintFittedMultipliers(const analysis::PowerFormResult& p, const std::string& by) {
  const std::string estimand =
      p.model_free && !p.model_free->estimand.empty()
          ? p.model_free->estimand
          : analysis::EstimandLabel(p.single_size ? analysis::Estimand::kFixedSize
                                                  : analysis::Estimand::kFrontier);
  fmt::print(
      "\nFitted FLOPs multiplier C_family(L*) / C_{}(L*) at L* = {:.4f} ({} = {}); secondary, "
      "estimand {}\n",
      p.reference, p.target_loss, by, p.reference, estimand);
  fmt::print("{:<10} {:<30} {:<34}\n", by, "multiplier", "FLOPs to reach L*");
  for (const std::string& name : p.families) {
    for (const auto& row : p.multipliers.rows) {
      if (row.family != name) continue;
      if (row.ok) {
        fmt::print("{:<10} {:<30} {:<34}\n", name, Interval(row.multiplier, "{:.3f}"),
                   Interval(row.compute_family, "{:.3g}"));
        for (const auto& flag : row.flags) fmt::print("{:<10} note: {}\n", "", flag);
      } else {
        fmt::print("{:<10} refused: {}\n", name, row.refusal);
      }
    }
  }
}

}  // namespace moelab::cli

namespace moelab::cli {

void PrintFrontier(const analysis::FrontierReport& f, const std::string& by) {
  if (f.estimand != analysis::Estimand::kFrontier) return;
  std::vector<std::string> targets;
  for (double x : f.frontier.targets) targets.push_back(fmt::format("{:.4f}", x));
  fmt::print(
      "\nFrontier composition: model sizes {}; per ({}, seed) the sizes on its envelope (compute "
      "order) and the compute-optimal size at each L* ({})\n",
      fmt::join(f.sizes, " | "), by, fmt::join(targets, ", "));
  std::vector<analysis::EnvelopeUse> envelopes = f.envelopes;
  std::stable_sort(envelopes.begin(), envelopes.end(), [](const auto& a, const auto& b) {
    if (a.family != b.family) return analysis::FamilyLess(a.family, b.family);
    return analysis::FamilyLess(a.seed, b.seed);
  });
  for (const auto& e : envelopes) {
    std::vector<std::string> at;
    for (const auto& s : e.size_at_target) at.push_back(s.empty() ? "-" : s);
    fmt::print("  {}={} seed {}: {} point(s) on {}; at L*: {}\n", by, e.family, e.seed, e.points,
               fmt::join(e.sizes, " | "), fmt::join(at, " ; "));
  }
  for (const auto& n : f.notes) fmt::print("  note: {}\n", n);
  fmt::print(
      "\nContrast, not the report's estimand: the same reading at each model size alone "
      "(a training curve per family), at the frontier's targets\n");
  for (const auto& s : f.fixed_size) {
    if (s.table) {
      PrintModelFree(*s.table, by, "at " + s.size);
    } else {
      fmt::print("\nfixed size (training curve) at {}: unavailable: {}\n", s.size, s.error);
    }
  }
}

}  // namespace moelab::cli
