// The fused attention kernels' own source (kernels/cuda/flash_attention_kernels.cuh) run on the
// CPU under tests/cuda_kernels/emulation/cuda_emulation.h against the double CPU reference, with
// the GPU test's tolerances (flash_reference.h). Runs on every machine: it checks the tiling,
// masking, online softmax, barriers and backward formulas where no GPU is lent; the hardware's
// wmma and timing only the GPU test (flash_attention_test.cc) can check.
// clang-format off
// The emulation first: it replaces the CUDA primitives the kernel header uses.
#include "tests/cuda_kernels/emulation/cuda_emulation.h"
#include "kernels/cuda/flash_attention_kernels.cuh"
// clang-format on

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "tests/cuda_kernels/flash_reference.h"

namespace moelab::cuda::flash {
namespace {

using testing::FlashCase;
using testing::FlashReference;

using testing::FromFloat;
using testing::ToFloat;

// The launch sequence of FlashAttentionForward / FlashAttentionBackward, on the emulation.
template <typename T, int DQK, int DV>
void RunCase(const FlashCase& c) {
  SCOPED_TRACE(c.name);
  const FlashReference ref(c);
  const Params p = MakeParams(ref.a);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<T> x(ref.total), dout(ref.dout.size()), out(ref.out.size(), FromFloat<T>(nan));
  for (size_t i = 0; i < x.size(); ++i) x[i] = FromFloat<T>(ref.x[i]);
  for (size_t i = 0; i < dout.size(); ++i) dout[i] = FromFloat<T>(ref.dout[i]);
  const T *q = x.data() + ref.q_off, *k = x.data() + ref.k_off, *v = x.data() + ref.v_off;
  const size_t pairs = size_t(c.batch) * c.heads;
  std::vector<float> lse(ref.lse.size(), nan), pmax(pairs, -INFINITY), d(ref.lse.size(), nan),
      dx(ref.total, nan);
  const unsigned tiles = (c.seq + kTile - 1) / kTile;
  emu::Launch(dim3(pairs, tiles), kThreads, FwdSmem<DQK, DV>::kBytes, [&] {
    FlashForwardKernel<T, DQK, DV>(p, q, k, v, out.data(), lse.data(), pmax.data());
  });
  const long rows = long(pairs) * c.seq;
  emu::Launch(dim3((rows * 32 + 255) / 256), 256, 0,
              [&] { RowDotKernel<T>(p, c.v_dim, out.data(), dout.data(), d.data()); });
  emu::Launch(dim3(c.batch * c.kv_heads, tiles), kThreads, BwdSmem<DQK, DV>::kBytes, [&] {
    FlashBackwardKvKernel<T, DQK, DV>(p, q, k, v, lse.data(), d.data(), dout.data(),
                                      dx.data() + ref.k_off, dx.data() + ref.v_off);
  });
  emu::Launch(dim3(pairs, tiles), kThreads, BwdSmem<DQK, DV>::kBytes, [&] {
    FlashBackwardQKernel<T, DQK, DV>(p, q, k, v, lse.data(), d.data(), dout.data(),
                                     dx.data() + ref.q_off);
  });
  std::vector<float> got_out(out.size());
  for (size_t i = 0; i < out.size(); ++i) got_out[i] = ToFloat(out[i]);
  ref.Expect(got_out, lse, pmax, dx);
}

// Small shapes (the emulation runs a thread per CUDA thread): every tile boundary case, GQA with
// fused strides, soft-cap, MLA's unequal dims, both input types.
TEST(CudaFlashEmulation, MhaAndMqaSoftCapAcrossTileBoundaries) {
  RunCase<bf16, 64, 64>({"mha 64, S=100", 1, 100, 2, 2, 64, 64, 0.0, false});
  RunCase<bf16, 64, 64>({"mqa softcap 3, S=77", 1, 77, 2, 1, 64, 64, 3.0, false});
}

TEST(CudaFlashEmulation, GqaFusedStridesFp32Inputs) {
  RunCase<float, 128, 128>({"gqa 128 fused fp32, S=70", 1, 70, 4, 2, 128, 128, 0.0, true});
}

TEST(CudaFlashEmulation, MlaUnequalDimsAndShortSequences) {
  RunCase<bf16, 48, 32>({"mla 48/32, S=65", 1, 65, 2, 2, 48, 32, 2.0, false});
  RunCase<float, 16, 16>({"16/16 softcap, S=17", 2, 17, 2, 2, 16, 16, 2.0, false});
  RunCase<bf16, 32, 32>({"32/32, S=1", 2, 1, 2, 1, 32, 32, 0.0, false});
}

}  // namespace
}  // namespace moelab::cuda::flash
