// Read-only, memory-mapped access to the uint16 token shards written by PrepareCorpus. The shards
// of one split are read as a single concatenated stream, so windows may straddle shard files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace moelab {

// One file mapped read-only for the object's lifetime (move-only).
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void Release();
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// A run of uint16 tokens inside a file: `tokens` of them from byte `offset` (a header before it,
// e.g. the 1024 bytes of an llm.c shard); tokens < 0: up to the end of the file.
struct ShardSpan {
  std::string path;
  int64_t offset = 0;
  int64_t tokens = -1;
};

// The token stream formed by concatenating uint16 little-endian shard files (or spans of them)
// in order.
class ShardReader {
 public:
  explicit ShardReader(const std::vector<std::string>& paths);
  explicit ShardReader(const std::vector<ShardSpan>& spans);
  int64_t size() const { return total_; }  // tokens
  uint16_t at(int64_t i) const;
  // Copies tokens [offset, offset + n) into out; the range must lie inside the stream.
  void Read(int64_t offset, int64_t n, int32_t* out) const;

 private:
  std::vector<MappedFile> files_;
  std::vector<const uint8_t*> begins_;  // first token byte of each span inside files_[i]
  std::vector<int64_t> starts_;  // starts_[i] = first token index of files_[i]; back() = total
  int64_t total_ = 0;
};

// The files `inputs` name, in order: a folder stands for its regular files that `keep` accepts,
// sorted by path, and a file for itself. A folder with none throws std::runtime_error with
// no_files_in(input), a path that is neither with not_found(input).
std::vector<std::string> ExpandInputFiles(
    const std::vector<std::string>& inputs,
    const std::function<bool(const std::filesystem::path&)>& keep,
    const std::function<std::string(const std::string&)>& no_files_in,
    const std::function<std::string(const std::string&)>& not_found);

}  // namespace moelab
