"""When rounds run: the base rounds after each case's first in seeded round-robin passes, the top-up of the
ranking width's cases, and racing (extra comparison rounds for the leader's rank group). Every added round is
passed to its case's pytest-benchmark record, so the saved JSON holds every round."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from ..progress import Progress
from ..runtime.device import synchronize, torch_threads
from .cases import CaseRounds, summarize
from .rounds import BASELINE, decode_all

if TYPE_CHECKING:
    from .session import BenchSession

log = logging.getLogger(__name__)


def _refresh(sess: BenchSession, c: CaseRounds, seconds: float) -> None:
    """Recompute a case's figures after a round was added and pass the round to its pytest-benchmark record."""
    c.info.update(summarize(sess, c.method, c.width, c.stats_rounds, c.normal_walls, c.walls, c.kinds,
                            c.baseline_walls))
    if c.info.get("model_speedup"):  # the model is the case's own (deterministic) rounds: only the measured side moved
        from .costmodel import measured_over_model

        c.info["measured_over_model"] = float(measured_over_model(c.info["speedup"], c.info["model_speedup"]))
    if c.sink is not None:
        c.sink(seconds, c.info)


def _timed_method(sess: BenchSession, c: CaseRounds) -> float:
    """The method's leg of a round: appends its wall and stats; returns pytest-benchmark's timer reading."""
    t0 = time.perf_counter()
    _, stats, wall = decode_all(sess, c.method, c.width)
    synchronize(sess.rt.device)
    seconds = time.perf_counter() - t0  # pytest-benchmark's own timer reading of a round (perf_counter)
    c.walls.append(wall)
    c.stats_rounds.append(stats)
    return seconds


def race_round(sess: BenchSession, key: str) -> float:
    """One more paired round of case `key` (normal, the dflash leg, then the method, as `paired_rounds` pairs
    them); returns its speedup and passes the round and the recomputed figures to the case's record."""
    c = sess.case_rounds[key]
    if len(c.normal_walls) != len(c.walls):
        raise RuntimeError(f"{key}: a round with a normal leg after comparison-only rounds would misalign the "
                           "speedup pairs; run every base round before compare_round")
    with torch_threads(sess.cfg.threads):
        c.normal_walls.append(decode_all(sess, "normal", 0)[2])
        if c.method != "normal":
            c.baseline_walls.append(decode_all(sess, BASELINE, c.width)[2])
        seconds = _timed_method(sess, c)
    _refresh(sess, c, seconds)
    return c.normal_walls[-1] / c.walls[-1] if c.walls[-1] > 0 else 0.0


def compare_round(sess: BenchSession, key: str) -> float:
    """One more round of the ranking statistic for speculative case `key`: plain dflash at the case's width, then
    the method, seconds apart, and no normal leg; returns the round's ratio against dflash.

    Why no normal leg: the rank groups compare each method with dflash (`comparison_rounds`), and a greedy decode
    costs ~2.4x a speculative one on the mini target, so leaving it out buys about twice the rounds of the
    ranking statistic in the same time. The speedup over greedy keeps the base rounds that have a normal leg."""
    c = sess.case_rounds[key]
    if c.method == "normal":
        raise ValueError("compare_round is for speculative cases: normal has no dflash leg")
    with torch_threads(sess.cfg.threads):
        c.baseline_walls.append(decode_all(sess, BASELINE, c.width)[2])
        seconds = _timed_method(sess, c)
    _refresh(sess, c, seconds)
    return c.compared()[-1]


def case_keys(sess: BenchSession, *, with_normal: bool) -> list[str]:
    """The measured cases that are exact (normal, a normal-vs-normal pairing, only when `with_normal`)."""
    return [k for k, c in sess.case_rounds.items()
            if (with_normal or c.method != "normal") and all(v != "diverged" for v in c.kinds)]


def seeded_passes(pending, seed: int, step, desc: str | None = None, total: int | None = None) -> int:
    """Round-robin passes: while `pending(passes done)` names cases, run `step(case)` once for each, in an order
    shuffled per pass by a generator seeded with `seed`. Returns the number of passes.

    With `desc`, progress is logged (every ~20 s and at the end: steps done of `total`, elapsed, time left): the
    passes of a default run take minutes, and a loop that prints nothing for that long reads as hung."""
    import random

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
    to 1-2 %. Back-to-back rounds gave tight intervals that missed that drift, so two runs disagreed beyond
    their intervals; spread over the session, every case samples the same drift and its interval shows it.
    `step(sess, key)` runs one paired round of a case (default `race_round`)."""
    step = step or race_round
    keys = case_keys(sess, with_normal=True)
    t0 = time.perf_counter()
    passes = max(0, passes)
    seeded_passes(lambda done: list(keys) if done < passes else [], seed, lambda k: step(sess, k),
                  desc="base rounds (round-robin passes)", total=passes * len(keys))
    rec = {"schedule": "round-robin", "passes": passes, "cases": len(keys),
           "seconds": time.perf_counter() - t0}
    sess.passes = rec
    return rec


def leading_width(cases: dict) -> int | None:
    """The width of the case with the highest median speedup over greedy (`report.stats.leading_width`): where the
    ranking is decided, since every method is compared there against plain dflash at that width."""
    import statistics

    from .stats import leading_width as lead

    return lead((statistics.median(c.speedups()), c.width) for c in cases.values() if c.speedups())

# Racing's time budget as a fraction of the base matrix's own time (its first case until the race starts, the
# round-robin passes included): half keeps the README main command under 20 min on 2 cores with prepare.
RACE_BUDGET_FRACTION = 0.5

# Before racing, every case at the leading width is topped up to this many x the base rounds of the ranking
# statistic (comparison-only rounds, round-robin). Why 4 (12 rounds by default): a case "separated" after 3 rounds
# had a bootstrap interval of about its min-max, and at 6 one outlier round still set an interval's edge, so two
# quiet runs put methods on either side of a group edge; replaying the three session-6 runs' rounds, groups of
# 12-round cases agreed between two simulated runs ~75 % of the time against ~25 % at 6 (docs/performance.md §11).
# A comparison round costs ~1 s on 2 cores, so 15 cases x 6 more rounds is ~90 s of the 20-minute budget.
RANK_MIN_FACTOR = 4


def top_up(sess: BenchSession, keys: list[str], rounds: int, seed: int, step=None) -> dict:
    """Comparison-only rounds (`compare_round`) until each of `keys` has `rounds` ratios against dflash, in
    round-robin passes in a seeded order per pass (`seeded_passes`, as `run_passes`, for the same reason: every
    case samples the machine's drift). Returns the record: `rounds`, `passes`, `added` per case, `seconds`."""
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


def run_race(sess: BenchSession, clock=time.perf_counter) -> dict:
    """Rank the exact speculative cases at the leading width: top every one of them up to RANK_MIN_FACTOR x the
    base rounds of its ratio against dflash (`top_up`), then race them (`racing.race`, comparison-only rounds):
    cap `race_max` x `rounds` per case, a time budget of RACE_BUDGET_FRACTION x the base matrix's own time (from
    the first case until the race starts; the top-up is not charged to it). Each case's extra_info gets its
    `race` record; the session keeps the whole record."""
    from .racing import race

    keys = case_keys(sess, with_normal=False)
    start = sess.matrix_started if sess.matrix_started is not None else clock()
    budget = RACE_BUDGET_FRACTION * max(0.0, clock() - start)
    width = leading_width({k: sess.case_rounds[k] for k in keys})
    # The race is run on what the rank groups compare: each case against plain dflash at the leading width.
    raced = [k for k in keys if sess.case_rounds[k].width == width and sess.case_rounds[k].compared()]
    cap = sess.cfg.rounds * sess.cfg.race_max
    topped = top_up(sess, raced, min(cap, RANK_MIN_FACTOR * sess.cfg.rounds), sess.cfg.seed)
    rounds = {k: sess.case_rounds[k].compared() for k in raced}
    # racing stops once the leader's group is resolved or the budget is spent: the total is the cap, an upper bound
    bar = Progress(f"race (at most {cap} rounds per case, {budget:.0f} s budget)",
                   sum(max(0, cap - len(r)) for r in rounds.values()), log)

    def step(k: str) -> float:
        ratio = compare_round(sess, k)
        bar.update(note=k)
        return ratio

    rec = race(rounds, step, sess.cfg.rounds, sess.cfg.race_max, budget, clock, resolution=sess.cfg.resolution)
    rec["width"] = width
    rec["statistic"] = "vs_baseline"
    rec["top_up"] = {k: v for k, v in topped.items() if k != "added"}
    for k in raced:
        c = sess.case_rounds[k]
        c.info["race"] = {**rec["cases"][k], "top_up_rounds": topped["added"][k]}
        if c.sink is not None:
            c.sink(None, c.info)
    sess.race = rec
    return rec
