#include "sweeps/adopt.h"

#include <map>
#include <set>

#include "db/reader.h"
#include "sweeps/spec.h"
#include "sweeps/store.h"

namespace moelab::sweeps {

std::vector<Adopted> AdoptRuns(const std::string& db_path, const std::string& sweep_name) {
  std::vector<Adopted> out;
  Store store(db_path);
  std::map<std::string, std::vector<db::RunRow>> by_hash;
  std::map<int64_t, std::string> hash_of;
  for (const db::RunRow& r : db::Reader(db_path).ListRuns()) {
    by_hash[r.config_hash].push_back(r);  // ascending id: the newest last
    hash_of[r.id] = r.config_hash;
  }
  for (const SweepRow& row : store.ListSweeps()) {
    if (!sweep_name.empty() && row.name != sweep_name) continue;
    Sweep sweep;
    try {
      sweep = ExpandSpec(ojson::parse(row.spec_json));
    } catch (const std::exception&) {
      continue;  // a spec this build no longer accepts: nothing to match against
    }
    std::set<std::string> covered;
    for (const Member& m : store.Members(row.id))
      if (hash_of.count(m.run_id)) covered.insert(hash_of[m.run_id]);
    for (const SweepRun* run : sweep.Unique()) {
      if (covered.count(run->hash) || !by_hash.count(run->hash)) continue;
      const std::vector<db::RunRow>& rows = by_hash[run->hash];
      const db::RunRow* pick = &rows.back();
      for (const db::RunRow& r : rows)
        if (r.status == RunStatus::kDone) pick = &r;
      store.Link(row.id, pick->id, run->index, "");
      store.connection()
          .Prepare("UPDATE runs SET sweep_id = ?2 WHERE id = ?1 AND sweep_id IS NULL")
          .Bind(1, pick->id)
          .Bind(2, row.id)
          .Run();
      covered.insert(run->hash);
      out.push_back({row.name, pick->id, run->index, pick->status});
    }
  }
  return out;
}

}  // namespace moelab::sweeps
