// Newton–Schulz orthogonalisation (Muon's NS5, Keller Jordan's quintic) for batches of
// same-shape row-major matrices: O ≈ U·S'·Vᵀ for G = U·S·Vᵀ with S' ≈ [0.68, 1.13] after 5
// steps. The Gram matrix and the quintic's square are symmetric, so they are formed with SYRK
// (one triangle) and the final product with SYMM (or GEMM on a filled copy): per step
// m²n + m³ + 2m²n FLOPs instead of the full-GEMM 4m²n + 2m³, m = min(rows, cols). Tall matrices
// are iterated as their transpose (Gram XᵀX, right multiplication), so the Gram matrix is always
// the small m×m one and no data is transposed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace moelab::cpu {

// The quintic p(σ) = aσ + bσ³ + cσ⁵, the same triple at every step.
inline constexpr double kNsA = 3.4445;
inline constexpr double kNsB = -4.7750;
inline constexpr double kNsC = 2.0315;
// Added to the Frobenius norm so an all-zero input stays zero instead of NaN.
inline constexpr double kNsEps = 1e-7;

// How the symmetric products are computed; kSyrkSymm is the default, the others exist so the
// benchmark can measure what the symmetric kernels save.
enum class NsKernel {
  kSyrkSymm,      // SYRK for X·Xᵀ and A·A, SYMM for B·X
  kSyrkFillGemm,  // SYRK for X·Xᵀ and A·A, fill the lower triangle of B, GEMM for B·X
  kGemm,          // three full GEMMs (the reference cost)
  // Experimental, for max(rows, cols) ≥ 2·min (else kSyrkSymm): iterate on the m×m Gram matrix
  // only (A ← h(A)²·A, Q ← Q·h(A), h(A) = aI + bA + cA²) and form O = Q·X₀ once, so the m×n
  // products happen twice instead of 2·steps times. Rounding grows with ‖Q‖ (up to a⁵ ≈ 487 on
  // tiny singular values): fine in float, not for bf16.
  kGram,
};

// kBatch: OpenMP over the batch, each matrix on one thread with single-threaded BLAS.
// kBlas: matrices one after another, each with multi-threaded BLAS.
// kAuto: kBatch for the largest multiple of the thread count when matrices are small enough
// that one BLAS call does not scale well, kBlas for the rest.
enum class NsThreading { kAuto, kBatch, kBlas };

struct NewtonSchulzOptions {
  int steps = 5;
  NsKernel kernel = NsKernel::kSyrkSymm;
  NsThreading threading = NsThreading::kAuto;
};

// Scratch for NS: per concurrently processed matrix two m×n iterates and two m×m symmetric
// buffers. It only grows, so a caller that keeps one alive allocates nothing in steady state.
template <typename T>
class NewtonSchulzWorkspace {
 public:
  // Room for `slots` matrices of rows×cols processed at the same time.
  void Reserve(int slots, int rows, int cols);
  T* slot(int i) { return buf_.data() + static_cast<size_t>(i) * per_slot_; }
  size_t bytes() const { return buf_.size() * sizeof(T); }

 private:
  std::vector<T> buf_;
  size_t per_slot_ = 0;
};

// out[b] = NS_steps(in[b]) for b < batch, each [rows, cols] row-major, contiguous.
// in and out may be the same buffer. ws may be null: a thread-local cached workspace is used.
template <typename T>
void NewtonSchulz(const T* in, T* out, int batch, int rows, int cols,
                  const NewtonSchulzOptions& options = {}, NewtonSchulzWorkspace<T>* ws = nullptr);

// FLOPs of `steps` NS iterations on one rows×cols matrix counted as full GEMMs
// (4m²n + 2m³ per step, m = min, n = max), the convention used for the reported rate.
double NewtonSchulzGemmFlops(int rows, int cols, int steps);
// FLOPs actually issued by the SYRK/SYMM kernels (m²n + m³ + 2m²n per step).
double NewtonSchulzSyrkFlops(int rows, int cols, int steps);
// FLOPs issued by kGram: m²n + 2m²n once, (6·steps − 5)·m³ for the Gram-side products.
double NewtonSchulzGramFlops(int rows, int cols, int steps);

}  // namespace moelab::cpu
