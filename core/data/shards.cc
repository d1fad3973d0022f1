#include "core/data/shards.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace moelab {

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(path + ": cannot open: " + std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw std::runtime_error(path + ": cannot stat: " + std::strerror(err));
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {  // mmap rejects length 0; an empty shard simply maps to nothing
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      throw std::runtime_error(path + ": mmap failed: " + std::strerror(err));
    }
    data_ = static_cast<const uint8_t*>(p);
    // Batches are drawn at random offsets; read-ahead would only waste page cache.
    ::madvise(p, size_, MADV_RANDOM);
  }
  ::close(fd);  // the mapping keeps the file alive
}

MappedFile::~MappedFile() { Release(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    Release();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void MappedFile::Release() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

namespace {
std::vector<ShardSpan> WholeFiles(const std::vector<std::string>& paths) {
  std::vector<ShardSpan> spans;
  for (const std::string& p : paths) spans.push_back({p, 0, -1});
  return spans;
}
}  // namespace

ShardReader::ShardReader(const std::vector<std::string>& paths) : ShardReader(WholeFiles(paths)) {}

ShardReader::ShardReader(const std::vector<ShardSpan>& spans) {
  starts_.push_back(0);
  for (const ShardSpan& s : spans) {
    MappedFile f(s.path);
    const int64_t size = static_cast<int64_t>(f.size());
    int64_t tokens = s.tokens;
    if (tokens < 0) {
      if ((size - s.offset) % 2 != 0) {
        throw std::runtime_error(s.path + ": size " + std::to_string(f.size()) +
                                 " is not a whole number of uint16 tokens (truncated shard?)");
      }
      tokens = (size - s.offset) / 2;
    }
    if (s.offset < 0 || s.offset + 2 * tokens > size) {
      throw std::runtime_error(s.path + ": " + std::to_string(tokens) + " tokens from byte " +
                               std::to_string(s.offset) + " do not fit a file of " +
                               std::to_string(size) + " bytes (truncated or replaced shard?)");
    }
    total_ += tokens;
    starts_.push_back(total_);
    begins_.push_back(f.data() == nullptr ? nullptr : f.data() + s.offset);
    files_.push_back(std::move(f));
  }
}

uint16_t ShardReader::at(int64_t i) const {
  int32_t v;
  Read(i, 1, &v);
  return static_cast<uint16_t>(v);
}

void ShardReader::Read(int64_t offset, int64_t n, int32_t* out) const {
  if (offset < 0 || n < 0 || offset + n > total_) {
    throw std::out_of_range("ShardReader::Read: [" + std::to_string(offset) + ", " +
                            std::to_string(offset + n) + ") outside a stream of " +
                            std::to_string(total_) + " tokens");
  }
  // The file holding `offset`: the last start <= offset.
  size_t f = std::upper_bound(starts_.begin(), starts_.end(), offset) - starts_.begin() - 1;
  while (n > 0) {
    int64_t local = offset - starts_[f];
    int64_t take = std::min(n, starts_[f + 1] - offset);
    const uint8_t* p = begins_[f] + 2 * local;
    for (int64_t i = 0; i < take; ++i) {
      out[i] = static_cast<int32_t>(p[2 * i] | (p[2 * i + 1] << 8));  // little-endian on disk
    }
    out += take;
    offset += take;
    n -= take;
    ++f;
  }
}

std::vector<std::string> ExpandInputFiles(
    const std::vector<std::string>& inputs,
    const std::function<bool(const std::filesystem::path&)>& keep,
    const std::function<std::string(const std::string&)>& no_files_in,
    const std::function<std::string(const std::string&)>& not_found) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  for (const std::string& in : inputs) {
    std::error_code ec;
    if (fs::is_directory(in, ec)) {
      std::vector<std::string> found;
      for (const auto& e : fs::directory_iterator(in)) {
        if (e.is_regular_file() && keep(e.path())) found.push_back(e.path());
      }
      std::sort(found.begin(), found.end());
      if (found.empty()) throw std::runtime_error(no_files_in(in));
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::is_regular_file(in, ec)) {
      files.push_back(in);
    } else {
      throw std::runtime_error(not_found(in));
    }
  }
  return files;
}

}  // namespace moelab
