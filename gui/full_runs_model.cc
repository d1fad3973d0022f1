#include "gui/full_runs_model.h"

#include <chrono>
#include <cmath>

#include "db/reader.h"
#include "promote/plan.h"

namespace moelab::gui {

namespace {

RunCurve Curve(db::Reader& reader, const db::RunRow& row) {
  RunCurve c;
  c.run = row.id;
  c.name = row.name;
  c.status = row.effective_status;
  const db::Series loss = reader.GetSeries(row.id, "val_loss");
  const db::Series flops = reader.GetSeries(row.id, "eval_flops");
  for (size_t i = 0; i < loss.values.size() && i < flops.values.size(); ++i) {
    if (!(flops.values[i] > 0) || !std::isfinite(loss.values[i])) continue;
    c.flops.push_back(flops.values[i]);
    c.loss.push_back(loss.values[i]);
  }
  return c;
}

}  // namespace

std::vector<double> BandUnitsOf(const nlohmann::json& plan, const RunCurve& curve) {
  std::vector<double> out;
  if (!plan.contains("curve")) return out;
  for (size_t i = 0; i < curve.flops.size(); ++i)
    out.push_back(promote::BandUnits(plan, curve.flops[i], curve.loss[i]));
  return out;
}

FullRunsData LoadFullRuns(const std::string& db_path, int64_t promotion_id) {
  FullRunsData d;
  d.db_path = db_path;
  d.last_band_units = NAN;
  try {
    d.promotions = db::ListPromotions(db_path);
    if (d.promotions.empty()) return d;
    const db::PromotionRecord* p = &d.promotions.front();
    for (const auto& q : d.promotions)
      if (q.id == promotion_id) p = &q;
    d.promotion = p->id;
    d.plan = nlohmann::json::parse(p->plan_json, nullptr, false);
    db::Reader reader(db_path);
    for (const db::RunRow& row : reader.ListRuns()) {
      if (p->run_id && row.id == *p->run_id) {
        d.promoted = Curve(reader, row);
      } else if (p->sweep_id && row.sweep_id == p->sweep_id) {
        d.sweep.push_back(Curve(reader, row));
      }
    }
    d.band_units = BandUnitsOf(d.plan, d.promoted);
    if (!d.band_units.empty()) {
      d.last_band_units = d.band_units.back();
      d.outside = std::abs(d.last_band_units) > 1;
    }
  } catch (const std::exception& e) {
    d.error = e.what();
  }
  return d;
}

FullRunsLoader::FullRunsLoader(std::string db_path, double poll_interval_s)
    : path_(std::move(db_path)), interval_s_(poll_interval_s) {
  thread_ = std::thread([this] { Loop(); });
}

FullRunsLoader::~FullRunsLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void FullRunsLoader::Select(int64_t promotion_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (wanted_ == promotion_id) return;
    wanted_ = promotion_id;
  }
  cv_.notify_all();
}

std::shared_ptr<const FullRunsData> FullRunsLoader::Data() const {
  std::lock_guard<std::mutex> lock(mu_);
  return data_;
}

void FullRunsLoader::Loop() {
  uint64_t version = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    const int64_t wanted = wanted_;
    lock.unlock();
    auto d = std::make_shared<FullRunsData>(LoadFullRuns(path_, wanted));
    d->version = ++version;
    lock.lock();
    data_ = std::move(d);
    cv_.wait_for(lock, std::chrono::duration<double>(interval_s_),
                 [&] { return stop_ || wanted_ != wanted; });
  }
}

}  // namespace moelab::gui
