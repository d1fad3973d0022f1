#include "db/merge.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <optional>

#include "db/schema.h"

namespace moelab::db {

namespace {

// Columns of a main-schema table, so the copies follow future migrations without edits here.
std::vector<std::string> Columns(Connection& db, const std::string& table) {
  Statement st = db.Prepare(fmt::format("SELECT name FROM pragma_table_info('{}')", table));
  std::vector<std::string> cols;
  while (st.Step()) cols.push_back(st.Text(0));
  return cols;
}

std::string Without(const std::vector<std::string>& cols, const std::string& drop,
                    const std::string& prefix = "") {
  std::vector<std::string> kept;
  for (const std::string& c : cols) {
    if (c != drop) kept.push_back(prefix + c);
  }
  return fmt::format("{}", fmt::join(kept, ", "));
}

// Copies src's promotions that main lacks (matched by creation time, plan and config). A run
// reference is mapped through the config hash: the destination run of the same hash is the
// imported copy or the run that made the import unnecessary.
template <typename MapSweep>
void MergePromotions(Connection& db, MapSweep& map_sweep, MergeResult& result) {
  // The references mean nothing here: inserted as NULL, re-linked below.
  std::vector<std::string> kept, select;
  for (const std::string& c : Columns(db, "promotions")) {
    if (c == "id") continue;
    kept.push_back(c);
    const bool ref = c == "sweep_id" || c == "fit_id" || c == "run_id" || c == "source_run_id";
    select.push_back(ref ? "NULL" : c);
  }
  const std::string cols = fmt::format("{}", fmt::join(kept, ", "));
  const std::string values = fmt::format("{}", fmt::join(select, ", "));
  Statement promos = db.Prepare(
      "SELECT s.id, s.sweep_id, EXISTS (SELECT 1 FROM main.promotions m WHERE m.created_at = "
      "s.created_at AND m.plan_json = s.plan_json AND m.config_json = s.config_json) "
      "FROM src.promotions s ORDER BY s.id");
  while (promos.Step()) {
    const int64_t src_id = promos.Int(0);
    const std::optional<int64_t> src_sweep = promos.OptInt(1);
    if (promos.Int(2)) {
      ++result.promotions_skipped;
      continue;
    }
    db.Prepare(fmt::format("INSERT INTO main.promotions ({}) SELECT {} FROM src.promotions WHERE "
                           "id = ?1",
                           cols, values))
        .Bind(1, src_id)
        .Run();
    const int64_t dst_id = db.last_insert_rowid();
    // Runs by config hash (NULL when the destination has no such run), no fit, sweep by name.
    for (const char* col : {"run_id", "source_run_id"}) {
      db.Prepare(fmt::format("UPDATE main.promotions SET {0} = (SELECT m.id FROM main.runs m JOIN "
                             "src.runs s ON s.config_hash = m.config_hash JOIN src.promotions p ON "
                             "p.{0} = s.id WHERE p.id = ?1 ORDER BY m.id LIMIT 1) WHERE id = ?2",
                             col))
          .Bind(1, src_id)
          .Bind(2, dst_id)
          .Run();
    }
    db.Prepare("UPDATE main.promotions SET sweep_id = ?2 WHERE id = ?1")
        .Bind(1, dst_id)
        .Bind(2, src_sweep ? std::optional<int64_t>(map_sweep(*src_sweep)) : std::nullopt)
        .Run();
    ++result.promotions_imported;
  }
}

// Copies src's adaptive histories (MergeResult, merge.h): per sweep, the batches dst lacks with
// their looks, unless a batch both hold chose other runs (a conflict, reported, nothing copied).
template <typename MapSweep>
void MergeAdaptive(Connection& db, MapSweep& map_sweep, MergeResult& result) {
  std::vector<std::pair<int64_t, std::string>> sweeps;  // src id, name
  {
    Statement st = db.Prepare(
        "SELECT DISTINCT b.sweep_id, s.name FROM src.adaptive_batches b JOIN src.sweeps s ON "
        "s.id = b.sweep_id ORDER BY b.sweep_id");
    while (st.Step()) sweeps.emplace_back(st.Int(0), st.Text(1));
  }
  const std::string batch_cols = Without(Columns(db, "adaptive_batches"), "sweep_id");
  const std::string look_cols = Without(Columns(db, "adaptive_looks"), "sweep_id");
  for (const auto& [src_sweep, name] : sweeps) {
    const int64_t dst_sweep = map_sweep(src_sweep);
    Statement differ = db.Prepare(
        "SELECT COUNT(*) FROM src.adaptive_batches s JOIN main.adaptive_batches m ON m.batch = "
        "s.batch AND m.sweep_id = ?2 WHERE s.sweep_id = ?1 AND m.runs_json != s.runs_json");
    differ.Bind(1, src_sweep).Bind(2, dst_sweep);
    differ.Step();
    if (differ.Int(0) > 0) {
      result.adaptive_conflicts.push_back(name);
      continue;
    }
    Statement held = db.Prepare(
        "SELECT COUNT(*) FROM src.adaptive_batches s JOIN main.adaptive_batches m ON m.batch = "
        "s.batch AND m.sweep_id = ?2 WHERE s.sweep_id = ?1");
    held.Bind(1, src_sweep).Bind(2, dst_sweep);
    held.Step();
    result.adaptive_batches_skipped += static_cast<int>(held.Int(0));
    // The looks first, keyed by the batches about to be copied (a batch's look may be missing:
    // the sweep was killed before it).
    db.Prepare(fmt::format(
                   "INSERT INTO main.adaptive_looks (sweep_id, {0}) SELECT ?2, {0} FROM "
                   "src.adaptive_looks l WHERE l.sweep_id = ?1 AND NOT EXISTS (SELECT 1 FROM "
                   "main.adaptive_batches m WHERE m.sweep_id = ?2 AND m.batch = l.batch) AND NOT "
                   "EXISTS (SELECT 1 FROM main.adaptive_looks m WHERE m.sweep_id = ?2 AND m.batch "
                   "= l.batch)",
                   look_cols))
        .Bind(1, src_sweep)
        .Bind(2, dst_sweep)
        .Run();
    db.Prepare(
          fmt::format("INSERT INTO main.adaptive_batches (sweep_id, {0}) SELECT ?2, {0} FROM "
                      "src.adaptive_batches b WHERE b.sweep_id = ?1 AND NOT EXISTS (SELECT 1 FROM "
                      "main.adaptive_batches m WHERE m.sweep_id = ?2 AND m.batch = b.batch)",
                      batch_cols))
        .Bind(1, src_sweep)
        .Bind(2, dst_sweep)
        .Run();
    result.adaptive_batches_imported += db.changes();
  }
}

}  // namespace

MergeResult MergeDatabase(const std::string& dst_path, const std::string& src_path) {
  // Validates the source (exists, is moelab, same schema version) with a clear message.
  { OpenForRead(src_path); }
  Connection db = OpenForWrite(dst_path);
  db.Prepare("ATTACH DATABASE ?1 AS src").Bind(1, src_path).Run();
  MergeResult result;
  db.Exec("BEGIN IMMEDIATE");
  try {
    std::map<int64_t, int64_t> sweep_map;
    auto map_sweep = [&](int64_t src_sweep) -> int64_t {
      if (auto it = sweep_map.find(src_sweep); it != sweep_map.end()) return it->second;
      db.Prepare(
            "INSERT INTO main.sweeps (name, spec_json, created_at) SELECT name, spec_json, "
            "created_at FROM src.sweeps WHERE id = ?1 ON CONFLICT (name) DO NOTHING")
          .Bind(1, src_sweep)
          .Run();
      Statement st = db.Prepare(
          "SELECT m.id FROM main.sweeps m JOIN src.sweeps s ON s.name = m.name WHERE s.id = ?1");
      st.Bind(1, src_sweep);
      const int64_t id = st.Step() ? st.Int(0) : 0;
      sweep_map[src_sweep] = id;
      return id;
    };

    const std::vector<std::string> run_columns = Columns(db, "runs");
    const std::string run_cols = Without(run_columns, "id");
    // The source's sweep ids mean nothing here; the sweep is re-linked by name below.
    std::string run_select;
    {
      std::vector<std::string> sel;
      for (const std::string& c : run_columns) {
        if (c != "id") sel.push_back(c == "sweep_id" ? "NULL" : c);
      }
      run_select = fmt::format("{}", fmt::join(sel, ", "));
    }
    const char* kPerRunTables[] = {"run_summary", "run_vars",      "steps",      "evals",
                                   "max_logits",  "expert_counts", "clip_events"};
    std::map<std::string, std::string> table_cols;
    for (const char* t : kPerRunTables) table_cols[t] = Without(Columns(db, t), "run_id");

    Statement runs = db.Prepare(
        "SELECT s.id, s.sweep_id, EXISTS (SELECT 1 FROM main.runs m WHERE m.config_hash = "
        "s.config_hash) FROM src.runs s ORDER BY s.id");
    while (runs.Step()) {
      const int64_t src_id = runs.Int(0);
      const std::optional<int64_t> src_sweep = runs.OptInt(1);
      if (runs.Int(2)) {
        ++result.skipped;
        continue;
      }
      db.Prepare(fmt::format("INSERT INTO main.runs ({}) SELECT {} FROM src.runs WHERE id = ?1",
                             run_cols, run_select))
          .Bind(1, src_id)
          .Run();
      const int64_t dst_id = db.last_insert_rowid();
      if (src_sweep) {
        db.Prepare("UPDATE main.runs SET sweep_id = ?2 WHERE id = ?1")
            .Bind(1, dst_id)
            .Bind(2, map_sweep(*src_sweep))
            .Run();
      }
      for (const char* t : kPerRunTables) {
        db.Prepare(
              fmt::format("INSERT INTO main.{0} (run_id, {1}) SELECT ?2, {1} FROM src.{0} WHERE "
                          "run_id = ?1",
                          t, table_cols[t]))
            .Bind(1, src_id)
            .Bind(2, dst_id)
            .Run();
      }
      result.id_map.emplace_back(src_id, dst_id);
      ++result.imported;
    }
    runs = Statement();
    MergePromotions(db, map_sweep, result);
    MergeAdaptive(db, map_sweep, result);
    db.Exec("COMMIT");
  } catch (...) {
    sqlite3_exec(db.get(), "ROLLBACK", nullptr, nullptr, nullptr);
    sqlite3_exec(db.get(), "DETACH DATABASE src", nullptr, nullptr, nullptr);
    throw;
  }
  db.Exec("DETACH DATABASE src");
  return result;
}

}  // namespace moelab::db
