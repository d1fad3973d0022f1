// Checkpoints of sharded expert parallelism keep the one unsharded format (issue 23): a rank
// holds only its experts' block of every routed-expert tensor (core/model/model.h, ExpertShard),
// in its parameter arena and in every optimizer buffer, while a checkpoint holds the whole model
// (core/model/model.h, FullLayout) and the state of the whole model's optimizer. This map
// converts between the two for the parameters ("params") and each optimizer buffer
// ("muon.momentum", "adamw.m", "adamw.v"): gather on write (inside the EP group, whose members'
// blocks tile every expert tensor in rank order), scatter on read (a copy of the rank's block).
// So any layout resumes any other: EP 2 writes what one process writes.
//
// Optimizer buffers hold their tensors' state in parameter order, each tensor's state as large
// as the tensor (AdamW: the AdamW tensors; Muon: "muon.momentum" the hidden matrices, the AdamW
// buffers the rest), as core/optim builds them.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "core/comm/communicator.h"
#include "core/model/model.h"

namespace moelab {

class ExpertShardMap {
 public:
  // local: this rank's parameters (arena of local_n elements); full: the whole model's
  // (FullLayout, full_n). muon: the optimizer is Muon/MuonClip (hidden matrices have momentum,
  // the rest AdamW moments), else AdamW. Throws when the tensors do not correspond.
  ExpertShardMap(const std::vector<ParamInfo>& local, size_t local_n,
                 const std::vector<ParamInfo>& full, size_t full_n, bool muon);

  // Elements of a buffer in this rank's and in the unsharded format.
  size_t local_size(const std::string& buffer) const { return Get(buffer).local_n; }
  size_t full_size(const std::string& buffer) const { return Get(buffer).full_n; }

  // Collective over ep (every member of the EP group calls it with its own block): full (of
  // full_size) becomes the unsharded buffer.
  void Gather(Communicator& ep, const std::string& buffer, const float* local, float* full) const;
  // This rank's part of an unsharded buffer; no communication.
  void Scatter(const std::string& buffer, const float* full, float* local) const;

 private:
  struct Segment {
    size_t local_offset, full_offset, size;  // size: elements held here
    bool sharded;                            // an expert block (full tensor = EP blocks)
    size_t full_tensor_size;
  };
  struct Buffer {
    std::vector<Segment> segments;
    size_t local_n = 0, full_n = 0;
  };
  const Buffer& Get(const std::string& buffer) const;
  std::map<std::string, Buffer> buffers_;
};

}  // namespace moelab
