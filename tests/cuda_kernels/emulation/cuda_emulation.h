// A CPU emulation of the CUDA primitives the kernels of kernels/cuda/*.cuh use (fused attention,
// norm, RoPE, optimizer, Newton–Schulz, the MoE dispatch plan), so that the kernels' own source
// runs on machines without a GPU: one std::thread per CUDA thread, blocks one after another;
// static __shared__ arrays are function statics (shared by the block's threads); __syncthreads
// and __syncwarp are real barriers, warp shuffles (xor, up and indexed), votes and matches (full
// warps only) go through a per-warp exchange buffer, atomics are std::atomic_ref,
// and a wmma fragment holds its whole 16×16 tile in every lane (mma_sync computes it with fp32
// sums of bf16 products; store_matrix_sync writes from lane 0 only, so a read of another lane's
// store without a barrier between them sees stale data here too). Pointers and strides handed
// to wmma are checked for the alignment the hardware requires; dynamic shared memory starts each
// block as NaN garbage between guard bands (a write past the launch's size aborts, a read there
// sees NaN). What it cannot show: the hardware's own wmma rounding and layout, memory-model
// subtleties beyond the barriers, speed.
//
// Include this first, then the kernel header; put tests/cuda_kernels/emulation before the CUDA
// include directory so that its mma.h replaces CUDA's.
#pragma once

#define MOELAB_CUDA_EMULATION 1
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>

#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

namespace emu {
struct Ctx {
  uint3 tid, bid;
  dim3 grid, block;
  std::barrier<>* block_bar;
  std::barrier<>* warp_bar;
  double* xbuf;
  unsigned char* smem;
};
inline thread_local Ctx ctx;
// Per warp: 32 doubles for the shuffles, then 96 (192 words: six per lane) for the emulated
// mma.sync's fragment exchange (kernels/cuda/mma.cuh).
constexpr int kWarpScratchDoubles = 128;
inline uint32_t* MmaExchange() { return reinterpret_cast<uint32_t*>(ctx.xbuf + 32); }
}  // namespace emu

// Static shared memory: a function-local static, shared by the block's threads (the emulation
// runs one block at a time, so the next block finds it as garbage, like the hardware's).
#undef __shared__
#define __shared__ static
// The kernels' dynamic shared memory: the emulated block's buffer.
#define MOELAB_FLASH_SMEM(name) unsigned char* name = emu::ctx.smem
#define MOELAB_DYNAMIC_SMEM(type, name) type* name = reinterpret_cast<type*>(emu::ctx.smem)
#undef threadIdx
#undef blockIdx
#undef gridDim
#undef blockDim
#define threadIdx (emu::ctx.tid)
#define blockIdx (emu::ctx.bid)
#define gridDim (emu::ctx.grid)
#define blockDim (emu::ctx.block)

inline void __syncthreads() { emu::ctx.block_bar->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::ctx.warp_bar->arrive_and_wait(); }
namespace emu {
// A warp shuffle: every lane publishes v, then takes lane src(lane)'s (its own where src < 0).
template <typename T, typename Src>
T Shuffle(T v, Src src) {
  static_assert(sizeof(T) <= 8);
  const int lane = threadIdx.x & 31;
  std::memcpy(&ctx.xbuf[lane], &v, sizeof(T));
  __syncwarp();
  T r = v;
  const int from = src(lane);
  if (from >= 0) std::memcpy(&r, &ctx.xbuf[from], sizeof(T));
  __syncwarp();
  return r;
}
}  // namespace emu
template <typename T>
T __shfl_xor_sync(unsigned, T v, int o) {
  return emu::Shuffle(v, [&](int lane) { return lane ^ o; });
}
template <typename T>
T __shfl_sync(unsigned, T v, int src) {
  return emu::Shuffle(v, [&](int) { return src & 31; });
}
template <typename T>
T __shfl_up_sync(unsigned, T v, unsigned delta) {  // lanes below delta keep their own value
  const int dl = static_cast<int>(delta);
  return emu::Shuffle(v, [&](int lane) { return lane >= dl ? lane - dl : -1; });
}
// Warp votes and matches, full warps only: every lane of the warp must call them, as the
// emulated __syncwarp is a barrier of all 32 lanes (a partial mask would deadlock here, so it
// aborts). Each lane publishes its word, the warp meets, each lane builds the answer over the
// 32 words, and the warp meets again before the buffer is reused.
namespace emu {
inline void RequireFullWarp(unsigned mask, const char* what) {
  if (mask != 0xffffffffu) {
    std::fprintf(stderr, "%s: the emulation supports the full-warp mask only (got %#x)\n", what,
                 mask);
    std::abort();
  }
}
// Bit l set where lane l's published 8-byte word satisfies pred(word).
template <typename P>
unsigned WarpVote(uint64_t word, P pred) {
  const int lane = threadIdx.x & 31;
  std::memcpy(&ctx.xbuf[lane], &word, 8);
  __syncwarp();
  unsigned bits = 0;
  for (int l = 0; l < 32; ++l) {
    uint64_t w;
    std::memcpy(&w, &ctx.xbuf[l], 8);
    if (pred(w)) bits |= 1u << l;
  }
  __syncwarp();
  return bits;
}
}  // namespace emu
inline unsigned __ballot_sync(unsigned mask, int pred) {
  emu::RequireFullWarp(mask, "__ballot_sync");
  return emu::WarpVote(pred != 0, [](uint64_t w) { return w != 0; });
}
// The lanes whose value has the same bits as this lane's (T of 4 or 8 bytes, as CUDA's).
template <typename T>
unsigned __match_any_sync(unsigned mask, T value) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8);
  emu::RequireFullWarp(mask, "__match_any_sync");
  uint64_t mine = 0;
  std::memcpy(&mine, &value, sizeof(T));
  return emu::WarpVote(mine, [mine](uint64_t w) { return w == mine; });
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int atomicAdd(int* p, int v) { return std::atomic_ref<int>(*p).fetch_add(v); }
inline int atomicMax(int* p, int v) {
  std::atomic_ref<int> a(*p);
  int cur = a.load();
  while (cur < v && !a.compare_exchange_weak(cur, v)) {
  }
  return cur;
}
inline unsigned atomicMin(unsigned* p, unsigned v) {
  std::atomic_ref<unsigned> a(*p);
  unsigned cur = a.load();
  while (cur > v && !a.compare_exchange_weak(cur, v)) {
  }
  return cur;
}
inline int __float_as_int(float x) {
  int i;
  std::memcpy(&i, &x, 4);
  return i;
}
inline unsigned __float_as_uint(float x) {
  unsigned i;
  std::memcpy(&i, &x, 4);
  return i;
}
using std::signbit;
// Round-to-nearest arithmetic intrinsics: one IEEE operation each, kept out of line so that GCC
// (whose C++ default is -ffp-contract=fast) cannot fuse a product and a sum into an FMA.
[[gnu::noinline]] inline float __fadd_rn(float a, float b) { return a + b; }
[[gnu::noinline]] inline float __fsub_rn(float a, float b) { return a - b; }
[[gnu::noinline]] inline float __fmul_rn(float a, float b) { return a * b; }
[[gnu::noinline]] inline float __fdiv_rn(float a, float b) { return a / b; }
using ::sqrtf;
inline float __expf(float x) { return std::exp(x); }
inline int min(int a, int b) { return a < b ? a : b; }
#undef __launch_bounds__
#define __launch_bounds__(...)

namespace nvcuda::wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static constexpr int num_elements = 256;
  T x[256];  // logical [16][16], row-major
};
inline void CheckPtr(const void* p, unsigned ldm, size_t elem) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0 || (ldm * elem) % 16 != 0) {
    std::fprintf(stderr, "wmma: misaligned pointer %p or ldm %u\n", p, ldm);
    std::abort();
  }
}
template <typename Use, typename T, typename Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm) {
  CheckPtr(p, ldm, sizeof(T));
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c)
      f.x[r * 16 + c] = std::is_same_v<Layout, row_major> ? p[r * ldm + c] : p[r + c * ldm];
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p,
                             unsigned ldm, layout_t l) {
  CheckPtr(p, ldm, 4);
  if (l != mem_row_major) std::abort();
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) f.x[r * 16 + c] = p[r * ldm + c];
}
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f,
                              unsigned ldm, layout_t l) {
  CheckPtr(p, ldm, 4);
  if (l != mem_row_major) std::abort();
  if ((threadIdx.x & 31) != 0) return;  // lane 0 writes; the kernel's __syncwarp publishes
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) p[r * ldm + c] = f.x[r * 16 + c];
}
inline void fill_fragment(fragment<accumulator, 16, 16, 16, float>& f, float v) {
  for (float& x : f.x) x = v;
}
template <typename LA, typename LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
              const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA>& a,
              const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB>& b,
              const fragment<accumulator, 16, 16, 16, float>& c) {
  float t[256];
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      float s = c.x[i * 16 + j];
      for (int k = 0; k < 16; ++k)
        s += __bfloat162float(a.x[i * 16 + k]) * __bfloat162float(b.x[k * 16 + j]);
      t[i * 16 + j] = s;
    }
  std::memcpy(d.x, t, sizeof t);
}
}  // namespace nvcuda::wmma

namespace emu {
// Guard bands either side of a block's dynamic shared memory, as garbage as the memory itself:
// a read past the launch's size sees NaN, a write there aborts once the block is done (on the
// GPU an access past the dynamic size the launch gave faults; here it would land in slack).
// A write of 0xff bytes only goes unseen.
constexpr size_t kSmemGuard = 256;
inline void CheckSmemGuards(const unsigned char* smem, size_t smem_bytes, dim3 block) {
  for (const unsigned char* g : {smem - kSmemGuard, smem + smem_bytes}) {
    for (size_t i = 0; i < kSmemGuard; ++i) {
      if (g[i] != 0xff) {
        std::fprintf(stderr,
                     "block (%u, %u) wrote shared memory outside its %zu dynamic bytes, at offset "
                     "%td\n",
                     block.x, block.y, smem_bytes, (g + i) - smem);
        std::abort();
      }
    }
  }
}

// Runs body() as grid × threads CUDA threads, one block at a time.
template <typename F>
void Launch(dim3 grid, int threads, size_t smem_bytes, F body) {
  std::vector<unsigned char> smem_store(smem_bytes + 3 * kSmemGuard);
  unsigned char* smem = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(smem_store.data()) + 2 * kSmemGuard - 1) / kSmemGuard *
      kSmemGuard);  // 256-byte aligned, a whole guard band on either side
  const int warps = (threads + 31) / 32;
  for (unsigned by = 0; by < grid.y; ++by) {
    for (unsigned bx = 0; bx < grid.x; ++bx) {
      // Garbage (NaN) shared memory and guard bands.
      std::memset(smem - kSmemGuard, 0xff, smem_bytes + 2 * kSmemGuard);
      std::barrier<> block_bar(threads);
      std::vector<std::unique_ptr<std::barrier<>>> warp_bars;
      for (int w = 0; w < warps; ++w) warp_bars.push_back(std::make_unique<std::barrier<>>(32));
      std::vector<double> xbuf(warps * kWarpScratchDoubles);
      std::vector<std::thread> ts;
      for (int t = 0; t < threads; ++t) {
        ts.emplace_back([&, t] {
          ctx.tid = make_uint3(t, 0, 0);
          ctx.bid = make_uint3(bx, by, 0);
          ctx.grid = grid;
          ctx.block = dim3(threads);
          ctx.block_bar = &block_bar;
          ctx.warp_bar = warp_bars[t / 32].get();
          ctx.xbuf = xbuf.data() + (t / 32) * kWarpScratchDoubles;
          ctx.smem = smem;
          body();
        });
      }
      for (auto& th : ts) th.join();
      CheckSmemGuards(smem, smem_bytes, dim3(bx, by));
    }
  }
}
}  // namespace emu
