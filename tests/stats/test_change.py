"""One case between two runs (dflash_core.stats.change), proved on injected rounds of known truth
(tests/support/timing.py): two runs of one model call no change in more than the stated 5 % of pairs, jointly
over every case, and a real 10 % slowdown of one method is caught."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dflash_core.stats.change import compare_runs

from ..support.timing import TRUTH, draw_run

PAIRS = 200


def _any_change(r: dict) -> bool:
    return any(c["hi"] < 0 or c["lo"] > 0 for c in r["cases"].values())


@pytest.mark.parametrize("tails", ["normal", "t3"])
def test_same_model_pairs_differ_at_most_at_the_stated_rate(tails):
    """200 pairs of runs of the same 14 methods (16 ranking rounds, a 3 % noise figure: a VM's): some case's joint
    95 % interval excludes no change in at most 5 % of pairs. Bound: Bin(200, 0.05) exceeds 19 with ~6 %; 20 allows
    that and fails a rule at twice the rate (10 %: P(<= 20) ~ 55 %, at 15 % ~ 4 %)."""
    rng = np.random.default_rng(11)
    hits = sum(_any_change(compare_runs([draw_run(rng, TRUTH, 0.03, 16, tails)],
                                        [draw_run(rng, TRUTH, 0.03, 16, tails)])) for _ in range(PAIRS))
    assert hits <= 20, f"{hits} of {PAIRS} same-model pairs called a change"


def test_a_real_ten_percent_slowdown_is_caught():
    """mobs 10 % slower in NEW, everything else the same: its whole interval lies below 0 and its median drops by
    more than the gate's 5 % in at least 95 % of 100 pairs (injected at a 3 % noise figure, 16 rounds)."""
    rng = np.random.default_rng(12)
    slow = {**TRUTH, "mobs": TRUTH["mobs"] + math.log(0.9)}
    caught = 0
    for _ in range(100):
        c = compare_runs([draw_run(rng, TRUTH, 0.03, 16)], [draw_run(rng, slow, 0.03, 16)])["cases"]["mobs"]
        caught += c["hi"] < 0 and c["ratio"] < 0.95
    assert caught >= 95, caught


def test_three_round_cases_keep_the_rate_with_wide_intervals():
    """At 3 rounds a case at a 5 % noise figure moves by several % between runs of one model (the fluke an old gate
    called a regression): here the intervals are wide, so the rate still holds, and a half of the pairs moves some
    case by more than 5 % without any being called."""
    rng = np.random.default_rng(13)
    hits = moved = 0
    for _ in range(PAIRS):
        r = compare_runs([draw_run(rng, TRUTH, 0.05, 3)], [draw_run(rng, TRUTH, 0.05, 3)])
        hits += _any_change(r)
        moved += any(c["ratio"] < 0.95 for c in r["cases"].values())
    assert hits <= 20 and moved > PAIRS // 2, (hits, moved)


def test_judged_cases_and_families():
    """Only the judged cases are compared; the others still feed their family's noise figure; a case of one round is
    not compared (no spread measured)."""
    rng = np.random.default_rng(3)
    a, b = draw_run(rng, TRUTH, 0.03, 8), draw_run(rng, TRUTH, 0.03, 8)
    one = {"x": [0.1]}
    r = compare_runs([a, one], [b, one], judged=[{"mobs"}, {"x"}])
    assert set(r["cases"]) == {"mobs"} and r["noise"][0][0]["cases"] == len(TRUTH)
    assert r["cases"]["mobs"]["rounds"] == [8, 8] and r["critical_value"] > 1.9
