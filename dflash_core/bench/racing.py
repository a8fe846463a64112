"""Racing: extra paired rounds only for the cases the ranking cannot yet tell from the leader.

After every case has its base rounds, the leader is the case with the highest median paired speedup, and
its contenders are the other members of its rank group (`report.stats.rank_groups` over each case's median and
95 % bootstrap interval, with the run's resolution: the report's own rule, so racing spends its rounds where the
report's first group is decided). In passes, the leader and every contender get one more paired round each, until the
leader's group has no other member, each of them has `max_factor` x the base rounds, or the time budget is spent.
A case outside the leader's group gets no extra round. Plain functions over per-round speedups and
an injected `step` (one more round of a case) and `clock`, so tests drive it with a fake timing model.

Stop reasons (per case, from the final state): `separated` (outside the leader's group; for the leader: alone
in it), `cap` (still in the leader's group, at the round cap), `budget` (still in it, below the cap, when the
time budget ran out).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence

from .stats import bootstrap_ci, rank_groups

SEPARATED, CAP, BUDGET = "separated", "cap", "budget"


def contenders(rounds: Mapping[str, Sequence[float]], resolution: float = 0.0) -> tuple[str | None, list[str]]:
    """(leader, the leader's rank group) — the group is empty when the leader is alone in it. Ties of the median
    go to the smaller id, so the choice does not depend on dict order."""
    live = {k: list(v) for k, v in rounds.items() if v}
    if not live:
        return None, []
    groups = rank_groups({k: (statistics.median(v), bootstrap_ci(v)) for k, v in live.items()}, resolution)
    first = groups[0]
    return first[0], (first if len(first) > 1 else [])


def race(rounds: dict[str, list[float]], step: Callable[[str], float], base_rounds: int, max_factor: int,
         budget_seconds: float | None = None, clock: Callable[[], float] = time.monotonic,
         resolution: float = 0.0) -> dict:
    """Race `rounds` (case -> paired speedups so far; extended in place). `step(case)` runs one more paired
    round of the case and returns its speedup. Returns the race record: the cap, the budget, the seconds spent,
    the passes and, per case, `rounds` (total), `extra_rounds` and `stop`."""
    if base_rounds < 1 or max_factor < 1:
        raise ValueError(f"racing needs base_rounds >= 1 and max_factor >= 1, got {base_rounds}, {max_factor}")
    cap = base_rounds * max_factor
    start = clock()
    extra = {k: 0 for k in rounds}
    passes, out_of_time = 0, False

    def spent() -> float:
        return clock() - start

    while not out_of_time:
        _, near = contenders(rounds, resolution)
        live = [k for k in near if len(rounds[k]) < cap]
        if not live:
            break
        for k in live:
            if budget_seconds is not None and spent() >= budget_seconds:
                out_of_time = True
                break
            rounds[k].append(float(step(k)))
            extra[k] += 1
        passes += 1
    leader, near = contenders(rounds, resolution)
    cases = {}
    for k, xs in rounds.items():
        if k not in near:
            stop = SEPARATED
        else:
            stop = CAP if len(xs) >= cap else BUDGET
        cases[k] = {"rounds": len(xs), "extra_rounds": extra[k], "stop": stop}
    return {"base_rounds": base_rounds, "max_factor": max_factor, "cap_rounds": cap, "resolution": resolution,
            "budget_seconds": budget_seconds, "spent_seconds": spent(), "passes": passes, "leader": leader,
            "unresolved": near, "cases": cases}
