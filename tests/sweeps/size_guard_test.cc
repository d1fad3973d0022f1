// The sweep-size guard: a spec whose axes multiply to more runs than the limit is refused before
// anything is expanded, with the product and its factors in the message; the spec's max_runs or
// ExpandOptions::max_runs (`--max-runs`) raises the limit.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include "sweeps/spec.h"
#include "tests/sweeps/spec_fixture.h"

namespace moelab::sweeps {
namespace {

using test_specs::Base;

// A grid with a typo'd axis: 3 axes of 1,000 values = 1e9 runs (the old expander allocated
// gigabytes before saying anything).
ojson HugeSpec() {
  ojson s = ojson::object();
  s["name"] = "huge";
  s["base"] = Base();
  ojson lr = ojson::array(), wd = ojson::array(), seed = ojson::array();
  for (int i = 0; i < 1000; ++i) {
    lr.push_back(1e-4 * (i + 1));
    wd.push_back(1e-3 * i);
    seed.push_back(i);
  }
  s["grid"] = {{"optimizer.lr", lr}, {"optimizer.weight_decay", wd}, {"train.seed", seed}};
  return s;
}

long MaxRssKb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

TEST(SizeGuard, RefusesBeforeExpandingWithTheProduct) {
  const ojson spec = HugeSpec();
  std::string breakdown;
  EXPECT_EQ(CountSpecRuns(spec, &breakdown), 1000000000);
  const long before = MaxRssKb();
  try {
    ExpandSpec(spec);
    FAIL() << "a 1e9-run spec must be refused";
  } catch (const SpecError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("1000000000 runs"), std::string::npos) << msg;
    EXPECT_NE(msg.find("grid.optimizer.lr 1000"), std::string::npos) << msg;
    EXPECT_NE(msg.find("limit of 10000"), std::string::npos) << msg;
    EXPECT_NE(msg.find("max_runs"), std::string::npos) << msg;
    EXPECT_NE(msg.find("--max-runs"), std::string::npos) << msg;
  }
  // The refusal costs no memory to speak of (the peak may not grow by 50 MB).
  EXPECT_LT(MaxRssKb() - before, 50 * 1024);
}

TEST(SizeGuard, LimitIsRaisedExplicitly) {
  ojson s = ojson::object();
  s["name"] = "mid";
  s["base"] = Base();
  s["grid"] = {{"train.steps", ojson::array({10, 20, 30, 40})},
               {"optimizer.lr", ojson::array({1e-3, 2e-3, 3e-3})}};
  s["seeds"] = ojson::array({0, 1});  // 4 × 3 × 2 = 24 runs
  EXPECT_EQ(CountSpecRuns(s), 24);
  ExpandOptions small;
  small.max_runs = 10;
  EXPECT_THROW(ExpandSpec(s, small), SpecError);
  s["max_runs"] = 30;  // the spec raises it
  EXPECT_EQ(ExpandSpec(s, small).runs.size(), 24u);
  s.erase("max_runs");
  small.max_runs = 24;  // --max-runs raises it
  EXPECT_EQ(ExpandSpec(s, small).runs.size(), 24u);
  s["max_runs"] = 0;
  EXPECT_THROW(ExpandSpec(s), SpecError);
  // random.count and zip groups count too.
  ojson r = ojson::object();
  r["name"] = "r";
  r["base"] = Base();
  r["zip"] = {{"optimizer.lr", ojson::array({1e-3, 2e-3})},
              {"optimizer.weight_decay", ojson::array({0.0, 0.1})}};
  r["random"] = {{"count", 20000}, {"params", {{"optimizer.beta1", {{"uniform", {0.8, 0.9}}}}}}};
  EXPECT_EQ(CountSpecRuns(r), 40000);
  EXPECT_THROW(ExpandSpec(r), SpecError);
}

}  // namespace
}  // namespace moelab::sweeps
