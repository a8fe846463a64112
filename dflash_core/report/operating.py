"""Each method's operating point: the width the width model chose for it on calibration decodes, what the model
predicted there and what the benchmark measured, and how well the model predicted dflash at every measured width.

Why in the report: the widths the lab measures at decide every number it prints (a 24-token calibration ranked every
method at a width where the drafter gave half of what it can), so a reader sees the predicted tokens per target call
and cost-model speedup per width that chose each one, beside the measured figures, and can judge the model itself.
"""

from __future__ import annotations

from typing import Any

# The width model's predicted tokens per target call should be within this fraction of the measured (the goal the
# report checks for dflash at every benchmarked width). The prediction comes from calibration prompts and the
# measurement from benchmark prompts, so this is a statement about how alike the two sets decode, not only the model.
PREDICTION_TOLERANCE = 0.10


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _table(entry: Any) -> dict[int, dict]:
    rows = entry.get("table") if isinstance(entry, dict) else None
    out = {}
    for r in rows if isinstance(rows, list) else []:
        if isinstance(r, dict) and isinstance(r.get("width"), int) and not isinstance(r.get("width"), bool):
            out[r["width"]] = r
    return out


def own_widths(settings: dict) -> dict[str, int]:
    """method -> its own width from `settings.method_widths` (malformed entries skipped)."""
    mw = settings.get("method_widths") if isinstance(settings.get("method_widths"), dict) else {}
    return {m: e["selected"] for m, e in mw.items()
            if isinstance(e, dict) and isinstance(e.get("selected"), int) and not isinstance(e.get("selected"), bool)}


def operating_points(methods: dict, settings: dict) -> dict:
    """{"methods": {id: {width, predicted_tokens_per_target_call, model_speedup, measured_tokens_per_target_call,
    measured_speedup, candidates}}, "dflash_prediction": [{width, predicted, measured, error}], "within": bool|None}.
    Empty dicts where the run chose no own widths (a run from before the width model, or a smoke run)."""
    mw = settings.get("method_widths") if isinstance(settings.get("method_widths"), dict) else {}
    out: dict[str, Any] = {"methods": {}, "dflash_prediction": [], "tolerance": PREDICTION_TOLERANCE, "within": None}
    for mid, w in own_widths(settings).items():
        pred = _table(mw.get(mid)).get(w) or {}
        row = ((methods.get(mid) or {}).get("rows") or {}).get(str(w)) or {}
        out["methods"][mid] = {"width": w, "predicted_tokens_per_target_call": _num(pred.get("tokens_per_target_call")),
                               "model_speedup": _num(pred.get("model_speedup")),
                               "measured_tokens_per_target_call": _num(row.get("tokens_per_target_call")),
                               "measured_speedup": _num(row.get("speedup"))}
    choice = settings.get("width_choice") if isinstance(settings.get("width_choice"), dict) else {}
    table = {**_table(choice), **_table(mw.get("dflash"))}
    for w, row in sorted(((int(k), r) for k, r in ((methods.get("dflash") or {}).get("rows") or {}).items()
                          if str(k).isdigit()), key=lambda kv: kv[0]):
        pred, meas = _num((table.get(w) or {}).get("tokens_per_target_call")), _num(row.get("tokens_per_target_call"))
        if pred and meas:
            out["dflash_prediction"].append({"width": w, "predicted": pred, "measured": meas,
                                             "error": meas / pred - 1.0})
    if out["dflash_prediction"]:
        out["within"] = all(abs(p["error"]) <= PREDICTION_TOLERANCE for p in out["dflash_prediction"])
    return out
