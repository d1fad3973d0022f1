// RunFit: the fit-form dispatch `moelab fit` and the GUI share (see run_fit.h).
#include "analysis/run_fit.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>

#include "analysis/compute_optimal.h"
#include "analysis/family_design.h"

namespace moelab::analysis {

namespace {

using nlohmann::json;

// Why the power form has no model-free estimate; never empty.
std::string NoModelFreeReason(const PowerFormResult& r, const std::string& key) {
  if (!r.model_free_error.empty()) return r.model_free_error;
  if (r.families.size() < 2)
    return fmt::format(
        "one family ({}={}): it compares each family with the reference seed by seed, and "
        "there is no other family",
        key, r.reference);
  return "no family besides the reference has points";
}

PowerFormResult FitPowerForm(const RunFitOptions& o, const ObservationSet& obs,
                             const FitOptions& fo) {
  PowerFormResult r;
  // The model-free table comes first and needs no law: when no family's law can be fitted (too
  // few runs for the bootstrap, say), the table is still computed and the law's failure said.
  try {
    r.fits = FitFamilies(obs.points, fo);
  } catch (const AnalysisError& e) {
    r.law_error = e.what();
  }
  for (const auto& f : r.fits.families) r.families.push_back(f.family);
  std::sort(r.families.begin(), r.families.end(), FamilyLess);
  if (!r.law_error.empty()) {
    std::set<std::string> names;
    for (const auto& p : obs.points) names.insert(p.family);
    std::vector<std::string> all(names.begin(), names.end());
    std::sort(all.begin(), all.end(), FamilyLess);
    if (all.empty()) throw AnalysisError(r.law_error);
    r.reference = o.reference.empty() ? all.back() : o.reference;
  } else {
    r.reference = o.reference.empty() ? r.families.back() : o.reference;
  }

  // The primary reading: FLOPs/tokens to target losses, interpolated per seed.
  try {
    r.model_free =
        ModelFreeMultipliers(obs.points, r.reference, o.target_losses, ModelFreeOptionsOf(fo));
  } catch (const AnalysisError& e) {
    r.model_free_error = e.what();
  }
  const bool model_free = r.model_free && !r.model_free->rows.empty();
  if (!r.law_error.empty() && !model_free) {
    // No law and no model-free table: nothing to report (the law's reasons name each family).
    throw AnalysisError(r.law_error +
                        "\n  and no model-free estimate: " + NoModelFreeReason(r, o.family_key));
  }
  r.target_loss = o.target_losses.empty() ? NAN : o.target_losses[o.target_losses.size() / 2];
  if (std::isnan(r.target_loss)) {
    if (r.model_free) {
      r.target_loss = r.model_free->targets[r.model_free->targets.size() / 2];
    } else {
      // The middle of the loss range every family's frontier covers.
      double lo = -INFINITY, hi = INFINITY;
      for (const auto& f : r.fits.families)
        lo = std::max(lo, f.min_loss), hi = std::min(hi, f.max_loss);
      r.target_loss = lo < hi ? 0.5 * (lo + hi) : r.fits.Get(r.reference).min_loss;
    }
  }
  if (r.law_error.empty()) {
    MultiplierOptions mo;
    mo.level = fo.level;
    mo.allow_e_at_bound = o.allow_e_at_bound;
    r.multipliers = ComputeMultiplierTable(r.fits, r.reference, r.target_loss, mo);
  }
  r.verdict_basis =
      model_free
          ? "model-free (FLOPs/tokens to L* interpolated on each seed's points)"
          : "fitted law (no model-free estimate: " + NoModelFreeReason(r, o.family_key) + ")";
  // One model size per family (a WSD sweep of one shape) gives a training curve, not a
  // compute-optimal frontier.
  std::map<std::string, std::set<double>> sizes;
  for (const auto& p : obs.points) sizes[p.family].insert(p.params);
  r.single_size = true;
  for (const auto& [f, s] : sizes) r.single_size = r.single_size && s.size() == 1;
  return r;
}

}  // namespace

ObservationSet SelectRuns(const ObservationSet& in,
                          const std::vector<std::pair<std::string, std::string>>& where) {
  if (where.empty()) return in;
  ObservationSet out = in;
  out.points.clear();
  std::set<std::string> kept;
  for (const Observation& p : in.points) {
    const auto vars = in.run_vars.find(p.run);
    const bool match = std::all_of(where.begin(), where.end(), [&](const auto& kv) {
      if (vars == in.run_vars.end()) return false;
      const auto v = vars->second.find(kv.first);
      return v != vars->second.end() &&
             (v->second == kv.second || v->second == '"' + kv.second + '"');
    });
    if (!match) continue;
    out.points.push_back(p);
    kept.insert(p.run);
  }
  for (auto it = out.run_vars.begin(); it != out.run_vars.end();)
    it = kept.count(it->first) ? std::next(it) : out.run_vars.erase(it);
  out.runs_used = static_cast<int>(kept.size());
  if (out.points.empty()) {
    std::string w;
    for (const auto& [k, v] : where) w += fmt::format("{}{}={}", w.empty() ? "" : ", ", k, v);
    throw AnalysisError(fmt::format("no run matches --where {} (of {} runs)", w, in.runs_used));
  }
  return out;
}

bool FamilyLess(const std::string& a, const std::string& b) {
  char* ea = nullptr;
  char* eb = nullptr;
  const double va = std::strtod(a.c_str(), &ea), vb = std::strtod(b.c_str(), &eb);
  if (*ea == '\0' && *eb == '\0' && !a.empty() && !b.empty()) return va < vb;
  return a < b;
}

FitResult RunFit(const RunFitOptions& o, const ObservationSet& obs) {
  const auto& forms = FitForms();
  if (std::find(forms.begin(), forms.end(), o.form) == forms.end())
    throw AnalysisError(
        fmt::format("unknown fit form '{}' (forms: {})", o.form, fmt::join(forms, ", ")));
  if (o.form == "heads" && (o.base.empty() || o.treatment.empty()))
    throw AnalysisError("--form heads needs --base and --treatment family values");
  RequireUnmixedFamilies(DesignRunsOf(obs.points, obs.run_vars), o.family_key, o.pool,
                         "moelab fit");
  FitResult r;
  r.form = o.form;
  r.family_key = o.family_key;
  r.options = o.fit;
  r.options.final_only = o.final_only || (obs.wsd_runs > 0 && !o.all_points);
  r.options.skip_failed_families = true;
  r.final_only_auto = r.options.final_only && !o.final_only;
  const FitOptions& fo = r.options;
  if (o.form == "power") {
    r.power = FitPowerForm(o, obs, fo);
  } else if (o.form == "joint") {
    JointOptions jo;
    jo.fit = fo;
    r.joint = FitJointSparsity(obs.points, obs.sparsity, jo);
  } else if (o.form == "chinchilla") {
    r.chinchilla = FitComputeOptimal(obs.points, fo, o.budgets);
  } else if (o.form == "heads") {
    r.heads = CompareHeads(obs.points, o.base, o.treatment, fo);
  } else {
    r.isoflop = CheckIsoFlop(obs.points);
  }
  return r;
}

void to_json(json& j, const FitResult& v) {
  if (v.power) {
    j = {{"fits", v.power->fits},
         {"multipliers", v.power->multipliers},
         {"verdict_basis", v.power->verdict_basis}};
    if (v.power->model_free) j["model_free"] = *v.power->model_free;
  } else if (v.joint) {
    j = *v.joint;
  } else if (v.chinchilla) {
    j = *v.chinchilla;
  } else if (v.heads) {
    j = *v.heads;
  } else if (v.isoflop) {
    j = *v.isoflop;
  } else {
    j = json::object();
  }
}

}  // namespace moelab::analysis
