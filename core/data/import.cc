#include "core/data/import.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <regex>
#include <stdexcept>

#include "core/data/shards.h"
#include "core/utc_time.h"

namespace moelab {
namespace fs = std::filesystem;

namespace {

constexpr int kGpt2Vocab = 50257;
constexpr int kGpt2EndOfText = 50256;

std::vector<std::string> ListShards(const std::vector<std::string>& inputs) {
  std::vector<std::string> files = ExpandInputFiles(
      inputs, [](const fs::path& p) { return p.extension() == ".bin"; },
      [](const std::string& in) { return in + ": folder has no *.bin shards"; },
      [](const std::string& in) { return in + ": no such file or folder"; });
  for (std::string& f : files) f = fs::weakly_canonical(fs::absolute(f)).string();
  return files;
}

// llm.c names its splits fineweb_train_000001.bin / fineweb_val_000000.bin.
bool IsValName(const std::string& path) {
  static const std::regex re("(^|[_.-])val([_.-]|$)");
  return std::regex_search(fs::path(path).stem().string(), re);
}

int32_t Int32At(const uint8_t* p) {  // little-endian on disk, whatever the host
  return static_cast<int32_t>(uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 |
                              uint32_t(p[3]) << 24);
}

// The largest token of a file's payload, in parallel over the mapped pages.
int MaxToken(const std::string& path, int64_t tokens, int threads) {
  MappedFile f(path);
  const uint8_t* p = f.data() + kLlmcHeaderBytes;
  int best = 0;
#pragma omp parallel for reduction(max : best) schedule(static) num_threads(std::max(1, threads))
  for (int64_t i = 0; i < tokens; ++i) best = std::max(best, int(p[2 * i] | (p[2 * i + 1] << 8)));
  return best;
}

}  // namespace

LlmcHeader ReadLlmcHeader(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open for reading");
  uint8_t raw[kLlmcHeaderBytes];
  in.read(reinterpret_cast<char*>(raw), kLlmcHeaderBytes);
  if (in.gcount() != kLlmcHeaderBytes) {
    throw std::runtime_error(
        fmt::format("{}: {} bytes, shorter than the {}-byte llm.c header (256 int32)", path,
                    in.gcount(), kLlmcHeaderBytes));
  }
  LlmcHeader h;
  h.magic = Int32At(raw);
  h.version = Int32At(raw + 4);
  h.tokens = Int32At(raw + 8);
  if (h.magic != kLlmcMagic) {
    throw std::runtime_error(
        fmt::format("{}: header magic {} is not llm.c's {} (not a nanoGPT / llm.c token shard)",
                    path, h.magic, kLlmcMagic));
  }
  if (h.version != 1) {
    throw std::runtime_error(fmt::format(
        "{}: header version {} is not supported: only version 1 (uint16 tokens) is; version 2 "
        "holds uint32 LLaMA-3 tokens, which do not fit moelab's uint16 shards",
        path, h.version));
  }
  const int64_t size = static_cast<int64_t>(fs::file_size(path));
  if (h.tokens < 0 || size != kLlmcHeaderBytes + 2 * h.tokens) {
    throw std::runtime_error(fmt::format(
        "{}: the header says {} tokens ({} bytes with the header) but the file has {} bytes "
        "(truncated or damaged shard)",
        path, h.tokens, kLlmcHeaderBytes + 2 * h.tokens, size));
  }
  return h;
}

ImportResult ImportShards(const ImportOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  if (o.inputs.empty()) throw std::runtime_error("no inputs: give llm.c .bin shards or a folder");
  if (o.out_dir.empty()) throw std::runtime_error("out_dir is empty");
  if (o.vocab_size < 0 || o.vocab_size > 65536) {
    throw std::runtime_error(fmt::format("vocab_size {} must be in 1 ... 65536", o.vocab_size));
  }
  if (!(o.val_fraction >= 0.0 && o.val_fraction < 1.0)) {
    throw std::runtime_error(fmt::format("val_fraction {} must be in [0, 1)", o.val_fraction));
  }
  std::vector<std::string> train_files, val_files = ListShards(o.val_inputs);
  for (const std::string& f : ListShards(o.inputs)) {
    if (std::find(val_files.begin(), val_files.end(), f) != val_files.end()) continue;
    (o.val_inputs.empty() && IsValName(f) ? val_files : train_files).push_back(f);
  }
  if (train_files.empty()) {
    throw std::runtime_error("every input is a validation shard: give training shards too");
  }

  const int vocab = o.vocab_size > 0 ? o.vocab_size : kGpt2Vocab;
  const int eos = o.eos_id >= 0 ? o.eos_id : o.vocab_size > 0 ? -1 : kGpt2EndOfText;
  if (eos >= vocab) {
    throw std::runtime_error(fmt::format("eos_id {} is not below vocab_size {}", eos, vocab));
  }
  nlohmann::json sources = nlohmann::json::array();
  auto spans_of = [&](const std::vector<std::string>& files, const char* split) {
    nlohmann::json spans = nlohmann::json::array();
    for (const std::string& f : files) {
      const LlmcHeader h = ReadLlmcHeader(f);
      const int max_token = MaxToken(f, h.tokens, o.threads);
      if (h.tokens > 0 && max_token >= vocab) {
        throw std::runtime_error(fmt::format(
            "{}: holds token {}, not below the vocabulary {} ({}): give the tokenizer's "
            "vocabulary with --vocab",
            f, max_token, vocab, o.vocab_size > 0 ? "given" : "GPT-2, from the header version"));
      }
      spans.push_back({{"file", f}, {"offset_bytes", kLlmcHeaderBytes}, {"tokens", h.tokens}});
      sources.push_back(
          {{"path", f},
           {"split", split},
           {"bytes", kLlmcHeaderBytes + 2 * h.tokens},
           {"header", {{"magic", h.magic}, {"version", h.version}, {"tokens", h.tokens}}},
           {"max_token", max_token}});
    }
    return spans;
  };
  nlohmann::json train = spans_of(train_files, "train"), val = spans_of(val_files, "val");
  auto count = [](const nlohmann::json& spans) {
    int64_t n = 0;
    for (const auto& s : spans) n += s["tokens"].get<int64_t>();
    return n;
  };
  int64_t held_out = 0;
  if (val.empty()) {
    // Hold out the tail of the training stream: spans cut from the end, never copied.
    const int64_t total = count(train);
    held_out = static_cast<int64_t>(o.val_fraction * double(total) + 0.5);
    if (held_out < 1 || held_out >= total) {
      throw std::runtime_error(fmt::format(
          "no validation shard (none given with --val, no input named *_val*) and val_fraction {} "
          "of {} training tokens holds out {}: give a validation shard or a val_fraction that "
          "leaves both splits non-empty",
          o.val_fraction, total, held_out));
    }
    int64_t need = held_out;
    nlohmann::json tail = nlohmann::json::array();
    while (need > 0) {
      nlohmann::json& last = train.back();
      const int64_t n = last["tokens"].get<int64_t>();
      const int64_t take = std::min(need, n);
      const nlohmann::json span = {
          {"file", last["file"]},
          {"offset_bytes", last["offset_bytes"].get<int64_t>() + 2 * (n - take)},
          {"tokens", take}};
      tail.insert(tail.begin(), span);
      need -= take;
      if (take == n) {
        train.erase(train.size() - 1);
      } else {
        last["tokens"] = n - take;
      }
    }
    val = std::move(tail);
  }
  auto files_of = [](const nlohmann::json& spans) {
    std::vector<std::string> f;
    for (const auto& s : spans) f.push_back(s["file"]);
    f.erase(std::unique(f.begin(), f.end()), f.end());
    return f;
  };
  nlohmann::json meta = {
      {"format_version", 1},
      {"vocab_size", vocab},
      {"tokenizer", nullptr},
      {"tokenizer_type", o.vocab_size > 0 ? "unknown (imported llm.c shards, vocabulary given)"
                                          : "gpt2 (imported llm.c shards; not included)"},
      {"eos_id", eos},
      {"dtype", "uint16"},
      {"layout", "llm.c"},
      {"train_tokens", count(train)},
      {"val_tokens", count(val)},
      {"shards", files_of(train)},
      {"val_shards", files_of(val)},
      {"train_spans", train},
      {"val_spans", val},
      {"val_held_out_tokens", held_out},
      {"sources", sources},
      {"created_at", UtcNowIso8601()},
      {"entropy_rate", nullptr},
  };

  const fs::path out(o.out_dir);
  fs::create_directories(out);
  const fs::path tmp = out / "meta.json.tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << meta.dump(2) << "\n";
    f.close();
    if (!f) throw std::runtime_error(tmp.string() + ": write failed (disk full?)");
  }
  fs::rename(tmp, out / "meta.json");

  ImportResult r;
  r.out_dir = out.string();
  r.meta = std::move(meta);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace moelab
