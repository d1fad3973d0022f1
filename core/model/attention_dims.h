// The attention kernels' dimensions for a model config (MHA/GQA over fused q|k|v rows, or MLA's
// per-head q/k of qk_nope + qk_rope and v of v_head_dim), the one derivation the CPU model and
// the CUDA model both use.
#pragma once

#include "core/config.h"
#include "kernels/cpu/attention.h"

namespace moelab {

// batch is left 0: the models set it for each forward.
cpu::AttentionDims AttentionDimsOf(const ModelConfig& m);

}  // namespace moelab
