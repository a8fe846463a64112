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


def _signed(x) -> str:
    return f"{100 * x:+.1f} %" if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else "?"


def _noise_clause(noise: dict, lead: dict | None, named: bool) -> str:
    """Whether the machine's noise could change the verdict: the noise figure, its upper limit, and what the verdict
    would be with the noise at that limit (`ranking.lead.noise_could_change`)."""
    sigma = noise.get("sigma")
    if sigma is None:
        return "the machine's noise was not measured"
    ci = noise.get("ci") or [None, None]
    fig = f"the machine's noise ({_pct(sigma)}, up to {_pct(ci[1])}"
    fig += f", above the {_pct(noise.get('threshold'))} of a quiet machine)" if noise.get("noisy") else ")"
    if not lead:
        return fig + " cannot be judged against a lead"
    could = bool(lead.get("noise_could_change"))
    if named:
        return fig + (" could undo it" if could else " could not change it")
    return fig + (" could turn it into a named winner" if could else " keeps it below a named winner")


def headline(doc: dict) -> str:
    """One sentence: on <target> (model <hash>), who leads at the ranking width, by how much over the next with the
    joint interval, at what confidence, whether it is named the fastest (its lead beyond the noise-widened
    resolution r) or which methods may still be the fastest, and whether the machine's noise could change that."""
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
    lead = rk.get("lead") if isinstance(rk.get("lead"), dict) else None
    total = len(rk.get("rounds") or {}) or len(g1)
    if total < 2 or lead is None:
        return (f"{on}, {g1[0]} is the only exact speculative method ranked {where} (nothing to compare it with; "
                f"{_noise_clause(noise, None, False)}).")
    leader = rk.get("winner") or g1[0]
    ahead = (f"{leader} leads {where} by {_signed(lead.get('estimate'))} over the next ({lead.get('over')}; joint "
             f"{conf} interval {_signed(lead.get('lo'))} to {_signed(lead.get('hi'))})")
    if rk.get("winner"):
        verdict = (f"named the fastest exact method with {conf} confidence because that lead exceeds the "
                   f"noise-widened resolution {r}")
    elif len(g1) == 1:
        verdict = (f"the only method that may be the fastest with {conf} confidence, though its lead may be below "
                   f"the noise-widened resolution {r}")
    elif len(g1) == total:
        verdict = f"but with {conf} confidence any of the {total} methods may be the fastest (resolution {r})"
    else:
        verdict = f"but with {conf} confidence the fastest is one of {_names(g1)} (resolution {r})"
    sep = ", " if verdict.startswith("but") else ": "
    return f"{on}, {ahead}{sep}{verdict}; {_noise_clause(noise, lead, bool(rk.get('winner')))}."
