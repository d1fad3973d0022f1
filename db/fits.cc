#include "db/fits.h"

#include "db/schema.h"
#include "db/sqlite.h"

namespace moelab::db {

namespace {

SweepRow ReadSweep(Statement& s) {
  SweepRow r;
  r.id = s.Int(0);
  r.name = s.Text(1);
  r.created_at = s.Real(2);
  r.runs = static_cast<int>(s.Int(3));
  return r;
}

constexpr const char* kSweepSelect =
    "SELECT s.id, s.name, s.created_at, (SELECT COUNT(*) FROM runs r WHERE r.sweep_id = s.id) "
    "FROM sweeps s ";

}  // namespace

std::vector<SweepRow> ListSweeps(const std::string& path) {
  Connection db = OpenForRead(path);
  Statement s = db.Prepare(std::string(kSweepSelect) + "ORDER BY s.id");
  std::vector<SweepRow> out;
  while (s.Step()) out.push_back(ReadSweep(s));
  return out;
}

std::optional<SweepRow> FindSweep(const std::string& path, const std::string& name) {
  Connection db = OpenForRead(path);
  Statement s = db.Prepare(std::string(kSweepSelect) + "WHERE s.name = ?");
  s.Bind(1, name);
  if (s.Step()) return ReadSweep(s);
  return std::nullopt;
}

int64_t SaveFit(const std::string& path, const FitRecord& fit) {
  Connection db = OpenForWrite(path);
  Statement s = db.Prepare(
      "INSERT INTO fits (sweep_id, created_at, family_key, form, options_json, inputs_json, "
      "result_json, bootstrap_seed) VALUES (?, ?, ?, ?, ?, ?, ?, ?)");
  s.BindAll(fit.sweep_id, UnixNow(), fit.family_key, fit.form, fit.options_json, fit.inputs_json,
            fit.result_json, static_cast<int64_t>(fit.bootstrap_seed));
  s.Run();
  return db.last_insert_rowid();
}

std::vector<FitRecord> ListFits(const std::string& path, std::optional<int64_t> sweep_id) {
  Connection db = OpenForRead(path);
  Statement s = db.Prepare(
      "SELECT id, sweep_id, created_at, family_key, form, options_json, inputs_json, "
      "result_json, bootstrap_seed FROM fits " +
      std::string(sweep_id ? "WHERE sweep_id = ? " : "") + "ORDER BY id DESC");
  if (sweep_id) s.Bind(1, *sweep_id);
  std::vector<FitRecord> out;
  while (s.Step()) {
    FitRecord f;
    f.id = s.Int(0);
    f.sweep_id = s.OptInt(1);
    f.created_at = s.Real(2);
    f.family_key = s.Text(3);
    f.form = s.Text(4);
    f.options_json = s.Text(5);
    f.inputs_json = s.Text(6);
    f.result_json = s.Text(7);
    f.bootstrap_seed = static_cast<uint64_t>(s.Int(8));
    out.push_back(std::move(f));
  }
  return out;
}

}  // namespace moelab::db
