"""Selection of the fastest method with a stated guarantee: Hsu's multiple comparisons with the best (MCB),
calibrated by a residual bootstrap, on a design whose rounds were fixed before the run.

Data: per case (one method at the ranking width) its per-round log ratios y = log(wall(dflash) / wall(method)),
each round with its own dflash leg seconds from the method's. Rounds of two methods are not paired, so a
method-vs-method difference is a difference of two independent medians.

What it guarantees (with probability >= `confidence`, jointly, whenever the fixed-design rounds are independent
within a case): the fastest method (highest true median) is in G1; every method outside G1 is not the fastest and
is slower than it by at least its listed gap; a single winner is named only when it is faster than every other
method by more than the resolution r. It claims nothing about a G2 method against G1 members other than the
(unknown) fastest, and does not order G2.

Why not the leader's group of overlapping 95 % intervals it replaces: comparisons with the sample leader are not
simultaneous (one per method at 95 % each) and racing until separated is optional stopping; at a 1.4 % true
gap that rule named a single winner in 17-21 % of simulated runs, this one in 0-0.1 %.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from scipy import stats as sps

from .medians import MEMORY_BYTES, deviations
from .summary import CONFIDENCE, SEED, finite, robust_noise

RESAMPLES = 4000
# The groups' indifference zone is r = max(user resolution, K_RESOLUTION * sigma / sqrt(n)). Why 2.5: the run-to-run
# SD of the gap between two medians of n rounds is about sqrt(2) * 1.25 * sigma / sqrt(n) * sqrt(2) (1.25: the
# median's efficiency factor at the normal), so a smaller gap is not expected to reproduce in another run. Quiet
# (sigma ~1.2 %, 16 rounds) it is 0.75 % and the user's 2 % governs; at the noise threshold (3 %) 1.9 %; loaded
# (10 %) 6 %: a noisy run widens G1 by itself. It does not touch the guarantee, which holds for any r.
K_RESOLUTION = 2.5
RULE = "mcb"  # benchmark.json `ranking.rule`
SLOWER, NOT_FASTEST = "slower than the fastest by more than r", "not the fastest"


def effective_resolution(user_resolution: float, sigma: float | None, rounds: float, k: float = K_RESOLUTION) -> float:
    """The indifference zone on the log scale: max(log(1 + user_resolution), k * sigma / sqrt(rounds)), `rounds`
    the median rounds per ranked case. With no measured sigma, the user's resolution."""
    base = math.log1p(user_resolution)
    if sigma is None or not math.isfinite(sigma) or rounds <= 0:
        return base
    return max(base, k * float(sigma) / math.sqrt(rounds))


def _critical_value(dev: np.ndarray, s_pair: np.ndarray, confidence: float) -> float:
    """max over candidate bests k of the `confidence` quantile of max_{j != k} |Z_kj|, Z_kj the bootstrap deviation
    of th_k - th_j over s_kj: a two-sided Dunnett event with the unknown true best as control (the max over k
    makes it valid whichever case is the best). Chunked: temporaries stay under MEMORY_BYTES."""
    b, m = dev.shape
    chunk = max(1, min(b, MEMORY_BYTES // (8 * m * 4)))
    c = 0.0
    for k in range(m):
        others = np.arange(m) != k
        zmax = np.empty(b)
        for s in range(0, b, chunk):
            d = dev[s:s + chunk]
            zmax[s:s + chunk] = np.abs((d[:, k:k + 1] - d[:, others]) / s_pair[k, others]).max(axis=1)
        c = max(c, float(np.quantile(zmax, confidence)))
    return c


def select_best(per_case_log_ratios: Mapping[str, Sequence[float]], resolution: float = 0.02,
                confidence: float = CONFIDENCE, k: float = K_RESOLUTION, resamples: int = RESAMPLES,
                seed: int = SEED, noise: dict | None = None, simultaneous: bool = True,
                heteroscedastic: bool = True) -> dict:
    """Hsu's MCB on each case's median log ratio against the common baseline.

    With c the bootstrap critical value (`_critical_value`) and s_ij = sqrt(s_i^2 + s_j^2) (cases independent):
    * upper_i = min_{j != i}(th_i - th_j + c s_ij); on the event the best b has upper_b > 0. G1 = {i : upper_i > -r}.
    * outside G1: gap_lo_i = min_{g in G1}(th_g - th_i - c s_gi) <= theta_best - theta_i on the event.
    * lower_i = min_{j != i}(th_i - th_j - c s_ij); the top estimate w is the winner iff lower_w > r: then
      G1 = {w}, w is the best and leads every other method by more than r.
    r = effective_resolution(resolution, sigma, median rounds, k). `simultaneous=False` uses the per-comparison
    normal quantile (tests only: the guarantee does not hold then). `noise`: a `robust_noise` result to reuse.
    Log-scale figures (estimate, se, upper, lower, gap_lo) with `ratio` = exp(estimate); `resolution` log scale.
    """
    cases = {str(i): finite(v) for i, v in per_case_log_ratios.items()}
    ids = sorted(i for i, v in cases.items() if v.size)
    arrays = [np.sort(cases[i]) for i in ids]
    noise = noise or robust_noise({i: cases[i] for i in ids}, confidence, seed=seed)
    sigma = noise.get("sigma")
    ns = np.array([a.size for a in arrays], dtype=int)
    theta = np.array([float(np.median(a)) for a in arrays])
    r = effective_resolution(resolution, sigma, float(np.median(ns)) if ids else 0.0, k)
    out = {"cases": ids, "estimate": dict(zip(ids, theta.tolist())), "ratio": dict(zip(ids, np.exp(theta).tolist())),
           "rounds": dict(zip(ids, ns.tolist())), "resolution": r, "resolution_user": math.log1p(resolution),
           "k": k, "sigma": sigma, "confidence": confidence, "resamples": resamples, "critical_value": None,
           "se": {}, "scale": {}, "upper": {}, "lower": {}, "below": {}, "g1": list(ids), "winner": None,
           "winner_lead_lo": None, "lead": None}
    if len(ids) < 2 or sigma is None or not sigma > 0:
        out["g1"] = sorted(ids, key=lambda i: -out["estimate"][i])
        return out  # one case, or no spread measured: nothing is resolved
    m = len(ids)
    if m * m * 8 * 4 > MEMORY_BYTES:
        raise ValueError(f"{m} cases exceed the bootstrap's memory bound ({MEMORY_BYTES} bytes)")
    resamples = int(max(200, min(resamples, MEMORY_BYTES // (8 * m))))
    dev, lam = deviations(arrays, float(sigma), float(noise["factor"]), resamples, seed, heteroscedastic)
    se = np.maximum(dev.std(axis=0, ddof=1), 1e-12)
    s_pair = np.sqrt(se[:, None] ** 2 + se[None, :] ** 2)
    c = _critical_value(dev, s_pair, confidence) if simultaneous else float(sps.norm.ppf(1 - (1 - confidence) / 2))
    diff = theta[:, None] - theta[None, :]
    off = ~np.eye(m, dtype=bool)
    upper = np.where(off, diff + c * s_pair, np.inf).min(axis=1)
    lower = np.where(off, diff - c * s_pair, np.inf).min(axis=1)
    order = np.argsort(-theta, kind="stable")
    in_g1 = upper > -r
    top = int(order[0])
    winner = ids[top] if lower[top] > r else None
    g1_idx = np.flatnonzero(in_g1)
    below = {}
    for t in order:
        if not in_g1[t]:
            gap = float(np.min(theta[g1_idx] - theta[t] - c * s_pair[g1_idx, t]))
            below[ids[t]] = {"gap_lo": gap, "claim": SLOWER if gap > r else NOT_FASTEST}
    second = int(order[1])
    # the leader's lead over the next estimate, on the joint event: at least lower[top] over every other method, at
    # most its gap to the runner-up plus c s; and whether the lead would still exceed r with the noise figure at the
    # upper end of its interval (every s and r scaled by that sigma): if not, the machine's noise could change it
    sig_hi = (noise.get("ci") or [None, None])[1]
    stretch = float(sig_hi) / float(sigma) if sig_hi and math.isfinite(float(sig_hi)) else 1.0
    r_hi = effective_resolution(resolution, sigma * stretch, float(np.median(ns)), k)
    lo_hi = float(np.min(np.where(off[top], diff[top] - c * stretch * s_pair[top], np.inf)))
    lead = {"over": ids[second], "estimate": float(diff[top, second]), "lo": float(lower[top]),
            "hi": float(diff[top, second] + c * s_pair[top, second]), "resolution_noise_hi": r_hi,
            "lo_noise_hi": lo_hi, "noise_could_change": bool((lower[top] > r) != (lo_hi > r_hi))}
    out.update(critical_value=c, resamples=resamples, se=dict(zip(ids, se.tolist())), lead=lead,
               scale=dict(zip(ids, lam.tolist())), upper=dict(zip(ids, upper.tolist())),
               lower=dict(zip(ids, lower.tolist())),
               g1=[ids[t] for t in order if in_g1[t]], winner=winner, below=below,
               winner_lead_lo=float(lower[top]) if winner else None)
    return out


def guarantee_sentence(confidence: float, r: float) -> str:
    """The one-sentence claim `select_best` supports (r on the log scale, shown as a percentage)."""
    return (f"With {100 * confidence:.0f} % confidence, jointly: the fastest method is in G1, every method outside "
            f"G1 is slower than the fastest (by at least its listed gap), and a method is named the winner only if "
            f"it is faster than every other method by more than {100 * math.expm1(r):.1f} %.")


def position_adjusted(logs: Mapping[str, np.ndarray], baseline_first: Mapping[str, Sequence[bool]]
                      ) -> tuple[dict[str, np.ndarray], float | None]:
    """Each round's log ratio with the position effect of its leg order removed, and that effect: log(first leg's
    wall / second leg's) of identical work (> 0: the leg that runs second is faster). Per case, half the median of
    its rounds with dflash first minus the median with the method first; the run's is the median over the cases
    that ran both orders. A round with dflash first then loses it, one with the method first gains it.
    Why: the legs run in a random order, so an unadjusted position effect of a few % would not bias a ratio but would
    spread its rounds into two modes and read as noise. None (nothing adjusted) when no case ran both orders."""
    diffs, flags = [], {}
    for k, y in logs.items():
        f = np.asarray(list(baseline_first.get(k) or [])[:y.size], dtype=bool)
        if f.size != y.size:
            continue
        flags[k] = f
        if f.any() and (~f).any():
            diffs.append(float(np.median(y[f]) - np.median(y[~f])))
    if not diffs:
        return dict(logs), None
    delta = float(np.median(diffs)) / 2
    out = {k: (y - np.where(flags[k], delta, -delta) if k in flags else y) for k, y in logs.items()}
    return out, delta


def adjusted_noise(per_case_ratios: Mapping[str, Sequence[float]], *, threshold: float | None = None,
                   confidence: float = CONFIDENCE, seed: int = SEED,
                   baseline_first: Mapping[str, Sequence[bool]] | None = None) -> tuple[dict, float | None, dict]:
    """The log ratios the ranking works on (the position effect removed), that effect and their noise figure: one
    function, so the bench's stderr warning and the report quote the same figure."""
    logs = {k: np.log(np.asarray([x for x in v if x > 0], dtype=float)) for k, v in per_case_ratios.items()}
    logs, delta = position_adjusted(logs, baseline_first or {})
    noise = robust_noise(logs, confidence, **({} if threshold is None else {"threshold": threshold}), seed=seed)
    return logs, delta, noise


def rank(per_case_ratios: Mapping[str, Sequence[float]], resolution: float, threshold: float | None = None,
         confidence: float = CONFIDENCE, resamples: int = RESAMPLES, seed: int = SEED,
         baseline_first: Mapping[str, Sequence[bool]] | None = None) -> dict:
    """The whole ranking of a run from each case's per-round ratios against the baseline (every round of a design
    fixed before the run, `bench.schedule.run_ranking`), the position effect of the leg order removed
    (`position_adjusted`, given each round's order: True where the baseline leg ran first), the noise figure over
    those rounds (`robust_noise`), then MCB (`select_best`).

    The noise rule: a winner is named when its simultaneous lower bound on the lead exceeds the noise-widened
    resolution r = max(resolution, k sigma / sqrt(n)), MCB's own rule, so a noisy run widens r and the intervals by
    itself; `threshold` only flags the run as noisy (a banner, a stderr warning). Why not a gate that names no winner
    above a fixed threshold: every VM seen reads 4-9 %, so a 3 % gate suppressed leads of ~22 % against a 3.2 %
    resolution; the widened r keeps the false-winner rate at MCB's (tests/stats/test_selection.py: <= 5 %, measured
    0-0.1 % at a 1.4 % true gap, quiet or loaded). `lead.noise_could_change` says whether the verdict would flip with
    the noise figure at the upper end of its interval. Returns select_best's record with `noise`,
    `position_delta` and `guarantee`."""
    logs, delta, noise = adjusted_noise(per_case_ratios, threshold=threshold, confidence=confidence, seed=seed,
                                        baseline_first=baseline_first)
    out = select_best(logs, resolution, confidence, resamples=resamples, seed=seed, noise=noise)
    return {**out, "noise": noise, "position_delta": delta,
            "guarantee": guarantee_sentence(confidence, out["resolution"])}
