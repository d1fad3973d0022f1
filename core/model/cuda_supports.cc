// The checks that a CUDA run can start (core/model/cuda_backend.h): kernel choices this build
// or model cannot run, NCCL for several ranks, the expert exchange's row width. ConfigError
// names the JSON path, before anything runs.
#include <stdexcept>
#include <string>
#include <utility>

#include "core/device.h"
#include "core/comm/collective_wait.h"
#include "core/comm/nccl_communicator.h"
#include "core/kernel_choices.h"
#include "core/model/cuda_backend.h"

#if MOELAB_HAVE_CUDA
#include "core/model/cuda_backend_choices.h"
#include "kernels/cuda/cudnn_grouped_matmul.h"
#include "kernels/cuda/moe_routing.h"
#endif

namespace moelab {

void RequireCudaSupports(const RunConfig& c, int world, int expert_parallel) {
  if (c.train.device != "cuda") return;
  const KernelChoices& k = c.train.kernels;
  std::string why;
  // A kernel choice this build cannot run (core/kernel_choices.h) stops the run here.
  KernelBuild build;
  build.cuda = CudaCompiledIn();
#if MOELAB_HAVE_CUDA
  if (k.experts == "cudnn") build.cudnn = cuda::CudnnGroupedMatmulAvailable(&build.cudnn_why);
#endif
  RequireKernelChoicesBuildable(k, build);
#if MOELAB_HAVE_CUDA
  ChooseFlash(c);  // attention "fused" where the kernels cannot run the shape: a ConfigError
  // experts "cudnn" runs where it can (bf16, an MoE model, no expert parallelism; the grouped
  // GEMMs elsewhere), and there it needs 16-byte rows.
  if (k.experts == "cudnn" && c.train.effective_precision() == "bf16" && c.moe.experts_total > 0 &&
      expert_parallel <= 1) {
    for (auto [path, width] : {std::pair{"model.d_model", c.model.d_model},
                               std::pair{"moe.expert_hidden", c.moe.expert_hidden}}) {
      if (width % 8 != 0) {
        throw ConfigError(path,
                          "train.kernels.experts \"cudnn\" needs a multiple of 8 (16-byte "
                          "rows), got " +
                              std::to_string(width));
      }
    }
  }
  RequireDeviceExpertsRunnable(k, c.train.effective_precision(), c.moe.experts_total,
                               expert_parallel, c.model.d_model, c.moe.expert_hidden);
  // The sort plan tallies every expert in one block's shared memory: more would stop the run
  // at its first MoE layer.
  if (k.dispatch == "sort" && c.moe.experts_total > cuda::kMoeSortMaxExperts) {
    throw ConfigError("moe.experts_total",
                      "train.kernels.dispatch \"sort\" counts at most " +
                          std::to_string(cuda::kMoeSortMaxExperts) + " experts, got " +
                          std::to_string(c.moe.experts_total) + " (the scan plan has no limit)");
  }
#endif
  if (world > 1) {
    if (!NcclCommunicator::Available(&why)) {
      throw ConfigError("train.device", "several ranks on \"cuda\" reduce over NCCL, but " + why);
    }
    try {  // the NCCL collectives' time-out (core/comm/collective_wait.h)
      CollectiveTimeoutSeconds();
    } catch (const std::invalid_argument& e) {
      throw ConfigError("train.device", e.what());
    }
  }
  // The expert exchange moves rows as 4-byte words (core/model/expert_exchange.h).
  if (expert_parallel > 1 && c.train.effective_precision() == "bf16" && c.model.d_model % 2 != 0) {
    throw ConfigError("model.d_model",
                      "expert parallelism in bf16 needs an even d_model (rows travel as 4-byte "
                      "words)");
  }
}

}  // namespace moelab
