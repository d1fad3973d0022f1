#include "analysis/frontier.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "analysis/family_design.h"
#include "analysis/fit_common.h"

namespace moelab::analysis {

namespace {

using RunVars = std::map<std::string, std::map<std::string, std::string>>;

// Model-size keys whose value differs between the runs (the sizes' names).
std::vector<std::string> VaryingSizeKeys(const std::vector<Observation>& obs,
                                         const RunVars& run_vars) {
  std::map<std::string, std::set<std::string>> values;
  for (const auto& o : obs) {
    auto vars = run_vars.find(o.run);
    if (vars == run_vars.end()) continue;
    for (const auto& [k, v] : vars->second)
      if (IsModelSizeKey(k)) values[k].insert(v);
  }
  std::vector<std::string> keys;
  for (const auto& [k, v] : values)
    if (v.size() > 1) keys.push_back(k);
  return keys;
}

std::string Leaf(const std::string& key) { return key.substr(key.rfind('.') + 1); }

// "size a" or "size a -> size b" for the envelope points bracketing `target`.
std::string SizeAt(const std::vector<FrontierPoint>& front,
                   const std::map<std::string, std::string>& size_of, double target) {
  for (size_t i = 0; i + 1 < front.size(); ++i) {
    if (front[i].loss >= target && target >= front[i + 1].loss) {
      const std::string& a = size_of.at(front[i].run);
      const std::string& b = size_of.at(front[i + 1].run);
      return a == b ? a : a + " -> " + b;
    }
  }
  return "";
}

// The envelopes of every (family, seed), with the sizes on them and at each target.
std::vector<EnvelopeUse> Envelopes(const std::vector<Observation>& obs,
                                   const std::map<std::string, std::string>& size_of,
                                   const std::vector<double>& targets, bool final_only) {
  std::map<std::string, std::map<std::string, std::vector<Observation>>> groups;
  for (const auto& o : obs) groups[o.family][o.seed].push_back(o);
  std::vector<EnvelopeUse> out;
  for (const auto& [family, seeds] : groups) {
    for (const auto& [seed, g] : seeds) {
      const std::vector<FrontierPoint> front = internal::FrontierOf(g, final_only);
      EnvelopeUse e;
      e.family = family;
      e.seed = seed;
      e.points = static_cast<int>(front.size());
      for (const auto& p : front) {
        const std::string& size = size_of.at(p.run);
        if (std::find(e.sizes.begin(), e.sizes.end(), size) == e.sizes.end())
          e.sizes.push_back(size);
      }
      for (double t : targets) e.size_at_target.push_back(SizeAt(front, size_of, t));
      out.push_back(std::move(e));
    }
  }
  return out;
}

}  // namespace

std::string EstimandLabel(Estimand e) {
  switch (e) {
    case Estimand::kFrontier:
      return "frontier (compute-optimal)";
    case Estimand::kFixedSize:
      return "fixed size (training curve)";
    case Estimand::kMixed:
      break;
  }
  return "mixed (some families one model size, some several: neither a frontier nor one "
         "training curve)";
}

Estimand EstimandOf(const std::vector<Observation>& obs) {
  std::map<std::string, std::set<double>> sizes;
  for (const auto& o : obs) sizes[o.family].insert(o.params);
  bool all_one = true, all_several = !sizes.empty();
  for (const auto& [family, s] : sizes) {
    all_one = all_one && s.size() == 1;
    all_several = all_several && s.size() >= 2;
  }
  if (all_several) return Estimand::kFrontier;
  return all_one ? Estimand::kFixedSize : Estimand::kMixed;
}

std::map<std::string, std::string> ModelSizeOfRuns(const std::vector<Observation>& obs,
                                                   const RunVars& run_vars) {
  std::map<std::string, std::string> out;
  const std::vector<std::string> keys = VaryingSizeKeys(obs, run_vars);
  // From the sweep variables when every run has a value for each varying size key.
  for (const auto& o : obs) {
    if (keys.empty()) break;
    auto vars = run_vars.find(o.run);
    std::vector<std::string> parts;
    for (const std::string& k : keys) {
      if (vars == run_vars.end() || !vars->second.count(k)) break;
      parts.push_back(fmt::format("{}={}", Leaf(k), vars->second.at(k)));
    }
    if (parts.size() != keys.size()) {
      out.clear();
      break;
    }
    out[o.run] = fmt::format("{}", fmt::join(parts, ", "));
  }
  if (!out.empty()) return out;
  // By rank of the active parameters inside the family.
  std::map<std::string, std::set<double>> params;
  for (const auto& o : obs) params[o.family].insert(o.params);
  for (const auto& o : obs) {
    const auto& p = params.at(o.family);
    const auto rank = std::distance(p.begin(), p.find(o.params));
    out[o.run] = fmt::format("size {}", rank + 1);
  }
  return out;
}

FrontierReport AnalyzeFrontier(const std::vector<Observation>& obs, const RunVars& run_vars,
                               const std::string& reference, const std::vector<double>& targets,
                               const ModelFreeOptions& options) {
  std::vector<std::string> dropped;
  const std::vector<Observation> clean = internal::CleanObservations(obs, true, &dropped);
  FrontierReport r;
  r.estimand = EstimandOf(clean);
  // Pooling the sizes of a family per seed makes each seed's curve its lower envelope over them.
  r.frontier = ModelFreeMultipliers(clean, reference, targets, options);

  const std::map<std::string, std::string> size_of = ModelSizeOfRuns(clean, run_vars);
  std::map<std::string, double> smallest;  // size -> its smallest active parameters
  for (const auto& o : clean) {
    auto [it, fresh] = smallest.emplace(size_of.at(o.run), o.params);
    if (!fresh) it->second = std::min(it->second, o.params);
  }
  for (const auto& [size, p] : smallest) r.sizes.push_back(size);
  std::stable_sort(r.sizes.begin(), r.sizes.end(), [&](const std::string& a, const std::string& b) {
    return smallest.at(a) < smallest.at(b);
  });

  r.envelopes = Envelopes(clean, size_of, r.frontier.targets, options.final_only);
  const std::string largest = r.sizes.empty() ? "" : r.sizes.back();
  for (const auto& e : r.envelopes) {
    if (r.estimand == Estimand::kFrontier && e.sizes.size() < 2) {
      r.notes.push_back(fmt::format(
          "'{}' seed {}: its envelope is one size ({}): there the frontier is that size's "
          "training curve",
          e.family, e.seed, e.sizes.empty() ? "none" : e.sizes[0]));
    }
    for (size_t k = 0; k < e.size_at_target.size(); ++k) {
      const std::string& at = e.size_at_target[k];
      if (r.sizes.size() > 1 && (at == largest || at.ends_with(" -> " + largest))) {
        r.notes.push_back(fmt::format(
            "L* = {:.4g}, '{}' seed {}: reached at the largest size ({}): a larger model might "
            "lower the frontier there (the size grid may not bracket the optimum)",
            r.frontier.targets[k], e.family, e.seed, largest));
      }
    }
  }

  for (const std::string& size : r.sizes) {
    FixedSizeTable f;
    f.size = size;
    std::vector<Observation> at_size;
    for (const auto& o : clean)
      if (size_of.at(o.run) == size) at_size.push_back(o);
    try {
      f.table = ModelFreeMultipliers(at_size, reference, r.frontier.targets, options);
    } catch (const AnalysisError& e) {
      f.error = e.what();
    }
    r.fixed_size.push_back(std::move(f));
  }
  return r;
}

void to_json(nlohmann::json& j, const EnvelopeUse& v) {
  j = {{"family", v.family},
       {"seed", v.seed},
       {"sizes", v.sizes},
       {"points", v.points},
       {"size_at_target", v.size_at_target}};
}

void to_json(nlohmann::json& j, const FrontierReport& v) {
  nlohmann::json fixed = nlohmann::json::array();
  for (const auto& f : v.fixed_size) {
    nlohmann::json x = {{"size", f.size}, {"estimand", EstimandLabel(Estimand::kFixedSize)}};
    if (f.table) x["table"] = *f.table;
    if (!f.error.empty()) x["error"] = f.error;
    fixed.push_back(std::move(x));
  }
  j = {{"estimand", EstimandLabel(v.estimand)},
       {"sizes", v.sizes},
       {"frontier", v.frontier},
       {"envelopes", v.envelopes},
       {"fixed_size", fixed},
       {"notes", v.notes}};
}

}  // namespace moelab::analysis
