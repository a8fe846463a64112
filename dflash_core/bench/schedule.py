"""When rounds run and in which leg order: the base rounds after each case's first in seeded round-robin passes,
then the ranking rounds of the ranking width's cases, a number fixed before the run. Every added round is passed
to its case's pytest-benchmark record, so the saved JSON holds every round.

Why a fixed number of ranking rounds: racing (extra rounds until the leader separated) made the stopping time
depend on the data, and that named a single winner in 17-21 % of simulated runs at a 1.4 % true gap; the
selection (stats/selection.py) states a guarantee only for a design declared before looking.

Why the legs of a round run in a seeded random order: with greedy, dflash, method always in that order, a
position effect (the second decode of a pair running faster or slower) reads as a method effect; the rows that
draft exactly like dflash pooled at 0.954 against it. Randomised per round it averages out of every ratio, and
the report measures it on those rows (`leg_orders`).
"""

from __future__ import annotations

import logging
import random
import time
from typing import TYPE_CHECKING

from ..progress import Progress
from ..runtime.device import synchronize, torch_threads
from .cases import CaseRounds, summarize
from .config import BASELINE
from .rounds import decode_all

if TYPE_CHECKING:
    from .state import BenchSession

NORMAL_LEG, BASELINE_LEG, METHOD_LEG = "n", "b", "m"  # a round's leg order, e.g. "bnm" (`CaseRounds.legs`)
log = logging.getLogger(__name__)


def _refresh(sess: BenchSession, c: CaseRounds, seconds: float) -> None:
    """Recompute a case's figures after a round was added and pass the round to its pytest-benchmark record."""
    c.info.update(summarize(sess, c.method, c.width, c.stats_rounds, c.normal_walls, c.walls, c.kinds,
                            c.baseline_walls, c.legs, c.traces, normal_prompt_walls=c.normal_prompt_walls))
    if c.sink is not None:
        c.sink(seconds, c.info)


def leg_order(seed: int, key: str, index: int, legs: str) -> str:
    """The seeded order of a round's legs: the same for a (seed, case, round index), random across them."""
    order = list(legs)
    random.Random(f"{seed}:{key}:{index}").shuffle(order)
    return "".join(order)


def _run_round(sess: BenchSession, c: CaseRounds, key: str, legs: str) -> float:
    """Run one round's legs in their seeded order (`leg_order`); appends every wall and the order; returns the
    method leg's pytest-benchmark timer reading (perf_counter around it alone)."""
    order = leg_order(sess.cfg.seed, key, len(c.walls), legs)
    seconds = 0.0
    with torch_threads(sess.cfg.threads):
        for leg in order:
            if leg == NORMAL_LEG:
                _, stats, wall = decode_all(sess, "normal", 0)
                c.normal_walls.append(wall)
                c.normal_prompt_walls.append([s.wall_seconds for s in stats])
            elif leg == BASELINE_LEG:
                c.baseline_walls.append(decode_all(sess, BASELINE, c.width)[2])
            else:
                per_prompt: list = []
                t0 = time.perf_counter()
                _, stats, wall = decode_all(sess, c.method, c.width, rounds=per_prompt)
                synchronize(sess.rt.device)
                seconds = time.perf_counter() - t0
                c.walls.append(wall)
                c.stats_rounds.append(stats)
                c.traces.append(per_prompt)
    c.legs.append(order)
    return seconds


def base_round(sess: BenchSession, key: str) -> float:
    """One more base round of case `key`: normal, plain dflash at the case's width and the method, in a seeded
    random order; returns its speedup over greedy and passes the round and the figures to the case's record."""
    c = sess.case_rounds[key]
    if len(c.normal_walls) != len(c.walls):
        raise RuntimeError(f"{key}: a round with a normal leg after comparison-only rounds would misalign the "
                           "speedup pairs; run every base round before compare_round")
    legs = NORMAL_LEG + METHOD_LEG if c.method == "normal" else NORMAL_LEG + BASELINE_LEG + METHOD_LEG
    seconds = _run_round(sess, c, key, legs)
    _refresh(sess, c, seconds)
    return c.normal_walls[-1] / c.walls[-1] if c.walls[-1] > 0 else 0.0


def compare_round(sess: BenchSession, key: str) -> float:
    """One more ranking round of speculative case `key`: plain dflash at the case's width and the method, seconds
    apart, in a seeded random order, no normal leg; returns the round's ratio against dflash.

    Why no normal leg: the ranking compares each method with dflash (`comparison_rounds`), and a greedy decode costs
    ~2.4x a speculative one on the mini target, so leaving it out buys about twice the ranking rounds in the same
    time. The speedup over greedy keeps the base rounds, which have a normal leg."""
    c = sess.case_rounds[key]
    if c.method == "normal":
        raise ValueError("compare_round is for speculative cases: normal has no dflash leg")
    seconds = _run_round(sess, c, key, BASELINE_LEG + METHOD_LEG)
    _refresh(sess, c, seconds)
    return c.compared()[-1]


def case_keys(sess: BenchSession, *, with_normal: bool) -> list[str]:
    """The measured cases that are exact (normal, a normal-vs-normal pairing, only when `with_normal`)."""
    return [k for k, c in sess.case_rounds.items()
            if (with_normal or c.method != "normal") and all(v != "diverged" for v in c.kinds)]


def seeded_passes(pending, seed: int, step, desc: str | None = None, total: int | None = None) -> int:
    """Round-robin passes: while `pending(passes done)` names cases, run `step(case)` once for each, in an order
    shuffled per pass by a generator seeded with `seed`. Returns the number of passes. The one loop that
    schedules rounds (base rounds and ranking rounds alike).

    With `desc`, progress is logged (every ~20 s and at the end: steps done of `total`, elapsed, time left): the
    passes of a default run take minutes, and a loop that prints nothing for that long reads as hung."""
    rng = random.Random(seed)
    bar = Progress(desc, total or 0, log) if desc else None
    done = 0
    while order := list(pending(done)):
        rng.shuffle(order)
        for k in order:
            step(k)
            if bar is not None:
                bar.update(note=f"pass {done + 1}, {k}")
        done += 1
    return done


def run_passes(sess: BenchSession, passes: int, seed: int, step=None) -> dict:
    """The base rounds after each case's first, in `passes` round-robin passes over every exact case (normal
    included), each pass in its own seeded order.

    Why not all of a case's rounds back to back: on the shared 2-core box the machine's state drifts over
    minutes (the verify/decode cost ratio moved 10-15 % between runs), while rounds a few seconds apart agree
    to 1-2 %. Spread over the session, every case samples the same drift and its interval shows it.
    `step(sess, key)` runs one round of a case (default `base_round`)."""
    step = step or base_round
    keys = case_keys(sess, with_normal=True)
    t0 = time.perf_counter()
    passes = max(0, passes)
    seeded_passes(lambda done: list(keys) if done < passes else [], seed, lambda k: step(sess, k),
                  desc="base rounds (round-robin passes)", total=passes * len(keys))
    rec = {"schedule": "round-robin", "passes": passes, "cases": len(keys),
           "seconds": time.perf_counter() - t0}
    sess.passes = rec
    return rec


def top_up(sess: BenchSession, keys: list[str], rounds: int, seed: int, step=None) -> dict:
    """Comparison-only rounds (`compare_round`) until each of `keys` has `rounds` ratios against dflash, in
    round-robin passes in a seeded order per pass (`seeded_passes`, for the same reason as `run_passes`). The
    stopping rule looks only at round counts, never at the ratios. Returns `rounds`, `passes`, `added` per case,
    `seconds`."""
    step = step or compare_round
    t0 = time.perf_counter()
    added = {k: 0 for k in keys}

    def one(k: str) -> None:
        step(sess, k)
        added[k] += 1

    need = sum(max(0, rounds - len(sess.case_rounds[k].compared())) for k in keys)
    passes = seeded_passes(lambda _: [k for k in keys if len(sess.case_rounds[k].compared()) < rounds], seed, one,
                           desc=f"ranking top-up to {rounds} rounds", total=need)
    return {"rounds": rounds, "passes": passes, "added": added, "seconds": time.perf_counter() - t0}


def run_ranking(sess: BenchSession, step=None) -> dict:
    """The ranking rounds: every exact speculative case at the ranking width (chosen on calibration prompts before
    any case ran, `calibration.ranking_width`) gets `--bench-rank-rounds` ratios against plain dflash in all
    (`top_up`: its base rounds count). Each case's extra_info gets its `ranking` record ({rounds, top_up_rounds});
    the session keeps the whole record (benchmark.json `ranking_rounds`)."""
    width = sess.ranking_width
    keys = [k for k in case_keys(sess, with_normal=False)
            if sess.case_rounds[k].width == width and sess.case_rounds[k].compared()]
    rec = top_up(sess, keys, sess.cfg.rank_rounds, sess.cfg.seed, step)
    out = {"width": width, "statistic": "vs_baseline", "baseline": BASELINE, "rounds": rec["rounds"],
           "passes": rec["passes"], "seconds": rec["seconds"], "leg_order": "seeded random per round",
           "cases": {k: {"rounds": len(sess.case_rounds[k].compared()), "top_up_rounds": rec["added"][k]}
                     for k in keys}}
    for k in keys:
        c = sess.case_rounds[k]
        c.info["ranking"] = out["cases"][k]
        if c.sink is not None:
            c.sink(None, c.info)
    sess.ranking = out
    return out
