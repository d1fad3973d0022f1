#include "core/train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include <fmt/format.h>

namespace moelab {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'M', 'O', 'E', 'C', 'K', 'P', 'T', '1'};

// FNV-1a over the payload: detects truncation and bit rot (not an adversary).
uint64_t Fnv1a(const char* data, size_t n, uint64_t h = 1469598103934665603ull) {
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char>(data[i])) * 1099511628211ull;
  return h;
}

class Writer {
 public:
  void Raw(const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    buf_.insert(buf_.end(), c, c + n);
  }
  template <typename T>
  void Pod(const T& v) {
    Raw(&v, sizeof v);
  }
  void Str(const std::string& s) {
    Pod<uint64_t>(s.size());
    Raw(s.data(), s.size());
  }
  void Floats(std::span<const float> v) {
    Pod<uint64_t>(v.size());
    Raw(v.data(), v.size() * sizeof(float));
  }
  std::vector<char>& buf() { return buf_; }

 private:
  std::vector<char> buf_;
};

class Reader {
 public:
  Reader(const std::vector<char>& buf, const std::string& path) : buf_(buf), path_(path) {}
  void Raw(void* p, size_t n) {
    if (pos_ + n > buf_.size()) throw std::runtime_error(path_ + ": checkpoint is truncated");
    std::memcpy(p, buf_.data() + pos_, n);
    pos_ += n;
  }
  template <typename T>
  T Pod() {
    T v;
    Raw(&v, sizeof v);
    return v;
  }
  std::string Str() {
    const uint64_t n = Pod<uint64_t>();
    if (n > buf_.size()) throw std::runtime_error(path_ + ": checkpoint is corrupt");
    std::string s(n, '\0');
    Raw(s.data(), n);
    return s;
  }
  void Floats(std::span<float> out, const std::string& what) {
    const uint64_t n = Pod<uint64_t>();
    if (n != out.size()) {
      throw std::runtime_error(fmt::format("{}: {} has {} values, the model expects {}", path_,
                                           what, n, out.size()));
    }
    Raw(out.data(), n * sizeof(float));
  }

 private:
  const std::vector<char>& buf_;
  std::string path_;
  size_t pos_ = 0;
};

void FsyncPath(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

int64_t StepOf(const fs::path& p) {
  const std::string name = p.filename().string();
  if (name.rfind("step_", 0) != 0 || p.extension() != ".ckpt") return -1;
  try {
    return std::stoll(name.substr(5, name.size() - 10));
  } catch (...) {
    return -1;
  }
}

std::vector<std::pair<int64_t, fs::path>> ListCheckpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const int64_t step = StepOf(entry.path());
    if (step >= 0) out.push_back({step, entry.path()});
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<char> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open checkpoint");
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

std::string WriteCheckpoint(const std::string& dir, const CheckpointHeader& header,
                            std::span<const float> params, std::span<const float> router_bias,
                            const std::vector<StateBuffer>& optimizer_state, int keep) {
  fs::create_directories(dir);
  Writer w;
  w.Raw(kMagic, sizeof kMagic);
  w.Str(header.config_hash);
  w.Str(header.branch_hash);
  w.Pod(header.step);
  w.Pod(header.tokens);
  w.Pod(header.flops);
  w.Floats(params);
  w.Floats(router_bias);
  w.Pod<uint64_t>(optimizer_state.size());
  for (const StateBuffer& s : optimizer_state) {
    w.Str(s.name);
    w.Floats(*s.data);
  }
  const uint64_t sum = Fnv1a(w.buf().data(), w.buf().size());
  w.Pod(sum);

  const std::string path = fmt::format("{}/step_{:09d}.ckpt", dir, header.step);
  const std::string tmp = path + ".tmp";
  {
    FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f) throw std::runtime_error(tmp + ": cannot create checkpoint: " + std::strerror(errno));
    const bool ok = std::fwrite(w.buf().data(), 1, w.buf().size(), f) == w.buf().size() &&
                    std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
    std::fclose(f);
    if (!ok) {
      std::remove(tmp.c_str());
      throw std::runtime_error(tmp + ": writing the checkpoint failed: " + std::strerror(errno));
    }
  }
  fs::rename(tmp, path);
  FsyncPath(dir, O_RDONLY | O_DIRECTORY);

  auto all = ListCheckpoints(dir);
  for (size_t i = 0; i + keep < all.size(); ++i) fs::remove(all[i].second);
  return path;
}

CheckpointHeader ReadCheckpoint(const std::string& path, const std::string& expected_hash,
                                std::span<float> params, std::span<float> router_bias,
                                const std::vector<StateBuffer>& optimizer_state,
                                bool match_branch) {
  const std::vector<char> buf = ReadAll(path);
  if (buf.size() < sizeof kMagic + sizeof(uint64_t) ||
      std::memcmp(buf.data(), kMagic, sizeof kMagic) != 0) {
    throw std::runtime_error(path + ": not a moelab checkpoint");
  }
  uint64_t stored = 0;
  std::memcpy(&stored, buf.data() + buf.size() - sizeof stored, sizeof stored);
  if (Fnv1a(buf.data(), buf.size() - sizeof stored) != stored) {
    throw std::runtime_error(path + ": checkpoint checksum mismatch (corrupt or truncated)");
  }
  Reader r(buf, path);
  char magic[8];
  r.Raw(magic, sizeof magic);
  CheckpointHeader h;
  h.config_hash = r.Str();
  h.branch_hash = r.Str();
  const std::string& got = match_branch ? h.branch_hash : h.config_hash;
  if (!expected_hash.empty() && got != expected_hash) {
    throw std::runtime_error(fmt::format(
        "{}: checkpoint is of {} {}, not {}", path,
        match_branch ? "a config family (all but length)" : "config", got.substr(0, 12),
        expected_hash.substr(0, 12)));
  }
  h.step = r.Pod<int64_t>();
  h.tokens = r.Pod<int64_t>();
  h.flops = r.Pod<double>();
  r.Floats(params, "params");
  r.Floats(router_bias, "router bias");
  const uint64_t n = r.Pod<uint64_t>();
  if (n != optimizer_state.size()) {
    throw std::runtime_error(fmt::format("{}: {} optimizer buffers, expected {}", path, n,
                                         optimizer_state.size()));
  }
  for (const StateBuffer& s : optimizer_state) {
    const std::string name = r.Str();
    if (name != s.name) {
      throw std::runtime_error(
          fmt::format("{}: optimizer buffer '{}' where '{}' was expected", path, name, s.name));
    }
    r.Floats(*s.data, name);
  }
  return h;
}

std::string LatestCheckpoint(const std::string& dir) {
  auto all = ListCheckpoints(dir);
  return all.empty() ? "" : all.back().second.string();
}

std::vector<std::string> CheckpointsNewestFirst(const std::string& dir) {
  std::vector<std::string> out;
  auto all = ListCheckpoints(dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) out.push_back(it->second.string());
  return out;
}

std::string ReadNewestValidCheckpoint(const std::string& dir, const std::string& expected_hash,
                                      std::span<float> params, std::span<float> router_bias,
                                      const std::vector<StateBuffer>& optimizer_state,
                                      CheckpointHeader* header,
                                      const std::function<void(const std::string&)>& warn) {
  const std::vector<std::string> all = CheckpointsNewestFirst(dir);
  std::string errors;
  for (const std::string& path : all) {
    try {
      *header = ReadCheckpoint(path, expected_hash, params, router_bias, optimizer_state);
      return path;
    } catch (const std::exception& e) {
      if (warn) warn(fmt::format("skipping checkpoint {}: {}", path, e.what()));
      errors += fmt::format("\n  {}", e.what());
    }
  }
  if (!all.empty()) {
    throw std::runtime_error(
        fmt::format("no valid checkpoint in {} ({} tried):{}", dir, all.size(), errors));
  }
  return "";
}

int64_t CheckpointStepOf(const std::string& path) { return StepOf(fs::path(path)); }

std::string CheckpointAtStep(const std::string& dir, int64_t step) {
  for (const auto& [s, p] : ListCheckpoints(dir))
    if (s == step) return p.string();
  return "";
}

}  // namespace moelab
