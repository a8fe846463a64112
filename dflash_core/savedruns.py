"""Saved runs, found and read as hostile input.

Found the way `pytest-benchmark compare` does (`resolve_runs`): a path, a run id (0001) or a glob, searched in the
storage folder (default .benchmarks) across every machine folder under it. Read for `--calibration-from RUN`
(`read_source`): a saved pytest-benchmark run or a report's benchmark.json whose size is bounded, that must be UTF-8
JSON without NaN, and whose choice (widths, calibrated options, budgeted size) is checked field by field (shapes,
types, bounds). It sits on the floor of `options.py`, not in `store/`, because the options table checks the
--calibration-from knob (its one gatekeeper) and stands below the store; nothing here needs the method registry
(`bench.reuse.check_registry` adds that check)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_benchmark.storage.file import FileStorage

from .errors import BadInputError, DFlashError, ReportInputError
from .safeio import read_json

RUN_ID = re.compile(r"^[0-9]{4}$")


def resolve_runs(args: list[str], storage: str | Path = ".benchmarks") -> list[Path]:
    """Each argument -> the saved files it names, in order, without duplicates."""
    store = Path(storage)
    out: list[Path] = []
    for arg in args:
        if Path(arg).exists() and not Path(arg).is_dir():  # a FIFO or device too: load_saved refuses it by name
            found = [Path(arg)]
        elif not store.is_dir():
            raise ReportInputError(f"{arg!r} is not a file, and the storage folder {store} does not exist: run "
                                   "`pytest benchmarks --benchmark-autosave` first, or pass --storage DIR")
        else:
            try:
                found = FileStorage(store, logger=None).query(arg)  # its own query: the matching of `compare`
            except (ValueError, NotImplementedError) as exc:  # pathlib's glob refuses absolute patterns this way
                raise ReportInputError(f"{arg!r} is not a file, and not a run id or glob of {store} ({exc}): pass an "
                                       "existing file, a run id (0001) or a relative glob") from exc
        if not found:
            raise ReportInputError(f"no saved run matches {arg!r} under {store}: pass a run id (0001), a "
                                   "glob ('*_abc1234*'), 'MACHINE/0001' or a file path")
        if RUN_ID.match(arg) and len({p.parent for p in found}) > 1:
            raise ReportInputError(f"run id {arg} is ambiguous under {store}: "
                                   + ", ".join(str(p) for p in found)
                                   + "; pass 'MACHINE-FOLDER/" + arg + "' or a path")
        out.extend(p for p in found if p not in out)
    return out


# --- --calibration-from: a run's choice ---------------------------------------------------------------

MAX_BYTES = 32 * 2**20  # a full-matrix saved run is a few MB (traces included)
MAX_WIDTHS, MAX_WIDTH = 64, 4096
MAX_METHODS, MAX_OPTIONS, MAX_TEXT = 64, 32, 200
METHOD_RE = re.compile(r"^[a-z0-9_]{1,64}$")
OPTION_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
CANONICAL = "dflash-mini-lab/benchmark"  # report.build.SCHEMA (report stands floors above)


@dataclass(frozen=True)
class Reused:
    """A run's choice: the speculative widths it measured and, per method and width, the options it ran with."""

    source: str
    widths: tuple[int, ...]
    options: dict  # method -> {width: {option: value}}
    ranking_width: int | None = None  # the width the run ranked at (settings.chosen), one of `widths`
    size: dict | None = None  # a real target's budgeted matrix size (settings.size_plan.chosen), reused whole
    method_widths: dict | None = None  # method -> its own width (settings.chosen.method_widths), None: none recorded


def resolve_source(text: str, storage: str | Path = ".benchmarks") -> Path:
    """A file path as is; otherwise a run id or glob, as `report` resolves it, naming exactly one saved run."""
    p = Path(text).expanduser()
    if p.is_file():
        return p
    if p.exists():
        raise BadInputError(f"{text} is not a file: pass a saved run (.benchmarks/.../0001_*.json) or a benchmark.json")
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


def _method_widths(doc: Any, where: str) -> dict | None:
    """{method: its own width} (a run's `chosen.method_widths`), every field checked; None when absent."""
    if doc is None:
        return None
    if not isinstance(doc, dict) or len(doc) > MAX_METHODS:
        raise _refuse(where, f"must be an object of at most {MAX_METHODS} methods")
    for mid, w in doc.items():
        if not isinstance(mid, str) or not METHOD_RE.match(mid):
            raise _refuse(where, f"names {str(mid)[:40]!r}, not a method id")
        if isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= MAX_WIDTH:
            raise _refuse(f"{where}.{mid}", f"is {str(w)[:40]!r}, not a verify width (an integer 1..{MAX_WIDTH})")
    return dict(doc)


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
    # safeio.read_json: stat before open (a FIFO hung here forever, /dev/zero read until memory ran out), bounded
    # size, UTF-8, no NaN, no 5,000-digit integer, bounded nesting
    doc = read_json(path, "--calibration-from", BadInputError,
                    "pass a saved run (.benchmarks/.../0001_*.json) or a benchmark.json written by this lab", MAX_BYTES)
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
        own = _method_widths(chosen.get("method_widths"), f"{where}: settings.chosen.method_widths")
        options = _options(chosen.get("options", {}), f"{where}: settings.chosen.options",
                           tuple(sorted({*widths, *(own or {}).values()})))
        rw = chosen.get("ranking_width")
        if rw is not None and (isinstance(rw, bool) or not isinstance(rw, int) or rw not in widths):
            raise _refuse(f"{where}: settings.chosen.ranking_width", f"is {str(rw)[:20]!r}, not one of its widths")
        return Reused(where, widths, options, rw, _size(settings.get("size_plan"), f"{where}: settings.size_plan"),
                      own)
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
