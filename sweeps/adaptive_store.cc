#include "sweeps/adaptive_store.h"

#include "db/sqlite.h"

namespace moelab::sweeps {

using nlohmann::json;

std::vector<AdaptiveBatchRow> AdaptiveStore::Batches(int64_t sweep_id) {
  db::Statement st = db_.Prepare(
      "SELECT batch, runs_json, why_json, cost_flops, created_at FROM adaptive_batches "
      "WHERE sweep_id = ?1 ORDER BY batch");
  st.Bind(1, sweep_id);
  std::vector<AdaptiveBatchRow> out;
  while (st.Step()) {
    AdaptiveBatchRow r;
    r.batch = static_cast<int>(st.Int(0));
    r.runs = json::parse(st.Text(1)).get<std::vector<int>>();
    r.why = json::parse(st.Text(2)).get<std::vector<std::string>>();
    r.cost_flops = st.Real(3);
    r.created_at = st.Real(4);
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<AdaptiveLookRow> AdaptiveStore::Looks(int64_t sweep_id) {
  db::Statement st = db_.Prepare(
      "SELECT batch, seeds, estimate, lo, hi, critical, alpha_spent, spent_flops, decision, "
      "detail_json, created_at FROM adaptive_looks WHERE sweep_id = ?1 ORDER BY batch");
  st.Bind(1, sweep_id);
  std::vector<AdaptiveLookRow> out;
  while (st.Step()) {
    AdaptiveLookRow r;
    r.batch = static_cast<int>(st.Int(0));
    r.seeds = static_cast<int>(st.Int(1));
    r.estimate = st.Real(2);
    r.lo = st.Real(3);
    r.hi = st.Real(4);
    r.critical = st.Real(5);
    r.alpha_spent = st.Real(6);
    r.spent_flops = st.Real(7);
    r.decision = st.Text(8);
    r.detail = json::parse(st.Text(9));
    r.created_at = st.Real(10);
    out.push_back(std::move(r));
  }
  return out;
}

void AdaptiveStore::AddBatch(int64_t sweep_id, const AdaptiveBatchRow& row) {
  db_.Prepare(
         "INSERT OR IGNORE INTO adaptive_batches (sweep_id, batch, runs_json, why_json, "
         "cost_flops, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)")
      .BindAll(sweep_id, row.batch, json(row.runs).dump(), json(row.why).dump(), row.cost_flops,
               db::UnixNow())
      .Run();
}

void AdaptiveStore::AddLook(int64_t sweep_id, const AdaptiveLookRow& row) {
  db_.Prepare(
         "INSERT OR REPLACE INTO adaptive_looks (sweep_id, batch, seeds, estimate, lo, hi, "
         "critical, alpha_spent, spent_flops, decision, detail_json, created_at) VALUES "
         "(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)")
      .BindAll(sweep_id, row.batch, row.seeds, row.estimate, row.lo, row.hi, row.critical,
               row.alpha_spent, row.spent_flops, row.decision, row.detail.dump(), db::UnixNow())
      .Run();
}

}  // namespace moelab::sweeps
