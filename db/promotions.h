// Promotions (`moelab promote`): a plan made from a sweep's fit — the promoted config, the
// predicted loss with its band and the predicted loss-vs-FLOPs curve — and the run it launched.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "db/sqlite.h"

namespace moelab::db {

struct PromotionRecord {
  int64_t id = 0;
  double created_at = 0;
  std::optional<int64_t> sweep_id;
  std::optional<int64_t> fit_id;
  std::string law;  // "chinchilla" | "power"
  std::string family_key, family;
  std::optional<int64_t> source_run_id;
  std::string target_json;  // {"budget_flops": C} or {"target_loss": L}
  std::string plan_json;    // promote::PromotionPlan as JSON (curve and band included)
  std::string config_json;  // the promoted run config
  std::string out_dir;      // where the config and launch scripts were written
  double predicted_loss = 0, band_lo = 0, band_hi = 0;
  std::optional<int64_t> run_id;  // the launched run, once there is one
};

// Inserts a promotion; returns its id.
int64_t SavePromotion(const std::string& path, const PromotionRecord& p);
// Links the promotion to the run it launched.
void LinkPromotionRun(const std::string& path, int64_t promotion_id, int64_t run_id);
// Records the folder the promotion's config and launch scripts were written to.
void SetPromotionOutDir(const std::string& path, int64_t promotion_id, const std::string& out_dir);
// Newest first (read-only connection).
std::vector<PromotionRecord> ListPromotions(const std::string& path);
std::optional<PromotionRecord> GetPromotion(const std::string& path, int64_t id);
// The promotion a run was launched by, if any.
std::optional<PromotionRecord> PromotionOfRun(const std::string& path, int64_t run_id);

}  // namespace moelab::db
