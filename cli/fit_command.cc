// `moelab fit`: scaling-law fits with bootstrap intervals over a sweep's runs, stored in the
// database's fits table.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "analysis/ablation.h"
#include "analysis/compute_optimal.h"
#include "analysis/export.h"
#include "analysis/model_free.h"
#include "analysis/observations.h"
#include "analysis/scaling.h"
#include "analysis/sparsity_slope.h"
#include "cli/commands.h"
#include "core/train/trainer.h"
#include "db/fits.h"

namespace moelab::cli {

namespace {

using analysis::Estimate;
using nlohmann::json;

std::string Interval(const Estimate& e, const char* spec = "{:.4g}") {
  if (std::isnan(e.lo) && std::isnan(e.hi)) {
    return fmt::format(fmt::runtime(spec), e.estimate) + " (no interval)";
  }
  return fmt::format("{} [{}, {}]", fmt::format(fmt::runtime(spec), e.estimate),
                     fmt::format(fmt::runtime(spec), e.lo), fmt::format(fmt::runtime(spec), e.hi));
}

const analysis::ParamEstimate* Param(const std::vector<analysis::ParamEstimate>& ps,
                                     const std::string& name) {
  for (const auto& p : ps)
    if (p.name == name) return &p;
  return nullptr;
}

// Numeric families sort by value, others by name.
bool FamilyLess(const std::string& a, const std::string& b) {
  char* ea = nullptr;
  char* eb = nullptr;
  const double va = std::strtod(a.c_str(), &ea), vb = std::strtod(b.c_str(), &eb);
  if (*ea == '\0' && *eb == '\0' && !a.empty() && !b.empty()) return va < vb;
  return a < b;
}

void PrintWarnings(const std::vector<std::string>& warnings) {
  for (const auto& w : warnings) fmt::print("  warning: {}\n", w);
}

// "1.133 [1.05, 1.21]", or the point with why there is no interval.
std::string RatioText(const Estimate& e, const std::string& note) {
  if (!note.empty()) return fmt::format("{:.3f} (no interval)", e.estimate);
  return Interval(e, "{:.3f}");
}

void PrintModelFree(const analysis::ModelFreeTable& t, const std::string& by) {
  fmt::print(
      "\nModel-free (primary): FLOPs and tokens to reach L*, log-log interpolated on each "
      "seed's points; ratio to {} = {} (geometric mean over seeds, paired by seed); interval: "
      "t on the mean log ratio (df = seeds - 1); p: exact sign-flip over seeds\n",
      by, t.reference);
  fmt::print("loss range every (family, seed) covers: [{:.4f}, {:.4f}]\n", t.range_lo, t.range_hi);
  fmt::print("{:<8} {:<10} {:>5}  {:<26} {:>7}  {:<30} {:<26} {}\n", "L*", by, "seeds",
             "FLOPs ratio (t)", "p", "bootstrap", "tokens ratio (t)", "per seed (FLOPs ratio)");
  std::set<std::string> notes;
  std::vector<analysis::ModelFreeRow> rows = t.rows;
  std::stable_sort(rows.begin(), rows.end(), [](const auto& x, const auto& y) {
    if (x.target_loss != y.target_loss) return x.target_loss < y.target_loss;
    return FamilyLess(x.family, y.family);
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

}  // namespace

void AddFitCommand(CLI::App& app) {
  struct Args {
    std::string db = "moelab.db", sweep, by = "sparsity", form = "power", reference, base,
                treatment;
    std::vector<std::string> inputs;
    std::vector<double> target_losses;
    double level = 0.90;
    int resamples = 1000, threads = 2;
    uint64_t seed = 12345;
    bool json = false, no_store = false, final_only = false, all_points = false,
         allow_e_at_bound = false;
    double max_failed_fraction = 0.10;
    int min_seeds = 3;
    std::string budgets;  // chinchilla form: N_opt/D_opt at these FLOPs
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "fit", "Fit scaling laws with bootstrap intervals over a sweep's runs (stored in fits)");
  cmd->add_option("--db", a->db, "Database file")->capture_default_str();
  cmd->add_option("--sweep", a->sweep, "Sweep name (default: every run in the database)");
  cmd->add_option("--inputs", a->inputs,
                  "Fit the runs of `moelab db export` JSON files instead of a database (not "
                  "stored); several files (e.g. one per seed) are fitted together")
      ->check(CLI::ExistingFile);
  cmd->add_option("--by", a->by, "Family key: a sweep variable or a config path")
      ->capture_default_str();
  cmd->add_option("--form", a->form, "power | joint | chinchilla | heads | isoflop")
      ->check(CLI::IsMember({"power", "joint", "chinchilla", "heads", "isoflop"}))
      ->capture_default_str();
  cmd->add_option("--target-loss", a->target_losses,
                  "L* for the FLOPs multipliers; repeat for several (default: 3 losses inside "
                  "the range every (family, seed) covers; the fitted law uses the middle one)");
  cmd->add_option("--reference", a->reference,
                  "Reference family of the multipliers (default: the largest value)");
  cmd->add_option("--base", a->base, "heads form: the base family (e.g. 1)");
  cmd->add_option("--treatment", a->treatment, "heads form: the treatment family (e.g. 2)");
  cmd->add_option("--resamples", a->resamples, "Bootstrap resamples over runs")
      ->capture_default_str();
  cmd->add_option("--seed", a->seed, "Bootstrap seed")->capture_default_str();
  cmd->add_option("--level", a->level, "Interval level")->capture_default_str();
  cmd->add_option("--threads", a->threads, "Threads for the bootstrap")->capture_default_str();
  cmd->add_flag("--final-only", a->final_only,
                "Frontier from each run's last evaluation only (the default for WSD runs)");
  cmd->add_flag("--all-points", a->all_points,
                "WSD runs: use every evaluation, pre-decay points included (biases alpha and "
                "C(L*): the stable-phase points are not at the end of their schedule)");
  cmd->add_option("--max-failed-fraction", a->max_failed_fraction,
                  "Refuse a fit when more than this fraction of bootstrap resamples fail")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_option("--min-seeds", a->min_seeds,
                  "Fewest seeds (trunks with their branches) for an interval; below it the "
                  "point estimate is printed with \"n seeds: too few for an interval\"")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_flag("--allow-e-at-bound", a->allow_e_at_bound,
                "Report fitted multipliers even when a family's E sits on its bound or its form "
                "is rejected (flagged; the model-free estimate stays the primary reading)");
  cmd->add_option(
      "--budgets", a->budgets,
      "chinchilla form: FLOPs budgets for N_opt/D_opt, comma-separated (e.g. 1e15,1e16)");
  cmd->add_flag("--json", a->json, "JSON output");
  cmd->add_flag("--no-store", a->no_store, "Do not store the result in the fits table");
  cmd->callback([a]() {
    std::optional<int64_t> sweep_id;
    if (a->inputs.empty() && !a->sweep.empty()) {
      const auto sweep = db::FindSweep(a->db, a->sweep);
      if (!sweep) {
        std::string names;
        for (const auto& s : db::ListSweeps(a->db)) names += (names.empty() ? "" : ", ") + s.name;
        throw std::runtime_error(fmt::format("no sweep '{}' in {} (sweeps: {})", a->sweep, a->db,
                                             names.empty() ? "none" : names));
      }
      sweep_id = sweep->id;
    }
    analysis::ObservationSet obs;
    if (!a->inputs.empty()) {
      for (size_t k = 0; k < a->inputs.size(); ++k) {
        std::ifstream in(a->inputs[k]);
        const nlohmann::json e = nlohmann::json::parse(in, nullptr, false);
        if (e.is_discarded()) throw std::runtime_error(a->inputs[k] + ": not valid JSON");
        analysis::ObservationSet part = analysis::ObservationsFromExport(e, a->by);
        // Run ids are per database: exports of different databases could share them.
        for (auto& p : part.points) {
          if (a->inputs.size() > 1) p.run = fmt::format("{}:{}", k + 1, p.run);
        }
        obs.points.insert(obs.points.end(), part.points.begin(), part.points.end());
        obs.skipped.insert(obs.skipped.end(), part.skipped.begin(), part.skipped.end());
        obs.runs_used += part.runs_used;
        obs.wsd_runs += part.wsd_runs;
        for (const auto& [f, sp] : part.sparsity) obs.sparsity[f] = sp;
        if (a->sweep.empty() && e["sweep"].is_string()) a->sweep = e["sweep"].get<std::string>();
      }
      a->no_store = true;
    } else {
      obs = analysis::LoadObservations(a->db, sweep_id, a->by);
    }
    if (obs.points.empty()) {
      std::string why;
      for (const auto& s : obs.skipped) why += "\n  " + s;
      throw std::runtime_error(fmt::format(
          "no finished run with evaluations and a value for '{}'{} (choose the family key with "
          "--by){}",
          a->by, a->sweep.empty() ? "" : " in sweep " + a->sweep, why));
    }
    analysis::FitOptions fo;
    fo.bootstrap_resamples = a->resamples;
    fo.seed = a->seed;
    fo.level = a->level;
    fo.threads = a->threads;
    fo.final_only = a->final_only || (obs.wsd_runs > 0 && !a->all_points);
    fo.skip_failed_families = true;
    fo.max_failed_fraction = a->max_failed_fraction;
    fo.min_units = a->min_seeds;

    json result;
    if (!a->json) {
      fmt::print(
          "{} runs, {} evaluation points, families by '{}'{}{}; bootstrap {} resamples "
          "over seeds (a seed's trunk with its branches is one replicate; seed {}), {:.0f}% "
          "intervals\n",
          obs.runs_used, obs.points.size(), a->by, a->sweep.empty() ? "" : " in sweep " + a->sweep,
          a->inputs.empty() ? "" : fmt::format(" (from {})", fmt::join(a->inputs, ", ")),
          a->resamples, a->seed, 100 * a->level);
      for (const auto& s : obs.skipped) fmt::print("  skipped {}\n", s);
      if (fo.final_only && !a->final_only) {
        fmt::print(
            "{} WSD run(s): final (post-decay) points only (--all-points to use every "
            "evaluation)\n",
            obs.wsd_runs);
      }
    }

    if (a->form == "power") {
      const analysis::FamilyFits fits = analysis::FitFamilies(obs.points, fo);
      std::vector<std::string> names;
      for (const auto& f : fits.families) names.push_back(f.family);
      std::sort(names.begin(), names.end(), FamilyLess);
      const std::string reference = a->reference.empty() ? names.back() : a->reference;

      // The primary reading: FLOPs/tokens to target losses, interpolated per seed.
      analysis::ModelFreeOptions mfo;
      mfo.resamples = a->resamples;
      mfo.seed = a->seed;
      mfo.level = a->level;
      mfo.min_seeds = a->min_seeds;
      mfo.final_only = fo.final_only;
      std::optional<analysis::ModelFreeTable> model_free;
      std::string model_free_error;
      try {
        model_free = analysis::ModelFreeMultipliers(obs.points, reference, a->target_losses, mfo);
      } catch (const analysis::AnalysisError& e) {
        model_free_error = e.what();
      }
      double target =
          a->target_losses.empty() ? NAN : a->target_losses[a->target_losses.size() / 2];
      if (std::isnan(target)) {
        if (model_free) {
          target = model_free->targets[model_free->targets.size() / 2];
        } else {
          // The middle of the loss range every family's frontier covers.
          double lo = -INFINITY, hi = INFINITY;
          for (const auto& f : fits.families)
            lo = std::max(lo, f.min_loss), hi = std::min(hi, f.max_loss);
          target = lo < hi ? 0.5 * (lo + hi) : fits.Get(reference).min_loss;
        }
      }
      analysis::MultiplierOptions mo;
      mo.level = a->level;
      mo.allow_e_at_bound = a->allow_e_at_bound;
      const analysis::MultiplierTable table =
          analysis::ComputeMultiplierTable(fits, reference, target, mo);
      const std::string basis =
          model_free && !model_free->rows.empty()
              ? "model-free (FLOPs/tokens to L* interpolated on each seed's points)"
              : "fitted law (no model-free estimate: " + model_free_error + ")";
      result = {{"fits", fits}, {"multipliers", table}, {"verdict_basis", basis}};
      if (model_free) result["model_free"] = *model_free;
      if (!a->json) {
        if (model_free) {
          PrintModelFree(*model_free, a->by);
          fmt::print("{}", analysis::SparsitySlopeReport(*model_free, obs.points, obs.sparsity,
                                                         a->level, a->min_seeds));
        } else
          fmt::print("\nmodel-free estimate unavailable: {}\n", model_free_error);
        // One model size per family (a WSD sweep of one shape) gives a training curve, not a
        // compute-optimal frontier: say which one was fitted.
        std::map<std::string, std::set<double>> sizes;
        for (const auto& p : obs.points) sizes[p.family].insert(p.params);
        bool single_size = true;
        for (const auto& [f, s] : sizes) single_size = single_size && s.size() == 1;
        fmt::print(
            "\nFitted law (secondary, smoothed): L(C) = E + A·(C/1e15)^(-alpha) on each "
            "family's {}\n",
            single_size ? "loss-compute curve (one model size per family: a training "
                          "curve, not a compute-optimal frontier)"
                        : "compute frontier (lower envelope over its model sizes)");
        fmt::print("{:<10} {:>5} {:>6}  {:<26} {:<26} {:<26} {:>9} {:>6}\n", a->by, "seeds",
                   "points", "E", "A", "alpha", "rmse(log)", "start");
        for (const std::string& name : names) {
          const auto& f = fits.Get(name);
          fmt::print(
              "{:<10} {:>5} {:>6}  {:<26} {:<26} {:<26} {:>9.4f} {:>6}{}\n", name, f.n_units,
              f.diagnostics.n_points, Interval(Param(f.params, "E")->value),
              Interval(Param(f.params, "A")->value), Interval(Param(f.params, "alpha")->value),
              f.diagnostics.rmse_log, f.diagnostics.winning_start,
              f.diagnostics.params_at_bound.empty()
                  ? ""
                  : fmt::format("  at bound: {}", fmt::join(f.diagnostics.params_at_bound, ",")));
        }
        fmt::print("misfit (runs test on residual signs by budget; unconstrained E):\n");
        for (const std::string& name : names) {
          const auto& m = fits.Get(name).misfit;
          fmt::print("{:<10} {} +/{} - in {} runs, p = {:.3f}; unconstrained E = {:.3g}: {}\n",
                     name, m.positives, m.negatives, m.runs, m.runs_p, m.unconstrained_E,
                     m.rejected ? "REJECTED (" + m.reason + ")" : "not rejected");
        }
        const std::string& note = fits.Get(reference).interval_note;
        if (!note.empty()) fmt::print("intervals: {}\n", note);
        fmt::print("\nFitted FLOPs multiplier C_family(L*) / C_{}(L*) at L* = {:.4f} ({} = {})\n",
                   reference, target, a->by, reference);
        fmt::print("{:<10} {:<30} {:<34}\n", a->by, "multiplier", "FLOPs to reach L*");
        for (const std::string& name : names) {
          for (const auto& row : table.rows) {
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
        fmt::print("\nverdict rests on: {}\n", basis);
        PrintWarnings(fits.warnings);
      }
    } else if (a->form == "joint") {
      analysis::JointOptions jo;
      jo.fit = fo;
      const analysis::JointSparsityFit fit =
          analysis::FitJointSparsity(obs.points, obs.sparsity, jo);
      result = fit;
      if (!a->json) {
        for (const auto& form : fit.forms) {
          fmt::print("\n{}: {}\n  held-out RMSE(log) {:.4f} on {} points ({})\n", form.form,
                     form.formula, form.holdout_rmse_log, form.holdout_points, fit.holdout_rule);
          for (const auto& p : form.params)
            fmt::print("  {:<8} {}{}\n", p.name, Interval(p.value),
                       p.at_bound ? "  (at bound)" : "");
        }
        fmt::print("\nbetter on held-out points: {}\n", fit.better_form);
        PrintWarnings(fit.warnings);
      }
    } else if (a->form == "chinchilla") {
      const std::vector<double> budgets =
          a->budgets.empty() ? std::vector<double>{} : analysis::ParseBudgets(a->budgets);
      const analysis::ChinchillaFit fit = analysis::FitComputeOptimal(obs.points, fo, budgets);
      result = fit;
      if (!a->json) {
        fmt::print("\nL(N, D) = E + A/N^alpha + B/D^beta\n");
        for (const auto& p : fit.params) fmt::print("  {:<8} {}\n", p.name, Interval(p.value));
        fmt::print("  N_opt ∝ C^{}   D_opt ∝ C^{}\n", Interval(fit.exponent_n, "{:.3f}"),
                   Interval(fit.exponent_d, "{:.3f}"));
        if (!fit.optimal.empty())
          fmt::print("  compute-optimal under C = {:.3g}·N·D (k measured from the runs' FLOPs)\n",
                     fit.flops_per_param_token);
        for (const auto& o : fit.optimal)
          fmt::print("  C = {:.3g}: N_opt {}  D_opt {}  L {}\n", o.flops,
                     Interval(o.params, "{:.3g}"), Interval(o.tokens, "{:.3g}"),
                     Interval(o.loss, "{:.4f}"));
        PrintWarnings(fit.warnings);
      }
    } else if (a->form == "heads") {
      if (a->base.empty() || a->treatment.empty())
        throw std::runtime_error("--form heads needs --base and --treatment family values");
      const analysis::HeadsAblation h =
          analysis::CompareHeads(obs.points, a->base, a->treatment, fo);
      result = h;
      if (!a->json) {
        fmt::print("\nrelative loss difference ({} {} vs {}), (L_t - L_b)/L_b\n", a->by,
                   a->treatment, a->base);
        for (const auto& b : h.budgets)
          fmt::print("  tokens {:.3g}: equal tokens {}  equal FLOPs {}{}\n", b.tokens,
                     Interval(b.delta_equal_tokens, "{:+.4f}"),
                     Interval(b.delta_equal_flops, "{:+.4f}"),
                     b.replicated ? "" : "  (one run per arm)");
        fmt::print("  mean: equal tokens {}  equal FLOPs {}\n",
                   Interval(h.mean_delta_equal_tokens, "{:+.4f}"),
                   Interval(h.mean_delta_equal_flops, "{:+.4f}"));
        PrintWarnings(h.warnings);
      }
    } else {
      const analysis::IsoFlopReport r = analysis::CheckIsoFlop(obs.points);
      result = r;
      if (!a->json) {
        fmt::print("\nIsoFLOP check: {}\n", r.pitfall ? "PITFALL" : "no pitfall found");
        for (const auto& issue : r.issues) fmt::print("  {}\n", issue);
      }
    }

    if (!a->no_store) {
      db::FitRecord rec;
      rec.sweep_id = sweep_id;
      rec.family_key = a->by;
      rec.form = a->form;
      rec.options_json = json(fo).dump();
      json inputs = json::array();
      for (const auto& p : obs.points)
        inputs.push_back({{"run", p.run},
                          {"family", p.family},
                          {"flops", p.flops},
                          {"tokens", p.tokens},
                          {"params", p.params},
                          {"loss", p.loss},
                          {"seed", p.seed},
                          {"unit", p.unit}});
      rec.inputs_json = inputs.dump();
      rec.result_json = result.dump();
      rec.bootstrap_seed = a->seed;
      const int64_t id = db::SaveFit(a->db, rec);
      if (!a->json) fmt::print("\nstored as fit {} in {}\n", id, a->db);
    }
    if (a->json) fmt::print("{}\n", result.dump(2));
  });
}

}  // namespace moelab::cli
