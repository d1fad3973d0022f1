// A thin RAII layer over the SQLite C API used by the writer and the reader. Every failure
// becomes a SqliteError naming the operation, the SQL and SQLite's own message, so a caller
// several layers up still sees what went wrong and where.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace moelab::db {

class SqliteError : public std::runtime_error {
 public:
  SqliteError(const std::string& what, int code) : std::runtime_error(what), code_(code) {}
  // The extended result code (SQLITE_BUSY, SQLITE_CORRUPT, ...).
  int code() const { return code_; }
  bool busy() const { return (code_ & 0xff) == SQLITE_BUSY || (code_ & 0xff) == SQLITE_LOCKED; }

 private:
  int code_;
};

class Statement {
 public:
  Statement() = default;
  Statement(sqlite3* db, const std::string& sql);
  ~Statement();
  Statement(Statement&& other) noexcept;
  Statement& operator=(Statement&& other) noexcept;
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  // Binds by 1-based index. Chainable so one call site reads like the SQL it fills.
  Statement& Bind(int index, int64_t value);
  Statement& Bind(int index, int value) { return Bind(index, static_cast<int64_t>(value)); }
  Statement& Bind(int index, double value);
  Statement& Bind(int index, const std::string& value);
  Statement& Bind(int index, const char* value);
  Statement& BindNull(int index);
  Statement& BindBlob(int index, const void* data, size_t bytes);
  template <typename T>
  Statement& Bind(int index, const std::optional<T>& value) {
    return value ? Bind(index, *value) : BindNull(index);
  }
  // Binds ?1, ?2, ... in order: one call for a row whose parameters follow the column list,
  // each value taking the same Bind overload it would take alone.
  template <typename... Ts>
  Statement& BindAll(const Ts&... values) {
    int index = 0;
    (Bind(++index, values), ...);
    return *this;
  }

  // Returns true while a row is available, false when done.
  bool Step();
  // Runs a statement that returns no rows, then resets it for reuse.
  void Run();
  void Reset();

  bool IsNull(int col) const;
  int64_t Int(int col) const;
  // NULL reads as NaN: SQLite stores a NaN double as NULL, and a missing metric is not zero.
  double Real(int col) const;
  std::string Text(int col) const;
  std::optional<int64_t> OptInt(int col) const;
  std::optional<double> OptReal(int col) const;
  std::span<const std::byte> Blob(int col) const;

  const std::string& sql() const { return sql_; }

 private:
  [[noreturn]] void Fail(const char* op, int rc) const;
  sqlite3* db_ = nullptr;
  sqlite3_stmt* stmt_ = nullptr;
  std::string sql_;
};

class Connection {
 public:
  Connection() = default;
  // flags: SQLITE_OPEN_READONLY or SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE.
  Connection(const std::string& path, int flags);
  ~Connection();
  Connection(Connection&& other) noexcept;
  Connection& operator=(Connection&& other) noexcept;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  void Exec(const std::string& sql);
  Statement Prepare(const std::string& sql) { return Statement(db_, sql); }
  // The single integer of a one-row, one-column query (PRAGMA user_version, COUNT(*), ...).
  int64_t QueryInt(const std::string& sql);
  int64_t last_insert_rowid() const { return sqlite3_last_insert_rowid(db_); }
  int changes() const { return sqlite3_changes(db_); }
  sqlite3* get() const { return db_; }
  const std::string& path() const { return path_; }

 private:
  sqlite3* db_ = nullptr;
  std::string path_;
};

// Opens `path` with SQLITE_OPEN_READONLY. A WAL database needs its -shm index, which SQLite
// creates beside the file even for a read-only connection; in a folder this process cannot
// write (a shared results folder, a read-only mount) that fails with "attempt to write a
// readonly database". Such a file is opened as immutable instead (nobody can be writing it
// there either); when it has a non-empty -wal, whose transactions immutable mode would not see,
// the error says to copy the database to a writable folder.
// busy_timeout_s is set on the connection before its first read (a writer may hold a lock).
Connection OpenReadOnly(const std::string& path, double busy_timeout_s = 10.0);

// Seconds since the Unix epoch, as stored in every *_at column.
double UnixNow();

// Runs body inside BEGIN IMMEDIATE ... COMMIT, rolled back when it throws. busy_timeout already
// waits for the lock; a busy failure all the same (a long checkpoint, many writers) retries the
// whole transaction up to `retries` times, 50 ms << min(attempt, max_backoff_shift) apart,
// because giving up would lose the write.
void WriteTransaction(Connection& db, int retries, const std::function<void()>& body,
                      int max_backoff_shift = 6);

}  // namespace moelab::db
