// `moelab fit`: scaling-law fits with bootstrap intervals over a sweep's runs, stored in the
// database's fits table.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "analysis/compute_optimal.h"
#include "analysis/export.h"
#include "analysis/frontier.h"
#include "analysis/observations.h"
#include "analysis/run_fit.h"
#include "analysis/sparsity_slope.h"
#include "cli/commands.h"
#include "cli/fit_report.h"
#include "core/train/trainer.h"
#include "db/fits.h"

namespace moelab::cli {

namespace {

using nlohmann::json;

struct FitArgs {
  std::string db = "moelab.db", sweep;
  std::vector<std::string> inputs, where;
  bool json = false, no_store = false;
  std::string budgets;  // chinchilla form: N_opt/D_opt at these FLOPs (run.budgets, parsed)
  // What RunFit takes, filled by the flags themselves (--by is run.family_key, --min-seeds
  // run.fit.min_units, ...), so there is no second copy of the options to keep in step.
  analysis::RunFitOptions run = [] {
    analysis::RunFitOptions o;
    o.fit.threads = 2;
    return o;
  }();
};

// The observations of --inputs (several exports fitted together) or of the database.
analysis::ObservationSet LoadFitObservations(FitArgs* a, std::optional<int64_t> sweep_id) {
  if (a->inputs.empty()) return analysis::LoadObservations(a->db, sweep_id, a->run.family_key);
  analysis::ObservationSet obs;
  for (size_t k = 0; k < a->inputs.size(); ++k) {
    std::ifstream in(a->inputs[k]);
    const nlohmann::json e = nlohmann::json::parse(in, nullptr, false);
    if (e.is_discarded()) throw std::runtime_error(a->inputs[k] + ": not valid JSON");
    analysis::ObservationSet part = analysis::ObservationsFromExport(e, a->run.family_key);
    // Run ids are per database: exports of different databases could share them.
    const auto id = [&](const std::string& run) {
      return a->inputs.size() > 1 ? fmt::format("{}:{}", k + 1, run) : run;
    };
    for (auto& p : part.points) p.run = id(p.run);
    for (auto& [run, vars] : part.run_vars) obs.run_vars[id(run)] = vars;
    obs.points.insert(obs.points.end(), part.points.begin(), part.points.end());
    obs.skipped.insert(obs.skipped.end(), part.skipped.begin(), part.skipped.end());
    obs.runs_used += part.runs_used;
    obs.wsd_runs += part.wsd_runs;
    for (const auto& [f, sp] : part.sparsity) obs.sparsity[f] = sp;
    if (a->sweep.empty() && e["sweep"].is_string()) a->sweep = e["sweep"].get<std::string>();
  }
  a->no_store = true;
  return obs;
}

analysis::RunFitOptions ToRunFitOptions(const FitArgs& a) {
  analysis::RunFitOptions o = a.run;
  if (!a.budgets.empty()) o.budgets = analysis::ParseBudgets(a.budgets);
  return o;
}

std::vector<std::pair<std::string, std::string>> ParseWhere(const std::vector<std::string>& w) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string& kv : w) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      throw std::runtime_error(fmt::format("--where {}: expected KEY=VALUE", kv));
    out.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return out;
}

void PrintHeader(const FitArgs& a, const analysis::ObservationSet& obs,
                 const analysis::FitResult& r) {
  fmt::print(
      "{} runs, {} evaluation points, families by '{}'{}{}; bootstrap {} resamples "
      "over seeds (a seed's trunk with its branches is one replicate; seed {}), {:.0f}% "
      "intervals\n",
      obs.runs_used, obs.points.size(), a.run.family_key,
      a.sweep.empty() ? "" : " in sweep " + a.sweep,
      a.inputs.empty() ? "" : fmt::format(" (from {})", fmt::join(a.inputs, ", ")),
      a.run.fit.bootstrap_resamples, a.run.fit.seed, 100 * a.run.fit.level);
  if (!a.where.empty()) fmt::print("  only runs with {}\n", fmt::join(a.where, ", "));
  if (!a.run.pool.empty()) fmt::print("  pooled on purpose: {}\n", fmt::join(a.run.pool, ", "));
  for (const auto& s : obs.skipped) fmt::print("  skipped {}\n", s);
  if (r.final_only_auto) {
    fmt::print(
        "{} WSD run(s): final (post-decay) points only (--all-points to use every "
        "evaluation)\n",
        obs.wsd_runs);
  }
}

void StoreFit(const FitArgs& a, std::optional<int64_t> sweep_id,
              const analysis::ObservationSet& obs, const analysis::FitResult& r) {
  db::FitRecord rec;
  rec.sweep_id = sweep_id;
  rec.family_key = a.run.family_key;
  rec.form = a.run.form;
  json options = r.options;
  if (!a.run.pool.empty()) options["pool"] = a.run.pool;
  if (!a.where.empty()) options["where"] = a.where;
  rec.options_json = options.dump();
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
  rec.result_json = json(r).dump();
  rec.bootstrap_seed = a.run.fit.seed;
  const int64_t id = db::SaveFit(a.db, rec);
  if (!a.json) fmt::print("\nstored as fit {} in {}\n", id, a.db);
}

void RunFitCommand(FitArgs* a) {
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
  analysis::ObservationSet obs = LoadFitObservations(a, sweep_id);
  if (obs.points.empty()) {
    std::string why;
    for (const auto& s : obs.skipped) why += "\n  " + s;
    throw std::runtime_error(fmt::format(
        "no finished run with evaluations and a value for '{}'{} (choose the family key with "
        "--by){}",
        a->run.family_key, a->sweep.empty() ? "" : " in sweep " + a->sweep, why));
  }
  obs = analysis::SelectRuns(obs, ParseWhere(a->where));
  const analysis::FitResult result = analysis::RunFit(ToRunFitOptions(*a), obs);
  // Families with several model sizes: which sizes make each envelope, and each size alone
  // (a training curve) as the contrast.
  std::optional<analysis::FrontierReport> frontier;
  std::string frontier_error;
  if (result.power && result.power->model_free &&
      analysis::EstimandOf(obs.points) == analysis::Estimand::kFrontier) {
    try {
      frontier = analysis::AnalyzeFrontier(obs.points, obs.run_vars, result.power->reference,
                                           result.power->model_free->targets,
                                           analysis::ModelFreeOptionsOf(result.options));
    } catch (const analysis::AnalysisError& e) {
      frontier_error = e.what();
    }
  }
  if (!a->json) {
    PrintHeader(*a, obs, result);
    std::string slope;
    if (result.power && result.power->model_free)
      slope = analysis::SparsitySlopeReport(*result.power->model_free, obs.points, obs.sparsity,
                                            a->run.fit.level, a->run.fit.min_units);
    if (!frontier_error.empty())
      fmt::print("  frontier composition unavailable: {}\n", frontier_error);
    PrintFitResult(result, a->run.family_key, slope, frontier ? &*frontier : nullptr);
  }
  if (!a->no_store) StoreFit(*a, sweep_id, obs, result);
  if (a->json) {
    json j = result;
    if (frontier) j["frontier"] = *frontier;  // printed, not stored: derived from the inputs
    fmt::print("{}\n", j.dump(2));
  }
}

}  // namespace

void AddFitCommand(CLI::App& app) {
  auto a = std::make_shared<FitArgs>();
  CLI::App* cmd = app.add_subcommand(
      "fit", "Fit scaling laws with bootstrap intervals over a sweep's runs (stored in fits)");
  cmd->add_option("--db", a->db, "Database file")->capture_default_str();
  cmd->add_option("--sweep", a->sweep, "Sweep name (default: every run in the database)");
  cmd->add_option("--inputs", a->inputs,
                  "Fit the runs of `moelab db export` JSON files instead of a database (not "
                  "stored); several files (e.g. one per seed) are fitted together")
      ->check(CLI::ExistingFile);
  cmd->add_option("--by", a->run.family_key, "Family key: a sweep variable or a config path")
      ->capture_default_str();
  cmd->add_option("--form", a->run.form, fmt::format("{}", fmt::join(analysis::FitForms(), " | ")))
      ->check(CLI::IsMember(analysis::FitForms()))
      ->capture_default_str();
  cmd->add_option("--pool", a->run.pool,
                  "Let a family pool runs that differ in this other swept key (repeat for "
                  "several); without it such a family is refused")
      ->delimiter(',');
  cmd->add_option("--where", a->where,
                  "KEY=VALUE: fit only the runs whose sweep variable KEY has VALUE (repeat for "
                  "several), e.g. one arm of another swept key");
  cmd->add_option("--target-loss", a->run.target_losses,
                  "L* for the FLOPs multipliers; repeat for several (default: 3 losses inside "
                  "the range every (family, seed) covers; the fitted law uses the middle one)");
  cmd->add_option("--reference", a->run.reference,
                  "Reference family of the multipliers (default: the largest value)");
  cmd->add_option("--base", a->run.base, "heads form: the base family (e.g. 1)");
  cmd->add_option("--treatment", a->run.treatment, "heads form: the treatment family (e.g. 2)");
  cmd->add_option("--resamples", a->run.fit.bootstrap_resamples, "Bootstrap resamples over runs")
      ->capture_default_str();
  cmd->add_option("--seed", a->run.fit.seed, "Bootstrap seed")->capture_default_str();
  cmd->add_option("--level", a->run.fit.level, "Interval level")->capture_default_str();
  cmd->add_option("--threads", a->run.fit.threads, "Threads for the bootstrap")
      ->capture_default_str();
  cmd->add_flag("--final-only", a->run.final_only,
                "Frontier from each run's last evaluation only (the default for WSD runs)");
  cmd->add_flag("--all-points", a->run.all_points,
                "WSD runs: use every evaluation, pre-decay points included (biases alpha and "
                "C(L*): the stable-phase points are not at the end of their schedule)");
  cmd->add_option("--max-failed-fraction", a->run.fit.max_failed_fraction,
                  "Refuse a fit when more than this fraction of bootstrap resamples fail")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_option("--min-seeds", a->run.fit.min_units,
                  "Fewest seeds (trunks with their branches) for an interval; below it the "
                  "point estimate is printed with \"n seeds: too few for an interval\"")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_flag("--allow-e-at-bound", a->run.allow_e_at_bound,
                "Report fitted multipliers even when a family's E sits on its bound or its form "
                "is rejected (flagged; the model-free estimate stays the primary reading)");
  cmd->add_option(
      "--budgets", a->budgets,
      "chinchilla form: FLOPs budgets for N_opt/D_opt, comma-separated (e.g. 1e15,1e16)");
  cmd->add_flag("--json", a->json, "JSON output");
  cmd->add_flag("--no-store", a->no_store, "Do not store the result in the fits table");
  cmd->callback([a]() { RunFitCommand(a.get()); });
}

}  // namespace moelab::cli
