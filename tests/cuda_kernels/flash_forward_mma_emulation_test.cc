// The mma.sync forward of the fused attention (kernels/cuda/flash_forward_mma.cuh) run on the
// CPU under tests/cuda_kernels/emulation/cuda_emulation.h, whose emulated mma.sync and ldmatrix
// form each lane's registers from the documented fragment layouts: out, LSE and S_max against
// the CPU attention in double (flash_reference.h, the GPU test's tolerances) on every
// instantiated head-dim pair, and against the wmma forward (flash_emulation_test.cc) on one
// shape. The GPU twin is flash_attention_test.cc under attention_kernel "mma" (its Mma/ tests,
// which the GPU check runs in their own process).
// clang-format off
// The emulation first: it replaces the CUDA primitives the kernel headers use.
#include "tests/cuda_kernels/emulation/cuda_emulation.h"
#include "kernels/cuda/flash_forward_mma.cuh"
// clang-format on

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "tests/cuda_kernels/flash_reference.h"

namespace moelab::cuda::flash {
namespace {

using testing::ExpectNear;
using testing::FlashCase;
using testing::FlashEmulationBuffers;
using testing::FlashReference;
using testing::UniformFlashCase;

struct Forward {
  std::vector<float> out, lse, pmax;
};

// The forward's launch (FlashAttentionForward) on the emulation, outputs poisoned with NaN.
template <typename T, int DQK, int DV>
Forward RunForward(const FlashReference& ref, bool mma) {
  const AttentionDims& a = ref.a;
  const Params p = MakeParams(a);
  FlashEmulationBuffers<T> b(ref);
  const size_t pairs = size_t(a.batch) * a.heads;
  if (mma) {
    constexpr int tile = kTile * MmaRowBlocks(DQK, DV);
    emu::Launch(dim3(pairs, (a.seq + tile - 1) / tile), kThreads, FwdMmaSmem<DQK, DV>::kBytes, [&] {
      FlashForwardMmaKernel<T, DQK, DV>(p, b.q, b.k, b.v, b.out.data(), b.lse.data(),
                                        b.pmax.data());
    });
  } else {
    emu::Launch(dim3(pairs, (a.seq + kTile - 1) / kTile), kThreads, FwdSmem<DQK, DV>::kBytes, [&] {
      FlashForwardKernel<T, DQK, DV>(p, b.q, b.k, b.v, b.out.data(), b.lse.data(), b.pmax.data());
    });
  }
  return {b.OutAsFloat(), b.lse, b.pmax};
}

// The forward half of FlashReference::Expect, with its tolerances.
template <typename T, int DQK, int DV>
void ExpectMatchesReference(const FlashCase& c) {
  SCOPED_TRACE(c.name);
  const FlashReference ref(c);
  const Forward f = RunForward<T, DQK, DV>(ref, /*mma=*/true);
  ref.ExpectForward(f.out, f.lse, f.pmax);
}

TEST(FlashForwardMmaEmulation, MhaAcrossTileBoundaries) {
  // Key tiles below, on and past the diagonal: the fast (unmasked) path, the masked one, the end.
  ExpectMatchesReference<bf16, 64, 64>({"mha 64, S=100", 1, 100, 2, 2, 64, 64, 0.0, false});
  // Two 128-query tiles, the second of two rows (its upper half past the end).
  ExpectMatchesReference<bf16, 64, 64>({"mha 64, S=130", 1, 130, 1, 1, 64, 64, 0.0, false});
}

TEST(FlashForwardMmaEmulation, GqaFusedStridesFp32Inputs) {
  ExpectMatchesReference<float, 128, 128>(
      {"gqa 128 fused fp32, S=70", 1, 70, 4, 2, 128, 128, 0.0, true});
  ExpectMatchesReference<bf16, 96, 64>({"96/64 gqa fused, S=64", 1, 64, 4, 2, 96, 64, 0.0, true});
}

TEST(FlashForwardMmaEmulation, MqaSoftCapKeepsRawSmax) {
  // Logits up to ~8 against a cap of 3: the raw S_max lies well above what the softmax saw.
  ExpectMatchesReference<bf16, 64, 64>({"mqa softcap 3, S=77", 1, 77, 2, 1, 64, 64, 3.0, false});
}

TEST(FlashForwardMmaEmulation, MlaUnequalHeadDims) {
  ExpectMatchesReference<bf16, 48, 32>(
      {"mla 48/32 softcap, S=65", 1, 65, 2, 2, 48, 32, 2.0, false});
  ExpectMatchesReference<float, 192, 128>(
      {"mla 192/128 softcap, S=70", 1, 70, 1, 1, 192, 128, 5.0, false});
}

TEST(FlashForwardMmaEmulation, RaggedAndSingleTokenSequences) {
  ExpectMatchesReference<float, 16, 16>({"16/16 softcap, S=17", 2, 17, 2, 2, 16, 16, 2.0, false});
  ExpectMatchesReference<bf16, 32, 32>({"32/32, S=1", 2, 1, 2, 1, 32, 32, 0.0, false});
}

TEST(FlashForwardMmaEmulation, SmaxIgnoresRowsPastTheEnd) {
  // UniformFlashCase at S = 100: the zero-filled rows past the end in the last warp (rows
  // 96–127) score 0 on the key tile below its diagonal and must not reach S_max.
  UniformFlashCase u(100);
  constexpr int D = UniformFlashCase::kD;
  emu::Launch(dim3(1, 1), kThreads, FwdMmaSmem<D, D>::kBytes, [&] {
    FlashForwardMmaKernel<bf16, D, D>(MakeParams(u.a), u.q.data(), u.k.data(), u.v.data(),
                                      u.out.data(), u.lse.data(), u.pmax.data());
  });
  u.Expect();
}

TEST(FlashForwardMmaEmulation, AgreesWithTheWmmaForward) {
  // Both round P to bf16 before P·V; they differ in the order of the fp32 sums and in exp2 vs
  // exp, so out within 1e-2 relative, LSE and S_max (no P involved) within 1e-4.
  const FlashReference ref({"mha 64 softcap 4, S=100", 1, 100, 2, 2, 64, 64, 4.0, false});
  const Forward mma = RunForward<bf16, 64, 64>(ref, true);
  const Forward old = RunForward<bf16, 64, 64>(ref, false);
  double max_abs = 0;
  for (float x : old.out) max_abs = std::max(max_abs, double(std::abs(x)));
  ExpectNear(mma.out, old.out, 1e-2 * max_abs, 1e-2, "out, mma vs wmma");
  ExpectNear(mma.lse, old.lse, 1e-4, 1e-4, "lse, mma vs wmma");
  ExpectNear(mma.pmax, old.pmax, 1e-4, 1e-4, "S_max, mma vs wmma");
}

}  // namespace
}  // namespace moelab::cuda::flash
