#!/usr/bin/env python3
"""Tests of experiments/lib/seed_stats.py (run by CTest: experiments_seed_stats_py)."""
import math
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seed_stats as ss  # noqa: E402


class SeedStatsTest(unittest.TestCase):
    def test_t_quantiles_match_tables(self):
        for p, df, q in [(0.95, 1, 6.313752), (0.95, 2, 2.919986), (0.95, 3, 2.353363),
                         (0.95, 11, 1.795885), (0.975, 3, 3.182446), (0.975, 40, 2.021075)]:
            self.assertAlmostEqual(ss.t_quantile(p, df), q, places=5)

    def test_sign_flip_is_exact(self):
        self.assertEqual(ss.sign_flip_p([0.1, 0.2, 0.3]), 0.25)
        self.assertEqual(ss.sign_flip_p([0.1, 0.2, 0.3, 0.4]), 0.125)
        self.assertEqual(ss.sign_flip_p([0.1, -0.1]), 1.0)

    def test_bootstrap_enumerated_and_labelled(self):
        lo, hi, exact = ss.bootstrap_interval([1, 2, 3, 4], 0.90)
        self.assertTrue(exact)
        self.assertGreaterEqual(lo, 1)
        self.assertLessEqual(hi, 4)
        d = ss.describe([1.10, 1.20, 1.15, 1.30], log_scale=True)
        self.assertEqual(d["label"], "seed range")
        self.assertEqual(d["df"], 3)
        self.assertEqual(d["p"], 0.125)
        self.assertLess(d["t_lo"], 1.10)
        self.assertIn("seed range", ss.format_statement(d))
        self.assertEqual(ss.describe(list(range(1, 9)))["label"], "90% bootstrap")
        self.assertIn("too few", ss.describe([1.1, 1.2], log_scale=True)["note"])

    def test_matches_the_cpp_library_on_a_fixed_case(self):
        # The same numbers tests/analysis/seed_stats_test.cc pins (TIntervalIsMeanPlusMinusTSe).
        m, lo, hi = ss.t_interval([1, 2, 3, 4], 0.90)
        half = 2.353363 * math.sqrt(5 / 3) / 2
        self.assertAlmostEqual(lo, 2.5 - half, places=5)
        self.assertAlmostEqual(hi, 2.5 + half, places=5)


if __name__ == "__main__":
    unittest.main()
