// The Scaling view's fit forms: the chooser of `moelab fit --form` and the tables of every form
// besides the power law (joint sparsity, Chinchilla, heads ablation, IsoFLOP check), drawn from
// the analysis::RunFit result gui::ComputeFits holds, with the numbers the CLI prints.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "gui/fits.h"

namespace moelab::gui {

// A combo over analysis::FitForms(); true when the choice changed.
bool FitFormCombo(std::string* form);

// The request's chinchilla budgets from the typed text; *error says why they cannot be read
// (the request then has none).
std::vector<double> BudgetsOf(const std::string& text, std::string* error);

// A table that fits its columns to their contents and scrolls sideways when the pane is
// narrower; `rows` body rows set its height.
bool BeginFitTable(const char* id, int columns, size_t rows);

// The heads ablation: a base and a treatment family chosen from `families`, then (L_treatment
// - L_base) / L_base per token budget at equal tokens and at equal FLOPs, and the mean.
void DrawHeadsAblation(const FitResult& res, const std::vector<std::string>& families,
                       std::string* base, std::string* treatment);

// Everything a non-power form shows: its inputs (heads: the two families; chinchilla: the
// budgets, comma-separated FLOPs), then its result or why there is none.
void DrawFitForm(const FitResult& res, const std::string& family_key, std::string* heads_base,
                 std::string* heads_treatment, std::string* budgets);

}  // namespace moelab::gui
