#include "gui/fits.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>

namespace moelab::gui {

FitResult ComputeFits(const FitRequest& request) {
  const auto t0 = std::chrono::steady_clock::now();
  FitResult out;
  out.request = request;
  try {
    out.observations =
        analysis::LoadObservations(request.db_path, request.sweep_id, request.family_key);
    if (out.observations.points.empty()) {
      out.error = "no finished run with evaluations has a value for '" + request.family_key + "'";
    } else {
      analysis::FitOptions options;
      options.bootstrap_resamples = request.resamples;
      options.skip_failed_families = true;
      options.threads = 1;  // the GUI shares the machine with the runs it watches
      options.final_only = out.observations.wsd_runs > 0;  // as `moelab fit`: post-decay points
      out.fits = analysis::FitFamilies(out.observations.points, options);
    }
  } catch (const std::exception& e) {
    out.error = e.what();
  }
  if (out.fits) {
    // Curve and 5–95 % band over each family's measured range (3× beyond each end, the
    // multiplier's own extrapolation limit).
    for (const auto& f : out.fits->families) {
      FitBand band;
      band.family = f.family;
      const double a = std::log(f.min_flops / 3), b = std::log(f.max_flops * 3);
      std::vector<double> samples;
      for (int i = 0; i <= 64; ++i) {
        const double c = std::exp(a + (b - a) * i / 64);
        band.flops.push_back(c);
        band.loss.push_back(f.LossAtCompute(c));
        samples.clear();
        for (const auto& d : f.draws) {
          if (!std::isfinite(d[0])) continue;
          samples.push_back(d[0] + std::exp(d[1] - d[2] * std::log(c / f.flops_unit)));
        }
        if (samples.size() < 10) {
          band.lo.push_back(band.loss.back());
          band.hi.push_back(band.loss.back());
          continue;
        }
        std::sort(samples.begin(), samples.end());
        band.lo.push_back(samples[samples.size() * 5 / 100]);
        band.hi.push_back(samples[std::min(samples.size() - 1, samples.size() * 95 / 100)]);
      }
      out.bands.push_back(std::move(band));
    }
    if (!request.heads_base.empty() && !request.heads_treatment.empty() &&
        request.heads_base != request.heads_treatment) {
      try {
        analysis::FitOptions options;
        options.bootstrap_resamples = request.resamples;
        options.threads = 1;
        out.heads = analysis::CompareHeads(out.observations.points, request.heads_base,
                                           request.heads_treatment, options);
      } catch (const std::exception& e) {
        out.heads_error = e.what();
      }
    }
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

FitJob::FitJob() : thread_([this] { Loop(); }) {}

FitJob::~FitJob() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void FitJob::Submit(const FitRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (last_ && *last_ == request) return;
  if (pending_ && *pending_ == request) return;
  pending_ = request;
  wake_.notify_all();
}

std::shared_ptr<const FitResult> FitJob::Result() const {
  std::lock_guard<std::mutex> lock(mu_);
  return result_;
}

bool FitJob::Busy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return busy_ || pending_.has_value();
}

void FitJob::Loop() {
  while (true) {
    FitRequest request;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [this] { return stop_ || pending_.has_value(); });
      if (stop_) return;
      request = *pending_;
      pending_.reset();
      last_ = request;
      busy_ = true;
    }
    auto result = std::make_shared<FitResult>(ComputeFits(request));
    std::lock_guard<std::mutex> lock(mu_);
    result_ = std::move(result);
    busy_ = false;
  }
}

}  // namespace moelab::gui
