#include "promote/db.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>

#include "analysis/compute_optimal.h"
#include "analysis/family_design.h"
#include "analysis/observations.h"
#include "core/run_shape.h"
#include "db/promotions.h"
#include "db/reader.h"
#include "db/writer.h"
#include "promote/launch.h"

namespace moelab::promote {

namespace {

namespace fs = std::filesystem;
using analysis::FamilyFits;
using analysis::FamilyOf;
using analysis::FitFamilies;
using analysis::FitOptions;
using analysis::FitOptionsFromJson;
using analysis::Observation;
using analysis::ObservationsFromJson;
using nlohmann::json;

// The newest Chinchilla fit (compute-optimal law) for the key, else the newest power-law fit.
const db::FitRecord* ChooseFit(const std::vector<db::FitRecord>& fits, const std::string& key) {
  for (const auto& f : fits)
    if (f.form == "chinchilla" && (key.empty() || f.family_key == key)) return &f;
  for (const auto& f : fits)
    if (f.form == "power" && (key.empty() || f.family_key == key)) return &f;
  return nullptr;
}

// Takes `dir` for one promotion: creates it, or accepts it empty. False when it holds files
// already (another promotion's, or an older database's at the same path).
bool ClaimFolder(const fs::path& dir) {
  fs::create_directories(dir.parent_path());
  std::error_code ec;
  if (fs::create_directory(dir, ec)) return true;
  return fs::is_directory(dir, ec) && fs::is_empty(dir, ec);
}

// <db>.promotions/<id>; when an older database at the same path left that folder full,
// <id>-2, <id>-3, ...: a new promotion never writes into another's files.
fs::path ClaimDefaultFolder(const std::string& db_path, int64_t promotion_id) {
  const fs::path base = fs::absolute(db_path + ".promotions").lexically_normal();
  fs::path dir = base / std::to_string(promotion_id);
  for (int k = 2; !ClaimFolder(dir); ++k) dir = base / fmt::format("{}-{}", promotion_id, k);
  return dir;
}

// An explicit --out, taken for one promotion (CheckOutFolder's refusals).
fs::path ClaimExplicitFolder(const std::string& db_path, const std::string& out_dir) {
  CheckOutFolder(db_path, out_dir);
  const fs::path dir = fs::absolute(out_dir).lexically_normal();
  if (!ClaimFolder(dir)) CheckOutFolder(db_path, out_dir);  // filled since: says why
  return dir;
}

std::string StateOf(const db::RunRow& run) {
  if (run.status == RunStatus::kDone) return "done";
  if (run.status == RunStatus::kDiverged) return "diverged";
  if (run.status == RunStatus::kRunning && !run.stale) return "running";
  return "resumable";  // queued, stopped, failed, or running with a stale heartbeat
}

}  // namespace

void CheckOutFolder(const std::string& db_path, const std::string& out_dir) {
  const fs::path dir = fs::absolute(out_dir).lexically_normal();
  std::error_code ec;
  if (fs::exists(db_path, ec)) {
    for (const db::PromotionRecord& q : db::ListPromotions(db_path)) {
      if (!q.out_dir.empty() && fs::path(q.out_dir).lexically_normal() == dir)
        throw PromotionRefused(fmt::format(
            "--out {}: promotion {} wrote that folder; every promotion writes its own (choose "
            "another --out, or leave it out for <db>.promotions/<id>)",
            out_dir, q.id));
    }
  }
  if (fs::exists(dir, ec) && !(fs::is_directory(dir, ec) && fs::is_empty(dir, ec)))
    throw PromotionRefused(fmt::format(
        "--out {}: the folder holds files already; a promotion never rewrites another's files "
        "(choose another --out, or leave it out for <db>.promotions/<id>)",
        out_dir));
}

std::optional<PromotedRun> FindPromotedRun(const std::string& db_path, const RunConfig& config) {
  const std::string hash = ConfigHash(config);
  const std::vector<db::PromotionRecord> promotions = db::ListPromotions(db_path);
  if (promotions.empty()) return std::nullopt;
  db::Reader reader(db_path);
  for (const db::PromotionRecord& p : promotions) {  // newest first
    if (!p.run_id) continue;
    const std::optional<db::RunRow> run = reader.GetRun(*p.run_id);
    if (!run || run->config_hash != hash) continue;
    return PromotedRun{p, *run, StateOf(*run)};
  }
  return std::nullopt;
}

std::string DescribePromotedRun(const PromotedRun& e, const std::string& db_path) {
  const db::RunRow& r = e.run;
  const int64_t total = r.shape.total_steps;
  std::string detail;
  if (e.state == "done") {
    detail = fmt::format("done at step {} of {}", r.last_step, total);
    if (r.last_val_loss) detail += fmt::format(", final validation loss {:.4f}", *r.last_val_loss);
  } else if (e.state == "running") {
    detail = fmt::format("running (pid {} on {}), step {} of {}; log {}/train.log",
                         r.pid.value_or(0), r.host, r.last_step, total, e.promotion.out_dir);
  } else if (e.state == "diverged") {
    detail = fmt::format("diverged at step {}: continuing it would diverge again",
                         r.diverged_step.value_or(r.last_step));
  } else {
    detail = fmt::format("resumable ({}{}, step {} of {}; {})", ToString(r.status),
                         r.stale ? ", heartbeat stale" : "", r.last_step, total,
                         r.checkpoint_step
                             ? fmt::format("newest checkpoint at step {}", *r.checkpoint_step)
                             : std::string("no checkpoint yet: it starts at step 0"));
  }
  std::string text = fmt::format(
      "this plan's config ({}) already has a promoted run: run {} '{}' of promotion {}, {}\n"
      "  folder {}\n",
      r.config_hash.substr(0, 16), r.id, r.name, e.promotion.id, detail, e.promotion.out_dir);
  if (e.state == "resumable") {
    int ranks = 1;
    try {
      ranks = nlohmann::json::parse(e.promotion.plan_json).at("layout").value("ranks", 1);
    } catch (const std::exception&) {
    }
    text += fmt::format("  continue it: bash {}/{}   (or: moelab train --db {} --resume {})\n",
                        e.promotion.out_dir, ranks > 1 ? "launch_mpirun.sh" : "launch_local.sh",
                        db_path, r.id);
  }
  text +=
      "Nothing new was recorded or started. `--again` records a new run of the same plan with "
      "another seed.\n";
  return text;
}

std::string ReseedForAnotherRun(const std::string& db_path, PromotionPlan* plan) {
  const auto first = FindPromotedRun(db_path, plan->config);
  if (!first)
    return fmt::format("--again: no promoted run has this config yet; seed {} kept\n",
                       plan->config.train.seed);
  const uint64_t old_seed = plan->config.train.seed;
  RunConfig c = plan->config;
  for (c.train.seed = old_seed + 1; FindPromotedRun(db_path, c); ++c.train.seed) {
  }
  plan->config.train.seed = c.train.seed;
  return fmt::format(
      "--again: seed {} instead of {}: a new run of the same plan (run {} of promotion {} trains "
      "seed {}; the same seed would replay its trajectory)\n",
      c.train.seed, old_seed, first->run.id, first->promotion.id, old_seed);
}

PreparedPromotion PreparePromotion(const PromoteRequest& a) {
  if (a.family.empty() && a.run_id < 0)
    throw PromotionRefused("choose a family (KEY=VALUE) or a run id");
  if (!(a.target.budget_flops > 0) && !(a.target.target_loss > 0))
    throw PromotionRefused("choose a target: a FLOPs budget or a target loss");
  const PromoteLayout& layout = a.layout;
  if (layout.ranks < 1 || layout.ep < 1 || layout.ranks % layout.ep != 0)
    throw PromotionRefused("the expert-parallel size must divide the rank count");
  const auto sweep = db::FindSweep(a.db_path, a.sweep);
  if (!sweep) throw PromotionRefused(fmt::format("no sweep '{}' in {}", a.sweep, a.db_path));
  const std::vector<db::FitRecord> fits = db::ListFits(a.db_path, sweep->id);
  if (fits.empty())
    throw PromotionRefused(fmt::format(
        "sweep '{}' has no stored fits: run `moelab fit --db {} --sweep {} --by KEY` (power law) "
        "or with `--form chinchilla` first",
        a.sweep, a.db_path, a.sweep));
  PreparedPromotion out;
  out.sweep_id = sweep->id;
  std::string key, value;
  if (!a.family.empty()) {
    const auto eq = a.family.find('=');
    if (eq == std::string::npos || eq == 0)
      throw PromotionRefused("the family is KEY=VALUE, e.g. sparsity=8");
    key = a.family.substr(0, eq);
    value = a.family.substr(eq + 1);
  }
  const db::FitRecord* fit = ChooseFit(fits, key);
  if (!fit) {
    std::string have;
    for (const auto& f : fits) have += fmt::format(" {} (by {})", f.form, f.family_key);
    throw PromotionRefused(fmt::format("sweep '{}' has no power-law or Chinchilla fit{}; stored:{}",
                                       a.sweep, key.empty() ? "" : " by '" + key + "'", have));
  }
  out.fit = *fit;
  key = fit->family_key;
  const std::vector<Observation> obs = ObservationsFromJson(json::parse(fit->inputs_json));
  FitOptions fo = FitOptionsFromJson(json::parse(fit->options_json));
  fo.threads = layout.threads;

  db::Reader reader(a.db_path);
  std::string source_run;
  if (a.run_id >= 0) {
    if (!reader.GetRun(a.run_id))
      throw PromotionRefused(fmt::format("unknown run {} in {}", a.run_id, a.db_path));
    source_run = std::to_string(a.run_id);
    const auto f = FamilyOf(reader.RunVars(a.run_id), reader.RunConfigJson(a.run_id), key);
    if (!f)
      throw PromotionRefused(
          fmt::format("run {} has no value for the fit's family key '{}'", a.run_id, key));
    value = *f;
  }
  RequireUnmixedStoredFamily(a.db_path, obs, key, value, json::parse(fit->options_json));
  double src_flops = -1, src_params = 0, src_tokens = 0;
  std::set<std::string> families;
  for (const auto& o : obs) {
    families.insert(o.family);
    if (o.family != value) continue;
    if (a.run_id >= 0 && o.run != source_run) continue;
    if (o.flops > src_flops) {
      src_flops = o.flops, src_params = o.params, src_tokens = o.tokens;
      if (a.run_id < 0) source_run = o.run;
    }
  }
  if (!families.count(value)) {
    std::string list;
    for (const auto& f : families) list += (list.empty() ? "" : ", ") + f;
    throw PromotionRefused(
        fmt::format("unknown family {}={} in fit {} (families: {})", key, value, fit->id, list));
  }
  if (src_flops < 0)
    throw PromotionRefused(
        fmt::format("run {} is not among fit {}'s observations", source_run, fit->id));
  const RunConfig source =
      ConfigFromJson(json::parse(reader.RunConfigJson(std::stoll(source_run))));

  PromoteOptions po = a.options;
  po.level = fo.level;
  if (layout.device == "cuda" && po.gpu.empty()) po.gpu = "h100";
  PromotionPlan plan;
  if (fit->form == "chinchilla") {
    plan = PlanFromChinchilla(obs, fo, source, source_run, a.target, layout, po);
  } else {
    fo.skip_failed_families = true;
    const FamilyFits ff = FitFamilies(obs, fo);
    plan = PlanFromPowerLaw(ff.Get(value), source, source_run, src_params, src_tokens, a.target,
                            layout, po);
  }
  plan.family_key = key;
  plan.family = value;
  if (a.measure && po.gpu.empty()) {
    // The promoted config itself when a step is cheap enough to time, else the source's rate.
    const bool own = plan.flops_per_token * plan.batch * plan.config.model.seq_len < 5e11;
    std::string how;
    const double rate = a.measure(own ? plan.config : source, &how);
    double load[1] = {0};
    if (getloadavg(load, 1) < 1) load[0] = NAN;
    if (rate > 0) {
      plan.time_s = plan.flops / (rate * layout.ranks);
      plan.time_basis = fmt::format(
          "{:.3g} FLOP/s per rank on the {} config ({}); load average {:.1f} on {} cores{}. The "
          "time is the FLOPs over a rate timed for a few seconds now: on a shared machine two "
          "measurements differ as much as its load does (compare their load averages)",
          rate, own ? "promoted" : "source", how, load[0], std::thread::hardware_concurrency(),
          layout.ranks > 1 ? fmt::format(", × {} ranks (ideal scaling)", layout.ranks) : "");
    }
  }
  out.plan = std::move(plan);
  out.key = key;
  out.value = value;
  out.source_run = source_run;
  return out;
}

RecordedPromotion RecordPromotion(const PromoteRequest& a, const PreparedPromotion& p,
                                  const std::string& bin) {
  const PromotionPlan& plan = p.plan;
  // One plan, one run: a second identical promotion would train the same trajectory again.
  if (const auto existing = FindPromotedRun(a.db_path, plan.config))
    throw PromotionRefused(DescribePromotedRun(*existing, a.db_path));
  const json plan_json = plan;
  const std::string hash = ConfigHash(plan.config);
  RecordedPromotion r;
  // An explicit folder is taken before anything is recorded; the default one is named by the
  // promotion's id, so it is taken once the row exists.
  std::optional<fs::path> out_opt;
  if (!a.out_dir.empty()) out_opt = ClaimExplicitFolder(a.db_path, a.out_dir);

  // The run row exists before any launcher starts: every launcher records into it (--run-id),
  // so the promotion is linked to its run whichever way it is started.
  db::RunInfo info;
  info.config_json = ConfigToJson(plan.config).dump();
  info.config_hash = hash;
  info.shape = RunShapeOf(plan.config);
  db::PromotionRecord rec;
  rec.sweep_id = p.sweep_id;
  rec.fit_id = p.fit.id;
  rec.law = plan.law;
  rec.family_key = p.key;
  rec.family = p.value;
  rec.source_run_id = std::stoll(p.source_run);
  rec.target_json = (a.target.budget_flops > 0 ? json{{"budget_flops", a.target.budget_flops}}
                                               : json{{"target_loss", a.target.target_loss}})
                        .dump();
  rec.plan_json = plan_json.dump();
  rec.config_json = info.config_json;
  rec.out_dir = out_opt ? out_opt->string() : "";
  rec.predicted_loss = plan.loss.estimate;
  rec.band_lo = plan.band.lo;
  rec.band_hi = plan.band.hi;
  r.promotion_id = db::SavePromotion(a.db_path, rec);
  if (!out_opt) {
    out_opt = ClaimDefaultFolder(a.db_path, r.promotion_id);
    db::SetPromotionOutDir(a.db_path, r.promotion_id, out_opt->string());
  }
  const fs::path& out = *out_opt;
  r.out_dir = out.string();
  info.name = fmt::format("promoted-{}-{}{}", r.promotion_id, p.key, p.value);
  r.run_name = info.name;
  r.run_id = db::RunWriter::CreateRun(a.db_path, info, RunStatus::kQueued);
  db::LinkPromotionRun(a.db_path, r.promotion_id, r.run_id);
  db::RunWriter::SetRunVar(a.db_path, r.run_id, "promotion", std::to_string(r.promotion_id));
  db::RunWriter::SetRunVar(a.db_path, r.run_id, p.key, p.value);

  LaunchFiles files;
  files.promotion_id = r.promotion_id;
  files.run_id = r.run_id;
  files.db_path = a.db_path;
  files.layout = a.layout;
  files.slurm = a.slurm;
  files.moelab_bin = bin;
  r.files = WritePromotionFiles(r.out_dir, plan, files);
  return r;
}

}  // namespace moelab::promote
