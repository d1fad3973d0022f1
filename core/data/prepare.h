// `moelab data prepare`: text files -> SentencePiece BPE tokenizer + uint16 token shards + a
// meta.json, in one folder that the "corpus" token source reads (see docs/data.md).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace moelab {

struct PrepareProgress {
  std::string stage;      // "scan", "sample", "train tokenizer", "encode", "write"
  double fraction = 0.0;  // of this stage, in [0, 1]
  std::string detail;     // e.g. "12.3M tokens"
  double mb_per_s = 0.0;  // input MB (10^6 bytes, as stored) per second in this stage; 0: unknown
  double eta_s = -1.0;    // seconds left in this stage; < 0: unknown
};

struct PrepareOptions {
  // Files, or folders whose *.txt, *.jsonl and *.ndjson files (each optionally .gz or .zst;
  // sorted by name) are all used. Text: every non-empty line is one document. JSON Lines: the
  // string field `text_field` of every line is one document (core/data/documents.h). Documents
  // are separated by the EOS token in the shards. The default is where
  // scripts/export-corpus.sh is expected to write the default corpus.
  std::vector<std::string> inputs = {"data/corpus"};
  std::string text_field = "text";
  // An existing SentencePiece model to encode with instead of training one: vocab_size,
  // max_sentences and character_coverage are then unused, the vocabulary is the model's and
  // its </s> piece separates documents.
  std::string tokenizer_model;
  std::string out_dir = "data/default";
  int vocab_size = 512;  // includes 256 byte-fallback pieces, <unk> and </s>
  // Share of documents held out for validation, chosen by a hash of (seed, document text), so
  // duplicate lines always land on the same side and the split never depends on file order.
  double val_fraction = 0.005;
  uint64_t seed = 1;
  // At most about this many training documents are sampled (deterministically from seed) to
  // train the tokenizer; keeps training around a minute on 2 cores for the default corpus.
  int64_t max_sentences = 300'000;
  // Share of characters the tokenizer must cover with their own pieces; the rest are spelled
  // with byte-fallback pieces, so no token is ever <unk> either way.
  double character_coverage = 0.9995;
  int64_t shard_tokens = 100'000'000;  // tokens per shard file (200 MB)
  int threads = 2;                     // tokenizer training and encoding; output is independent
  bool force = false;  // rebuild even if out_dir already holds a matching prepared corpus
  bool quiet = false;  // no progress line on stderr (ignored when `progress` is set)
  // Called for progress instead of the stderr line, from the calling thread only.
  std::function<void(const PrepareProgress&)> progress;
};

struct PrepareResult {
  bool skipped = false;  // out_dir already held a corpus prepared with the same options
  std::string out_dir;
  nlohmann::json meta;  // the meta.json content
  double seconds = 0.0;
  double encode_seconds = 0.0;  // wall time of the encoding pass
  int64_t encode_bytes = 0;     // document bytes (decompressed) it encoded
};

// Builds out_dir (see PrepareOptions); idempotent and atomic: files are written under temporary
// names and meta.json (which marks the folder valid) is renamed into place last, so an
// interrupted run never leaves a folder that looks prepared. Throws std::runtime_error.
PrepareResult PrepareCorpus(const PrepareOptions& options);

// Expands PrepareOptions::inputs into the ordered list of files (folders -> their document
// files, see PrepareOptions::inputs).
std::vector<std::string> ListInputFiles(const std::vector<std::string>& inputs);

}  // namespace moelab
