// The text `moelab fit` prints for a FitResult: one function per form, and the power form's
// sections one function each, so a new section (e.g. a per-doubling slope) is one more call.
#pragma once

#include <string>

#include "analysis/run_fit.h"

namespace moelab::cli {

// "1.23 [1.1, 1.4]", or the point with "(no interval)".
std::string Interval(const analysis::Estimate& e, const char* spec = "{:.4g}");

// Everything after the header, for any form (`by` is the family key's label);
// `after_model_free` is printed right after the model-free table (the per-doubling slope).
void PrintFitResult(const analysis::FitResult& r, const std::string& by,
                    const std::string& after_model_free = "");

// The power form's sections, in the order PrintFitResult prints them.
void PrintModelFree(const analysis::ModelFreeTable& t, const std::string& by);
void PrintFittedLaws(const analysis::PowerFormResult& p, const std::string& by);
void PrintMisfit(const analysis::PowerFormResult& p);
void PrintFittedMultipliers(const analysis::PowerFormResult& p, const std::string& by);

}  // namespace moelab::cli
