#include "db/promotions.h"

#include "db/schema.h"

namespace moelab::db {

namespace {

constexpr const char* kColumns =
    "id, created_at, sweep_id, fit_id, law, family_key, family, source_run_id, target_json, "
    "plan_json, config_json, out_dir, predicted_loss, band_lo, band_hi, run_id";

PromotionRecord Read(Statement& s) {
  PromotionRecord p;
  p.id = s.Int(0);
  p.created_at = s.Real(1);
  p.sweep_id = s.OptInt(2);
  p.fit_id = s.OptInt(3);
  p.law = s.Text(4);
  p.family_key = s.Text(5);
  p.family = s.Text(6);
  p.source_run_id = s.OptInt(7);
  p.target_json = s.Text(8);
  p.plan_json = s.Text(9);
  p.config_json = s.Text(10);
  p.out_dir = s.Text(11);
  p.predicted_loss = s.Real(12);
  p.band_lo = s.Real(13);
  p.band_hi = s.Real(14);
  p.run_id = s.OptInt(15);
  return p;
}

bool HasTable(Connection& db) {
  return db.QueryInt(
             "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND "
             "name = 'promotions'") > 0;
}

std::vector<PromotionRecord> Query(const std::string& path, const std::string& where,
                                   std::optional<int64_t> arg) {
  Connection db = OpenForRead(path);
  std::vector<PromotionRecord> out;
  if (!HasTable(db)) return out;
  Statement s = db.Prepare(std::string("SELECT ") + kColumns + " FROM promotions " + where +
                           " ORDER BY id DESC");
  if (arg) s.Bind(1, *arg);
  while (s.Step()) out.push_back(Read(s));
  return out;
}

}  // namespace

int64_t SavePromotion(const std::string& path, const PromotionRecord& p) {
  Connection db = OpenForWrite(path);  // migration 5 creates the table
  Statement s = db.Prepare(
      "INSERT INTO promotions (created_at, sweep_id, fit_id, law, family_key, family, "
      "source_run_id, target_json, plan_json, config_json, out_dir, predicted_loss, band_lo, "
      "band_hi, run_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
  s.BindAll(UnixNow(), p.sweep_id, p.fit_id, p.law, p.family_key, p.family, p.source_run_id,
            p.target_json, p.plan_json, p.config_json, p.out_dir, p.predicted_loss, p.band_lo,
            p.band_hi, p.run_id);
  s.Run();
  return db.last_insert_rowid();
}

void LinkPromotionRun(const std::string& path, int64_t promotion_id, int64_t run_id) {
  Connection db = OpenForWrite(path);  // migration 5 creates the table
  Statement s = db.Prepare("UPDATE promotions SET run_id = ? WHERE id = ?");
  s.Bind(1, run_id).Bind(2, promotion_id);
  s.Run();
}

void SetPromotionOutDir(const std::string& path, int64_t promotion_id, const std::string& out_dir) {
  Connection db = OpenForWrite(path);
  Statement s = db.Prepare("UPDATE promotions SET out_dir = ? WHERE id = ?");
  s.Bind(1, out_dir).Bind(2, promotion_id);
  s.Run();
}

std::vector<PromotionRecord> ListPromotions(const std::string& path) {
  return Query(path, "", std::nullopt);
}

std::optional<PromotionRecord> GetPromotion(const std::string& path, int64_t id) {
  auto v = Query(path, "WHERE id = ?", id);
  if (v.empty()) return std::nullopt;
  return v.front();
}

std::optional<PromotionRecord> PromotionOfRun(const std::string& path, int64_t run_id) {
  auto v = Query(path, "WHERE run_id = ?", run_id);
  if (v.empty()) return std::nullopt;
  return v.front();
}

}  // namespace moelab::db
