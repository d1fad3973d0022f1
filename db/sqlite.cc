#include "db/sqlite.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <thread>
#include <utility>

namespace moelab::db {

namespace {

SqliteError MakeError(sqlite3* db, const std::string& op, const std::string& sql, int rc) {
  const int code = db ? sqlite3_extended_errcode(db) : rc;
  const char* msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  std::string what = fmt::format("SQLite error during {}: {} (code {})", op, msg, code);
  if (!sql.empty()) what += fmt::format(" [SQL: {}]", sql);
  return SqliteError(what, code);
}

}  // namespace

double UnixNow() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

// ---- Statement ----------------------------------------------------------------------------

Statement::Statement(sqlite3* db, const std::string& sql) : db_(db), sql_(sql) {
  const int rc = sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt_, nullptr);
  if (rc != SQLITE_OK) throw MakeError(db, "prepare", sql, rc);
}

Statement::~Statement() { sqlite3_finalize(stmt_); }

Statement::Statement(Statement&& other) noexcept
    : db_(std::exchange(other.db_, nullptr)),
      stmt_(std::exchange(other.stmt_, nullptr)),
      sql_(std::move(other.sql_)) {}

Statement& Statement::operator=(Statement&& other) noexcept {
  if (this != &other) {
    sqlite3_finalize(stmt_);
    db_ = std::exchange(other.db_, nullptr);
    stmt_ = std::exchange(other.stmt_, nullptr);
    sql_ = std::move(other.sql_);
  }
  return *this;
}

void Statement::Fail(const char* op, int rc) const { throw MakeError(db_, op, sql_, rc); }

Statement& Statement::Bind(int index, int64_t value) {
  if (int rc = sqlite3_bind_int64(stmt_, index, value); rc != SQLITE_OK) Fail("bind", rc);
  return *this;
}

Statement& Statement::Bind(int index, double value) {
  if (int rc = sqlite3_bind_double(stmt_, index, value); rc != SQLITE_OK) Fail("bind", rc);
  return *this;
}

Statement& Statement::Bind(int index, const std::string& value) {
  const int rc = sqlite3_bind_text(stmt_, index, value.data(), static_cast<int>(value.size()),
                                   SQLITE_TRANSIENT);
  if (rc != SQLITE_OK) Fail("bind", rc);
  return *this;
}

Statement& Statement::Bind(int index, const char* value) {
  return value ? Bind(index, std::string(value)) : BindNull(index);
}

Statement& Statement::BindNull(int index) {
  if (int rc = sqlite3_bind_null(stmt_, index); rc != SQLITE_OK) Fail("bind", rc);
  return *this;
}

Statement& Statement::BindBlob(int index, const void* data, size_t bytes) {
  // A zero-length blob would bind as NULL with a null pointer; keep "empty" distinct from NULL.
  static const char kEmpty = 0;
  const int rc = sqlite3_bind_blob64(stmt_, index, data ? data : &kEmpty, bytes, SQLITE_TRANSIENT);
  if (rc != SQLITE_OK) Fail("bind", rc);
  return *this;
}

bool Statement::Step() {
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  // Reset so the statement is reusable after a retry; the error text comes from the db handle.
  SqliteError err = MakeError(db_, "step", sql_, rc);
  sqlite3_reset(stmt_);
  throw err;
}

void Statement::Run() {
  while (Step()) {
  }
  Reset();
}

void Statement::Reset() {
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
}

bool Statement::IsNull(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }

int64_t Statement::Int(int col) const { return sqlite3_column_int64(stmt_, col); }

double Statement::Real(int col) const {
  if (IsNull(col)) return std::numeric_limits<double>::quiet_NaN();
  return sqlite3_column_double(stmt_, col);
}

std::string Statement::Text(int col) const {
  const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, col));
  return p ? std::string(p, sqlite3_column_bytes(stmt_, col)) : std::string();
}

std::optional<int64_t> Statement::OptInt(int col) const {
  if (IsNull(col)) return std::nullopt;
  return Int(col);
}

std::optional<double> Statement::OptReal(int col) const {
  if (IsNull(col)) return std::nullopt;
  return sqlite3_column_double(stmt_, col);
}

std::span<const std::byte> Statement::Blob(int col) const {
  const auto* p = static_cast<const std::byte*>(sqlite3_column_blob(stmt_, col));
  const int n = sqlite3_column_bytes(stmt_, col);
  return p ? std::span<const std::byte>(p, static_cast<size_t>(n)) : std::span<const std::byte>();
}

// ---- Connection ---------------------------------------------------------------------------

Connection::Connection(const std::string& path, int flags) : path_(path) {
  const int rc = sqlite3_open_v2(path.c_str(), &db_, flags, nullptr);
  if (rc != SQLITE_OK) {
    SqliteError err = MakeError(db_, fmt::format("open of '{}'", path), "", rc);
    sqlite3_close_v2(db_);
    db_ = nullptr;
    throw err;
  }
  sqlite3_extended_result_codes(db_, 1);
}

Connection::~Connection() { sqlite3_close_v2(db_); }

Connection::Connection(Connection&& other) noexcept
    : db_(std::exchange(other.db_, nullptr)), path_(std::move(other.path_)) {}

Connection& Connection::operator=(Connection&& other) noexcept {
  if (this != &other) {
    sqlite3_close_v2(db_);
    db_ = std::exchange(other.db_, nullptr);
    path_ = std::move(other.path_);
  }
  return *this;
}

void Connection::Exec(const std::string& sql) {
  char* msg = nullptr;
  const int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &msg);
  sqlite3_free(msg);
  if (rc != SQLITE_OK) throw MakeError(db_, "exec", sql, rc);
}

int64_t Connection::QueryInt(const std::string& sql) {
  Statement st = Prepare(sql);
  if (!st.Step()) throw SqliteError(fmt::format("query returned no row [SQL: {}]", sql), 0);
  return st.Int(0);
}

namespace {

// A file: URI for sqlite3_open_v2 (SQLITE_OPEN_URI): '%', '?' and '#' must be escaped.
std::string FileUri(const std::string& path, const char* query) {
  std::string uri = "file:";
  for (char c : std::filesystem::absolute(path).string()) {
    if (c == '%' || c == '?' || c == '#') {
      uri += fmt::format("%{:02X}", static_cast<unsigned char>(c));
    } else {
      uri += c;
    }
  }
  return uri + "?" + query;
}

bool CannotWriteBeside(const std::string& path) {
  const std::filesystem::path dir = std::filesystem::absolute(path).parent_path();
  return ::access(dir.c_str(), W_OK) != 0;
}

}  // namespace

Connection OpenReadOnly(const std::string& path, double busy_timeout_s) {
  const int busy_ms = static_cast<int>(busy_timeout_s * 1000);
  {
    Connection db(path, SQLITE_OPEN_READONLY);
    sqlite3_busy_timeout(db.get(), busy_ms);
    try {
      db.QueryInt(
          "PRAGMA schema_version");  // reads the header: fails here when -shm cannot be made
      return db;
    } catch (const SqliteError& e) {
      const int primary = e.code() & 0xff;
      if ((primary != SQLITE_READONLY && primary != SQLITE_CANTOPEN) || !CannotWriteBeside(path)) {
        throw;
      }
    }
  }
  struct stat wal;
  if (::stat((path + "-wal").c_str(), &wal) == 0 && wal.st_size > 0) {
    throw std::runtime_error(fmt::format(
        "database '{}' is in a folder this process cannot write and has a non-empty '{}-wal' "
        "(transactions not yet merged into the file): copy the database together with its -wal "
        "file to a writable folder and read it there",
        path, path));
  }
  Connection db(FileUri(path, "immutable=1"), SQLITE_OPEN_READONLY | SQLITE_OPEN_URI);
  sqlite3_busy_timeout(db.get(), busy_ms);
  return db;
}

void WriteTransaction(Connection& db, int retries, const std::function<void()>& body,
                      int max_backoff_shift) {
  for (int attempt = 0;; ++attempt) {
    try {
      db.Exec("BEGIN IMMEDIATE");
      try {
        body();
        db.Exec("COMMIT");
      } catch (...) {
        if (!sqlite3_get_autocommit(db.get())) {
          sqlite3_exec(db.get(), "ROLLBACK", nullptr, nullptr, nullptr);
        }
        throw;
      }
      return;
    } catch (const SqliteError& e) {
      if (!e.busy() || attempt >= retries) throw;
      std::this_thread::sleep_for(
          std::chrono::milliseconds(50 << std::min(attempt, max_backoff_shift)));
    }
  }
}

}  // namespace moelab::db
