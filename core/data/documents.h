// Streaming documents out of the inputs of `moelab data prepare`: plain text (one document per
// line) or JSON Lines (one document per line, its text in a named string field), each plain,
// gzip (`.gz`, zlib) or Zstandard (`.zst`, libzstd) compressed. Nothing is read whole: files are
// decompressed in 1 MiB chunks, so a corpus of any size streams through constant memory.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace moelab {

enum class DocumentFormat { kText, kJsonLines };
enum class Compression { kNone, kGzip, kZstd };

// What a file name says about its content: `x.jsonl.zst` -> JSON Lines, Zstandard. `.jsonl` and
// `.ndjson` are JSON Lines; anything else (`.txt`, ...) is text.
struct InputKind {
  DocumentFormat format = DocumentFormat::kText;
  Compression compression = Compression::kNone;
};
InputKind KindOfInput(const std::string& path);

// True for the file names a folder input contributes: *.txt, *.jsonl, *.ndjson, each optionally
// followed by .gz or .zst.
bool IsDocumentFile(const std::string& path);

// A file's decompressed bytes, in order.
class ByteStream {
 public:
  virtual ~ByteStream() = default;
  // Up to n bytes into buf; 0 at the end. Throws std::runtime_error naming the file on errors
  // (a corrupt or truncated compressed stream included).
  virtual size_t Read(char* buf, size_t n) = 0;
  // Bytes of the file itself (compressed) consumed so far, for progress against its size.
  virtual int64_t consumed() const = 0;
};
std::unique_ptr<ByteStream> OpenByteStream(const std::string& path, Compression compression);

// Calls fn(document) for every document of `path` in order, and progress(consumed file bytes)
// about every MiB. Text: every non-empty line (a trailing '\r' dropped). JSON Lines: the string
// `text_field` of every non-empty line; a line that is not a JSON object with that string field is
// an error naming the file, the line number and the field (an empty string is skipped like an
// empty line).
void ForEachDocument(const std::string& path, const std::string& text_field,
                     const std::function<void(const std::string&)>& fn,
                     const std::function<void(int64_t)>& progress = {});

}  // namespace moelab
