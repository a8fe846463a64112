"""The report's cost model (bench/costmodel.py) from the saved loop timings: the verify curve fitted over every
case's in-loop verify rounds, each row's model speedup and measured/model ratio, the component a ratio outside
the band points at, the verify-cost curve and the upper bound per width."""

from __future__ import annotations

import statistics

from ..bench.costmodel import differing_component, fit_verify_curve, row_model, upper_bound


def _isolated(curves: list[dict]) -> dict | None:
    """The isolated verify-cost curves of `test_verify_cost` (medians over pooled runs), kept for reading."""
    if not curves:
        return None
    ratio = {w: statistics.median(c["ratio"][w] for c in curves if w in c["ratio"]) for w in curves[0]["ratio"]}
    return {"ratio": ratio, "t_decode_seconds": statistics.median(c["t_decode_seconds"] for c in curves)}


def apply_cost_model(methods: dict, settings: dict, curves: list[dict]) -> dict:
    """Fill each row's model_speedup, measured_over_model and `model_component` (the component that explains most
    of the gap between the wall clock and the model) from the loop timings; return the document's `verify_cost`,
    `upper_bound_speedup` and the fitted curve (`cost_fit`); none of them without greedy's and a speculative
    case's loop timings."""
    normal = ((methods.get("normal") or {}).get("rows") or {}).get("0") or {}
    nblock = normal.get("loop_costs") or {}
    blocks = [r["loop_costs"] for mid, m in methods.items() if mid != "normal" for r in m["rows"].values()
              if isinstance(r.get("loop_costs"), dict) and r["loop_costs"].get("verify")]
    curve = fit_verify_curve(blocks=blocks, block_size=settings.get("block_size")) if blocks and nblock else None
    if curve is None:
        return {"verify_cost": None, "upper_bound_speedup": {}, "cost_fit": None}
    t_decode = float(nblock.get("step") or 0.0)
    for mid, m in methods.items():
        for r in m["rows"].values():
            block = r.get("loop_costs")
            if mid == "normal":
                r.update(model_speedup=1.0, measured_over_model=r["speedup"], model_component="")
            elif isinstance(block, dict) and block.get("schedule"):
                model = row_model(block, nblock, curve)
                r["model_speedup"] = model["model_speedup"]
                r["measured_over_model"] = r["speedup"] / model["model_speedup"] if model["model_speedup"] else 0.0
                r["model_component"] = differing_component(model)
    widths = sorted({int(w) for mid, m in methods.items() if mid != "normal" for w in m["rows"]})
    base = (methods.get("dflash") or {}).get("rows") or {}
    bound = {}
    for w in widths:
        spec = (base.get(str(w)) or {}).get("loop_costs") or {}
        prompts = int(nblock.get("prompts") or 1)
        tokens = int(nblock.get("tokens") or 0) // max(1, prompts)
        if spec and tokens:
            b = upper_bound(nblock, float(spec.get("prefill", 0.0)), curve, tokens, prompts, w)
            if b:
                bound[str(w)] = b
    verify = {"ratio": {str(w): curve[w] / t_decode for w in range(1, len(curve)) if t_decode > 0},
              "t_decode_seconds": t_decode, "source": "loop: isotonic fit of every case's in-loop verify rounds",
              "isolated": _isolated(curves)}
    return {"verify_cost": verify, "upper_bound_speedup": bound,
            "cost_fit": {"t_verify": curve, "t_decode": t_decode, "cases": len(blocks)}}
