#include "core/data/data.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sentencepiece_processor.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/data/markov.h"
#include "core/data/prepare.h"
#include "core/data/random.h"
#include "core/data/shards.h"
#include "tests/common/errors.h"
#include "tests/common/fresh_dir_test.h"

namespace moelab {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string ReadAll(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::vector<std::string> ReadLines(const fs::path& p) {
  std::ifstream f(p);
  std::vector<std::string> lines;
  for (std::string l; std::getline(f, l);) {
    if (!l.empty()) lines.push_back(l);
  }
  return lines;
}

// A few hundred KB of pseudo-English over a small alphabet: vocab 300 leaves room for BPE
// merges after the 256 byte pieces only when the text has few distinct characters.
void WriteTinyCorpus(const fs::path& dir) {
  fs::create_directories(dir);
  const std::vector<std::string> words = {
      "the",  "of",    "and",   "to",    "in",     "a",     "is",    "that",  "for",  "it",
      "as",   "with",  "was",   "on",    "be",     "by",    "this",  "which", "from", "or",
      "word", "light", "earth", "water", "heaven", "great", "made",  "said",  "king", "land",
      "day",  "night", "name",  "house", "people", "city",  "stone", "river", "tree", "fire"};
  data::Rng rng(42);
  for (int f = 0; f < 2; ++f) {
    std::ofstream out(dir / (f == 0 ? "a.txt" : "b.txt"));
    for (int line = 0; line < 1500; ++line) {
      int n = 4 + static_cast<int>(data::Below(rng.Next(), 20));
      std::string s;
      for (int w = 0; w < n; ++w) {
        if (w) s += data::Below(rng.Next(), 8) == 0 ? ", " : " ";
        s += words[data::Below(rng.Next(), words.size())];
      }
      out << s << ".\n";
      if (line % 100 == 0) out << "\n";        // blank lines are not documents
      if (line % 250 == 0) out << s << ".\n";  // duplicates must not straddle the split
    }
  }
}

fs::path TestRoot() {
  static const fs::path root = test::FreshProcessDir("data_test");
  return root;
}

PrepareOptions TinyOptions(const std::string& out_name) {
  PrepareOptions o;
  o.inputs = {(TestRoot() / "corpus").string()};
  o.out_dir = (TestRoot() / out_name).string();
  o.vocab_size = 300;
  o.val_fraction = 0.05;
  o.seed = 7;
  o.shard_tokens = 50'000;  // several train shards, so windows straddle files
  o.quiet = true;
  return o;
}

class PreparedCorpus : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    WriteTinyCorpus(TestRoot() / "corpus");
    result_ = new PrepareResult(PrepareCorpus(TinyOptions("prepared")));
  }
  static void TearDownTestSuite() {
    delete result_;
    result_ = nullptr;
    fs::remove_all(TestRoot());
  }
  static fs::path Dir() { return TestRoot() / "prepared"; }
  static std::vector<int32_t> Stream(const std::vector<std::string>& names) {
    std::vector<std::string> paths;
    for (const auto& n : names) paths.push_back((Dir() / n).string());
    ShardReader r(paths);
    std::vector<int32_t> t(r.size());
    r.Read(0, r.size(), t.data());
    return t;
  }
  // Splits a token stream at EOS and decodes each document.
  static std::vector<std::string> Decode(const std::vector<int32_t>& stream, int eos) {
    sentencepiece::SentencePieceProcessor sp;
    EXPECT_TRUE(sp.Load((Dir() / "tokenizer.model").string()).ok());
    std::vector<std::string> docs;
    std::vector<int> cur;
    for (int32_t t : stream) {
      if (t == eos) {
        std::string text;
        EXPECT_TRUE(sp.Decode(cur, &text).ok());
        docs.push_back(text);
        cur.clear();
      } else {
        cur.push_back(t);
      }
    }
    EXPECT_TRUE(cur.empty()) << "stream must end with EOS";
    return docs;
  }
  static DataConfig Config() {
    DataConfig c;
    c.source = "corpus";
    c.path = Dir().string();
    return c;
  }
  static PrepareResult* result_;
};
PrepareResult* PreparedCorpus::result_ = nullptr;

TEST_F(PreparedCorpus, MetaJsonDescribesTheFolder) {
  ASSERT_FALSE(result_->skipped);
  const nlohmann::json meta = nlohmann::json::parse(ReadAll(Dir() / "meta.json"));
  EXPECT_EQ(meta, result_->meta);
  EXPECT_EQ(meta["format_version"], 1);
  EXPECT_EQ(meta["vocab_size"], 300);
  EXPECT_EQ(meta["tokenizer"], "tokenizer.model");
  EXPECT_TRUE(meta["entropy_rate"].is_null());
  EXPECT_EQ(meta["seed"], 7);
  EXPECT_GT(meta["train_tokens"].get<int64_t>(), 100'000);
  EXPECT_GT(meta["val_tokens"].get<int64_t>(), 0);
  EXPECT_GT(meta["shards"].size(), 1u);
  EXPECT_EQ(meta["val_shards"].size(), 1u);
  ASSERT_EQ(meta["sources"].size(), 2u);
  for (const auto& s : meta["sources"]) {
    EXPECT_EQ(s["bytes"].get<int64_t>(), static_cast<int64_t>(fs::file_size(s["path"])));
  }
  EXPECT_TRUE(meta["created_at"].is_string());
  EXPECT_TRUE(fs::exists(Dir() / "tokenizer.model"));
  EXPECT_FALSE(fs::exists(Dir() / ".prepare-tmp"));

  const DataMeta m = ReadDataMeta(Dir().string());
  EXPECT_EQ(m.vocab_size, 300);
  EXPECT_EQ(m.train_tokens, meta["train_tokens"].get<int64_t>());
  EXPECT_EQ(m.shards.size(), meta["shards"].size());
}

TEST_F(PreparedCorpus, ShardsDecodeToTheInputAndTheSplitIsDisjoint) {
  const DataMeta m = ReadDataMeta(Dir().string());
  const std::vector<int32_t> train = Stream(m.shards), val = Stream(m.val_shards);
  EXPECT_EQ(static_cast<int64_t>(train.size()), m.train_tokens);
  for (int32_t t : train) ASSERT_LT(t, 300);
  const std::vector<std::string> train_docs = Decode(train, m.eos_id);
  const std::vector<std::string> val_docs = Decode(val, m.eos_id);

  std::multiset<std::string> input, output;
  for (const char* f : {"a.txt", "b.txt"}) {
    for (auto& l : ReadLines(TestRoot() / "corpus" / f)) input.insert(l);
  }
  output.insert(train_docs.begin(), train_docs.end());
  output.insert(val_docs.begin(), val_docs.end());
  EXPECT_EQ(output, input);  // exact round trip, every document exactly once
  EXPECT_EQ(m.json["train_documents"].get<size_t>(), train_docs.size());

  const std::set<std::string> train_set(train_docs.begin(), train_docs.end());
  for (const auto& d : val_docs) EXPECT_EQ(train_set.count(d), 0u) << d;
  const double share = double(val_docs.size()) / double(input.size());
  EXPECT_NEAR(share, 0.05, 0.02);
}

TEST_F(PreparedCorpus, SecondRunWithSameOptionsDoesNothing) {
  const auto before = fs::last_write_time(Dir() / "meta.json");
  PrepareResult again = PrepareCorpus(TinyOptions("prepared"));
  EXPECT_TRUE(again.skipped);
  EXPECT_EQ(fs::last_write_time(Dir() / "meta.json"), before);
  EXPECT_EQ(again.meta["train_tokens"], result_->meta["train_tokens"]);
}

TEST_F(PreparedCorpus, RebuildsWhenOptionsChangeOrTheFolderIsIncomplete) {
  fs::copy(Dir(), TestRoot() / "copy", fs::copy_options::recursive);
  PrepareOptions o = TinyOptions("copy");
  o.shard_tokens = 1'000'000;  // one train shard instead of several
  o.threads = 1;               // and the output must not depend on the thread count
  PrepareResult r = PrepareCorpus(o);
  EXPECT_FALSE(r.skipped);
  EXPECT_EQ(r.meta["shards"].size(), 1u);
  EXPECT_FALSE(fs::exists(TestRoot() / "copy" / "train_001.bin"));  // stale shard removed
  EXPECT_EQ(r.meta["train_tokens"], result_->meta["train_tokens"]);
  const DataMeta m = ReadDataMeta(Dir().string());
  std::vector<int32_t> a = Stream(m.shards);
  std::vector<std::string> one = {(TestRoot() / "copy" / "train_000.bin").string()};
  ShardReader rb(one);
  std::vector<int32_t> b(rb.size());
  rb.Read(0, rb.size(), b.data());
  EXPECT_EQ(a, b);

  // A folder without meta.json (an interrupted prepare) is never taken as done.
  fs::remove(TestRoot() / "copy" / "meta.json");
  EXPECT_THROW(ReadDataMeta((TestRoot() / "copy").string()), std::runtime_error);
  EXPECT_FALSE(PrepareCorpus(o).skipped);
  fs::remove_all(TestRoot() / "copy");
}

TEST_F(PreparedCorpus, TrainBatchIsAPureFunctionOfItsArguments) {
  auto src = OpenTokenSource(Config(), 300);
  EXPECT_EQ(src->vocab_size(), 300);
  EXPECT_TRUE(std::isnan(src->entropy_rate()));
  EXPECT_THAT(src->describe(), HasSubstr("corpus"));
  const int B = 4, S = 64;
  std::vector<int32_t> a(B * (S + 1)), b(a.size()), c(a.size()), d(a.size()), e(a.size());
  src->TrainBatch(1, 10, 0, B, S, a.data());
  src->ValBatch(0, B, S, e.data());  // interleaved calls must not matter
  src->TrainBatch(1, 10, 0, B, S, b.data());
  src->TrainBatch(1, 11, 0, B, S, c.data());
  src->TrainBatch(1, 10, 1, B, S, d.data());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a, d);
  auto other = OpenTokenSource(Config(), 512);  // a larger model vocabulary is fine
  other->TrainBatch(1, 10, 0, B, S, b.data());
  EXPECT_EQ(a, b);
  other->TrainBatch(2, 10, 0, B, S, b.data());
  EXPECT_NE(a, b);
  for (int32_t t : a) EXPECT_TRUE(t >= 0 && t < 300);

  // Each window is a contiguous slice of the training stream (possibly across shard files).
  const DataMeta m = ReadDataMeta(Dir().string());
  const std::vector<int32_t> train = Stream(m.shards);
  for (int r = 0; r < B; ++r) {
    auto it = std::search(train.begin(), train.end(), a.begin() + r * (S + 1),
                          a.begin() + (r + 1) * (S + 1));
    EXPECT_NE(it, train.end());
  }
}

TEST_F(PreparedCorpus, ValBatchesAreFixedConsecutiveWindowsThatWrapAround) {
  auto src = OpenTokenSource(Config(), 300);
  const DataMeta m = ReadDataMeta(Dir().string());
  const std::vector<int32_t> val = Stream(m.val_shards);
  const int B = 2, S = 31, L = S + 1;
  std::vector<int32_t> v0(B * L), v1(B * L);
  src->ValBatch(0, B, S, v0.data());
  src->ValBatch(1, B, S, v1.data());
  EXPECT_TRUE(std::equal(v0.begin(), v0.end(), val.begin()));
  EXPECT_TRUE(std::equal(v1.begin(), v1.end(), val.begin() + B * L));
  const int64_t windows = static_cast<int64_t>(val.size()) / L;
  std::vector<int32_t> wrapped(B * L);
  // Batch index k with k * B == windows (mod windows) starts over at window 0.
  src->ValBatch(windows, B, S, wrapped.data());
  EXPECT_EQ(wrapped, v0);
  // Windows longer than the whole split read it cyclically instead of failing.
  std::vector<int32_t> big(val.size() + 10);
  src->ValBatch(0, 1, static_cast<int>(val.size()) + 9, big.data());
  EXPECT_EQ(big[val.size()], val[0]);
}

TEST_F(PreparedCorpus, TooSmallModelVocabularyIsAClearError) {
  EXPECT_THAT(test::ErrorMessageOf([&] { OpenTokenSource(Config(), 256); }),
              HasSubstr("model.vocab_size 256 is smaller than the tokenizer's vocabulary 300"));
  EXPECT_THROW(CheckVocabFits(ReadDataMeta(Dir().string()), 299), std::runtime_error);
  EXPECT_NO_THROW(CheckVocabFits(ReadDataMeta(Dir().string()), 300));
}

TEST_F(PreparedCorpus, TooSmallTokenizerVocabularyExplainsWhy) {
  PrepareOptions o = TinyOptions("too_small");
  o.vocab_size = 260;  // 256 bytes + <unk> + </s> leave room for 2 characters only
  EXPECT_THAT(test::ErrorMessageOf([&] { PrepareCorpus(o); }),
              HasSubstr("raise vocab_size or lower character_coverage"));
  EXPECT_FALSE(fs::exists(TestRoot() / "too_small" / "meta.json"));
}

TEST(DataErrors, MissingFolderNamesTheFixCommand) {
  DataConfig c;
  c.source = "corpus";
  c.path = "/nonexistent/moelab/data";
  const std::string missing = test::ErrorMessageOf([&] { OpenTokenSource(c, 512); });
  EXPECT_THAT(missing, HasSubstr("/nonexistent/moelab/data/meta.json not found"));
  EXPECT_THAT(missing, HasSubstr("run `moelab data prepare`"));
  c.source = "uniform";
  EXPECT_THROW(OpenTokenSource(c, 512), std::runtime_error);
}

TEST(DataErrors, PrepareRejectsBadInputs) {
  PrepareOptions o;
  o.quiet = true;
  o.inputs = {"/nonexistent/corpus"};
  o.out_dir = (fs::temp_directory_path() / "moelab_never_written").string();
  EXPECT_THAT(test::ErrorMessageOf([&] { PrepareCorpus(o); }),
              HasSubstr("/nonexistent/corpus: no such file or folder"));
  o.vocab_size = 100;
  EXPECT_THROW(PrepareCorpus(o), std::runtime_error);
  EXPECT_FALSE(fs::exists(o.out_dir));
}

// --- Markov source ----------------------------------------------------------------------------

double EmpiricalNll(const MarkovChain& chain, const std::vector<int32_t>& seq) {
  const int k = chain.options().order;
  double nll = 0.0;
  for (size_t i = k; i < seq.size(); ++i) {
    nll -= chain.LogProb(chain.StateOf(&seq[i - k]), seq[i]);
  }
  return nll / double(seq.size() - k);
}

TEST(Markov, EntropyRateMatchesTheEmpiricalNllOfALongSample) {
  struct Case {
    int vocab, order;
    double concentration;
  };
  for (Case c : {Case{16, 1, 0.5}, Case{64, 1, 0.1}, Case{6, 2, 0.3}, Case{4, 3, 1.0}}) {
    MarkovOptions o{c.vocab, c.order, c.concentration, 99};
    MarkovChain chain(o);
    double total = 0.0;
    for (double p : chain.stationary()) total += p;
    EXPECT_NEAR(total, 1.0, 1e-12);
    EXPECT_GT(chain.entropy_rate(), 0.0);
    EXPECT_LT(chain.entropy_rate(), std::log(double(c.vocab)));
    std::vector<int32_t> seq(1'500'000);
    chain.Sample(123, static_cast<int64_t>(seq.size()), seq.data());
    // ~1.5M tokens: the standard error of the mean is ~1e-3 nats; 5e-3 leaves room.
    EXPECT_NEAR(EmpiricalNll(chain, seq), chain.entropy_rate(), 5e-3)
        << "vocab " << c.vocab << " order " << c.order;
  }
}

TEST(Markov, HighConcentrationApproachesTheUniformEntropy) {
  MarkovChain chain(MarkovOptions{32, 1, 1e4, 5});
  EXPECT_NEAR(chain.entropy_rate(), std::log(32.0), 1e-2);
}

TEST(Markov, SourceIsDeterministicAndReportsItsEntropy) {
  DataConfig c{
      .source = "markov", .markov_order = 1, .markov_concentration = 0.2, .markov_seed = 3};
  auto a = OpenTokenSource(c, 128), b = OpenTokenSource(c, 128);
  EXPECT_EQ(a->vocab_size(), 128);
  EXPECT_DOUBLE_EQ(a->entropy_rate(), b->entropy_rate());
  EXPECT_THAT(a->describe(), HasSubstr("entropy rate"));
  const int B = 3, S = 50;
  std::vector<int32_t> x(B * (S + 1)), y(x.size()), z(x.size()), v(x.size()), w(x.size());
  a->TrainBatch(5, 7, 0, B, S, x.data());
  b->TrainBatch(5, 7, 0, B, S, y.data());
  a->TrainBatch(5, 8, 0, B, S, z.data());
  EXPECT_EQ(x, y);
  EXPECT_NE(x, z);
  for (int32_t t : x) EXPECT_TRUE(t >= 0 && t < 128);
  a->ValBatch(2, B, S, v.data());
  b->ValBatch(2, B, S, w.data());
  EXPECT_EQ(v, w);
  EXPECT_NE(v, x);

  c.markov_seed = 4;  // another chain
  EXPECT_NE(OpenTokenSource(c, 128)->entropy_rate(), a->entropy_rate());
}

TEST(Markov, InfeasibleOrIllegalOptionsAreClearErrors) {
  DataConfig c;
  c.source = "markov";
  c.markov_order = 3;
  const std::string infeasible = test::ErrorMessageOf([&] { OpenTokenSource(c, 512); });
  EXPECT_THAT(infeasible, HasSubstr("order 3 over vocab 512"));
  EXPECT_THAT(infeasible, HasSubstr("lower data.markov_order"));
  c.markov_order = 0;
  EXPECT_THROW(OpenTokenSource(c, 512), std::runtime_error);
  c.markov_order = 1;
  c.markov_concentration = 0.0;
  EXPECT_THROW(OpenTokenSource(c, 512), std::runtime_error);
}

}  // namespace
}  // namespace moelab
