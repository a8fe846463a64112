"""The comparison of two runs as data: per case, the change the gate judged (its statistic, its joint interval and
rounds: report.gate.judge, stats.change), tokens per target call, and the gate's verdict and reasons, so the page
and the gate never disagree.

`python -m dflash_core.report compare BASE NEW --out DIR` writes it as DIR/compare.json and DIR/compare.html.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..store.artifacts import write_atomic
from .compare_page import render_compare
from .gate import EXIT_CODES, STATISTIC_TEXT, GateConfig, RunSupport, counts, judge

COMPARE_SCHEMA = "dflash-mini-lab/compare"
COMPARE_VERSION = 2  # 2: the change is the gate's (stats.change: the ranking's statistic, a joint interval)


def _side(row: dict | None) -> dict | None:
    if row is None:
        return None
    rounds = row.get("speedup_rounds") if isinstance(row.get("speedup_rounds"), list) else [row["speedup"]]
    return {"speedup": row["speedup"], "speedup_ci": row.get("speedup_ci"),
            "speedup_ci_label": row.get("speedup_ci_label"), "speedup_q1": row.get("speedup_q1"),
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
            ch = v.change or {}
            change = {"statistic": ch.get("statistic"), "statistic_text": STATISTIC_TEXT.get(ch.get("statistic")),
                      "ratio": ch.get("ratio"), "ratio_ci": ch.get("ci"), "rounds": ch.get("rounds"),
                      "tokens_per_target_call_delta": n["tokens_per_target_call"] - b["tokens_per_target_call"]}
        rows.append({"case": v.case, "method": v.method, "width": int(v.width), "base": _side(b), "new": _side(n),
                     "change": change, "verdict": v.verdict, "reasons": list(v.reasons)})
    return {"schema": COMPARE_SCHEMA, "schema_version": COMPARE_VERSION, "base": names[0], "new": names[1],
            "device": base.get("device"), "verdict": result.verdict, "exit_code": result.exit_code,
            "counts": counts(result.rows),
            "smoke": any((d.get("settings") or {}).get("smoke") is True for d in (base, new)),
            "exit_codes": EXIT_CODES, "exactness_failures": result.exactness,
            "runs": {"base": _support(result.base), "new": _support(result.new)},
            "config": {"speedup_drop": cfg.speedup_drop, "tau_tolerance": cfg.tau_tolerance,
                       "min_rounds": cfg.min_rounds, "confidence": cfg.confidence},
            "comparison": result.comparison,
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
