#!/usr/bin/python3
"""Tests of the run protocol's rules (bench/protocol.py) on synthetic runs, against hand-worked
medians: the verdict is the median run's, a file with < 3 runs, a loaded run, a flipped `met` or a
hand-edited value is refused, and informational rows are labelled."""
import copy
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__))))
import protocol  # noqa: E402


def target(name, value, peer, goal=2.0, higher=True, note=""):
    c = value / peer if peer else value
    met = c >= goal if higher else c <= goal
    off = abs(c - goal) / abs(goal) * 100
    return {"name": name, "value": value, "peer": peer, "goal": goal,
            "goal_applies_to": "value/peer" if peer else "value", "higher_is_better": higher,
            "unit": "ops/s", "compared": c, "met": met, "status": "met" if met else "missed by %.1f%%" % off,
            "reason": None, "note": note}


def report(*targets):
    load = {"1m": 0.5, "5m": 0.5, "15m": 0.5}
    return {"benchmark": "x_bench", "command": "x_bench --json", "quick": False, "load_begin": load,
            "load_end": load, "tables": [{"title": "t", "columns": ["a"], "rows": [[1]], "load_begin": load,
                                          "load_end": load, "notes": []}],
            "targets": list(targets), "meta": {}}


def run(rep, load1=0.5):
    l = {"1m": load1, "5m": 0.5, "15m": 0.5}
    return {"started": "2026-12-06T06:00:00Z", "wall_s": 1.0, "exit_code": 0, "error": None,
            "waited_for_quiet_s": 0, "load_before": l, "load_after": l, "report": rep}


def doc(runs, cfg=None):
    return {"benchmark": "x_bench",
            "protocol": {"version": 1, "runs": len(runs), "started": "2026-12-06T06:00:00Z", "command": "x",
                         "env": {}, "label": "//x", "cpu": "c", "quiet_threshold_1m": 1.0,
                         "quiet": all(r["load_before"]["1m"] < 1.0 for r in runs), "like_for_like": ""},
            "runs": runs, "targets": protocol.aggregate(runs, cfg or {})}


def check(d, cfg=None):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(d, f)
    errs = []
    protocol.check_file(f.name, cfg or {}, errs)
    os.unlink(f.name)
    return errs


class ProtocolTest(unittest.TestCase):
    def test_median_run_decides(self):
        # ratios 2.5 (met), 1.5 (missed), 1.9 (missed): the median run is 1.9 -> missed, 1 of 3.
        runs = [run(report(target("add", 250, 100))), run(report(target("add", 150, 100))),
                run(report(target("add", 190, 100)))]
        t = protocol.aggregate(runs, {})[0]
        self.assertFalse(t["met"])
        self.assertEqual(t["met_runs"], 1)
        self.assertAlmostEqual(t["compared"], 1.9)
        self.assertEqual(t["median_run"], 2)
        self.assertEqual(check(doc(runs)), [])

    def test_best_run_is_not_selected(self):
        runs = [run(report(target("add", 250, 100))), run(report(target("add", 210, 100))),
                run(report(target("add", 100, 100)))]
        t = protocol.aggregate(runs, {})[0]
        self.assertTrue(t["met"])
        self.assertAlmostEqual(t["compared"], 2.1)  # the median, not the best 2.5
        self.assertEqual(t["met_runs"], 2)

    def test_lower_is_better_and_even_runs_take_the_worse_middle(self):
        runs = [run(report(target("t", v, None, goal=1.0, higher=False))) for v in (0.5, 0.9, 1.1, 1.2)]
        t = protocol.aggregate(runs, {})[0]
        self.assertAlmostEqual(t["value"], 1.1)
        self.assertFalse(t["met"])  # 2 of 4 met is not a majority

    def test_failed_run_counts_as_worst(self):
        runs = [run(report(target("add", 250, 100))), run(None), run(report(target("add", 150, 100)))]
        runs[1]["error"], runs[1]["exit_code"] = "exit code 1", 1
        t = protocol.aggregate(runs, {})[0]
        self.assertFalse(t["met"])
        self.assertAlmostEqual(t["compared"], 1.5)

    def test_check_refuses_fewer_than_three_runs(self):
        runs = [run(report(target("add", 250, 100))), run(report(target("add", 250, 100)))]
        self.assertTrue(any("runs recorded" in e for e in check(doc(runs))))

    def test_check_refuses_a_flipped_verdict_or_edited_value(self):
        runs = [run(report(target("add", v, 100))) for v in (150, 160, 250)]
        d = doc(runs)
        bad = copy.deepcopy(d)
        bad["targets"][0]["met"] = True
        self.assertTrue(check(bad))
        bad = copy.deepcopy(d)
        bad["targets"][0]["value"] = 250
        self.assertTrue(check(bad))
        bad = copy.deepcopy(d)
        del bad["runs"][2]["report"]["targets"][0]  # a run edited after the fact
        self.assertTrue(check(bad))

    def test_check_refuses_a_loaded_run(self):
        runs = [run(report(target("add", 250, 100)), load1=l) for l in (0.3, 2.5, 0.4)]
        self.assertTrue(any("loaded machine" in e for e in check(doc(runs))))

    def test_informational_rows(self):
        cfg = {"informational": {"b": "self-set goal"}}
        runs = [run(report(target("a", 250, 100, note="informational: 4 ranks on 2 cores"),
                           target("b", 1, None, goal=0.5), target("c", 250, 100)))] * 3
        rows = {t["name"]: t for t in protocol.aggregate(runs, cfg)}
        self.assertEqual(rows["a"]["informational"], "4 ranks on 2 cores")
        self.assertEqual(rows["b"]["informational"], "self-set goal")
        self.assertIsNone(rows["c"]["informational"])
        d = doc(runs, cfg)
        self.assertEqual(check(d, {"x_bench": cfg}), [])
        self.assertTrue(check(d, {}))  # label changed without `protocol.py refresh`


if __name__ == "__main__":
    unittest.main()
