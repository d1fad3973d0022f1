#include "core/model/attention_dims.h"

#include <cmath>

namespace moelab {

cpu::AttentionDims AttentionDimsOf(const ModelConfig& m) {
  cpu::AttentionDims dims;
  const int H = m.heads, KVH = m.kv_heads_effective(), hd = m.head_dim_effective();
  dims.seq = m.seq_len;
  dims.heads = H;
  if (m.attention == "mla") {
    const int dn = m.qk_nope_head_dim, dvh = m.v_head_dim, dqk = dn + m.qk_rope_head_dim;
    dims.kv_heads = H;  // MLA expands k and v per head
    dims.qk_dim = dqk;
    dims.v_dim = dvh;
    dims.ldq = dims.ldk = H * dqk;
    dims.ldv = H * (dn + dvh);
    dims.ldo = H * dvh;
    dims.scale = 1.0 / std::sqrt(static_cast<double>(dqk));
  } else {
    dims.kv_heads = KVH;
    dims.qk_dim = dims.v_dim = hd;
    dims.ldq = dims.ldk = dims.ldv = H * hd + 2 * KVH * hd;  // fused q|k|v rows
    dims.ldo = H * hd;
    dims.scale = 1.0 / std::sqrt(static_cast<double>(hd));
  }
  dims.softcap = m.logit_softcap;
  return dims;
}

}  // namespace moelab
