"""A regression gate on what the lab measures, not on raw wall time.

`--benchmark-compare-fail=median:10%` compares each case's raw wall-time median; with 1-3 rounds and the
machine's noise it flags about half the cases between two runs of the same code. This gate first requires both
runs to have chosen the same settings (widths and calibrated options, report.match), then judges, per method and
width present in BASE:

* exactness (any diverged verdict fails) and a case missing from NEW;
* tokens per target call: deterministic for a fixed setting (same model, same options), so a drop beyond
  `tau_tolerance` is a real change in what the drafter proposes;
* the speed, judged with the ranking's own statistic and rounds where the case has them (its per-round ratio
  against plain dflash at the ranking width, the position effect of the leg order removed, all its ranking rounds)
  and its paired speedup over greedy rounds otherwise, only when both runs have `min_rounds` rounds of it: the
  change of the case's median with an interval that holds jointly over every case judged (stats.change, the same
  bootstrap of a median as the ranking). A regression when that whole interval lies below no change AND the
  median dropped by more than `speedup_drop`; so two runs of one model gate as a speed regression in at most 5 %
  of pairs (95 % joint), and a 3-round fluke gives a wide interval, not a regression.
* "no regression" only where the interval can see the threshold: its lower end above 1 - `speedup_drop`, so a drop
  of that size is ruled out, with at least `CLEAR_ROUNDS` rounds in each run. An interval that reaches below it
  without being a regression is "inconclusive" (two 3-round runs: about [-90 %, +1000 %]), never "no regression": a
  gate that cannot see a 5 % drop says so.

`judge` returns plain data (a verdict and its reasons per row: regression / no regression / inconclusive / not
judged, and `baseline` for normal, whose speed is every speedup's denominator); the CLI prints how many of each and
maps the overall verdict to an exit code: 0 no regression, 1 regression found, 3 inconclusive (no regression found,
but some case is inconclusive or could not be judged); 2 stays bad input, including two runs that chose different
settings.

It fails closed: a document it cannot judge (a missing or mistyped field, a non-finite number, no cases in BASE)
or a threshold that is not a finite fraction is a `ReportInputError` (exit 2), never "no regression".
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ReportInputError
from ..safeio import finite
from ..stats.change import compare_runs
from ..stats.selection import adjusted_noise
from .impossible import kept
from .match import different_prompts, report_setup, require_same_setup
from .ranking import baseline_first

REGRESSION, NOT_JUDGED, INCONCLUSIVE, NO_REGRESSION = "regression", "not judged", "inconclusive", "no regression"
BASELINE_ROW = "baseline"  # normal: exactness and tokens per call checked; its speed is what every speedup divides by
ROW_VERDICTS = (REGRESSION, NO_REGRESSION, INCONCLUSIVE, NOT_JUDGED)
# Rounds each run needs before a case can be cleared ("no regression"): below 6 not even a median's min-max interval
# covers it with 95 % (stats.summary.median_interval), and a bootstrap of 3 rounds' residuals can be far too narrow
# (two 3-round runs of one model at 8 % noise gave intervals of +/-4 %).
CLEAR_ROUNDS = 6
EXIT_CODES = {NO_REGRESSION: 0, REGRESSION: 1, INCONCLUSIVE: 3}
REBUILD = "rebuild it with python -m dflash_core.report SAVED"
ROW_NUMBERS = ("tokens_per_target_call", "speedup", "speedup_q1", "speedup_q3")


@dataclass(frozen=True)
class GateConfig:
    # Relative drop of the case's median that counts, once the joint interval shows a drop at all: 5 % so that a real
    # 10 % slowdown is caught (its estimate is below 0.95 in ~99 % of runs at 16 rounds and a 3 % noise figure).
    speedup_drop: float = 0.05
    tau_tolerance: float = 0.005  # relative drop of tokens per target call allowed (float rounding only)
    # Speedup rounds each run needs before its speedup is judged: with fewer, Q1-Q3 is the rounds themselves
    # (one round: a point), so "ranges apart" says nothing about the run's spread. 3 is the default --bench-rounds.
    min_rounds: int = 3
    confidence: float = 0.95  # the joint interval's confidence (stats.change)

    def check(self) -> None:
        """Both thresholds finite fractions in [0, 1] (NaN compares false and would pass every drop), min_rounds
        a positive integer."""
        for name, v in (("--speedup-drop", self.speedup_drop), ("--tau-tolerance", self.tau_tolerance)):
            if not finite(v) or not 0.0 <= v <= 1.0:
                raise ReportInputError(f"{name} {v!r} must be a finite fraction in [0, 1] (0.10 means 10 %)")
        if not finite(self.confidence) or not 0.5 <= self.confidence < 1.0:
            raise ReportInputError(f"confidence {self.confidence!r} must be a fraction in [0.5, 1)")
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
    """One case of BASE judged against NEW: `verdict` is regression / no regression / inconclusive / not judged, or
    baseline (normal)."""

    case: str
    method: str
    width: str
    verdict: str
    reasons: list[str] = field(default_factory=list)
    change: dict | None = None  # stats.change's record of the case, with `statistic` (None: speed not judged)


def counts(rows: list[RowVerdict]) -> dict[str, int]:
    """How many cases got each verdict (normal, the baseline, is not counted)."""
    return {v: sum(r.verdict == v for r in rows) for v in ROW_VERDICTS}


@dataclass(frozen=True)
class GateResult:
    verdict: str  # no regression / regression / inconclusive
    rows: list[RowVerdict]
    base: RunSupport
    new: RunSupport
    exactness: list[str]  # NEW's exactness failures (references included)
    comparison: dict = field(default_factory=dict)  # stats.change.compare_runs over the judged cases

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    def regressions(self) -> list[str]:
        out = [f"exactness: NEW diverged from greedy: {', '.join(self.exactness)}"] if self.exactness else []
        return out + [f"{r.case}: {why}" for r in self.rows if r.verdict == REGRESSION for why in r.reasons]


def _rounds(row: dict) -> list[float]:
    """The row's speedup rounds the statistics use (report.impossible: flagged rounds left out)."""
    return kept(row, "speedup_rounds") if isinstance(row.get("speedup_rounds"), list) else [row["speedup"]]


def support(doc: dict, name: str) -> RunSupport:
    """A run's noise figure (its report's `noise`) and its speculative cases' speedup round counts."""
    noise = doc.get("noise") if isinstance(doc.get("noise"), dict) else {}
    counts = [len(_rounds(r)) for mid, m in doc["methods"].items() if mid != "normal" for r in m["rows"].values()]
    spread = noise.get("sigma") if finite(noise.get("sigma")) else None
    threshold = noise.get("threshold") if finite(noise.get("threshold")) else None
    return RunSupport(name, spread, threshold, noise.get("noisy") is True and spread is not None,
                      (min(counts, default=0), max(counts, default=0)))


RANKED, OVER_GREEDY = "vs_baseline", "speedup"
STATISTIC_TEXT = {RANKED: "ratio against dflash (the ranking's rounds)", OVER_GREEDY: "paired speedup over greedy"}


def families(doc: dict) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """(case -> log ratios of the ranking's statistic at the ranking width, position effect removed, dflash's own A/A
    included; case -> log speedup rounds of every other speculative case), from a canonical document."""
    rk = doc.get("ranking") if isinstance(doc.get("ranking"), dict) else {}
    width = rk.get("width") if rk.get("statistic") == RANKED else None
    methods = doc["methods"]
    ranked: dict[str, list[float]] = {}
    if isinstance(width, int) and not isinstance(width, bool):
        rows = {mid: m["rows"].get(str(width)) for mid, m in methods.items() if mid != "normal"}
        ratios = {f"{mid}-w{width}": kept(r, "vs_baseline_rounds") for mid, r in rows.items()
                  if r and isinstance(r.get("vs_baseline_rounds"), list) and r["vs_baseline_rounds"]}
        first = {f"{mid}-w{width}": v for mid, v in baseline_first(methods, width).items()}
        logs, _, _ = adjusted_noise(ratios, baseline_first=first)
        ranked = {k: np.asarray(v, float).tolist() for k, v in logs.items()}
    other = {f"{mid}-w{w}": [math.log(x) for x in _rounds(r) if x > 0]
             for mid, m in methods.items() if mid != "normal" for w, r in m["rows"].items()}
    return ranked, {k: v for k, v in other.items() if k not in ranked or k.startswith("dflash-")}


def speed_changes(base: dict, new: dict, cfg: GateConfig) -> tuple[dict, dict[str, str]]:
    """stats.change over every case both runs can support (>= min_rounds rounds in each), each with the ranking's
    statistic where both runs ranked it (dflash itself: its speedup over greedy, its ratio against itself is the
    A/A) and its speedup over greedy otherwise. Returns the comparison and case -> statistic."""
    (rb, ob), (rn, on) = families(base), families(new)
    def enough(a: dict, b: dict, k: str) -> bool:
        return min(len(a.get(k) or []), len(b.get(k) or [])) >= cfg.min_rounds

    ranked = {k for k in set(rb) & set(rn) if not k.startswith("dflash-") and enough(rb, rn, k)}
    greedy = {k for k in set(ob) & set(on) if k not in ranked and enough(ob, on, k)}
    cmp = compare_runs([rb, ob], [rn, on], cfg.confidence, judged=[ranked, greedy])
    return cmp, {**{k: RANKED for k in ranked}, **{k: OVER_GREEDY for k in greedy}}


def _change_text(ch: dict, confidence: float) -> str:
    lo, hi = ch["ci"]
    return (f"{STATISTIC_TEXT[ch['statistic']]} {100 * (ch['ratio'] - 1):+.1f} % (joint {100 * confidence:.0f} % "
            f"interval {100 * (lo - 1):+.1f} to {100 * (hi - 1):+.1f} %, {ch['rounds'][0]} vs {ch['rounds'][1]} "
            "rounds)")


def judge_row(mid: str, w: str, b: dict, n: dict | None, change: dict | None, cfg: GateConfig) -> RowVerdict:
    """The verdict of one case: deterministic checks first, then its speed change when both runs can support it."""
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
        return RowVerdict(case, mid, w, REGRESSION if bad else BASELINE_ROW, bad)
    if change is None:
        if bad:
            return RowVerdict(case, mid, w, REGRESSION, bad)
        rb, rn = len(_rounds(b)), len(_rounds(n))
        return RowVerdict(case, mid, w, NOT_JUDGED, [f"speedup not judged: {rb} vs {rn} rounds (an interval needs "
                                                     f">= {cfg.min_rounds} in each run)"])
    if change["hi"] < 0 and change["ratio"] < 1 - cfg.speedup_drop:
        bad.append(_change_text(change, cfg.confidence) + f": slower beyond its interval and by more than "
                   f"{100 * cfg.speedup_drop:.0f} %")
    if bad:
        return RowVerdict(case, mid, w, REGRESSION, bad, change)
    if change["ci"][0] < 1 - cfg.speedup_drop:  # the interval cannot rule out a drop of the threshold's size
        return RowVerdict(case, mid, w, INCONCLUSIVE, [
            _change_text(change, cfg.confidence) + f": the interval reaches below -{100 * cfg.speedup_drop:.0f} %, so "
            "a regression of that size is not ruled out (more rounds narrow it)"], change)
    if min(change["rounds"]) < CLEAR_ROUNDS:
        return RowVerdict(case, mid, w, INCONCLUSIVE, [
            f"{change['rounds'][0]} vs {change['rounds'][1]} rounds: below {CLEAR_ROUNDS} rounds a run's spread is "
            "not known well enough to rule out a "
            f"{100 * cfg.speedup_drop:.0f} % drop (its median's interval covers less than 95 %)"], change)
    return RowVerdict(case, mid, w, NO_REGRESSION, [], change)


def judge(base: dict, new: dict, cfg: GateConfig | None = None,
          names: tuple[str, str] = ("BASE", "NEW")) -> GateResult:
    """Every case of BASE judged against NEW (two canonical documents that chose the same settings)."""
    cfg = cfg or GateConfig()
    cfg.check()
    check_document(base, names[0], need_cases=True)
    check_document(new, names[1], need_cases=False)
    require_same_setup(report_setup(base), report_setup(new), names, "the gate cannot pair their cases")
    if different_prompts(base.get("prompts") or {}, new.get("prompts") or {}):
        raise ReportInputError(f"{names[0]} and {names[1]} benchmarked different prompts (their prompts' SHA-256 "
                               "differ): the gate compares one workload; re-run one of them on the other's prompts")
    sides = (support(base, names[0]), support(new, names[1]))
    cmp, statistic = speed_changes(base, new, cfg)
    changes = {k: {**v, "statistic": statistic[k]} for k, v in cmp["cases"].items()}
    rows = [judge_row(mid, w, b, (new["methods"].get(mid) or {}).get("rows", {}).get(w), changes.get(f"{mid}-w{w}"),
                      cfg)
            for mid, m in base["methods"].items() for w, b in m["rows"].items()]
    ex = new["exactness"]
    failures = (list(ex["failures"]) or ["?"]) if not ex["all_exact"] or ex["failures"] else []
    if failures or any(r.verdict == REGRESSION for r in rows):
        verdict = REGRESSION
    elif any(r.verdict in (NOT_JUDGED, INCONCLUSIVE) for r in rows):
        verdict = INCONCLUSIVE
    else:
        verdict = NO_REGRESSION
    return GateResult(verdict, rows, *sides, failures, {k: v for k, v in cmp.items() if k != "cases"})


def gate(base: dict, new: dict, cfg: GateConfig | None = None) -> list[str]:
    """Regressions of NEW against BASE; an empty list passes (`judge` has the per-row verdicts)."""
    return judge(base, new, cfg).regressions()
