// The moelab database schema: numbered migrations tracked in PRAGMA user_version, and the
// connection settings every moelab process uses (WAL, synchronous=NORMAL, busy timeout,
// foreign keys). docs/database.md describes the tables.
#pragma once

#include <string>

#include "db/sqlite.h"

namespace moelab::db {

// The schema version this build writes and reads (= number of migrations).
int SchemaVersion();

// Opens (creating if needed) a database for writing and brings its schema up to date. Safe to
// call from several processes at once: each migration runs in its own BEGIN IMMEDIATE
// transaction that re-checks user_version, so exactly one process applies it.
Connection OpenForWrite(const std::string& path, double busy_timeout_s = 10.0);

// Opens an existing database read-only. Never takes write locks, so it may poll a file that
// trainers are writing. Throws a clear error when the file is missing, is not a moelab
// database, or has a schema this build does not know.
Connection OpenForRead(const std::string& path, double busy_timeout_s = 10.0);

// Applies pending migrations to an open read-write connection; returns how many ran.
int Migrate(Connection& db);

// Runs PRAGMA integrity_check; returns "ok" or SQLite's description of the damage.
std::string IntegrityCheck(const std::string& path);

}  // namespace moelab::db
