#include "core/train/micro_batch.h"

namespace moelab {

MicroBatchPlan PlanMicroBatches(const RunConfig& config, int local_batch) {
  MicroBatchPlan plan;
  plan.rows = local_batch;
  const int micro = config.train.micro_batch;
  plan.micro = micro <= 0 || micro > local_batch ? local_batch : micro;
  return plan;
}

void AccumulateStats(const StepStats& part, double weight, bool first, StepStats* step) {
  if (!step) return;
  if (first) {
    *step = part;
    step->loss = weight * part.loss;
    step->aux_loss = weight * part.aux_loss;
    step->z_loss = weight * part.z_loss;
    return;
  }
  step->loss += weight * part.loss;
  step->aux_loss += weight * part.aux_loss;
  step->z_loss += weight * part.z_loss;
  for (size_t i = 0; i < step->max_logit.size() && i < part.max_logit.size(); ++i) {
    step->max_logit[i] = std::max(step->max_logit[i], part.max_logit[i]);
  }
  for (size_t i = 0; i < step->max_logit_raw.size() && i < part.max_logit_raw.size(); ++i) {
    step->max_logit_raw[i] = std::max(step->max_logit_raw[i], part.max_logit_raw[i]);
  }
  for (size_t i = 0; i < step->expert_counts.size() && i < part.expert_counts.size(); ++i) {
    step->expert_counts[i] += part.expert_counts[i];
  }
}

void GradAccumulator::Add(const float* g, double w, bool first) {
  if (buf_.size() != n_) buf_.Resize(n_);
  be_.ScaledSum(g, w, first, buf_.data(), n_);
}

void GradAccumulator::Finish(float* g, double w) { be_.FinishScaledSum(buf_.data(), w, g, n_); }

MoeBatchStatsHook StepAuxStats::Recorder() {
  layers_.clear();
  return [this](int layer, MoeBatchStats& s) {
    if (static_cast<size_t>(layer) >= layers_.size()) layers_.resize(layer + 1);
    Layer& l = layers_[layer];
    l.counts.resize(s.experts, 0);
    l.score_sums.resize(s.experts, 0.0);
    for (int e = 0; e < s.experts; ++e) {
      l.counts[e] += s.counts[e];
      l.score_sums[e] += s.score_sums[e];
    }
    l.tokens += *s.tokens;
  };
}

void StepAuxStats::Combine() {
  if (!ranks_) return;
  for (size_t i = 0; i < layers_.size(); ++i) {
    Layer& l = layers_[i];
    MoeBatchStats s{static_cast<int>(l.counts.size()), l.counts.data(), l.score_sums.data(),
                    &l.tokens};
    ranks_(static_cast<int>(i), s);
  }
}

MoeBatchStatsHook StepAuxStats::Replayer() {
  return [this](int layer, MoeBatchStats& s) {
    const Layer& l = layers_.at(layer);
    for (int e = 0; e < s.experts; ++e) {
      s.counts[e] = l.counts[e];
      s.score_sums[e] = l.score_sums[e];
    }
    *s.tokens = l.tokens;
  };
}

double ForwardBackwardMicroBatched(Model<float>& model, const int32_t* tokens, int seq_len,
                                   const MicroBatchPlan& plan, StepStats* stats,
                                   GradAccumulator& acc, StepAuxStats* aux) {
  if (plan.count() <= 1) return model.ForwardBackward(tokens, plan.rows, stats);
  const size_t row = static_cast<size_t>(seq_len) + 1;
  if (aux) {
    model.SetMoeBatchStatsHook(aux->Recorder());
    for (int i = 0; i < plan.count(); ++i) {
      model.Forward(tokens + plan.begin(i) * row, plan.size(i), nullptr);
    }
    aux->Combine();
    model.SetMoeBatchStatsHook(aux->Replayer());
  }
  StepStats part;
  double objective = 0;
  const int last = plan.count() - 1;
  for (int i = 0; i <= last; ++i) {
    const double w = plan.weight(i);
    objective += w * model.ForwardBackward(tokens + plan.begin(i) * row, plan.size(i), &part);
    if (i < last) {
      acc.Add(model.grads(), w, i == 0);
    } else {
      acc.Finish(model.grads(), w);
    }
    AccumulateStats(part, w, i == 0, stats);
  }
  if (aux) model.SetMoeBatchStatsHook(aux->ranks());
  return objective;
}

double ForwardMicroBatched(Model<float>& model, const int32_t* tokens, int seq_len,
                           const MicroBatchPlan& plan, StepStats* stats) {
  if (plan.count() <= 1) return model.Forward(tokens, plan.rows, stats);
  const size_t row = static_cast<size_t>(seq_len) + 1;
  StepStats part;
  double objective = 0;
  for (int i = 0; i < plan.count(); ++i) {
    const double w = plan.weight(i);
    objective += w * model.Forward(tokens + plan.begin(i) * row, plan.size(i), &part);
    AccumulateStats(part, w, i == 0, stats);
  }
  return objective;
}

}  // namespace moelab
