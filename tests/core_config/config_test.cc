#include "core/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <sstream>

namespace moelab {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

// Parses and expects a ConfigError at `path` whose reason contains `reason`.
void ExpectError(const json& j, const std::string& path, const std::string& reason) {
  try {
    ConfigFromJson(j);
    FAIL() << "no error for " << j.dump() << " (expected " << path << ")";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.path(), path) << e.what();
    EXPECT_THAT(e.reason(), HasSubstr(reason)) << e.what();
  }
}

TEST(Config, EmptyDocumentGivesDefaults) {
  const RunConfig c = ConfigFromJson(json::object());
  EXPECT_EQ(c.model.d_model, 256);
  EXPECT_EQ(c.optimizer.name, "adamw");
  EXPECT_EQ(c.total_steps(), c.train.steps);
}

TEST(Config, RoundTripThroughJson) {
  json j = {{"model", {{"layers", 3}, {"heads", 8}, {"kv_heads", 2}}},
            {"moe", {{"experts_total", 16}, {"experts_active", 4}, {"router", "sigmoid"}}},
            {"optimizer", {{"no_decay", {"norm"}}}}};
  const RunConfig c = ConfigFromJson(j);
  EXPECT_EQ(c.model.kv_heads, 2);
  EXPECT_EQ(c.moe.router, "sigmoid");
  const RunConfig back = ConfigFromJson(ConfigToJson(c));
  EXPECT_EQ(ConfigToJson(back), ConfigToJson(c));
  EXPECT_EQ(ConfigHash(back), ConfigHash(c));
}

TEST(Config, UnknownKeyNamesPathAndSuggests) {
  ExpectError({{"model", {{"head", 4}}}}, "model.head", "did you mean 'model.heads'");
  ExpectError({{"modle", {{"heads", 4}}}}, "modle", "did you mean 'model'");
  // Other trainers' names for a field are too far for the edit distance: a table finds them.
  ExpectError({{"optimizer", {{"learning_rate", 1e-3}}}}, "optimizer.learning_rate",
              "did you mean 'optimizer.lr'");
  ExpectError({{"model", {{"n_layer", 4}}}}, "model.n_layer", "did you mean 'model.layers'");
  // A key under the wrong section is found by its leaf name.
  ExpectError({{"model", {{"experts_total", 8}}}}, "model.experts_total",
              "did you mean 'moe.experts_total'");
}

TEST(Config, WrongTypesNamePathAndTypes) {
  ExpectError({{"model", {{"layers", "four"}}}}, "model.layers", "expected an integer, got string");
  ExpectError({{"model", {{"layers", 2.5}}}}, "model.layers", "expected an integer");
  ExpectError({{"model", {{"tie_embeddings", 1}}}}, "model.tie_embeddings",
              "expected true or false");
  ExpectError({{"optimizer", {{"lr", "fast"}}}}, "optimizer.lr", "expected a number");
  ExpectError({{"optimizer", {{"no_decay", {"norm", 3}}}}}, "optimizer.no_decay[1]",
              "expected a string");
  ExpectError({{"model", 3}}, "model", "expected an object");
  ExpectError({{"moe", {{"router", "softmx"}}}}, "moe.router", "not one of: softmax, sigmoid");
}

TEST(Config, ImpossibleCombinations) {
  ExpectError({{"model", {{"d_model", 100}, {"heads", 3}}}}, "model.heads",
              "does not divide d_model");
  ExpectError({{"model", {{"heads", 4}, {"kv_heads", 3}}}}, "model.kv_heads",
              "does not divide heads");
  ExpectError({{"model", {{"heads", 4}, {"kv_heads", 8}}}}, "model.kv_heads", "exceed");
  ExpectError({{"moe", {{"experts_total", 4}, {"experts_active", 6}}}}, "moe.experts_active",
              "exceeds experts_total");
  ExpectError({{"moe", {{"experts_total", 4}, {"dense_layers", 9}}}}, "moe.dense_layers",
              "between 0 and model.layers");
  ExpectError({{"model", {{"d_model", 96}, {"heads", 32}}}}, "model.head_dim", "even for RoPE");
  ExpectError({{"model", {{"qk_norm", true}}}, {"optimizer", {{"qk_clip_tau", 30}}}},
              "model.qk_norm", "QK-Clip");
  ExpectError({{"model", {{"qk_norm", true}, {"attention", "mla"}}}}, "model.qk_norm", "MLA");
  ExpectError({{"optimizer", {{"name", "muonclip"}}}}, "optimizer.qk_clip_tau", "muonclip");
  ExpectError({{"optimizer", {{"no_decay", {"norms"}}}}}, "optimizer.no_decay[0]",
              "unknown parameter kind");
  ExpectError({{"train", {{"steps", 10}}}, {"schedule", {{"warmup_steps", 10}}}},
              "schedule.warmup_steps", "not shorter");
  ExpectError({{"data", {{"source", "markov"}, {"markov_order", 4}}},
               {"model", {{"vocab_size", 4096}}}},
              "data.markov_order", "too many");
}

TEST(Config, TokensSetSteps) {
  const RunConfig c = ConfigFromJson(
      {{"train", {{"tokens", 3e6}, {"batch_size", 8}}}, {"model", {{"seq_len", 256}}}});
  EXPECT_EQ(c.train.tokens, 3000000);
  EXPECT_EQ(c.total_steps(), (3000000 + 2047) / 2048);
}

TEST(Config, HashIgnoresOrderAndNumberSpelling) {
  const json a = json::parse(R"({"train": {"tokens": 3e6, "seed": 7}, "model": {"layers": 2}})");
  const json b = json::parse(R"({"model": {"layers": 2.0}, "train": {"seed": 7, "tokens": 3000000}})");
  EXPECT_EQ(ConfigHash(ConfigFromJson(a)), ConfigHash(ConfigFromJson(b)));
  // Explicit defaults hash like omitted ones.
  EXPECT_EQ(ConfigHash(ConfigFromJson(json::object())),
            ConfigHash(ConfigFromJson({{"model", {{"d_model", 256}}}})));
  // Threads and checkpointing do not change the experiment.
  EXPECT_EQ(ConfigHash(ConfigFromJson({{"train", {{"threads", 1}}}})),
            ConfigHash(ConfigFromJson({{"train", {{"threads", 2}}}})));
  EXPECT_NE(ConfigHash(ConfigFromJson({{"train", {{"seed", 1}}}})),
            ConfigHash(ConfigFromJson({{"train", {{"seed", 2}}}})));
  EXPECT_EQ(ConfigHash(ConfigFromJson(a)).size(), 64u);
}

// optimizer.adamw_lr arrived after runs were recorded: unset (0) it must not enter the hash,
// set it must.
TEST(Config, AdamwLrKeepsOldHashesWhenUnset) {
  RunConfig c = ConfigFromJson(json::object());
  EXPECT_EQ(c.optimizer.adamw_lr, 0.0);
  const std::string unset = ConfigHash(c);
  c.optimizer.adamw_lr = 3e-3;
  EXPECT_NE(ConfigHash(c), unset);
  EXPECT_EQ(ConfigHash(ConfigFromJson({{"optimizer", {{"adamw_lr", 0.0}}}})), unset);
  EXPECT_THROW(ConfigFromJson({{"optimizer", {{"adamw_lr", -1.0}}}}), ConfigError);
}

TEST(Config, MuonDefaultsFollowMuonClipAlgorithm1) {
  // Kimi K2's MuonClip (Algorithm 1) uses plain momentum: O = NS(μM + G).
  EXPECT_FALSE(ConfigFromJson({{"optimizer", {{"name", "muonclip"}, {"qk_clip_tau", 100}}}})
                   .optimizer.muon_nesterov);
}

TEST(Config, CanonicalJsonSortsKeysAndNormalisesNumbers) {
  EXPECT_EQ(CanonicalJson(json::parse(R"({"b": 3e6, "a": [1.5, 2.0, true]})")),
            R"({"a":[1.5,2,true],"b":3000000})");
}

TEST(Config, Sha256KnownVector) {
  EXPECT_EQ(Sha256Hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Config, Overrides) {
  json j = json::object();
  ApplyOverride(j, "model.layers=6");
  ApplyOverride(j, "optimizer.name=muon");
  ApplyOverride(j, "model.tie_embeddings=true");
  ApplyOverride(j, "optimizer.no_decay=[\"norm\"]");
  const RunConfig c = ConfigFromJson(j);
  EXPECT_EQ(c.model.layers, 6);
  EXPECT_EQ(c.optimizer.name, "muon");
  EXPECT_TRUE(c.model.tie_embeddings);
  EXPECT_EQ(c.optimizer.no_decay, std::vector<std::string>{"norm"});
  EXPECT_THROW(ApplyOverride(j, "model.layer=6"), ConfigError);
  EXPECT_THROW(ApplyOverride(j, "noequals"), ConfigError);
}

TEST(Config, DocsFileMatchesCode) {
  const char* src = std::getenv("MOELAB_SOURCE_DIR");
  if (!src) src = MOELAB_SOURCE_DIR_DEFAULT;
  std::ifstream in(std::string(src) + "/docs/config.md");
  ASSERT_TRUE(in) << "docs/config.md missing: run `moelab config docs > docs/config.md`";
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(ss.str(), ConfigDocsMarkdown())
      << "docs/config.md is out of date: run `moelab config docs > docs/config.md`";
}

// Inputs the config fuzzer (fuzz/config_fuzz.cc) found; each was rejected with something other
// than a ConfigError naming a path, or with a message that did not print whole.
ConfigError ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e;
  }
  ADD_FAILURE() << "no ConfigError";
  return ConfigError("", "");
}

TEST(ConfigFuzzRegression, OverrideOnADocumentThatIsNotAnObject) {
  json j = -0;  // nlohmann's type_error 305 escaped from operator[]
  const ConfigError e = ErrorOf([&] { ApplyOverride(j, "model.layers=6"); });
  EXPECT_EQ(e.path(), "(root)");
  EXPECT_THAT(e.reason(), HasSubstr("expected an object, got number"));
}

TEST(ConfigFuzzRegression, OverrideValueThatIsNotUtf8) {
  json j = json::object();
  // A bare word became a string that nlohmann cannot dump: type_error 316 from the error
  // message (an integer field) or from the config hash (a string field, accepted before).
  ConfigError e = ErrorOf([&] { ApplyOverride(j, "model.layers=\xb3\xb3"); });
  EXPECT_EQ(e.path(), "model.layers");
  EXPECT_THAT(e.reason(), HasSubstr("not valid UTF-8"));
  e = ErrorOf([&] { ApplyOverride(j, "data.path=caf\xe9"); });
  EXPECT_EQ(e.path(), "data.path");
}

TEST(ConfigFuzzRegression, NumberOutOfRange) {
  json j = json::object();
  const ConfigError e = ErrorOf([&] { ApplyOverride(j, "optimizer.lr=1e999"); });
  EXPECT_EQ(e.path(), "optimizer.lr");
  EXPECT_THAT(e.reason(), HasSubstr("the number 1e999 is out of range"));
  // In a file: nlohmann's out_of_range 406 is not a parse_error and escaped LoadConfigFile.
  const std::string path = ::testing::TempDir() + "config_fuzz_1e686.json";
  std::ofstream(path) << R"({"optimizerlearte": 1e686})";
  const ConfigError f = ErrorOf([&] { LoadConfigFile(path); });
  EXPECT_EQ(f.path(), path);
  EXPECT_THAT(f.reason(), HasSubstr("not valid JSON"));
  EXPECT_THAT(f.reason(), HasSubstr("number overflow"));
  // nlohmann's message quotes the raw bytes it last read: a DEL reached the terminal.
  std::ofstream(path) << "{\"model\": {\"heads\": 32}\x7f";
  const ConfigError g = ErrorOf([&] { LoadConfigFile(path); });
  EXPECT_THAT(std::string(g.what()), HasSubstr("32}\\u007f"));
}

TEST(ConfigFuzzRegression, EmptyKeyAndEmptyOverrideNameWhereTheyAre) {
  ExpectError(json::parse(R"({"": {"d_model": 32}})"), "(root)", "empty key");
  ExpectError(json::parse(R"({"model": {"": 32}})"), "model", "empty key");
  json j = json::object();
  const ConfigError e = ErrorOf([&] { ApplyOverride(j, ""); });
  EXPECT_EQ(e.path(), "--set ''");
  EXPECT_THAT(e.reason(), HasSubstr("path.to.key=value"));
}

TEST(ConfigFuzzRegression, ControlCharactersFromTheInputAreEscapedInMessages) {
  // A key starting with NUL made what() an empty C string.
  const ConfigError e = ErrorOf([] { ConfigFromJson({{std::string("\0x", 2), 1}}); });
  EXPECT_THAT(std::string(e.what()), ::testing::StartsWith("\\u0000x: unknown key"));
  const ConfigError f = ErrorOf([] {
    ConfigFromJson({{"moe", {{"router", std::string("soft\0max\x1b", 9)}}}});
  });
  EXPECT_THAT(std::string(f.what()), HasSubstr("'soft\\u0000max\\u001b' is not one of"));
  json j = json::object();
  const ConfigError g = ErrorOf([&] { ApplyOverride(j, std::string("model.\0x=1", 10)); });
  EXPECT_THAT(std::string(g.what()), HasSubstr("model.\\u0000x: unknown key"));
}

}  // namespace
}  // namespace moelab
