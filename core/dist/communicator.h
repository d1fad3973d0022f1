// Collective operations the trainer needs, behind an interface so data- and expert-parallel
// training (MPI on CPU, NCCL on GPU) plug in without reshaping the model or trainer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace moelab {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // In-place reductions across ranks; the same call order on every rank.
  virtual void AllReduceSum(float* data, size_t n) = 0;
  virtual void AllReduceSum(double* data, size_t n) = 0;
  virtual void AllReduceSum(int64_t* data, size_t n) = 0;
  virtual void AllReduceMax(float* data, size_t n) = 0;
  // Variable-size exchange (expert parallelism: between MoE dispatch and combine).
  // send_counts[r] elements go to rank r; recv_counts[r] arrive from rank r.
  virtual void AllToAllV(const float* send, const size_t* send_counts, float* recv,
                         const size_t* recv_counts) = 0;
  virtual void Barrier() = 0;
};

// One process: every collective is the identity.
class SingleProcessCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  void AllReduceSum(float*, size_t) override {}
  void AllReduceSum(double*, size_t) override {}
  void AllReduceSum(int64_t*, size_t) override {}
  void AllReduceMax(float*, size_t) override {}
  void AllToAllV(const float* send, const size_t* send_counts, float* recv,
                 const size_t*) override;
  void Barrier() override {}
};

}  // namespace moelab
