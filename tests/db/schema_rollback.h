// Shared by the migration tests (tests/db/db_test.cc, tests/cli/cli_test.cc): a database rolled
// back to an older schema, as a file an older moelab wrote would be.
#pragma once

#include "db/sqlite.h"

namespace moelab::db::test_schema {

// Undoes migrations 7 to 9 (runs.uuid and its index; runs.threads and
// runs.nondeterministic_from_step; the adaptive tables) and marks the file schema 6.
inline void RollBackToSchema6(Connection& c) {
  c.Exec("DROP INDEX runs_uuid");
  c.Exec("ALTER TABLE runs DROP COLUMN uuid");
  c.Exec("ALTER TABLE runs DROP COLUMN threads");  // schema 8
  c.Exec("ALTER TABLE runs DROP COLUMN nondeterministic_from_step");
  c.Exec("DROP TABLE adaptive_batches");  // schema 9
  c.Exec("DROP TABLE adaptive_looks");
  c.Exec("PRAGMA user_version = 6");
}

}  // namespace moelab::db::test_schema
