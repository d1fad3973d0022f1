// Misfit detection for a fitted power law: is the form L = E + A·C^(−α) (E ≥ 0) what the data
// follow, or only the nearest member of a family that does not describe them?
//
// Two checks, both cheap and both needed. A Wald–Wolfowitz runs test on the signs of the
// residuals in compute order: a wrong form leaves long same-sign runs (the curve bends the
// other way), exchangeable noise does not. And the unconstrained fit: E below zero means the
// data's log-log curvature is the opposite of the form's (local slopes steepen with compute),
// so an E pinned at its bound 0 is the form failing, not "E not identified".
#pragma once

#include <vector>

#include "analysis/scaling.h"

namespace moelab::analysis {

// P(R ≤ runs) for `positives` + `negatives` signs in random order (exact, small samples).
// NaN when one of the two counts is 0 (the test is undefined).
double RunsTestLowerP(int positives, int negatives, int runs);

// Residuals of log L against the fitted law `best` = (E, log_A, α) at the frontier points,
// averaged per budget (seeds at one compute value share it) in compute order; the runs test on
// their signs; and the fit with E's lower bound removed (start: `best`). Rejected when the runs
// test gives p < 0.01 or when E sits at 0 and the unconstrained E is negative.
MisfitCheck CheckPowerLawMisfit(const std::vector<FrontierPoint>& frontier,
                                const std::vector<double>& best, const FitOptions& opt);

}  // namespace moelab::analysis
