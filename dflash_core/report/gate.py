"""A regression gate on what the lab measures, not on raw wall time.

`--benchmark-compare-fail=median:10%` compares each case's raw wall-time median; with 1-3 rounds and the
machine's noise it flags about half the cases between two runs of the same code. This gate compares, per
method and width present in BASE: exactness (any diverged verdict fails), tokens per target call (a
deterministic count, so a drop beyond `tau_tolerance` is a real change in what the drafter proposes), and the
paired speedup only when it dropped by more than `speedup_drop` AND the two runs' Q1-Q3 ranges do not overlap.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GateConfig:
    speedup_drop: float = 0.10  # relative drop of the median paired speedup
    tau_tolerance: float = 0.005  # relative drop of tokens per target call allowed (float rounding only)


def gate(base: dict, new: dict, cfg: GateConfig = GateConfig()) -> list[str]:
    """Regressions of NEW against BASE (two canonical documents); an empty list passes."""
    problems = []
    if not new["exactness"]["all_exact"]:
        problems.append(f"exactness: NEW diverged from greedy: {', '.join(new['exactness']['failures'])}")
    for mid, m in base["methods"].items():
        for w, b in m["rows"].items():
            case = f"{mid}-w{w}"
            n = (new["methods"].get(mid) or {}).get("rows", {}).get(w)
            if n is None:
                problems.append(f"{case}: measured in BASE, missing from NEW")
                continue
            if b["tokens_per_target_call"] > 0 and \
                    n["tokens_per_target_call"] < b["tokens_per_target_call"] * (1 - cfg.tau_tolerance):
                problems.append(f"{case}: tokens per target call {b['tokens_per_target_call']:.3f} -> "
                                f"{n['tokens_per_target_call']:.3f}")
            if mid == "normal":
                continue
            drop = (b["speedup"] - n["speedup"]) / b["speedup"] if b["speedup"] > 0 else 0.0
            if drop > cfg.speedup_drop and n["speedup_q3"] < b["speedup_q1"]:
                problems.append(f"{case}: paired speedup {b['speedup']:.3f} [{b['speedup_q1']:.3f}-"
                                f"{b['speedup_q3']:.3f}] -> {n['speedup']:.3f} [{n['speedup_q1']:.3f}-"
                                f"{n['speedup_q3']:.3f}] ({100 * drop:.0f}% lower, ranges apart)")
    return problems
