#include "cli/db_option.h"

namespace moelab::cli {

CLI::Option* AddDbOption(CLI::App* cmd, std::string* path, DbAccess access) {
  *path = kDefaultDb;
  return cmd
      ->add_option("--db", *path,
                   access == DbAccess::kWrite  ? "SQLite database file (created, with its "
                                                 "folder, if missing)"
                   : access == DbAccess::kRead ? "SQLite database file (must exist)"
                                               : "SQLite database file (read when it exists)")
      ->capture_default_str();
}

}  // namespace moelab::cli
