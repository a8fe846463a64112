"""Calibration orchestration on calibration prompts only (never benchmark prompts): the verify widths that
`--bench-widths auto` chooses, every registered calibrator at every calibrated width, and `--tune`'s width
choice. The search itself (decode every setting, price it with the cost model) is `calibrate.calibrate`."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from ..methods import calibrated
from ..progress import Progress
from ..runtime.decode import greedy

if TYPE_CHECKING:
    from .session import BenchSession

log = logging.getLogger(__name__)


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
    bar = Progress("auto widths: dflash at every width on calibration prompts", sess.block_size, log)
    for w in range(1, sess.block_size + 1):
        rec = calibrate(sess.rt, ids, sess.cfg.calibration_tokens, [{"width": w}],
                        lambda s: info.build(sess.rt, sess.prepared), w, repeats=1, costs=sess.calibration_costs,
                        refs=refs)
        rows.append(rec["table"][0])
        bar.update(note=f"w{w}")
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


def calibration_widths(sess: BenchSession) -> list[int]:
    """The widths calibrated: the benchmarked ones (given, else chosen by `auto_widths`) that fit the block size
    (the bench fixture refuses the others), else B alone."""
    given = sess.cfg.calibration_widths or tuple(sess.bench_widths)
    ws = sorted({int(w) for w in given if 1 <= int(w) <= sess.block_size})
    return ws or [sess.block_size]


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


def calibrate_one(sess: BenchSession, method_id: str, texts: list[str], width: int, ctx: dict) -> dict:
    """The registry's calibration of one method at `width` on the calibration prompts (`ctx`: their ids, greedy
    references and the target's component costs, shared by every method)."""
    from .calibrate import calibrate_method

    c = sess.cfg
    return calibrate_method(sess.rt, sess.prepared, method_id, ctx["ids"], c.calibration_tokens, width,
                            repeats=c.calibration_repeats, prompt_texts=texts, family=sess.family,
                            costs=ctx["costs"], refs=ctx["refs"])


def calibrate_all(sess: BenchSession, cal_texts: list[str], ctx: dict | None = None) -> None:
    """Every method the registry calibrates (`methods.calibrated`), at every calibrated width; a method that
    reuses another's choice adapts that method's selection at each width. The widest width's choice is the
    method's default options. A method whose options were reused from another run (`bench.reuse`) is skipped.
    `ctx`: the session's `calibration_context` (built when None).

    V10 and V11 search by successive halving (stage 1 on one prompt, stage 2 on all, reusing the stage-1
    decodes): with one deterministic decode per setting, a default bench's calibration at each of its widths
    stays within the decodes a single-width tok/s calibration used."""
    from .costmodel import OBJECTIVE

    ctx = ctx or calibration_context(sess, cal_texts)
    widths = calibration_widths(sess)
    todo = [m for m in calibrated() if m.id not in sess.width_options]  # the others: reused (--calibration-from)
    searched = [m for m in todo if m.calibration.reuses is None]
    bar = Progress(f"calibration ({len(searched)} methods x {len(widths)} widths)", len(searched) * len(widths), log)

    def one(mid: str, w: int) -> dict:
        rec = calibrate_one(sess, mid, cal_texts, w, ctx)
        bar.update(note=f"{mid} w{w}")
        return rec

    for info in todo:
        t0 = time.perf_counter()
        cal = info.calibration
        if cal.reuses is None:
            per = {w: one(info.id, w) for w in widths}
            head = {"objective": OBJECTIVE}
        else:
            src = sess.width_options[cal.reuses]
            per = {w: {"selected": cal.adapt(src[w]), "selected_options": cal.adapt(src[w]),
                       "reused_setting": dict(src[w])} for w in widths}
            head = {"reuses": cal.reuses, "objective": OBJECTIVE}
        sess.width_options[info.id] = {w: dict(r["selected_options"]) for w, r in per.items()}
        top = per[widths[-1]]
        sess.calibration[info.id] = {**head, "selected": top["selected"],
                                     "selected_options": dict(top["selected_options"]),
                                     "widths": {str(w): r for w, r in per.items()},
                                     "seconds": time.perf_counter() - t0}
        sess.options[info.id] = dict(sess.width_options[info.id][widths[-1]])
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
    bar = Progress("--tune: width per method", len(speculative_ids()), log)
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
        bar.update(note=mid)
