"""The report's finding as one sentence: what the run can tell, with its guarantee, its noise and the model it
was measured on (docs/design.md §10: every figure names its model). Both pages show it first."""

from __future__ import annotations

import math


def _pct(x) -> str:
    return f"{100 * x:.1f} %" if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else "?"


def model_label(doc: dict) -> str:
    """'<target name> (model <first 12 hex of the model hash>)': the hash of the target's and artifacts' SHA-256s
    that runs are pooled on (`runs[].model_sha256`)."""
    runs = doc.get("runs") or [{}]
    h = str(runs[0].get("model_sha256") or "")[:12] or "unknown"
    return f"{(doc.get('target') or {}).get('name') or 'an unnamed target'} (model {h})"


def _names(ids) -> str:
    return "{" + ", ".join(ids) + "}"


def headline(doc: dict) -> str:
    """One sentence: "On <target> (model <hash>), the fastest exact methods at width W are {...} (95 %, resolution
    r; machine noise n %)", a single winner only when the ranking names one, or plainly that this run cannot tell."""
    rk = doc.get("ranking") or {}
    noise = doc.get("noise") or {}
    on = f"On {model_label(doc)}"
    if not doc.get("exactness", {}).get("all_exact", True):
        return (f"{on}, the exactness gate FAILED ({', '.join(doc['exactness']['failures'])}): this run ranks "
                "nothing until every method reproduces greedy.")
    g1 = list(rk.get("g1") or [])
    if not g1:
        return f"{on}, this run measured no speculative method: it ranks nothing."
    conf = f"{100 * float(rk.get('confidence') or 0.95):.0f} %"
    r = _pct(rk.get("resolution_effective"))
    where = f"at width {rk['width']}" if rk.get("width") else "by their best speedups over greedy"
    sigma = noise.get("sigma")
    tail = f"machine noise {_pct(sigma)}" if sigma is not None else "machine noise not measured"
    total = len(rk.get("rounds") or {}) or len(g1)
    if noise.get("noisy"):
        return (f"{on}, this run cannot name the fastest exact method: the machine was noisy ({tail} > threshold "
                f"{_pct(noise.get('threshold'))}); with {conf} confidence the fastest {where} is one of "
                f"{_names(g1)} (resolution {r}).")
    if rk.get("winner"):
        return (f"{on}, the fastest exact method {where} is {rk['winner']}, faster than every other method by more "
                f"than {r} ({conf}; {tail}).")
    if len(g1) == 1:
        return (f"{on}, the fastest exact method {where} is {g1[0]}, though its lead over the next may be below "
                f"{r} ({conf}; {tail}).")
    if len(g1) == total and total > 1:
        return (f"{on}, this run cannot tell the {total} methods apart {where}: every one may be the fastest "
                f"({conf}, resolution {r}; {tail}).")
    return f"{on}, the fastest exact methods {where} are {_names(g1)} ({conf}, resolution {r}; {tail})."
