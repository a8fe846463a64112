"""The lab's statistics of one case and of one run: quartiles, order-statistic intervals of a median, one-sided
limits for goals, and the run's noise figure. The selection of the best method is `stats/selection.py`.

Plain functions over the per-round ratios the benchmark saves (`speedup_rounds`, `vs_baseline_rounds`), so the
report builder recomputes everything from saved runs and the benchmark, the calibration tables and the report
use one definition of each figure.

* Quartiles are the standard library's inclusive rule (Hyndman-Fan type 7, numpy.percentile's default).
* An interval of a median comes from order statistics (a binomial argument): its coverage is exact for
  independent rounds whatever the noise's shape, and it is labelled 95 % only when it has it. A percentile
  bootstrap from 3 rounds called itself 95 % and covered 75 %.
* The noise figure is a pooled robust scale of per-round log-ratio residuals. The A/A maximum |ratio - 1| it
  replaces is an extreme value: it grows with the number of rounds and one stray round sets it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache

import numpy as np
from scipy import stats as sps

CONFIDENCE = 0.95
SEED = 0
# Pooled robust SD of the per-round log ratios above which a run is noisy: quiet simulated runs (1 % noise,
# 15 cases x 3-12 rounds) never exceeded 1.6 % and loaded ones (10 %) never fell below 6.3 % in 2000 runs each,
# and the real runs gave 1.1-1.4 % quiet, 9.5 % loaded: 3 % leaves a factor of 2 on both sides.
NOISE_THRESHOLD = 0.03
MAD_TO_SD = 1.482602218505602  # 1 / Phi^-1(3/4): a MAD as an SD at the normal
MAD_EFFICIENCY = 0.3675  # the MAD's asymptotic efficiency against the SD at the normal (its equivalent df)
CORRECTION_REPS = 400  # Monte Carlo replicates of the pooled MAD's small-sample factor
CORRECTION_CAP = 200  # cases longer than this are simulated at this length (their bias is < 0.5 %)
MIN_LABELLED_N = 6  # the fewest rounds whose min-max covers a median with >= 95 % (1 - 2 * 0.5**6)


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


def finite(xs: Iterable[float]) -> np.ndarray:
    """The finite values of `xs` as a float array."""
    a = np.asarray([float(x) for x in xs], dtype=float)
    return a[np.isfinite(a)]


# --- one case: intervals and limits of a median ---------------------------------------------------------

def median_interval(xs: Sequence[float], confidence: float = CONFIDENCE) -> dict:
    """Distribution-free interval of a case's median from order statistics.

    [x_(l), x_(n+1-l)] covers the true median with probability 1 - 2 P(Bin(n, 1/2) < l), exactly, for
    independent rounds of any continuous noise; l is the largest index that reaches `confidence`. Below 6 rounds
    not even the min-max reaches 95 % (1 - 2 * 0.5**n: 75 % at 3), so the min-max is returned with its true
    coverage in the label. Returns n, median, lo, hi, coverage, label (`lo`/`hi` None without rounds).
    """
    a = np.sort(finite(xs))
    n = int(a.size)
    if n == 0:
        return {"n": 0, "median": None, "lo": None, "hi": None, "coverage": 0.0, "label": "no rounds"}
    med = float(np.median(a))
    minmax = 1.0 - 2.0 * 0.5 ** n
    if minmax < confidence:
        return {"n": n, "median": med, "lo": float(a[0]), "hi": float(a[-1]), "coverage": minmax,
                "label": f"min-max of {n} round{'s' if n > 1 else ''} (covers the median with {100 * minmax:.1f} %)"}
    lo_i, c = _two_sided_index(n, float(confidence))
    return {"n": n, "median": med, "lo": float(a[lo_i - 1]), "hi": float(a[n - lo_i]), "coverage": c,
            "label": f"{100 * confidence:.0f} % CI (order statistics {lo_i} and {n + 1 - lo_i} of {n}, exact "
                     f"coverage {100 * c:.1f} %)"}


def lower_confidence_limit(xs: Sequence[float], confidence: float = CONFIDENCE, comparisons: int = 1) -> dict:
    """One-sided distribution-free lower limit of a median (an order statistic), Bonferroni over `comparisons`.

    For a goal on "the best method" pass the number of methods it was picked from: the picked method's own limit
    is biased upward by the picking, while the largest of Bonferroni limits is a valid lower limit of the largest
    true median. `limit` is None when `n` rounds cannot reach the level (0.5**n > alpha): the goal is then
    undetermined, not met. Returns n, limit, coverage, needed (the fewest rounds that would reach it)."""
    a = np.sort(finite(xs))
    n = int(a.size)
    alpha = (1.0 - confidence) / max(1, int(comparisons))
    needed = int(math.ceil(math.log2(1.0 / alpha)))
    if n == 0 or 0.5 ** n > alpha:
        return {"n": n, "limit": None, "coverage": None, "needed": needed}
    lo_i, c = _one_sided_index(n, float(alpha))
    return {"n": n, "limit": float(a[lo_i - 1]), "coverage": c, "needed": needed}


@lru_cache(maxsize=4096)
def _two_sided_index(n: int, confidence: float) -> tuple[int, float]:
    """The largest l whose [x_(l), x_(n+1-l)] covers the median with >= `confidence`, and its exact coverage."""
    ls = np.arange(1, n // 2 + 1)
    cov = 1.0 - 2.0 * sps.binom.cdf(ls - 1, n, 0.5)
    lo_i = int(ls[cov >= confidence].max())
    return lo_i, float(1.0 - 2.0 * sps.binom.cdf(lo_i - 1, n, 0.5))


@lru_cache(maxsize=4096)
def _one_sided_index(n: int, alpha: float) -> tuple[int, float]:
    """The largest l with P(x_(l) > median) = P(Bin(n, 1/2) < l) <= alpha, and the coverage 1 - that."""
    ls = np.arange(1, n + 1)
    lo_i = int(ls[sps.binom.cdf(ls - 1, n, 0.5) <= alpha].max())
    return lo_i, float(1.0 - sps.binom.cdf(lo_i - 1, n, 0.5))


def upper_confidence_limit(xs: Sequence[float], confidence: float = CONFIDENCE, comparisons: int = 1) -> dict:
    """The mirror of `lower_confidence_limit`, for goals of the form "x <= target"."""
    lo = lower_confidence_limit([-x for x in finite(xs)], confidence, comparisons)
    return {**lo, "limit": None if lo["limit"] is None else -lo["limit"]}


def goal_met(limit: float | None, target: float, at_least: bool = True) -> bool | None:
    """A goal "x >= target" is met only when the LOWER confidence limit of x reaches it (for "x <= target" the
    upper limit): a point estimate of 2.52x whose lower limit is 2.41x does not meet ">= 2.5x". None when there is
    no limit (too few rounds): undetermined, which a page must not show as met."""
    if limit is None or not math.isfinite(float(limit)):
        return None
    return float(limit) >= float(target) if at_least else float(limit) <= float(target)


# --- one run: the noise figure --------------------------------------------------------------------------

def residuals(cases: Iterable[np.ndarray]) -> list[np.ndarray]:
    """Per case, its values minus its median, without the one structural zero of an odd-sized case.

    Why drop it: for odd n the median is a data point, so one residual is 0 by construction; it says nothing of
    the spread and would pull the pooled MAD towards 0. The n - 1 left match the case's degrees of freedom."""
    out = []
    for a in cases:
        n = a.size
        if n < 2:
            continue
        r = np.sort(a) - np.median(a)
        out.append(np.delete(r, n // 2) if n % 2 else r)
    return out


def pooled_mad_sd(residuals: Sequence[np.ndarray]) -> float:
    """MAD about 0 of the pooled residuals (each case is already centred on its median), as an SD."""
    return float(np.median(np.abs(np.concatenate(residuals)))) * MAD_TO_SD if residuals else float("nan")


def consistency_factor(sizes: Sequence[int], reps: int = CORRECTION_REPS, seed: int = SEED) -> float:
    """The factor that makes the pooled MAD-SD of residuals about per-case medians mean-unbiased at the normal.

    Why: residuals about a sample median are smaller than the errors (n = 2: +-half the gap, SD sigma/sqrt 2), so
    with 3-16 rounds per case the raw pooled MAD is 5-20 % low. The factor is 1 / E[estimate] for this run's own
    design (its multiset of case sizes), by a seeded Monte Carlo under N(0, 1)."""
    ns = tuple(sorted(min(int(n), CORRECTION_CAP) for n in sizes if n >= 2))
    return _consistency_factor(ns, int(reps), int(seed)) if ns else float("nan")


@lru_cache(maxsize=1024)
def _consistency_factor(ns: tuple[int, ...], reps: int, seed: int) -> float:
    """Vectorised per distinct case size: reps x cases x n normals at once (<= 10 MB for 15 capped cases)."""
    rng = np.random.default_rng(seed)
    parts = []
    for n in sorted(set(ns)):
        x = np.sort(rng.standard_normal((reps, ns.count(n), n)), axis=2)
        r = x - np.median(x, axis=2, keepdims=True)
        if n % 2:
            r = np.delete(r, n // 2, axis=2)
        parts.append(np.abs(r).reshape(reps, -1))
    est = np.median(np.concatenate(parts, axis=1), axis=1) * MAD_TO_SD
    return float(1.0 / est.mean())


def robust_noise(per_case_log_ratios: Mapping[str, Sequence[float]], confidence: float = CONFIDENCE,
                 threshold: float = NOISE_THRESHOLD, seed: int = SEED) -> dict:
    """The run's noise: a pooled robust SD of per-round log ratios, with its confidence interval.

    Each case's log ratios minus the case's median (the method's own speed cancels; what is left is round-to-round
    noise), pooled over every case, MAD x 1.4826 x the design's small-sample factor (`consistency_factor`). It does
    not drift with the number of rounds and one wild round moves it by ~1/N. Interval: chi-square with the
    equivalent df 0.3675 sum(n_i - 1) (the MAD's efficiency at the normal): a normal-theory interval, read as
    "the noise is about between". Returns sigma, sigma_raw, factor, ci, df, df_equiv, residuals, cases,
    confidence, threshold, noisy (sigma > threshold); sigma None when no case has two rounds.
    """
    cases = {str(k): finite(v) for k, v in per_case_log_ratios.items()}
    cases = {k: v for k, v in cases.items() if v.size}
    res = residuals(cases.values())
    sizes = [a.size for a in cases.values()]
    df = int(sum(n - 1 for n in sizes if n >= 2))
    base = {"cases": len(cases), "confidence": confidence, "threshold": float(threshold), "df": df}
    if not res or df == 0:
        return {**base, "sigma": None, "sigma_raw": None, "factor": None, "ci": None, "df_equiv": 0.0,
                "residuals": 0, "noisy": False}
    raw = pooled_mad_sd(res)
    factor = consistency_factor(sizes, seed=seed)
    sigma = raw * factor
    nu = MAD_EFFICIENCY * df
    a = 1.0 - confidence
    ci = [sigma * math.sqrt(nu / sps.chi2.ppf(1 - a / 2, nu)), sigma * math.sqrt(nu / sps.chi2.ppf(a / 2, nu))]
    return {**base, "sigma": float(sigma), "sigma_raw": float(raw), "factor": float(factor),
            "ci": [float(x) for x in ci], "df_equiv": float(nu), "residuals": int(sum(r.size for r in res)),
            "noisy": bool(sigma > threshold)}
