"""Which speedup differences a run resolves: bootstrap confidence intervals, rank groups, the A/A noise figure.

Plain functions over the paired per-round speedups the benchmark saves (`speedup_rounds`), so the report
builder can recompute everything from saved runs. scipy is not a dependency of the lab, so the bootstrap is
numpy's seeded generator resampling the rounds (percentile method); the seed is fixed so a report rebuilt
from the same saved runs shows the same intervals.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 4000
SEED = 0


def bootstrap_ci(xs: Sequence[float], confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
                 seed: int = SEED) -> tuple[float, float]:
    """Percentile bootstrap interval of the median of `xs` (the statistic the report shows as the speedup).

    One round gives the degenerate interval (x, x): nothing about its spread was measured. No data: (0, 0).
    """
    a = np.asarray(list(xs), dtype=float)
    if a.size == 0:
        return 0.0, 0.0
    if a.size == 1:
        return float(a[0]), float(a[0])
    rng = np.random.default_rng(seed)
    meds = np.median(a[rng.integers(0, a.size, size=(resamples, a.size))], axis=1)
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(meds, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def overlaps(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """True when two closed intervals share a point."""
    return a[0] <= b[1] and b[0] <= a[1]


def rank_groups(cases: Mapping[str, tuple[float, tuple[float, float]]], resolution: float = 0.0) -> list[list[str]]:
    """Groups of cases the run cannot tell apart, best first.

    `cases`: id -> (point estimate, (lo, hi)), estimates > 0. Two cases are joined when their intervals overlap
    or their estimates differ by less than `resolution` (a fraction of the lower one: a difference the lab does
    not claim to resolve even when the intervals separate it). Groups are the connected components of that
    relation, so a chain of unresolved neighbours is one group: a boundary needs a clean gap between everything
    above it and everything below. Why not "the cases overlapping the leader, then repeat on the rest": on a
    continuum of methods 0.5 % apart that rule cuts wherever the leader's interval happens to end, so two runs
    of the same code cut at different methods. Components are contiguous in estimate order (an interval holds
    its estimate), so one pass over the sorted cases finds them. Within a group: descending estimate, ties by id.
    """
    if resolution < 0:
        raise ValueError(f"resolution must be >= 0, got {resolution}")
    order = sorted(cases, key=lambda k: (-cases[k][0], k))
    groups: list[list[str]] = []
    lowest = prev = None  # the lowest lower bound of every case so far, and the previous case's estimate
    for k in order:
        est, (lo, hi) = cases[k]
        joined = groups and (hi >= lowest or prev - est < resolution * est)
        if joined:
            groups[-1].append(k)
        else:
            groups.append([k])
        lowest = lo if lowest is None else min(lowest, lo)
        prev = est
    return groups


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
