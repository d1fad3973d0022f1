// "Did you mean" for names a user types: config paths (core/config.cc uses the same edit
// distance) and sweep variables in expressions (sweeps/spec.cc).
#pragma once

#include <map>
#include <string>
#include <vector>

namespace moelab {

// The candidate nearest to `name` by edit distance when it is close enough to be a typo (at most
// max(2, |name| / 3) edits), else "". Defined in core/config.cc beside the config's own hint.
std::string ClosestName(const std::string& name, const std::vector<std::string>& candidates);

// The config path (section.field) nearest to `name`: a path with a typo, a field under the wrong
// section, a bare field name (a sweep variable), or another trainer's name for it
// (learning_rate: optimizer.lr); "" when none is close. Defined in core/config.cc.
std::string NearestConfigPath(const std::string& name);

// Other trainers' names for config fields (nanoGPT, llm.c, Hugging Face configs) and the path
// each means: too far from ours by edit distance to be found as typos. core/config_names.cc.
const std::map<std::string, std::string>& ForeignConfigNames();

}  // namespace moelab
