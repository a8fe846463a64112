"""A regression gate on what the lab measures, not on raw wall time.

`--benchmark-compare-fail=median:10%` compares each case's raw wall-time median; with 1-3 rounds and the
machine's noise it flags about half the cases between two runs of the same code. This gate first requires both
runs to have chosen the same settings (widths and calibrated options, report.match), then judges, per method and
width present in BASE:

* exactness (any diverged verdict fails) and a case missing from NEW;
* tokens per target call: deterministic for a fixed setting (same model, same options), so a drop beyond
  `tau_tolerance` is a real change in what the drafter proposes;
* the paired speedup, only when both runs have `min_rounds` rounds of it (an interval; otherwise the row is
  "not judged", never a regression): a regression when its median dropped by more than `speedup_drop` AND the two
  runs' Q1-Q3 ranges do not overlap. When a run was flagged noisy (its robust noise figure above its threshold), a drop
  is judged only when it also exceeds that figure; anything smaller is "inconclusive".

`judge` returns plain data (a verdict and its reasons per row); the CLI prints it and maps the overall verdict
to an exit code: 0 no regression, 1 regression found, 3 inconclusive (no regression found, but some row could not
be judged); 2 stays bad input, including two runs that chose different settings.

It fails closed: a document it cannot judge (a missing or mistyped field, a non-finite number, no cases in BASE)
or a threshold that is not a finite fraction is a `ReportInputError` (exit 2), never "no regression".
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from ..errors import ReportInputError
from ..safeio import finite
from .match import report_setup, require_same_setup

OK, REGRESSION, NOT_JUDGED, INCONCLUSIVE = "ok", "regression", "not judged", "inconclusive"
NO_REGRESSION = "no regression"
EXIT_CODES = {NO_REGRESSION: 0, REGRESSION: 1, INCONCLUSIVE: 3}
REBUILD = "rebuild it with python -m dflash_core.report SAVED"
ROW_NUMBERS = ("tokens_per_target_call", "speedup", "speedup_q1", "speedup_q3")


@dataclass(frozen=True)
class GateConfig:
    speedup_drop: float = 0.10  # relative drop of the median paired speedup
    tau_tolerance: float = 0.005  # relative drop of tokens per target call allowed (float rounding only)
    # Speedup rounds each run needs before its speedup is judged: with fewer, Q1-Q3 is the rounds themselves
    # (one round: a point), so "ranges apart" says nothing about the run's spread. 3 is the default --bench-rounds.
    min_rounds: int = 3

    def check(self) -> None:
        """Both thresholds finite fractions in [0, 1] (NaN compares false and would pass every drop), min_rounds
        a positive integer."""
        for name, v in (("--speedup-drop", self.speedup_drop), ("--tau-tolerance", self.tau_tolerance)):
            if not finite(v) or not 0.0 <= v <= 1.0:
                raise ReportInputError(f"{name} {v!r} must be a finite fraction in [0, 1] (0.10 means 10 %)")
        if isinstance(self.min_rounds, bool) or not isinstance(self.min_rounds, int) or self.min_rounds < 1:
            raise ReportInputError(f"--min-rounds {self.min_rounds!r} must be an integer >= 1")


def threshold(text: str) -> float:
    """argparse type of the gate's thresholds: a finite fraction in [0, 1]."""
    try:
        v = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from exc
    if not finite(v) or not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite fraction in [0, 1] (0.10 means 10 %)")
    return v


def _row_ok(row: Any) -> bool:
    return (isinstance(row, dict) and all(finite(row.get(k)) and row[k] >= 0 for k in ROW_NUMBERS)
            and isinstance(row.get("exact", True), bool)
            and (row.get("speedup_rounds") is None or (isinstance(row["speedup_rounds"], list)
                                                       and all(finite(x) for x in row["speedup_rounds"]))))


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


@dataclass(frozen=True)
class RunSupport:
    """What one run can support: its A/A noise figure and how many speedup rounds its speculative cases have."""

    name: str
    spread: float | None  # the run's noise figure (robust SD of per-round log ratios); None: none measured
    threshold: float | None
    noisy: bool
    rounds: tuple[int, int]  # fewest and most speedup rounds over the speculative cases

    def line(self) -> str:
        noise = ("no noise figure" if self.spread is None else
                 f"noise figure {100 * self.spread:.1f} % (threshold {100 * (self.threshold or 0):.1f} %"
                 + (", flagged noisy)" if self.noisy else ")"))
        lo, hi = self.rounds
        return f"{self.name}: {noise}, {lo if lo == hi else f'{lo}-{hi}'} speedup round(s) per case"


@dataclass(frozen=True)
class RowVerdict:
    """One case of BASE judged against NEW: `verdict` is ok / regression / not judged / inconclusive."""

    case: str
    method: str
    width: str
    verdict: str
    reasons: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class GateResult:
    verdict: str  # no regression / regression / inconclusive
    rows: list[RowVerdict]
    base: RunSupport
    new: RunSupport
    exactness: list[str]  # NEW's exactness failures (references included)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    def regressions(self) -> list[str]:
        out = [f"exactness: NEW diverged from greedy: {', '.join(self.exactness)}"] if self.exactness else []
        return out + [f"{r.case}: {why}" for r in self.rows if r.verdict == REGRESSION for why in r.reasons]


def _rounds(row: dict) -> list[float]:
    xs = row.get("speedup_rounds")
    return xs if isinstance(xs, list) else [row["speedup"]]


def support(doc: dict, name: str) -> RunSupport:
    """A run's noise figure (its report's `noise`) and its speculative cases' speedup round counts."""
    noise = doc.get("noise") if isinstance(doc.get("noise"), dict) else {}
    counts = [len(_rounds(r)) for mid, m in doc["methods"].items() if mid != "normal" for r in m["rows"].values()]
    spread = noise.get("sigma") if finite(noise.get("sigma")) else None
    threshold = noise.get("threshold") if finite(noise.get("threshold")) else None
    return RunSupport(name, spread, threshold, noise.get("noisy") is True and spread is not None,
                      (min(counts, default=0), max(counts, default=0)))


def _range(r: dict) -> str:
    return f"{r['speedup']:.3f}x (Q1-Q3 {r['speedup_q1']:.3f}-{r['speedup_q3']:.3f}, {len(_rounds(r))} rounds)"


def judge_row(mid: str, w: str, b: dict, n: dict | None, sides: tuple[RunSupport, RunSupport],
              cfg: GateConfig) -> RowVerdict:
    """The verdict of one case: deterministic checks first, then the speedup when both runs can support it."""
    case = f"{mid}-w{w}"
    if n is None:
        return RowVerdict(case, mid, w, REGRESSION, ["measured in BASE, missing from NEW"])
    bad = []
    if n.get("exact") is False:
        bad.append(f"NEW diverged from greedy ({n.get('verdicts')})")
    bt, nt = b["tokens_per_target_call"], n["tokens_per_target_call"]
    if bt > 0 and nt < bt * (1 - cfg.tau_tolerance):
        bad.append(f"tokens per target call {bt:.3f} -> {nt:.3f} (deterministic at this fixed setting: "
                   f"{n.get('options') or 'no options'})")
    if mid == "normal":  # the baseline of every speedup: normal against normal says nothing about NEW's code
        return RowVerdict(case, mid, w, REGRESSION if bad else OK, bad)
    rb, rn = len(_rounds(b)), len(_rounds(n))
    if min(rb, rn) < cfg.min_rounds:
        if bad:
            return RowVerdict(case, mid, w, REGRESSION, bad)
        return RowVerdict(case, mid, w, NOT_JUDGED, [f"speedup not judged: {rb} vs {rn} rounds (an interval needs "
                                                     f">= {cfg.min_rounds} in each run)"])
    drop = (b["speedup"] - n["speedup"]) / b["speedup"] if b["speedup"] > 0 else 0.0
    apart = n["speedup_q3"] < b["speedup_q1"]
    noisy = [s for s in sides if s.noisy]
    noise = max((s.spread for s in noisy), default=0.0)
    change = f"paired speedup {_range(b)} -> {_range(n)} ({100 * drop:.0f}% lower"
    if drop > max(cfg.speedup_drop, noise) and apart:
        bad.append(change + ", ranges apart" + (f", beyond the noise figure {100 * noise:.1f} %)" if noisy else ")"))
    if bad:
        return RowVerdict(case, mid, w, REGRESSION, bad)
    if noisy:
        who = " and ".join(f"{s.name} flagged noisy (noise figure {100 * s.spread:.1f} % > "
                           f"{100 * (s.threshold or 0):.1f} %)"
                           for s in noisy)
        return RowVerdict(case, mid, w, INCONCLUSIVE, [f"speedup not resolved: {who}"])
    return RowVerdict(case, mid, w, OK, [])


def judge(base: dict, new: dict, cfg: GateConfig | None = None,
          names: tuple[str, str] = ("BASE", "NEW")) -> GateResult:
    """Every case of BASE judged against NEW (two canonical documents that chose the same settings)."""
    cfg = cfg or GateConfig()
    cfg.check()
    check_document(base, names[0], need_cases=True)
    check_document(new, names[1], need_cases=False)
    require_same_setup(report_setup(base), report_setup(new), names, "the gate cannot pair their cases")
    sides = (support(base, names[0]), support(new, names[1]))
    rows = [judge_row(mid, w, b, (new["methods"].get(mid) or {}).get("rows", {}).get(w), sides, cfg)
            for mid, m in base["methods"].items() for w, b in m["rows"].items()]
    ex = new["exactness"]
    failures = (list(ex["failures"]) or ["?"]) if not ex["all_exact"] or ex["failures"] else []
    if failures or any(r.verdict == REGRESSION for r in rows):
        verdict = REGRESSION
    elif any(r.verdict in (NOT_JUDGED, INCONCLUSIVE) for r in rows):
        verdict = INCONCLUSIVE
    else:
        verdict = NO_REGRESSION
    return GateResult(verdict, rows, *sides, failures)


def gate(base: dict, new: dict, cfg: GateConfig | None = None) -> list[str]:
    """Regressions of NEW against BASE; an empty list passes (`judge` has the per-row verdicts)."""
    return judge(base, new, cfg).regressions()
