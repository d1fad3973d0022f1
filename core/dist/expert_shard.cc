#include "core/dist/expert_shard.h"

#include <algorithm>
#include <stdexcept>

namespace moelab {

ExpertShardMap::ExpertShardMap(const std::vector<ParamInfo>& local, size_t local_n,
                               const std::vector<ParamInfo>& full, size_t full_n, bool muon) {
  if (local.size() != full.size()) {
    throw std::invalid_argument("ExpertShardMap: the sharded and whole models differ");
  }
  Buffer& params = buffers_["params"];
  params.local_n = local_n;
  params.full_n = full_n;
  for (size_t i = 0; i < local.size(); ++i) {
    const ParamInfo &l = local[i], &f = full[i];
    const size_t matrix = static_cast<size_t>(l.rows) * l.cols;
    if (l.name != f.name || matrix != static_cast<size_t>(f.rows) * f.cols ||
        l.batch_first + l.batch > f.batch || (!l.sharded() && l.size() != f.size())) {
      throw std::invalid_argument("ExpertShardMap: " + l.name + " does not match the whole model");
    }
    const size_t block = static_cast<size_t>(l.batch_first) * matrix;
    const bool sharded = l.sharded();
    params.segments.push_back({l.offset, f.offset + block, l.size(), sharded, f.size()});
    // The optimizer buffers this tensor has state in, at the running offsets.
    const std::vector<std::string> names = muon && l.is_hidden_matrix()
                                               ? std::vector<std::string>{"muon.momentum"}
                                               : std::vector<std::string>{"adamw.m", "adamw.v"};
    for (const std::string& name : names) {
      Buffer& b = buffers_[name];
      b.segments.push_back({b.local_n, b.full_n + block, l.size(), sharded, f.size()});
      b.local_n += l.size();
      b.full_n += f.size();
    }
  }
}

const ExpertShardMap::Buffer& ExpertShardMap::Get(const std::string& buffer) const {
  const auto it = buffers_.find(buffer);
  if (it == buffers_.end()) {
    // A buffer with no tensors (e.g. Muon's momentum when nothing is a hidden matrix).
    static const Buffer kEmpty;
    return kEmpty;
  }
  return it->second;
}

void ExpertShardMap::Gather(Communicator& ep, const std::string& buffer, const float* local,
                            float* full) const {
  const Buffer& b = Get(buffer);
  std::fill(full, full + b.full_n, 0.0f);  // the whole model's padding
  std::vector<size_t> counts(ep.world_size());
  for (const Segment& s : b.segments) {
    std::copy_n(local + s.local_offset, s.size, full + s.full_offset);
    if (!s.sharded) continue;
    // The EP group's blocks tile the tensor in rank order.
    if (s.size * ep.world_size() != s.full_tensor_size) {
      throw std::logic_error("ExpertShardMap: the EP group's blocks do not tile an expert tensor");
    }
    std::fill(counts.begin(), counts.end(), s.size);
    ep.AllGatherV(full + s.full_offset - ep.rank() * s.size, counts.data());
  }
}

void ExpertShardMap::Scatter(const std::string& buffer, const float* full, float* local) const {
  const Buffer& b = Get(buffer);
  for (const Segment& s : b.segments) {
    std::copy_n(full + s.full_offset, s.size, local + s.local_offset);
  }
}

}  // namespace moelab
