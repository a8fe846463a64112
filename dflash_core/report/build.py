"""Saved pytest-benchmark JSON -> the canonical `benchmark.json` document (schema in docs/report-schema.md).

Every number in the canonical document comes from the saved runs' `extra_info` and stats, and the
document names the runs it merges. Runs are pooled only when they measured the same model (same target
and artifact SHA-256s) with the same workload. Malformed input is refused with an error naming the file
and field: a crash here would read as a failed exactness gate (exit 1).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import statistics
from pathlib import Path
from typing import Any

from ..bench.costmodel import unexplained_overhead
from ..errors import ReportInputError
from ..options import option
from ..runtime.device import DEVICE_RE  # the report's folder is named after the device: only a device name
from ..safeio import read_json
from ..stats.summary import median_interval, quartiles
from ..store.data import TASK_RE
from .costs import apply_cost_model
from .goals import goals
from .headline import answer, headline
from .impossible import flag_impossible
from .match import different_prompts, require_same_setup, saved_setup
from .operating import operating_points, own_widths
from .ranking import build_ranking, preliminary_noise
from .schema import check_saved

SCHEMA = "dflash-mini-lab/benchmark"
SCHEMA_VERSION = 8

ID_RE = re.compile(r"^[a-z0-9_]+$")
VERDICTS = ("exact", "tie", "diverged")
ACTIVITY_COUNTS = ("rounds", "rounds_differ", "positions", "positions_differ", "gained", "lost", "accepted",
                   "shadow_accepted")
ACTIVITY_STATUS = ("baseline", "active", "inactive")
LEG_ORDER_RE = re.compile(r"^(?=.*m)(?!.*(.).*\1)[nbm]{2,3}$")  # each leg once, the method's among them


def _is_activity(v) -> bool:
    """A case's activity block (dflash_core.bench.activity.summary): counts, the net change and a status."""
    return (isinstance(v, dict) and all(_is_int(v.get(k)) and v[k] >= 0 for k in ACTIVITY_COUNTS)
            and _is_int(v.get("net")) and v.get("status") in ACTIVITY_STATUS)


MAX_TASKS = 64  # task families of one run's prompts (prompts.json has 7; a --prompts-file at most 256 prompts)
TASK_FIELDS = {"prompts": "int", "tokens_per_target_call": "num", "acceptance_rate": "num", "speedup": "num",
               "speedup_rounds": "nums"}


def _is_tasks(v) -> bool:
    """A case's per-task block (bench.cases.task_figures): task id -> its figures, each of its kind."""
    return (isinstance(v, dict) and 0 < len(v) <= MAX_TASKS
            and all(isinstance(t, str) and TASK_RE.fullmatch(t) and isinstance(f, dict) and set(f) == set(TASK_FIELDS)
                    and all(_KINDS[kind][0](f[k]) for k, kind in TASK_FIELDS.items()) for t, f in v.items()))


def _reject_nan(obj: Any, where: str) -> None:
    if isinstance(obj, float) and not math.isfinite(obj):
        raise ReportInputError(f"{where}: non-finite number {obj!r}; re-run the benchmark (NaN is not JSON)")
    if isinstance(obj, dict):
        for k, v in obj.items():
            _reject_nan(v, f"{where}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _reject_nan(v, f"{where}[{i}]")
    elif isinstance(obj, str) and obj.startswith("UNSERIALIZABLE["):
        raise ReportInputError(f"{where}: pytest-benchmark could not serialise a value ({obj[:60]}...)")


def load_saved(path: str | Path) -> dict:
    """Read one saved pytest-benchmark JSON file strictly (UTF-8, no NaN, bounded size and nesting, lab fields
    present and typed)."""
    p = Path(path)
    doc = read_json(p, "saved run", ReportInputError, "pass a JSON file written by pytest --benchmark-autosave or "
                    "--benchmark-json")
    validate_saved(doc, str(p))
    return doc


# --- field checks: (kind, description) per extra_info key --------------------------------------------

# Bounds on saved numbers: nothing the lab measures comes near them, and beyond them the statistics overflow
# (rounds of 1e308 made the quartiles inf) or leave a float's range (a 400-digit integer).
MAX_NUMBER = 1e12
MAX_INT = 2 ** 53
MAX_ROUNDS = 20_000  # rounds of one case, pooled runs together: the bootstrap's time grows with them
MAX_WIDTH = 4096  # verify widths are block sizes (16 by default)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) <= MAX_NUMBER and v == v


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and abs(v) <= MAX_INT


_KINDS = {
    "num": (lambda v: _is_num(v) and v >= 0, "a number >= 0"),
    "int": (lambda v: _is_int(v) and v >= 0, "an integer >= 0"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "id": (lambda v: isinstance(v, str) and bool(ID_RE.match(v)), "an id of [a-z0-9_]"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "nums": (lambda v: isinstance(v, list) and len(v) <= MAX_ROUNDS and all(_is_num(x) and x >= 0 for x in v),
             f"a list of at most {MAX_ROUNDS} numbers >= 0"),
    "ints": (lambda v: isinstance(v, list) and len(v) <= MAX_ROUNDS and all(_is_int(x) and x >= 0 for x in v),
             "a list of integers >= 0"),
    "verdicts": (lambda v: isinstance(v, dict) and all(k in VERDICTS and _is_int(n) and n >= 0 for k, n in v.items()),
                 f"an object of counts keyed by {'/'.join(VERDICTS)}"),
    "obj": (lambda v: isinstance(v, dict), "an object"),
    "width": (lambda v: _is_int(v) and 0 <= v <= MAX_WIDTH, f"an integer in 0..{MAX_WIDTH}"),
    "activity": (lambda v: _is_activity(v), "an object of integer counts (" + ", ".join(ACTIVITY_COUNTS) + ") and a "
                 "status (" + "/".join(ACTIVITY_STATUS) + ")"),
    "legs": (lambda v: isinstance(v, list) and all(isinstance(x, str) and LEG_ORDER_RE.match(x) for x in v),
             "a list of leg orders (each of n, b, m at most once, m included)"),
    "ranking": (lambda v: isinstance(v, dict) and _is_int(v.get("rounds")) and _is_int(v.get("top_up_rounds")),
                "an object with rounds and top_up_rounds"),
    "tasks": (lambda v: _is_tasks(v), f"an object of at most {MAX_TASKS} task ids ([a-z][a-z0-9_]) -> "
              "{" + ", ".join(TASK_FIELDS) + "}"),
}
DECODE_FIELDS = {
    "method": "id", "width": "width", "speedup": "num", "speedup_iqr": "num", "speedup_rounds": "nums",
    "tokens_per_second": "num", "normal_tokens_per_second": "num", "tokens_per_target_call": "num",
    "acceptance_rate": "num", "accept_histogram": "ints", "per_position_acceptance": "nums",
    "guidance_work": "int", "overhead_fraction": "num", "exact": "bool", "verdicts": "verdicts",
}
DECODE_OPTIONAL = {
    "tokens_per_second_iqr": "num", "rounds": "int", "prompts": "int", "tokens_per_prompt": "int",
    "new_tokens": "int", "target_calls": "int", "draft_calls": "int", "proposed": "int", "accepted": "int",
    "target_seconds": "num", "draft_seconds": "num", "select_seconds": "num", "options": "obj", "dtype": "str",
    "drafted": "int", "acceptance_rate_drafted": "num", "activity": "activity",
    "vs_baseline_rounds": "nums", "vs_baseline": "num", "baseline": "id",  # schema 5: against dflash, same width
    "compared_rounds": "int",  # len(vs_baseline_rounds): base rounds plus the ranking's comparison-only rounds
    "leg_orders": "legs", "ranking": "ranking",  # schema 7: each round's leg order, the fixed ranking rounds
    "tasks": "tasks",  # per task family of the benchmark prompts (bench.cases.task_figures)
}
# Not carried into a row: the case's id, and cost-model figures, which the report computes from `loop_costs`
# (report/costs.py) and never takes from a saved run.
NOT_CARRIED = ("method", "device", "model_speedup", "measured_over_model", "component_costs")
REFERENCE_FIELDS = {"reference": "str", "tokens_per_second": "num", "speedup": "num", "speedup_iqr": "num",
                    "speedup_rounds": "nums", "exact": "bool", "verdicts": "verdicts"}


def _is_width_key(w: Any) -> bool:
    """A verify-cost width key: a decimal integer in 0..MAX_WIDTH (the report computes w + 1 from it)."""
    return isinstance(w, str) and w.isascii() and w.isdigit() and len(w) <= 4 and int(w) <= MAX_WIDTH


def _check(ex: dict, required: dict, optional: dict, where: str) -> None:
    for key, kind in (*required.items(), *optional.items()):
        if key not in ex:
            if key in required:
                raise ReportInputError(f"{where}: extra_info lacks {key!r}; not a DFlash Mini Lab case (re-run "
                                       "`pytest benchmarks --benchmark-autosave`)")
            continue
        ok, desc = _KINDS[kind]
        if not ok(ex[key]):
            raise ReportInputError(f"{where}: extra_info.{key} must be {desc}, not {str(ex[key])[:60]!r}")


def _require_schema_7(lab: dict, where: str) -> None:
    """Refuse a run saved before report schema 7 (no ranking rounds record, no robust noise record): its racing,
    A/A rounds and isolated costs are not read, and a rebuild without them would rank on other statistics."""
    noise = lab.get("noise") if isinstance(lab.get("noise"), dict) else {}
    if "ranking_rounds" not in lab or noise.get("figure") != "robust":
        raise ReportInputError(f"{where}: saved before report schema 7 (no ranking_rounds or robust noise record), "
                               "which this lab no longer reads; re-run the benchmark: `./lab bench`, or `pytest "
                               "benchmarks --benchmark-autosave`")
    if not (_is_num(noise.get("threshold")) and noise["threshold"] >= 0):
        raise ReportInputError(f"{where}: dflash.noise.threshold must be a number >= 0, not "
                               f"{str(noise.get('threshold'))[:60]!r}")


def _kind(b: dict) -> str:
    """test_decode / test_reference / test_verify_cost, or '' for anything else (a foreign test)."""
    return str(b.get("name", "")).split("[", 1)[0]


def validate_saved(doc: Any, where: str) -> None:
    if not isinstance(doc, dict):
        raise ReportInputError(f"{where}: top level must be an object")
    for key in ("benchmarks", "machine_info", "datetime"):
        if key not in doc:
            raise ReportInputError(f"{where}: missing {key!r}; not a pytest-benchmark saved run")
    if not isinstance(doc["benchmarks"], list) or not isinstance(doc["machine_info"], dict):
        raise ReportInputError(f"{where}: 'benchmarks' must be a list and 'machine_info' an object")
    if not isinstance(doc.get("dflash"), dict):
        raise ReportInputError(f"{where}: no 'dflash' section: a pytest-benchmark run of another project, or a "
                               "lab run without a benchmark session; pass a run of `pytest benchmarks "
                               "--benchmark-autosave`")
    _require_schema_7(doc["dflash"], where)
    _reject_nan(doc, where)
    for i, b in enumerate(doc["benchmarks"]):
        if not isinstance(b, dict):
            raise ReportInputError(f"{where}: benchmarks[{i}] must be an object")
        for key in ("name", "fullname", "stats", "extra_info"):
            if key not in b:
                raise ReportInputError(f"{where}: benchmarks[{i}] lacks {key!r}")
        if not isinstance(b["extra_info"], dict) or not isinstance(b["stats"], dict):
            raise ReportInputError(f"{where}: benchmarks[{i}] stats and extra_info must be objects")
        at, ex = f"{where}: {b['name']}", b["extra_info"]
        if "device" in ex and not (isinstance(ex["device"], str) and DEVICE_RE.match(ex["device"])):
            raise ReportInputError(f"{at}: extra_info.device {str(ex['device'])[:60]!r} is not a device name "
                                   "(cpu, cuda, cuda:N, mps); the report folder is named after it")
        kind = _kind(b)
        if kind == "test_decode":
            _check(ex, DECODE_FIELDS, DECODE_OPTIONAL, at)
            for key in ("median", "iqr", "rounds"):
                if not _is_num(b["stats"].get(key)):
                    raise ReportInputError(f"{at}: stats.{key} must be a number")
        elif kind == "test_reference":
            _check(ex, REFERENCE_FIELDS, {}, at)
        elif kind == "test_verify_cost":
            vc = ex.get("verify_cost")
            if not (isinstance(vc, dict) and isinstance(vc.get("ratio"), dict) and _is_num(vc.get("t_decode_seconds"))
                    and all(_is_num(v) and v >= 0 for v in vc["ratio"].values())
                    and all(_is_width_key(w) for w in vc["ratio"])):
                raise ReportInputError(f"{at}: extra_info.verify_cost must hold 'ratio' (width 0..{MAX_WIDTH} -> "
                                       "number >= 0) and 't_decode_seconds'")
    check_saved(doc, where)  # every other field the report reads, typed (saved.schema.json)


# --- pooling -----------------------------------------------------------------------------------------

def model_identity(doc: dict) -> dict:
    """The hashes that say which model a run measured: the target's SHA-256s, its dtype, the artifacts'."""
    lab = doc.get("dflash") if isinstance(doc.get("dflash"), dict) else {}
    tgt = lab.get("target") if isinstance(lab.get("target"), dict) else {}  # a saved run is hostile until checked
    prov = lab.get("provenance") if isinstance(lab.get("provenance"), dict) else {}
    arts = prov.get("artifacts") if isinstance(prov.get("artifacts"), dict) else {}
    files = arts.get("files") if isinstance(arts.get("files"), dict) else {}
    ident = {
        "target": {k: v for k, v in sorted(tgt.items()) if "sha256" in k},
        "dtype": tgt.get("dtype"),
        "artifacts": {str(k): (v.get("sha256") if isinstance(v, dict) else v) for k, v in sorted(files.items())},
    }
    return ident


def identity_hash(ident: dict) -> str:
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()


WORKLOAD = ("tokens", "prompt_limit", "smoke")


def check_poolable(docs: list[dict], sources: list[str]) -> None:
    """Refuse to pool runs of different models, workloads or chosen settings (widths and calibrated options,
    report.match): the error names both hashes / settings and the fix."""
    if len(docs) < 2:
        return
    first = model_identity(docs[0])
    if not first["target"] or not first["artifacts"]:
        raise ReportInputError(f"{sources[0]}: no target/artifact SHA-256s in its 'dflash' section, so it can't be "
                               "pooled with other runs; build its report alone")
    h0 = identity_hash(first)
    w0 = {k: (docs[0]["dflash"].get("settings") or {}).get(k) for k in WORKLOAD}
    p0 = _prompts_section(docs[0]["dflash"].get("prompts"))
    for doc, src in zip(docs[1:], sources[1:]):
        h = identity_hash(model_identity(doc))
        if h != h0:
            raise ReportInputError(f"{sources[0]} and {src} measured different models (model hash {h0[:16]} vs "
                                   f"{h[:16]}: target/artifact SHA-256s or dtype differ); a report pools runs of one "
                                   "model only: build one report per model")
        w = {k: (doc["dflash"].get("settings") or {}).get(k) for k in WORKLOAD}
        if different_prompts(p0, _prompts_section(doc["dflash"].get("prompts"))):
            raise ReportInputError(f"{sources[0]} and {src} benchmarked different prompts (their prompts' SHA-256 "
                                   "differ: another prompt set or --prompts-file); pool only runs of the same prompts")
        if w != w0:
            raise ReportInputError(f"{sources[0]} and {src} ran different workloads ({w0} vs {w}); pool only runs "
                                   "with the same --bench-tokens, --bench-prompts and --smoke")
        require_same_setup(saved_setup(docs[0]), saved_setup(doc), (sources[0], src),
                           "a report pools the rounds of the same cases only")


def run_identity(doc: dict) -> str:
    """What names one benchmark run: pytest-benchmark's `datetime` (microseconds), `machine_info` and `commit_info`,
    which a session writes once into every file it saves (the autosave and --benchmark-json alike)."""
    return identity_hash({k: doc.get(k) for k in ("datetime", "machine_info", "commit_info")})


def distinct_runs(docs: list[dict], sources: list[str]) -> tuple[list[dict], list[str], list[str]]:
    """(the runs, their sources, one note per repeated run): a run given several times (copies of one file, or files
    with one run identity) is kept once, at its first source. Why: pooling a copy as an independent run doubles
    its rounds without new information, so the intervals shrink on no evidence (200 copies of one run named a
    single winner "with 95 % confidence"). Two files of one identity that differ are refused: one was edited,
    and which one measured the run cannot be told."""
    first: dict[str, int] = {}
    copies: dict[int, list[str]] = {}
    for i, (d, s) in enumerate(zip(docs, sources)):
        k = run_identity(d)
        if k not in first:
            first[k] = i
            continue
        j = first[k]
        if json.dumps(d, sort_keys=True) != json.dumps(docs[j], sort_keys=True):
            raise ReportInputError(f"{sources[j]} and {s} claim the same run (same datetime, machine_info and "
                                   "commit_info) but differ: one of them was edited; pass only the run as saved")
        copies.setdefault(j, []).append(s)
    keep = sorted(first.values())
    notes = [f"{sources[j]} was given {1 + len(c)} times (copies of one run: {', '.join(c[:3])}"
             f"{f' and {len(c) - 3} more' if len(c) > 3 else ''}): pooled once" for j, c in sorted(copies.items())]
    return [docs[i] for i in keep], [sources[i] for i in keep], notes


def _pool_rows(rows: list[dict]) -> dict:
    """One row from the same case measured in several runs: paired speedup rounds are concatenated."""
    out = dict(rows[0])
    if len(rows) == 1:
        sp = out["speedup_rounds"]
    else:
        sp = [x for r in rows for x in r["speedup_rounds"]]
        if len(sp) > MAX_ROUNDS or sum(len(r.get("vs_baseline_rounds") or []) for r in rows) > MAX_ROUNDS:
            raise ReportInputError(f"pooling these runs gives a case more than {MAX_ROUNDS} rounds, more than the "
                                   "report's bootstrap takes: pool fewer runs")
        q1, med, q3 = quartiles(sp)
        out.update(speedup=med, speedup_iqr=q3 - q1, speedup_rounds=sp,
                   tokens_per_second=statistics.median(r["tokens_per_second"] for r in rows),
                   exact=all(r["exact"] for r in rows),
                   verdicts={k: sum(r["verdicts"].get(k, 0) for r in rows) for k in VERDICTS
                             if any(k in r["verdicts"] for r in rows)})
        if all(r.get("vs_baseline_rounds") for r in rows):
            vs = [x for r in rows for x in r["vs_baseline_rounds"]]
            out.update(vs_baseline_rounds=vs, vs_baseline=statistics.median(vs), compared_rounds=len(vs))
        if all("normal_tokens_per_second" in r for r in rows):
            out["normal_tokens_per_second"] = statistics.median(r["normal_tokens_per_second"] for r in rows)
        if all("rounds" in r for r in rows):
            out["rounds"] = sum(r["rounds"] for r in rows)
        out["tokens_per_second_runs"] = [r["tokens_per_second"] for r in rows]
    if len(rows) > 1 and "tasks" in out:  # pooled per task as the case's rounds are; dropped unless every run has them
        if all(isinstance(r.get("tasks"), dict) and set(r["tasks"]) == set(rows[0]["tasks"]) for r in rows):
            out["tasks"] = {t: _pool_task(f, [x for r in rows for x in r["tasks"][t]["speedup_rounds"]])
                            for t, f in rows[0]["tasks"].items()}
        else:
            out.pop("tasks")
    if len(rows) > 1 and all(r.get("leg_orders") for r in rows):
        out["leg_orders"] = [x for r in rows for x in r["leg_orders"]]
    q1, _, q3 = quartiles(sp) if sp else (out["speedup"],) * 3
    out["speedup_q1"], out["speedup_q3"] = q1, q3
    iv = median_interval(sp) if sp else {"lo": out["speedup"], "hi": out["speedup"], "label": "no rounds",
                                          "coverage": 0.0}
    out["speedup_ci"], out["speedup_ci_label"], out["speedup_ci_coverage"] = [iv["lo"], iv["hi"]], iv["label"], \
        iv["coverage"]
    return out


SHA_RE = re.compile(r"[0-9a-f]{64}")


def _prompts_section(v: Any) -> dict:
    """The saved run's prompt provenance (bench.state `prompts`), kept only as plain strings, numbers and task ids."""
    if not isinstance(v, dict):
        return {}
    out = {k: v[k] for k in ("source", "file") if isinstance(v.get(k), str)}
    out |= {k: v[k] for k in ("prompts", "trajectories") if _is_int(v.get(k))}
    if isinstance(v.get("sha256"), str) and SHA_RE.fullmatch(v["sha256"]):
        out["sha256"] = v["sha256"]
    tasks = v.get("tasks")
    if isinstance(tasks, list) and len(tasks) <= 4096 and all(isinstance(t, str) and TASK_RE.fullmatch(t)
                                                              for t in tasks):
        out["tasks"] = list(tasks)
    return out


def _pool_task(first: dict, rounds: list[float]) -> dict:
    """A task's figures over pooled runs: its speedup rounds concatenated, their median; counts from the first."""
    return {**first, "speedup_rounds": rounds, "speedup": quartiles(rounds)[1] if rounds else first["speedup"]}


def _setting(lab: dict, key: str, name: str) -> float:
    """A run setting (a fraction >= 0); saved runs that predate it get today's default (the options table's)."""
    v = (lab.get("settings") or {}).get(key) if isinstance(lab.get("settings"), dict) else None
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
    return float(v) if ok else option(name).default


# --- the canonical document ----------------------------------------------------------------------------

def _runs(docs: list[dict], sources: list[str]) -> list[dict]:
    def commit(d):
        ci = d.get("commit_info") if isinstance(d.get("commit_info"), dict) else {}
        return ci.get("id"), ci.get("dirty")

    return [{"source": s, "datetime": d.get("datetime"), "commit": commit(d)[0], "dirty": commit(d)[1],
             "pytest_benchmark": d.get("version"),
             "machine": {k: d["machine_info"].get(k) for k in ("node", "machine", "processor", "system",
                                                                "python_version")},
             "cpu": (d["machine_info"].get("cpu") or {}).get("brand_raw")
             if isinstance(d["machine_info"].get("cpu"), dict) else None,
             "accelerator": d["machine_info"].get("accelerator"),
             "model_sha256": identity_hash(model_identity(d))} for d, s in zip(docs, sources)]


def _best(m: dict, tuned: dict, mid: str, own: dict | None = None) -> dict:
    """The shown width: the one chosen on calibration prompts when `--tune` chose one, else the method's own width
    (the width model's choice on calibration decodes, `settings.method_widths`) when it was measured, else the
    maximum of the benchmark medians, labelled post-hoc (a choice made on the benchmark data it is reported on)."""
    rows = m["rows"]
    tw = tuned.get(mid)
    if isinstance(tw, dict):  # the bench writes {"selected": width, "table": ..., "objective": ...}
        tw = tw.get("selected")
    ow = (own or {}).get(mid)
    if isinstance(tw, int) and not isinstance(tw, bool) and str(tw) in rows:
        w, selection = str(tw), "calibration"
    elif ow is not None and str(ow) in rows:
        w, selection = str(ow), "own width"
    else:
        w = max(rows, key=lambda k: (rows[k]["speedup"], -int(k)))
        selection = "post-hoc" if len(rows) > 1 else "only width"
    r = rows[w]
    extra = {k: r[k] for k in ("activity", "acceptance_rate_drafted", "rounds", "tasks") if k in r}
    return {**extra, "width": int(w), "selection": selection, "speedup": r["speedup"], "speedup_iqr": r["speedup_iqr"],
            "speedup_q1": r["speedup_q1"], "speedup_q3": r["speedup_q3"], "speedup_ci": r["speedup_ci"],
            "speedup_ci_label": r["speedup_ci_label"],
            "rank_group": None, "tokens_per_second": r["tokens_per_second"],
            "tokens_per_target_call": r["tokens_per_target_call"], "acceptance_rate": r["acceptance_rate"],
            **{k: r.get(k) for k in ("model_speedup", "measured_over_model", "model_component")},
            "unexplained_overhead": bool(r.get("unexplained_overhead", False))}


def flag_overhead(methods: dict, noise: dict) -> None:
    """Each row's `unexplained_overhead`: measured/model outside [0.9, 1.1] on a quiet machine (the run's noise
    figure below the quiet level, costmodel.unexplained_overhead); rows of runs without a cost model are never
    flagged."""
    for m in methods.values():
        for r in m["rows"].values():
            r["unexplained_overhead"] = unexplained_overhead(r.get("measured_over_model"), noise.get("sigma"),
                                                             noise.get("threshold", 0.03))


def method_activity(mid: str, rows: dict, why: Any) -> dict | None:
    """A method's activity over every width it was measured at: `no draft` (normal), `baseline` (dflash),
    `active` when some width's draft differed from dflash's, `inactive` when none did (with the registry's
    one-sentence `why`); None when no row carries an activity block (runs that predate schema 4)."""
    if mid == "normal":
        return {"status": "no draft", "why": ""}
    acts = [r["activity"] for r in rows.values() if isinstance(r.get("activity"), dict)]
    if not acts:
        return None
    if any(a["status"] == "baseline" for a in acts):
        status = "baseline"
    else:
        status = "active" if any(a["rounds_differ"] for a in acts) else "inactive"
    return {"status": status, "why": str(why or "") if status == "inactive" else "",
            "rounds_differ": sum(a["rounds_differ"] for a in acts), "rounds": sum(a["rounds"] for a in acts)}


def build_report(docs: list[dict], sources: list[str]) -> dict:
    """Pool saved runs of ONE device and ONE model into the canonical document."""
    if not docs:
        raise ReportInputError("no saved runs given")
    docs, sources, repeated = distinct_runs(docs, sources)
    devices = sorted({d.split(":")[0] for doc in docs for b in doc["benchmarks"]
                      if (d := b["extra_info"].get("device"))})
    if len(devices) > 1:
        raise ReportInputError(f"saved runs mix devices {devices}: a ranking compares one device; build one "
                               "report per device (pass only the runs of one device)")
    check_poolable(docs, sources)
    device = devices[0] if devices else "cpu"
    cases: dict[tuple[str, str], list[dict]] = {}
    refs: dict[str, list[dict]] = {}
    curves: list[dict] = []
    limitations: list[str] = list(repeated)
    for doc in docs:
        for b in doc["benchmarks"]:
            ex, kind = b["extra_info"], _kind(b)
            if kind == "test_decode":
                row = {k: ex[k] for k in ex if k not in NOT_CARRIED}
                row["benchmark"] = {"fullname": b["fullname"], "median_seconds": b["stats"]["median"],
                                    "iqr_seconds": b["stats"]["iqr"], "rounds": b["stats"]["rounds"]}
                cases.setdefault((ex["method"], str(ex["width"])), []).append(row)
            elif kind == "test_reference":
                refs.setdefault(ex["reference"], []).append({k: v for k, v in ex.items() if k != "device"})
            elif kind == "test_verify_cost":
                curves.append(ex["verify_cost"])
    if not cases:
        raise ReportInputError(f"{', '.join(sources)}: no test_decode cases (no lab rows): nothing to report; pass a "
                               "run of `pytest benchmarks --benchmark-autosave`")
    lab = docs[0]["dflash"]
    info = lab.get("methods") if isinstance(lab.get("methods"), dict) else {}
    tuned = lab.get("tuned_widths") if isinstance(lab.get("tuned_widths"), dict) else {}
    methods: dict[str, dict] = {}
    for (mid, w), rows in cases.items():
        methods.setdefault(mid, {"rows": {}})["rows"][w] = _pool_rows(rows)
    lab_settings = lab.get("settings") if isinstance(lab.get("settings"), dict) else {}
    costs = apply_cost_model(methods, lab_settings, curves)
    own = own_widths(lab_settings)
    references = {k: _pool_rows(v) for k, v in refs.items()}
    threshold = float(lab["noise"]["threshold"])
    impossible = flag_impossible(methods, costs["upper_bound_speedup"], references,
                                 preliminary_noise(methods, lab_settings, threshold), threshold)
    for mid, m in methods.items():
        meta = info.get(mid) if isinstance(info.get(mid), dict) else {}
        m.update({k: meta.get(k) for k in ("index", "label", "mechanism", "complexity", "stages")})
        if not _is_int(m["index"]):
            m["index"] = 0
        m["best"] = _best(m, tuned, mid, own)
        m["activity"] = method_activity(mid, m["rows"], meta.get("why_inactive"))
        m["exact"] = all(r["exact"] for r in m["rows"].values())
    base_rows = (methods.get("dflash") or {}).get("rows") or {}
    for mid, m in methods.items():  # tau against dflash's own decode at the width shown (activity's other half)
        if mid != "normal":
            d = base_rows.get(str(m["best"]["width"]))
            m["best"]["tau_minus_dflash"] = (m["best"]["tokens_per_target_call"] - d["tokens_per_target_call"]
                                             if d else None)
    settings = dict(lab.get("settings") or {}) if isinstance(lab.get("settings"), dict) else {}
    ranked = build_ranking(methods, settings, _setting(lab, "resolution", "resolution"), threshold, limitations)
    flag_overhead(methods, ranked["noise"])
    for m in methods.values():  # the width shown carries its row's overhead flag
        m["best"]["unexplained_overhead"] = m["rows"][str(m["best"]["width"])]["unexplained_overhead"]
    groups, rk = ranked["rank_groups"], ranked["ranking"]
    top = ranked["leader"]
    leader = {"method": top, **methods[top]["best"]} if top else None
    # A single winner only when the selection names one (MCB: faster than every other by more than r, quiet run)
    winner = {"method": rk["winner"], **methods[rk["winner"]]["best"]} if rk["winner"] else None
    failures = [f"{mid}-w{w}" for mid, m in methods.items() for w, r in m["rows"].items() if not r["exact"]]
    failures += [f"reference:{k}" for k, r in references.items() if not r.get("exact", True)]
    settings["widths"] = sorted({int(w) for mid, m in methods.items() if mid != "normal" for w in m["rows"]})

    def section(key):
        v = lab.get(key)
        return v if isinstance(v, dict) else {}

    doc = {
        "schema": SCHEMA, "schema_version": SCHEMA_VERSION, "device": device,
        "runs": _runs(docs, sources), "settings": settings, "target": section("target"),
        "provenance": section("provenance"), "calibration": section("calibration"), "traces": section("traces"),
        "token_text": section("token_text"),
        "trace_prompt": lab.get("trace_prompt") if isinstance(lab.get("trace_prompt"), str) else None,
        "prompts": _prompts_section(lab.get("prompts")),
        "methods": dict(sorted(methods.items(), key=lambda kv: (kv[1]["index"], kv[0]))),
        "references": references, "verify_cost": costs["verify_cost"],
        "upper_bound_speedup": costs["upper_bound_speedup"],
        "exactness": {"all_exact": not failures, "failures": failures},
        "rank_groups": groups, "ranking": rk, "leader": leader, "winner": winner, "noise": ranked["noise"],
        "position_effect": ranked["position_effect"], "impossible": impossible,
        "ranking_rounds": lab.get("ranking_rounds") if isinstance(lab.get("ranking_rounds"), dict) else None,
        "cost_model": ({**section("cost_model"), "fit": costs["cost_fit"]}
                       if section("cost_model") or costs["cost_fit"] else None), "limitations": limitations,
        "operating_points": operating_points(methods, lab_settings),
    }
    if impossible["count"]:
        cases = sorted({f["case"] for f in impossible["rounds"]})
        limitations.append(f"{impossible['count']} round(s) beyond what the run can physically reach "
                           f"({', '.join(cases)}): flagged, shown under 'Impossible rounds' and left out of every "
                           "statistic that names groups")
    doc["goals"] = goals(doc)
    doc["headline"] = headline(doc)
    doc["answer"] = answer(doc)
    return doc
