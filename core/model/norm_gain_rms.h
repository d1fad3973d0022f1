// The RMS of the attention-path norm gains (issue 13, QK-Clip): the RMSNorm gains in front of
// q and k (attn_norm, and with QK-norm or MLA their own gains) scale q and k together, so they
// can raise the max attention logit without touching W_q or W_k. Logged per step (the
// `steps.norm_gain_rms` column) so a QK-Clip comparison can show whether they moved.
#pragma once

#include <vector>

#include "core/model/model.h"

namespace moelab {

// sqrt(mean g²) over every element of every norm gain on an attention input path; NaN when the
// model has none. `params` is the flat parameter arena `infos` index into.
template <typename T>
double AttentionNormGainRms(const std::vector<ParamInfo>& infos, const T* params);

// The same for a model on any backend: on a device, only the gains are copied to the host.
template <typename T>
double AttentionNormGainRms(const Model<T>& model);

// True for a norm gain that scales an attention input: "layers.L.attn_norm" and the norm gains
// inside "layers.L.attn." (QK-norm's q_norm/k_norm, MLA's q_a_norm/kv_a_norm).
bool IsAttentionNormGain(const ParamInfo& info);

}  // namespace moelab
