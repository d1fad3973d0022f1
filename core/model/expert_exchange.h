// The expert-parallel row exchange of one MoE layer (dist.expert_parallel), written once for both
// backends: the one MoE layer (core/model/moe_layer.cc) runs it over the rows its backend's ops
// hand it (core/model/moe_experts.h).
//
// P ranks share the layer's E experts, J = E/P each: rank p owns experts p·J … p·J+J−1. A rank's
// dispatched rows are expert-contiguous (its dispatch offsets), so the rows for rank q's experts
// are one block of them. One all-to-all sends each block to its owner; the rows arrive in
// [source rank][expert] order and are reordered to [expert][source rank]: each owned expert's
// rows contiguous (what the expert GEMMs read), each source's rows in its dispatch order. The
// reverse exchange brings the outputs (or input gradients) back to their tokens.
//
// Rows live in the memory given, host or device: the communicator moves them (MPI on host
// memory, NCCL on device memory) and the memory reorders them, so the same code serves both.
// Rows travel as 4-byte words (the communicator's AllToAllV moves floats; nothing is computed
// on them), so a row must be a multiple of 4 bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/model/backend_memory.h"

namespace moelab {

class Communicator;

class ExpertExchange {
 public:
  ExpertExchange(BackendMemory* memory, int experts);

  // Collective over ep. local_offsets [E+1] (host): this rank's dispatch offsets. Exchanges the
  // per-expert row counts, so every rank knows what it will receive. Throws when E is not
  // divisible by the EP size.
  void Plan(Communicator& ep, const int64_t* local_offsets);
  // [E+1] (host), after Plan: offsets of the owned rows, expert-contiguous (0 rows for the
  // experts of other ranks, so offsets + p·J, J experts, describe exactly the owned ones).
  const std::vector<int64_t>& owned_offsets() const { return owned_offsets_; }
  int64_t owned_rows() const { return owned_offsets_[experts_]; }
  int first_owned() const { return rank_ * (experts_ / ranks_); }

  // Collective. local: this rank's dispatched rows (local_offsets[E] rows of row_bytes) →
  // owned: owned_rows() rows, expert-contiguous. Both in the memory given at construction.
  void ToOwners(Communicator& ep, const void* local, void* owned, size_t row_bytes);
  // Collective: the reverse (owned rows → their tokens' dispatched rows).
  void FromOwners(Communicator& ep, const void* owned, void* local, size_t row_bytes);

  size_t workspace_bytes() const { return buffer_.size() + 2 * counts_.size() * sizeof(float); }

 private:
  // Words per rank for rows of row_bytes, and the received-rows buffer grown to fit.
  void Size(size_t row_bytes);
  // Block (source q, owned expert j) between the [source][expert] buffer and the owned rows.
  void Reorder(unsigned char* owned, size_t row_bytes, bool to_owned);

  BackendMemory* memory_;
  int experts_;
  int ranks_ = 1, rank_ = 0;
  std::vector<int64_t> local_offsets_;           // [E+1]
  std::vector<int64_t> owned_offsets_;           // [E+1]
  std::vector<int64_t> rows_;                    // [P, J]: rows source q sends for owned expert j
  std::vector<size_t> send_words_, recv_words_;  // [P]
  BackendArray<float> counts_;                   // [2E]: the counts sent, then received
  BackendArray<unsigned char> buffer_;           // received rows, [source][expert]
};

}  // namespace moelab
