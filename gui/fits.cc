#include "gui/fits.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

namespace moelab::gui {

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
      analysis::FitOptions options;
      options.bootstrap_resamples = request.resamples;
      options.skip_failed_families = true;
      options.threads = 1;  // the GUI shares the machine with the runs it watches
      options.final_only = out.observations.wsd_runs > 0;  // as `moelab fit`: post-decay points
      out.fits = analysis::FitFamilies(out.observations.points, options);
    }
  } catch (const std::exception& e) {
    out.error = e.what();
  }
  if (out.fits) {
    for (const auto& f : out.fits->families) out.bands.push_back(CurveAndBand(f));
    if (!request.heads_base.empty() && !request.heads_treatment.empty() &&
        request.heads_base != request.heads_treatment) {
      try {
        analysis::FitOptions options;
        options.bootstrap_resamples = request.resamples;
        options.threads = 1;
        out.heads = analysis::CompareHeads(out.observations.points, request.heads_base,
                                           request.heads_treatment, options);
      } catch (const std::exception& e) {
        out.heads_error = e.what();
      }
    }
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
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
