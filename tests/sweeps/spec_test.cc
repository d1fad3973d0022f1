// Spec expansion and validation: axes, zip, runs, random, seeds, derived expressions and the
// error message of every kind of bad spec.
#include "sweeps/spec.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/flops.h"
#include "tests/common/test_util.h"
#include "tests/sweeps/spec_fixture.h"

namespace moelab::sweeps {
namespace {

namespace fs = std::filesystem;

using test_specs::Base;

ojson Spec(const std::string& extra) {
  ojson s = ojson::parse(extra);
  if (!s.contains("name")) s["name"] = "t";
  if (!s.contains("base")) s["base"] = Base();
  return s;
}

using test_specs::ErrorOf;

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

TEST(SpecTest, GridIsCartesianLastAxisFastest) {
  const Sweep s = ExpandSpec(Spec(R"({"grid": {"model.layers": [1, 2], "optimizer.lr": [0.1,
                                     0.2, 0.3]}})"));
  ASSERT_EQ(s.runs.size(), 6u);
  EXPECT_EQ(s.runs[0].config.model.layers, 1);
  EXPECT_DOUBLE_EQ(s.runs[1].config.optimizer.lr, 0.2);
  EXPECT_EQ(s.runs[3].config.model.layers, 2);
  EXPECT_EQ(s.runs[3].name, "t/layers=2,lr=0.1");
  EXPECT_EQ(s.runs[5].vars["optimizer.lr"], 0.3);
  for (size_t i = 0; i < s.runs.size(); ++i) EXPECT_EQ(s.runs[i].duplicate_of, -1);
}

TEST(SpecTest, ZipRunsRandomSeedsCompose) {
  const Sweep s = ExpandSpec(Spec(R"({
    "runs": [{"optimizer.name": "adamw"}, {"optimizer.name": "adamw", "optimizer.lr": 0.01}],
    "zip": [{"model.d_model": [32, 64], "model.heads": [2, 4]}],
    "random": {"count": 3, "seed": 7, "params": {
        "optimizer.weight_decay": {"uniform": [0, 0.2]},
        "optimizer.beta2": {"log_uniform": [0.9, 0.99]},
        "moe.experts_total": {"int_uniform": [2, 8]},
        "schedule.type": {"choice": ["cosine", "wsd"]}}},
    "seeds": [1, 2]
  })"));
  ASSERT_EQ(s.runs.size(), 2u * 2u * 3u * 2u);
  EXPECT_EQ(s.runs[0].config.model.d_model, 32);
  EXPECT_EQ(s.runs[0].config.model.heads, 2);
  EXPECT_EQ(s.runs[6].config.model.d_model, 64);
  EXPECT_EQ(s.runs[6].config.model.heads, 4);
  EXPECT_EQ(s.runs[1].config.train.seed, 2u);
  EXPECT_DOUBLE_EQ(s.runs[12].config.optimizer.lr, 0.01);
  for (const SweepRun& r : s.runs) {
    EXPECT_GE(r.config.optimizer.weight_decay, 0);
    EXPECT_LE(r.config.optimizer.weight_decay, 0.2);
    EXPECT_GE(r.config.optimizer.beta2, 0.9);
    EXPECT_LE(r.config.optimizer.beta2, 0.99);
    EXPECT_GE(r.config.moe.experts_total, 2);
    EXPECT_LE(r.config.moe.experts_total, 8);
  }
  // The same seed gives the same samples: a random sweep is resumable.
  const Sweep again = ExpandSpec(s.spec);
  for (size_t i = 0; i < s.runs.size(); ++i) EXPECT_EQ(s.runs[i].hash, again.runs[i].hash);
}

TEST(SpecTest, DerivedFieldsInOrderWithModelQuantities) {
  const Sweep s = ExpandSpec(Spec(R"({
    "vars": {"head_ratio": 1},
    "grid": {"sparsity": [2, 4], "head_ratio": [1, 2]},
    "derived": ["moe.experts_total = sparsity * moe.experts_active",
                "model.heads = model.layers * head_ratio",
                "train.tokens = 2 * params_active",
                "ratio = params_total / params_active"]
  })"));
  ASSERT_EQ(s.runs.size(), 4u);
  const SweepRun& r = s.runs[3];
  EXPECT_EQ(r.config.moe.experts_total, 8);
  EXPECT_EQ(r.config.model.heads, 4);
  // params_active is computed from the config as built so far (after experts and heads).
  EXPECT_EQ(r.config.train.tokens, 2 * CountParams(r.config).active);
  EXPECT_NEAR(r.vars["ratio"].get<double>(),
              static_cast<double>(CountParams(r.config).total) / CountParams(r.config).active,
              1e-9);
  EXPECT_EQ(r.vars["sparsity"], 4);
  EXPECT_TRUE(s.warnings.empty()) << s.warnings[0];
}

TEST(SpecTest, DuplicateConfigsAreTrainedOnceAndUnusedVariablesWarn) {
  const Sweep s = ExpandSpec(Spec(R"({"grid": {"layer": [1, 2]}})"));
  ASSERT_EQ(s.runs.size(), 2u);
  EXPECT_EQ(s.runs[1].duplicate_of, 0);
  EXPECT_EQ(s.Unique().size(), 1u);
  ASSERT_FALSE(s.warnings.empty());
  EXPECT_HAS(s.warnings[0], "'layer' is not used");
  // It names the real path (before: "a config path such as 'section.layer'").
  EXPECT_HAS(s.warnings[0], "did you mean the config path 'model.layers'?");
  const Sweep h = ExpandSpec(Spec(R"({"grid": {"n_heads": [2, 4]}})"));
  ASSERT_FALSE(h.warnings.empty());
  EXPECT_HAS(h.warnings[0], "did you mean the config path 'model.heads'?");
}

TEST(SpecTest, BaseFromPathRelativeToSpec) {
  test::TempDir tmp("spec");
  const fs::path dir = tmp.path();
  fs::create_directories(dir / "sub");
  std::ofstream(dir / "sub" / "base.json") << Base().dump();
  std::ofstream(dir / "sub" / "spec.json") << R"({"base": "base.json", "seeds": [1, 2]})";
  const Sweep s = LoadSweep((dir / "sub" / "spec.json").string());
  EXPECT_EQ(s.name, "spec");  // the file name when the spec has none
  EXPECT_EQ(s.runs.size(), 2u);
  EXPECT_TRUE(s.spec["base"].is_object());  // inlined, so the stored spec stands alone
  // The same from an editor's buffer: the base next to the named file, syntax errors at their
  // line and column.
  const std::string text = R"({"base": "base.json", "seeds": [1, 2, 3]})";
  EXPECT_EQ(ExpandSpec(ParseSpecText(text, (dir / "sub" / "x.json").string())).runs.size(), 3u);
  try {
    ParseSpecText("{\n  \"seeds\": [1,\n  ]\n}", "e.json");
    ADD_FAILURE() << "no error";
  } catch (const SpecError& e) {
    EXPECT_HAS(e.what(), "e.json: not valid JSON (line 3, column 3)");
  }
}

TEST(SpecTest, WsdDecayStart) {
  RunConfig c;
  c.schedule.type = "wsd";
  c.schedule.decay_fraction = 0.25;
  c.schedule.warmup_steps = 2;
  c.train.steps = 16;
  EXPECT_EQ(WsdDecayStart(c), 12);
}

// ---- Bad specs: each a clear error naming where and why. ----

TEST(SpecErrorTest, UnknownPathWithDidYouMean) {
  const std::string e = ErrorOf(Spec(R"({"grid": {"model.layer": [1, 2]}})"));
  EXPECT_HAS(e, "grid");
  EXPECT_HAS(e, "model.layer");
  EXPECT_HAS(e, "did you mean 'model.layers'");
}

TEST(SpecErrorTest, ExpressionErrorNamesFieldAndMuParserMessage) {
  const std::string e =
      ErrorOf(Spec(R"({"grid": {"s": [2]}, "derived": ["moe.experts_total = s * * 2"]})"));
  EXPECT_HAS(e, "run #0 (s=2)");
  EXPECT_HAS(e, "derived[0] 'moe.experts_total = s * * 2'");
  EXPECT_HAS(e, "expression error");
  const std::string unknown =
      ErrorOf(Spec(R"({"grid": {"s": [2]}, "derived": ["moe.experts_total = sparsity * 2"]})"));
  EXPECT_HAS(unknown, "sparsity");
}

// A misspelled variable in an expression: muParser's "Unexpected token" alone does not say what
// went wrong; the message names the token and the variable it is nearest to.
TEST(SpecErrorTest, MisspelledVariableInAnExpressionGetsADidYouMean) {
  const std::string e = ErrorOf(
      Spec(R"({"grid": {"sparsity": [2, 4]}, "derived": ["moe.experts_total = sparsty * 2"]})"));
  EXPECT_HAS(e, "'sparsty' is not a sweep variable");
  EXPECT_HAS(e, "did you mean 'sparsity'?");
  const std::string far = ErrorOf(
      Spec(R"({"grid": {"sparsity": [2]}, "derived": ["moe.experts_total = zzzzzzzz * 2"]})"));
  EXPECT_HAS(far, "'zzzzzzzz' is not a sweep variable");
  EXPECT_EQ(far.find("did you mean"), std::string::npos) << far;
}

// A corpus folder that does not exist makes every run that reads it invalid, not just the first.
TEST(SpecErrorTest, MissingCorpusMakesEveryRunInvalid) {
  ojson spec = Spec(R"({"grid": {"optimizer.lr": [0.1, 0.2, 0.3]}})");
  spec["base"]["data"] = {{"source", "corpus"}, {"path", "/nonexistent/moelab-corpus"}};
  ExpandOptions o;
  o.check_data = true;
  try {
    ExpandSpec(spec, o);
    FAIL() << "expected an error";
  } catch (const SpecError& e) {
    EXPECT_HAS(e.what(), "all 3 runs are invalid; nothing was started");
    EXPECT_HAS(e.what(), "run #2 (optimizer.lr=0.3): data.path:");
  }
  spec["grid"]["optimizer.lr"] = ojson::array({0.1});
  try {
    ExpandSpec(spec, o);
    FAIL() << "expected an error";
  } catch (const SpecError& e) {
    EXPECT_HAS(e.what(), "its only run is invalid");
  }
}

TEST(SpecErrorTest, NonIntegralResultForIntegerField) {
  const std::string e = ErrorOf(Spec(R"({"grid": {"r": [1.5]}, "derived": ["model.layers = r"]})"));
  EXPECT_HAS(e, "model.layers is an integer field");
  EXPECT_HAS(e, "1.5");
  // Integral within tolerance is accepted and rounded.
  const Sweep s =
      ExpandSpec(Spec(R"({"grid": {"r": [0.1]}, "derived": ["model.layers = r * 20"]})"));
  EXPECT_EQ(s.runs[0].config.model.layers, 2);
}

TEST(SpecErrorTest, TypeMismatch) {
  const std::string e = ErrorOf(Spec(R"({"grid": {"model.layers": [2, "four"]}})"));
  EXPECT_HAS(e, "1 of 2 runs are invalid");
  EXPECT_HAS(e, "run #1 (model.layers=four)");
  EXPECT_HAS(e, "model.layers: expected");
  const std::string d = ErrorOf(Spec(R"({"derived": ["optimizer.name = 2"]})"));
  EXPECT_HAS(d, "optimizer.name");
  EXPECT_HAS(d, "only produce numbers");
}

TEST(SpecErrorTest, EmptyAxisAndUnevenZip) {
  EXPECT_HAS(ErrorOf(Spec(R"({"grid": {"model.layers": []}})")), "grid.model.layers: empty axis");
  EXPECT_HAS(ErrorOf(Spec(R"({"seeds": []})")), "seeds: empty axis");
  EXPECT_HAS(ErrorOf(Spec(R"({"runs": []})")), "runs: empty");
  EXPECT_HAS(ErrorOf(Spec(R"({"zip": [{"model.layers": [1, 2], "model.heads": [2]}]})")),
             "same length");
}

TEST(SpecErrorTest, InvalidCombinationNamesRunAndPath) {
  const std::string e = ErrorOf(Spec(R"({"grid": {"moe.experts_active": [2, 9]}})"));
  EXPECT_HAS(e, "run #1 (moe.experts_active=9)");
  EXPECT_HAS(e, "moe.experts_active");
  EXPECT_HAS(e, "nothing was started");
}

TEST(SpecErrorTest, ModelQuantityOfInvalidConfig) {
  // experts_active 9 > experts_total 4 until the first derived field fixes it: using
  // params_active before that is an error, after it is fine.
  ojson bad = Spec(R"({"derived": ["train.tokens = 10 * params_active",
                                    "moe.experts_total = 16"]})");
  bad["base"]["moe"]["experts_active"] = 9;
  EXPECT_HAS(ErrorOf(bad), "params_active needs a valid config");
  ojson good = Spec(R"({"derived": ["moe.experts_total = 16",
                                     "train.tokens = 10 * params_active"]})");
  good["base"]["moe"]["experts_active"] = 9;
  EXPECT_EQ(ErrorOf(good), "");
}

TEST(SpecErrorTest, MultiRankUnknownKeysAndBase) {
  EXPECT_HAS(ErrorOf(Spec(R"({"ranks": 0})")), "ranks: expected an integer from 1");
  EXPECT_HAS(ErrorOf(Spec(R"({"gird": {}})")), "gird: unknown key");
  ojson s = Spec("{}");
  s["base"]["model"]["layerz"] = 2;
  EXPECT_HAS(ErrorOf(s), "base: model.layerz: unknown key");
  EXPECT_HAS(ErrorOf(Spec(R"({"grid": {"params_active": [1]}})")), "cannot be assigned");
  EXPECT_HAS(ErrorOf(Spec(R"({"grid": {"model": [1]}})")), "is a config section");
  EXPECT_HAS(
      ErrorOf(Spec(R"({"random": {"count": 2, "params": {"optimizer.lr": {"gauss": [1, 2]}}}})")),
      "unknown distribution");
}

// Inputs found with the sweep-spec fuzz target (fuzz/sweep_spec_fuzz.cc): undefined behaviour
// (UBSan), an exception other than SpecError, or a message that misreported the value.
TEST(SpecFuzzRegression, IntUniformBoundsBeyondInt64AreRefused) {
  // static_cast<int64_t>(1e300) and b - a + 1 for [-9e18, 9e18] were undefined behaviour.
  EXPECT_HAS(ErrorOf(Spec(R"({"random": {"count": 2, "seed": 1,
                               "params": {"x": {"int_uniform": [1e300, 1e300]}}}})")),
             "random.params.x.int_uniform: bounds must lie within ±2^53 (9007199254740992)");
  EXPECT_HAS(ErrorOf(Spec(R"({"random": {"count": 2, "seed": 1,
                      "params": {"model.layers": {"int_uniform": [-9e18, 9e18]}}}})")),
             "bounds must lie within ±2^53");
  // No integer in [0.2, 0.8]: it drew 0, outside the bounds.
  EXPECT_HAS(ErrorOf(Spec(R"({"random": {"count": 1,
                               "params": {"model.layers": {"int_uniform": [0.2, 0.8]}}}})")),
             "random.params.model.layers.int_uniform: no integer lies in [0.2, 0.8]");
  EXPECT_HAS(ErrorOf(Spec(R"({"random": {"count": 1,
                      "params": {"optimizer.lr": {"uniform": [-1.7e308, 1.7e308]}}}})")),
             "too wide to sample");
}

TEST(SpecFuzzRegression, DerivedIntegerBeyondInt64NamesTheValue) {
  // llround(1e30) is INT64_MIN: the error said "got number -9223372036854775808".
  const std::string e =
      ErrorOf(Spec(R"({"grid": {"s": [1]}, "derived": ["model.layers = 1e30 * s"]})"));
  EXPECT_HAS(e, "'model.layers = 1e30 * s': 1e+30 is beyond the integer range");
  EXPECT_EQ(e.find("-9223372036854775808"), std::string::npos) << e;
}

TEST(SpecFuzzRegression, NumberOverflowInTheTextIsASpecError) {
  // nlohmann's out_of_range 406 is not a parse_error: it escaped ParseSpecText.
  try {
    ParseSpecText(R"({"grid": {"optimizer.lr": [1e686]}})", "o.json");
    ADD_FAILURE() << "no error";
  } catch (const SpecError& e) {
    EXPECT_HAS(e.what(), "o.json: not valid JSON");
    EXPECT_HAS(e.what(), "number overflow");
  }
}

TEST(SpecFuzzRegression, ControlCharactersInKeysAreEscaped) {
  ojson spec = Spec("{}");
  spec["grid"] = {{std::string("\0bad", 4), {1}}};
  const std::string e = ErrorOf(spec);
  EXPECT_HAS(e, "'\\u0000bad' is neither a config path");
}

}  // namespace
}  // namespace moelab::sweeps
