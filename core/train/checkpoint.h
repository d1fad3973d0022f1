// Checkpoints: parameters, router biases, optimizer state and the step, written atomically
// (temp file, fsync, rename, fsync of the folder) and verified by a checksum when read. A
// checkpoint names the run that wrote it (its runs.uuid): resume adopts only its own run's
// checkpoints, and pruning removes only its own run's (docs/database.md, "Run identity").
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/optim/optimizer.h"

namespace moelab {

struct CheckpointHeader {
  std::string config_hash;
  // Hash of the config without its length (see BranchHash): runs that differ only in length
  // can start from each other's checkpoints (WSD branching).
  std::string branch_hash;
  int64_t step = 0;
  int64_t tokens = 0;
  double flops = 0;
  // The run that wrote it (runs.uuid). Empty in a legacy checkpoint (format 1, written before
  // runs had UUIDs) and in one written by Train without a run identity (TrainOptions::run_uuid).
  std::string run_uuid;
};

// Which checkpoints a run may resume from.
struct ResumeIdentity {
  std::string run_uuid;     // adopt checkpoints with exactly this run_uuid ("" = anonymous)
  std::string config_hash;  // shown in warnings; ReadCheckpoint checks it
  // A legacy checkpoint (no run_uuid) this run recorded as its own (runs.checkpoint_path): the
  // only legacy file a run with a UUID adopts. It may lie outside the folder (old layout).
  std::string legacy_checkpoint;
  // Checkpoints beyond this step are skipped: the database recorded the run only up to here, so
  // adopting one would leave the steps in between unrecorded (-1: no limit).
  int64_t max_step = -1;
};

// Writes <dir>/step_<step>.ckpt atomically and removes all but the newest `keep` checkpoints of
// the same run (header.run_uuid; other runs' files in the folder are never touched). Refuses
// (throws) to overwrite another run's checkpoint of the same step. Returns the path written.
std::string WriteCheckpoint(const std::string& dir, const CheckpointHeader& header,
                            std::span<const float> params, std::span<const float> router_bias,
                            const std::vector<StateBuffer>& optimizer_state, int keep);

// Reads a checkpoint into the given buffers (sizes must match the model and optimizer) and
// verifies the checksum and the config hash (or, with match_branch, the branch hash).
// Throws std::runtime_error with the reason.
CheckpointHeader ReadCheckpoint(const std::string& path, const std::string& expected_hash,
                                std::span<float> params, std::span<float> router_bias,
                                const std::vector<StateBuffer>& optimizer_state,
                                bool match_branch = false);

// Reads only the header (no checksum, no payload): cheap, for choosing and pruning. Throws
// std::runtime_error when the file is not a moelab checkpoint.
CheckpointHeader ReadCheckpointHeader(const std::string& path);

// Checkpoint files in dir, newest (highest step) first.
std::vector<std::string> CheckpointsNewestFirst(const std::string& dir);

// The checkpoints of dir (and identity.legacy_checkpoint) the run may resume from, newest first.
// Each file it passes over says why through warn: another run's ("foreign"), a legacy file this
// run did not record, one beyond identity.max_step, an unreadable header.
std::vector<std::string> ResumeCandidates(const std::string& dir, const ResumeIdentity& identity,
                                          const std::function<void(const std::string&)>& warn);

// Resume: reads the first of candidates (ResumeCandidates) that passes ReadCheckpoint; one that
// fails (corrupt, truncated, another config) is skipped with a warning passed to warn (e.g.
// printed to stderr). Returns the path read, "" when there are no candidates; throws when there
// are candidates but none is valid.
std::string ReadNewestValidCheckpoint(const std::vector<std::string>& candidates,
                                      const std::string& expected_hash, std::span<float> params,
                                      std::span<float> router_bias,
                                      const std::vector<StateBuffer>& optimizer_state,
                                      CheckpointHeader* header,
                                      const std::function<void(const std::string&)>& warn);

// The newest readable checkpoint in dir ("" if none).
std::string LatestCheckpoint(const std::string& dir);
// The step encoded in a checkpoint's file name (-1 if it is not a checkpoint name).
int64_t CheckpointStepOf(const std::string& path);
// The checkpoint of exactly this step in dir ("" if none).
std::string CheckpointAtStep(const std::string& dir, int64_t step);

}  // namespace moelab
