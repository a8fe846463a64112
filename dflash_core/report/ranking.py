"""The report's ranking: which rounds are ranked, the selection with its guarantee (stats/selection.py), the
run's noise figure, the ranking's own A/A (dflash against dflash) and the position effect of the leg order.

Everything here is recomputed from the saved rows (schema 7 and later: build.load_saved refuses older runs), so
a saved run rebuilds with the code of the day.
"""

from __future__ import annotations

import math

from ..bench.config import BASELINE
from ..stats.selection import NOT_FASTEST, RULE, adjusted_noise, rank
from ..stats.summary import median_interval
from .impossible import kept, kept_flags

NOISE_FIGURE = "pooled robust SD (MAD x 1.4826, small-sample factor) of the ranked cases' per-round log ratios"


def ranking_width(methods: dict, settings: dict) -> int | None:
    """The width chosen on calibration prompts before any round (`settings.ranking_width`); None when the run
    measured no row there. Why not the best benchmark median: a choice made on the data it is reported on."""
    w = settings.get("ranking_width")
    rows = {int(k) for m in methods.values() for k in m["rows"]}
    return w if isinstance(w, int) and not isinstance(w, bool) and w in rows else None


def ranked_rounds(methods: dict, width: int | None) -> tuple[str, dict[str, list[float]]]:
    """(statistic, method -> per-round ratios) the ranking compares: each method's ratio against plain dflash in the
    same rounds at `width` (schema >= 5); runs without it rank each method's best speedup over greedy rounds
    (schema <= 4: every switch of the machine's state between minutes is in those, so their groups are wide)."""
    speculative = {mid: m for mid, m in methods.items() if mid != "normal"}
    at = {mid: m["rows"].get(str(width)) for mid, m in speculative.items()}
    if width is not None and at and all(r is not None and r.get("vs_baseline_rounds") for r in at.values()):
        return "vs_baseline", {mid: kept(r, "vs_baseline_rounds") for mid, r in at.items()}
    return "speedup", {mid: kept(m["rows"][str(m["best"]["width"])], "speedup_rounds")
                       for mid, m in speculative.items()}


def preliminary_noise(methods: dict, settings: dict, threshold: float) -> float | None:
    """The noise figure of the ranking rounds before any round is flagged impossible (report.impossible needs it to
    size its allowance; the figure is a robust SD, so a wild round barely moves it); None without ranking rounds."""
    width = ranking_width(methods, settings)
    if width is None:
        return None
    at = {mid: m["rows"].get(str(width)) for mid, m in methods.items() if mid != "normal"}
    ratios = {mid: r["vs_baseline_rounds"] for mid, r in at.items() if r and r.get("vs_baseline_rounds")}
    if not ratios:
        return None
    return adjusted_noise(ratios, threshold=threshold, baseline_first=baseline_first(methods, width))[2].get("sigma")


def position_effect(methods: dict, width: int | None) -> dict | None:
    """How much faster the second of two identical decodes ran: per round of the rows that draft exactly like
    dflash at `width` (dflash itself, and methods whose draft never differed from dflash's), the wall of the leg
    that ran first over the leg that ran second (> 1: the second leg was faster). None without such rows."""
    per_round, rows = [], []
    for mid, m in methods.items():
        r = m["rows"].get(str(width)) if width is not None else None
        status = ((r or {}).get("activity") or {}).get("status")
        if r is None or mid == "normal" or status not in ("baseline", "inactive") or not r.get("vs_baseline_rounds"):
            continue
        rows.append(mid)
        # vs = dflash wall / method wall; a round whose method leg ran first reads method / dflash
        for x, first_is_dflash in zip(kept(r, "vs_baseline_rounds"), baseline_first({mid: m}, width)[mid]):
            per_round.append(x if first_is_dflash else 1.0 / x)
    if not per_round:
        return None
    iv = median_interval(per_round)
    return {"rows": sorted(rows), "rounds": len(per_round), "median": iv["median"], "lo": iv["lo"], "hi": iv["hi"],
            "label": iv["label"], "randomised": all(m["rows"].get(str(width), {}).get("leg_orders")
                                                    for mid, m in methods.items() if mid in rows)}


def baseline_first(methods: dict, width: int | None) -> dict[str, list[bool]]:
    """Per method at `width`, per round: did the dflash leg run before the method's (`leg_orders`; a round without
    one counts as greedy, dflash, method)."""
    out = {}
    for mid, m in methods.items():
        r = m["rows"].get(str(width)) if width is not None else None
        if mid == "normal" or not r or not r.get("vs_baseline_rounds"):
            continue
        orders = r.get("leg_orders") or []
        first = [(orders[i] if i < len(orders) else "nbm").find("b") < (orders[i] if i < len(orders) else "nbm")
                 .find("m") for i in range(len(r["vs_baseline_rounds"]))]
        out[mid] = kept_flags(r, "vs_baseline_rounds", first)  # parallel to the rounds the ranking keeps
    return out


def aa_of_the_ranking(rounds: dict[str, list[float]]) -> dict | None:
    """dflash against dflash at the ranking width: the ranking's own A/A, with its interval of the median."""
    xs = rounds.get(BASELINE)
    if not xs:
        return None
    iv = median_interval(xs)
    return {"rounds": len(xs), "median": iv["median"], "lo": iv["lo"], "hi": iv["hi"], "label": iv["label"],
            "spread": max(abs(x - 1.0) for x in xs)}


def _lead(lead: dict | None) -> dict | None:
    """select_best's lead of the top estimate over the next, as fractions (0.22: 22 % faster)."""
    if lead is None:
        return None
    return {"over": lead["over"], "estimate": math.expm1(lead["estimate"]), "lo": math.expm1(lead["lo"]),
            "hi": math.expm1(lead["hi"]), "resolution_noise_hi": math.expm1(lead["resolution_noise_hi"]),
            "noise_could_change": lead["noise_could_change"]}


def build_ranking(methods: dict, settings: dict, resolution: float, threshold: float, limitations: list[str]) -> dict:
    """The ranking, its noise figure and position effect as benchmark.json fields, and each method's `best` ranking
    figures (rank_group, vs_baseline, its interval, gap). Appends to `limitations` what it could not compute."""
    width = ranking_width(methods, settings)
    statistic, rounds = ranked_rounds(methods, width)
    first = baseline_first(methods, width) if statistic == "vs_baseline" else {}
    out = rank(rounds, resolution, threshold=threshold, baseline_first=first)
    noise = out["noise"]
    for mid, m in methods.items():
        if mid == "normal":
            continue
        b = m["best"]
        b["rank_group"] = 1 if mid in out["g1"] else 2
        if statistic == "vs_baseline":
            iv = median_interval(rounds[mid])
            b.update(vs_baseline=iv["median"], vs_baseline_ci=[iv["lo"], iv["hi"]], vs_baseline_label=iv["label"])
        below = out["below"].get(mid)
        b["gap_lo"] = None if below is None else max(0.0, math.expm1(below["gap_lo"]))
        b["claim"] = "in G1" if below is None else below["claim"]
    groups = [list(out["g1"])] + ([[k for k in sorted(out["cases"], key=lambda k: -out["estimate"][k])
                                    if k not in out["g1"]]] if len(out["g1"]) < len(out["cases"]) else [])
    ranking = {
        "statistic": statistic, "width": width if statistic == "vs_baseline" else None, "width_chosen": "calibration",
        "baseline": BASELINE if statistic == "vs_baseline" else None, "rule": RULE, "confidence": out["confidence"],
        "resolution": resolution, "resolution_effective": math.expm1(out["resolution"]),
        "critical_value": out["critical_value"], "resamples": out["resamples"],
        "rounds": {k: int(v) for k, v in out["rounds"].items()},
        "g1": list(out["g1"]), "winner": out["winner"], "lead": _lead(out["lead"]),
        "winner_lead_lo": None if out["winner_lead_lo"] is None else math.expm1(out["winner_lead_lo"]),
        "below": {k: {"gap_lo": max(0.0, math.expm1(v["gap_lo"])), "claim": v["claim"]}
                  for k, v in out["below"].items()},
        "guarantee": out["guarantee"],
        "not_claimed": "G2 is not ordered, and a G2 method is not claimed slower than every G1 member: only than "
                       f"the (unknown) fastest one. '{NOT_FASTEST}' is all that is claimed where no gap is listed.",
    }
    doc_noise = {"figure": NOISE_FIGURE, "sigma": noise["sigma"], "ci": noise["ci"], "threshold": noise["threshold"],
                 "noisy": bool(noise["noisy"]), "cases": noise["cases"], "residuals": noise.get("residuals", 0),
                 "df": noise["df"], "statistic": statistic, "aa": aa_of_the_ranking(rounds)}
    if noise["sigma"] is None and rounds:
        limitations.append("no noise figure: no ranked case has two rounds")
    pe = position_effect(methods, width if statistic == "vs_baseline" else None)
    if pe is not None:
        pe["adjustment"] = None if out["position_delta"] is None else math.exp(out["position_delta"])
    return {"ranking": ranking, "rank_groups": groups, "noise": doc_noise, "position_effect": pe,
            "leader": max(out["cases"], key=lambda k: (out["estimate"][k], k)) if out["cases"] else None}


def noise_of_rounds(per_case_ratios: dict[str, list[float]], threshold: float,
                    baseline_first: dict[str, list[bool]] | None = None) -> dict:
    """The noise figure of a session's ranking rounds (for the bench's own stderr warning), computed as the report
    computes it: the position effect of the leg orders removed first (`selection.adjusted_noise`)."""
    return adjusted_noise(per_case_ratios, threshold=threshold, baseline_first=baseline_first)[2]
