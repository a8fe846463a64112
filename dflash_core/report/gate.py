"""A regression gate on what the lab measures, not on raw wall time.

`--benchmark-compare-fail=median:10%` compares each case's raw wall-time median; with 1-3 rounds and the
machine's noise it flags about half the cases between two runs of the same code. This gate compares, per
method and width present in BASE: exactness (any diverged verdict fails), tokens per target call (a
deterministic count, so a drop beyond `tau_tolerance` is a real change in what the drafter proposes), and the
paired speedup only when it dropped by more than `speedup_drop` AND the two runs' Q1-Q3 ranges do not overlap.

It fails closed: a document it cannot judge (a missing or mistyped field, a non-finite number, no cases in BASE)
or a threshold that is not a finite fraction is a `ReportInputError` (exit 2), never "no regression".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..safeio import finite
from .build import ReportInputError

REBUILD = "rebuild it with python -m dflash_core.report SAVED"
ROW_NUMBERS = ("tokens_per_target_call", "speedup", "speedup_q1", "speedup_q3")


@dataclass(frozen=True)
class GateConfig:
    speedup_drop: float = 0.10  # relative drop of the median paired speedup
    tau_tolerance: float = 0.005  # relative drop of tokens per target call allowed (float rounding only)

    def check(self) -> None:
        """Both thresholds finite fractions in [0, 1]: NaN compares false and would pass every drop."""
        for name, v in (("--speedup-drop", self.speedup_drop), ("--tau-tolerance", self.tau_tolerance)):
            if not finite(v) or not 0.0 <= v <= 1.0:
                raise ReportInputError(f"{name} {v!r} must be a finite fraction in [0, 1] (0.10 means 10 %)")


def threshold(text: str) -> float:
    """argparse type of the gate's thresholds: a finite fraction in [0, 1]."""
    import argparse

    try:
        v = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from exc
    if not finite(v) or not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite fraction in [0, 1] (0.10 means 10 %)")
    return v


def _row_ok(row: Any) -> bool:
    return isinstance(row, dict) and all(finite(row.get(k)) and row[k] >= 0 for k in ROW_NUMBERS)


def check_document(doc: Any, where: str, need_cases: bool) -> None:
    """The fields the gate reads, with their types; `need_cases`: BASE must hold at least one row to compare."""
    if not isinstance(doc, dict):
        raise ReportInputError(f"{where}: a benchmark document must be a JSON object: {REBUILD}")
    ex = doc.get("exactness")
    if not (isinstance(ex, dict) and isinstance(ex.get("all_exact"), bool) and isinstance(ex.get("failures"), list)
            and all(isinstance(f, str) for f in ex["failures"])):
        raise ReportInputError(f"{where}: 'exactness' must hold all_exact (true or false) and failures (a list of "
                               f"case names): {REBUILD}")
    methods = doc.get("methods")
    if not isinstance(methods, dict):
        raise ReportInputError(f"{where}: 'methods' must be an object of method ids: {REBUILD}")
    for mid, m in methods.items():
        rows = m.get("rows") if isinstance(m, dict) else None
        if not isinstance(rows, dict) or not rows:
            raise ReportInputError(f"{where}: method {str(mid)[:40]!r} has no rows (an object of widths): {REBUILD}")
        for w, row in rows.items():
            if not _row_ok(row):
                raise ReportInputError(f"{where}: {str(mid)[:40]}-w{str(w)[:8]} lacks a finite number >= 0 for one of "
                                       f"{', '.join(ROW_NUMBERS)}: {REBUILD}")
    if need_cases and not methods:
        raise ReportInputError(f"{where}: BASE holds no cases, so nothing can be gated: pass a run with lab rows")


def gate(base: dict, new: dict, cfg: GateConfig = GateConfig()) -> list[str]:
    """Regressions of NEW against BASE (two canonical documents); an empty list passes."""
    cfg.check()
    check_document(base, "BASE", need_cases=True)
    check_document(new, "NEW", need_cases=False)
    problems = []
    if not new["exactness"]["all_exact"] or new["exactness"]["failures"]:
        problems.append(f"exactness: NEW diverged from greedy: {', '.join(new['exactness']['failures']) or '?'}")
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
