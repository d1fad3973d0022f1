// `moelab promote` end to end: a sweep database with a known law and real (tiny) configs, a
// stored fit, the refusals, and a promoted run launched on CPU that finishes linked to its
// promotion.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#ifdef MOELAB_PROMOTE_HAVE_GUI
#include <stb_image.h>
#endif

#include "analysis/promote.h"
#include "core/flops.h"
#include "core/run_shape.h"
#include "db/promotions.h"
#include "db/reader.h"
#include "db/schema.h"
#include "db/writer.h"
#include "tests/common/test_util.h"

namespace moelab {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string Bin() { return test::BinPath("moelab"); }

RunConfig Tiny(int d) {
  RunConfig c;
  c.model.vocab_size = 64;
  c.model.d_model = d;
  c.model.layers = 1;
  c.model.heads = 2;
  c.model.ffn_hidden = 2 * d;
  c.model.seq_len = 16;
  c.moe.experts_total = 4;
  c.moe.experts_active = 2;
  c.moe.expert_hidden = d;
  c.data.source = "markov";
  c.train.batch_size = 4;
  c.train.steps = 40;
  c.train.threads = 1;
  c.eval.every = 10;
  c.eval.batches = 1;
  c.checkpoint.every = 0;
  c.optimizer.name = "adamw";
  c.optimizer.lr = 1e-2;
  return c;
}

TEST(PromoteCli, RefusesThenPlansWritesLaunchesAndLinks) {
  const test::TempDir tmp("promote");  // kept when the test fails (or MOELAB_KEEP_TEST_DIR is set)
  const fs::path& dir = tmp.path();
  // The output (stdout and stderr) of a shell command line, and its exit code.
  const auto Capture = [&dir](const std::string& cmd, int* code) {
    const std::string log = (dir / "capture.log").string();
    *code = test::Run({"/bin/sh", "-c", cmd}, log);
    return test::Slurp(log);
  };
  const std::string path = (dir / "p.db").string();
  int64_t sweep_id = 0;
  {
    db::Connection c = db::OpenForWrite(path);
    c.Exec("INSERT INTO sweeps (name, created_at) VALUES ('law', 0), ('empty', 0)");
    sweep_id = c.QueryInt("SELECT id FROM sweeps WHERE name = 'law'");
  }
  // Known law L = 3.2 + 2·(C/1e6)^−0.3 over five runs of growing width.
  for (int r = 0; r < 5; ++r) {
    const RunConfig cfg = Tiny(8 + 4 * r);
    db::RunInfo info;
    info.name = "r" + std::to_string(r);
    info.config_json = ConfigToJson(cfg).dump();
    info.config_hash = ConfigHash(cfg);
    info.sweep_id = sweep_id;
    info.shape.params_active = CountParams(cfg).active;
    auto w = db::RunWriter::Create(path, info);
    db::RunWriter::SetRunVar(path, w->run_id(), "sparsity", "2");
    for (int k = 1; k <= 4; ++k) {
      const double flops = 1e6 * std::pow(2.0, r * 1.2 + k * 0.3);
      const double loss =
          (3.2 + 2 * std::pow(flops / 1e6, -0.3)) * (1 + 0.004 * ((r * 7 + k * 3) % 5 - 2));
      w->OnEval(k * 10, static_cast<int64_t>(flops / ForwardFlopsPerToken(cfg).training()), flops,
                loss);
    }
    w->OnEnd(RunStatus::kDone, "");
  }
  const std::string base = Bin() + " promote --db " + path;
  int code = 0;
  // A sweep without fits.
  std::string out = Capture(base + " --sweep empty --family sparsity=2 --budget-flops 1e8", &code);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("no stored fits"), std::string::npos) << out;
  out = Capture(Bin() + " fit --db " + path + " --sweep law --by sparsity --resamples 100", &code);
  ASSERT_EQ(code, 0) << out;
  // Unknown family, unknown run, target outside the supported range.
  out = Capture(base + " --sweep law --family sparsity=7 --budget-flops 1e8", &code);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("unknown family"), std::string::npos) << out;
  out = Capture(base + " --sweep law --run 999 --budget-flops 1e8", &code);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("unknown run"), std::string::npos) << out;
  out = Capture(base + " --sweep law --family sparsity=2 --budget-flops 1e13", &code);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("--max-extrapolation"), std::string::npos) << out;
  out = Capture(base + " --sweep law --family sparsity=2 --target-loss 3.0", &code);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("irreducible"), std::string::npos) << out;

  // The promotion: planned, written, recorded, launched on CPU.
  const fs::path pdir = dir / "promo";
  out = Capture(base + " --sweep law --family sparsity=2 --budget-flops 1.5e8 --threads 1 --out " +
                    pdir.string() + " --launch",
                &code);
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("memory / device"), std::string::npos) << out;
  EXPECT_NE(out.find("predicted loss"), std::string::npos) << out;
  for (const char* f :
       {"config.json", "plan.json", "launch_local.sh", "launch_mpirun.sh", "launch_slurm.sbatch"})
    EXPECT_TRUE(fs::exists(pdir / f)) << f;
  const auto promos = db::ListPromotions(path);
  ASSERT_EQ(promos.size(), 1u);
  const db::PromotionRecord& p = promos.front();
  ASSERT_TRUE(p.run_id.has_value());
  EXPECT_EQ(p.sweep_id, sweep_id);
  EXPECT_EQ(p.family, "2");
  EXPECT_LT(p.band_lo, p.predicted_loss);
  EXPECT_GT(p.band_hi, p.predicted_loss);
  const json plan = json::parse(p.plan_json);
  EXPECT_GE(plan["curve"].size(), 2u);
  EXPECT_EQ(db::PromotionOfRun(path, *p.run_id)->id, p.id);
  // The run row carries the full shape (expert matrices too), the same as `moelab train` records.
  {
    const RunShape want = RunShapeOf(ConfigFromJson(json::parse(p.config_json)));
    const RunShape got = db::Reader(path).GetRun(*p.run_id)->shape;
    EXPECT_EQ(got.moe_layers, want.moe_layers);
    EXPECT_GT(got.moe_layers, 0);
    EXPECT_EQ(got.experts, want.experts);
    EXPECT_EQ(got.layers, want.layers);
    EXPECT_EQ(got.heads, want.heads);
    EXPECT_EQ(got.params_total, want.params_total);
    EXPECT_EQ(got.params_active, want.params_active);
    EXPECT_EQ(got.flops_per_token, want.flops_per_token);
  }

  // Wait for the launched run (a few seconds of CPU).
  RunStatus status = RunStatus::kQueued;
  for (int i = 0; i < 1200; ++i) {
    db::Reader reader(path);
    status = reader.GetRun(*p.run_id)->status;
    if (IsTerminal(status) && status != RunStatus::kStopped) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(status, RunStatus::kDone) << test::Slurp((pdir / "train.log").string());
  db::Reader reader(path);
  const db::Series val = reader.GetSeries(*p.run_id, "val_loss");
  const db::Series flops = reader.GetSeries(*p.run_id, "eval_flops");
  ASSERT_FALSE(val.values.empty());
  EXPECT_NEAR(flops.values.back() / plan["flops"].get<double>(), 1.0, 0.02);
  EXPECT_TRUE(std::isfinite(analysis::BandUnits(plan, flops.values.back(), val.values.back())));

#ifdef MOELAB_PROMOTE_HAVE_GUI
  // The Full runs view under Xvfb: the promoted run's curve (orange) over its band.
  if (std::system("command -v xvfb-run > /dev/null 2>&1") == 0) {
    const std::string png = (dir / "full-runs.png").string();
    const std::string gui = Bin() + "-gui";
    const std::string cmd = "xvfb-run -a -s \"-screen 0 1280x800x24\" " + gui + " --db " + path +
                            " --view full-runs --screenshot " + png + " --frames 3";
    int rc = -1;
    for (int attempt = 0; attempt < 3 && rc != 0; ++attempt) rc = std::system(cmd.c_str());
    ASSERT_EQ(rc, 0) << cmd;
    int w = 0, h = 0, n = 0;
    unsigned char* img = stbi_load(png.c_str(), &w, &h, &n, 3);
    ASSERT_NE(img, nullptr);
    int orange = 0, band = 0;
    for (int i = 0; i < w * h; ++i) {
      const unsigned char* px = img + 3 * i;
      orange +=
          std::abs(px[0] - 255) < 12 && std::abs(px[1] - 170) < 12 && std::abs(px[2] - 60) < 12;
      band += px[2] > px[0] + 25 && px[2] > 60 && px[1] > px[0];  // blue-ish fill and law line
    }
    stbi_image_free(img);
    EXPECT_GT(orange, 100) << "no promoted-run curve in " << png;
    EXPECT_GT(band, 1000) << "no predicted band in " << png;
    if (const char* docs = std::getenv("MOELAB_PROMOTE_DOCS_DIR"))
      fs::copy_file(png, fs::path(docs) / "promote-full-runs.png",
                    fs::copy_options::overwrite_existing);
  }
#endif
}

}  // namespace
}  // namespace moelab
