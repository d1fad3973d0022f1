// Softmax cross-entropy over the vocabulary with an optional output z-loss, fused with its
// backward pass (the logits buffer is overwritten by its gradient, as in llm.c's fused
// classifier, so no probability tensor is materialised).
#pragma once

#include <cstdint>

namespace moelab::cpu {

struct CrossEntropyResult {
  double loss = 0;    // mean over rows of −log softmax(logits)[target]
  double z_loss = 0;  // z_coef · mean over rows of logsumexp²
};

// logits [n, V]; targets [n]. row_scratch [2n] holds per-row values so the mean is summed in row
// order (bit-identical for any thread count). When backward is true, logits is overwritten with
// d(loss + z_loss)/d logits = ((softmax − onehot) + 2·z_coef·lse·softmax) / n.
template <typename T>
CrossEntropyResult CrossEntropy(T* logits, const int32_t* targets, int n, int vocab, double z_coef,
                                bool backward, double* row_scratch);

}  // namespace moelab::cpu
