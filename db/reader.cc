#include "db/reader.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>
#include <optional>
#include <vector>

#include "db/schema.h"

namespace moelab::db {

namespace {

struct SeriesSource {
  const char* key;
  const char* table;
  const char* column;
  bool optional = false;  // NULL where not recorded: those steps are left out of the series
};

// Whitelist: keys become SQL identifiers, so only these ever reach a query string.
constexpr SeriesSource kSeriesSources[] = {
    {"loss", "steps", "loss"},
    {"aux_loss", "steps", "aux_loss"},
    {"lr", "steps", "lr"},
    {"grad_norm", "steps", "grad_norm"},
    {"tokens", "steps", "tokens"},
    {"flops", "steps", "flops"},
    {"step_time_s", "steps", "step_time_s"},
    {"tokens_per_s", "steps", "tokens_per_s"},
    {"wall_time", "steps", "wall_time"},
    {"norm_gain_rms", "steps", "norm_gain_rms", true},
    {"val_loss", "evals", "val_loss"},
    {"eval_tokens", "evals", "tokens"},
    {"eval_flops", "evals", "flops"},
    {"eval_wall_time", "evals", "wall_time"},
};

constexpr const char* kRunColumns = R"sql(
SELECT r.id, r.name, r.sweep_id, r.config_hash, r.status, r.pid, r.host, r.created_at,
       r.started_at, r.heartbeat_at, r.ended_at, r.error, r.diverged_step, r.checkpoint_path,
       r.checkpoint_step, r.layers, r.heads, r.moe_layers, r.experts, r.params_total,
       r.params_active, r.flops_per_token, s.total_steps, s.last_step, s.last_loss,
       s.best_val_loss, s.last_val_loss, s.tokens, s.flops, s.tokens_per_s, s.updated_at,
       r.ranks, r.dp_size, r.ep_size, r.uuid, r.threads, r.nondeterministic_from_step
FROM runs r LEFT JOIN run_summary s ON s.run_id = r.id)sql";

RunRow ReadRun(const Statement& st, double now, double stale_after_s) {
  RunRow r;
  r.id = st.Int(0);
  r.name = st.Text(1);
  r.sweep_id = st.OptInt(2);
  r.config_hash = st.Text(3);
  r.status = ParseRunStatus(st.Text(4));
  r.pid = st.OptInt(5);
  r.host = st.Text(6);
  r.created_at = st.Real(7);
  r.started_at = st.OptReal(8);
  r.heartbeat_at = st.OptReal(9);
  r.ended_at = st.OptReal(10);
  r.error = st.Text(11);
  r.diverged_step = st.OptInt(12);
  r.checkpoint_path = st.Text(13);
  r.checkpoint_step = st.OptInt(14);
  r.shape.layers = static_cast<int>(st.Int(15));
  r.shape.heads = static_cast<int>(st.Int(16));
  r.shape.moe_layers = static_cast<int>(st.Int(17));
  r.shape.experts = static_cast<int>(st.Int(18));
  r.shape.params_total = st.Int(19);
  r.shape.params_active = st.Int(20);
  r.shape.flops_per_token = st.OptReal(21).value_or(0);
  r.shape.total_steps = st.Int(22);
  r.last_step = st.Int(23);
  r.last_loss = st.OptReal(24);
  r.best_val_loss = st.OptReal(25);
  r.last_val_loss = st.OptReal(26);
  r.tokens = st.Int(27);
  r.flops = st.OptReal(28).value_or(0);
  r.tokens_per_s = st.OptReal(29);
  r.updated_at = st.OptReal(30);
  r.ranks = static_cast<int>(st.Int(31));
  r.dp_size = static_cast<int>(st.Int(32));
  r.ep_size = static_cast<int>(st.Int(33));
  r.uuid = st.Text(34);
  if (const auto t = st.OptInt(35)) r.threads = static_cast<int>(*t);
  r.nondeterministic_from_step = st.OptInt(36);
  r.effective_status = r.status;
  if (r.status == RunStatus::kRunning) {
    const double alive_at = r.heartbeat_at.value_or(r.started_at.value_or(r.created_at));
    if (now - alive_at > stale_after_s) {
      r.stale = true;
      r.effective_status = RunStatus::kFailed;
    }
  }
  return r;
}

template <typename T>
std::vector<T> DecodeBlob(std::span<const std::byte> blob) {
  std::vector<T> out(blob.size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), blob.data(), out.size() * sizeof(T));
  return out;
}

// The rows of a per-step matrix table (the step in column 0) whose values, as decode(row) reads
// them, number n (the run's shape), appended to steps and values; a row decode refuses or of
// another size is left out.
// `sql` selects a run's (?1) rows over a step range (?2 to ?3), in step order.
template <typename T, typename Decode>
void ReadShapedRows(Connection& db, const char* sql, int64_t run_id, int64_t step_min,
                    int64_t step_max, size_t n, Decode decode, std::vector<int64_t>* steps,
                    std::vector<T>* values) {
  Statement st = db.Prepare(sql);
  st.BindAll(run_id, step_min, step_max);
  while (st.Step()) {
    const std::optional<std::vector<T>> row = decode(st);
    if (!row || row->size() != n) continue;  // only rows matching the run's shape
    steps->push_back(st.Int(0));
    values->insert(values->end(), row->begin(), row->end());
  }
}

}  // namespace

Reader::Reader(const std::string& path) : db_(OpenForRead(path)) {}

std::vector<RunRow> Reader::ListRuns(double stale_after_s) {
  Statement st = db_.Prepare(std::string(kRunColumns) + " ORDER BY r.id");
  const double now = UnixNow();
  std::vector<RunRow> rows;
  while (st.Step()) rows.push_back(ReadRun(st, now, stale_after_s));
  return rows;
}

std::optional<RunRow> Reader::GetRun(int64_t run_id, double stale_after_s) {
  Statement st = db_.Prepare(std::string(kRunColumns) + " WHERE r.id = ?1");
  st.Bind(1, run_id);
  if (!st.Step()) return std::nullopt;
  return ReadRun(st, UnixNow(), stale_after_s);
}

std::string Reader::RunConfigJson(int64_t run_id) {
  Statement st = db_.Prepare("SELECT config_json FROM runs WHERE id = ?1");
  st.Bind(1, run_id);
  if (!st.Step()) throw std::runtime_error(fmt::format("run {} not found in '{}'", run_id, path()));
  return st.Text(0);
}

std::map<int64_t, std::string> Reader::SweepNames() {
  std::map<int64_t, std::string> out;
  Statement st = db_.Prepare("SELECT id, name FROM sweeps ORDER BY id");
  while (st.Step()) out[st.Int(0)] = st.Text(1);
  return out;
}

std::string Reader::SweepSpecJson(const std::string& name) {
  Statement st = db_.Prepare("SELECT spec_json FROM sweeps WHERE name = ?1");
  st.Bind(1, name);
  return st.Step() ? st.Text(0) : std::string();
}

std::map<std::string, std::string> Reader::RunVars(int64_t run_id) {
  Statement st = db_.Prepare("SELECT key, value FROM run_vars WHERE run_id = ?1");
  st.Bind(1, run_id);
  std::map<std::string, std::string> vars;
  while (st.Step()) vars[st.Text(0)] = st.Text(1);
  return vars;
}

std::map<int64_t, std::map<std::string, std::string>> Reader::AllRunVars() {
  Statement st = db_.Prepare("SELECT run_id, key, value FROM run_vars");
  std::map<int64_t, std::map<std::string, std::string>> vars;
  while (st.Step()) vars[st.Int(0)][st.Text(1)] = st.Text(2);
  return vars;
}

const std::vector<std::string>& Reader::SeriesKeys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k;
    for (const SeriesSource& s : kSeriesSources) k.emplace_back(s.key);
    return k;
  }();
  return keys;
}

Series Reader::GetSeries(int64_t run_id, const std::string& key, int64_t step_min,
                         int64_t step_max) {
  const SeriesSource* source = nullptr;
  for (const SeriesSource& s : kSeriesSources) {
    if (key == s.key) source = &s;
  }
  if (!source) {
    throw std::invalid_argument(
        fmt::format("unknown series key '{}' (known: {})", key, fmt::join(SeriesKeys(), ", ")));
  }
  Statement st = db_.Prepare(fmt::format(
      "SELECT step, {} FROM {} WHERE run_id = ?1 AND step BETWEEN ?2 AND ?3{} ORDER BY step",
      source->column, source->table,
      source->optional ? fmt::format(" AND {} IS NOT NULL", source->column) : ""));
  st.Bind(1, run_id).Bind(2, step_min).Bind(3, step_max);
  Series out;
  while (st.Step()) {
    out.steps.push_back(st.Int(0));
    out.values.push_back(st.Real(1));
  }
  return out;
}

std::pair<int, int> Reader::Shape(int64_t run_id, bool experts) {
  Statement st = db_.Prepare(experts ? "SELECT moe_layers, experts FROM runs WHERE id = ?1"
                                     : "SELECT layers, heads FROM runs WHERE id = ?1");
  st.Bind(1, run_id);
  if (!st.Step()) throw std::runtime_error(fmt::format("run {} not found in '{}'", run_id, path()));
  return {static_cast<int>(st.Int(0)), static_cast<int>(st.Int(1))};
}

std::optional<MaxLogitMatrix> Reader::GetMaxLogitMatrix(int64_t run_id, int64_t step) {
  const auto [layers, heads] = Shape(run_id, false);
  Statement st = db_.Prepare(
      "SELECT step, max_logit, max_logit_raw FROM max_logits WHERE run_id = ?1 AND step <= ?2 "
      "ORDER BY step DESC LIMIT 1");
  st.Bind(1, run_id).Bind(2, step);
  if (!st.Step()) return std::nullopt;
  MaxLogitMatrix m;
  m.step = st.Int(0);
  m.values = DecodeBlob<float>(st.Blob(1));
  m.raw = st.IsNull(2) ? m.values : DecodeBlob<float>(st.Blob(2));
  // A run recorded without a shape still yields its data, as one row.
  const bool shaped = static_cast<size_t>(layers) * heads == m.values.size();
  m.layers = shaped ? layers : 1;
  m.heads = shaped ? heads : static_cast<int>(m.values.size());
  return m;
}

MaxLogitTimeline Reader::GetMaxLogitTimeline(int64_t run_id, int64_t step_min, int64_t step_max) {
  const auto [layers, heads] = Shape(run_id, false);
  MaxLogitTimeline t{.layers = layers, .heads = heads, .steps = {}, .values = {}};
  const size_t n = static_cast<size_t>(layers) * heads;
  ReadShapedRows(
      db_,
      "SELECT step, max_logit FROM max_logits WHERE run_id = ?1 AND step BETWEEN ?2 AND ?3 "
      "ORDER BY step",
      run_id, step_min, step_max, n,
      [n](const Statement& row) -> std::optional<std::vector<float>> {
        const auto blob = row.Blob(1);
        if (blob.size() != n * sizeof(float)) return std::nullopt;
        return DecodeBlob<float>(blob);
      },
      &t.steps, &t.values);
  return t;
}

std::vector<moelab::ClipEvent> Reader::ClipEvents(int64_t run_id, int64_t step_min,
                                                  int64_t step_max) {
  Statement st = db_.Prepare(
      "SELECT step, layer, head, s_max, gamma FROM clip_events WHERE run_id = ?1 AND step "
      "BETWEEN ?2 AND ?3 ORDER BY step, layer, head");
  st.Bind(1, run_id).Bind(2, step_min).Bind(3, step_max);
  std::vector<moelab::ClipEvent> out;
  while (st.Step()) {
    out.push_back(moelab::ClipEvent{st.Int(0), static_cast<int>(st.Int(1)),
                                    static_cast<int>(st.Int(2)), st.Real(3), st.Real(4)});
  }
  return out;
}

ExpertLoads Reader::GetExpertLoads(int64_t run_id, int64_t step_min, int64_t step_max) {
  const auto [moe_layers, experts] = Shape(run_id, true);
  ExpertLoads out{.moe_layers = moe_layers, .experts = experts, .steps = {}, .counts = {}};
  // int32 counts unless a count needed int64 (elem_bytes says which).
  ReadShapedRows(
      db_,
      "SELECT step, elem_bytes, counts FROM expert_counts WHERE run_id = ?1 AND step BETWEEN ?2 "
      "AND ?3 ORDER BY step",
      run_id, step_min, step_max, static_cast<size_t>(moe_layers) * experts,
      [](const Statement& row) -> std::optional<std::vector<int64_t>> {
        if (row.Int(1) != 4) return DecodeBlob<int64_t>(row.Blob(2));
        const auto narrow = DecodeBlob<int32_t>(row.Blob(2));
        return std::vector<int64_t>(narrow.begin(), narrow.end());
      },
      &out.steps, &out.counts);
  return out;
}

}  // namespace moelab::db
