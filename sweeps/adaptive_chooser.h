// The adaptive sweep's chooser: from the runs so far, the next batch that buys the most interval
// narrowing per FLOP. The interval's half-width is c_n·sd/√n over n seeds, so each seed that
// brackets the target in both arms narrows it by the same expected amount, and the chooser
// prices the ways to gain one:
//   - finish a seed whose arm does not bracket the target yet: extend it by one rung (a longer
//     run that continues the trained one's stable phase from its kept checkpoint and becomes
//     the family's new trunk: only its steps after that are paid) when every loss is above the
//     target, or add the next shorter rung when every loss is below (a WSD branch);
//   - start a new seed (the next of the spec's seeds) in both arms, on the rungs where the seeds
//     so far crossed the target, one trunk per arm with the shorter rungs branching
//     from it; before any seed has shown where the target lies, on the whole ladder.
// The cheapest gains are taken until the batch holds seeds_per_batch seeds (min_seeds before the
// first look) or the budget would be exceeded. Deterministic given the database: ties are broken
// by seed order, and every choice carries a one-line "why".
#pragma once

#include <set>
#include <string>
#include <vector>

#include "sweeps/adaptive_estimand.h"
#include "sweeps/adaptive_store.h"

namespace moelab::sweeps {

struct AdaptiveBatch {
  std::vector<int> runs;         // SweepRun indices, ascending
  std::vector<std::string> why;  // one line per choice
  double cost_flops = 0;
  // Set when nothing more can be chosen: the budget is spent, or the space is exhausted.
  std::string exhausted;
};

// `chosen`: every run an earlier batch picked (done or not); `spent_flops`: their price.
AdaptiveBatch ChooseBatch(const AdaptiveSpace& space, const AdaptiveSpec& spec,
                          const EstimandReading& reading, const std::set<int>& chosen,
                          double spent_flops);

// The FLOPs of training `runs` together (index → run of the space): within each (side, seed)
// the longest run not yet trained is the trunk and the shorter new ones branch from it (their
// decay only); the trunk is trained in full, less the stable phase of the longest trained run
// when it extends that one (no new run branches before its decay start: the sweep runner's
// rule, sweeps/runner.cc PlanExtensions); a run shorter than an already trained one is trained
// in full (the trunk kept no checkpoint at its decay start). A run reused from outside the
// sweep without its kept checkpoint would be trained in full: the price then understates it.
double BatchCost(const AdaptiveSpace& space, const std::vector<int>& runs,
                 const std::set<int>& chosen);

// What an adaptive answer cost against fixed grids (issue 38), every grid seed on every rung of
// every side, priced by BatchCost: the grid of the same seed count, and the smallest grid whose
// ordinary (one-look) t interval at the same alpha is as narrow as the repeated interval the
// sweep reached, the seed SD taken equal (c·sd/√n against t_{1−alpha/2, n'−1}·sd/√n').
struct GridComparison {
  int seeds = 0;                 // the seeds the adaptive answer rests on
  double per_seed_flops = 0;     // one seed of the grid
  double same_seeds_flops = 0;   // `seeds` seeds of the grid
  int equal_width_seeds = 0;     // n' (may exceed the space's seeds)
  double equal_width_flops = 0;  // n' seeds of the grid
  double full_flops = 0;         // every seed of the space
};
GridComparison CompareWithGrid(const AdaptiveSpace& space, const AdaptiveSpec& spec, int seeds,
                               double critical);
// "charged 1.2e13 FLOPs; the fixed grid of the same 5 seeds costs ...; one as narrow ...".
std::string FormatGridComparison(const GridComparison& g, double spent_flops);
// That line for the sweep's last look once the rule stopped it; "" while it continues or when
// no seed counts (what `sweep run`/`status` print after "cost: " and the GUI shows).
std::string CostAgainstGrids(const AdaptiveSpace& space, const AdaptiveSpec& spec,
                             const AdaptiveLookRow& last);

// What `moelab sweep plan` says about an adaptive sweep: the question, the first batch with its
// reasons, the cost bound (the whole budget, and the full grid for comparison), and the
// smallest effect the budget can at best resolve, in units of the seed SD of the log ratio.
std::string DescribeAdaptivePlan(const Sweep& sweep, const AdaptiveSpace& space,
                                 const AdaptiveSpec& spec);

}  // namespace moelab::sweeps
