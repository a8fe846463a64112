"""One benchmark case (a method at a verify width): its paired rounds, exactness verdicts, plain-number
figures for pytest-benchmark's extra_info, mechanism activity and cost-model fields, and the record racing
extends (`CaseRounds`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..runtime.decode import DecodeStats
from ..runtime.device import torch_threads
from .rounds import BASELINE, PairedRounds, comparison_rounds, decode_all, paired_rounds, verdict_fields, verdicts
from .session import session_costs
from .stats import median_iqr

if TYPE_CHECKING:
    from .session import BenchSession


@dataclass
class CaseRounds:
    """A measured case's rounds, kept so racing can add paired rounds and recompute its figures."""

    method: str
    width: int
    normal_walls: list[float]
    walls: list[float]
    stats_rounds: list  # per round: the DecodeStats of every prompt
    kinds: list[str]  # exactness verdict per prompt
    info: dict  # the case's extra_info as measured (activity included)
    sink: Any = None  # (timer seconds, updated info) -> None: the case's pytest-benchmark record
    baseline_walls: list[float] = field(default_factory=list)  # plain dflash at this width, each round

    def speedups(self) -> list[float]:
        """Speedups over greedy: the rounds with a normal leg, which are a prefix of `walls` (`compare_round`)."""
        return [n / m for n, m in zip(self.normal_walls, self.walls) if m > 0]

    def compared(self) -> list[float]:
        """The rounds' ratios against plain dflash at the same width (`comparison_rounds`)."""
        return comparison_rounds(self.baseline_walls, self.walls)


def summarize(sess: BenchSession, method: str, width: int, stats_rounds: list[list], normal_walls: list[float],
              method_walls: list[float], kinds: list[str], baseline_walls: list[float] | None = None) -> dict:
    """Plain-number metrics for extra_info (no numpy scalars, no NaN): counts from the first timed round
    (every round decodes the same ids), seconds from all rounds."""
    first = DecodeStats.merge(stats_rounds[0])
    every = DecodeStats.merge([s for rnd in stats_rounds for s in rnd])
    # normal rounds are a prefix of the method's (the comparison-only rounds come after every base round):
    # the speedup over greedy pairs that prefix, tokens/s uses every round
    figs = PairedRounds(normal_walls, method_walls, []).figures(first.new_tokens)
    drafted = int(first.meta.get("drafted", first.proposed))  # trimming methods (ACT, DSpark) draft more
    vs = comparison_rounds(baseline_walls or [], method_walls)
    compared = {"vs_baseline_rounds": [float(x) for x in vs], "vs_baseline": float(median_iqr(vs)[0]),
                "baseline": BASELINE, "compared_rounds": len(vs)} if vs else {}
    return {**compared,
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


def measure_pair(sess: BenchSession, method: str, width: int, rounds: int, benchmark=None) -> dict:
    """Time `method` against `normal` in `rounds` paired rounds (see `paired_rounds`); records the case's
    width and trace on the session, and its rounds for racing (`run_race`).

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
        info = summarize(sess, method, width, stats_rounds, pr.normal_walls, pr.walls, kinds, pr.baseline_walls)
        info.update(cost_model_fields(sess, method, width, per_prompt, info["speedup"]))
    if act.get("activity") is not None:
        info["activity"] = act["activity"]
    sess.record_case(method, width, trace)
    sess.case_rounds[f"{method}-w{width}"] = CaseRounds(method, width, list(pr.normal_walls), list(pr.walls),
                                                        stats_rounds, kinds, dict(info),
                                                        _benchmark_sink(benchmark) if benchmark is not None else None,
                                                        list(pr.baseline_walls))
    return info


def activity_decode(sess: BenchSession, method: str, width: int) -> dict | None:
    """Mechanism activity of a case (docs/design.md §9): decode every prompt once, untimed, with the method's
    proposer wrapped in `activity.Shadowed` beside a plain dflash proposer at the same context, and count
    where their drafts differ and what that did to accepted drafts (`activity.summary`). None for normal."""
    from ..methods import get_method
    from ..runtime.decode import speculative
    from .activity import BASELINE, Shadowed, count_rounds, summary

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
    """Racing's extra rounds into the case's pytest-benchmark record, so the saved JSON the report is built from
    (docs/design.md §7) holds every round: its timer reading joins `stats` and the recomputed figures replace
    `extra_info`'s. pytest-benchmark's Stats caches its figures on first read, so a fresh Stats is built."""

    def sink(seconds: float | None, info: dict) -> None:
        from pytest_benchmark.stats import Stats

        meta = getattr(benchmark, "stats", None)  # None under --benchmark-disable
        if seconds is not None and meta is not None:
            fresh = Stats()
            for x in [*meta.stats.data, seconds]:
                fresh.update(x)
            meta.stats = fresh
        benchmark.extra_info.update(info)

    return sink


def case_costs(sess: BenchSession, method: str, width: int):
    """The case's component costs: the session's target costs and, for a speculative method, its proposer's
    per-call medians from one untimed decode of the first benchmark prompt (costmodel.TimedProposer)."""
    from ..methods import get_method
    from ..runtime.decode import speculative
    from .costmodel import TimedProposer

    costs = session_costs(sess)
    build = get_method(method).build
    if build is None:
        return costs
    timer = TimedProposer(build(sess.rt, sess.prepared, **sess.options_for(method, width)))
    speculative(sess.rt, timer, sess.prompt_ids[0], sess.cfg.tokens, width, method=method)
    return costs.with_proposer(timer.costs())


def cost_model_fields(sess: BenchSession, method: str, width: int, per_prompt: list, measured: float) -> dict:
    """extra_info's cost-model fields: `model_speedup` of the case's own rounds (every prompt; 1 for normal),
    `measured_over_model` (the median paired speedup over it) and the `component_costs` behind it."""
    from .costmodel import measured_over_model, model_speedup

    costs = case_costs(sess, method, width)
    model = model_speedup(per_prompt, costs) if method != "normal" else 1.0
    return {"model_speedup": float(model), "measured_over_model": float(measured_over_model(measured, model)),
            "component_costs": costs.to_dict()}
