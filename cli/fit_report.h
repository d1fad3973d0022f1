// The text `moelab fit` prints for a FitResult: one function per form, and the power form's
// sections one function each, so a new section (e.g. a per-doubling slope) is one more call.
#pragma once

#include <string>

#include "analysis/frontier.h"
#include "analysis/run_fit.h"

namespace moelab::cli {

// "1.23 [1.1, 1.4]", or the point with "(no interval)".
std::string Interval(const analysis::Estimate& e, const char* spec = "{:.4g}");

// Everything after the header, for any form (`by` is the family key's label);
// `after_model_free` is printed right after the model-free table (the per-doubling slope);
// `frontier` (power form, families with several model sizes): which sizes make up each
// envelope, then each size's fixed-size table as the contrast, after the fitted law.
void PrintFitResult(const analysis::FitResult& r, const std::string& by,
                    const std::string& after_model_free = "",
                    const analysis::FrontierReport* frontier = nullptr);

// The power form's sections, in the order PrintFitResult prints them. The model-free table's
// header names its estimand (t.estimand); `what` (e.g. "at d_model=24") marks a contrast table,
// not the primary reading.
void PrintModelFree(const analysis::ModelFreeTable& t, const std::string& by,
                    const std::string& what = "");
void PrintFittedLaws(const analysis::PowerFormResult& p, const std::string& by);
void PrintMisfit(const analysis::PowerFormResult& p);
void PrintFittedMultipliers(const analysis::PowerFormResult& p, const std::string& by);
// The frontier's composition (sizes on each (family, seed) envelope, the compute-optimal size at
// each L*) and the fixed-size (training curve) table of each size.
void PrintFrontier(const analysis::FrontierReport& f, const std::string& by);

}  // namespace moelab::cli
