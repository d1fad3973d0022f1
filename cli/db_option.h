// The one `--db` rule of every `moelab` command: the same default file, and the same promise.
// Commands that write create the file and its folder when missing (db::OpenForWrite); commands
// that only read need it to exist and say so.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace moelab::cli {

inline constexpr const char* kDefaultDb = "moelab.db";

enum class DbAccess { kWrite, kRead, kReadIfPresent };

// Adds `--db FILE` to cmd, with *path set to kDefaultDb (shown in --help) and a help text that
// states the rule for `access`.
CLI::Option* AddDbOption(CLI::App* cmd, std::string* path, DbAccess access);

}  // namespace moelab::cli
