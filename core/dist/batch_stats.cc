#include "core/dist/batch_stats.h"

#include <vector>

#include "core/comm/communicator.h"

namespace moelab {

MoeBatchStatsHook AllReduceBatchStatsHook(Communicator& comm) {
  return [&comm, buf = std::vector<double>()](int, MoeBatchStats& s) mutable {
    const size_t E = static_cast<size_t>(s.experts);
    buf.resize(2 * E + 1);
    for (size_t e = 0; e < E; ++e) {
      buf[e] = static_cast<double>(s.counts[e]);
      buf[E + e] = s.score_sums[e];
    }
    buf[2 * E] = static_cast<double>(*s.tokens);
    comm.AllReduceSum(buf.data(), buf.size());
    for (size_t e = 0; e < E; ++e) {
      s.counts[e] = static_cast<int64_t>(buf[e]);
      s.score_sums[e] = buf[E + e];
    }
    *s.tokens = static_cast<int64_t>(buf[2 * E]);
  };
}

}  // namespace moelab
