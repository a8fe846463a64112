"""Calibration orchestration on calibration prompts only (never benchmark prompts): the verify widths that
`--bench-widths auto` chooses, every registered calibrator at every calibrated width, and `--tune`'s width
choice. The search itself (decode every setting, price it with the cost model) is `calibrate.calibrate`."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..runtime.decode import greedy

if TYPE_CHECKING:
    from .session import BenchSession


def auto_widths(sess: BenchSession, cal_texts: list[str], ctx: dict | None = None) -> list[int]:
    """The default verify widths (`--bench-widths auto`), read off the measured verify-cost curve.

    On calibration prompts (never benchmark ones), plain dflash is decoded at every width 1..B and each width
    priced by the cost model (`calibrate`: the session's measured t_verify(w) curve, the drafter's timed costs,
    the deterministic accepted counts), the noise-free objective of issue 14. The widths are the best width and
    the best of those at most half of it (the scaling a reader wants to see), so the curve of the machine, not a
    fixed list, decides: on a CPU where verify cost grows with the width they come out small, on a GPU where
    it is flat up to B they come out large. The table is kept in `width_choice` (benchmark.json settings).
    `ctx`: the session's `calibration_context` (built here when None)."""
    from ..methods import get_method
    from .calibrate import calibrate
    from .costmodel import OBJECTIVE, choose

    ctx = ctx or calibration_context(sess, cal_texts)
    ids, refs = ctx["ids"], ctx["refs"]
    info = get_method("dflash")
    rows = []
    for w in range(1, sess.block_size + 1):
        rec = calibrate(sess.rt, ids, sess.cfg.calibration_tokens, [{"width": w}],
                        lambda s: info.build(sess.rt, sess.prepared), w, repeats=1, costs=sess.calibration_costs,
                        refs=refs)
        rows.append(rec["table"][0])
    best = rows[choose(rows)]["setting"]["width"]
    low = [r for r in rows if r["setting"]["width"] <= best // 2]
    widths = sorted({best, *([low[choose(low)]["setting"]["width"]] if low else [])})
    c = sess.calibration_costs
    sess.width_choice = {
        "objective": OBJECTIVE, "method": "dflash", "selected": widths,
        "rule": "the width with the best cost-model speedup, and the best of the widths at most half of it",
        "verify_over_decode": {str(w): float(c.t_verify[w] / c.t_decode) for w in range(1, sess.block_size + 1)},
        "table": [{"width": r["setting"]["width"], "model_speedup": r["model_speedup"],
                   "tokens_per_target_call": r["tokens_per_target_call"]} for r in rows]}
    return widths

def _cal_ids(sess: BenchSession, texts: list[str]) -> list[list[int]]:
    return [sess.rt.encode(t) for t in texts]

def _cal_kwargs(sess: BenchSession, texts: list[str]) -> dict:
    c = sess.cfg
    return {"tokens": c.calibration_tokens, "repeats": c.calibration_repeats, "prompt_texts": texts,
            "family": sess.family}

def _calibrator(name: str, **extra: Any):
    """Adapter: run `calibrate.<name>` at `width` on the calibration prompts (`ctx`: their ids, greedy
    references and the target's component costs, shared by every calibrator); its choice becomes the options."""

    def run(sess, texts, width, ctx):
        from . import calibrate

        rec = getattr(calibrate, name)(sess.rt, sess.prepared, ctx["ids"], width=width, costs=ctx["costs"],
                                       refs=ctx["refs"], **_cal_kwargs(sess, texts), **extra)
        return {**rec, "selected_options": dict(rec["selected"])}

    return run

def calibration_widths(sess: BenchSession) -> list[int]:
    """The widths calibrated: the benchmarked ones (given, else chosen by `auto_widths`) that fit the block size
    (the bench fixture refuses the others), else B alone."""
    given = sess.cfg.calibration_widths or tuple(sess.bench_widths)
    ws = sorted({int(w) for w in given if 1 <= int(w) <= sess.block_size})
    return ws or [sess.block_size]

# method id -> function(session, calibration prompt texts, width, shared context) -> record with "selected_options"
# V10/V11 screen their grids on one prompt (stage 1) before all prompts decide (stage 2, reusing the stage-1
# decodes): with one deterministic decode per setting instead of two tok/s trials, a default bench's calibration,
# now run at each of its 3 widths, stays within the decodes the single-width calibration used (318 vs 324).
CALIBRATORS: dict[str, Any] = {"act": _calibrator("calibrate_act"), "dspark_lite": _calibrator("calibrate_dspark"),
                               "boltzmann_v10": _calibrator("calibrate_v10", stage1_prompts=1),
                               "gated_mobs_v11": _calibrator("calibrate_v11", stage1_prompts=1)}

def calibration_context(sess: BenchSession, cal_texts: list[str]) -> dict:
    """What every calibration shares: the calibration prompts' ids, their greedy references and the target's
    component costs at a calibration context (calibration never times benchmark prompts); the costs are
    measured once per session. Refuses calibration prompts that share an n-gram with a benchmark prompt."""
    from ..prepare.data import refuse_benchmark
    from .costmodel import target_costs

    refuse_benchmark(cal_texts, sess.family, "calibration")
    ids = _cal_ids(sess, cal_texts)
    tokens = sess.cfg.calibration_tokens
    refs = [greedy(sess.rt, p, tokens)[0] for p in ids]
    if sess.calibration_costs is None:
        sess.calibration_costs = target_costs(sess.rt, ids[0] + refs[0][: max(0, tokens // 2)], sess.block_size)
    return {"ids": ids, "refs": refs, "costs": sess.calibration_costs}

def calibrate_all(sess: BenchSession, cal_texts: list[str], ctx: dict | None = None) -> None:
    """Every calibrator at every calibrated width; `ctx`: the session's `calibration_context` (built when None)."""
    from .costmodel import OBJECTIVE

    ctx = ctx or calibration_context(sess, cal_texts)
    widths = calibration_widths(sess)
    for mid, fn in CALIBRATORS.items():
        t0 = time.perf_counter()
        per = {w: fn(sess, cal_texts, w, ctx) for w in widths}
        sess.width_options[mid] = {w: dict(r.get("selected_options", r.get("selected", {}))) for w, r in per.items()}
        top = per[widths[-1]]
        sess.calibration[mid] = {"objective": OBJECTIVE, "selected": top["selected"],
                                 "selected_options": dict(sess.width_options[mid][widths[-1]]),
                                 "widths": {str(w): r for w, r in per.items()}, "seconds": time.perf_counter() - t0}
        sess.options[mid] = dict(sess.width_options[mid][widths[-1]])
    if "boltzmann_v10" in sess.calibration:  # V13 reuses V10's choice (T, cutoff, slope; budget fixed to 1)
        v10 = sess.calibration["boltzmann_v10"]
        per13 = {w: v10["widths"][str(w)]["v13"] for w in widths if "v13" in v10["widths"].get(str(w), {})}
        if per13:
            sess.width_options["minop_v13"] = {w: dict(v["options"]) for w, v in per13.items()}
            top = per13[max(per13)]
            sess.options["minop_v13"] = dict(top["options"])
            sess.calibration["minop_v13"] = {"reuses": "boltzmann_v10", "objective": OBJECTIVE, **top,
                                             "widths": {str(w): v for w, v in per13.items()}}
    if sess.cfg.tune:
        tune_widths(sess, cal_texts)

def tune_widths(sess: BenchSession, cal_texts: list[str]) -> None:
    """--tune: each speculative method's width among 1, 2, 4 (<= B), chosen on calibration prompts by the
    calibration objective (costmodel.choose: cost-model speedup, ties to tokens per target call, then the
    smaller width), with the options calibrated nearest that width."""
    from ..methods import get_method, speculative_ids
    from .calibrate import calibrate
    from .costmodel import OBJECTIVE, choose

    ids = _cal_ids(sess, cal_texts)
    refs = [greedy(sess.rt, p, sess.cfg.calibration_tokens)[0] for p in ids]
    widths = sorted({min(w, sess.block_size) for w in (1, 2, 4)})
    for mid in speculative_ids():
        info = get_method(mid)
        rows = []
        for w in widths:
            opts = sess.options_for(mid, w)
            rec = calibrate(sess.rt, ids, sess.cfg.calibration_tokens, [{"width": w}],
                            lambda s, info=info, opts=opts: info.build(sess.rt, sess.prepared, **opts), w,
                            repeats=sess.cfg.calibration_repeats, costs=sess.calibration_costs, refs=refs)
            rows.append(rec["table"][0])
        best = rows[choose(rows)]
        sess.tuned_widths[mid] = {"selected": best["setting"]["width"], "table": rows, "objective": OBJECTIVE}
