#include "gui/fits.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "gui/view_model.h"

namespace moelab::gui {

analysis::RunFitOptions RunFitOptionsOf(const FitRequest& request) {
  analysis::RunFitOptions o;
  o.form = request.form;
  o.family_key = request.family_key;
  o.fit.bootstrap_resamples = request.resamples;
  o.fit.seed = request.seed;
  o.fit.level = request.level;
  o.fit.min_units = request.min_seeds;
  o.fit.max_failed_fraction = request.max_failed_fraction;
  o.fit.threads = 1;  // the GUI shares the machine with the runs it watches
  o.final_only = request.final_only.value_or(false);
  o.all_points = request.final_only.has_value() && !*request.final_only;
  o.reference = request.reference;
  o.target_losses = request.target_losses;
  o.base = request.heads_base;
  o.treatment = request.heads_treatment;
  o.budgets = request.budgets;
  return o;
}

namespace {

// The power form's laws, curves, bands and model-free table, as the view draws them.
void TakePowerForm(const analysis::PowerFormResult& power, FitResult* out) {
  out->fits = power.fits;
  for (const auto& f : power.fits.families) out->bands.push_back(CurveAndBand(f));
  out->model_free = power.model_free;
  out->model_free_error = power.model_free_error;
  out->law_error = power.law_error;
}

// The power form's heads ablation beside the laws (the heads form has it as its result).
void AddHeadsAblation(const FitRequest& request, FitResult* out) {
  if (request.heads_base.empty() || request.heads_treatment.empty() ||
      request.heads_base == request.heads_treatment)
    return;
  try {
    out->heads = analysis::CompareHeads(out->observations.points, request.heads_base,
                                        request.heads_treatment, out->options);
  } catch (const std::exception& e) {
    out->heads_error = e.what();
  }
}

}  // namespace

FitResult ComputeFits(const FitRequest& request) {
  const auto t0 = std::chrono::steady_clock::now();
  FitResult out;
  out.request = request;
  try {
    out.observations =
        analysis::LoadObservations(request.db_path, request.sweep_id, request.family_key);
    if (out.observations.points.empty()) {
      out.error = "no finished run with evaluations has a value for '" + request.family_key + "'";
    } else {
      analysis::RunFitOptions options = RunFitOptionsOf(request);
      // The reference chooser may still hold a family of the previous key: the default then.
      const bool known_reference = std::any_of(
          out.observations.points.begin(), out.observations.points.end(),
          [&](const analysis::Observation& p) { return p.family == options.reference; });
      if (!known_reference) options.reference.clear();
      out.form_result = analysis::RunFit(options, out.observations);
      out.options = out.form_result->options;
    }
  } catch (const std::exception& e) {
    out.error = e.what();
  }
  if (out.form_result && out.form_result->power) {
    TakePowerForm(*out.form_result->power, &out);
    AddHeadsAblation(request, &out);
  }
  if (out.form_result && out.form_result->heads) out.heads = out.form_result->heads;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

FitRequest RequestFromStored(const FitResult& stored, const std::string& db_path) {
  FitRequest r;
  r.db_path = db_path;
  r.sweep_id = stored.request.sweep_id;
  r.family_key = stored.request.family_key;
  const analysis::FitOptions& o = stored.options;
  r.resamples = o.bootstrap_resamples;
  r.seed = o.seed;
  r.level = o.level;
  r.min_seeds = o.min_units;
  r.max_failed_fraction = o.max_failed_fraction;
  if (stored.options_stored) r.final_only = o.final_only;
  if (stored.model_free) {
    r.reference = stored.model_free->reference;
    r.target_losses = stored.model_free->targets;
  } else if (stored.stored_multipliers) {
    r.reference = stored.stored_multipliers->reference;
  }
  return r;
}

namespace {

std::string Format(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

}  // namespace

std::string NoIntervalReason(const std::string& note) {
  const size_t colon = note.find(':');
  if (note.empty() || colon == std::string::npos) return "no interval";
  return note.substr(0, colon) + ": no interval";
}

std::string EstimateText(const analysis::Estimate& e, const std::string& note, const char* fmt) {
  if (!std::isfinite(e.estimate)) return "none (not estimated)";
  const std::string point = Format(fmt, e.estimate);
  if (!std::isfinite(e.lo) || !std::isfinite(e.hi)) {
    return point + " (" + NoIntervalReason(note) + ")";
  }
  return point + " [" + Format(fmt, e.lo) + ", " + Format(fmt, e.hi) + "]";
}

std::vector<std::string> OptionsText(const analysis::FitOptions& o) {
  std::vector<std::string> out;
  out.push_back(std::to_string(o.bootstrap_resamples) + " bootstrap resamples (seed " +
                std::to_string(o.seed) + ")");
  out.push_back(Format("%.0f%% intervals", 100 * o.level));
  out.push_back("an interval needs >= " + std::to_string(o.min_units) + " seeds");
  out.push_back(o.final_only ? "final (post-decay) points only"
                             : "every evaluation (pre-decay points included, --all-points)");
  out.push_back(Format("refused above %.0f%% failed resamples", 100 * o.max_failed_fraction));
  out.push_back("Huber delta " + FormatValue(o.huber_delta));
  return out;
}

FitBand CurveAndBand(const analysis::PowerLawFit& f) {
  FitBand band;
  band.family = f.family;
  const double a = std::log(f.min_flops / 3), b = std::log(f.max_flops * 3);
  const bool draws = !f.draws.empty();
  std::vector<double> samples;
  for (int i = 0; i <= 64; ++i) {
    const double c = std::exp(a + (b - a) * i / 64);
    band.flops.push_back(c);
    band.loss.push_back(f.LossAtCompute(c));
    if (!draws) continue;
    samples.clear();
    for (const auto& d : f.draws) {
      if (!std::isfinite(d[0])) continue;
      samples.push_back(d[0] + std::exp(d[1] - d[2] * std::log(c / f.flops_unit)));
    }
    if (samples.size() < 10) {
      band.lo.push_back(band.loss.back());
      band.hi.push_back(band.loss.back());
      continue;
    }
    std::sort(samples.begin(), samples.end());
    band.lo.push_back(samples[samples.size() * 5 / 100]);
    band.hi.push_back(samples[std::min(samples.size() - 1, samples.size() * 95 / 100)]);
  }
  return band;
}

namespace {

using nlohmann::json;

// A number, or NaN for null / missing / not a number (to_json writes NaN as null).
double Num(const json& j, const char* key) {
  if (!j.is_object()) return NAN;
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : NAN;
}

analysis::Estimate Est(const json& j) { return {Num(j, "estimate"), Num(j, "lo"), Num(j, "hi")}; }

std::string Str(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// A point's run label: the stored string, or the JSON text of whatever else is stored there.
std::string RunLabel(const json& p) {
  return p.contains("run") && p["run"].is_string() ? p["run"].get<std::string>()
                                                   : p.value("run", json()).dump();
}

// One stored family (analysis/json.cc's to_json(PowerLawFit)); false if it lacks E, alpha or A.
bool ParseFamily(const json& j, analysis::PowerLawFit* f) {
  if (!j.is_object()) return false;
  f->family = Str(j, "family");
  std::map<std::string, analysis::ParamEstimate> by_name;
  for (const json& p : j.value("params", json::array())) {
    if (!p.is_object()) continue;
    analysis::ParamEstimate e;
    e.name = Str(p, "name");
    e.value = Est(p.value("value", json::object()));
    e.lower_bound = Num(p, "lower_bound");
    e.upper_bound = Num(p, "upper_bound");
    e.at_bound = p.value("at_bound", false);
    const double r = Num(p, "resamples_at_bound");
    e.resamples_at_bound = std::isfinite(r) ? r : 0;
    by_name[e.name] = e;
  }
  if (!by_name.count("E") || !by_name.count("alpha")) return false;
  if (!by_name.count("log_A") && by_name.count("A")) {
    analysis::ParamEstimate l = by_name["A"];
    l.name = "log_A";
    l.value = {std::log(l.value.estimate), std::log(l.value.lo), std::log(l.value.hi)};
    by_name["log_A"] = l;
  }
  if (!by_name.count("log_A")) return false;
  if (!by_name.count("A")) {
    analysis::ParamEstimate a = by_name["log_A"];
    a.name = "A";
    a.value = {std::exp(a.value.estimate), std::exp(a.value.lo), std::exp(a.value.hi)};
    by_name["A"] = a;
  }
  // PowerLawFit's accessors read E, log_A, A, alpha by position.
  f->params = {by_name["E"], by_name["log_A"], by_name["A"], by_name["alpha"]};
  const double unit = Num(j, "flops_unit");
  f->flops_unit = std::isfinite(unit) && unit > 0 ? unit : 1e15;
  f->paired = j.value("paired", false);
  const json& fr = j.value("flops_range", json::array());
  const json& lr = j.value("loss_range", json::array());
  if (fr.is_array() && fr.size() == 2 && fr[0].is_number() && fr[1].is_number()) {
    f->min_flops = fr[0].get<double>();
    f->max_flops = fr[1].get<double>();
  }
  if (lr.is_array() && lr.size() == 2 && lr[0].is_number() && lr[1].is_number()) {
    f->min_loss = lr[0].get<double>();
    f->max_loss = lr[1].get<double>();
  }
  for (const json& p : j.value("frontier", json::array())) {
    if (!p.is_object()) continue;
    analysis::FrontierPoint fp;
    fp.run = RunLabel(p);
    fp.flops = Num(p, "flops");
    fp.loss = Num(p, "loss");
    f->frontier.push_back(fp);
  }
  // Rows without ranges (older ones): the frontier's.
  if (!(f->max_flops > 0) && !f->frontier.empty()) {
    f->min_flops = f->max_flops = f->frontier.front().flops;
    f->min_loss = f->max_loss = f->frontier.front().loss;
    for (const auto& p : f->frontier) {
      f->min_flops = std::min(f->min_flops, p.flops);
      f->max_flops = std::max(f->max_flops, p.flops);
      f->min_loss = std::min(f->min_loss, p.loss);
      f->max_loss = std::max(f->max_loss, p.loss);
    }
  }
  const json& mf = j.value("misfit", json::object());
  if (mf.is_object()) {
    f->misfit.rejected = mf.value("rejected", false);
    f->misfit.reason = Str(mf, "reason");
  }
  f->interval_note = Str(j, "interval_note");
  f->n_units = j.value("n_units", 0);
  const json& d = j.value("diagnostics", json::object());
  if (d.is_object()) {
    f->diagnostics.n_runs = d.value("n_runs", 0);
    f->diagnostics.n_points = d.value("n_points", 0);
    f->diagnostics.rmse_log = Num(d, "rmse_log");
    f->diagnostics.resamples_ok = d.value("resamples_ok", 0);
    f->diagnostics.resamples_failed = d.value("resamples_failed", 0);
  }
  return f->max_flops > 0;
}

}  // namespace

namespace {

template <typename Fail>
std::optional<FitResult> ParseStored(const db::FitRecord& record, Fail fail) {
  const json r = json::parse(record.result_json, nullptr, false);
  if (!r.is_object()) return fail("its result is not a JSON object");
  const json& fits = r.contains("fits") ? r["fits"] : r;
  if (!fits.is_object() || !fits.contains("families") || !fits["families"].is_array()) {
    return fail("it holds no families");
  }
  FitResult out;
  out.stored_fit = record.id;
  out.request.family_key = record.family_key;
  out.request.sweep_id = record.sweep_id;
  analysis::FamilyFits ff;
  for (const json& fam : fits["families"]) {
    analysis::PowerLawFit f;
    if (ParseFamily(fam, &f)) ff.families.push_back(std::move(f));
  }
  if (ff.families.empty()) return fail("no family has E, A, alpha and a compute range");
  for (const json& w : fits.value("warnings", json::array())) {
    if (w.is_string()) ff.warnings.push_back(w.get<std::string>());
  }
  for (const auto& f : ff.families) out.bands.push_back(CurveAndBand(f));
  out.fits = std::move(ff);
  // The observations the fit saw (`moelab fit` stores them with the row).
  const json inputs = json::parse(record.inputs_json, nullptr, false);
  std::set<std::string> runs;
  if (inputs.is_array()) {
    for (const json& p : inputs) {
      if (!p.is_object()) continue;
      analysis::Observation o;
      o.run = RunLabel(p);
      o.family = Str(p, "family");
      o.flops = Num(p, "flops");
      o.tokens = Num(p, "tokens");
      o.params = Num(p, "params");
      o.loss = Num(p, "loss");
      o.seed = Str(p, "seed");  // rows from before issue 21 have none: one seed group
      o.unit = Str(p, "unit");
      runs.insert(o.run);
      out.observations.points.push_back(std::move(o));
    }
  }
  out.observations.runs_used = static_cast<int>(runs.size());
  const json& m = r.value("multipliers", json());
  if (m.is_object() && m.contains("rows") && m["rows"].is_array()) {
    analysis::MultiplierTable t;
    t.reference = Str(m, "reference");
    t.target_loss = Num(m, "target_loss");
    for (const json& row : m["rows"]) {
      if (!row.is_object()) continue;
      analysis::Multiplier x;
      x.family = Str(row, "family");
      x.reference = Str(row, "reference");
      x.target_loss = Num(row, "target_loss");
      x.ok = row.value("ok", false);
      x.refusal = Str(row, "refusal");
      x.interval_note = Str(row, "interval_note");
      x.multiplier = Est(row.value("multiplier", json::object()));
      x.compute_family = Est(row.value("compute_family", json::object()));
      x.compute_reference = Est(row.value("compute_reference", json::object()));
      for (const json& flag : row.value("flags", json::array())) {
        if (flag.is_string()) x.flags.push_back(flag.get<std::string>());
      }
      t.rows.push_back(std::move(x));
    }
    out.stored_multipliers = std::move(t);
  }
  out.stored_basis = Str(r, "verdict_basis");
  const json& mf = r.value("model_free", json());
  if (mf.is_object() && mf.contains("rows") && mf["rows"].is_array()) {
    analysis::ModelFreeTable t;
    t.reference = Str(mf, "reference");
    for (const json& x : mf.value("targets", json::array())) {
      if (x.is_number()) t.targets.push_back(x.get<double>());
    }
    const json& range = mf.value("loss_range", json::array());
    if (range.is_array() && range.size() == 2 && range[0].is_number() && range[1].is_number()) {
      t.range_lo = range[0].get<double>();
      t.range_hi = range[1].get<double>();
    }
    auto numbers = [](const json& a) {
      std::vector<double> v;
      if (a.is_array()) {
        for (const json& x : a) v.push_back(x.is_number() ? x.get<double>() : NAN);
      }
      return v;
    };
    for (const json& row : mf["rows"]) {
      if (!row.is_object()) continue;
      analysis::ModelFreeRow x;
      x.family = Str(row, "family");
      x.target_loss = Num(row, "target_loss");
      for (const json& seed : row.value("seeds", json::array())) {
        x.seeds.push_back(seed.is_string() ? seed.get<std::string>() : seed.dump());
      }
      x.flops_family = numbers(row.value("flops_family", json()));
      x.flops_reference = numbers(row.value("flops_reference", json()));
      x.tokens_family = numbers(row.value("tokens_family", json()));
      x.tokens_reference = numbers(row.value("tokens_reference", json()));
      x.flops_ratio = Est(row.value("flops_ratio", json::object()));
      x.tokens_ratio = Est(row.value("tokens_ratio", json::object()));
      x.interval_note = Str(row, "interval_note");
      t.rows.push_back(std::move(x));
    }
    for (const json& n : mf.value("notes", json::array())) {
      if (n.is_string()) t.notes.push_back(n.get<std::string>());
    }
    out.model_free = std::move(t);
  } else {
    out.model_free_error = out.stored_basis.empty()
                               ? "this row is older than the model-free reading"
                               : "not stored: " + out.stored_basis;
  }
  // The options `moelab fit` ran with (rows without them: the analysis defaults, marked).
  const json o = json::parse(record.options_json, nullptr, false);
  if (o.is_object() && o.contains("bootstrap_resamples")) {
    analysis::FitOptions& fo = out.options;
    out.options_stored = true;
    auto num = [&](const char* key, double fallback) {
      const double v = Num(o, key);
      return std::isfinite(v) ? v : fallback;
    };
    fo.huber_delta = num("huber_delta", fo.huber_delta);
    fo.flops_unit = num("flops_unit", fo.flops_unit);
    fo.bootstrap_resamples = static_cast<int>(num("bootstrap_resamples", fo.bootstrap_resamples));
    fo.seed = o.value("seed", fo.seed);
    fo.level = num("level", fo.level);
    fo.min_units = static_cast<int>(num("min_units", fo.min_units));
    fo.final_only = o.value("final_only", fo.final_only);
    fo.expanded_percentile = o.value("expanded_percentile", fo.expanded_percentile);
    fo.skip_failed_families = o.value("skip_failed_families", fo.skip_failed_families);
    fo.max_failed_fraction = num("max_failed_fraction", fo.max_failed_fraction);
    fo.min_span_fraction = num("min_span_fraction", fo.min_span_fraction);
    fo.max_iterations = static_cast<int>(num("max_iterations", fo.max_iterations));
  }
  return out;
}

}  // namespace

std::optional<FitResult> FitResultFromStored(const db::FitRecord& record, std::string* why) {
  auto fail = [&](const std::string& reason) -> std::optional<FitResult> {
    if (why) *why = reason;
    return std::nullopt;
  };
  if (record.form != "power") return fail("a " + record.form + " fit, not the power law");
  try {
    return ParseStored(record, fail);
  } catch (const std::exception& e) {  // a field of an unexpected type
    return fail(std::string("malformed: ") + e.what());
  }
}

FitJob::FitJob() : thread_([this] { Loop(); }) {}

FitJob::~FitJob() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void FitJob::Submit(const FitRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (last_ && *last_ == request) return;
  if (pending_ && *pending_ == request) return;
  pending_ = request;
  wake_.notify_all();
}

std::shared_ptr<const FitResult> FitJob::Result() const {
  std::lock_guard<std::mutex> lock(mu_);
  return result_;
}

bool FitJob::Busy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return busy_ || pending_.has_value();
}

void FitJob::Loop() {
  while (true) {
    FitRequest request;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [this] { return stop_ || pending_.has_value(); });
      if (stop_) return;
      request = *pending_;
      pending_.reset();
      last_ = request;
      busy_ = true;
    }
    auto result = std::make_shared<FitResult>(ComputeFits(request));
    std::lock_guard<std::mutex> lock(mu_);
    result_ = std::move(result);
    busy_ = false;
  }
}

}  // namespace moelab::gui
