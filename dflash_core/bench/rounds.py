"""Paired timing: one leg decodes every benchmark prompt once (`decode_all`), and a round times the candidate
right after a fresh `normal` leg (and, for a speculative case, plain dflash at the same width), so every ratio
is paired inside the run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..methods.runner import run_method
from ..runtime.device import synchronize
from ..runtime.exactness import classify
from ..stats.summary import median_iqr

if TYPE_CHECKING:
    from .state import BenchSession


def decode_all(sess: BenchSession, method: str, width: int, trace: list | None = None,
               rounds: list | None = None):
    """Decode every benchmark prompt once with the options calibrated for `width`; returns (outputs, stats list,
    wall seconds summed). `trace` receives the first prompt's verify rounds, `rounds` one round list per prompt."""
    outs, stats = [], []
    opts = sess.options_for(method, width) if method != "normal" else {}
    for i, p in enumerate(sess.prompt_ids):
        tr = [] if rounds is not None else (trace if i == 0 else None)
        ids, st = run_method(method, sess.rt, sess.prepared, p, sess.cfg.tokens, width if method != "normal" else None,
                             trace=tr, **opts)
        if rounds is not None:
            rounds.append(tr)
            if i == 0 and trace is not None:
                trace.extend(tr)
        outs.append(ids)
        stats.append(st)
    return outs, stats, sum(s.wall_seconds for s in stats)


def verdicts(sess: BenchSession, outs: list[list[int]]) -> list[str]:
    return [classify(o, r, m, sess.rt.dtype).kind for o, r, m in zip(outs, sess.greedy_outputs, sess.margins)]


def verdict_fields(kinds: list[str]) -> dict:
    return {"exact": all(k != "diverged" for k in kinds), "verdicts": {k: kinds.count(k) for k in sorted(set(kinds))}}


@dataclass
class PairedRounds:
    """What `paired_rounds` measured: round i's `walls[i]` ran right after `normal_walls[i]` (and, for a
    speculative case, right after `baseline_walls[i]`: plain dflash at the same width, `comparison_rounds`)."""

    normal_walls: list[float]
    walls: list[float]
    results: list  # what each timed round's runner returned beside its wall seconds
    baseline_walls: list[float] = field(default_factory=list)
    normal_prompt_walls: list[list[float]] = field(default_factory=list)  # per normal leg: each prompt's seconds

    def figures(self, tokens: int) -> dict:
        """Speedup (per-round normal/candidate ratios) and tokens/s, each as median and IQR."""
        ratios = [n / m for n, m in zip(self.normal_walls, self.walls) if m > 0]
        sp, sp_iqr = median_iqr(ratios)
        tps, tps_iqr = median_iqr([tokens / w for w in self.walls if w > 0])
        return {"tokens_per_second": float(tps), "tokens_per_second_iqr": float(tps_iqr),
                "normal_tokens_per_second": float(median_iqr([tokens / w for w in self.normal_walls if w > 0])[0]),
                "speedup": float(sp), "speedup_iqr": float(sp_iqr), "speedup_rounds": [float(r) for r in ratios],
                "rounds": len(ratios)}  # the rounds paired with normal (a case's later rounds may have no normal leg)


def comparison_rounds(baseline_walls: list[float], walls: list[float]) -> list[float]:
    """Per round, baseline wall / method wall: how much faster than plain dflash at the same width the method
    ran, both timed within seconds of each other.

    Why: on the shared 2-core box the speedup over greedy switches between machine states minutes apart (a
    case's rounds came out bimodal, e.g. 2.3x and 2.8x for dflash, while rounds seconds apart agree to
    1-2 %); two speculative decodes at the same width are hit alike, so their ratio is what the rank groups
    compare. For dflash itself it is dflash against dflash: the comparison's own A/A noise."""
    return [b / m for b, m in zip(baseline_walls, walls) if m > 0]


def paired_rounds(sess: BenchSession, run, rounds: int, benchmark=None, warmup=None, baseline=None) -> PairedRounds:
    """Time `run()` (returns (wall seconds, result)) against `normal` in `rounds` interleaved rounds, after
    one untimed warm-up (`warmup()`, else `run()`; normal is warm: the session ran it for the greedy outputs).

    With a pytest-benchmark fixture, the rounds go through `benchmark.pedantic` and normal runs in its
    untimed setup right before each round, so each round's ratio is paired. `baseline()` (a wall in seconds), when
    given, runs in the setup too, after normal: the round's comparison leg (`comparison_rounds`).
    """
    pr = PairedRounds([], [], [])

    def run_normal():
        _, stats, wall = decode_all(sess, "normal", 0)
        pr.normal_walls.append(wall)
        pr.normal_prompt_walls.append([s.wall_seconds for s in stats])
        if baseline is not None:
            pr.baseline_walls.append(baseline())

    def run_timed():
        wall, result = run()
        pr.walls.append(wall)
        pr.results.append(result)
        synchronize(sess.rt.device)

    (warmup or run)()
    if benchmark is not None:
        benchmark.pedantic(run_timed, setup=run_normal, rounds=rounds, warmup_rounds=0, iterations=1)
    else:
        for _ in range(rounds):
            run_normal()
            run_timed()
    return pr
