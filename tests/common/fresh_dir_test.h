// Folders for the files the code under test writes: one per test binary, and a fixture with one
// per test. Header-only (unlike test::TempDir in test_util.h) so test folders that start no
// processes need no library.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace moelab::test {

// <tmp>/moelab_<name>_<pid>, emptied and created: a folder for the whole test binary (call it
// once, from a function-local static, so that its tests share it).
inline std::filesystem::path FreshProcessDir(const std::string& name) {
  std::filesystem::path p = std::filesystem::temp_directory_path() /
                            ("moelab_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p;
}

// dir_ is <tmp>/moelab_<prefix>_<pid>_<test name>. It does not exist when the test starts, so
// whatever creates it (the trainer, the checkpoint writer) is part of what the test runs; it is
// removed again at the end.
class FreshDirTest : public ::testing::Test {
 protected:
  explicit FreshDirTest(std::string prefix) : prefix_(std::move(prefix)) {}
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("moelab_" + prefix_ + "_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path dir_;

 private:
  std::string prefix_;
};

}  // namespace moelab::test
