#include "core/model/norm_gain_rms.h"

#include <cmath>
#include <limits>

#include "core/model/backend.h"

namespace moelab {

bool IsAttentionNormGain(const ParamInfo& info) {
  if (info.kind != ParamKind::kNorm || info.layer < 0) return false;
  const std::string& n = info.name;
  const auto ends_with = [&](const std::string& s) {
    return n.size() >= s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0;
  };
  return ends_with("attn_norm") || n.find(".attn.") != std::string::npos;
}

template <typename T>
double AttentionNormGainRms(const std::vector<ParamInfo>& infos, const T* params) {
  double sum = 0;
  size_t count = 0;
  for (const ParamInfo& p : infos) {
    if (!IsAttentionNormGain(p)) continue;
    for (size_t i = 0; i < p.size(); ++i) {
      const double g = static_cast<double>(params[p.offset + i]);
      sum += g * g;
    }
    count += p.size();
  }
  if (count == 0) return std::numeric_limits<double>::quiet_NaN();
  return std::sqrt(sum / static_cast<double>(count));
}

template <typename T>
double AttentionNormGainRms(const Model<T>& model) {
  const Backend<T>& be = model.backend();
  if (be.is_host()) return AttentionNormGainRms(model.param_infos(), model.params());
  // A sparse host image: the attention-path gains at their arena offsets, nothing else.
  std::vector<ParamInfo> gains;
  size_t size = 0;
  for (const ParamInfo& p : model.param_infos()) {
    if (!IsAttentionNormGain(p)) continue;
    ParamInfo q = p;
    q.offset = size;
    size += p.size();
    gains.push_back(q);
  }
  std::vector<T> values(size);
  size_t at = 0;
  for (const ParamInfo& p : model.param_infos()) {
    if (!IsAttentionNormGain(p)) continue;
    be.ToHost(values.data() + at, model.params() + p.offset, sizeof(T) * p.size());
    at += p.size();
  }
  return AttentionNormGainRms(gains, values.data());
}

template double AttentionNormGainRms<float>(const std::vector<ParamInfo>&, const float*);
template double AttentionNormGainRms<float>(const Model<float>&);
template double AttentionNormGainRms<double>(const Model<double>&);
template double AttentionNormGainRms<double>(const std::vector<ParamInfo>&, const double*);

}  // namespace moelab
