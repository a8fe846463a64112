"""Calibration on calibration prompts only (never benchmark prompts): choose a method's setting among
exact settings by measured throughput over repeated, order-rotated trials, and return the full table.

The seed chose from one noisy run per setting; here every setting runs `repeats` times per prompt, the
order of settings is rotated each round so drift does not favour one, and the median tokens/s with its
spread (IQR) is recorded. Ties in median go to the earlier (simpler) setting in grid order.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .decode import greedy, speculative


@dataclass
class Trial:
    setting: dict
    key: str
    tokens_per_second: list[float] = field(default_factory=list)
    acceptance: list[float] = field(default_factory=list)
    tokens_per_call: list[float] = field(default_factory=list)
    guidance: list[float] = field(default_factory=list)
    exact: bool = True

    def summary(self) -> dict:
        tps = sorted(self.tokens_per_second)
        q = statistics.quantiles(tps, n=4) if len(tps) >= 2 else [tps[0]] * 3 if tps else [0.0] * 3
        return {"setting": self.setting, "key": self.key, "all_exact": self.exact,
                "tokens_per_second_median": statistics.median(tps) if tps else 0.0,
                "tokens_per_second_iqr": q[2] - q[0], "trials": len(tps),
                "mean_acceptance_rate": statistics.fmean(self.acceptance) if self.acceptance else 0.0,
                "mean_tokens_per_target_call": statistics.fmean(self.tokens_per_call) if self.tokens_per_call
                else 0.0,
                "mean_guidance_work": statistics.fmean(self.guidance) if self.guidance else 0.0}


def setting_key(setting: dict) -> str:
    return "|".join(f"{k}={setting[k]}" for k in sorted(setting))


def calibrate(rt, prompts: Sequence[Sequence[int]], tokens: int, settings: Sequence[dict],
              make_proposer: Callable[[dict], Any], width: int, *, repeats: int = 3,
              warmup: bool = True) -> dict:
    """Measure every setting on every calibration prompt `repeats` times in rotated order.

    `make_proposer(setting)` builds the method's proposer for one setting. Returns
    {"selected": setting, "table": [summary...], "protocol": {...}}; raises if no setting is exact.
    """
    refs = [greedy(rt, list(p), tokens)[0] for p in prompts]
    trials = [Trial(dict(s), setting_key(s)) for s in settings]
    if warmup and prompts:
        speculative(rt, make_proposer(settings[0]), list(prompts[0]), min(tokens, 8), width)
    n = len(trials)
    for r in range(repeats):
        for pi, (p, ref) in enumerate(zip(prompts, refs)):
            shift = (pi * repeats + r) % n
            for t in trials[shift:] + trials[:shift]:
                ids, st = speculative(rt, make_proposer(t.setting), list(p), tokens, width)
                t.exact &= ids == ref
                t.tokens_per_second.append(st.tokens_per_second)
                t.acceptance.append(st.acceptance_rate)
                t.tokens_per_call.append(st.tokens_per_target_call)
                t.guidance.append(st.guidance_work)
    table = [t.summary() for t in trials]
    exact = [row for row in table if row["all_exact"]]
    if not exact:
        raise RuntimeError("calibration found no exact setting: the method or the rollback is broken")
    best = max(exact, key=lambda row: (row["tokens_per_second_median"], -table.index(row)))
    return {"selected": best["setting"], "selected_key": best["key"], "table": table,
            "protocol": {"prompts": len(prompts), "tokens": tokens, "repeats": repeats, "width": width,
                         "order": "rotated per (prompt, repeat)", "statistic": "median tokens/s, IQR spread"}}
