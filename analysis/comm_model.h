// Analytic communication model of distributed training: bytes each rank sends per step for a
// layout (data parallel × expert parallel, ZeRO-1, distributed Muon), the ring all-reduce and
// all-to-all cost in an alpha-beta model, and memory per rank. `moelab bench --distributed`
// checks it against the communicator's byte counters; docs/distributed.md tabulates it for
// K2-like shapes at cluster scale.
#pragma once

#include <cstdint>
#include <string>

#include "core/config.h"

namespace moelab::analysis {

// The sizes that drive communication.
struct CommShape {
  int64_t params_total = 0;
  int64_t expert_params = 0;    // routed experts of every MoE layer (sharded over EP ranks)
  int64_t muon_params = 0;      // 2-D hidden matrices (Muon; the rest uses AdamW)
  int64_t tokens_per_step = 0;  // global batch × sequence length
  int moe_layers = 0;
  int d_model = 0;
  int top_k = 0;
  int experts = 0;
  int layers = 0;
  int heads = 0;
  bool muon = false;  // optimizer muon or muonclip
};
CommShape CommShapeOf(const RunConfig& config);

struct CommLayout {
  int ranks = 1;
  int expert_parallel = 1;
  bool zero1 = false;
  int data_parallel() const { return ranks / expert_parallel; }
};

struct CommCost {
  double bytes_per_element = 4;    // fp32 on CPU; 2 for bf16 gradients on GPUs
  double alpha_s = 5e-6;           // latency per message
  double beta_bytes_per_s = 10e9;  // link bandwidth per rank
};

// Per rank and step. "payload" is what the collectives are handed (what a communicator's byte
// counter sees); "wire" is what a ring algorithm sends: all-reduce 2(p-1)/p of the payload,
// reduce-scatter / all-gather (p-1)/p of the full buffer, all-to-all (p-1)/p.
struct CommEstimate {
  // Gradient all-reduce of the replicated (non-expert) parameters over all ranks.
  double dense_grad_payload = 0, dense_grad_wire = 0;
  // Expert gradients: all-reduced over the data-parallel replicas of each expert (world / EP).
  double expert_grad_payload = 0, expert_grad_wire = 0;
  // ZeRO-1 (and its distributed Muon): the gradients are reduce-scattered to their owners
  // (the two fields above then hold (p-1)/p, not 2(p-1)/p) and the updated parameters
  // all-gathered here: together the bytes of one all-reduce.
  double gather_payload = 0, gather_wire = 0;
  // Expert-parallel all-to-all: dispatch and combine, forward and backward, every MoE layer,
  // with tokens spread uniformly over experts.
  double a2a_payload = 0, a2a_wire = 0;
  // Loss, grad norm, per-head S_max, expert counts.
  double metrics_payload = 0;
  double payload() const {
    return dense_grad_payload + expert_grad_payload + gather_payload + a2a_payload +
           metrics_payload;
  }
  double wire() const {
    return dense_grad_wire + expert_grad_wire + gather_wire + a2a_wire + metrics_payload;
  }
  double time_s = 0;  // alpha-beta time of all the above, unoverlapped

  // Memory per rank (fp32 master weights and gradients).
  double param_bytes = 0, grad_bytes = 0, optimizer_bytes = 0;
};

// Ring all-reduce of n bytes over p ranks: bytes each rank sends.
double RingAllReduceWire(double bytes, int p);
double RingAllReduceTime(double bytes, int p, const CommCost& cost);

CommEstimate EstimateComm(const CommShape& shape, const CommLayout& layout,
                          const CommCost& cost = {});

// A Kimi-K2-like shape (61 layers, 1 dense; d 7168; 64 MLA heads; 384 experts, 8 active + 1
// shared, hidden 2048; vocab 163840; seq 4096) with `global_tokens` tokens per step.
RunConfig K2LikeConfig(int64_t global_tokens = int64_t{1} << 26);

// Markdown table of the model for K2-like shapes at 8 → 1024 ranks (EP 8/16/64), bf16.
std::string K2ScalingTable();

}  // namespace moelab::analysis
