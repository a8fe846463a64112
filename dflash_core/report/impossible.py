"""Rounds a run cannot physically have produced, flagged and kept out of the statistics that name groups.

A round's speedup over greedy at width w cannot exceed what a perfect, free drafter reaches at w: the run's own bound
(`upper_bound_speedup[w]`, the cost model's) or its oracle row (`oracle-w<w>`, replayed greedy drafts, measured),
whichever is higher. Nor can it fall below what the same method would do if it accepted nothing: its median speedup
over its tokens per target call (every call then commits one token at the same cost per call). A ratio against plain
dflash at w is bounded by the two rows' limits (method over dflash). Both limits get the noise's allowance: `Z`
noise figures on the log scale, the noise figure never counted below the run's quiet threshold, so a quiet run is
not flagged for the spread of its medians. A round beyond a limit is a stall of one leg, a clock jump or a bug, not
a speed: run 0002 held a 17.77x round of dspark_lite at width 3 where the run's bound was 2.78x, and a 0.06x round
against dflash.

Flagged rounds stay in the saved rows (the record is whole); `kept` gives the rounds the statistics use.
"""

from __future__ import annotations

import math
import statistics

from ..stats.summary import median_interval, quartiles

Z = 6.0  # noise figures of allowance beyond a physical limit (log scale): on a 3 % quiet run, x1.20 either side
STATISTICS = ("speedup_rounds", "vs_baseline_rounds")
RULE = (f"a round above its width's bound (the larger of the cost-model bound and the oracle row) or below its "
        f"method's zero-acceptance floor (median speedup / tokens per target call), each widened by {Z:g} noise "
        "figures on the log scale (the noise figure at least the run's quiet threshold); a ratio against dflash by "
        "the two rows' limits")


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def kept(row: dict, key: str) -> list[float]:
    """The row's rounds of `key` without the ones flagged impossible (`row["impossible"][key]`: their indices)."""
    xs = row.get(key)
    if not isinstance(xs, list):
        return []
    out = set((row.get("impossible") or {}).get(key) or ())
    return [x for i, x in enumerate(xs) if i not in out]


def kept_flags(row: dict, key: str, flags: list) -> list:
    """A per-round list parallel to `row[key]` (the leg orders), with the flagged rounds' entries dropped."""
    out = set((row.get("impossible") or {}).get(key) or ())
    return [f for i, f in enumerate(flags) if i not in out]


def _bound(width: int, bound: dict, references: dict) -> float | None:
    """The most a perfect, free drafter reaches at `width`: the cost-model bound or the oracle row, the higher."""
    oracle = references.get(f"oracle-w{width}") if isinstance(references, dict) else None
    cands = [bound.get(str(width))]
    if isinstance(oracle, dict):
        ci = oracle.get("speedup_ci")
        cands += [oracle.get("speedup"), ci[1] if isinstance(ci, list) and len(ci) == 2 else None]
    cands = [c for c in cands if _num(c) and c > 0]
    return max(cands) if cands else None


def _floor(row: dict) -> float | None:
    """The zero-acceptance floor: the row's median speedup over its tokens per target call."""
    xs = [x for x in row.get("speedup_rounds") or [] if _num(x) and x > 0]
    tau = row.get("tokens_per_target_call")
    if not xs or not _num(tau) or tau < 1:
        return None
    return statistics.median(xs) / tau


def _check(xs: list, lo: float | None, hi: float | None, allow: float, key: str, case: str) -> list[dict]:
    out = []
    for i, x in enumerate(xs):
        if not _num(x):
            continue
        if hi is not None and x > hi * math.exp(allow):
            out.append({"case": case, "statistic": key, "round": i, "value": x, "limit": hi, "side": "above"})
        elif lo is not None and x < lo * math.exp(-allow):
            out.append({"case": case, "statistic": key, "round": i, "value": x, "limit": lo, "side": "below"})
    return out


def flag_impossible(methods: dict, bound: dict, references: dict, sigma: float | None, threshold: float) -> dict:
    """Mark every speculative row's impossible rounds (`row["impossible"]`: statistic -> indices), re-summarise the
    rows that lost a speedup round, and return the document's `impossible` record (count, rule, allowance, rounds)."""
    if not _num(sigma):  # no noise figure (a run without ranking rounds): what the noise allows is unknown, so no
        # round can be told impossible rather than noisy (a loaded smoke run's one round sat above its curve's bound)
        return {"count": 0, "rule": RULE, "allowance": None, "rounds": [],
                "note": "not judged: the run has no noise figure"}
    allow = Z * max(float(sigma), threshold if _num(threshold) else 0.0)
    dflash = (methods.get("dflash") or {}).get("rows") or {}
    found: list[dict] = []
    for mid, m in methods.items():
        if mid == "normal":
            continue
        for w, row in m["rows"].items():
            hi, lo = _bound(int(w), bound, references), _floor(row)
            case = f"{mid}-w{w}"
            flags = _check(row.get("speedup_rounds") or [], lo, hi, allow, "speedup_rounds", case)
            base = dflash.get(w)
            if isinstance(row.get("vs_baseline_rounds"), list) and isinstance(base, dict):
                blo = _floor(base)
                vs_hi = hi / blo if hi is not None and blo else None
                vs_lo = lo / hi if hi is not None and lo is not None else None
                flags += _check(row["vs_baseline_rounds"], vs_lo, vs_hi, allow, "vs_baseline_rounds", case)
            if flags:
                row["impossible"] = {k: [f["round"] for f in flags if f["statistic"] == k] for k in STATISTICS}
                resummarise(row)
                found += flags
    return {"count": len(found), "rule": RULE, "allowance": math.exp(allow), "rounds": found}


def resummarise(row: dict) -> None:
    """The row's speedup figures (median, quartiles, interval of the median) from its kept rounds."""
    xs = kept(row, "speedup_rounds")
    if not xs or len(xs) == len(row.get("speedup_rounds") or []):
        return
    q1, med, q3 = quartiles(xs)
    iv = median_interval(xs)
    row.update(speedup=med, speedup_iqr=q3 - q1, speedup_q1=q1, speedup_q3=q3, speedup_ci=[iv["lo"], iv["hi"]],
               speedup_ci_label=iv["label"], speedup_ci_coverage=iv["coverage"])
    if _num(row.get("model_speedup")) and row["model_speedup"] > 0:  # report.costs priced the row before
        row["measured_over_model"] = med / row["model_speedup"]
