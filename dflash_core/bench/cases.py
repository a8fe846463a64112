"""One benchmark case (a method at a verify width): its paired rounds, exactness verdicts, plain-number
figures for pytest-benchmark's extra_info, mechanism activity and cost-model fields, and the record the schedule
extends (`CaseRounds`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_benchmark.stats import Stats

from ..methods import get_method
from ..runtime.decode import DecodeStats, speculative
from ..runtime.device import torch_threads
from ..stats.summary import median_iqr
from .activity import Shadowed, count_rounds, summary
from .config import BASELINE
from .costmodel import loop_block
from .rounds import PairedRounds, comparison_rounds, decode_all, paired_rounds, verdict_fields, verdicts

if TYPE_CHECKING:
    from .state import BenchSession


@dataclass
class CaseRounds:
    """A measured case's rounds, kept so the schedule can add rounds and recompute its figures."""

    method: str
    width: int
    normal_walls: list[float]
    walls: list[float]
    stats_rounds: list  # per round: the DecodeStats of every prompt
    kinds: list[str]  # exactness verdict per prompt
    info: dict  # the case's extra_info as measured (activity included)
    sink: Any = None  # (timer seconds, updated info) -> None: the case's pytest-benchmark record
    baseline_walls: list[float] = field(default_factory=list)  # plain dflash at this width, each round
    legs: list[str] = field(default_factory=list)  # each round's leg order: "n" normal, "b" dflash, "m" the method
    traces: list = field(default_factory=list)  # per round: the method leg's trace of every prompt (timed rounds)
    normal_prompt_walls: list = field(default_factory=list)  # per normal leg: each prompt's seconds (`task_figures`)

    def speedups(self) -> list[float]:
        """Speedups over greedy: the rounds with a normal leg, which are a prefix of `walls` (`compare_round`)."""
        return [n / m for n, m in zip(self.normal_walls, self.walls) if m > 0]

    def compared(self) -> list[float]:
        """The rounds' ratios against plain dflash at the same width (`comparison_rounds`)."""
        return comparison_rounds(self.baseline_walls, self.walls)


def summarize(sess: BenchSession, method: str, width: int, stats_rounds: list[list], normal_walls: list[float],
              method_walls: list[float], kinds: list[str], baseline_walls: list[float] | None = None,
              legs: list[str] | None = None, traces: list | None = None, *,
              normal_prompt_walls: list | None = None) -> dict:
    """Plain-number metrics for extra_info (no numpy scalars, no NaN): counts from the first timed round
    (every round decodes the same ids), seconds from all rounds; `tasks` per task family (`task_figures`)."""
    first = DecodeStats.merge(stats_rounds[0])
    every = DecodeStats.merge([s for rnd in stats_rounds for s in rnd])
    # normal rounds are a prefix of the method's (the comparison-only rounds come after every base round):
    # the speedup over greedy pairs that prefix, tokens/s uses every round
    figs = PairedRounds(normal_walls, method_walls, []).figures(first.new_tokens)
    drafted = int(first.meta.get("drafted", first.proposed))  # trimming methods (ACT, DSpark) draft more
    vs = comparison_rounds(baseline_walls or [], method_walls)
    compared = {"vs_baseline_rounds": [float(x) for x in vs], "vs_baseline": float(median_iqr(vs)[0]),
                "baseline": BASELINE, "compared_rounds": len(vs)} if vs else {}
    order = {"leg_orders": [str(x) for x in legs]} if legs else {}
    loop = loop_block(stats_rounds, traces or [], greedy_case=method == "normal")
    tasks = task_figures(getattr(sess, "prompt_tasks", None) or [], stats_rounds, normal_prompt_walls or [])
    return {**compared, **order, "loop_costs": loop, **({"tasks": tasks} if tasks else {}),
        "method": method, "device": str(sess.rt.device.type), "dtype": str(sess.rt.dtype).replace("torch.", ""),
        "width": int(width), "prompts": len(sess.prompt_ids), "tokens_per_prompt": sess.cfg.tokens,
        "rounds": figs["rounds"], "new_tokens": int(first.new_tokens),
        **{k: figs[k] for k in ("tokens_per_second", "tokens_per_second_iqr", "normal_tokens_per_second",
                                "speedup", "speedup_iqr", "speedup_rounds")},
        "acceptance_rate": float(first.acceptance_rate), "drafted": drafted,
        "acceptance_rate_drafted": float(first.accepted / drafted) if drafted else 0.0,
        "tokens_per_target_call": float(first.tokens_per_target_call),
        "target_calls": int(first.target_calls), "draft_calls": int(first.draft_calls),
        "proposed": int(first.proposed), "accepted": int(first.accepted),
        "accept_histogram": [int(x) for x in first.accept_counts],
        "per_position_acceptance": [float(x) for x in first.per_position_acceptance],
        "guidance_work": int(first.guidance_work),
        "target_seconds": float(every.target_seconds),
        "draft_seconds": float(every.draft_seconds),
        "select_seconds": float(every.select_seconds),
        "overhead_fraction": float(every.overhead_seconds / every.wall_seconds) if every.wall_seconds else 0.0,
        **verdict_fields(kinds),
        "options": {k: v for k, v in (sess.options_for(method, width) if method != "normal" else {}).items()
                    if isinstance(v, (int, float, str))},
    }


def task_figures(tasks: list[str], stats_rounds: list[list], normal_prompt_walls: list[list[float]]) -> dict:
    """Per task family of the benchmark prompts: its prompts, tau and acceptance (first round: every round decodes
    the same ids) and its speedup over greedy per paired round (the family's greedy seconds over the method's,
    both summed over its prompts; median over rounds). {} when the prompts carry no tasks."""
    if not tasks or not stats_rounds or len(tasks) != len(stats_rounds[0]):
        return {}
    out = {}
    for task in dict.fromkeys(tasks):
        idx = [i for i, t in enumerate(tasks) if t == task]
        first = DecodeStats.merge([stats_rounds[0][i] for i in idx])
        ratios = [sum(nw[i] for i in idx) / m for nw, rnd in zip(normal_prompt_walls, stats_rounds)
                  if len(nw) == len(tasks) and (m := sum(rnd[i].wall_seconds for i in idx)) > 0]
        out[task] = {"prompts": len(idx), "tokens_per_target_call": float(first.tokens_per_target_call),
                     "acceptance_rate": float(first.acceptance_rate),
                     "speedup": float(median_iqr(ratios)[0]) if ratios else 0.0,
                     "speedup_rounds": [float(r) for r in ratios]}
    return out


def measure_pair(sess: BenchSession, method: str, width: int, rounds: int, benchmark=None) -> dict:
    """Time `method` against `normal` in `rounds` paired rounds (see `paired_rounds`); records the case's
    width and trace on the session, and its rounds for the schedule (`schedule.run_passes`, `run_ranking`). The
    first round runs inside pytest-benchmark's pedantic loop, which runs the other legs in its setup: normal, then
    dflash, then the method (`paired_rounds`); the later rounds' legs run in a seeded random order.

    The untimed warm-up of a speculative method is its activity decode (`activity_decode`): the method with a
    plain dflash shadow, never timed. The case's `activity` block comes from it."""
    if sess.matrix_started is None:
        sess.matrix_started = time.perf_counter()
    act: dict = {}

    def run():
        trace: list = []
        per_prompt: list = []
        outs, stats, wall = decode_all(sess, method, width, trace=trace, rounds=per_prompt)
        return wall, (outs, stats, trace, per_prompt)

    def warmup():
        act["activity"] = activity_decode(sess, method, width)

    def baseline():
        return decode_all(sess, BASELINE, width)[2]

    with torch_threads(sess.cfg.threads):
        pr = paired_rounds(sess, run, rounds, benchmark, warmup=None if method == "normal" else warmup,
                           baseline=None if method == "normal" else baseline)
        outs, _, trace, per_prompt = pr.results[0]
        kinds = verdicts(sess, outs)
        stats_rounds = [r[1] for r in pr.results]
        legs = ["nm" if method == "normal" else "nbm"] * len(pr.walls)
        traces = [r[3] for r in pr.results]
        info = summarize(sess, method, width, stats_rounds, pr.normal_walls, pr.walls, kinds, pr.baseline_walls, legs,
                         traces, normal_prompt_walls=pr.normal_prompt_walls)
    if act.get("activity") is not None:
        info["activity"] = act["activity"]
    sess.record_case(method, width, trace)
    sess.case_rounds[f"{method}-w{width}"] = CaseRounds(method, width, list(pr.normal_walls), list(pr.walls),
                                                        stats_rounds, kinds, dict(info),
                                                        _benchmark_sink(benchmark) if benchmark is not None else None,
                                                        list(pr.baseline_walls), legs, traces,
                                                        [list(w) for w in pr.normal_prompt_walls])
    return info


def activity_decode(sess: BenchSession, method: str, width: int) -> dict | None:
    """Mechanism activity of a case (docs/design.md §9): decode every prompt once, untimed, with the method's
    proposer wrapped in `activity.Shadowed` beside a plain dflash proposer at the same context, and count
    where their drafts differ and what that did to accepted drafts (`activity.summary`). None for normal."""
    info = get_method(method)
    if info.build is None:
        return None
    base = get_method(BASELINE)
    counts = None
    for p in sess.prompt_ids:
        prop = Shadowed(info.build(sess.rt, sess.prepared, **sess.options_for(method, width)),
                        base.build(sess.rt, sess.prepared, **sess.options_for(BASELINE, width)))
        ids, _ = speculative(sess.rt, prop, p, sess.cfg.tokens, width, method=method)
        counts = count_rounds(prop.rounds, ids, counts)
    return summary(method, counts or {}, info.why_inactive)


def _benchmark_sink(benchmark):
    """The schedule's extra rounds into the case's pytest-benchmark record, so the saved JSON the report is built from
    (docs/design.md §7) holds every round: its timer reading joins `stats` and the recomputed figures replace
    `extra_info`'s. pytest-benchmark's Stats caches its figures on first read, so a fresh Stats is built."""

    def sink(seconds: float | None, info: dict) -> None:
        meta = getattr(benchmark, "stats", None)  # None under --benchmark-disable
        if seconds is not None and meta is not None:
            fresh = Stats()
            for x in [*meta.stats.data, seconds]:
                fresh.update(x)
            meta.stats = fresh
        benchmark.extra_info.update(info)

    return sink
