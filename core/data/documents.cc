#include "core/data/documents.h"

#include <fmt/format.h>
#include <zlib.h>
#include <zstd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "core/printable.h"

namespace moelab {

namespace {

constexpr size_t kChunk = 1 << 20;

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::FILE* OpenOrThrow(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    throw std::runtime_error(
        fmt::format("{}: cannot open for reading: {}", path, std::strerror(errno)));
  }
  return f;
}

class PlainStream : public ByteStream {
 public:
  explicit PlainStream(const std::string& path) : path_(path), f_(OpenOrThrow(path)) {}
  ~PlainStream() override { std::fclose(f_); }
  size_t Read(char* buf, size_t n) override {
    const size_t got = std::fread(buf, 1, n, f_);
    if (got < n && std::ferror(f_)) throw std::runtime_error(path_ + ": read error");
    consumed_ += static_cast<int64_t>(got);
    return got;
  }
  int64_t consumed() const override { return consumed_; }

 private:
  std::string path_;
  std::FILE* f_;
  int64_t consumed_ = 0;
};

// zlib's gz* interface: handles concatenated members (as written by pigz or `cat a.gz b.gz`).
class GzipStream : public ByteStream {
 public:
  explicit GzipStream(const std::string& path) : path_(path) {
    f_ = gzopen(path.c_str(), "rb");
    if (f_ == nullptr) {
      throw std::runtime_error(
          fmt::format("{}: cannot open for reading: {}", path, std::strerror(errno)));
    }
    gzbuffer(f_, kChunk);
  }
  ~GzipStream() override { gzclose(f_); }
  size_t Read(char* buf, size_t n) override {
    const int got = gzread(f_, buf, static_cast<unsigned>(n));
    if (got < 0) {
      int err = 0;
      throw std::runtime_error(
          fmt::format("{}: gzip stream is corrupt: {}", path_, gzerror(f_, &err)));
    }
    return static_cast<size_t>(got);
  }
  int64_t consumed() const override { return static_cast<int64_t>(gzoffset(f_)); }

 private:
  std::string path_;
  gzFile f_ = nullptr;
};

class ZstdStream : public ByteStream {
 public:
  explicit ZstdStream(const std::string& path)
      : path_(path), f_(OpenOrThrow(path)), in_buf_(ZSTD_DStreamInSize()) {
    ds_ = ZSTD_createDStream();
    if (ds_ == nullptr) {
      std::fclose(f_);
      throw std::runtime_error(path + ": cannot create a zstd decompression stream");
    }
    ZSTD_initDStream(ds_);
  }
  ~ZstdStream() override {
    ZSTD_freeDStream(ds_);
    std::fclose(f_);
  }
  size_t Read(char* buf, size_t n) override {
    ZSTD_outBuffer out{buf, n, 0};
    while (out.pos == 0) {
      if (in_.pos == in_.size) {
        const size_t got = std::fread(in_buf_.data(), 1, in_buf_.size(), f_);
        if (got == 0) {
          if (std::ferror(f_)) throw std::runtime_error(path_ + ": read error");
          if (last_ != 0) {
            throw std::runtime_error(path_ +
                                     ": zstd stream is truncated (the file ends inside a frame)");
          }
          return 0;
        }
        consumed_ += static_cast<int64_t>(got);
        in_ = ZSTD_inBuffer{in_buf_.data(), got, 0};
      }
      last_ = ZSTD_decompressStream(ds_, &out, &in_);
      if (ZSTD_isError(last_)) {
        throw std::runtime_error(
            fmt::format("{}: zstd stream is corrupt: {}", path_, ZSTD_getErrorName(last_)));
      }
    }
    return out.pos;
  }
  int64_t consumed() const override { return consumed_; }

 private:
  std::string path_;
  std::FILE* f_;
  ZSTD_DStream* ds_ = nullptr;
  std::vector<char> in_buf_;
  ZSTD_inBuffer in_{nullptr, 0, 0};
  size_t last_ = 0;  // ZSTD_decompressStream's hint: 0 when a frame has just ended
  int64_t consumed_ = 0;
};

}  // namespace

InputKind KindOfInput(const std::string& path) {
  InputKind k;
  std::string_view s = path;
  if (EndsWith(s, ".gz")) {
    k.compression = Compression::kGzip;
    s.remove_suffix(3);
  } else if (EndsWith(s, ".zst")) {
    k.compression = Compression::kZstd;
    s.remove_suffix(4);
  }
  if (EndsWith(s, ".jsonl") || EndsWith(s, ".ndjson")) k.format = DocumentFormat::kJsonLines;
  return k;
}

bool IsDocumentFile(const std::string& path) {
  std::string_view s = path;
  if (EndsWith(s, ".gz")) s.remove_suffix(3);
  if (EndsWith(s, ".zst")) s.remove_suffix(4);
  return EndsWith(s, ".txt") || EndsWith(s, ".jsonl") || EndsWith(s, ".ndjson");
}

std::unique_ptr<ByteStream> OpenByteStream(const std::string& path, Compression compression) {
  switch (compression) {
    case Compression::kGzip:
      return std::make_unique<GzipStream>(path);
    case Compression::kZstd:
      return std::make_unique<ZstdStream>(path);
    case Compression::kNone:
      break;
  }
  return std::make_unique<PlainStream>(path);
}

void ForEachDocument(const std::string& path, const std::string& text_field,
                     const std::function<void(const std::string&)>& fn,
                     const std::function<void(int64_t)>& progress) {
  const InputKind kind = KindOfInput(path);
  std::unique_ptr<ByteStream> in = OpenByteStream(path, kind.compression);
  // Not zero-filled: only the bytes Read returns are looked at.
  const std::unique_ptr<char[]> buf = std::make_unique_for_overwrite<char[]>(kChunk);
  std::string line, doc;
  int64_t line_no = 0;
  auto emit = [&]() {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) return;
    if (kind.format == DocumentFormat::kText) {
      fn(line);
      return;
    }
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw std::runtime_error(
          fmt::format("{}:{}: not a JSON value ({})", path, line_no, PrintableText(e.what())));
    }
    const auto it = j.is_object() ? j.find(text_field) : j.end();
    if (!j.is_object() || it == j.end() || !it->is_string()) {
      throw std::runtime_error(fmt::format(
          "{}:{}: no string field \"{}\" (give the field holding the text with --text-field)", path,
          line_no, text_field));
    }
    doc = it->get<std::string>();
    if (!doc.empty()) fn(doc);
  };
  for (size_t got; (got = in->Read(buf.get(), kChunk)) > 0;) {
    size_t start = 0;
    for (size_t i = 0; i < got; ++i) {
      if (buf[i] != '\n') continue;
      line.append(buf.get() + start, i - start);
      emit();
      line.clear();
      start = i + 1;
    }
    line.append(buf.get() + start, got - start);
    if (progress) progress(in->consumed());
  }
  emit();  // a last line without '\n'
  if (progress) progress(in->consumed());
}

}  // namespace moelab
