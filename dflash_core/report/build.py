"""Saved pytest-benchmark JSON -> the canonical `benchmark.json` document (schema in docs/report-schema.md).

Every number in the canonical document comes from the saved runs' `extra_info` and stats, and the
document names the runs it merges. Malformed input is refused with an error naming the file and field.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ..errors import DFlashError

SCHEMA = "dflash-mini-lab/benchmark"
SCHEMA_VERSION = 1


class ReportInputError(DFlashError):
    """A saved benchmark file cannot be turned into a report."""


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
    """Read one saved pytest-benchmark JSON file strictly (no NaN, required fields present)."""
    p = Path(path)
    try:
        text = p.read_text("utf-8")
    except OSError as exc:
        raise ReportInputError(f"cannot read {p}: {exc}") from exc

    def no_const(c):
        raise ReportInputError(f"{p}: non-finite number {c} in JSON; re-run the benchmark")

    try:
        doc = json.loads(text, parse_constant=no_const)
    except ValueError as exc:
        if isinstance(exc, ReportInputError):
            raise
        raise ReportInputError(f"{p} is not valid JSON ({exc}); pass a file written by "
                               "pytest --benchmark-autosave or --benchmark-json") from exc
    validate_saved(doc, str(p))
    return doc


def validate_saved(doc: Any, where: str) -> None:
    if not isinstance(doc, dict):
        raise ReportInputError(f"{where}: top level must be an object")
    for key in ("benchmarks", "machine_info", "datetime"):
        if key not in doc:
            raise ReportInputError(f"{where}: missing {key!r}; not a pytest-benchmark saved run")
    if not isinstance(doc["benchmarks"], list):
        raise ReportInputError(f"{where}: 'benchmarks' must be a list")
    for i, b in enumerate(doc["benchmarks"]):
        for key in ("name", "fullname", "stats", "extra_info"):
            if key not in b:
                raise ReportInputError(f"{where}: benchmarks[{i}] lacks {key!r}")
    _reject_nan(doc, where)


def _device_of(b: dict) -> str | None:
    ex = b.get("extra_info", {})
    return ex.get("device")


def build_report(docs: list[dict], sources: list[str]) -> dict:
    """Merge saved runs of ONE device into the canonical document."""
    if not docs:
        raise ReportInputError("no saved runs given")
    devices = sorted({d for doc in docs for b in doc["benchmarks"] if (d := _device_of(b))})
    if len(devices) > 1:
        raise ReportInputError(f"saved runs mix devices {devices}: a ranking compares one device; build one "
                               "report per device (pass only the runs of one device)")
    device = devices[0] if devices else "cpu"
    methods: dict[str, dict] = {}
    references: dict[str, dict] = {}
    verify_cost = None
    for doc in docs:
        for b in doc["benchmarks"]:
            ex = b["extra_info"]
            name = b["name"]
            if name.startswith("test_decode"):
                m = ex["method"]
                row = {k: ex[k] for k in ex if k not in ("method", "device")}
                row["benchmark"] = {"fullname": b["fullname"], "median_seconds": b["stats"]["median"],
                                    "iqr_seconds": b["stats"]["iqr"], "rounds": b["stats"]["rounds"]}
                methods.setdefault(m, {"rows": {}})["rows"][str(ex["width"])] = row
            elif name.startswith("test_reference"):
                references[ex["reference"]] = {k: v for k, v in ex.items() if k != "device"}
            elif name.startswith("test_verify_cost"):
                verify_cost = ex["verify_cost"]
    lab = next((doc.get("dflash") for doc in reversed(docs) if doc.get("dflash")), {}) or {}
    info = lab.get("methods", {})
    for mid, m in methods.items():
        meta = info.get(mid, {})
        m.update({k: meta.get(k) for k in ("index", "label", "mechanism", "complexity", "stages")})
        rows = m["rows"]
        best_w = max(rows, key=lambda w: (rows[w]["speedup"], -int(w)))
        m["best"] = {"width": int(best_w), "speedup": rows[best_w]["speedup"],
                     "speedup_iqr": rows[best_w]["speedup_iqr"], "tokens_per_second": rows[best_w]["tokens_per_second"],
                     "tokens_per_target_call": rows[best_w]["tokens_per_target_call"],
                     "acceptance_rate": rows[best_w]["acceptance_rate"]}
        m["exact"] = all(r["exact"] for r in rows.values())
    spec = [(mid, m) for mid, m in methods.items() if mid != "normal"]
    winner = max(spec, key=lambda kv: kv[1]["best"]["speedup"]) if spec else None
    failures = [f"{mid}-w{w}" for mid, m in methods.items() for w, r in m["rows"].items() if not r["exact"]]
    failures += [f"reference:{k}" for k, r in references.items() if not r.get("exact", True)]
    bounds = {}
    if verify_cost and "normal" in methods:
        for w, ratio in verify_cost["ratio"].items():
            bounds[w] = (int(w) + 1) / ratio  # (w+1) t_decode / t_verify(w), drafter cost excluded
    return {
        "schema": SCHEMA, "schema_version": SCHEMA_VERSION, "device": device,
        "runs": [{"source": s, "datetime": d.get("datetime"), "commit": d.get("commit_info", {}).get("id"),
                  "dirty": d.get("commit_info", {}).get("dirty"), "pytest_benchmark": d.get("version"),
                  "machine": {k: d["machine_info"].get(k) for k in ("node", "machine", "processor", "system",
                                                                     "python_version")},
                  "cpu": (d["machine_info"].get("cpu") or {}).get("brand_raw"),
                  "accelerator": d["machine_info"].get("accelerator")} for d, s in zip(docs, sources)],
        "settings": lab.get("settings", {}), "target": lab.get("target", {}), "provenance": lab.get("provenance", {}),
        "calibration": lab.get("calibration", {}), "traces": lab.get("traces", {}),
        "token_text": lab.get("token_text", {}),
        "methods": dict(sorted(methods.items(), key=lambda kv: (kv[1].get("index") or 0, kv[0]))),
        "references": references, "verify_cost": verify_cost, "upper_bound_speedup": bounds,
        "exactness": {"all_exact": not failures, "failures": failures},
        "winner": {"method": winner[0], **winner[1]["best"]} if winner else None,
    }
