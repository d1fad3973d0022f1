// `data prepare` inputs beyond plain text: JSON Lines with a chosen text field, gzip and
// Zstandard streams, and a given SentencePiece model instead of a trained one.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sentencepiece_processor.h>
#include <zlib.h>
#include <zstd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/data/data.h"
#include "core/data/documents.h"
#include "core/data/prepare.h"
#include "core/data/shards.h"
#include "tests/common/errors.h"
#include "tests/common/fresh_dir_test.h"

namespace moelab {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

fs::path Root() {
  static const fs::path root = test::FreshProcessDir("input_test");
  return root;
}

// Documents with what JSON must carry through: newlines, quotes, non-ASCII, a tab.
std::vector<std::string> Documents() {
  const std::vector<std::string> words = {"moe",   "expert", "router", "token", "head",
                                          "logit", "clip",   "muon",   "adam",  "loss"};
  std::vector<std::string> docs;
  for (int i = 0; i < 1200; ++i) {
    std::string d;
    for (int w = 0; w < 5 + i % 11; ++w) d += (w ? " " : "") + words[(i * 7 + w * 3) % 10];
    if (i % 50 == 0) d += "\nsecond line \"quoted\"\tcaf\xc3\xa9";
    docs.push_back(d);
  }
  return docs;
}

std::string JsonLines(const std::vector<std::string>& docs) {
  std::string s;
  for (size_t i = 0; i < docs.size(); ++i) {
    s += nlohmann::json{{"id", i}, {"content", docs[i]}, {"text", "not this one"}}.dump() + "\n";
    if (i % 100 == 0) s += "\n";  // blank lines are not documents
  }
  return s;
}

void WriteBytes(const fs::path& p, const std::string& s) {
  std::ofstream(p, std::ios::binary) << s;
}

void WriteGzip(const fs::path& p, const std::string& s) {
  gzFile f = gzopen(p.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  // Two members, as `cat a.gz b.gz` or pigz write: both must be read.
  const size_t half = s.size() / 2;
  ASSERT_EQ(gzwrite(f, s.data(), half), int(half));
  gzclose(f);
  f = gzopen(p.c_str(), "ab");
  ASSERT_EQ(gzwrite(f, s.data() + half, s.size() - half), int(s.size() - half));
  gzclose(f);
}

std::string Zstd(const std::string& s) {
  std::string out(ZSTD_compressBound(s.size()), '\0');
  const size_t n = ZSTD_compress(out.data(), out.size(), s.data(), s.size(), 3);
  EXPECT_FALSE(ZSTD_isError(n));
  out.resize(n);
  return out;
}

std::vector<std::string> Collect(const fs::path& p, const std::string& field) {
  std::vector<std::string> out;
  ForEachDocument(p.string(), field, [&](const std::string& d) { out.push_back(d); });
  return out;
}

std::vector<int32_t> Tokens(const DataMeta& m, bool val) {
  ShardReader r(val ? m.val_spans : m.train_spans);
  std::vector<int32_t> t(r.size());
  r.Read(0, r.size(), t.data());
  return t;
}

TEST(Documents, JsonLinesPlainGzipAndZstdStreamTheSameDocuments) {
  const std::vector<std::string> docs = Documents();
  const std::string jsonl = JsonLines(docs);
  WriteBytes(Root() / "d.jsonl", jsonl);
  WriteGzip(Root() / "d.jsonl.gz", jsonl);
  WriteBytes(Root() / "d.jsonl.zst", Zstd(jsonl));
  for (const char* name : {"d.jsonl", "d.jsonl.gz", "d.jsonl.zst"}) {
    EXPECT_EQ(Collect(Root() / name, "content"), docs) << name;
  }
  EXPECT_EQ(KindOfInput("x.txt.zst").format, DocumentFormat::kText);
  EXPECT_EQ(KindOfInput("x.ndjson.gz").compression, Compression::kGzip);
  EXPECT_TRUE(IsDocumentFile("a/b.jsonl.zst"));
  EXPECT_FALSE(IsDocumentFile("a/b.bin"));
}

TEST(Documents, BadJsonLinesAndTruncatedStreamsNameTheFileAndLine) {
  WriteBytes(Root() / "bad.jsonl", "{\"text\": \"ok\"}\n{\"body\": \"no text\"}\n");
  const std::string bad = test::ErrorMessageOf([&] { Collect(Root() / "bad.jsonl", "text"); });
  EXPECT_THAT(bad, HasSubstr("bad.jsonl:2: no string field \"text\""));
  EXPECT_THAT(bad, HasSubstr("--text-field"));
  WriteBytes(Root() / "broken.jsonl", "{\"text\": \"ok\"}\n{\"text\": \n");
  EXPECT_THROW(Collect(Root() / "broken.jsonl", "text"), std::runtime_error);
  const std::string z = Zstd(JsonLines(Documents()));
  WriteBytes(Root() / "cut.jsonl.zst", z.substr(0, z.size() / 2));
  EXPECT_THAT(test::ErrorMessageOf([&] { Collect(Root() / "cut.jsonl.zst", "content"); }),
              HasSubstr("truncated"));
}

// Found by the documents fuzz target (fuzz/documents_fuzz.cc): nlohmann's "last read" puts the
// line's raw bytes into the error (a DEL, invalid UTF-8); the message escapes control bytes.
TEST(Documents, ParseErrorsOfJsonLinesPrintControlBytesEscaped) {
  WriteBytes(Root() / "del.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"ab\x7f\xff\"}\n");
  const std::string del = test::ErrorMessageOf([&] { Collect(Root() / "del.jsonl", "text"); });
  EXPECT_THAT(del, HasSubstr("del.jsonl:2: not a JSON value"));
  EXPECT_THAT(del, HasSubstr("ab\\u007f"));
  EXPECT_THAT(del, Not(HasSubstr("\x7f")));
}

PrepareOptions Options(const std::vector<fs::path>& inputs, const std::string& out) {
  PrepareOptions o;
  o.inputs.clear();
  for (const auto& i : inputs) o.inputs.push_back(i.string());
  o.out_dir = (Root() / out).string();
  o.vocab_size = 300;
  o.val_fraction = 0.05;
  o.quiet = true;
  return o;
}

// The same documents as text (one line each, so without the embedded newlines) and as
// zstd-compressed JSON Lines give the same shards; a given tokenizer reproduces them exactly.
TEST(PrepareInputs, JsonLinesZstdMatchesTextAndAGivenTokenizerIsReused) {
  std::vector<std::string> docs = Documents();
  for (auto& d : docs) std::replace(d.begin(), d.end(), '\n', ' ');
  std::string text;
  for (const auto& d : docs) text += d + "\n";
  fs::create_directories(Root() / "txt");
  fs::create_directories(Root() / "zst");
  WriteBytes(Root() / "txt" / "c.txt", text);
  WriteBytes(Root() / "zst" / "c.jsonl.zst", Zstd(JsonLines(docs)));

  const PrepareResult a = PrepareCorpus(Options({Root() / "txt"}, "from_txt"));
  PrepareOptions ob = Options({Root() / "zst"}, "from_zst");  // a folder picks up *.jsonl.zst
  ob.text_field = "content";
  const PrepareResult b = PrepareCorpus(ob);
  EXPECT_GT(b.encode_bytes, 0);
  EXPECT_GT(b.encode_seconds, 0.0);
  const DataMeta ma = ReadDataMeta(a.out_dir), mb = ReadDataMeta(b.out_dir);
  EXPECT_EQ(ma.train_tokens, mb.train_tokens);
  EXPECT_EQ(Tokens(ma, false), Tokens(mb, false));
  EXPECT_EQ(Tokens(ma, true), Tokens(mb, true));
  EXPECT_EQ(mb.json["options"]["text_field"], "content");

  // Reusing the tokenizer of `a` on the same text: no training, identical shards and model.
  PrepareOptions oc = Options({Root() / "txt" / "c.txt"}, "reused");
  oc.tokenizer_model = (fs::path(a.out_dir) / "tokenizer.model").string();
  oc.vocab_size = 0;  // unused with a given tokenizer
  const PrepareResult c = PrepareCorpus(oc);
  const DataMeta mc = ReadDataMeta(c.out_dir);
  EXPECT_EQ(mc.vocab_size, 300);
  EXPECT_EQ(mc.eos_id, ma.eos_id);
  EXPECT_EQ(c.meta["tokenizer_sample_documents"], 0);
  EXPECT_EQ(c.meta["tokenizer_type"], "sentencepiece (given)");
  EXPECT_EQ(Tokens(ma, false), Tokens(mc, false));
  EXPECT_EQ(Tokens(ma, true), Tokens(mc, true));
  EXPECT_TRUE(PrepareCorpus(oc).skipped);  // the given model is part of the identity

  // A file that is not a SentencePiece model is refused before the folder is touched.
  WriteBytes(Root() / "not.model", "garbage");
  PrepareOptions od = oc;
  od.tokenizer_model = (Root() / "not.model").string();
  EXPECT_THAT(test::ErrorMessageOf([&] { PrepareCorpus(od); }),
              HasSubstr("not a SentencePiece model"));
  EXPECT_TRUE(fs::exists(fs::path(c.out_dir) / "meta.json"));
}

// Every stage that reads the inputs reports a non-decreasing fraction that ends at 100 %.
TEST(PrepareInputs, ProgressOfEachStageEndsAtOneHundredPercent) {
  std::string big;
  const std::string once = JsonLines(Documents());
  while (big.size() < (1u << 20)) big += once;
  WriteBytes(Root() / "big.jsonl", big);
  PrepareOptions o = Options({Root() / "big.jsonl"}, "progress");
  o.text_field = "content";
  o.max_sentences = 2000;
  std::map<std::string, std::vector<double>> seen;
  o.progress = [&](const PrepareProgress& p) { seen[p.stage].push_back(p.fraction); };
  PrepareCorpus(o);
  for (const char* stage : {"scan", "sample", "encode"}) {
    const auto& f = seen[stage];
    ASSERT_FALSE(f.empty()) << stage;
    EXPECT_TRUE(std::is_sorted(f.begin(), f.end())) << stage;
    EXPECT_DOUBLE_EQ(f.back(), 1.0) << stage;
  }
}

}  // namespace
}  // namespace moelab
