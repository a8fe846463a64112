"""Calibration orchestration on calibration prompts only (never benchmark prompts): the verify widths that
`--bench-widths auto` chooses, each method's own width (`method_widths`), every registered calibrator at every
calibrated width, and `--tune`'s width choice. The search itself (decode every setting, price it with the cost model)
is `calibrate.calibrate`.

Every setting is decoded on the width model's replay (`bench.replay`): each calibration prompt's greedy decode of
the benchmark's length, from its start as a benchmark decode is, replayed without the target, so a width is judged on
the blocks of 16 held-out decodes at once (a 24-token decode of 3 prompts saw too few rounds to show what a wide
block buys: dflash's tokens per target call read 2.88 at every width from 6 to 16 there, 5.3 at 6 and 7.4 at 16 on a
96-token decode). The target's costs are timed in the loop on real decodes (`loop_target_costs`)."""

from __future__ import annotations

import logging
import statistics
import time
from typing import TYPE_CHECKING

from ..methods import calibrated, get_method, speculative_ids
from ..progress import Progress
from ..runtime.decode import greedy, speculative
from ..store.data import clean_segments, refuse_benchmark
from .calibrate import calibrate, calibrate_method
from .costmodel import (
    OBJECTIVE,
    ComponentCosts,
    TimedProposer,
    choose,
    fit_verify_curve,
    pooled_costs,
    target_costs,
    verify_samples,
)
from .replay import ReplayRuntime, trajectories

if TYPE_CHECKING:
    from .state import BenchSession

log = logging.getLogger(__name__)


def width_rows(sess: BenchSession, method: str, widths: list[int], ctx: dict, note: str = "") -> list[dict]:
    """`method` decoded on the width model's replay (`ctx["rt"]`: every calibration decode, no target forward) at
    each of `widths` with its options there (`options_for`), each width priced by the cost model (the session's
    in-loop verify curve, the drafter's costs timed on real decodes, the method's own selection seconds and its
    deterministic accepted counts): the noise-free objective that chooses widths."""
    info = get_method(method)
    rows = []
    bar = Progress(f"widths: {method} at {len(widths)} width(s) on calibration decodes{note}", len(widths), log)
    for w in widths:
        opts = sess.options_for(method, w)
        rec = calibrate(ctx["rt"], ctx["ids"], ctx["tokens"], [{"width": w}],
                        lambda s, opts=opts: info.build(ctx["rt"], sess.prepared, **opts), w, repeats=1,
                        costs=sess.calibration_costs, refs=ctx["refs"], warmup=False, drafter=sess.drafter_costs)
        rows.append(rec["table"][0])
        bar.update(note=f"w{w}")
    return rows


def dflash_table(sess: BenchSession, widths: list[int], ctx: dict) -> list[dict]:
    """Plain dflash at each of `widths` on the replay (`width_rows`)."""
    return width_rows(sess, "dflash", widths, ctx)


def auto_widths(sess: BenchSession, cal_texts: list[str], ctx: dict | None = None) -> list[int]:
    """The default verify widths (`--bench-widths auto`), read off the cost model over widths 1..B.

    The widths are the best width (`dflash_table`) and the best of those at most half of it (the scaling a reader
    wants to see; only the best under `cfg.width_count` 1: a real target's auto size), so the curve of the machine,
    not a fixed list, decides: on a CPU where verify cost grows with the width they come out small, on a GPU where
    it is flat up to B they come out large. The table is kept in
    `width_choice` (benchmark.json settings). `ctx`: the session's `calibration_context` (built here when None)."""
    ctx = ctx or calibration_context(sess, cal_texts)
    rows = dflash_table(sess, list(range(1, sess.block_size + 1)), ctx)
    sess.method_widths["dflash"] = {"selected": rows[choose(rows)]["setting"]["width"], "table": _table_rows(rows)}
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
        "table": _table_rows(rows), "width_model": ctx.get("model")}
    return widths


def _table_rows(rows: list[dict]) -> list[dict]:
    """The width table as benchmark.json keeps it: per width the cost-model speedup, the predicted tokens per target
    call and the seconds per round of each priced component."""
    return [{"width": r["setting"]["width"], "model_speedup": r["model_speedup"],
             "tokens_per_target_call": r["tokens_per_target_call"],
             **{k: r[k] for k in ("t_draft", "t_select") if r.get(k) is not None}} for r in rows]


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
    """What every calibration shares, built once per session: the width model's replay and the target's costs.

    The calibration prompts' greedy continuations (`calibration_tokens` each, the cached greedy decode: also the
    target's decode step in the loop, t_decode), their taps from one forward, cut into decodes of the benchmark's
    length (`replay.Trajectory.segment`); a decode whose text shares an n-gram with a benchmark prompt is dropped (the
    held-out guard, as for training text). The verify curve and the drafter's costs are timed on real decodes
    (`loop_target_costs`). Refuses calibration prompts that share an n-gram with a benchmark prompt.
    Returns {"rt": the ReplayRuntime, "ids"/"refs": each replayed decode's prompt and greedy continuation,
    "tokens": their length, "costs", "model": what the width model read}."""
    refuse_benchmark(cal_texts, sess.family, "calibration")
    ids = _cal_ids(sess, cal_texts)
    c = sess.cfg
    t0 = time.perf_counter()
    # each calibration prompt decoded once from its start, for the benchmark's length, as a benchmark decode is. Why
    # not decodes cut from deep inside long continuations: the drafter trained on short trajectories accepts less
    # the further a decode starts from its prompt (mini, dflash at width 7: 3.46 tokens per target call from the
    # prompt, 2.37 from 384 tokens in), so such decodes priced every width for a context the benchmark never decodes
    # and under-predicted it by 20-44 % (studies/2026-12-07-operating-point/)
    length = max(1, min(c.tokens, c.calibration_tokens))
    # a calibration prompt whose decode would pass the target's context is left out (a small target's context of
    # 256 positions cannot hold the longest English ones and a benchmark-length decode); none left is bad input
    room = getattr(sess.rt, "max_positions", None)
    fit = [p for p in ids if room is None or len(p) + length <= room]
    if len(fit) < len(ids):
        log.info("width model: %d of %d calibration prompts left out: with a decode of %d tokens they pass the "
                 "target's context of %d positions", len(ids) - len(fit), len(ids), length, room)
    ids = fit or ids  # none fits: the decode below refuses with the fix (lower --bench-tokens)
    runs = [greedy(sess.rt, p, length) for p in ids]
    steps = [(st.target_seconds - st.prefill_seconds) / (st.target_calls - 1) for _, st in runs
             if st.target_calls > 1]
    trajs = trajectories(sess.rt, ids, [r for r, _ in runs], tuple(sess.prepared.drafter.cfg.taps))
    segs = [t.segment(0, min(len(r) for r, _ in runs)) for t in trajs]  # one decode per prompt, from its start
    keep, dropped = clean_segments(sess.rt, [list(s.prompt[len(ids[s.source]):]) + list(s.tokens) for s in segs],
                                   sess.family)
    segs = [segs[i] for i in keep]
    if not segs:  # every decode leaked: the prompts themselves (refused above if they leak) with their first token
        segs = [t.segment(0, 1) for t in trajs]
    if sess.calibration_costs is None:
        sess.calibration_costs, sess.drafter_costs = loop_target_costs(sess, ids[:CURVE_PROMPTS], steps)
    model = {"prompts": len(ids), "tokens_per_prompt": length, "decode_tokens": len(segs[0].tokens),
             "decodes": len(segs), "dropped_held_out": len(dropped), "tokens": sum(len(s.tokens) for s in segs),
             "seconds": round(time.perf_counter() - t0, 2),
             "method": "replay: the greedy continuations' taps from one forward, drafts cached per anchor"}
    log.info("width model: %d calibration decodes of %d tokens (%d tokens) replayed from %d greedy continuations%s",
             model["decodes"], model["decode_tokens"], model["tokens"], len(ids),
             f", {len(dropped)} dropped (held out)" if dropped else "")
    return {"rt": ReplayRuntime(sess.rt, segs), "ids": [list(s.prompt) for s in segs],
            "refs": [list(s.tokens) for s in segs], "tokens": len(segs[0].tokens), "costs": sess.calibration_costs,
            "model": model, "prompt_ids": ids}


# calibration prompts the in-loop verify curve decodes (each at every width 1..B): the curve is a cost of the target
# and the drafter, not of the text, so four prompts time it as well as all of them (and B times faster than all)
CURVE_PROMPTS = 4


def loop_target_costs(sess: BenchSession, ids: list[list[int]], steps: list[float]) -> tuple:
    """The target's costs as the decode loop pays them, on calibration prompts, and the drafter's: t_decode is
    greedy's median step (`steps`: seconds per step after the prefill), t_verify(0..B) the isotonic fit
    (costmodel.fit_verify_curve) of every verify round's in-loop seconds while plain dflash decodes the prompts
    (`curve_tokens` each) at each width 1..B (with its taps, in the loop's session and threads), and the drafter's
    draft/observe/begin medians over those decodes (costmodel.TimedProposer). Why not verifies timed in isolation:
    without taps and outside the loop they came out 10-30 % off the loop's and not monotone. Why the drafter's
    costs from here: the replay reads cached blocks, so it times each method's selection, not the drafter forward.
    Returns (ComponentCosts, ProposerCosts)."""
    build = get_method("dflash").build
    traces, timers = [], []
    widths = list(range(1, sess.block_size + 1))
    for i, p in enumerate(ids):  # every width on each prompt, the order reversed on every other prompt: a burst
        for w in (widths if i % 2 == 0 else widths[::-1]):  # of load then slows all widths alike, not the last few
            tr: list = []
            timer = TimedProposer(build(sess.rt, sess.prepared))
            speculative(sess.rt, timer, list(p), sess.cfg.curve_tokens, w, trace=tr)
            traces.append(tr)
            timers.append(timer)
    drafter = pooled_costs(timers)
    curve = fit_verify_curve(verify_samples(traces), block_size=sess.block_size)
    if curve is None:  # nothing verified (a budget of one token)
        return target_costs(sess.rt, ids[0], sess.block_size), drafter
    return ComponentCosts(t_decode=float(statistics.median(steps)) if steps else curve[0],
                          t_verify=tuple(curve)), drafter


def calibrate_one(sess: BenchSession, method_id: str, texts: list[str], width: int, ctx: dict) -> dict:
    """The registry's calibration of one method at `width` on the calibration prompts (`ctx`: their ids, greedy
    references and the target's component costs, shared by every method)."""
    c = sess.cfg
    return calibrate_method(ctx["rt"], sess.prepared, method_id, ctx["ids"], ctx["tokens"], width,
                            repeats=c.calibration_repeats, prompt_texts=texts, family=sess.family,
                            costs=ctx["costs"], refs=ctx["refs"], drafter=sess.drafter_costs,
                            held_out_ids=ctx["prompt_ids"], warmup=False)


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
        tune_widths(sess, cal_texts, ctx)


def tune_widths(sess: BenchSession, cal_texts: list[str], ctx: dict | None = None) -> None:
    """--tune: each speculative method's width among 1, 2, 4 (<= B), chosen on the width model's replay by the
    calibration objective (costmodel.choose: cost-model speedup, ties to tokens per target call, then the
    smaller width), with the options calibrated nearest that width."""
    ctx = ctx or calibration_context(sess, cal_texts)
    widths = sorted({min(w, sess.block_size) for w in (1, 2, 4)})
    for mid in speculative_ids():
        rows = width_rows(sess, mid, widths, ctx, note=" (--tune)")
        best = rows[choose(rows)]
        sess.tuned_widths[mid] = {"selected": best["setting"]["width"], "table": rows, "objective": OBJECTIVE}


# The widths each method's own width is chosen among under `--bench-widths auto` (besides dflash's, which is read at
# every width 1..B): every other width and B. Why not every width: a replay costs each method's selection per round,
# and 13 methods x 16 widths x ~500 rounds took minutes on 2 cores; the cost-model speedup moves by a few per cent
# between neighbouring widths, and the width dflash chose is always a candidate.
OWN_WIDTH_STEP = 2


def own_width_candidates(sess: BenchSession, auto: bool) -> list[int]:
    """The widths a method's own width is chosen among: the benchmarked widths when they were given (or reused),
    else every OWN_WIDTH_STEP-th width, B and the benchmarked ones."""
    bench = sess.calibration_widths()
    if not auto:
        return bench
    return sorted({*range(OWN_WIDTH_STEP, sess.block_size + 1, OWN_WIDTH_STEP), sess.block_size, *bench})


def method_widths(sess: BenchSession, ctx: dict, auto: bool) -> dict:
    """Each speculative method's own width: the best cost-model speedup on the width model's replay among
    `own_width_candidates` (costmodel.choose), with its options calibrated nearest each width; kept per method in
    `sess.method_widths` (benchmark.json `settings.method_widths`), as the seed study records each method's own
    verification length. dflash's row comes from `auto_widths` when it ran (every width 1..B)."""
    cands = own_width_candidates(sess, auto)
    todo = [m for m in speculative_ids() if not (sess.method_widths.get(m) or {}).get("reused_from")
            and (m not in sess.method_widths or not auto)]
    bar = Progress(f"own widths: {len(todo)} methods x {len(cands)} widths on the replay", len(todo), log)
    for mid in todo:
        rows = width_rows(sess, mid, cands, ctx, note=f" ({mid})")
        sess.method_widths[mid] = {"selected": int(rows[choose(rows)]["setting"]["width"]),
                                   "table": _table_rows(rows), "candidates": cands}
        bar.update(note=f"{mid} w{sess.method_widths[mid]['selected']}")
    return sess.method_widths


def calibrate_own_widths(sess: BenchSession, cal_texts: list[str], ctx: dict) -> list[str]:
    """Calibrate each calibrated method at its own width when that width was not calibrated yet (calibrate_all
    calibrated the benchmarked widths), so its own-width case runs with options chosen at that width. A method that
    reuses another's choice adapts that method's selection at the nearest calibrated width. Returns the methods
    calibrated here."""
    done = []
    for info in calibrated():
        w = sess.own_width(info.id)
        per = sess.width_options.get(info.id)
        if w is None or per is None or w in per:
            continue
        cal = info.calibration
        if cal.reuses is None:
            rec = calibrate_one(sess, info.id, cal_texts, w, ctx)
        else:
            src = sess.options_for(cal.reuses, w)
            rec = {"selected": cal.adapt(src), "selected_options": cal.adapt(src), "reused_setting": dict(src)}
        per[w] = dict(rec["selected_options"])
        sess.calibration[info.id].setdefault("widths", {})[str(w)] = rec
        done.append(info.id)
    return done
