// `data import`: nanoGPT / llm.c token shards adopted in place (header checked, split, spans).
#include "core/data/import.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/data/data.h"
#include "core/data/shards.h"
#include "tests/common/fresh_dir_test.h"

namespace moelab {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

fs::path Root() {
  static const fs::path root = test::FreshProcessDir("import_test");
  return root;
}

// An llm.c shard as dev/data/data_common.py writes it: 256 little-endian int32 (magic, version,
// token count, zeros) and the uint16 tokens.
void WriteShard(const fs::path& p, const std::vector<uint16_t>& tokens, int32_t magic = 20240520,
                int32_t version = 1, int32_t count = -1) {
  int32_t header[256] = {};
  header[0] = magic;
  header[1] = version;
  header[2] = count >= 0 ? count : static_cast<int32_t>(tokens.size());
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(header), sizeof header);
  f.write(reinterpret_cast<const char*>(tokens.data()), 2 * tokens.size());
}

std::vector<uint16_t> Ramp(int n, int start, int vocab) {
  std::vector<uint16_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = static_cast<uint16_t>((start + i) % vocab);
  return t;
}

std::vector<int32_t> Read(const std::vector<ShardSpan>& spans) {
  ShardReader r(spans);
  std::vector<int32_t> t(r.size());
  r.Read(0, r.size(), t.data());
  return t;
}

TEST(Import, NamedValidationShardAndTheGpt2VocabularyFromTheHeader) {
  const fs::path dir = Root() / "named";
  fs::create_directories(dir);
  WriteShard(dir / "fineweb_train_000001.bin", Ramp(5000, 0, 50257));
  WriteShard(dir / "fineweb_train_000002.bin", Ramp(3000, 50000, 50257));
  WriteShard(dir / "fineweb_val_000000.bin", Ramp(700, 7, 50257));
  ImportOptions o;
  o.inputs = {dir.string()};
  o.out_dir = (Root() / "named_out").string();
  const ImportResult r = ImportShards(o);
  const DataMeta m = ReadDataMeta(o.out_dir);
  EXPECT_EQ(m.vocab_size, 50257);
  EXPECT_EQ(m.eos_id, 50256);
  EXPECT_EQ(m.train_tokens, 8000);
  EXPECT_EQ(m.val_tokens, 700);
  EXPECT_EQ(m.tokenizer, "");
  ASSERT_EQ(m.train_spans.size(), 2u);
  EXPECT_EQ(m.train_spans[0].offset, 1024);
  std::vector<int32_t> train = Read(m.train_spans), want;
  for (uint16_t t : Ramp(5000, 0, 50257)) want.push_back(t);
  for (uint16_t t : Ramp(3000, 50000, 50257)) want.push_back(t);
  EXPECT_EQ(train, want);
  EXPECT_EQ(Read(m.val_spans)[0], 7);

  DataConfig c;
  c.source = "corpus";
  c.path = o.out_dir;
  auto src = OpenTokenSource(c, 50304);  // a padded model vocabulary, as nanoGPT uses
  std::vector<int32_t> batch(2 * 17);
  src->ValBatch(0, 2, 16, batch.data());
  EXPECT_EQ(batch[0], 7);
  EXPECT_EQ(batch[17], 7 + 17);
  EXPECT_THROW(OpenTokenSource(c, 50000), std::runtime_error);
}

TEST(Import, WithoutAValidationShardTheTailIsHeldOutInPlace) {
  const fs::path dir = Root() / "tail";
  fs::create_directories(dir);
  WriteShard(dir / "a.bin", Ramp(600, 0, 64));
  WriteShard(dir / "b.bin", Ramp(400, 600, 64));
  ImportOptions o;
  o.inputs = {(dir / "a.bin").string(), (dir / "b.bin").string()};
  o.out_dir = (Root() / "tail_out").string();
  o.vocab_size = 64;
  o.val_fraction = 0.1;
  ImportShards(o);
  const DataMeta m = ReadDataMeta(o.out_dir);
  EXPECT_EQ(m.vocab_size, 64);
  EXPECT_EQ(m.eos_id, -1);
  EXPECT_EQ(m.train_tokens, 900);
  EXPECT_EQ(m.val_tokens, 100);
  const std::vector<int32_t> train = Read(m.train_spans), val = Read(m.val_spans);
  for (int i = 0; i < 900; ++i) ASSERT_EQ(train[i], i % 64);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(val[i], (900 + i) % 64);

  // A hold-out longer than the last shard takes whole shards and a piece of the one before.
  o.val_fraction = 0.5;
  ImportShards(o);
  const DataMeta h = ReadDataMeta(o.out_dir);
  EXPECT_EQ(h.train_tokens, 500);
  ASSERT_EQ(h.val_spans.size(), 2u);
  const std::vector<int32_t> v2 = Read(h.val_spans);
  for (int i = 0; i < 500; ++i) ASSERT_EQ(v2[i], (500 + i) % 64);
}

void ExpectImportError(const ImportOptions& o, const std::string& what) {
  try {
    ImportShards(o);
    FAIL() << "expected an error containing " << what;
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr(what));
  }
}

TEST(Import, HeaderAndVocabularyAreChecked) {
  const fs::path dir = Root() / "bad";
  fs::create_directories(dir);
  ImportOptions o;
  o.out_dir = (Root() / "bad_out").string();
  o.vocab_size = 64;
  WriteShard(dir / "magic.bin", Ramp(100, 0, 64), 20240000);
  o.inputs = {(dir / "magic.bin").string()};
  ExpectImportError(o, "header magic 20240000 is not llm.c's 20240520");
  WriteShard(dir / "v2.bin", Ramp(100, 0, 64), 20240520, 2);
  o.inputs = {(dir / "v2.bin").string()};
  ExpectImportError(o, "version 2 is not supported");
  WriteShard(dir / "short.bin", Ramp(100, 0, 64), 20240520, 1, 120);
  o.inputs = {(dir / "short.bin").string()};
  ExpectImportError(o, "the header says 120 tokens");
  WriteShard(dir / "big.bin", Ramp(100, 0, 100));
  o.inputs = {(dir / "big.bin").string()};
  ExpectImportError(o, "holds token 99, not below the vocabulary 64");
  std::ofstream(dir / "tiny.bin") << "x";
  o.inputs = {(dir / "tiny.bin").string()};
  ExpectImportError(o, "shorter than the 1024-byte llm.c header");
  EXPECT_FALSE(fs::exists(fs::path(o.out_dir) / "meta.json"));
}

}  // namespace
}  // namespace moelab
