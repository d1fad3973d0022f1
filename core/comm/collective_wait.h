// Waiting for a collective without hanging forever (core/comm/nccl_communicator.cc). A peer that
// died or a broken link leaves an NCCL collective pending, and cudaStreamSynchronize would wait
// for it with no end. WaitWatched polls instead: each poll says done, pending or failed (with
// why); a failure, or a collective still pending after the timeout, throws naming it, so the
// rank reaches the CLI's MPI_Abort and the job ends with a message instead of a silent hang.
#pragma once

#include <functional>
#include <string>

namespace moelab {

enum class CollectiveState { kDone, kPending, kFailed };

// Seconds a collective may stay pending: MOELAB_NCCL_TIMEOUT_S (0: no limit), default 1800 — a
// peer may be writing a checkpoint or evaluating while this rank waits at the next collective.
// Throws std::invalid_argument naming the variable for a value that is not a number ≥ 0.
double CollectiveTimeoutSeconds();

// Polls until kDone (returns), kFailed (throws std::runtime_error "<what>: <why>") or, with
// timeout_s > 0, until timeout_s seconds have passed (throws naming the wait and the variable).
// Between polls it yields at first, then sleeps up to 200 µs: a collective that takes tens of
// milliseconds finishes within a fraction of a millisecond of the answer.
void WaitWatched(const std::function<CollectiveState(std::string* why)>& poll, double timeout_s,
                 const std::string& what);

}  // namespace moelab
