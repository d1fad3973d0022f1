// "Did you mean" for names a user types: config paths (core/config.cc uses the same edit
// distance) and sweep variables in expressions (sweeps/spec.cc).
#pragma once

#include <string>
#include <vector>

namespace moelab {

// The candidate nearest to `name` by edit distance when it is close enough to be a typo (at most
// max(2, |name| / 3) edits), else "". Defined in core/config.cc beside the config's own hint.
std::string ClosestName(const std::string& name, const std::vector<std::string>& candidates);

}  // namespace moelab
