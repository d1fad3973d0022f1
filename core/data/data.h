// Token sources: the prepared corpus (memory-mapped shards) and synthetic sources with a known
// entropy rate. Batches are a pure function of (seed, step), so a resumed run sees the same data.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/data/shards.h"

namespace moelab {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual int vocab_size() const = 0;
  // Fills out[batch * (seq_len + 1)] with training windows for optimizer step `step`
  // (0-based), deterministically from (seed, step, rank).
  virtual void TrainBatch(uint64_t seed, int64_t step, int rank, int batch, int seq_len,
                          int32_t* out) = 0;
  // Fixed held-out windows: index-th validation batch, the same for every run and seed.
  virtual void ValBatch(int64_t index, int batch, int seq_len, int32_t* out) = 0;
  // True entropy rate in nats/token for synthetic sources; NaN when unknown.
  virtual double entropy_rate() const = 0;
  virtual std::string describe() const = 0;
};

// Opens the source named by the config; throws std::runtime_error with a clear message (e.g.
// "data/default/meta.json not found: run `moelab data prepare`").
std::unique_ptr<TokenSource> OpenTokenSource(const DataConfig& data, int vocab_size);

// The parts of a prepared folder's meta.json that readers rely on (the full document is `json`).
struct DataMeta {
  std::string dir;  // the folder meta.json was read from
  int format_version = 0;
  int vocab_size = 0;
  int eos_id = -1;        // separator written between documents
  std::string tokenizer;  // file name inside the folder, e.g. "tokenizer.model"; "" for imports
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  std::vector<std::string> shards;      // train shard file names, in stream order
  std::vector<std::string> val_shards;  // validation shard file names
  // Where each split's tokens are: meta.json's `train_spans`/`val_spans` (imported llm.c shards:
  // absolute paths, a header to skip, a held-out tail), else the whole files above, resolved
  // against `dir`.
  std::vector<ShardSpan> train_spans, val_spans;
  nlohmann::json json;
};

// Reads and checks `<dir>/meta.json` without touching the shards, so config validation can
// compare the tokenizer's vocabulary with model.vocab_size before anything runs. Throws
// std::runtime_error ("<dir>/meta.json not found: run `moelab data prepare`", ...).
DataMeta ReadDataMeta(const std::string& dir);

// Throws std::runtime_error when a model with `vocab_size` cannot represent the folder's tokens.
void CheckVocabFits(const DataMeta& meta, int vocab_size);

}  // namespace moelab
