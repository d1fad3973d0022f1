// docs/extending.md's "An optimizer" recipe, followed literally in a test: a toy optimizer (plain
// SGD, w -= lr·g) written against the Optimizer interface of core/optim/optimizer.h and driven
// by the model the way the trainer drives one. It checks the contract the recipe states: Step
// covers the whole arena, the padding between tensors stays untouched, state() names every
// buffer a checkpoint must save (none for SGD), groups() maps every tensor, and the loss falls.
// The registration steps of the recipe (the name in optimizer.name's allowed values and in
// MakeOptimizer) are code edits this test cannot make: it checks the refusal they remove.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/model/model.h"
#include "core/optim/optimizer.h"
#include "tests/common/tiny_configs.h"

namespace moelab {
namespace {

// Recipe step 1: a class implementing Optimizer over the flat arenas.
class PlainSgd : public Optimizer {
 public:
  explicit PlainSgd(const std::vector<ParamInfo>& params) : params_(params) {}

  void Step(float* params, const float* grads, double lr, int64_t step) override {
    (void)step;
    // Only the tensors: the padding between them is never written (docs/model.md, Parameters).
    for (const ParamInfo& p : params_) {
      for (size_t i = p.offset; i < p.offset + p.size(); ++i) {
        params[i] -= static_cast<float>(lr) * grads[i];
      }
    }
  }
  std::vector<StateBuffer> state() override { return {}; }  // stateless: nothing to checkpoint
  std::vector<std::pair<std::string, std::string>> groups() const override {
    std::vector<std::pair<std::string, std::string>> out;
    for (const ParamInfo& p : params_) out.emplace_back(p.name, "sgd");
    return out;
  }

 private:
  std::vector<ParamInfo> params_;
};

TEST(ToyOptimizer, PlainSgdTrainsTheModelThroughTheOptimizerInterface) {
  RunConfig c = test::TinyDenseConfig();
  c.model.heads = 2;
  c.model.kv_heads = 2;
  Model<float> model(c);
  model.Init(7);
  std::unique_ptr<Optimizer> opt = std::make_unique<PlainSgd>(model.param_infos());

  const int batch = 4;
  const std::vector<int32_t> tokens =
      test::RandomTokens(batch, c.model.seq_len, c.model.vocab_size, /*seed=*/3);

  // Which arena elements belong to no tensor (alignment padding): they must stay 0.
  std::vector<bool> in_tensor(model.num_params(), false);
  for (const ParamInfo& p : model.param_infos()) {
    for (size_t i = p.offset; i < p.offset + p.size(); ++i) in_tensor[i] = true;
  }

  const double first = model.ForwardBackward(tokens.data(), batch, nullptr);
  double last = first;
  for (int64_t step = 1; step <= 20; ++step) {
    opt->Step(model.params(), model.grads(), 0.5, step);
    model.ParamsChanged();  // as the trainer does after every update
    last = model.ForwardBackward(tokens.data(), batch, nullptr);
    ASSERT_TRUE(std::isfinite(last)) << "step " << step;
  }
  EXPECT_LT(last, first - 0.1) << "first " << first << " last " << last;
  for (size_t i = 0; i < model.num_params(); ++i) {
    if (!in_tensor[i]) {
      EXPECT_EQ(model.params()[i], 0.0f) << "padding element " << i;
    }
  }
  EXPECT_TRUE(opt->state().empty());
  EXPECT_EQ(opt->groups().size(), model.param_infos().size());
}

TEST(ToyOptimizer, AnUnregisteredNameIsRefusedAtTheConfigPath) {
  // Until the recipe's registration steps are done, the name fails validation at its JSON path
  // (before anything runs) and MakeOptimizer refuses it by name.
  nlohmann::json j = {{"optimizer", {{"name", "sgd"}}}};
  try {
    ConfigFromJson(j);
    FAIL() << "optimizer.name 'sgd' was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer.name"), std::string::npos) << e.what();
  }
  OptimizerConfig oc;
  oc.name = "sgd";
  try {
    MakeOptimizer(oc, {});
    FAIL() << "MakeOptimizer built an unregistered optimizer";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("'sgd'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moelab
