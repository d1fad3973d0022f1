#include "core/data/data.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <stdexcept>

#include "core/data/markov.h"
#include "core/data/random.h"
#include "core/data/shards.h"

namespace moelab {
namespace fs = std::filesystem;

namespace {

// Salts that keep the streams of different purposes apart.
constexpr uint64_t kTrainSalt = 0x747261696eULL;      // "train"
constexpr uint64_t kMarkovValSeed = 0x76616c6964ULL;  // "valid": fixed, independent of seed

void CheckBatchArgs(int batch, int seq_len, const int32_t* out) {
  if (batch < 1 || seq_len < 1) {
    throw std::runtime_error(
        fmt::format("batch {} and seq_len {} must both be >= 1", batch, seq_len));
  }
  if (out == nullptr) throw std::runtime_error("null output buffer");
}

// Training and validation windows over the prepared shards.
class CorpusSource : public TokenSource {
 public:
  CorpusSource(std::string dir, DataMeta meta)
      : dir_(std::move(dir)),
        meta_(std::move(meta)),
        train_(meta_.train_spans),
        val_(meta_.val_spans) {
    if (train_.size() != meta_.train_tokens || val_.size() != meta_.val_tokens) {
      throw std::runtime_error(fmt::format(
          "{}: shards hold {} train / {} val tokens but meta.json says {} / {}: the folder is "
          "damaged, run `moelab data prepare --force` (or `moelab data import` again)",
          dir_, train_.size(), val_.size(), meta_.train_tokens, meta_.val_tokens));
    }
  }

  int vocab_size() const override { return meta_.vocab_size; }

  // Window b starts at a uniform offset drawn from hash(seed, step, rank, b): a pure function,
  // so resuming at any step reproduces the data exactly with no loader state.
  void TrainBatch(uint64_t seed, int64_t step, int rank, int batch, int seq_len,
                  int32_t* out) override {
    CheckBatchArgs(batch, seq_len, out);
    const int64_t len = int64_t{seq_len} + 1;
    if (train_.size() < len) {
      throw std::runtime_error(fmt::format("{}: {} training tokens cannot fill a window of {}",
                                           dir_, train_.size(), len));
    }
    const uint64_t starts = static_cast<uint64_t>(train_.size() - len + 1);
    const uint64_t base = data::HashOf(seed ^ kTrainSalt, static_cast<uint64_t>(step),
                                       static_cast<uint64_t>(static_cast<int64_t>(rank)), 0);
    for (int b = 0; b < batch; ++b) {
      uint64_t offset = data::Below(data::HashCombine(base, static_cast<uint64_t>(b)), starts);
      train_.Read(static_cast<int64_t>(offset), len, out + b * len);
      Check(out + b * len, len);
    }
  }

  // Consecutive non-overlapping windows: batch `index` holds windows index*batch ...; once the
  // split is used up the windows wrap around (and a split shorter than one window is read
  // cyclically).
  void ValBatch(int64_t index, int batch, int seq_len, int32_t* out) override {
    CheckBatchArgs(batch, seq_len, out);
    const int64_t len = int64_t{seq_len} + 1, n = val_.size();
    if (n == 0) throw std::runtime_error(dir_ + ": the validation split is empty");
    const int64_t windows = n / len;
    for (int b = 0; b < batch; ++b) {
      int32_t* dst = out + b * len;
      const int64_t w = index * batch + b;
      if (windows > 0) {
        val_.Read((w % windows) * len, len, dst);
      } else {
        for (int64_t i = 0; i < len; ++i) dst[i] = val_.at((w * len + i) % n);
      }
      Check(dst, len);
    }
  }

  double entropy_rate() const override { return std::numeric_limits<double>::quiet_NaN(); }

  std::string describe() const override {
    return fmt::format("corpus {}: {} train / {} val tokens, SentencePiece BPE vocab {}", dir_,
                       meta_.train_tokens, meta_.val_tokens, meta_.vocab_size);
  }

 private:
  // Cheap next to the copy, and turns a damaged shard into an error instead of an out-of-range
  // embedding lookup.
  void Check(const int32_t* t, int64_t n) const {
    for (int64_t i = 0; i < n; ++i) {
      if (t[i] >= meta_.vocab_size) {
        throw std::runtime_error(
            fmt::format("{}: token {} >= vocab_size {} in the shards: the "
                        "folder is damaged, run `moelab data prepare --force`",
                        dir_, t[i], meta_.vocab_size));
      }
    }
  }

  std::string dir_;
  DataMeta meta_;
  ShardReader train_, val_;
};

class MarkovSource : public TokenSource {
 public:
  explicit MarkovSource(const MarkovOptions& o) : chain_(o) {}

  int vocab_size() const override { return chain_.options().vocab_size; }

  void TrainBatch(uint64_t seed, int64_t step, int rank, int batch, int seq_len,
                  int32_t* out) override {
    CheckBatchArgs(batch, seq_len, out);
    const int64_t len = int64_t{seq_len} + 1;
    for (int b = 0; b < batch; ++b) {
      chain_.Sample(
          data::HashOf(seed ^ kTrainSalt, static_cast<uint64_t>(step),
                       static_cast<uint64_t>(static_cast<int64_t>(rank)), static_cast<uint64_t>(b)),
          len, out + b * len);
    }
  }

  void ValBatch(int64_t index, int batch, int seq_len, int32_t* out) override {
    CheckBatchArgs(batch, seq_len, out);
    const int64_t len = int64_t{seq_len} + 1;
    for (int b = 0; b < batch; ++b) {
      chain_.Sample(data::HashOf(kMarkovValSeed, static_cast<uint64_t>(index * batch + b), 0, 0),
                    len, out + b * len);
    }
  }

  double entropy_rate() const override { return chain_.entropy_rate(); }

  std::string describe() const override {
    const MarkovOptions& o = chain_.options();
    return fmt::format(
        "markov order {}, vocab {}, concentration {}, seed {}: entropy rate {:.6f} nats/token",
        o.order, o.vocab_size, o.concentration, o.seed, chain_.entropy_rate());
  }

 private:
  MarkovChain chain_;
};

}  // namespace

DataMeta ReadDataMeta(const std::string& dir) {
  const fs::path path = fs::path(dir) / "meta.json";
  std::ifstream in(path);
  if (!in) {
    if (!fs::exists(dir)) {
      throw std::runtime_error(fmt::format("{} not found (no folder {}): run `moelab data prepare`",
                                           path.string(), dir));
    }
    throw std::runtime_error(fmt::format("{} not found: run `moelab data prepare`", path.string()));
  }
  DataMeta m;
  m.dir = dir;
  try {
    m.json = nlohmann::json::parse(in);
    m.format_version = m.json.at("format_version").get<int>();
    m.vocab_size = m.json.at("vocab_size").get<int>();
    m.eos_id = m.json.value("eos_id", -1);
    const auto& tok = m.json.at("tokenizer");
    m.tokenizer = tok.is_string() ? tok.get<std::string>() : "";
    m.train_tokens = m.json.at("train_tokens").get<int64_t>();
    m.val_tokens = m.json.at("val_tokens").get<int64_t>();
    m.shards = m.json.at("shards").get<std::vector<std::string>>();
    m.val_shards = m.json.at("val_shards").get<std::vector<std::string>>();
    // Relative names are inside the folder; fs::path's operator/ keeps absolute ones as they are.
    auto spans = [&](const char* key, const std::vector<std::string>& names) {
      std::vector<ShardSpan> out;
      if (m.json.contains(key)) {
        for (const auto& s : m.json.at(key)) {
          out.push_back({(fs::path(dir) / s.at("file").get<std::string>()).string(),
                         s.at("offset_bytes").get<int64_t>(), s.at("tokens").get<int64_t>()});
        }
      } else {
        for (const auto& n : names) out.push_back({(fs::path(dir) / n).string(), 0, -1});
      }
      return out;
    };
    m.train_spans = spans("train_spans", m.shards);
    m.val_spans = spans("val_spans", m.val_shards);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(fmt::format(
        "{}: not a valid prepared-corpus description ({}): run `moelab data prepare --force`",
        path.string(), e.what()));
  }
  if (m.format_version != 1) {
    throw std::runtime_error(fmt::format(
        "{}: format_version {} is not supported (expected 1): run `moelab data prepare --force`",
        path.string(), m.format_version));
  }
  if (m.vocab_size < 1 || m.vocab_size > 65536) {
    throw std::runtime_error(
        fmt::format("{}: vocab_size {} out of range", path.string(), m.vocab_size));
  }
  return m;
}

void CheckVocabFits(const DataMeta& meta, int vocab_size) {
  if (vocab_size < meta.vocab_size && meta.tokenizer.empty()) {
    // Imported token shards (llm.c): no tokenizer of ours, the vocabulary is the import's.
    throw std::runtime_error(fmt::format(
        "model.vocab_size {} is smaller than the vocabulary {} of the imported token shards "
        "({}/meta.json, `moelab data import --vocab`): set model.vocab_size to at least {}",
        vocab_size, meta.vocab_size, meta.dir, meta.vocab_size));
  }
  if (vocab_size < meta.vocab_size) {
    throw std::runtime_error(fmt::format(
        "model.vocab_size {} is smaller than the tokenizer's vocabulary {} ({}/meta.json): set "
        "model.vocab_size to at least {} or prepare the data with a smaller vocabulary",
        vocab_size, meta.vocab_size, meta.dir, meta.vocab_size));
  }
}

std::unique_ptr<TokenSource> OpenTokenSource(const DataConfig& data, int vocab_size) {
  if (data.source == "corpus") {
    DataMeta meta = ReadDataMeta(data.path);
    CheckVocabFits(meta, vocab_size);
    return std::make_unique<CorpusSource>(data.path, std::move(meta));
  }
  if (data.source == "markov") {
    MarkovOptions o;
    o.vocab_size = vocab_size;
    o.order = data.markov_order;
    o.concentration = data.markov_concentration;
    o.seed = data.markov_seed;
    return std::make_unique<MarkovSource>(o);
  }
  throw std::runtime_error(
      fmt::format("data.source \"{}\" is unknown; use \"corpus\" or \"markov\"", data.source));
}

}  // namespace moelab
