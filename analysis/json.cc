// JSON for the fits table and `moelab fit --json`. NaN becomes null (nlohmann's behaviour).
#include "analysis/ablation.h"

namespace moelab::analysis {

void to_json(nlohmann::json& j, const Estimate& v) {
  j = {{"estimate", v.estimate}, {"lo", v.lo}, {"hi", v.hi}};
}

void to_json(nlohmann::json& j, const ParamEstimate& v) {
  j = {{"name", v.name},
       {"value", v.value},
       {"lower_bound", v.lower_bound},
       {"upper_bound", v.upper_bound},
       {"at_bound", v.at_bound},
       {"resamples_at_bound", v.resamples_at_bound}};
}

void to_json(nlohmann::json& j, const FitOptions& v) {
  j = {{"huber_delta", v.huber_delta},
       {"flops_unit", v.flops_unit},
       {"bootstrap_resamples", v.bootstrap_resamples},
       {"seed", v.seed},
       {"level", v.level},
       {"min_units", v.min_units},
       {"final_only", v.final_only},
       {"expanded_percentile", v.expanded_percentile},
       {"skip_failed_families", v.skip_failed_families},
       {"max_failed_fraction", v.max_failed_fraction},
       {"min_span_fraction", v.min_span_fraction},
       {"max_iterations", v.max_iterations}};
}

void to_json(nlohmann::json& j, const FitDiagnostics& v) {
  j = {{"starts_tried", v.starts_tried},
       {"winning_start", v.winning_start},
       {"winning_start_values", v.winning_start_values},
       {"cost", v.cost},
       {"rmse_log", v.rmse_log},
       {"n_points", v.n_points},
       {"n_runs", v.n_runs},
       {"resamples_ok", v.resamples_ok},
       {"resamples_failed", v.resamples_failed},
       {"params_at_bound", v.params_at_bound}};
}

void to_json(nlohmann::json& j, const FrontierPoint& v) {
  j = {{"run", v.run}, {"flops", v.flops}, {"loss", v.loss}};
}

void to_json(nlohmann::json& j, const MisfitCheck& v) {
  j = {{"n_budgets", v.n_budgets}, {"positives", v.positives},
       {"negatives", v.negatives}, {"runs", v.runs},
       {"runs_p", v.runs_p},       {"unconstrained_E", v.unconstrained_E},
       {"rejected", v.rejected},   {"reason", v.reason}};
}

void to_json(nlohmann::json& j, const PowerLawFit& v) {
  j = {{"family", v.family},
       {"form", "L = E + A*(C/flops_unit)^(-alpha)"},
       {"params", v.params},
       {"diagnostics", v.diagnostics},
       {"flops_unit", v.flops_unit},
       {"paired", v.paired},
       {"n_units", v.n_units},
       {"interval_note", v.interval_note},
       {"misfit", v.misfit},
       {"flops_range", {v.min_flops, v.max_flops}},
       {"loss_range", {v.min_loss, v.max_loss}},
       {"frontier", v.frontier}};
}

void to_json(nlohmann::json& j, const FamilyFits& v) {
  j = {{"families", v.families}, {"warnings", v.warnings}, {"options", v.options}};
}

void to_json(nlohmann::json& j, const Multiplier& v) {
  j = {{"family", v.family},
       {"reference", v.reference},
       {"target_loss", v.target_loss},
       {"ok", v.ok},
       {"refusal", v.refusal},
       {"multiplier", v.multiplier},
       {"compute_family", v.compute_family},
       {"compute_reference", v.compute_reference},
       {"undefined_fraction", v.undefined_fraction},
       {"paired", v.paired},
       {"interval_note", v.interval_note},
       {"flags", v.flags}};
}

void to_json(nlohmann::json& j, const MultiplierTable& v) {
  j = {{"reference", v.reference}, {"target_loss", v.target_loss}, {"rows", v.rows}};
}

void to_json(nlohmann::json& j, const JointFormFit& v) {
  j = {{"form", v.form},
       {"formula", v.formula},
       {"params", v.params},
       {"diagnostics", v.diagnostics},
       {"holdout_rmse_log", v.holdout_rmse_log},
       {"holdout_mae_log", v.holdout_mae_log},
       {"holdout_points", v.holdout_points}};
}

void to_json(nlohmann::json& j, const JointSparsityFit& v) {
  j = {{"forms", v.forms},
       {"better_form", v.better_form},
       {"holdout_rule", v.holdout_rule},
       {"warnings", v.warnings}};
}

void to_json(nlohmann::json& j, const ComputeOptimal& v) {
  j = {{"flops", v.flops}, {"params", v.params}, {"tokens", v.tokens}, {"loss", v.loss}};
}

void to_json(nlohmann::json& j, const ChinchillaFit& v) {
  j = {{"form", "L = E + A/N^alpha + B/D^beta"},
       {"params", v.params},
       {"exponent_n", v.exponent_n},
       {"exponent_d", v.exponent_d},
       {"optimal", v.optimal},
       {"diagnostics", v.diagnostics},
       {"flops_per_param_token", v.flops_per_param_token},
       {"warnings", v.warnings}};
}

void to_json(nlohmann::json& j, const HeadsBudgetDelta& v) {
  j = {{"tokens", v.tokens},
       {"base_loss", v.base_loss},
       {"treatment_loss", v.treatment_loss},
       {"base_flops", v.base_flops},
       {"treatment_flops", v.treatment_flops},
       {"delta_equal_tokens", v.delta_equal_tokens},
       {"equal_tokens_stats", v.equal_tokens_stats},
       {"replicated", v.replicated},
       {"delta_equal_flops", v.delta_equal_flops},
       {"note", v.note}};
}

void to_json(nlohmann::json& j, const HeadsAblation& v) {
  j = {{"base_family", v.base_family},
       {"treatment_family", v.treatment_family},
       {"budgets", v.budgets},
       {"mean_delta_equal_tokens", v.mean_delta_equal_tokens},
       {"mean_equal_tokens_stats", v.mean_equal_tokens_stats},
       {"mean_delta_equal_flops", v.mean_delta_equal_flops},
       {"warnings", v.warnings}};
}

void to_json(nlohmann::json& j, const IsoFlopProfile& v) {
  j = {{"flops", v.flops},
       {"n_sizes", v.n_sizes},
       {"min_params", v.min_params},
       {"max_params", v.max_params},
       {"best_params", v.best_params},
       {"vertex_params", v.vertex_params},
       {"minimum_at_edge", v.minimum_at_edge},
       {"vertex_outside_grid", v.vertex_outside_grid},
       {"not_convex", v.not_convex},
       {"vertex_offset", v.vertex_offset},
       {"issues", v.issues}};
}

void to_json(nlohmann::json& j, const IsoFlopReport& v) {
  j = {{"profiles", v.profiles}, {"pitfall", v.pitfall}, {"issues", v.issues}};
}

void to_json(nlohmann::json& j, const InferenceFlops& v) {
  j = {{"attention_projections", v.attention_projections},
       {"attention_scores", v.attention_scores},
       {"dense_ffn", v.dense_ffn},
       {"routed_experts", v.routed_experts},
       {"shared_experts", v.shared_experts},
       {"router", v.router},
       {"lm_head", v.lm_head},
       {"total", v.total},
       {"conventions", v.conventions}};
}

}  // namespace moelab::analysis
