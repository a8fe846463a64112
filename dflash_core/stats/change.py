"""One case between two runs: the change of its median per-round log ratio, with an interval that holds jointly
over every case compared, from the same bootstrap of a median as the ranking (`stats.medians`).

Per family of cases (the ranking rounds against dflash; the other cases' rounds against greedy) each run's noise
figure is its own `robust_noise`, and case i's median in run R is redrawn from R's pooled residuals
(`medians.deviations`). The runs are independent, so the change d_i = th_new,i - th_base,i has bootstrap deviation
D_i = dev_new,i - dev_base,i; c is the `confidence` quantile of max_i |D_i| / se_i over every compared case, so
[d_i - c se_i, d_i + c se_i] covers every true change at once with probability >= `confidence` (independent rounds
within a case).

What it guarantees: between two runs of one model (every true change 0) some case's interval excludes 0 with
probability <= 1 - `confidence`, jointly over every case compared; so a gate that calls a regression only when a
case's whole interval lies below 0 calls a false one in at most 5 % of same-model pairs (95 %), whatever the
number of cases. A 3-round fluke cannot do it: 3 rounds give a wide interval, not a narrow one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from .medians import deviations
from .summary import CONFIDENCE, SEED, finite, robust_noise

RESAMPLES = 4000
RULE = "joint bootstrap of the change of two medians (stats.change)"


def _family(logs: Mapping[str, np.ndarray], resamples: int, seed: int) -> tuple[dict, dict]:
    """(case -> bootstrap deviations of its median, the family's noise record) for the cases of >= 2 rounds."""
    cases = {k: np.sort(finite(v)) for k, v in logs.items()}
    cases = {k: v for k, v in cases.items() if v.size >= 2}
    noise = robust_noise(cases, seed=seed)
    if not cases or noise["sigma"] is None or not noise["sigma"] > 0:
        return {}, noise
    ids = sorted(cases)
    dev, _ = deviations([cases[k] for k in ids], float(noise["sigma"]), float(noise["factor"]), resamples, seed,
                        heteroscedastic=True)
    return {k: dev[:, t] for t, k in enumerate(ids)}, noise


def compare_runs(base: Sequence[Mapping[str, Sequence[float]]], new: Sequence[Mapping[str, Sequence[float]]],
                 confidence: float = CONFIDENCE, resamples: int = RESAMPLES, seed: int = SEED,
                 judged: Sequence[set] | None = None) -> dict:
    """The change of every case present in both runs, per family: `base[f]` and `new[f]` map case -> per-round log
    ratios of family f (a case name belongs to one family). A case is compared when it has >= 2 rounds in both
    runs and both runs' family has a noise figure. Returns cases (case -> estimate, se, lo, hi on the log scale;
    ratio, ci as ratios; rounds [base, new]; family), critical_value, confidence, resamples, noise (per family:
    [base, new] noise records), rule. `judged[f]`: the cases of family f to compare (default all); the others
    only feed the family's noise figure, as plain dflash's own A/A rounds feed the ranking's."""
    if len(base) != len(new):
        raise ValueError("base and new must hold the same families")
    seq = np.random.SeedSequence(seed)
    cols, out, noises = [], {}, []
    for f, (fb, fn) in enumerate(zip(base, new)):
        sb, sn = (int(s.generate_state(1)[0]) for s in seq.spawn(2))
        db, nb = _family({k: np.asarray(v, float) for k, v in fb.items()}, resamples, sb)
        dn, nn = _family({k: np.asarray(v, float) for k, v in fn.items()}, resamples, sn)
        noises.append([nb, nn])
        for k in sorted(set(db) & set(dn) & (set(judged[f]) if judged is not None else set(db))):
            tb, tn = float(np.median(finite(fb[k]))), float(np.median(finite(fn[k])))
            d = dn[k] - db[k]
            out[k] = {"estimate": tn - tb, "se": max(float(d.std(ddof=1)), 1e-12), "family": f,
                      "rounds": [int(finite(fb[k]).size), int(finite(fn[k]).size)]}
            cols.append(d)
    c = None
    if cols:
        dev = np.stack(cols, axis=1)
        se = np.array([out[k]["se"] for k in out])
        c = float(np.quantile(np.abs(dev / se).max(axis=1), confidence))
        for r in out.values():
            lo, hi = r["estimate"] - c * r["se"], r["estimate"] + c * r["se"]
            r.update(lo=lo, hi=hi, ratio=math.exp(r["estimate"]), ci=[math.exp(lo), math.exp(hi)])
    return {"cases": out, "critical_value": c, "confidence": confidence, "resamples": resamples, "noise": noises,
            "rule": RULE}
