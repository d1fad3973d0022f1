#include "core/model/expert_exchange.h"

#include <stdexcept>
#include <string>

#include "core/comm/communicator.h"

namespace moelab {

namespace {
// Counts travel as floats (the communicator's type): exact up to 2^24 rows per expert and rank.
constexpr int64_t kMaxExactRows = int64_t{1} << 24;
}  // namespace

ExpertExchange::ExpertExchange(BackendMemory* memory, int experts)
    : memory_(memory),
      experts_(experts),
      local_offsets_(experts + 1, 0),
      owned_offsets_(experts + 1, 0),
      counts_(memory),
      buffer_(memory) {
  counts_.Resize(2 * static_cast<size_t>(experts));
}

void ExpertExchange::Plan(Communicator& ep, const int64_t* local_offsets) {
  const int P = ep.world_size(), me = ep.rank(), E = experts_;
  if (E % P != 0) {
    throw std::invalid_argument("expert parallelism: experts_total (" + std::to_string(E) +
                                ") is not divisible by the EP size (" + std::to_string(P) + ")");
  }
  const int J = E / P;
  ranks_ = P;
  rank_ = me;
  local_offsets_.assign(local_offsets, local_offsets + E + 1);
  // The counts go first (J per pair of ranks), so that every rank knows what it receives.
  std::vector<float> host(2 * static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) {
    const int64_t rows = local_offsets[e + 1] - local_offsets[e];
    if (rows < 0 || rows > kMaxExactRows) {
      throw std::runtime_error("expert parallelism: bad dispatch offsets");
    }
    host[e] = static_cast<float>(rows);
  }
  counts_.Upload(host.data(), E);
  const std::vector<size_t> per_rank(P, static_cast<size_t>(J));
  ep.AllToAllV(counts_.data(), per_rank.data(), counts_.data() + E, per_rank.data());
  counts_.Download(host.data(), host.size());
  rows_.assign(static_cast<size_t>(P) * J, 0);
  for (size_t i = 0; i < rows_.size(); ++i) rows_[i] = static_cast<int64_t>(host[E + i]);
  owned_offsets_.assign(E + 1, 0);
  for (int e = 0; e < E; ++e) {
    int64_t rows = 0;
    if (e / J == me) {
      for (int q = 0; q < P; ++q) rows += rows_[static_cast<size_t>(q) * J + e % J];
    }
    owned_offsets_[e + 1] = owned_offsets_[e] + rows;
  }
}

void ExpertExchange::Size(size_t row_bytes) {
  if (row_bytes % sizeof(float) != 0) {
    throw std::invalid_argument(
        "expert parallelism: a row must be a multiple of 4 bytes (in bf16, an even "
        "model.d_model)");
  }
  const int P = ranks_, J = experts_ / P;
  const size_t words = row_bytes / sizeof(float);
  send_words_.assign(P, 0);
  recv_words_.assign(P, 0);
  for (int q = 0; q < P; ++q) {
    send_words_[q] =
        static_cast<size_t>(local_offsets_[(q + 1) * J] - local_offsets_[q * J]) * words;
    for (int j = 0; j < J; ++j) recv_words_[q] += static_cast<size_t>(rows_[q * J + j]) * words;
  }
  const size_t need = static_cast<size_t>(owned_rows()) * row_bytes;
  if (buffer_.size() < need) buffer_.Resize(need + need / 4);  // slack: the load varies by step
}

void ExpertExchange::Reorder(unsigned char* owned, size_t row_bytes, bool to_owned) {
  const int P = ranks_, J = experts_ / P;
  std::vector<int64_t> next(owned_offsets_.begin() + rank_ * J,
                            owned_offsets_.begin() + rank_ * J + J);
  size_t at = 0;  // rows into the [source][expert] buffer
  for (int q = 0; q < P; ++q) {
    for (int j = 0; j < J; ++j) {
      const size_t rows = static_cast<size_t>(rows_[static_cast<size_t>(q) * J + j]);
      unsigned char* block = buffer_.data() + at * row_bytes;
      unsigned char* mine = owned + static_cast<size_t>(next[j]) * row_bytes;
      if (rows > 0) {
        if (to_owned) {
          memory_->Copy(mine, block, rows * row_bytes);
        } else {
          memory_->Copy(block, mine, rows * row_bytes);
        }
      }
      next[j] += static_cast<int64_t>(rows);
      at += rows;
    }
  }
}

void ExpertExchange::ToOwners(Communicator& ep, const void* local, void* owned, size_t row_bytes) {
  Size(row_bytes);
  ep.AllToAllV(static_cast<const float*>(local), send_words_.data(),
               reinterpret_cast<float*>(buffer_.data()), recv_words_.data());
  Reorder(static_cast<unsigned char*>(owned), row_bytes, /*to_owned=*/true);
}

void ExpertExchange::FromOwners(Communicator& ep, const void* owned, void* local,
                                size_t row_bytes) {
  Size(row_bytes);
  Reorder(static_cast<unsigned char*>(const_cast<void*>(owned)), row_bytes, /*to_owned=*/false);
  ep.AllToAllV(reinterpret_cast<const float*>(buffer_.data()), recv_words_.data(),
               static_cast<float*>(local), send_words_.data());
}

}  // namespace moelab
