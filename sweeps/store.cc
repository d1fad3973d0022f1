#include "sweeps/store.h"

#include <fmt/format.h>

#include <functional>

#include "db/schema.h"

namespace moelab::sweeps {

using nlohmann::json;

Store::Store(const std::string& db_path) : db_(db::OpenForWrite(db_path)) {}

Store::Store(const std::string& db_path, Mode mode)
    : db_(mode == Mode::kReadOnly ? db::OpenForRead(db_path) : db::OpenForWrite(db_path)) {}

void Store::Transaction(const std::function<void()>& body) {
  // Trainers hold the write lock for one short batch at a time; the busy timeout covers that,
  // and a whole-transaction retry covers a busy timeout that still runs out under load.
  db::WriteTransaction(db_, 8, body, 5);
}

int64_t Store::UpsertSweep(const std::string& name, const std::string& spec_json) {
  int64_t id = 0;
  Transaction([&] {
    db_.Prepare(
           "INSERT INTO sweeps (name, spec_json, created_at) VALUES (?1, ?2, ?3) "
           "ON CONFLICT (name) DO UPDATE SET spec_json = excluded.spec_json")
        .Bind(1, name)
        .Bind(2, spec_json)
        .Bind(3, db::UnixNow())
        .Run();
    db::Statement st = db_.Prepare("SELECT id FROM sweeps WHERE name = ?1");
    st.Bind(1, name);
    if (!st.Step()) throw std::runtime_error("sweep row vanished");
    id = st.Int(0);
  });
  return id;
}

std::optional<SweepRow> Store::FindSweep(const std::string& name) {
  db::Statement st =
      db_.Prepare("SELECT id, name, spec_json, created_at FROM sweeps WHERE name = ?1");
  st.Bind(1, name);
  if (!st.Step()) return std::nullopt;
  return SweepRow{st.Int(0), st.Text(1), st.Text(2), st.Real(3)};
}

std::vector<SweepRow> Store::ListSweeps() {
  db::Statement st = db_.Prepare("SELECT id, name, spec_json, created_at FROM sweeps ORDER BY id");
  std::vector<SweepRow> out;
  while (st.Step()) out.push_back({st.Int(0), st.Text(1), st.Text(2), st.Real(3)});
  return out;
}

std::vector<Member> Store::Members(int64_t sweep_id) {
  db::Statement st = db_.Prepare(
      "SELECT run_id, idx, checkpoint_dir, failures, retryable, errors_json, branch_of, "
      "branch_step FROM sweep_runs WHERE sweep_id = ?1 ORDER BY idx, run_id");
  st.Bind(1, sweep_id);
  std::vector<Member> out;
  while (st.Step()) {
    Member m;
    m.run_id = st.Int(0);
    m.idx = static_cast<int>(st.Int(1));
    m.checkpoint_dir = st.IsNull(2) ? "" : st.Text(2);
    m.failures = static_cast<int>(st.Int(3));
    m.retryable = st.Int(4) != 0;
    m.errors = json::parse(st.Text(5), nullptr, false);
    if (m.errors.is_discarded()) m.errors = json::array();
    m.branch_of = st.OptInt(6);
    m.branch_step = st.OptInt(7);
    out.push_back(std::move(m));
  }
  return out;
}

void Store::Link(int64_t sweep_id, int64_t run_id, int idx, const std::string& checkpoint_dir) {
  Transaction([&] {
    db_.Prepare(
           "INSERT INTO sweep_runs (sweep_id, run_id, idx, checkpoint_dir) VALUES (?1, ?2, ?3, "
           "?4) ON CONFLICT (sweep_id, run_id) DO UPDATE SET idx = excluded.idx")
        .BindAll(sweep_id, run_id, idx, checkpoint_dir)
        .Run();
  });
}

void Store::RecordFailure(int64_t sweep_id, int64_t run_id, const std::string& error,
                          bool retryable) {
  Transaction([&] {
    db::Statement st =
        db_.Prepare("SELECT errors_json FROM sweep_runs WHERE sweep_id = ?1 AND run_id = ?2");
    st.Bind(1, sweep_id).Bind(2, run_id);
    json errors = json::array();
    if (st.Step()) {
      errors = json::parse(st.Text(0), nullptr, false);
      if (!errors.is_array()) errors = json::array();
    }
    errors.push_back({{"at", db::UnixNow()}, {"error", error}});
    db_.Prepare(
           "UPDATE sweep_runs SET failures = failures + 1, retryable = ?3, errors_json = ?4 "
           "WHERE sweep_id = ?1 AND run_id = ?2")
        .BindAll(sweep_id, run_id, retryable ? 1 : 0, errors.dump())
        .Run();
  });
}

void Store::SetBranch(int64_t sweep_id, int64_t run_id, int64_t parent_run, int64_t step) {
  Transaction([&] {
    db_.Prepare(
           "UPDATE sweep_runs SET branch_of = ?3, branch_step = ?4 WHERE sweep_id = ?1 AND "
           "run_id = ?2")
        .BindAll(sweep_id, run_id, parent_run, step)
        .Run();
  });
}

int Store::CopyRowsUpTo(int64_t parent_run, int64_t child_run, int64_t step) {
  int copied = 0;
  Transaction([&] {
    for (const char* table : {"steps", "evals", "max_logits", "expert_counts", "clip_events"}) {
      // Column lists come from the schema itself, so a later migration adding a column to a
      // metric table is copied too.
      std::vector<std::string> cols;
      db::Statement info = db_.Prepare(fmt::format("PRAGMA table_info({})", table));
      while (info.Step()) {
        const std::string c = info.Text(1);
        if (c != "run_id") cols.push_back(c);
      }
      const std::string list = fmt::format("{}", fmt::join(cols, ", "));
      db_.Prepare(fmt::format("INSERT OR IGNORE INTO {0} (run_id, {1}) SELECT ?2, {1} FROM {0} "
                              "WHERE run_id = ?1 AND step <= ?3",
                              table, list))
          .Bind(1, parent_run)
          .Bind(2, child_run)
          .Bind(3, step)
          .Run();
      copied += db_.changes();
    }
  });
  return copied;
}

}  // namespace moelab::sweeps
