#include "sweeps/spec.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "core/data/data.h"
#include "core/device.h"
#include "core/did_you_mean.h"
#include "core/flops.h"
#include "sweeps/derived.h"
#include "sweeps/launch.h"
#include "sweeps/spec_keys.h"

namespace moelab::sweeps {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::vector<ojson> AxisValues(const ojson& values, const std::string& where) {
  if (!values.is_array()) {
    throw SpecError(
        fmt::format("{}: expected a list of values, got {}", where, values.type_name()));
  }
  if (values.empty()) throw SpecError(fmt::format("{}: empty axis (no values)", where));
  return std::vector<ojson>(values.begin(), values.end());
}

std::vector<Point> Product(const std::vector<Point>& outer, const std::vector<Point>& inner) {
  std::vector<Point> out;
  out.reserve(outer.size() * inner.size());
  for (const Point& a : outer) {
    for (const Point& b : inner) {
      Point p = a;
      p.insert(p.end(), b.begin(), b.end());
      out.push_back(std::move(p));
    }
  }
  return out;
}

std::vector<Point> RandomPoints(const ojson& r) {
  if (!r.is_object()) throw SpecError("random: expected an object {count, seed, params}");
  for (auto it = r.begin(); it != r.end(); ++it) {
    if (it.key() != "count" && it.key() != "seed" && it.key() != "params") {
      throw SpecError(
          fmt::format("random.{}: unknown key (expected count, seed, params)", it.key()));
    }
  }
  if (!r.contains("count") || !r["count"].is_number_integer() || r["count"].get<int64_t>() < 1) {
    throw SpecError("random.count: expected a positive integer");
  }
  if (!r.contains("params") || !r["params"].is_object() || r["params"].empty()) {
    throw SpecError("random.params: expected a non-empty object of key -> distribution");
  }
  const int64_t count = r["count"].get<int64_t>();
  const uint64_t seed = r.value("seed", static_cast<uint64_t>(0));
  struct Dist {
    std::string key, kind;
    ojson arg;
  };
  std::vector<Dist> dists;
  for (auto it = r["params"].begin(); it != r["params"].end(); ++it) {
    const std::string where = fmt::format("random.params.{}", it.key());
    CheckKey(it.key(), where);
    const ojson& d = it.value();
    if (!d.is_object() || d.size() != 1) {
      throw SpecError(fmt::format(
          "{}: expected one of {{\"uniform\": [lo, hi]}}, {{\"log_uniform\": [lo, hi]}}, "
          "{{\"int_uniform\": [lo, hi]}}, {{\"choice\": [values...]}}",
          where));
    }
    const std::string kind = d.begin().key();
    const ojson& arg = d.begin().value();
    if (kind == "choice") {
      AxisValues(arg, where + ".choice");
    } else if (kind == "uniform" || kind == "log_uniform" || kind == "int_uniform") {
      if (!arg.is_array() || arg.size() != 2 || !arg[0].is_number() || !arg[1].is_number() ||
          arg[0].get<double>() > arg[1].get<double>()) {
        throw SpecError(fmt::format("{}.{}: expected [lo, hi] with lo <= hi", where, kind));
      }
      if (kind == "log_uniform" && arg[0].get<double>() <= 0) {
        throw SpecError(fmt::format("{}.log_uniform: bounds must be positive", where));
      }
      const double lo = arg[0].get<double>(), hi = arg[1].get<double>();
      if (kind == "uniform" && !std::isfinite(hi - lo)) {
        throw SpecError(fmt::format("{}.uniform: [{}, {}] is too wide to sample", where, lo, hi));
      }
      // Caught by UBSan in the fuzz target: bounds beyond int64 overflowed the conversion and
      // b - a + 1; and bounds with no integer between them ([0.2, 0.8]) drew one outside them.
      if (kind == "int_uniform" &&
          (std::fabs(lo) > kMaxExactInteger || std::fabs(hi) > kMaxExactInteger)) {
        throw SpecError(fmt::format("{}.int_uniform: bounds must lie within ±2^53 ({})", where,
                                    kMaxExactInteger));
      }
      if (kind == "int_uniform" && std::ceil(lo) > std::floor(hi)) {
        throw SpecError(fmt::format("{}.int_uniform: no integer lies in [{}, {}]", where, lo, hi));
      }
    } else {
      throw SpecError(
          fmt::format("{}: unknown distribution '{}' (uniform, log_uniform, int_uniform, choice)",
                      where, kind));
    }
    dists.push_back({it.key(), kind, arg});
  }
  // One generator drawn in a fixed order: the same seed gives the same points on every run of
  // the spec, which is what makes a random sweep resumable and deduplicable.
  std::mt19937_64 rng(seed);
  std::vector<Point> points;
  for (int64_t i = 0; i < count; ++i) {
    Point p;
    for (const Dist& d : dists) {
      const double u = std::generate_canonical<double, 53>(rng);
      if (d.kind == "choice") {
        const size_t k = std::min(d.arg.size() - 1, static_cast<size_t>(u * d.arg.size()));
        p.emplace_back(d.key, d.arg[k]);
      } else {
        const double lo = d.arg[0].get<double>(), hi = d.arg[1].get<double>();
        if (d.kind == "uniform") {
          p.emplace_back(d.key, lo + u * (hi - lo));
        } else if (d.kind == "log_uniform") {
          p.emplace_back(d.key, std::exp(std::log(lo) + u * (std::log(hi) - std::log(lo))));
        } else {
          const int64_t a = static_cast<int64_t>(std::ceil(lo));
          const int64_t b = static_cast<int64_t>(std::floor(hi));
          p.emplace_back(d.key,
                         a + std::min<int64_t>(b - a, static_cast<int64_t>(u * (b - a + 1))));
        }
      }
    }
    points.push_back(std::move(p));
  }
  return points;
}

void SetPath(json& config, const std::string& path, const json& value) {
  ApplyOverride(config, path + "=" + value.dump());
}

std::string FormatVars(const ojson& vars, const std::vector<std::string>& keys) {
  std::string s;
  for (const std::string& k : keys) {
    if (!s.empty()) s += ", ";
    s += k + "=" + ShortValue(vars[k]);
  }
  return s;
}

}  // namespace

std::string ShortValue(const ojson& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float()) return fmt::format("{:.4g}", v.get<double>());
  return v.dump();
}

std::vector<const SweepRun*> Sweep::Unique() const {
  std::vector<const SweepRun*> out;
  for (const SweepRun& r : runs)
    if (r.duplicate_of < 0) out.push_back(&r);
  return out;
}

int64_t WsdDecayStart(const RunConfig& c) {
  const int64_t total = c.total_steps();
  const int64_t decay =
      std::max<int64_t>(1, static_cast<int64_t>(std::llround(c.schedule.decay_fraction * total)));
  return std::max<int64_t>(c.schedule.warmup_steps, total - decay);
}

std::vector<BranchPlan> PlanWsdBranches(const Sweep& sweep) {
  std::vector<BranchPlan> plan(sweep.runs.size());
  if (!sweep.branching) return plan;
  std::map<std::string, std::vector<const SweepRun*>> families;
  for (const SweepRun* r : sweep.Unique())
    if (r->config.schedule.type == "wsd") families[r->branch_hash].push_back(r);
  for (auto& [hash, members] : families) {
    if (members.size() < 2) continue;
    std::stable_sort(members.begin(), members.end(), [](const SweepRun* a, const SweepRun* b) {
      return a->config.total_steps() > b->config.total_steps();
    });
    const SweepRun* parent = members[0];
    const int64_t parent_decay = WsdDecayStart(parent->config);
    for (size_t k = 1; k < members.size(); ++k) {
      const RunConfig& c = members[k]->config;
      const int64_t at = WsdDecayStart(c);
      // The parent must still be in its stable phase at the branch step (its own decay starts
      // no earlier), and the branch must leave the child some steps of its own.
      if (at < 1 || at >= c.total_steps() || at > parent_decay || at < c.schedule.warmup_steps) {
        continue;
      }
      plan[members[k]->index] = {parent->index, at};
    }
  }
  return plan;
}

ojson LoadSpecFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw SpecError(fmt::format("{}: cannot open the sweep spec", path));
  std::stringstream text;
  text << in.rdbuf();
  return ParseSpecText(text.str(), path);
}

ojson ParseSpecText(const std::string& text, const std::string& path) {
  ojson spec;
  try {
    spec = ojson::parse(text, nullptr, true, /*ignore_comments=*/true);
  } catch (const ojson::parse_error& e) {
    // "line L, column C" of the byte the parser stopped at, so an editor can point at it.
    const size_t end = std::min<size_t>(e.byte > 0 ? e.byte - 1 : 0, text.size());
    const size_t line = 1 + std::count(text.begin(), text.begin() + end, '\n');
    const size_t nl = text.rfind('\n', end > 0 ? end - 1 : 0);
    const size_t column = end > 0 && nl != std::string::npos ? end - nl : end + 1;
    throw SpecError(
        fmt::format("{}: not valid JSON (line {}, column {}): {}", path, line, column, e.what()));
  } catch (const ojson::out_of_range& e) {  // a number like 1e999 (found by fuzzing)
    throw SpecError(fmt::format("{}: not valid JSON: {}", path, e.what()));
  }
  if (!spec.is_object()) throw SpecError(fmt::format("{}: a sweep spec is a JSON object", path));
  if (!spec.contains("name")) spec["name"] = fs::path(path).stem().string();
  if (spec.contains("base") && spec["base"].is_string()) {
    const fs::path base = fs::path(path).parent_path() / spec["base"].get<std::string>();
    std::ifstream bin(base);
    if (!bin) {
      throw SpecError(
          fmt::format("base: cannot open '{}' (relative to the spec file)", base.string()));
    }
    try {
      spec["base"] = ojson::parse(bin, nullptr, true, true);
    } catch (const ojson::exception& e) {  // parse_error, or out_of_range for 1e999
      throw SpecError(fmt::format("base: '{}' is not valid JSON: {}", base.string(), e.what()));
    }
  }
  return spec;
}

int64_t CountSpecRuns(const ojson& spec, std::string* breakdown) {
  int64_t total = 1;
  std::vector<std::string> parts;
  auto times = [&](int64_t n, const std::string& what) {
    parts.push_back(fmt::format("{} {}", what, n));
    if (n > 0 && total > std::numeric_limits<int64_t>::max() / n) {
      total = std::numeric_limits<int64_t>::max();
    } else {
      total *= n;
    }
  };
  auto length = [](const ojson& v) -> int64_t { return v.is_array() ? v.size() : 1; };
  if (spec.contains("runs")) times(length(spec["runs"]), "runs");
  if (spec.contains("zip")) {
    ojson groups = spec["zip"];
    if (groups.is_object()) groups = ojson::array({groups});
    if (groups.is_array()) {
      for (size_t g = 0; g < groups.size(); ++g) {
        if (groups[g].is_object() && !groups[g].empty())
          times(length(groups[g].begin().value()), fmt::format("zip[{}]", g));
      }
    }
  }
  if (spec.contains("grid") && spec["grid"].is_object()) {
    for (auto it = spec["grid"].begin(); it != spec["grid"].end(); ++it)
      times(length(it.value()), "grid." + it.key());
  }
  if (spec.contains("random") && spec["random"].is_object() && spec["random"].contains("count") &&
      spec["random"]["count"].is_number_integer()) {
    times(std::max<int64_t>(1, spec["random"]["count"].get<int64_t>()), "random.count");
  }
  if (spec.contains("seeds")) times(length(spec["seeds"]), "seeds");
  if (breakdown)
    *breakdown = parts.empty() ? "no axes" : fmt::format("{}", fmt::join(parts, " × "));
  return total;
}

namespace {

// The size guard: throws before anything is expanded when the spec's axes multiply to more
// runs than the limit (the options', raised by the spec's own "max_runs").
void CheckSpecSize(const ojson& spec, const ExpandOptions& options) {
  // The size guard runs first: nothing below may allocate per run before it.
  int64_t limit = options.max_runs > 0 ? options.max_runs : kDefaultMaxRuns;
  if (spec.contains("max_runs")) {
    if (!spec["max_runs"].is_number_integer() || spec["max_runs"].get<int64_t>() < 1) {
      throw SpecError("max_runs: expected a positive integer");
    }
    limit = std::max(limit, spec["max_runs"].get<int64_t>());
  }
  std::string breakdown;
  const int64_t n = CountSpecRuns(spec, &breakdown);
  if (n > limit) {
    throw SpecError(fmt::format(
        "the sweep expands to {} runs ({}), above the limit of {}; nothing was expanded. "
        "Check the axes for a typo, or raise the limit with \"max_runs\": {} in the spec or "
        "--max-runs {}",
        n == std::numeric_limits<int64_t>::max() ? std::string("more than 9.2e18")
                                                 : fmt::format("{}", n),
        breakdown, limit, n, n));
  }
}

// Every top-level key must be known: a typo would otherwise be silently ignored.
void CheckTopLevelKeys(const ojson& spec) {
  for (auto it = spec.begin(); it != spec.end(); ++it) {
    if (it.key() == "max_runs") continue;  // the size guard's key, checked above
    const auto& keys = TopLevelKeys();
    if (std::find(keys.begin(), keys.end(), it.key()) == keys.end()) {
      throw SpecError(fmt::format("{}: unknown key in the sweep spec (known: {})", it.key(),
                                  fmt::join(keys, ", ")));
    }
  }
}

// The base config with "set" applied and the layout shorthands: what every run starts from.
json BaseConfigOf(const ojson& spec) {
  // The base config; validated for unknown keys and types up front (combinations may be fixed
  // by the axes, so those are checked per run).
  json base = json::object();
  if (spec.contains("base")) {
    if (!spec["base"].is_object()) {
      throw SpecError("base: expected a config object or a path to a config file");
    }
    base = ToJson(spec["base"]);
    // Unknown keys and wrong types in the base are one mistake, not one per run; combination
    // checks wait for the axes, which may be what makes the base valid.
    try {
      ConfigFromJson(base);
    } catch (const ConfigError& e) {
      if (e.reason().rfind("unknown key", 0) == 0 || e.reason().rfind("expected ", 0) == 0) {
        throw SpecError(fmt::format("base: {}", e.what()));
      }
    }
  }

  // "set": a few changes to the base by config path, so a spec can reuse a base file.
  if (spec.contains("set")) {
    if (!spec["set"].is_object()) throw SpecError("set: expected an object path -> value");
    for (auto it = spec["set"].begin(); it != spec["set"].end(); ++it) {
      if (!IsConfigPath(it.key())) {
        throw SpecError(fmt::format("set.{}: expected a config path (section.field)", it.key()));
      }
      CheckKey(it.key(), "set");
      SetPath(base, it.key(), ToJson(it.value()));
    }
  }

  // Layout shorthands for the sweep: "expert_parallel": E, "zero1": true set dist.* of every run.
  for (const char* key : {"expert_parallel", "zero1"}) {
    if (!spec.contains(key)) continue;
    try {
      SetPath(base, std::string("dist.") + key, ToJson(spec[key]));
    } catch (const ConfigError& e) {
      throw SpecError(fmt::format("{}: {}", key, e.what()));
    }
  }
  return base;
}

// The spec's "vars": each variable's default value.
std::map<std::string, ojson> DefaultVarsOf(const ojson& spec) {
  std::map<std::string, ojson> default_vars;
  if (spec.contains("vars")) {
    if (!spec["vars"].is_object()) throw SpecError("vars: expected an object name -> value");
    for (auto it = spec["vars"].begin(); it != spec["vars"].end(); ++it) {
      const std::string where = fmt::format("vars.{}", it.key());
      if (IsConfigPath(it.key())) {
        throw SpecError(
            fmt::format("{}: variables are plain names; set config fields in base", where));
      }
      CheckKey(it.key(), where);
      default_vars[it.key()] = it.value();
    }
  }
  return default_vars;
}

// The spec's axes multiplied out, and the keys they assign.
struct SpecPoints {
  std::vector<Point> points;
  std::set<std::string> assigned;
  size_t runs_listed = 0;  // runs[] is the outermost axis: point i comes from runs[i / stride]
};

SpecPoints ExpandAxes(const ojson& spec) {
  SpecPoints out;
  std::vector<Point>& points = out.points;
  std::set<std::string>& assigned = out.assigned;
  size_t& runs_listed = out.runs_listed;
  // Expansion order, outermost first: runs × zip groups × grid axes × random × seeds. The last
  // axis varies fastest.
  points = {Point{}};
  if (spec.contains("runs")) {
    runs_listed = spec["runs"].is_array() ? spec["runs"].size() : 0;
    const ojson& runs = spec["runs"];
    if (!runs.is_array()) throw SpecError("runs: expected a list of override objects");
    if (runs.empty()) throw SpecError("runs: empty list (no runs)");
    std::vector<Point> list;
    for (size_t i = 0; i < runs.size(); ++i) {
      if (!runs[i].is_object()) {
        throw SpecError(fmt::format("runs[{}]: expected an object of key -> value", i));
      }
      Point p;
      for (auto it = runs[i].begin(); it != runs[i].end(); ++it) {
        CheckKey(it.key(), fmt::format("runs[{}]", i));
        p.emplace_back(it.key(), it.value());
        assigned.insert(it.key());
      }
      list.push_back(std::move(p));
    }
    points = Product(points, list);
  }
  if (spec.contains("zip")) {
    ojson groups = spec["zip"];
    if (groups.is_object()) groups = ojson::array({groups});
    if (!groups.is_array()) throw SpecError("zip: expected a list of groups {key: [values]}");
    for (size_t g = 0; g < groups.size(); ++g) {
      const std::string where = fmt::format("zip[{}]", g);
      if (!groups[g].is_object() || groups[g].empty()) {
        throw SpecError(fmt::format("{}: expected a non-empty object key -> [values]", where));
      }
      size_t n = 0;
      std::string first;
      std::vector<std::pair<std::string, std::vector<ojson>>> axes;
      for (auto it = groups[g].begin(); it != groups[g].end(); ++it) {
        CheckKey(it.key(), where);
        auto values = AxisValues(it.value(), fmt::format("{}.{}", where, it.key()));
        if (first.empty()) {
          first = it.key();
          n = values.size();
        } else if (values.size() != n) {
          throw SpecError(fmt::format(
              "{}: axes that vary together need the same length: '{}' has {} values, '{}' has "
              "{}",
              where, first, n, it.key(), values.size()));
        }
        assigned.insert(it.key());
        axes.emplace_back(it.key(), std::move(values));
      }
      std::vector<Point> tuples(n);
      for (size_t i = 0; i < n; ++i)
        for (const auto& [k, v] : axes) tuples[i].emplace_back(k, v[i]);
      points = Product(points, tuples);
    }
  }
  if (spec.contains("grid")) {
    if (!spec["grid"].is_object()) throw SpecError("grid: expected an object key -> [values]");
    for (auto it = spec["grid"].begin(); it != spec["grid"].end(); ++it) {
      const std::string where = fmt::format("grid.{}", it.key());
      CheckKey(it.key(), "grid");
      std::vector<Point> axis;
      for (const ojson& v : AxisValues(it.value(), where)) axis.push_back({{it.key(), v}});
      assigned.insert(it.key());
      points = Product(points, axis);
    }
  }
  if (spec.contains("random")) {
    std::vector<Point> samples = RandomPoints(spec["random"]);
    for (const auto& [k, v] : samples.front()) assigned.insert(k);
    points = Product(points, samples);
  }
  if (spec.contains("seeds")) {
    std::vector<Point> axis;
    for (const ojson& v : AxisValues(spec["seeds"], "seeds")) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0) {
        throw SpecError(fmt::format("seeds: {} is not a non-negative integer", v.dump()));
      }
      axis.push_back({{"train.seed", v}});
    }
    assigned.insert("train.seed");
    points = Product(points, axis);
  }
  return out;
}

// A variable nothing reads is almost always a typo of a config path: its runs would all share
// one config. Each such variable adds a warning.
void WarnUnusedVars(const std::set<std::string>& assigned,
                    const std::map<std::string, ojson>& default_vars,
                    const std::vector<Derived>& derived, std::vector<std::string>* warnings) {
  std::set<std::string> used_in_exprs;
  for (const Derived& d : derived) {
    for (const std::string& v : assigned)
      if (d.expr.find(v) != std::string::npos) used_in_exprs.insert(v);
    for (const auto& [v, value] : default_vars)
      if (d.expr.find(v) != std::string::npos) used_in_exprs.insert(v);
  }
  for (const std::string& v : assigned) {
    if (!IsConfigPath(v) && !used_in_exprs.count(v) && !IsLaunchKey(v)) {
      const std::string near = NearestConfigPath(v);
      warnings->push_back(fmt::format(
          "sweep variable '{}' is not used by any derived field: it is recorded but changes "
          "nothing ({})",
          v,
          near.empty() ? "to set a config field, name it by its path, section.field"
                       : fmt::format("did you mean the config path '{}'?", near)));
    }
  }
}

// The data.path and train.device checks, once per value: every run that uses it gets the error.
struct RunChecks {
  std::map<std::string, std::string> data_error, device_error;
};

// Completes one run from its point: launch keys, derived fields, the config and its checks.
// Throws ConfigError or SpecError for an invalid run.
void BuildRun(const ojson& spec, const ExpandOptions& options, const Point& point,
              const std::vector<Derived>& derived, json* config_ptr,
              std::map<std::string, ojson>* vars_ptr, RunChecks* checks, SweepRun* run_ptr) {
  SweepRun& run = *run_ptr;
  json& config = *config_ptr;
  std::map<std::string, ojson>& vars = *vars_ptr;
  std::map<std::string, std::string>& data_error = checks->data_error;
  std::map<std::string, std::string>& device_error = checks->device_error;
  // Launch keys: "ranks" per run; "expert_parallel" / "zero1" stand for dist.*.
  for (const auto& [k, v] : point) {
    if (k == "ranks") {
      if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > kMaxRanks) {
        throw SpecError(fmt::format("{}: expected an integer from 1 to {}, got {}",
                                    KeyOrigin(spec, k, run.runs_index), kMaxRanks, v.dump()));
      }
      run.ranks = v.get<int>();
    } else if (k == "expert_parallel" || k == "zero1") {
      try {
        SetPath(config, "dist." + k, ToJson(v));
      } catch (const ConfigError& e) {
        throw SpecError(fmt::format("{}: {}", KeyOrigin(spec, k, run.runs_index), e.what()));
      }
    }
  }
  for (const Derived& d : derived) {
    const json value = TypedResult(d, Evaluate(d, config, vars));
    if (IsConfigPath(d.target)) {
      SetPath(config, d.target, value);
    } else {
      vars[d.target] = ojson::parse(value.dump());
    }
    run.vars[d.target] = ojson::parse(value.dump());
  }
  run.config = ConfigFromJson(config);
  LayoutOrigin origin;
  origin.ranks = KeyOrigin(spec, "ranks", run.runs_index);
  origin.expert_parallel = KeyOrigin(spec, "dist.expert_parallel", run.runs_index);
  if (const std::string e = LayoutError(run.config, run.ranks, origin); !e.empty()) {
    throw SpecError(e);
  }
  if (options.check_data && run.config.data.source == "corpus") {
    const std::string key =
        fmt::format("{}\n{}", run.config.data.path, run.config.model.vocab_size);
    if (!data_error.count(key)) {
      try {
        CheckVocabFits(ReadDataMeta(run.config.data.path), run.config.model.vocab_size);
        data_error[key] = "";
      } catch (const std::exception& e) {
        data_error[key] = e.what();
      }
    }
    if (!data_error[key].empty()) throw ConfigError("data.path", data_error[key]);
  }
  if (options.check_device && run.config.train.device != "cpu") {
    const std::string& key = run.config.train.device;
    if (!device_error.count(key)) {
      try {
        RequireDevice(run.config.train);
        device_error[key] = "";
      } catch (const DeviceError& e) {
        device_error[key] = e.what();
      }
    }
    if (!device_error[key].empty()) throw ConfigError("train.device", device_error[key]);
  }
}

// Throws the error of a sweep with invalid runs: how many, and the first ones listed.
void ThrowInvalidRuns(const Sweep& sweep, int error_count, size_t points,
                      const std::vector<std::string>& errors) {
  const std::string how_many =
      error_count == static_cast<int>(points)
          ? (points == 1 ? std::string("its only run is") : fmt::format("all {} runs are", points))
          : fmt::format("{} of {} runs are", error_count, points);
  std::string msg =
      fmt::format("sweep '{}': {} invalid; nothing was started:", sweep.name, how_many);
  for (const std::string& e : errors) msg += "\n  " + e;
  if (error_count > static_cast<int>(errors.size())) {
    msg += fmt::format("\n  ... and {} more", error_count - errors.size());
  }
  throw SpecError(msg);
}

}  // namespace

Sweep ExpandSpec(const ojson& spec, const ExpandOptions& options) {
  if (!spec.is_object()) throw SpecError("a sweep spec is a JSON object");
  CheckSpecSize(spec, options);
  CheckTopLevelKeys(spec);
  Sweep sweep;
  sweep.spec = spec;
  if (!spec.contains("name") || !spec["name"].is_string() ||
      spec["name"].get<std::string>().empty()) {
    throw SpecError("name: a sweep needs a name (a non-empty string)");
  }
  sweep.name = spec["name"].get<std::string>();
  if (spec.contains("ranks")) {
    if (!spec["ranks"].is_number_integer() || spec["ranks"].get<int64_t>() < 1 ||
        spec["ranks"].get<int64_t>() > kMaxRanks) {
      throw SpecError(fmt::format("ranks: expected an integer from 1 to {}, got {}", kMaxRanks,
                                  spec["ranks"].dump()));
    }
    sweep.ranks = spec["ranks"].get<int>();
  }
  if (spec.contains("branching")) {
    if (!spec["branching"].is_boolean()) throw SpecError("branching: expected true or false");
    sweep.branching = spec["branching"].get<bool>();
  }

  const json base = BaseConfigOf(spec);
  const std::map<std::string, ojson> default_vars = DefaultVarsOf(spec);
  const SpecPoints expanded = ExpandAxes(spec);
  const std::vector<Point>& points = expanded.points;
  const size_t runs_listed = expanded.runs_listed;
  const std::vector<Derived> derived = ParseDerived(spec);
  WarnUnusedVars(expanded.assigned, default_vars, derived, &sweep.warnings);

  std::vector<std::string> errors;
  int error_count = 0;
  std::map<std::string, int> first_of_hash;
  RunChecks checks;  // data.path and train.device, once per value
  for (size_t i = 0; i < points.size(); ++i) {
    SweepRun run;
    run.index = static_cast<int>(i);
    run.ranks = sweep.ranks;
    if (runs_listed > 0) run.runs_index = static_cast<int>(i / (points.size() / runs_listed));
    json config = base;
    std::map<std::string, ojson> vars = default_vars;
    for (const auto& [k, v] : default_vars) run.vars[k] = v;
    for (const auto& [k, v] : points[i]) {
      run.vars[k] = v;
      if (std::find(run.assigned_keys.begin(), run.assigned_keys.end(), k) ==
          run.assigned_keys.end()) {
        run.assigned_keys.push_back(k);
      }
      if (IsConfigPath(k)) {
        SetPath(config, k, ToJson(v));
      } else {
        vars[k] = v;
      }
    }
    try {
      BuildRun(spec, options, points[i], derived, &config, &vars, &checks, &run);
    } catch (const ConfigError& e) {
      ++error_count;
      // Layout errors name where the spec set the field (runs[3].expert_parallel, base.dist...).
      const std::string what =
          e.path().rfind("dist.", 0) == 0
              ? fmt::format("{}: {}", KeyOrigin(spec, e.path(), run.runs_index), e.reason())
              : std::string(e.what());
      if (static_cast<int>(errors.size()) < options.max_errors_listed) {
        errors.push_back(
            fmt::format("run #{} ({}): {}", i, FormatVars(run.vars, run.assigned_keys), what));
      }
      continue;
    } catch (const SpecError& e) {
      ++error_count;
      if (static_cast<int>(errors.size()) < options.max_errors_listed) {
        errors.push_back(
            fmt::format("run #{} ({}): {}", i, FormatVars(run.vars, run.assigned_keys), e.what()));
      }
      continue;
    }
    run.hash = ConfigHash(run.config);
    run.branch_hash = BranchHash(run.config);
    std::string label;
    for (const std::string& k : run.assigned_keys) {
      if (!label.empty()) label += ",";
      const size_t dot = k.rfind('.');
      label += (dot == std::string::npos ? k : k.substr(dot + 1)) + "=" + ShortValue(run.vars[k]);
    }
    run.name = sweep.name + "/" + (label.empty() ? std::to_string(i) : label);
    auto [it, inserted] = first_of_hash.emplace(run.hash, run.index);
    if (!inserted) run.duplicate_of = it->second;
    sweep.runs.push_back(std::move(run));
  }
  if (error_count > 0) ThrowInvalidRuns(sweep, error_count, points.size(), errors);
  int duplicates = 0;
  for (const SweepRun& r : sweep.runs) duplicates += r.duplicate_of >= 0;
  if (duplicates > 0) {
    sweep.warnings.push_back(fmt::format(
        "{} run(s) have the same config as an earlier run of the sweep and are trained once",
        duplicates));
  }
  if (spec.contains("adaptive")) sweep.adaptive = ParseAdaptiveSpec(spec["adaptive"], sweep);
  return sweep;
}

}  // namespace moelab::sweeps
