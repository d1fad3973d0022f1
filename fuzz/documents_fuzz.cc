// libFuzzer target: the tokenizer's input reader (core/data/documents.h), which streams the
// documents `moelab data prepare` trains the tokenizer on and encodes. The first byte picks the
// file kind the rest is read as: plain text or JSON Lines (text field "text"), each plain, gzip
// or Zstandard compressed.
// Findings: a crash, a hang, a sanitizer report, an exception other than std::runtime_error,
// and a document that breaks the reader's promise (empty, or holding a line break for text).
#include <cstdint>
#include <stdexcept>
#include <string>

#include "core/data/documents.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const char* const kNames[] = {"in.txt",   "in.txt.gz",   "in.txt.zst",
                                       "in.jsonl", "in.jsonl.gz", "in.jsonl.zst"};
  const std::string name = kNames[data[0] % 6];
  const std::string path = moelab::fuzz::WriteScratch(name, data + 1, size - 1);
  const bool text = moelab::KindOfInput(path).format == moelab::DocumentFormat::kText;
  int64_t last_progress = 0;
  try {
    moelab::ForEachDocument(
        path, "text",
        [&](const std::string& doc) {
          if (doc.empty()) moelab::fuzz::Finding("an empty document");
          if (text && doc.find('\n') != std::string::npos) {
            moelab::fuzz::Finding("a text document holding a line break");
          }
        },
        [&](int64_t consumed) {
          if (consumed < last_progress) moelab::fuzz::Finding("progress went backwards");
          last_progress = consumed;
        });
  } catch (const std::runtime_error& e) {
    moelab::fuzz::ExpectClear(e);
  }
  return 0;
}
