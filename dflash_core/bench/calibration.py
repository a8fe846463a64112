"""Calibration orchestration on calibration prompts only (never benchmark prompts): the verify widths that
`--bench-widths auto` chooses, every registered calibrator at every calibrated width, and `--tune`'s width
choice. The search itself (decode every setting, price it with the cost model) is `calibrate.calibrate`."""

from __future__ import annotations

import logging
import statistics
import time
from typing import TYPE_CHECKING

from ..methods import calibrated, get_method, speculative_ids
from ..progress import Progress
from ..runtime.decode import greedy, speculative
from ..store.data import refuse_benchmark
from .calibrate import calibrate, calibrate_method
from .costmodel import OBJECTIVE, ComponentCosts, choose, fit_verify_curve, target_costs, verify_samples

if TYPE_CHECKING:
    from .state import BenchSession

log = logging.getLogger(__name__)


def dflash_table(sess: BenchSession, widths: list[int], ctx: dict) -> list[dict]:
    """Plain dflash decoded on the calibration prompts (never benchmark ones) at each of `widths`, each width priced
    by the cost model (`calibrate`: the session's verify-cost curve, the drafter's timed costs, the deterministic
    accepted counts): the noise-free objective that chooses widths."""
    info = get_method("dflash")
    rows = []
    bar = Progress(f"widths: dflash at {len(widths)} width(s) on calibration prompts", len(widths), log)
    for w in widths:
        rec = calibrate(sess.rt, ctx["ids"], sess.cfg.calibration_tokens, [{"width": w}],
                        lambda s: info.build(sess.rt, sess.prepared), w, repeats=1, costs=sess.calibration_costs,
                        refs=ctx["refs"])
        rows.append(rec["table"][0])
        bar.update(note=f"w{w}")
    return rows


def auto_widths(sess: BenchSession, cal_texts: list[str], ctx: dict | None = None) -> list[int]:
    """The default verify widths (`--bench-widths auto`), read off the cost model over widths 1..B.

    The widths are the best width (`dflash_table`) and the best of those at most half of it (the scaling a reader
    wants to see; only the best under `cfg.width_count` 1: a real target's auto size), so the curve of the machine,
    not a fixed list, decides: on a CPU where verify cost grows with the width they come out small, on a GPU where
    it is flat up to B they come out large. The table is kept in
    `width_choice` (benchmark.json settings). `ctx`: the session's `calibration_context` (built here when None)."""
    ctx = ctx or calibration_context(sess, cal_texts)
    rows = dflash_table(sess, list(range(1, sess.block_size + 1)), ctx)
    best = rows[choose(rows)]["setting"]["width"]
    low = [r for r in rows if r["setting"]["width"] <= best // 2]
    second = [low[choose(low)]["setting"]["width"]] if low and sess.cfg.width_count > 1 else []
    widths = sorted({best, *second})
    c = sess.calibration_costs
    sess.width_choice = {
        "objective": OBJECTIVE, "method": "dflash", "selected": widths,
        "rule": "the width with the best cost-model speedup" + (
            ", and the best of the widths at most half of it" if sess.cfg.width_count > 1 else
            " (one width: a real target's auto size)"),
        "verify_over_decode": {str(w): float(c.t_verify[w] / c.t_decode) for w in range(1, sess.block_size + 1)},
        "table": _table_rows(rows)}
    return widths


def _table_rows(rows: list[dict]) -> list[dict]:
    return [{"width": r["setting"]["width"], "model_speedup": r["model_speedup"],
             "tokens_per_target_call": r["tokens_per_target_call"]} for r in rows]


def ranking_width(sess: BenchSession, widths: list[int], ctx: dict) -> int:
    """The width the ranking compares methods at, chosen before any benchmark round: among the benchmarked
    `widths`, plain dflash's best by the cost model on calibration prompts (the `auto_widths` table when it
    covers them, else a `dflash_table` of just those widths). Why not the width of the highest benchmark
    median: a choice made on the data it is reported on (post-hoc), and two widths whose medians tie flip between
    runs. Recorded in `width_choice.ranking_width`."""
    table = (sess.width_choice or {}).get("table") or []
    rows = [r for r in table if r["width"] in widths]
    if len(rows) != len(set(widths)):
        rows = _table_rows(dflash_table(sess, sorted(set(widths)), ctx))
    width = rows[choose(rows)]["width"]
    sess.width_choice = {**(sess.width_choice or {}), "ranking_width": width, "ranking_table": rows,
                         "ranking_rule": "among the benchmarked widths, plain dflash's best cost-model speedup on "
                                         "calibration prompts"}
    return width


def _cal_ids(sess: BenchSession, texts: list[str]) -> list[list[int]]:
    return [sess.rt.encode(t) for t in texts]


def calibration_context(sess: BenchSession, cal_texts: list[str]) -> dict:
    """What every calibration shares: the calibration prompts' ids, their greedy references and the target's
    component costs timed inside the decode loop on them (`loop_target_costs`; calibration never times benchmark
    prompts); the costs are measured once per session. Refuses calibration prompts that share an n-gram with a
    benchmark prompt."""
    refuse_benchmark(cal_texts, sess.family, "calibration")
    ids = _cal_ids(sess, cal_texts)
    tokens = sess.cfg.calibration_tokens
    greedy_runs = [greedy(sess.rt, p, tokens) for p in ids]
    refs = [r for r, _ in greedy_runs]
    if sess.calibration_costs is None:
        sess.calibration_costs = loop_target_costs(sess, ids, [st for _, st in greedy_runs])
    return {"ids": ids, "refs": refs, "costs": sess.calibration_costs}


def loop_target_costs(sess: BenchSession, ids: list[list[int]], greedy_stats: list) -> object:
    """The target's costs as the decode loop pays them, on calibration prompts: t_decode is greedy's median step
    (its target seconds after the prefill), t_verify(0..B) the isotonic fit (costmodel.fit_verify_curve) of every
    verify round's in-loop seconds while plain dflash decodes the prompts at each width 1..B (with its taps, in the
    loop's session and threads). Why not verifies timed in isolation: without taps and outside the loop they came
    out 10-30 % off the loop's and not monotone, and auto widths and calibration read off that noise."""
    steps = [(st.target_seconds - st.prefill_seconds) / (st.target_calls - 1) for st in greedy_stats
             if st.target_calls > 1]
    build = get_method("dflash").build
    traces = []
    for w in range(1, sess.block_size + 1):
        for p in ids:
            tr: list = []
            speculative(sess.rt, build(sess.rt, sess.prepared), list(p), sess.cfg.calibration_tokens, w, trace=tr)
            traces.append(tr)
    curve = fit_verify_curve(verify_samples(traces), block_size=sess.block_size)
    if curve is None:
        return target_costs(sess.rt, ids[0], sess.block_size)  # nothing verified (a budget of one token)
    return ComponentCosts(t_decode=float(statistics.median(steps)) if steps else curve[0], t_verify=tuple(curve))


def calibrate_one(sess: BenchSession, method_id: str, texts: list[str], width: int, ctx: dict) -> dict:
    """The registry's calibration of one method at `width` on the calibration prompts (`ctx`: their ids, greedy
    references and the target's component costs, shared by every method)."""
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
    ctx = ctx or calibration_context(sess, cal_texts)
    widths = sess.calibration_widths()
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
