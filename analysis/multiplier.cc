// FLOPs multipliers C_family(L*) / C_reference(L*) from fitted power laws (the smoothed,
// secondary reading; analysis/model_free.h has the primary one).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "analysis/bootstrap.h"
#include "analysis/fit_common.h"
#include "analysis/scaling.h"

namespace moelab::analysis {

using internal::kNaN;

Multiplier ComputeMultiplier(const PowerLawFit& f, const PowerLawFit& ref, double target,
                             const MultiplierOptions& opt) {
  Multiplier m;
  m.family = f.family;
  m.reference = ref.family;
  m.target_loss = target;
  // Refusals before estimation leave the numbers NaN (null in JSON), never a misleading 0.
  m.multiplier = m.compute_family = m.compute_reference = {kNaN, kNaN, kNaN};
  for (const PowerLawFit* p : {&f, &ref}) {
    if (!(target > p->E() * (1 + opt.loss_margin))) {
      m.refusal = fmt::format(
          "L* = {:.4g} is not above the fitted irreducible loss E = {:.4g} of family '{}' by the "
          "{:.0f}% margin; the law would be extrapolated to (or past) its asymptote",
          target, p->E(), p->family, 100 * opt.loss_margin);
      return m;
    }
    double c = p->ComputeAtLoss(target);
    if (c > p->max_flops * opt.extrapolation_factor ||
        c < p->min_flops / opt.extrapolation_factor) {
      m.refusal = fmt::format(
          "reaching L* = {:.4g} takes {:.3g} FLOPs for family '{}', outside {}x its measured "
          "compute range [{:.3g}, {:.3g}]",
          target, c, p->family, opt.extrapolation_factor, p->min_flops, p->max_flops);
      return m;
    }
  }
  for (const PowerLawFit* p : {&f, &ref}) {
    const ParamEstimate& e = p->params.at(0);
    if (p->misfit.rejected) {
      // A rejected form is reported as rejected, never as an unidentified asymptote.
      const std::string what = fmt::format(
          "the power law of family '{}' is rejected ({}): C(L*) is read off the nearest member of "
          "a "
          "form that does not describe the data; the model-free estimate is the reading",
          p->family, p->misfit.reason);
      if (!opt.allow_e_at_bound) {
        m.refusal = what + " (report it anyway with --allow-e-at-bound)";
        return m;
      }
      m.flags.push_back(what);
    } else if (e.at_bound) {
      const std::string what = fmt::format(
          "the fitted E = {:.4g} of family '{}' sits on its bound [{:.4g}, {:.4g}]: the asymptote "
          "is "
          "not identified by the data, and C(L*) depends on where the bound was put",
          e.value.estimate, p->family, e.lower_bound, e.upper_bound);
      if (!opt.allow_e_at_bound) {
        m.refusal = what + " (allow with --allow-e-at-bound)";
        return m;
      }
      m.flags.push_back(what);
    } else if (e.resamples_at_bound > 0) {
      m.flags.push_back(fmt::format("E of family '{}' is on its bound in {:.1f}% of resamples",
                                    p->family, 100 * e.resamples_at_bound));
    }
  }
  // Draws pair by resample number only when both fits drew the same seeds in resample b (one
  // FitFamilies call, paired by seed); otherwise they are independent draws.
  m.paired = f.paired && ref.paired && f.bootstrap_seed == ref.bootstrap_seed;
  if (f.paired != ref.paired) {
    m.refusal =
        "one family was drawn paired by seed and the other not; fit both in one call so that "
        "their resamples share seeds";
    return m;
  }
  double c_f = f.ComputeAtLoss(target), c_r = ref.ComputeAtLoss(target);
  m.interval_note = !f.interval_note.empty() ? f.interval_note : ref.interval_note;
  if (!m.interval_note.empty()) {
    m.compute_family = {c_f, kNaN, kNaN};
    m.compute_reference = {c_r, kNaN, kNaN};
    m.multiplier = {c_f / c_r, kNaN, kNaN};
    m.ok = true;
    return m;
  }
  const size_t n = std::min(f.draws.size(), ref.draws.size());
  std::vector<double> mult, cf, cr;
  int undefined = 0;
  const double inf = std::numeric_limits<double>::infinity();
  for (size_t b = 0; b < n; ++b) {
    const auto& a = f.draws[b];
    const auto& r = ref.draws[b];
    if (std::isnan(a[0]) || std::isnan(r[0])) continue;
    // A resample whose E lies above L* never reaches it: that family's C is infinite.
    double ca = internal::ComputeAt(a[0], a[1], a[2], f.flops_unit, target);
    double cb = internal::ComputeAt(r[0], r[1], r[2], ref.flops_unit, target);
    if (std::isnan(ca) || std::isnan(cb)) undefined++;
    ca = std::isnan(ca) ? inf : ca;
    cb = std::isnan(cb) ? inf : cb;
    cf.push_back(ca);
    cr.push_back(cb);
    mult.push_back(std::isinf(ca) && std::isinf(cb) ? kNaN : ca / cb);
  }
  m.undefined_fraction = cf.empty() ? 1.0 : static_cast<double>(undefined) / cf.size();
  const int n_units = std::min(f.n_units, ref.n_units);
  const double level =
      opt.expanded_percentile ? internal::ExpandedLevel(opt.level, n_units) : opt.level;
  m.compute_family = internal::MakeEstimate(c_f, cf, level);
  m.compute_reference = internal::MakeEstimate(c_r, cr, level);
  m.multiplier = internal::MakeEstimate(c_f / c_r, mult, level);
  if (m.undefined_fraction > (1 - level) / 2) {
    m.refusal = fmt::format(
        "in {:.0f}% of bootstrap resamples L* = {:.4g} lies below a fitted E, so the {:.0f}% "
        "interval is unbounded",
        100 * m.undefined_fraction, target, 100 * opt.level);
    return m;
  }
  m.ok = true;
  return m;
}

MultiplierTable ComputeMultiplierTable(const FamilyFits& fits, const std::string& reference,
                                       double target, const MultiplierOptions& opt) {
  MultiplierTable t;
  t.reference = reference;
  t.target_loss = target;
  const PowerLawFit& ref = fits.Get(reference);
  for (const auto& f : fits.families) {
    if (f.family == reference) continue;
    t.rows.push_back(ComputeMultiplier(f, ref, target, opt));
  }
  return t;
}

std::vector<Multiplier> MultiplierCurve(const PowerLawFit& f, const PowerLawFit& ref, int points,
                                        const MultiplierOptions& opt) {
  double lo = std::max(f.min_loss, ref.min_loss);
  double hi = std::min(f.max_loss, ref.max_loss);
  if (!(lo < hi)) {
    throw AnalysisError(fmt::format(
        "families '{}' and '{}' cover disjoint loss ranges ([{:.4g}, {:.4g}] vs [{:.4g}, {:.4g}]); "
        "no common L* to compare at",
        f.family, ref.family, f.min_loss, f.max_loss, ref.min_loss, ref.max_loss));
  }
  if (points < 2) points = 2;
  std::vector<Multiplier> out;
  for (int i = 0; i < points; ++i) {
    double l = lo + (hi - lo) * i / (points - 1);
    out.push_back(ComputeMultiplier(f, ref, l, opt));
  }
  return out;
}

}  // namespace moelab::analysis
