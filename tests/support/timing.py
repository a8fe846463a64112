"""An injected timing model for the statistics tests: per-round log ratios of known truth and noise.

Round r of method i (its wall against its own dflash leg seconds before) has log ratio theta_i + sigma * e, e iid
per round and method, from
  normal    N(0, 1)
  t3        Student t with 3 df scaled to MAD-SD 1 (1 % of rounds beyond ~5 sigma, like the lab's pooled real
            residuals: MAD-SD 1.4 %, 1 % of rounds beyond -7.3 % / +9.7 %)
  contam    N(0, 1) with 10 % of rounds x 3
A machine-state shift common to a whole round cancels in the paired ratio and is not modelled. TRUTH is the
medians against dflash of a quiet measured run (studies/2026-12-01-leader-group/): the top two 1.4 % apart, inside the
2 % resolution.
"""

from __future__ import annotations

import math

import numpy as np

from dflash_core.stats.summary import MAD_TO_SD

TRUTH_RATIOS = {"jump_mobs": 1.109, "mobs": 1.094, "bmobs": 1.050, "dspark_lite": 1.046, "act": 1.034,
                "dflash2": 1.014, "fused_jump": 1.005, "dflash": 0.996, "boltzmann": 0.991, "v14": 0.990,
                "v13": 0.982, "v10": 0.982, "v11": 0.976, "v12": 0.922}
TRUTH = {k: math.log(v) for k, v in TRUTH_RATIOS.items()}
QUIET, LOADED = 0.012, 0.10
T3_MAD = 0.7648923040  # median |t_3|


def noise(rng: np.random.Generator, shape, tails: str = "normal") -> np.ndarray:
    """Standardised round noise (MAD-SD 1 for t3; SD 1 for the bulk of normal and contam)."""
    if tails == "normal":
        return rng.standard_normal(shape)
    if tails == "t3":
        return rng.standard_t(3, shape) / (T3_MAD * MAD_TO_SD)
    if tails == "contam":
        e = rng.standard_normal(shape)
        return np.where(rng.random(shape) < 0.10, 3.0 * e, e)
    raise ValueError(tails)


def draw_run(rng: np.random.Generator, truth: dict[str, float], sigma: float, rounds: int, tails: str = "normal",
             scale: dict[str, float] | None = None) -> dict[str, np.ndarray]:
    """One run: `rounds` log ratios per case (`scale`: a per-case noise multiplier, default 1)."""
    e = noise(rng, (len(truth), rounds), tails)
    return {i: truth[i] + sigma * (scale or {}).get(i, 1.0) * e[t] for t, i in enumerate(truth)}


def ratios(run: dict[str, np.ndarray]) -> dict[str, list[float]]:
    """The run's log ratios as the ratios a saved run holds."""
    return {k: np.exp(v).tolist() for k, v in run.items()}


def lfc_truth(m: int = 14, eps: float = 1e-4) -> dict[str, float]:
    """The least favourable configuration: every method equal but one a hair ahead (nothing to hide behind)."""
    return {f"m{i:02d}": (eps if i == 0 else 0.0) for i in range(m)}


def true_best(truth: dict[str, float]) -> str:
    return max(truth, key=lambda k: truth[k])
