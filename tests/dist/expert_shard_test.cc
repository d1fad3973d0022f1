// Sharded expert parallelism without MPI (issue 23): a model built with an ExpertShard holds
// exactly its block of every routed-expert tensor, initialised as the whole model's block, and
// ExpertShardMap cuts the whole model's parameters and optimizer buffers (the checkpoint format)
// into every rank's, for AdamW and Muon. The gather (a collective) is covered end to end by
// tests/dist/train_dist_test.cc (EP checkpoints resumed by one process and vice versa).
#include "core/dist/expert_shard.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/model/model.h"
#include "core/optim/optimizer.h"
#include "tests/common/tiny_configs.h"

namespace moelab {
namespace {

RunConfig MoeConfig(const std::string& optimizer) {
  RunConfig c = test::SmallMoeConfig();
  c.model.heads = 2;
  c.moe.expert_hidden = 24;
  c.optimizer.name = optimizer;
  return c;
}

size_t StateSize(Optimizer& o, const std::string& name) {
  for (const StateBuffer& sb : o.state()) {
    if (sb.name == name) return sb.data->size();
  }
  return 0;
}

TEST(ExpertShard, ShardedModelsHoldTheirBlockOfTheWholeModel) {
  for (const std::string opt : {"adamw", "muon"}) {
    const RunConfig c = MoeConfig(opt);
    Model<float> whole(c);
    whole.Init(5);
    size_t full_n = 0;
    const std::vector<ParamInfo> layout = Model<float>::FullLayout(c, &full_n);
    EXPECT_EQ(full_n, whole.num_params());
    ASSERT_EQ(layout.size(), whole.param_infos().size());
    for (size_t i = 0; i < layout.size(); ++i) {
      EXPECT_EQ(layout[i].offset, whole.param_infos()[i].offset) << layout[i].name;
    }
    const std::unique_ptr<Optimizer> whole_opt = MakeOptimizer(c.optimizer, layout);
    for (const int ep : {2, 4}) {
      const int held = 4 / ep;
      for (int p = 0; p < ep; ++p) {
        Model<float> part(c, ExpertShard{p * held, held});
        part.Init(5);
        EXPECT_LT(part.num_params(), whole.num_params());
        int sharded = 0;
        for (const ParamInfo& info : part.param_infos()) {
          if (info.kind != ParamKind::kExpert) continue;
          ++sharded;
          EXPECT_TRUE(info.sharded());
          EXPECT_EQ(info.batch, held);
          EXPECT_EQ(info.batch_first, p * held);
          EXPECT_EQ(info.batch_total, 4);
        }
        EXPECT_EQ(sharded, 3);  // one MoE layer: w1, w3, w2
        const ExpertShardMap map(part.param_infos(), part.num_params(), layout, full_n,
                                 opt == "muon");
        EXPECT_EQ(map.full_size("params"), full_n);
        EXPECT_EQ(map.local_size("params"), part.num_params());
        // Scatter of the whole model's parameters is exactly the shard's own initialisation.
        std::vector<float> cut(part.num_params(), -1.0f);
        map.Scatter("params", whole.params(), cut.data());
        for (const ParamInfo& info : part.param_infos()) {
          for (size_t i = 0; i < info.size(); ++i) {
            ASSERT_EQ(cut[info.offset + i], part.params()[info.offset + i])
                << opt << " EP " << ep << " rank " << p << " " << info.name << "[" << i << "]";
          }
        }
        // Optimizer buffers: the shard's own optimizer and the whole model's sizes.
        const std::unique_ptr<Optimizer> part_opt = MakeOptimizer(c.optimizer, part.param_infos());
        for (const StateBuffer& sb : part_opt->state()) {
          EXPECT_EQ(map.local_size(sb.name), sb.data->size()) << sb.name;
          EXPECT_EQ(map.full_size(sb.name), StateSize(*whole_opt, sb.name)) << sb.name;
        }
      }
    }
  }
}

TEST(ExpertShard, ModelRejectsShardsOutsideTheExperts) {
  const RunConfig c = MoeConfig("adamw");
  EXPECT_THROW(Model<float>(c, ExpertShard{3, 2}), std::invalid_argument);
  RunConfig dense = c;
  dense.moe.experts_total = 0;
  EXPECT_THROW(Model<float>(dense, ExpertShard{0, 1}), std::invalid_argument);
}

}  // namespace
}  // namespace moelab
