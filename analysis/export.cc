#include "analysis/export.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <stdexcept>
#include <vector>

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
  FamilySparsities sparsities;
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
    out.run_vars[fmt::format("{}", id)] = vars;
    AddRunConfig(c, *family, &out, &sparsities);
  }
  SetFamilySparsity(sparsities, &out);
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

namespace {

// A run's step-indexed data, lined up for row-by-row output.
struct StepColumns {
  std::vector<std::string> names;            // after the fixed columns
  std::vector<std::vector<double>> by_step;  // [row][column], NaN = missing
};

// The per-head and per-expert column names of a shape.
std::vector<std::string> WideNames(int layers, int heads, int moe_layers, int experts) {
  std::vector<std::string> n;
  for (int l = 0; l < layers; ++l)
    for (int h = 0; h < heads; ++h) n.push_back(fmt::format("smax_l{}_h{}", l, h));
  for (int l = 0; l < moe_layers; ++l)
    for (int e = 0; e < experts; ++e) n.push_back(fmt::format("load_l{}_e{}", l, e));
  return n;
}

const std::vector<std::string>& FixedNames() {
  static const std::vector<std::string> n = {"tokens", "flops",     "loss",     "aux_loss",
                                             "lr",     "grad_norm", "val_loss", "max_logit"};
  return n;
}

// Rows of one run: steps ascending, values [fixed..., wide...] in the order of FixedNames() then
// WideNames() of the run's own shape.
void RunRows(db::Reader& reader, int64_t run_id, std::vector<int64_t>* steps,
             std::vector<std::vector<double>>* rows, std::vector<std::string>* wide) {
  const std::vector<std::string> keys = {"tokens", "flops", "loss", "aux_loss", "lr", "grad_norm"};
  std::map<int64_t, size_t> row_of;
  const db::Series first = reader.GetSeries(run_id, "loss");
  for (int64_t s : first.steps) row_of.emplace(s, row_of.size());
  const db::Series val = reader.GetSeries(run_id, "val_loss");
  const db::MaxLogitTimeline ml = reader.GetMaxLogitTimeline(run_id);
  const db::ExpertLoads el = reader.GetExpertLoads(run_id);
  // Steps with only an evaluation or only a matrix still get a row.
  for (int64_t s : val.steps) row_of.emplace(s, 0);
  for (int64_t s : ml.steps) row_of.emplace(s, 0);
  for (int64_t s : el.steps) row_of.emplace(s, 0);
  steps->clear();
  for (auto& [s, i] : row_of) {
    i = steps->size();
    steps->push_back(s);
  }
  *wide = WideNames(ml.layers, ml.heads, el.moe_layers, el.experts);
  const size_t fixed = FixedNames().size(), cols = fixed + wide->size();
  rows->assign(steps->size(), std::vector<double>(cols, NAN));
  for (size_t k = 0; k < keys.size(); ++k) {
    const db::Series s = keys[k] == "loss" ? first : reader.GetSeries(run_id, keys[k]);
    for (size_t i = 0; i < s.steps.size(); ++i) (*rows)[row_of.at(s.steps[i])][k] = s.values[i];
  }
  for (size_t i = 0; i < val.steps.size(); ++i) (*rows)[row_of.at(val.steps[i])][6] = val.values[i];
  const size_t cells = size_t(ml.layers) * ml.heads;
  for (size_t i = 0; i < ml.steps.size(); ++i) {
    std::vector<double>& r = (*rows)[row_of.at(ml.steps[i])];
    double m = -INFINITY;
    for (size_t c = 0; c < cells; ++c) {
      const double v = ml.values[i * cells + c];
      r[fixed + c] = v;
      if (std::isfinite(v)) m = std::max(m, v);
    }
    if (std::isfinite(m)) r[7] = m;
  }
  const size_t per_layer = size_t(el.experts);
  for (size_t i = 0; i < el.steps.size(); ++i) {
    std::vector<double>& r = (*rows)[row_of.at(el.steps[i])];
    for (int l = 0; l < el.moe_layers; ++l) {
      const int64_t* c = &el.counts[(i * el.moe_layers + l) * per_layer];
      double sum = 0;
      for (size_t e = 0; e < per_layer; ++e) sum += double(c[e]);
      for (size_t e = 0; e < per_layer; ++e) {
        r[fixed + cells + l * per_layer + e] = sum > 0 ? double(c[e]) / sum : NAN;
      }
    }
  }
}

// Integral values (tokens, FLOPs) without an exponent; the rest as the shortest text that reads
// back to the same double, so CSV and JSON Lines hold identical numbers.
std::string CsvValue(double v) {
  if (!std::isfinite(v)) return "";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{:.0f}", v);
  return fmt::format("{}", v);
}

// Run variables `moelab train` records about the run itself (cli/train_command.cc), as opposed
// to the sweep variables (sparsity, head_ratio, a grid's config paths) the step export carries.
bool IsTrainerVar(const std::string& key) {
  return key == "build.commit" || key == "data.entropy_rate" || key.rfind("dist.", 0) == 0;
}

std::map<std::string, std::string> SweepVars(db::Reader& reader, int64_t run_id) {
  std::map<std::string, std::string> vars;
  for (const auto& [k, v] : reader.RunVars(run_id))
    if (!IsTrainerVar(k)) vars[k] = v;
  return vars;
}

// A variable's text as JSON: a number or a boolean when it reads as one, else the text.
nlohmann::ordered_json VarValue(const std::string& text) {
  nlohmann::ordered_json v = nlohmann::ordered_json::parse(text, nullptr, false);
  return v.is_number() || v.is_boolean() ? v : nlohmann::ordered_json(text);
}

}  // namespace

int64_t ExportSteps(const std::string& db_path, std::optional<int64_t> sweep_id, StepsFormat format,
                    std::ostream& out) {
  db::Reader reader(db_path);
  std::vector<db::RunRow> runs;
  for (const db::RunRow& run : reader.ListRuns()) {
    if (!sweep_id || run.sweep_id == sweep_id) runs.push_back(run);
  }
  // CSV needs every column up front: the sweep variables of every run (so nobody parses them
  // out of run_name) and the widest recorded shape among the runs.
  std::vector<std::string> header = FixedNames();
  std::vector<std::string> var_names;
  if (format == StepsFormat::kCsv) {
    std::set<std::string> names;
    for (const db::RunRow& run : runs)
      for (const auto& [k, v] : SweepVars(reader, run.id)) names.insert(k);
    var_names.assign(names.begin(), names.end());
    int layers = 0, heads = 0, moe_layers = 0, experts = 0;
    for (const db::RunRow& run : runs) {
      layers = std::max(layers, run.shape.layers);
      heads = std::max(heads, run.shape.heads);
      moe_layers = std::max(moe_layers, run.shape.moe_layers);
      experts = std::max(experts, run.shape.experts);
    }
    for (auto& n : WideNames(layers, heads, moe_layers, experts)) header.push_back(n);
    out << "run_id,run_name";
    for (const auto& n : var_names) out << ',' << CsvField(n);
    out << ",step";
    for (const auto& n : header) out << ',' << n;
    out << '\n';
  }
  int64_t count = 0;
  std::vector<int64_t> steps;
  std::vector<std::vector<double>> rows;
  std::vector<std::string> wide;
  for (const db::RunRow& run : runs) {
    RunRows(reader, run.id, &steps, &rows, &wide);
    const std::map<std::string, std::string> vars = SweepVars(reader, run.id);
    std::vector<std::string> names = FixedNames();
    names.insert(names.end(), wide.begin(), wide.end());
    if (format == StepsFormat::kCsv) {
      std::vector<int> col_of(names.size());
      for (size_t c = 0; c < names.size(); ++c) {
        col_of[c] =
            static_cast<int>(std::find(header.begin(), header.end(), names[c]) - header.begin());
      }
      std::string prefix = fmt::format("{},{},", run.id, CsvField(run.name));
      for (const std::string& n : var_names) {
        const auto it = vars.find(n);
        prefix += (it == vars.end() ? "" : CsvField(it->second)) + ",";
      }
      std::vector<std::string> cells(header.size());
      for (size_t i = 0; i < steps.size(); ++i) {
        std::fill(cells.begin(), cells.end(), std::string());
        for (size_t c = 0; c < names.size(); ++c) {
          // A matrix wider than the run's recorded shape has no column: left out.
          if (col_of[c] < static_cast<int>(cells.size())) cells[col_of[c]] = CsvValue(rows[i][c]);
        }
        out << prefix << steps[i];
        for (const auto& v : cells) out << ',' << v;
        out << '\n';
      }
    } else {
      for (size_t i = 0; i < steps.size(); ++i) {
        // Ordered, so the keys come in the documented column order.
        nlohmann::ordered_json row = {{"run_id", run.id}, {"run_name", run.name}};
        for (const auto& [k, v] : vars) row[k] = VarValue(v);
        row["step"] = steps[i];
        for (size_t c = 0; c < names.size(); ++c) {
          const double v = rows[i][c];
          row[names[c]] = std::isfinite(v) ? nlohmann::ordered_json(v) : nullptr;
        }
        out << row.dump() << '\n';
      }
    }
    count += static_cast<int64_t>(steps.size());
  }
  return count;
}

}  // namespace moelab::analysis
