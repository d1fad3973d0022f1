// Global-batch balancing across data-parallel ranks (issue 23): the MoE layers' aux-loss
// statistics (top-k counts, normalised score sums, tokens) summed over the ranks that share the
// global batch, so the Switch aux loss of N ranks is the one-process loss of the whole batch.
#pragma once

#include "core/model/moe.h"

namespace moelab {

class Communicator;

// A hook (core/model/moe.h, MoeBatchStatsHook) that sums each layer's statistics over comm in
// one double all-reduce of 2E+1 numbers (the counts and the token count are integers far below
// 2^53, so their sums are exact; the score sums are added in rank order, identically on every
// rank). comm must outlive the hook.
MoeBatchStatsHook AllReduceBatchStatsHook(Communicator& comm);

}  // namespace moelab
