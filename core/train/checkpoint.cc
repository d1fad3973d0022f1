#include "core/train/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "core/printable.h"

namespace moelab {

namespace fs = std::filesystem;

namespace {

// Format 2 adds the run's UUID after the branch hash; format 3 adds a checksum of the header
// (magic to flops) right after it, so choosing and pruning, which read only the header, never
// trust a damaged one. Formats 1 (no UUID) and 2 are still read.
constexpr char kMagic1[8] = {'M', 'O', 'E', 'C', 'K', 'P', 'T', '1'};
constexpr char kMagic2[8] = {'M', 'O', 'E', 'C', 'K', 'P', 'T', '2'};
constexpr char kMagic3[8] = {'M', 'O', 'E', 'C', 'K', 'P', 'T', '3'};
constexpr size_t kMagicSize = sizeof kMagic3;

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
  size_t pos() const { return pos_; }
  void Floats(std::span<float> out, const std::string& what) {
    const uint64_t n = Pod<uint64_t>();
    if (n != out.size()) {
      throw std::runtime_error(
          fmt::format("{}: {} has {} values, the model expects {}", path_, what, n, out.size()));
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

// step_<9 digits>.ckpt (legacy and anonymous runs) or step_<9 digits>.<uuid8>.ckpt: two runs
// sharing an explicit folder never write the same file name.
int64_t StepOf(const fs::path& p) {
  const std::string name = p.filename().string();
  if (name.rfind("step_", 0) != 0 || p.extension() != ".ckpt") return -1;
  const std::string digits = name.substr(5, name.find('.') - 5);
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  try {
    return std::stoll(digits);
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

// The first bytes of a file: enough for any header (three short strings and three numbers).
std::vector<char> ReadPrefix(const std::string& path, size_t n) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open checkpoint");
  std::vector<char> buf(n);
  in.read(buf.data(), static_cast<std::streamsize>(n));
  buf.resize(static_cast<size_t>(in.gcount()));
  return buf;
}

// Checks the magic and returns the format (1, 2 or 3).
int FormatOf(const std::vector<char>& buf, const std::string& path) {
  if (buf.size() >= kMagicSize && std::memcmp(buf.data(), kMagic3, kMagicSize) == 0) return 3;
  if (buf.size() >= kMagicSize && std::memcmp(buf.data(), kMagic2, kMagicSize) == 0) return 2;
  if (buf.size() >= kMagicSize && std::memcmp(buf.data(), kMagic1, kMagicSize) == 0) return 1;
  throw std::runtime_error(path + ": not a moelab checkpoint (corrupt, or another kind of file)");
}

// Everything up to the payload; leaves r at the parameters. Throws "corrupt" when the header
// fails its checksum (format 3) or, in older formats, names a step other than its file name's.
CheckpointHeader ParseHeader(Reader& r, const std::vector<char>& buf, int format,
                             const std::string& path) {
  const auto corrupt = [&](const std::string& why) {
    return std::runtime_error(fmt::format("{}: checkpoint header is corrupt ({})", path, why));
  };
  CheckpointHeader h;
  try {
    char magic[kMagicSize];
    r.Raw(magic, sizeof magic);
    h.config_hash = r.Str();
    h.branch_hash = r.Str();
    if (format >= 2) h.run_uuid = r.Str();
    h.step = r.Pod<int64_t>();
    h.tokens = r.Pod<int64_t>();
    h.flops = r.Pod<double>();
  } catch (const std::runtime_error&) {
    // A damaged string length runs past the end of what was read.
    throw corrupt("a field runs past the end of the header");
  }
  if (format >= 3) {
    const size_t header_end = r.pos();
    if (r.Pod<uint64_t>() != Fnv1a(buf.data(), header_end)) throw corrupt("checksum mismatch");
  } else if (const int64_t named = StepOf(fs::path(path)); named >= 0 && named != h.step) {
    throw corrupt(fmt::format("step {} in a file named for step {}", h.step, named));
  }
  return h;
}

// Names read from a file reach messages escaped: a damaged file's bytes must not garble them.
std::string Short(const std::string& uuid) {
  return uuid.empty() ? "(none)" : PrintableText(uuid.substr(0, 8));
}

}  // namespace

std::string WriteCheckpoint(const std::string& dir, const CheckpointHeader& header,
                            std::span<const float> params, std::span<const float> router_bias,
                            const std::vector<StateBuffer>& optimizer_state, int keep) {
  fs::create_directories(dir);
  Writer w;
  w.Raw(kMagic3, sizeof kMagic3);
  w.Str(header.config_hash);
  w.Str(header.branch_hash);
  w.Str(header.run_uuid);
  w.Pod(header.step);
  w.Pod(header.tokens);
  w.Pod(header.flops);
  w.Pod(Fnv1a(w.buf().data(), w.buf().size()));  // the header's own checksum (format 3)
  w.Floats(params);
  w.Floats(router_bias);
  w.Pod<uint64_t>(optimizer_state.size());
  for (const StateBuffer& s : optimizer_state) {
    w.Str(s.name);
    w.Floats(*s.data);
  }
  const uint64_t sum = Fnv1a(w.buf().data(), w.buf().size());
  w.Pod(sum);

  const std::string path =
      header.run_uuid.empty()
          ? fmt::format("{}/step_{:09d}.ckpt", dir, header.step)
          : fmt::format("{}/step_{:09d}.{}.ckpt", dir, header.step, header.run_uuid.substr(0, 8));
  // Same-named files of two runs (an explicit folder shared by both): never replace the other's.
  std::error_code ec;
  if (fs::exists(path, ec)) {
    std::string owner;
    try {
      owner = ReadCheckpointHeader(path).run_uuid;
    } catch (const std::exception&) {
      owner = header.run_uuid;  // unreadable: a torn file of ours is replaced
    }
    if (owner != header.run_uuid) {
      throw std::runtime_error(fmt::format(
          "{} belongs to run {}, not this run {}: give each run its own checkpoint folder", path,
          Short(owner), Short(header.run_uuid)));
    }
  }
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

  // Prune this run's checkpoints only: another run's (or a legacy) file in the folder stays. So
  // do this run's files beyond this step (a copy of its database went further): they are not
  // counted, and this run's trajectory replaces them when it gets there.
  std::vector<fs::path> own;
  for (const auto& [step, p] : ListCheckpoints(dir)) {
    if (step > header.step) continue;
    try {
      if (ReadCheckpointHeader(p.string()).run_uuid == header.run_uuid) own.push_back(p);
    } catch (const std::exception&) {
      // Not readable: not provably ours, left alone.
    }
  }
  for (size_t i = 0; i + keep < own.size(); ++i) fs::remove(own[i], ec);
  return path;
}

CheckpointHeader ReadCheckpoint(const std::string& path, const std::string& expected_hash,
                                std::span<float> params, std::span<float> router_bias,
                                const std::vector<StateBuffer>& optimizer_state,
                                bool match_branch) {
  const std::vector<char> buf = ReadAll(path);
  const int format = FormatOf(buf, path);
  if (buf.size() < kMagicSize + sizeof(uint64_t)) {
    throw std::runtime_error(path + ": checkpoint is truncated");
  }
  uint64_t stored = 0;
  std::memcpy(&stored, buf.data() + buf.size() - sizeof stored, sizeof stored);
  if (Fnv1a(buf.data(), buf.size() - sizeof stored) != stored) {
    throw std::runtime_error(path + ": checkpoint checksum mismatch (corrupt or truncated)");
  }
  Reader r(buf, path);
  CheckpointHeader h = ParseHeader(r, buf, format, path);
  const std::string& got = match_branch ? h.branch_hash : h.config_hash;
  if (!expected_hash.empty() && got != expected_hash) {
    throw std::runtime_error(
        fmt::format("{}: checkpoint is of {} {}, not {}", path,
                    match_branch ? "a config family (all but length)" : "config",
                    PrintableText(got.substr(0, 12)), expected_hash.substr(0, 12)));
  }
  r.Floats(params, "params");
  r.Floats(router_bias, "router bias");
  const uint64_t n = r.Pod<uint64_t>();
  if (n != optimizer_state.size()) {
    throw std::runtime_error(
        fmt::format("{}: {} optimizer buffers, expected {}", path, n, optimizer_state.size()));
  }
  for (const StateBuffer& s : optimizer_state) {
    const std::string name = r.Str();
    if (name != s.name) {
      throw std::runtime_error(fmt::format("{}: optimizer buffer '{}' where '{}' was expected",
                                           path, PrintableText(name), s.name));
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

CheckpointHeader ReadCheckpointHeader(const std::string& path) {
  const std::vector<char> buf = ReadPrefix(path, 4096);
  Reader r(buf, path);
  return ParseHeader(r, buf, FormatOf(buf, path), path);
}

std::vector<std::string> ResumeCandidates(const std::string& dir, const ResumeIdentity& id,
                                          const std::function<void(const std::string&)>& warn) {
  const auto say = [&](const std::string& s) {
    if (warn) warn(s);
  };
  std::vector<std::pair<int64_t, std::string>> out;
  const auto same_file = [](const std::string& a, const std::string& b) {
    std::error_code ec;
    return !a.empty() && !b.empty() && fs::equivalent(a, b, ec);
  };
  const auto consider = [&](const std::string& path) {
    CheckpointHeader h;
    try {
      h = ReadCheckpointHeader(path);
    } catch (const std::exception& e) {
      say(fmt::format("skipping checkpoint {}: {}", path, e.what()));
      return;
    }
    if (h.run_uuid != id.run_uuid) {
      const bool recorded_legacy = h.run_uuid.empty() && same_file(path, id.legacy_checkpoint);
      if (!recorded_legacy) {
        say(h.run_uuid.empty()
                ? fmt::format("skipping legacy checkpoint {} (step {}, written before runs had "
                              "UUIDs): it is not the checkpoint this run recorded, so it may be "
                              "another run's",
                              path, h.step)
                : fmt::format("skipping foreign checkpoint {} (step {}): it belongs to run {} "
                              "(config {}), not to this run {} (config {})",
                              path, h.step, Short(h.run_uuid),
                              PrintableText(h.config_hash.substr(0, 12)), Short(id.run_uuid),
                              id.config_hash.substr(0, 12)));
        return;
      }
    }
    if (id.max_step >= 0 && h.step > id.max_step) {
      say(
          fmt::format("skipping checkpoint {} (step {}): the database recorded this run only up "
                      "to step {} (a copy of the database, or a trainer killed between the "
                      "checkpoint and its record, went further)",
                      path, h.step, id.max_step));
      return;
    }
    out.push_back({h.step, path});
  };
  bool legacy_seen = false;
  for (const std::string& path : CheckpointsNewestFirst(dir)) {
    legacy_seen = legacy_seen || same_file(path, id.legacy_checkpoint);
    consider(path);
  }
  std::error_code ec;
  if (!legacy_seen && !id.legacy_checkpoint.empty() && fs::exists(id.legacy_checkpoint, ec)) {
    consider(id.legacy_checkpoint);
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> paths;
  for (auto& [step, path] : out) paths.push_back(std::move(path));
  return paths;
}

std::string ReadNewestValidCheckpoint(const std::vector<std::string>& all,
                                      const std::string& expected_hash, std::span<float> params,
                                      std::span<float> router_bias,
                                      const std::vector<StateBuffer>& optimizer_state,
                                      CheckpointHeader* header,
                                      const std::function<void(const std::string&)>& warn) {
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
        fmt::format("no valid checkpoint of this run ({} tried):{}", all.size(), errors));
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
