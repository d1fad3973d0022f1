// The adaptive panel of the Sweeps view (issue 38): for a sweep with an "adaptive" block, the
// question it answers, the estimate and repeated interval after each batch, the budget spent and
// left, and why each batch's runs were chosen. It reads the database's adaptive_batches and
// adaptive_looks (sweeps/adaptive_store.h), refreshed every two seconds; analysis stays in
// sweeps/ and analysis/.
#pragma once

#include <string>

namespace moelab::gui {

// Draws nothing for a sweep without an "adaptive" block (or a database without it).
void AdaptivePanel(const std::string& db_path, const std::string& sweep_name);

}  // namespace moelab::gui
