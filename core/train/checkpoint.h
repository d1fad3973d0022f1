// Checkpoints: parameters, router biases, optimizer state and the step, written atomically
// (temp file, fsync, rename, fsync of the folder) and verified by a checksum when read.
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
};

// Writes <dir>/step_<step>.ckpt atomically and removes all but the newest `keep` checkpoints.
// Returns the path written.
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

// Checkpoint files in dir, newest (highest step) first.
std::vector<std::string> CheckpointsNewestFirst(const std::string& dir);

// Resume: reads the newest checkpoint of dir that passes ReadCheckpoint; a newer one that fails
// (corrupt, truncated, another config) is skipped with a warning passed to warn (e.g. printed to
// stderr). Returns the path read, "" when dir has no checkpoint at all; throws when there are
// checkpoints but none is valid.
std::string ReadNewestValidCheckpoint(const std::string& dir, const std::string& expected_hash,
                                      std::span<float> params, std::span<float> router_bias,
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
