#include "core/dist/zero.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "core/optimizer_traits.h"
#include "kernels/cpu/sum_squares.h"

namespace moelab {

namespace {

bool IsMuonMatrix(const ParamInfo& p, bool muon) { return muon && p.is_hidden_matrix(); }

std::vector<ParamInfo> SortedByOffset(std::vector<ParamInfo> params) {
  std::sort(params.begin(), params.end(),
            [](const ParamInfo& a, const ParamInfo& b) { return a.offset < b.offset; });
  return params;
}

}  // namespace

std::vector<ArenaRange> PartitionArena(const std::vector<ParamInfo>& unsorted, size_t n, int parts,
                                       bool muon) {
  if (parts < 1) throw std::invalid_argument("PartitionArena: parts must be positive");
  const std::vector<ParamInfo> params = SortedByOffset(unsorted);
  size_t at = 0;
  for (const ParamInfo& p : params) {
    if (p.offset != at) {
      throw std::invalid_argument(
          fmt::format("PartitionArena: {} starts at {}, expected {}", p.name, p.offset, at));
    }
    at += p.size();
  }
  if (at != n) throw std::invalid_argument("PartitionArena: parameters do not cover the arena");
  std::vector<ArenaRange> ranges(parts);
  size_t prev = 0;
  for (int r = 0; r + 1 < parts; ++r) {
    const size_t target =
        static_cast<size_t>(std::llround(static_cast<double>(n) * (r + 1) / parts));
    size_t cut = target;
    for (const ParamInfo& p : params) {
      if (target < p.offset || target >= p.offset + p.size()) continue;
      if (IsMuonMatrix(p, muon)) {
        // Nearest matrix boundary.
        const size_t m = static_cast<size_t>(p.rows) * p.cols;
        const size_t k = (target - p.offset + m / 2) / m;
        cut = p.offset + k * m;
      }
      break;
    }
    cut = std::clamp(cut, prev, n);
    ranges[r] = {prev, cut};
    prev = cut;
  }
  ranges[parts - 1] = {prev, n};
  return ranges;
}

std::vector<ParamInfo> RestrictParams(const std::vector<ParamInfo>& params, ArenaRange range,
                                      bool muon) {
  std::vector<ParamInfo> out;
  for (const ParamInfo& p : params) {
    const size_t a = std::max(range.begin, p.offset), b = std::min(range.end, p.offset + p.size());
    if (a >= b) continue;
    if (a == p.offset && b == p.offset + p.size()) {
      out.push_back(p);
      continue;
    }
    ParamInfo q = p;
    if (IsMuonMatrix(p, muon)) {
      const size_t m = static_cast<size_t>(p.rows) * p.cols;
      if ((a - p.offset) % m != 0 || (b - p.offset) % m != 0) {
        throw std::invalid_argument(fmt::format("range cuts the Muon matrix {}", p.name));
      }
      q.offset = a;
      q.batch = static_cast<int>((b - a) / m);
    } else {
      q.offset = a;
      q.batch = 1;
      q.rows = 1;
      q.cols = static_cast<int>(b - a);
    }
    out.push_back(q);
  }
  return out;
}

std::vector<size_t> ChunkCounts(const std::vector<ArenaRange>& ranges, size_t a, size_t b) {
  std::vector<size_t> c(ranges.size(), 0);
  for (size_t r = 0; r < ranges.size(); ++r) {
    const size_t lo = std::max(a, ranges[r].begin), hi = std::min(b, ranges[r].end);
    c[r] = hi > lo ? hi - lo : 0;
  }
  return c;
}

namespace {

// The arena in buckets of bucket_mb (at least 1024 floats), each handed to `collective` with its
// start and every rank's share of it: one collective per bucket bounds the staging memory.
template <typename Collective>
void ForEachBucket(const std::vector<ArenaRange>& ranges, double bucket_mb,
                   Collective&& collective) {
  const size_t n = ranges.back().end;
  const size_t bucket =
      std::max<size_t>(1024, static_cast<size_t>(bucket_mb * (1 << 20) / sizeof(float)));
  for (size_t a = 0; a < n; a += bucket) {
    const size_t b = std::min(n, a + bucket);
    const std::vector<size_t> counts = ChunkCounts(ranges, a, b);
    collective(a, counts.data());
  }
}

}  // namespace

double RangeSquares(const float* g, ArenaRange r) { return cpu::SumSquares(g + r.begin, r.size()); }

ShardedOptimizer::ShardedOptimizer(const RunConfig& run, const std::vector<ParamInfo>& params,
                                   size_t num_params, Communicator& comm, Backend<float>& backend)
    : comm_(comm), be_(backend) {
  const OptimizerConfig& config = run.optimizer;
  const OptimizerTraits traits = TraitsOf(config);
  const bool muon = traits.muon;
  ranges_ = PartitionArena(params, num_params, comm.world_size(), muon);
  const std::vector<ParamInfo> sorted = SortedByOffset(params);
  local_ = MakeOptimizer(config, RestrictParams(sorted, mine(), muon), backend.optimizer_ops());
  // It writes the weight copy of its shard; the backend casts the all-gathered rest.
  local_->WriteWeightCopy(backend.weight_copy());
  // The unsharded layout: every rank's size of every buffer name.
  const std::vector<std::string>& names = traits.state_names;
  const int w = comm.world_size();
  std::vector<int64_t> sizes(names.size() * w, 0);
  for (const StateBuffer& s : local_->state()) {
    const auto it = std::find(names.begin(), names.end(), s.name);
    if (it == names.end()) throw std::logic_error("unexpected optimizer buffer " + s.name);
    sizes[(it - names.begin()) * w + comm.rank()] = static_cast<int64_t>(s.data->size());
  }
  comm.AllReduceSum(sizes.data(), sizes.size());
  for (size_t i = 0; i < names.size(); ++i) {
    std::vector<size_t> c(w);
    size_t total = 0;
    for (int r = 0; r < w; ++r) total += c[r] = static_cast<size_t>(sizes[i * w + r]);
    // The unsharded Muon always has its momentum buffer (the first); AdamW buffers exist when
    // some tensor is AdamW's.
    if (total == 0 && !(muon && i == 0)) continue;
    layout_.push_back({names[i], total});
    counts_.push_back(c);
  }
}

void ShardedOptimizer::ReduceScatterGradients(float* grads, double bucket_mb, int average_over) {
  ForEachBucket(ranges_, bucket_mb,
                [&](size_t a, const size_t* counts) { comm_.ReduceScatterSum(grads + a, counts); });
  const ArenaRange m = mine();
  be_.Scale(grads + m.begin, m.size(),
            1.0f / static_cast<float>(average_over > 0 ? average_over : comm_.world_size()));
}

double ShardedOptimizer::GradNorm(const float* grads) {
  std::vector<double> partial(ranges_.size(), 0.0);
  partial[comm_.rank()] = be_.SumSquares(grads + mine().begin, mine().size());
  comm_.AllReduceSum(partial.data(), partial.size());  // adds zeros: exact
  double total = 0;
  for (double p : partial) total += p;
  return std::sqrt(total);
}

void ShardedOptimizer::Step(float* params, const float* grads, double lr, int64_t step,
                            double bucket_mb) {
  local_->Step(params, grads, lr, step);
  ForEachBucket(ranges_, bucket_mb,
                [&](size_t a, const size_t* counts) { comm_.AllGatherV(params + a, counts); });
}

std::vector<std::vector<float>> ShardedOptimizer::GatherFullState() {
  local_->SyncToHost();
  std::vector<StateBuffer> local = local_->state();
  std::vector<std::vector<float>> full;
  for (size_t i = 0; i < layout_.size(); ++i) {
    std::vector<float> buf(layout_[i].second);
    size_t off = 0;
    for (int r = 0; r < comm_.rank(); ++r) off += counts_[i][r];
    for (const StateBuffer& s : local) {
      if (s.name == layout_[i].first) std::copy(s.data->begin(), s.data->end(), buf.begin() + off);
    }
    comm_.AllGatherV(buf.data(), counts_[i].data());
    full.push_back(std::move(buf));
  }
  return full;
}

void ShardedOptimizer::LoadFullState(const std::vector<std::vector<float>>& full) {
  std::vector<StateBuffer> local = local_->state();
  for (size_t i = 0; i < layout_.size(); ++i) {
    size_t off = 0;
    for (int r = 0; r < comm_.rank(); ++r) off += counts_[i][r];
    for (const StateBuffer& s : local) {
      if (s.name != layout_[i].first) continue;
      std::copy(full[i].begin() + off, full[i].begin() + off + s.data->size(), s.data->begin());
    }
  }
  local_->SyncToDevice();
}

size_t ShardedOptimizer::local_state_bytes() const {
  size_t b = 0;
  for (const StateBuffer& s : local_->state()) b += s.data->size() * sizeof(float);
  return b;
}

size_t ShardedOptimizer::full_state_bytes() const {
  size_t b = 0;
  for (const auto& [name, size] : layout_) b += size * sizeof(float);
  return b;
}

}  // namespace moelab
