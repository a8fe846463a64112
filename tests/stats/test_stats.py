"""The statistics of one case and of one run (dflash_core.stats.summary), proved on injected rounds of known truth:
the noise figure separates quiet from loaded runs and covers its truth, an interval says the coverage it has,
and a goal is met only on its confidence limit. Each test names the rule whose break makes it fail."""

from __future__ import annotations

import numpy as np
import pytest

from dflash_core.stats import summary as S

from ..support.timing import noise


def _sizes_run(rng, sigma, tails, lo=3, hi=16, cases=15):
    """One run's log ratios: 15 cases of lo..hi rounds (a schema 6 run had 3 and 12; schema 7 has 3 and 16)."""
    sizes = rng.integers(lo, hi + 1, size=cases)
    return {f"c{i}": sigma * noise(rng, int(n), tails) for i, n in enumerate(sizes)}


def test_noise_separates_quiet_from_loaded_and_does_not_grow_with_rounds():
    """Quiet (1 %) and loaded (10 %) runs with t3 tails: every quiet figure is below the 3 % threshold and every
    loaded one above, and the quiet figure at 24 rounds per case is within 15 % of the one at 3-16.
    Break: the A/A max |ratio - 1| as the figure -> a quiet run's figure reaches ~25 %."""
    rng = np.random.default_rng(11)
    quiet = [S.robust_noise(_sizes_run(rng, 0.01, "t3"))["sigma"] for _ in range(100)]
    loaded = [S.robust_noise(_sizes_run(rng, 0.10, "t3"))["sigma"] for _ in range(100)]
    long = [S.robust_noise(_sizes_run(rng, 0.01, "t3", 24, 24))["sigma"] for _ in range(100)]
    assert max(quiet) < S.NOISE_THRESHOLD < min(loaded)
    assert min(loaded) > 3 * np.median(quiet)  # the figure moves by the noise's own factor, not by rounds
    assert abs(np.median(long) / np.median(quiet) - 1) < 0.15
    assert S.robust_noise(_sizes_run(rng, 0.10, "normal"))["noisy"] is True
    assert S.robust_noise(_sizes_run(rng, 0.01, "normal"))["noisy"] is False


def test_noise_interval_covers_the_true_sigma():
    """The chi-square interval (equivalent df) covers the true sigma in >= 92 % of 300 normal runs (nominal 95 %),
    cases of 3-12 rounds (a schema 6 run's design, where the small-sample factor matters most).
    Break: the pooled MAD without the small-sample factor -> 88.7 %."""
    rng = np.random.default_rng(12)
    hits = 0
    for _ in range(300):
        nz = S.robust_noise(_sizes_run(rng, 0.012, "normal", 3, 12))
        hits += nz["ci"][0] <= 0.012 <= nz["ci"][1]
    assert hits / 300 >= 0.92


def test_noise_fields_and_degenerate_runs():
    nz = S.robust_noise({"a": [0.0, 0.01, -0.01, 0.02], "b": [0.1]})
    assert nz["df"] == 3 and nz["cases"] == 2 and nz["residuals"] == 4 and nz["sigma"] > 0
    assert nz["ci"][0] < nz["sigma"] < nz["ci"][1] and nz["threshold"] == S.NOISE_THRESHOLD
    assert S.robust_noise({"a": [0.3]})["sigma"] is None and S.robust_noise({})["noisy"] is False
    # one wild round moves the figure by ~1/N, not to the wild value
    rng = np.random.default_rng(3)
    run = _sizes_run(rng, 0.01, "normal", 12, 12)
    wild = {**run, "c0": np.concatenate([run["c0"][:-1], [0.5]])}
    assert S.robust_noise(wild)["sigma"] < 1.1 * S.robust_noise(run)["sigma"]


@pytest.mark.parametrize("n", [3, 6, 12])
def test_an_interval_covers_what_its_label_says(n):
    """Whatever the interval says is what it covers: "95 %" -> >= 93 % of 2000 runs (t3 noise); otherwise its
    stated coverage +- 3 %; no "95 %" below 6 rounds. Break: the min-max labelled 95 % at any n -> 75 % at n = 3."""
    rng = np.random.default_rng(21)
    hits, iv = 0, None
    for _ in range(2000):
        iv = S.median_interval(np.exp(0.012 * noise(rng, n, "t3")))
        hits += iv["lo"] <= 1.0 <= iv["hi"]
    cov = hits / 2000
    if iv["label"].startswith("95 %"):
        assert cov >= 0.93
    else:
        assert abs(cov - iv["coverage"]) < 0.03
    assert (n >= S.MIN_LABELLED_N) == iv["label"].startswith("95 %")


def test_minmax_coverage_and_the_order_statistics_chosen():
    for n in range(1, 6):
        iv = S.median_interval(np.arange(n) + 1.0)
        assert iv["coverage"] == pytest.approx(1 - 2 * 0.5 ** n)
        assert (iv["lo"], iv["hi"]) == (1.0, float(n)) and iv["label"].startswith("min-max")
    iv = S.median_interval(np.arange(12.0))
    assert (iv["lo"], iv["hi"]) == (2.0, 9.0) and iv["coverage"] == pytest.approx(0.96142578125)
    assert S.median_interval([])["lo"] is None
    lo = S.lower_confidence_limit(np.arange(16.0))  # one-sided 95 %: the 5th order statistic of 16
    assert lo["limit"] == 4.0 and lo["coverage"] >= 0.95
    assert S.lower_confidence_limit(np.arange(3.0)) == {"n": 3, "limit": None, "coverage": None, "needed": 5}
    assert S.lower_confidence_limit(np.arange(3.0), comparisons=14)["needed"] == 9
    assert S.upper_confidence_limit(np.arange(16.0))["limit"] == 11.0


def test_goal_met_semantics():
    assert S.goal_met(2.5, 2.5) and not S.goal_met(2.49, 2.5) and S.goal_met(None, 2.5) is None
    assert S.goal_met(float("nan"), 2.5) is None
    assert S.goal_met(1.29, 1.3, at_least=False) and not S.goal_met(1.31, 1.3, at_least=False)


def test_quartiles():
    assert S.quartiles([1.0, 2.0, 3.0, 4.0, 5.0]) == (2.0, 3.0, 4.0) and S.median_iqr([2.0]) == (2.0, 0.0)
