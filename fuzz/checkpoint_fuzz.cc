// libFuzzer target: the checkpoint reader (core/train/checkpoint.h): ReadCheckpointHeader (what
// resume and pruning read of every file in a run folder) and ReadCheckpoint (the whole file).
// Input: byte 0 holds flags (bit 0: make the trailing checksum match, so the fuzzer gets past
// it into the payload; bit 1: match the branch hash), bytes 1-3 the model's sizes (parameters,
// router biases, optimizer buffers "b0", "b1", ...), the rest is the checkpoint file.
// Then ResumeCandidates over the folder holding it.
// Findings: a crash, a hang, a sanitizer report, or an exception other than std::runtime_error.
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/train/checkpoint.h"
#include "fuzz/fuzz_util.h"

namespace {

// The checksum WriteCheckpoint appends (FNV-1a over everything before it). Kept in step with
// core/train/checkpoint.cc by hand: when the format changes, only the fuzzer's reach suffers.
uint64_t Fnv1a(const uint8_t* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const uint8_t flags = data[0];
  std::vector<float> params(data[1] % 64), bias(data[2] % 16);
  std::vector<std::vector<float>> buffers(data[3] % 4);
  std::vector<uint8_t> file(data + 4, data + size);
  if ((flags & 1) && file.size() >= sizeof(uint64_t)) {
    const uint64_t sum = Fnv1a(file.data(), file.size() - sizeof sum);
    std::memcpy(file.data() + file.size() - sizeof sum, &sum, sizeof sum);
  }
  const std::string path =
      moelab::fuzz::WriteScratch("step_000000001.ckpt", file.data(), file.size());
  std::vector<moelab::StateBuffer> state;
  for (size_t i = 0; i < buffers.size(); ++i) {
    buffers[i].resize(params.size());
    state.push_back({"b" + std::to_string(i), &buffers[i]});
  }
  try {
    moelab::ReadCheckpointHeader(path);
  } catch (const std::runtime_error& e) {
    moelab::fuzz::ExpectClear(e);
  }
  try {
    moelab::ReadCheckpoint(path, "", params, bias, state, (flags & 2) != 0);
  } catch (const std::runtime_error& e) {
    moelab::fuzz::ExpectClear(e);
  }
  // Resume's choice among a folder's files reads every header and explains every skip.
  moelab::ResumeIdentity identity;
  identity.run_uuid = "0123456789abcdef";
  identity.max_step = 5;
  moelab::ResumeCandidates(
      moelab::fuzz::ScratchDir().string(), identity,
      [](const std::string& why) { moelab::fuzz::ExpectClear(std::runtime_error(why)); });
  return 0;
}
