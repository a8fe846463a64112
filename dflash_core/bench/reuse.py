"""`--calibration-from RUN`: reuse another run's verify widths and calibrated options instead of choosing them.

Why: `--bench-widths auto` and every calibration are timing-based, so on a loaded machine two runs of one commit
chose different widths (6,12 vs 4,11) or options (dspark_lite's floor 0.35 vs 0.0), and their cases no longer
paired (report.match refuses them). A run that reuses BASE's choice measures exactly BASE's cases.

RUN is a saved pytest-benchmark run or a report's benchmark.json (a path, or a run id / glob under .benchmarks). The
file is hostile input: its size is bounded, it must be UTF-8 JSON without NaN, and only the part read here is
checked field by field (shapes, types, bounds); then every method id must be in the registry and every option valid
for its method (`MethodInfo.parse_options`). Runs that predate the `chosen` record give their choice through the
options each measured case ran with.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BadInputError

MAX_BYTES = 32 * 2**20  # a full-matrix saved run is a few MB (traces included)
MAX_WIDTHS, MAX_WIDTH = 64, 4096
MAX_METHODS, MAX_OPTIONS, MAX_TEXT = 64, 32, 200
METHOD_RE = re.compile(r"^[a-z0-9_]{1,64}$")
OPTION_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
CANONICAL = "dflash-mini-lab/benchmark"  # report.build.SCHEMA (not imported: this module stays import-light)


@dataclass(frozen=True)
class Reused:
    """A run's choice: the speculative widths it measured and, per method and width, the options it ran with."""

    source: str
    widths: tuple[int, ...]
    options: dict  # method -> {width: {option: value}}
    ranking_width: int | None = None  # the width the run ranked at (settings.chosen), one of `widths`
    size: dict | None = None  # a real target's budgeted matrix size (settings.size_plan.chosen), reused whole


def resolve_source(text: str, storage: str | Path = ".benchmarks") -> Path:
    """A file path as is; otherwise a run id or glob, as `report` resolves it, naming exactly one saved run."""
    p = Path(text).expanduser()
    if p.is_file():
        return p
    if p.exists():
        raise BadInputError(f"{text} is not a file: pass a saved run (.benchmarks/.../0001_*.json) or a benchmark.json")
    from ..errors import DFlashError
    from ..report.runs import resolve_runs

    try:
        found = resolve_runs([text], storage)
    except DFlashError as exc:
        raise BadInputError(str(exc)) from None
    if len(found) != 1:
        raise BadInputError(f"{text!r} names {len(found)} saved runs under {storage}: name exactly one (a path)")
    return found[0]


def _refuse(where: str, what: str) -> BadInputError:
    return BadInputError(f"{where} {what}: pass a saved run or benchmark.json written by this lab")


def _value(v: Any, where: str) -> Any:
    if isinstance(v, bool) or (isinstance(v, int) and abs(v) <= 10**12):
        return v
    if isinstance(v, float) and math.isfinite(v):
        return v
    if isinstance(v, str) and len(v) <= MAX_TEXT:
        return v
    raise _refuse(where, f"must be a finite number, true/false or a short string, not {str(v)[:40]!r}")


def _widths(ws: Any, where: str) -> tuple[int, ...]:
    if not isinstance(ws, list) or not 1 <= len(ws) <= MAX_WIDTHS:
        raise _refuse(where, f"must be a list of 1..{MAX_WIDTHS} verify widths")
    for w in ws:
        if isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= MAX_WIDTH:
            raise _refuse(where, f"holds {str(w)[:40]!r}, not a verify width (an integer 1..{MAX_WIDTH})")
    return tuple(sorted(set(ws)))


def _options(doc: Any, where: str, widths: tuple[int, ...]) -> dict:
    """{method: {width-as-text: {option: value}}} -> {method: {width: options}}, every field checked."""
    if not isinstance(doc, dict) or len(doc) > MAX_METHODS:
        raise _refuse(where, f"must be an object of at most {MAX_METHODS} methods")
    out: dict = {}
    for mid, per in doc.items():
        if not isinstance(mid, str) or not METHOD_RE.match(mid):
            raise _refuse(where, f"names {str(mid)[:40]!r}, not a method id")
        if not isinstance(per, dict) or len(per) > MAX_WIDTHS:
            raise _refuse(f"{where}.{mid}", "must be an object keyed by verify width")
        out[mid] = {}
        for w, opts in per.items():
            at = f"{where}.{mid}.{str(w)[:12]}"
            if not (isinstance(w, str) and w.isdigit() and len(w) <= 6 and int(w) in widths):
                raise _refuse(at, f"is keyed by {str(w)[:12]!r}, not one of the run's widths {list(widths)}")
            if not isinstance(opts, dict) or len(opts) > MAX_OPTIONS:
                raise _refuse(at, f"must be an object of at most {MAX_OPTIONS} options")
            for k, v in opts.items():
                if not isinstance(k, str) or not OPTION_RE.match(k):
                    raise _refuse(at, f"names the option {str(k)[:40]!r}")
                _value(v, f"{at}.{k}")
            out[mid][int(w)] = dict(opts)
    return out


def _from_rows(rows: list[tuple[Any, Any, Any]], where: str) -> tuple[tuple[int, ...], dict]:
    """A run without a `chosen` record: its widths and options are those of the cases it measured."""
    cases = [(m, w, o) for m, w, o in rows if m != "normal"]
    widths = _widths([w for _, w, _ in cases], f"{where} (its cases' widths)")
    doc: dict = {}
    for m, w, o in cases:
        if not isinstance(m, str):
            raise _refuse(where, "has a case without a method id")
        doc.setdefault(m, {})[str(w)] = o if o is not None else {}
    return widths, _options(doc, f"{where} (its cases' options)", widths)


def read_source(path: Path) -> Reused:
    """The choice recorded in a saved run or benchmark.json, checked as hostile input (no registry needed)."""
    where = str(path)
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise _refuse(where, f"is {size} bytes; a saved run is at most {MAX_BYTES} bytes")
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise BadInputError(f"cannot read {where}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise _refuse(where, f"is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc

    def no_const(c):
        raise _refuse(where, f"holds the non-finite number {c}")

    try:
        doc = json.loads(text, parse_constant=no_const)
    except RecursionError as exc:
        raise _refuse(where, "nests too deeply") from exc
    except ValueError as exc:
        if isinstance(exc, BadInputError):
            raise
        raise _refuse(where, f"is not valid JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise _refuse(where, "is not a JSON object")
    if doc.get("schema") == CANONICAL:
        settings, methods = doc.get("settings"), doc.get("methods")
        if not isinstance(methods, dict) or not all(isinstance(m, dict) and isinstance(m.get("rows"), dict)
                                                    for m in methods.values()):
            raise _refuse(where, "has no methods with rows")
        rows = [(mid, _int_width(w, where), r.get("options") if isinstance(r, dict) else None)
                for mid, m in methods.items() for w, r in m["rows"].items()]
    elif isinstance(doc.get("benchmarks"), list) and isinstance(doc.get("dflash"), dict):
        settings = doc["dflash"].get("settings")
        rows = []
        for b in doc["benchmarks"]:
            ex = b.get("extra_info") if isinstance(b, dict) else None
            if isinstance(ex, dict) and str(b.get("name", "")).startswith("test_decode[") and "width" in ex:
                rows.append((ex.get("method"), ex["width"], ex.get("options")))
    else:
        raise _refuse(where, "is neither a saved lab run (benchmarks + dflash) nor a benchmark.json")
    chosen = settings.get("chosen") if isinstance(settings, dict) else None
    if chosen is not None:
        if not isinstance(chosen, dict):
            raise _refuse(f"{where}: settings.chosen", "must be an object")
        widths = _widths(chosen.get("widths"), f"{where}: settings.chosen.widths")
        options = _options(chosen.get("options", {}), f"{where}: settings.chosen.options", widths)
        rw = chosen.get("ranking_width")
        if rw is not None and (isinstance(rw, bool) or not isinstance(rw, int) or rw not in widths):
            raise _refuse(f"{where}: settings.chosen.ranking_width", f"is {str(rw)[:20]!r}, not one of its widths")
        return Reused(where, widths, options, rw, _size(settings.get("size_plan"), f"{where}: settings.size_plan"))
    widths, options = _from_rows(rows, where)
    return Reused(where, widths, options)


SIZE_KNOBS = {"prompt_limit": 1024, "tokens": 100_000, "rounds": 1024}  # knob -> the largest value accepted


def _size(plan: Any, where: str) -> dict | None:
    """A saved budgeted size ({prompt_limit, tokens, rounds} under `chosen`), checked; None when the run has none."""
    if plan is None:
        return None
    chosen = plan.get("chosen") if isinstance(plan, dict) else None
    if not isinstance(chosen, dict) or set(chosen) != set(SIZE_KNOBS) or not all(
            isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= SIZE_KNOBS[k] for k, v in chosen.items()):
        raise _refuse(where, "must hold chosen: {prompt_limit, tokens, rounds} as integers >= 1")
    return dict(chosen)


def _int_width(w: Any, where: str) -> int:
    if isinstance(w, str) and w.isdigit() and len(w) <= 6:
        return int(w)
    raise _refuse(where, f"has a row keyed by {str(w)[:12]!r}, not a width")


def check_registry(reused: Reused) -> Reused:
    """Keep the calibrated methods' options, each checked by its method; refuse unknown ids and bad options."""
    from ..methods import METHODS

    kept = {}
    for mid, per in reused.options.items():
        info = METHODS.get(mid)
        if info is None:
            raise BadInputError(f"{reused.source}: unknown method {mid!r} (a run of another lab version?): pass a "
                                "run of this version, or drop --calibration-from")
        if info.calibration is None:
            if any(per.values()):
                raise BadInputError(f"{reused.source}: {mid} is not calibrated, yet the run gives it options "
                                    f"{next(o for o in per.values() if o)}: pass a run of this lab version")
            continue
        for w, opts in per.items():
            try:
                info.parse_options(opts)
            except BadInputError as exc:
                raise BadInputError(f"{reused.source}: {mid} at width {w}: {exc}") from None
        kept[mid] = per
    return Reused(reused.source, reused.widths, kept, reused.ranking_width, reused.size)


def load_reused(text: str, storage: str | Path = ".benchmarks") -> Reused:
    """Resolve, read and check a --calibration-from source."""
    return check_registry(read_source(resolve_source(text, storage)))


def check_given_widths(reused: Reused, given) -> None:
    """--bench-widths and --calibration-from together must name the same widths (else which one wins is a guess)."""
    given = tuple(sorted(set(given or ())))
    if given and given != reused.widths:
        raise BadInputError(f"--bench-widths {','.join(map(str, given))} and --calibration-from {reused.source} "
                            f"(widths {','.join(map(str, reused.widths))}) disagree: drop one of them")


def apply_reused(sess, reused: Reused) -> None:
    """Give the session the reused widths and, for every calibrated method the run chose options for at every one
    of them, those options (the rest are calibrated as usual, `calibration.calibrate_all`)."""
    cfg = sess.cfg
    if max(reused.widths) > sess.block_size:
        raise BadInputError(f"--calibration-from {reused.source}: width {max(reused.widths)} exceeds this drafter's "
                            f"block size B={sess.block_size} (the run used another drafter): drop --calibration-from")
    check_given_widths(reused, cfg.calibration_widths)
    sess.bench_widths = list(reused.widths)
    sess.ranking_width = reused.ranking_width  # None (a run before it was recorded): chosen here on calibration
    sess.width_choice = {"reused_from": reused.source, "selected": list(reused.widths),
                         "rule": f"reused from {reused.source} (--calibration-from)"}
    for mid, per in reused.options.items():
        if set(per) != set(reused.widths):
            continue  # a method the run chose at other widths only: calibrate it here
        sess.width_options[mid] = {w: dict(per[w]) for w in reused.widths}
        top = dict(per[reused.widths[-1]])
        sess.options[mid] = top
        sess.calibration[mid] = {"reused_from": reused.source, "objective": f"reused from {reused.source} "
                                 "(--calibration-from)", "selected": top, "selected_options": top,
                                 "widths": {str(w): {"selected": dict(per[w]), "selected_options": dict(per[w])}
                                            for w in reused.widths}}
