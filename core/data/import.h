// `moelab data import`: adopts token shards written by nanoGPT / llm.c (`.bin` files with a
// header of 256 int32: magic 20240520, version, token count; then uint16 tokens) as they are.
// Nothing is copied or re-encoded: the folder gets a meta.json whose spans point into the
// memory-mapped files past their headers, so `data.source: corpus` trains on them directly.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace moelab {

constexpr int32_t kLlmcMagic = 20240520;
constexpr int64_t kLlmcHeaderBytes = 256 * 4;

struct LlmcHeader {
  int32_t magic = 0;
  int32_t version = 0;  // 1: uint16 tokens of the GPT-2 tokenizer; 2: uint32 (LLaMA 3), refused
  int64_t tokens = 0;
};

// Reads and checks the header of `path` against its size; throws std::runtime_error naming the
// file and what is wrong (magic, version, a size that disagrees with the token count).
LlmcHeader ReadLlmcHeader(const std::string& path);

struct ImportOptions {
  // .bin shard files, or folders whose *.bin files (sorted by name) are all used.
  std::vector<std::string> inputs;
  std::string out_dir = "data/imported";
  // 0: taken from the header: version 1 is llm.c's GPT-2 format, vocabulary 50257 with
  // <|endoftext|> = 50256 as the document separator. Every token is checked to be below it.
  int vocab_size = 0;
  int eos_id = -1;  // -1: 50256 with the header's GPT-2 vocabulary, else unknown
  // Validation shards. Empty: inputs whose file name has a `val` part (fineweb_val_000000.bin,
  // tiny_shakespeare_val.bin) are validation; if none does, the last val_fraction of the
  // training stream is held out (a span of the last shard, never copied).
  std::vector<std::string> val_inputs;
  double val_fraction = 0.005;
  int threads = 2;  // the token range check
  bool quiet = false;
};

struct ImportResult {
  std::string out_dir;
  nlohmann::json meta;
  double seconds = 0.0;
};

// Writes out_dir/meta.json (atomically: a temporary file renamed into place). Throws
// std::runtime_error.
ImportResult ImportShards(const ImportOptions& options);

}  // namespace moelab
