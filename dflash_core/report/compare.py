"""The comparison of two runs as data: per case, the change in speedup and tokens per target call with
intervals, and the gate's verdict and reasons (report.gate.judge), so the page and the gate never disagree.

`python -m dflash_core.report compare BASE NEW --out DIR` writes it as DIR/compare.json and DIR/compare.html.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..store.artifacts import write_atomic
from .compare_page import render_compare
from .gate import EXIT_CODES, GateConfig, RunSupport, judge

COMPARE_SCHEMA = "dflash-mini-lab/compare"
COMPARE_VERSION = 1
RESAMPLES, SEED, CONFIDENCE = 4000, 0, 0.95


def ratio_ci(base: list[float], new: list[float]) -> list[float] | None:
    """95 % percentile-bootstrap interval of median(NEW) / median(BASE), each run resampled on its own (the two
    runs are independent); None when either has fewer than two rounds (no spread was measured). Seeded, so a
    page rebuilt from the same runs shows the same interval."""
    if len(base) < 2 or len(new) < 2:
        return None
    rng = np.random.default_rng(SEED)
    b, n = np.asarray(base, float), np.asarray(new, float)
    mb = np.median(b[rng.integers(0, b.size, (RESAMPLES, b.size))], axis=1)
    mn = np.median(n[rng.integers(0, n.size, (RESAMPLES, n.size))], axis=1)
    ok = mb > 0
    if not ok.any():
        return None
    alpha = (1 - CONFIDENCE) / 2
    lo, hi = np.quantile(mn[ok] / mb[ok], [alpha, 1 - alpha])
    return [float(lo), float(hi)]


def _side(row: dict | None) -> dict | None:
    if row is None:
        return None
    rounds = row.get("speedup_rounds") if isinstance(row.get("speedup_rounds"), list) else [row["speedup"]]
    return {"speedup": row["speedup"], "speedup_ci": row.get("speedup_ci"), "speedup_q1": row.get("speedup_q1"),
            "speedup_q3": row.get("speedup_q3"), "rounds": len(rounds),
            "tokens_per_target_call": row["tokens_per_target_call"], "exact": row["exact"],
            "options": row.get("options") or {}}


def _support(s: RunSupport) -> dict:
    return {"name": s.name, "noise_spread": s.spread, "noise_threshold": s.threshold, "noisy": s.noisy,
            "rounds_min": s.rounds[0], "rounds_max": s.rounds[1], "line": s.line()}


def compare(base: dict, new: dict, cfg: GateConfig | None = None, names: tuple[str, str] = ("BASE", "NEW")) -> dict:
    """The comparison document: both runs' support, the gate's overall verdict, and one row per case of BASE."""
    cfg = cfg or GateConfig()
    result = judge(base, new, cfg, names)
    rows = []
    for v in result.rows:
        b = base["methods"][v.method]["rows"][v.width]
        n = (new["methods"].get(v.method) or {}).get("rows", {}).get(v.width)
        change = None
        if n is not None:
            br = b.get("speedup_rounds") or [b["speedup"]]
            nr = n.get("speedup_rounds") or [n["speedup"]]
            change = {"speedup_ratio": n["speedup"] / b["speedup"] if b["speedup"] > 0 else None,
                      "speedup_ratio_ci": ratio_ci(br, nr),
                      "tokens_per_target_call_delta": n["tokens_per_target_call"] - b["tokens_per_target_call"]}
        rows.append({"case": v.case, "method": v.method, "width": int(v.width), "base": _side(b), "new": _side(n),
                     "change": change, "verdict": v.verdict, "reasons": list(v.reasons)})
    return {"schema": COMPARE_SCHEMA, "schema_version": COMPARE_VERSION, "base": names[0], "new": names[1],
            "device": base.get("device"), "verdict": result.verdict, "exit_code": result.exit_code,
            "exit_codes": EXIT_CODES, "exactness_failures": result.exactness,
            "runs": {"base": _support(result.base), "new": _support(result.new)},
            "config": {"speedup_drop": cfg.speedup_drop, "tau_tolerance": cfg.tau_tolerance,
                       "min_rounds": cfg.min_rounds},
            "rows": rows}


def write_compare(doc: dict, out: str | Path) -> Path:
    """DIR/compare.json and DIR/compare.html, each rendered in full first and written atomically."""
    out = Path(out)
    files = {"compare.json": (json.dumps(doc, indent=2, sort_keys=True, allow_nan=False) + "\n").encode(),
             "compare.html": render_compare(doc).encode("utf-8")}
    out.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        write_atomic(out / name, data)
    return out
