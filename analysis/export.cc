#include "analysis/export.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <stdexcept>

#include "db/reader.h"

namespace moelab::analysis {

using nlohmann::json;

namespace {

json NumberOrNull(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

double NumberOr(const json& j, const char* key, double fallback) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : fallback;
}

std::string CsvField(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string CsvNumber(const json& v) {
  if (v.is_null()) return "";
  if (v.is_number_integer()) return fmt::format("{}", v.get<int64_t>());
  if (v.is_number()) return fmt::format("{:.10g}", v.get<double>());
  return CsvField(v.is_string() ? v.get<std::string>() : v.dump());
}

}  // namespace

json ExportRuns(const std::string& db_path, std::optional<int64_t> sweep_id,
                const std::string& sweep_name) {
  db::Reader reader(db_path);
  json runs = json::array(), points = json::array();
  std::vector<std::pair<double, double>> all;  // (flops, loss) of every finished point
  for (const db::RunRow& run : reader.ListRuns()) {
    if (sweep_id && run.sweep_id != sweep_id) continue;
    const std::string config = reader.RunConfigJson(run.id);
    json vars = json::object();
    for (const auto& [k, v] : reader.RunVars(run.id)) vars[k] = v;
    const db::Series loss = reader.GetSeries(run.id, "val_loss");
    const db::Series flops = reader.GetSeries(run.id, "eval_flops");
    const db::Series tokens = reader.GetSeries(run.id, "eval_tokens");
    json r = {{"id", run.id},
              {"name", run.name},
              {"status", ToString(run.effective_status)},
              {"config_hash", run.config_hash},
              {"vars", vars},
              {"config", json::parse(config, nullptr, false)},
              {"params_active", run.shape.params_active},
              {"params_total", run.shape.params_total},
              {"flops_per_token", run.shape.flops_per_token},
              {"steps", run.last_step},
              {"evaluations", loss.steps.size()}};
    if (r["config"].is_discarded()) r["config"] = nullptr;
    for (size_t i = 0; i < loss.steps.size(); ++i) {
      const double f = i < flops.values.size() ? flops.values[i] : NAN;
      const double t = i < tokens.values.size() ? tokens.values[i] : NAN;
      points.push_back({{"run", run.id},
                        {"step", loss.steps[i]},
                        {"tokens", NumberOrNull(t)},
                        {"flops", NumberOrNull(f)},
                        {"val_loss", NumberOrNull(loss.values[i])},
                        {"final", i + 1 == loss.steps.size()},
                        {"frontier", false}});
    }
    runs.push_back(std::move(r));
  }
  // The loss-over-compute frontier of each run's points within its family is the fit's business
  // (it depends on the family key); the export flags the sweep-wide frontier of final points,
  // the compute-optimal runs at a glance.
  std::vector<size_t> order;
  for (size_t i = 0; i < points.size(); ++i)
    if (points[i]["final"].get<bool>() && points[i]["flops"].is_number() &&
        points[i]["val_loss"].is_number())
      order.push_back(i);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return points[a]["flops"].get<double>() < points[b]["flops"].get<double>();
  });
  double best = INFINITY;
  for (size_t i : order) {
    const double l = points[i]["val_loss"].get<double>();
    if (l < best) {
      best = l;
      points[i]["frontier"] = true;
    }
  }
  return {{"moelab_export", kExportVersion},
          {"sweep", sweep_name.empty() ? json(nullptr) : json(sweep_name)},
          {"database", db_path},
          {"runs", runs},
          {"points", points}};
}

ObservationSet ObservationsFromExport(const json& e, const std::string& family_key) {
  if (!e.is_object() || !e.contains("moelab_export") || !e.contains("runs") ||
      !e.contains("points")) {
    throw std::runtime_error("not a moelab export (expected the JSON of `moelab db export`)");
  }
  if (e["moelab_export"] != kExportVersion) {
    throw std::runtime_error(fmt::format("moelab export version {} (this build reads {})",
                                         e["moelab_export"].dump(), kExportVersion));
  }
  ObservationSet out;
  std::map<int64_t, std::vector<const json*>> by_run;
  for (const json& p : e["points"]) by_run[p.at("run").get<int64_t>()].push_back(&p);
  std::map<std::string, std::vector<double>> sparsities;
  for (const json& run : e["runs"]) {
    const int64_t id = run.at("id").get<int64_t>();
    const std::string label = fmt::format("run {} '{}'", id, run.value("name", ""));
    // An export written by another build may hold a status this one does not know: skip it.
    const std::string status = run.value("status", "");
    const std::optional<RunStatus> parsed = TryParseRunStatus(status);
    if (parsed != RunStatus::kDone && parsed != RunStatus::kDiverged) {
      out.skipped.push_back(fmt::format("{}: status {}", label, status));
      continue;
    }
    std::map<std::string, std::string> vars;
    for (auto it = run["vars"].begin(); it != run["vars"].end(); ++it)
      vars[it.key()] = it.value().is_string() ? it.value().get<std::string>() : it.value().dump();
    const json& c = run["config"];
    const auto family = FamilyOf(vars, c.is_null() ? "{}" : c.dump(), family_key);
    if (!family) {
      out.skipped.push_back(fmt::format("{}: no value for '{}'", label, family_key));
      continue;
    }
    auto pts = by_run.find(id);
    if (pts == by_run.end() || pts->second.empty()) {
      out.skipped.push_back(fmt::format("{}: no evaluations", label));
      continue;
    }
    for (const json* p : pts->second) {
      Observation o;
      o.run = fmt::format("{}", id);
      o.family = *family;
      o.loss = NumberOr(*p, "val_loss", NAN);
      o.flops = NumberOr(*p, "flops", NAN);
      o.tokens = NumberOr(*p, "tokens", NAN);
      o.params = NumberOr(run, "params_active", NAN);
      SetTrunk(c, &o);
      out.points.push_back(o);
    }
    ++out.runs_used;
    if (c.is_object() && c.contains("schedule") && c["schedule"].is_object() &&
        c["schedule"].value("type", "") == "wsd") {
      ++out.wsd_runs;
    }
    if (c.is_object() && c.contains("moe")) {
      const double total = c["moe"].value("experts_total", 0.0);
      const double active = c["moe"].value("experts_active", 1.0);
      sparsities[*family].push_back(total > 0 ? total / active : 0.0);
    }
  }
  for (const auto& [family, values] : sparsities) {
    bool same = true;
    for (double v : values) same = same && v == values.front();
    if (same && !values.empty()) out.sparsity[family] = values.front();
  }
  return out;
}

std::string ExportCsv(const json& e) {
  std::set<std::string> var_names;
  std::map<int64_t, const json*> runs;
  for (const json& r : e.at("runs")) {
    runs[r.at("id").get<int64_t>()] = &r;
    for (auto it = r["vars"].begin(); it != r["vars"].end(); ++it) var_names.insert(it.key());
  }
  std::string out = "run_id,run_name,status,config_hash";
  for (const auto& v : var_names) out += "," + CsvField(v);
  out += ",params_active,params_total,step,tokens,flops,val_loss,final,frontier\n";
  for (const json& p : e.at("points")) {
    const json& r = *runs.at(p.at("run").get<int64_t>());
    out += fmt::format("{},{},{},{}", r["id"].get<int64_t>(), CsvField(r.value("name", "")),
                       r.value("status", ""), r.value("config_hash", ""));
    for (const auto& v : var_names)
      out += "," + (r["vars"].contains(v) ? CsvNumber(r["vars"][v]) : "");
    out += fmt::format(",{},{},{},{},{},{},{},{}\n", CsvNumber(r["params_active"]),
                       CsvNumber(r["params_total"]), CsvNumber(p["step"]), CsvNumber(p["tokens"]),
                       CsvNumber(p["flops"]), CsvNumber(p["val_loss"]),
                       p["final"].get<bool>() ? 1 : 0, p["frontier"].get<bool>() ? 1 : 0);
  }
  return out;
}

}  // namespace moelab::analysis
