"""Which settings a run chose, and whether two runs chose the same ones.

`--bench-widths auto` and calibration are timing-based, so two runs of one commit on a loaded machine can pick
different verify widths (6,12 vs 4,11) or a different calibrated option (dspark_lite's floor 0.35 vs 0.0). Their
cases then do not pair: a case of one run is missing from the other, and the tokens per target call of one case
change with its options. So pooling, the gate and the comparison page first match two runs on their setup, read
from the rows they measured (every case records the options it ran with), and refuse with the fix when they differ.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import ReportInputError

# What a refusal tells the user to do, by what differs.
WIDTHS_FIX = "pin --bench-widths or --calibration-from RUN"
OPTIONS_FIX = "pass --calibration-from RUN (it reuses that run's widths and calibrated options)"


@dataclass(frozen=True)
class Setup:
    """The speculative verify widths a run measured and, per case ("<method>-w<width>"), the options it ran with."""

    widths: tuple[int, ...]
    options: dict

    def describe(self) -> str:
        return ",".join(str(w) for w in self.widths) or "none"


def setup_from_rows(rows: Iterable[tuple[str, int, object]]) -> Setup:
    """(method, width, options) per measured case -> the run's Setup (normal has no width of its own)."""
    widths, options = set(), {}
    for method, width, opts in rows:
        if method == "normal":
            continue
        widths.add(int(width))
        options[f"{method}-w{int(width)}"] = dict(opts) if isinstance(opts, dict) else {}
    return Setup(tuple(sorted(widths)), options)


def saved_setup(doc: dict) -> Setup:
    """The Setup of a saved pytest-benchmark run (already validated by build.load_saved)."""
    rows = []
    for b in doc.get("benchmarks", []):
        ex = b.get("extra_info") or {}
        if str(b.get("name", "")).startswith("test_decode[") and "method" in ex and "width" in ex:
            rows.append((ex["method"], ex["width"], ex.get("options")))
    return setup_from_rows(rows)


def report_setup(doc: dict) -> Setup:
    """The Setup of a canonical benchmark.json document."""
    return setup_from_rows((mid, int(w), r.get("options")) for mid, m in doc["methods"].items()
                           for w, r in m["rows"].items())


def _value(v) -> str:
    return f"{v:g}" if isinstance(v, float) else repr(v) if isinstance(v, str) else str(v)


def differences(a: Setup, b: Setup, limit: int = 6) -> list[str]:
    """What differs, each as 'widths 6,12 vs 4,11' or 'dspark_lite-w4 floor 0.35 vs 0' (the cases both measured)."""
    out = []
    if a.widths != b.widths:
        out.append(f"widths {a.describe()} vs {b.describe()}")
    for case in sorted(set(a.options) & set(b.options)):
        oa, ob = a.options[case], b.options[case]
        for k in sorted(set(oa) | set(ob)):
            if oa.get(k) != ob.get(k):
                out.append(f"{case} {k} {_value(oa.get(k, '-'))} vs {_value(ob.get(k, '-'))}")
    if len(out) > limit:
        out = out[:limit] + [f"{len(out) - limit} more"]
    return out


def different_prompts(a: dict, b: dict) -> bool:
    """Whether two runs' prompt records (`prompts`: the saved run's or benchmark.json's) say they benchmarked
    different prompts; a run saved before the fingerprint says nothing, so only two fingerprints that differ count."""
    return bool(a.get("sha256") and b.get("sha256") and a["sha256"] != b["sha256"])


def require_same_setup(a: Setup, b: Setup, names: tuple[str, str], consequence: str) -> None:
    """Refuse two runs that chose different settings, naming what differs and the fix.

    `consequence`: what cannot be done with them (e.g. 'the gate cannot pair their cases')."""
    diffs = differences(a, b)
    if not diffs:
        return
    fix = WIDTHS_FIX if a.widths != b.widths else OPTIONS_FIX
    raise ReportInputError(f"{names[0]} and {names[1]} chose different settings ({consequence}): "
                           f"{'; '.join(diffs)}: {fix} (e.g. run the second again with --calibration-from "
                           f"{names[0]})")
