// SwiGLU feed-forward, y = (silu(x·W1ᵀ) ⊙ x·W3ᵀ)·W2ᵀ, used by dense layers and by every expert
// on its gathered tokens.
#pragma once

namespace moelab::cpu {

// x [n,d]; w1, w3 [hidden,d]; w2 [d,hidden]. Saves h1, h3, act ([n,hidden] each) for backward.
// y [n,d] is overwritten.
template <typename T>
void SwigluForward(const T* x, int n, int d, int hidden, const T* w1, const T* w3, const T* w2,
                   T* h1, T* h3, T* act, T* y);

// dy [n,d] -> dx [n,d] (overwritten, or accumulated if accumulate_dx) and dw1, dw3, dw2
// (overwritten, or accumulated if accumulate_dw). scratch: [n, 2·hidden].
template <typename T>
void SwigluBackward(const T* x, int n, int d, int hidden, const T* w1, const T* w3, const T* w2,
                    const T* h1, const T* h3, const T* act, const T* dy, T* dx, T* dw1, T* dw3,
                    T* dw2, T* scratch, bool accumulate_dx = false, bool accumulate_dw = false);

}  // namespace moelab::cpu
