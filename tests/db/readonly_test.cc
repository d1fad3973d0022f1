// A database in a folder the reading process cannot write (a shared results folder, a read-only
// mount): every reader opens it without writing anything beside it. The test runs as root here,
// and root writes anywhere, so the reader runs in a child that drops to the unprivileged user.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "db/reader.h"
#include "db/schema.h"
#include "db/writer.h"
#include "tests/common/test_util.h"

namespace moelab::db {
namespace {

namespace fs = std::filesystem;

constexpr uid_t kNobody = 65534;

// Runs body as `nobody` in a child; its exit code (0 = body returned true).
int AsNobody(const std::function<bool()>& body) {
  return test::Wait(test::SpawnFunction([&] {
    if (::setgid(kNobody) != 0 || ::setuid(kNobody) != 0) return 90;
    return body() ? 0 : 1;
  }));
}

class ReadOnlyFolder : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::getuid() != 0) GTEST_SKIP() << "needs root, to read as the unprivileged user nobody";
    tmp_ = std::make_unique<test::TempDir>("readonly");
    folder_ = tmp_->path() / "shared";
    fs::create_directories(folder_);
    path_ = (folder_ / "results.db").string();
    RunInfo info;
    info.name = "r1";
    info.config_json = "{}";
    info.config_hash = "h";
    info.shape = RunShape{1, 1, 0, 0, 10, 10, 1.0, 3};
    auto w = RunWriter::Create(path_, info);  // WAL mode: readers need a -shm beside it
    StepRecord s;
    s.step = 1;
    s.loss = 2.5;
    w->OnStep(s, StepStats{});
    w->OnEnd(RunStatus::kDone, "");
    w.reset();
    // The writer is gone: no -wal or -shm left, and the folder becomes read-only for others.
    ASSERT_FALSE(fs::exists(path_ + "-shm"));
    fs::permissions(tmp_->path(), fs::perms::all, fs::perm_options::replace);  // nobody may enter
    fs::permissions(folder_,
                    fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                        fs::perms::others_read | fs::perms::others_exec,
                    fs::perm_options::replace);
    fs::permissions(path_,
                    fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                        fs::perms::others_read,
                    fs::perm_options::replace);
  }
  std::unique_ptr<test::TempDir> tmp_;
  fs::path folder_;
  std::string path_;
};

TEST_F(ReadOnlyFolder, ReaderOpensItAndWritesNothingBesideIt) {
  const int code = AsNobody([&] {
    Reader reader(path_);
    const auto runs = reader.ListRuns();
    return runs.size() == 1 && runs[0].name == "r1" &&
           reader.GetSeries(runs[0].id, "loss").values.at(0) == 2.5;
  });
  EXPECT_EQ(code, 0) << "the reader failed in a read-only folder (see the test's stderr)";
  EXPECT_FALSE(fs::exists(path_ + "-shm"));
  EXPECT_FALSE(fs::exists(path_ + "-wal"));
}

// A -wal with transactions not merged into the file (a writer killed in a folder that is now
// read-only) cannot be read without writing: the error says what to do instead of SQLite's
// "attempt to write a readonly database".
TEST_F(ReadOnlyFolder, UnmergedWalIsAClearError) {
  {
    // A non-empty -wal, as a killed writer leaves it.
    Connection c(path_, SQLITE_OPEN_READWRITE);
    c.Exec("PRAGMA wal_autocheckpoint = 0");
    c.Exec("UPDATE runs SET name = 'r1b'");
    ASSERT_TRUE(fs::exists(path_ + "-wal"));
    ASSERT_GT(fs::file_size(path_ + "-wal"), 0u);
    // Keep the -wal: copy the files while the connection holds them.
    fs::copy_file(path_, path_ + ".copy");
    fs::copy_file(path_ + "-wal", path_ + ".copy-wal");
  }
  fs::rename(path_ + ".copy", folder_ / "killed.db");
  fs::rename(path_ + ".copy-wal", folder_ / "killed.db-wal");
  fs::permissions(folder_ / "killed.db", fs::perms::others_read | fs::perms::group_read,
                  fs::perm_options::add);
  fs::permissions(folder_ / "killed.db-wal", fs::perms::others_read | fs::perms::group_read,
                  fs::perm_options::add);
  const std::string killed = (folder_ / "killed.db").string();
  const int code = AsNobody([&] {
    try {
      Reader reader(killed);
      return false;
    } catch (const std::exception& e) {
      return std::string(e.what()).find("copy the database together with its -wal") !=
             std::string::npos;
    }
  });
  EXPECT_EQ(code, 0);
}

}  // namespace
}  // namespace moelab::db
