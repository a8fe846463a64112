"""The lab's one statistics module: quartiles, bootstrap confidence intervals, rank groups, the A/A noise figure.

Plain functions over the paired per-round speedups the benchmark saves (`speedup_rounds`), so the report
builder can recompute everything from saved runs, and the benchmark and calibration tables use the same
definitions. Quartiles are the standard library's `statistics.quantiles(..., method="inclusive")`: linear
interpolation between order statistics (Hyndman-Fan type 7, numpy.percentile's default), so an IQR in the
report and one in a calibration table mean the same thing and can be recomputed with numpy. The bootstrap is
numpy's seeded generator resampling the rounds (percentile method); the seed is fixed so a report rebuilt from
the same saved runs shows the same intervals.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 4000
SEED = 0
# Elements per bootstrap chunk: the resampled indexes (int64) and values (float64) of 2**21 elements are 32 MiB,
# so the temporaries stay under ~64 MiB whatever the number of rounds (4000 x 50k rounds took 3.2 GB at once).
BOOTSTRAP_CHUNK_ELEMENTS = 1 << 21


def quartiles(xs: Sequence[float]) -> tuple[float, float, float]:
    """(Q1, median, Q3) with the inclusive rule; (0, 0, 0) for no data and (x, x, x) for one value."""
    if not xs:
        return 0.0, 0.0, 0.0
    if len(xs) == 1:
        return float(xs[0]), float(xs[0]), float(xs[0])
    q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return q1, statistics.median(xs), q3


def median_iqr(xs: Sequence[float]) -> tuple[float, float]:
    """(median, Q3 - Q1) of `xs`; (0, 0) for no data and (x, 0) for one value (no spread is measured)."""
    q1, med, q3 = quartiles(xs)
    return med, q3 - q1


def bootstrap_ci(xs: Sequence[float], confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
                 seed: int = SEED) -> tuple[float, float]:
    """Percentile bootstrap interval of the median of `xs` (the statistic the report shows as the speedup).

    One round gives the degenerate interval (x, x): nothing about its spread was measured. No data: (0, 0).
    Memory is bounded (`BOOTSTRAP_CHUNK_ELEMENTS`); time grows with resamples x rounds.
    """
    a = np.asarray(list(xs), dtype=float)
    if a.size == 0:
        return 0.0, 0.0
    if a.size == 1:
        return float(a[0]), float(a[0])
    rng = np.random.default_rng(seed)
    # Rows in chunks: the generator yields the same stream in pieces, so the interval is the one-shot result.
    rows = max(1, BOOTSTRAP_CHUNK_ELEMENTS // a.size)
    meds = np.concatenate([np.median(a[rng.integers(0, a.size, size=(min(rows, resamples - i), a.size))], axis=1)
                           for i in range(0, resamples, rows)])
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(meds, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def overlaps(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """True when two closed intervals share a point."""
    return a[0] <= b[1] and b[0] <= a[1]


def rank_groups(cases: Mapping[str, tuple[float, tuple[float, float]]], resolution: float = 0.0) -> list[list[str]]:
    """The leader's rank group, then every other case: at most two groups, best first.

    `cases`: id -> (point estimate, (lo, hi)), estimates > 0. Group 1 holds the leader (the highest estimate) and
    every case the run cannot tell apart from it: its interval overlaps the leader's, or its estimate is less
    than `resolution` (a fraction of its own estimate) below the leader's, a difference the lab does not claim to
    resolve even when the intervals separate it. Group 2 holds every other case, each resolved below group 1;
    group 2 is not ordered further. Why not partition the rest too (repeat on the rest, or chains of unresolved
    neighbours): on the 2-core box the methods behind the leader's group sit on a continuum 0.5-1 % apart, and one
    method (act) moves by 4 % with the machine's verify-cost state, so any cut through it fell at different
    methods in two quiet runs (chains: the same groups in 20-35 % of simulated pairs of runs; this rule: 89-95 %,
    98 % with the leader's group raced to 24 rounds; docs/performance.md §12). Within a group: descending
    estimate, ties by id.
    """
    if resolution < 0:
        raise ValueError(f"resolution must be >= 0, got {resolution}")
    order = sorted(cases, key=lambda k: (-cases[k][0], k))
    if not order:
        return []
    top, top_ci = cases[order[0]]
    first, rest = [order[0]], []
    for k in order[1:]:
        est, ci = cases[k]
        (first if overlaps(ci, top_ci) or top - est < resolution * est else rest).append(k)
    return [first, rest] if rest else [first]


def leading_width(speedups: Iterable[tuple[float, int]]) -> int | None:
    """The ranking width: the width of the highest median speedup over greedy among (speedup, width) pairs, ties
    to the smaller width; None without pairs. One function for the benchmark (where racing runs) and the report
    (where the groups are ranked), so the two can never rank at different widths."""
    best = max(((float(s), -int(w)) for s, w in speedups), default=None)
    return None if best is None else -best[1]


def aa_noise(rounds: Sequence[float], threshold: float) -> dict:
    """The machine's own noise from A/A rounds (normal timed against normal with the cases' pairing).

    `spread` is the largest |ratio - 1| any A/A round showed: identical work differed by that much, so a
    speedup difference smaller than it is not resolved. `noisy` when it exceeds `threshold` (a fraction).
    """
    xs = [float(x) for x in rounds]
    if not xs:
        return {"rounds": [], "median": None, "spread": None, "ci": None, "threshold": float(threshold),
                "noisy": False}
    spread = max(abs(x - 1.0) for x in xs)
    return {"rounds": xs, "median": float(np.median(xs)), "spread": float(spread), "ci": list(bootstrap_ci(xs)),
            "threshold": float(threshold), "noisy": bool(spread > threshold)}
