// Small ImGui widgets every moelab-gui view shares.
#pragma once

#include <imgui.h>

#include <span>
#include <string>
#include <vector>

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
// A multi-line text editor with line numbers in a gutter; line `mark_line` (1-based; 0 = none)
// is highlighted in the text and the gutter (where a JSON error is), and scrolled into view
// when `reveal_mark`. True when edited.
bool CodeEditor(const char* id, std::string* text, ImVec2 size, int mark_line, bool reveal_mark);

// Text drawn straight into a draw list (labels of heatmaps and plots) that, unlike
// ImDrawList::AddText, also reaches ImGui's text log, so `--script dump-text` sees it.
void DrawListText(ImDrawList* dl, ImVec2 pos, ImU32 color, const char* text);
// The tooltip of a per-layer timeline under the mouse: the step at or before mouse_x and each
// layer's value there ("<layer_name> l: value"), in the colours the layers' lines are drawn in.
// series[l][i] is layer l's value at steps[i].
void LayerTooltip(std::span<const double> steps, double mouse_x,
                  const std::vector<std::vector<double>>& series, const char* layer_name);
// Tables drawn this frame whose columns are cut off: content wider than the table shows with
// no horizontal scrolling, in the table or its window. One line each ("" when none).
std::vector<std::string> ClippedTables();

}  // namespace moelab::gui
