// `moelab sweep status` (sweeps/runner.h PrintStatus): each sweep's runs by status, and for one
// sweep a table of its runs with step, loss, failures and the last error or branch.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "db/reader.h"
#include "sweeps/runner.h"
#include "sweeps/slurm.h"
#include "sweeps/spec.h"
#include "sweeps/store.h"

namespace moelab::sweeps {

namespace fs = std::filesystem;

void PrintStatus(const std::string& db_path, const std::string& name, std::FILE* out) {
  Store store(db_path, Store::Mode::kReadOnly);
  db::Reader reader(db_path);
  std::map<int64_t, db::RunRow> rows;
  for (const db::RunRow& r : reader.ListRuns(kStaleAfterS)) rows[r.id] = r;
  std::vector<SweepRow> sweeps;
  if (name.empty()) {
    sweeps = store.ListSweeps();
  } else {
    std::string n = name;
    if (fs::is_regular_file(name)) n = LoadSpecFile(name)["name"].get<std::string>();
    const auto row = store.FindSweep(n);
    if (!row) throw SpecError(fmt::format("no sweep named '{}' in {}", n, db_path));
    sweeps.push_back(*row);
  }
  for (const SweepRow& s : sweeps) {
    const std::vector<Member> members = store.Members(s.id);
    std::map<std::string, int> counts;
    for (const Member& m : members)
      counts[rows.count(m.run_id) ? ToString(rows[m.run_id].effective_status) : "?"]++;
    std::string summary;
    for (const auto& [k, v] : counts)
      summary += fmt::format("{}{} {}", summary.empty() ? "" : ", ", v, k);
    fmt::print(out, "sweep {} (id {}): {} runs: {}\n", s.name, s.id, members.size(), summary);
    PrintSlurmJobs(db_path, s.name, out);  // jobs submitted by `sweep slurm --submit`
    if (!name.empty()) {
      // Full names (a cut name can make two runs look the same); "-" for what a run has not
      // recorded yet (an unstarted run has no loss, which printed as "nan").
      size_t name_width = 4;
      for (const Member& m : members)
        if (rows.count(m.run_id)) name_width = std::max(name_width, rows[m.run_id].name.size());
      const auto metric = [](const std::optional<double>& v) {
        return v && std::isfinite(*v) ? fmt::format("{:.4f}", *v) : std::string("-");
      };
      fmt::print(out, "  {:>4} {:>5} {:<{}} {:<9} {:>13} {:>8} {:>8} {:>5} {:>5}  {}\n", "idx",
                 "run", "name", name_width, "status", "step", "loss", "val", "ranks", "fails",
                 "last error / branch");
      for (const Member& m : members) {
        if (!rows.count(m.run_id)) continue;
        const db::RunRow& r = rows[m.run_id];
        std::string note;
        if (!m.errors.empty()) note = m.errors.back().value("error", "");
        if (note.empty() && m.branch_of) {
          note =
              fmt::format("branch of run {} at step {}", *m.branch_of, m.branch_step.value_or(0));
        }
        if (note.empty() && r.stale) note = "heartbeat stale: the trainer is gone";
        fmt::print(out, "  {:>4} {:>5} {:<{}} {:<9} {:>6}/{:<6} {:>8} {:>8} {:>5} {:>5}  {}\n",
                   m.idx, r.id, r.name, name_width, ToString(r.effective_status), r.last_step,
                   r.shape.total_steps, metric(r.last_loss), metric(r.last_val_loss), r.ranks,
                   m.failures, note.substr(0, 100));
      }
    }
  }
  if (sweeps.empty()) fmt::print(out, "no sweeps in {}\n", db_path);
}

}  // namespace moelab::sweeps
