// The dist config section and the layout check (no MPI needed).
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "core/config.h"
#include "core/comm/communicator.h"
#include "core/dist/layout.h"
#include "tests/common/errors.h"

namespace moelab {
namespace {

using nlohmann::json;

// Hashes printed by `moelab config check` of main before the dist section existed: runs
// recorded then must keep their hash (and their checkpoints).
TEST(DistConfig, HashOfConfigsWithoutDistUnchanged) {
  EXPECT_EQ(ConfigHash(ConfigFromJson(json::object())),
            "c4221220c57a491d9957359f6f761e7fc893b63ffa4dcf343944e4c2575ebe3f");
  const json moe = {{"model", {{"d_model", 64}}},
                    {"moe", {{"experts_total", 8}}},
                    {"optimizer", {{"name", "muonclip"}, {"qk_clip_tau", 100}}}};
  // MuonClip's default momentum became plain (K2 Algorithm 1; issue 13), a different experiment,
  // so this hash changed with it (was 1d65bf2a...); AdamW hashes, like the default above, did not.
  // moe.balance's default became aux_free (issue 23): the config as it was (aux_loss, now
  // explicit) keeps its hash, the unset one is the new experiment.
  json aux_loss = moe;
  aux_loss["moe"]["balance"] = "aux_loss";
  EXPECT_EQ(ConfigHash(ConfigFromJson(aux_loss)),
            "585368ddc332d6579ba3568c38daf78c0f0900baaa1c1fd0de909da368363644");
  EXPECT_EQ(ConfigHash(ConfigFromJson(moe)),
            "eed37c9b2ec2e55a62bbf5f42822d9e3113e27bf8d7c333146c2f623537f147d");
  // The layout is not part of the experiment: a run resumes at another layout.
  json with_dist = moe;
  with_dist["dist"] = {{"zero1", true}, {"expert_parallel", 2}, {"bucket_mb", 1}};
  EXPECT_EQ(ConfigHash(ConfigFromJson(with_dist)), ConfigHash(ConfigFromJson(moe)));
  EXPECT_EQ(BranchHash(ConfigFromJson(with_dist)), BranchHash(ConfigFromJson(moe)));
  // Round trip keeps the section.
  const RunConfig back = ConfigFromJson(ConfigToJson(ConfigFromJson(with_dist)));
  EXPECT_TRUE(back.dist.zero1);
  EXPECT_EQ(back.dist.expert_parallel, 2);
}

std::string ErrorOf(const json& j) {
  return test::ConfigErrorOf([&] { ConfigFromJson(j); }, "accepted " + j.dump()).what();
}

TEST(DistConfig, ValidationNamesTheField) {
  EXPECT_NE(ErrorOf({{"dist", {{"expert_parallel", 2}}}}).find("needs an MoE model"),
            std::string::npos);
  EXPECT_NE(ErrorOf({{"moe", {{"experts_total", 4}}}, {"dist", {{"expert_parallel", 8}}}})
                .find("dist.expert_parallel: 8 expert-parallel ranks exceed the 4 experts"),
            std::string::npos);
  EXPECT_NE(ErrorOf({{"moe", {{"experts_total", 6}}}, {"dist", {{"expert_parallel", 4}}}})
                .find("do not split evenly"),
            std::string::npos);
  EXPECT_NE(ErrorOf({{"dist", {{"bucket_mb", 0}}}}).find("dist.bucket_mb"), std::string::npos);
  EXPECT_NE(ErrorOf({{"dist", {{"zero_1", true}}}}).find("did you mean 'dist.zero1'"),
            std::string::npos);
}

TEST(DistLayout, SplitsTheGlobalBatch) {
  RunConfig c;
  c.train.batch_size = 8;
  const DistLayout l = MakeDistLayout(c, 4, 3);
  EXPECT_EQ(l.dp, 4);
  EXPECT_EQ(l.ep, 1);
  EXPECT_EQ(l.local_batch, 2);
  EXPECT_EQ(l.rank, 3);
  EXPECT_EQ(MakeDistLayout(c, 1, 0).local_batch, 8);
  try {
    MakeDistLayout(c, 3, 0);
    FAIL() << "8 sequences over 3 ranks accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.path(), "train.batch_size");
  }
  c.moe.experts_total = 4;
  c.dist.expert_parallel = 2;
  try {
    MakeDistLayout(c, 3, 0);
    FAIL() << "world 3 with EP 2 accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.path(), "dist.expert_parallel");
    EXPECT_NE(std::string(e.what()).find("not divisible"), std::string::npos);
  }
}

// The world size comes from the launcher's environment; one process needs no MPI.
TEST(DistLauncher, WorldSizeFromTheEnvironment) {
  const char* saved_ompi = std::getenv("OMPI_COMM_WORLD_SIZE");
  const char* saved_pmi = std::getenv("PMI_SIZE");
  const std::string ompi = saved_ompi ? saved_ompi : "", pmi = saved_pmi ? saved_pmi : "";
  unsetenv("OMPI_COMM_WORLD_SIZE");
  unsetenv("PMI_SIZE");
  EXPECT_EQ(LauncherWorldSize(), 1);
  EXPECT_EQ(MakeWorldCommunicator()->kind(), "single");
  setenv("PMI_SIZE", "3", 1);
  EXPECT_EQ(LauncherWorldSize(), 3);
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  EXPECT_EQ(LauncherWorldSize(), 4);
  setenv("OMPI_COMM_WORLD_SIZE", "1", 1);
  EXPECT_EQ(LauncherWorldSize(), 1);
  unsetenv("OMPI_COMM_WORLD_SIZE");
  unsetenv("PMI_SIZE");
  if (saved_ompi) setenv("OMPI_COMM_WORLD_SIZE", ompi.c_str(), 1);
  if (saved_pmi) setenv("PMI_SIZE", pmi.c_str(), 1);
}

}  // namespace
}  // namespace moelab
