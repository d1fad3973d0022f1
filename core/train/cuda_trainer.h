// The training loop on a CUDA GPU (train.device "cuda"): the same steps as Train() in
// core/train/trainer.cc (data → forward/backward → clip → optimizer → QK-Clip → router bias →
// metrics, evaluation, checkpoints, resume), with parameters, gradients, activations and
// optimizer state resident on the device. See docs/cuda.md.
#pragma once

#include "core/config.h"
#include "core/metrics.h"
#include "core/train/trainer.h"

namespace moelab {

// Called by Train() when config.train.device == "cuda". Without a usable GPU (or in a build
// without CUDA) the run fails before its first step with the reason reported to the sink.
TrainResult TrainOnCuda(const RunConfig& config, MetricsSink* sink, const TrainOptions& options);

}  // namespace moelab
