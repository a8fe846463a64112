"""The lab's run-level performance goals, each with this run's figure (computed into benchmark.json).

The goals themselves are stated in docs/performance.md (with the 350M-only goals, which need the real config).
"""

from __future__ import annotations


def goals(doc: dict) -> list[dict]:
    """[{id, goal, figure, spread, ok}] from the canonical document's own numbers (figure None: not measured)."""
    win = doc.get("leader") or doc.get("winner") or {}  # the leader: goals hold whether or not it is resolved
    spec = {k: m for k, m in doc["methods"].items() if k != "normal"}
    refs = doc.get("references") or {}
    ub = (doc.get("upper_bound_speedup") or {}).get(str(win.get("width")))
    ratio4 = ((doc.get("verify_cost") or {}).get("ratio") or {}).get("4")
    overhead = max((r.get("overhead_fraction", 0.0) for m in spec.values() for r in m["rows"].values()), default=None)
    sp = win.get("speedup")
    out = [
        {"id": "speedup", "goal": "best method >= 2.5x over normal (paired speedup)", "figure": sp,
         "spread": win.get("speedup_iqr"), "ok": sp is not None and sp >= 2.5},
        {"id": "bound", "goal": ">= 80% of the bound (w+1)·t_dec/t_ver(w) at the best width",
         "figure": sp / ub if ub and sp else None, "spread": None, "ok": bool(ub and sp and sp / ub >= 0.8)},
        {"id": "verify_cost", "goal": "t_verify(4)/t_decode <= 1.3", "figure": ratio4, "spread": None,
         "ok": ratio4 is not None and ratio4 <= 1.3},
        {"id": "overhead", "goal": "loop overhead <= 0.05 of wall (fraction), every method and width",
         "figure": overhead, "spread": None, "ok": overhead is not None and overhead <= 0.05},
    ]
    for k in ("prompt_lookup", "assisted"):
        tps = (refs.get(k) or {}).get("tokens_per_second")
        if tps is None:
            continue
        fig = win["tokens_per_second"] / tps if win.get("tokens_per_second") and tps else None
        out.append({"id": f"vs_{k}", "goal": f"best method >= 1.5x {k.replace('_', '-')} (tok/s)", "figure": fig,
                    "spread": None, "ok": fig is not None and fig >= 1.5})
    hf = refs.get("dflash_transformers") or {}
    ours = {str(w): r for w, r in (spec.get("dflash") or {}).get("rows", {}).items()}
    if hf.get("tokens_per_second") and ours:
        # transformers' DFlash row drafts at the drafter's block size: compare with our dflash at that width
        w = str(hf.get("width") or max(ours, key=int))
        mine = (ours.get(w) or {}).get("tokens_per_second")
        fig = mine / hf["tokens_per_second"] if mine else None
        out.append({"id": "vs_dflash_transformers", "goal": f"dflash (w{w}) >= 1.3x transformers' DFlash (tok/s)",
                    "figure": fig, "spread": None, "ok": fig is not None and fig >= 1.3})
    return out
