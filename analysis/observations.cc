#include "analysis/observations.h"

#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "db/reader.h"

namespace moelab::analysis {

using nlohmann::json;

std::optional<std::string> FamilyOf(const std::map<std::string, std::string>& run_vars,
                                    const std::string& config_json, const std::string& key) {
  if (auto it = run_vars.find(key); it != run_vars.end()) return it->second;
  json node = json::parse(config_json, nullptr, false);
  if (node.is_discarded()) return std::nullopt;
  size_t start = 0;
  while (true) {
    const size_t dot = key.find('.', start);
    const std::string part = key.substr(start, dot == std::string::npos ? dot : dot - start);
    if (!node.is_object() || !node.contains(part)) return std::nullopt;
    json next = node[part];
    node = next;
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  if (node.is_string()) return node.get<std::string>();
  if (node.is_number()) {
    const double v = node.get<double>();
    if (std::floor(v) == v && std::fabs(v) < 1e15) return fmt::format("{}", (long long)v);
    return fmt::format("{}", v);
  }
  return node.dump();
}

void SetTrunk(const json& config, Observation* o) {
  if (!config.is_object()) return;
  try {
    const RunConfig rc = ConfigFromJson(config);
    o->seed = fmt::format("{}", rc.train.seed);
    o->unit = fmt::format("seed {}, trunk {}", o->seed, BranchHash(rc).substr(0, 12));
  } catch (const std::exception&) {
    // An export from another build whose config no longer parses: the run is its own unit.
  }
}

void AddRunConfig(const nlohmann::json& c, const std::string& family, ObservationSet* out,
                  FamilySparsities* sparsities) {
  if (!c.is_object()) return;
  if (c.contains("schedule") && c["schedule"].is_object() &&
      c["schedule"].value("type", "") == "wsd") {
    ++out->wsd_runs;
  }
  if (c.contains("moe")) {
    const double total = c["moe"].value("experts_total", 0.0);
    const double active = c["moe"].value("experts_active", 1.0);
    (*sparsities)[family].push_back(total > 0 ? total / active : 0.0);
  }
}

void SetFamilySparsity(const FamilySparsities& sparsities, ObservationSet* out) {
  for (const auto& [family, values] : sparsities) {
    bool same = true;
    for (double v : values) same = same && v == values.front();
    if (same && !values.empty()) out->sparsity[family] = values.front();
  }
}

ObservationSet LoadObservations(const std::string& db_path, std::optional<int64_t> sweep_id,
                                const std::string& family_key) {
  db::Reader reader(db_path);
  ObservationSet out;
  FamilySparsities sparsities;
  for (const db::RunRow& run : reader.ListRuns()) {
    if (sweep_id && run.sweep_id != sweep_id) continue;
    const std::string label = fmt::format("run {} '{}'", run.id, run.name);
    if (run.effective_status != RunStatus::kDone && run.effective_status != RunStatus::kDiverged) {
      out.skipped.push_back(fmt::format("{}: status {}", label, ToString(run.effective_status)));
      continue;
    }
    const std::string config = reader.RunConfigJson(run.id);
    const std::map<std::string, std::string> vars = reader.RunVars(run.id);
    const auto family = FamilyOf(vars, config, family_key);
    if (!family) {
      out.skipped.push_back(fmt::format("{}: no value for '{}'", label, family_key));
      continue;
    }
    const db::Series loss = reader.GetSeries(run.id, "val_loss");
    const db::Series flops = reader.GetSeries(run.id, "eval_flops");
    const db::Series tokens = reader.GetSeries(run.id, "eval_tokens");
    if (loss.steps.empty()) {
      out.skipped.push_back(fmt::format("{}: no evaluations", label));
      continue;
    }
    const json c = json::parse(config, nullptr, false);
    for (size_t i = 0; i < loss.steps.size(); ++i) {
      Observation o;
      o.run = fmt::format("{}", run.id);
      o.family = *family;
      o.loss = loss.values[i];
      o.flops = i < flops.values.size() ? flops.values[i] : NAN;
      o.tokens = i < tokens.values.size() ? tokens.values[i] : NAN;
      o.params = static_cast<double>(run.shape.params_active);
      SetTrunk(c, &o);
      out.points.push_back(o);
    }
    ++out.runs_used;
    out.run_vars[fmt::format("{}", run.id)] = vars;
    AddRunConfig(c, *family, &out, &sparsities);
  }
  SetFamilySparsity(sparsities, &out);
  return out;
}

}  // namespace moelab::analysis
