// Small ImGui widgets every moelab-gui view shares.
#pragma once

#include <imgui.h>

#include <string>

#include "core/run_status.h"
#include "gui/data_store.h"

namespace moelab::gui {

// The colour a run status is drawn in (running blue, done green, failed/diverged red, ...).
ImU32 StatusColor(RunStatus status);
// A "(?)" on the same line that shows `text` when hovered.
void HelpMarker(const char* text);
// A key chooser over sweep variables ("var:NAME") and config keys; `none` is the "" entry.
// Returns true when the user picked another key.
bool KeyCombo(const char* label, std::string* key, const RunsSnapshot& runs, const char* none);

}  // namespace moelab::gui
