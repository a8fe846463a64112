"""The deterministic cost-model speedup (docs/design.md §8) beside the wall-clock one.

A decode's rounds (drafts verified k_r and accepted a_r per target call) are deterministic; only the cost of
each component is timed, once, in isolation: a greedy step (t_decode), a verify of w drafts (t_verify[w],
w = 0..B, steady state with rollback), and per round the drafter (t_draft per drafted block, t_observe per
verified round), the selection (t_select per drafted block). Then

    normal = P·t_prefill + Σ_r (a_r + 1)·t_decode            (greedy emits the same tokens one per step)
    method = P·(t_prefill + t_begin) + Σ_r (t_verify[k_r] + t_observe + [k_r > 0]·(t_draft + t_select))
    model speedup = normal / method

over the P decoded prompts. The prefill is INCLUDED on both sides, as the wall-clock speedup includes it
(t_prefill cancels out of every calibration choice, so calibration passes 0); t_begin is the drafter's
prompt context. A round with k_r = 0 (the loop's last, when one token is left) drafts nothing.

Plain functions; torch is imported only by the measuring helpers.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

QUIET_SPREAD = 0.02  # A/A spread below which a measured/model ratio outside RATIO_BAND is not noise
RATIO_BAND = (0.9, 1.1)
# Model speedups within 1 % of the best are ties: the component timings behind them are medians of small
# timings and not resolved better than that; ties go to tokens per target call, then grid order.
TIE_TOLERANCE = 0.01
OBJECTIVE = "cost-model speedup on calibration prompts; ties: tokens per target call"


@dataclass(frozen=True)
class ComponentCosts:
    """Seconds of each component, measured in isolation (see the module docstring for the formula)."""

    t_decode: float
    t_verify: tuple[float, ...]  # index w: a verify of w drafts (a block of w + 1 rows)
    t_draft: float = 0.0
    t_observe: float = 0.0
    t_select: float = 0.0
    t_prefill: float = 0.0
    t_begin: float = 0.0

    def with_proposer(self, p: "ProposerCosts") -> "ComponentCosts":
        return replace(self, t_draft=p.t_draft, t_observe=p.t_observe, t_select=p.t_select, t_begin=p.t_begin)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["t_verify"] = [float(x) for x in self.t_verify]
        return {k: (float(v) if isinstance(v, (int, float)) else v) for k, v in d.items()}


@dataclass(frozen=True)
class ProposerCosts:
    t_draft: float = 0.0
    t_observe: float = 0.0
    t_select: float = 0.0
    t_begin: float = 0.0


def _k_a(r: Any) -> tuple[int, int]:
    """(drafts verified, accepted) of one round: a trace dict {draft, accepted, ...} or a (k, a) pair."""
    if isinstance(r, Mapping):
        return len(r["draft"]), int(r["accepted"])
    k, a = r
    return int(k), int(a)


def model_seconds(decodes: Sequence[Sequence[Any]], costs: ComponentCosts) -> tuple[float, float]:
    """(normal seconds, method seconds) the cost model predicts for these decodes (one round list per prompt)."""
    normal = method = 0.0
    for rounds in decodes:
        normal += costs.t_prefill
        method += costs.t_prefill + costs.t_begin
        for r in rounds:
            k, a = _k_a(r)
            if k >= len(costs.t_verify):
                raise ValueError(f"a round verified {k} drafts but t_verify covers 0..{len(costs.t_verify) - 1}")
            normal += (a + 1) * costs.t_decode
            method += costs.t_verify[k] + costs.t_observe + (costs.t_draft + costs.t_select if k > 0 else 0.0)
    return normal, method


def model_speedup(decodes: Sequence[Sequence[Any]], costs: ComponentCosts) -> float:
    """normal / method seconds of the model; 1.0 when nothing was decoded (normal against itself)."""
    normal, method = model_seconds(decodes, costs)
    return normal / method if method > 0 else 1.0


def measured_over_model(measured: float, model: float) -> float:
    return measured / model if model > 0 else 0.0


def unexplained_overhead(ratio: float | None, aa_spread: float | None) -> bool:
    """True when the machine was quiet (A/A spread < 2 %) and measured/model left [0.9, 1.1]: the wall clock
    saw a cost the components do not explain. On a noisy machine (or without A/A rounds) nothing is flagged."""
    if ratio is None or aa_spread is None or aa_spread >= QUIET_SPREAD:
        return False
    return not (RATIO_BAND[0] <= ratio <= RATIO_BAND[1])


def choose(rows: Sequence[Mapping], tolerance: float = TIE_TOLERANCE) -> int:
    """Index of the chosen row among rows with `all_exact`, `model_speedup`, `tokens_per_target_call`, in grid
    order: the highest model speedup; rows within `tolerance` (relative) of it tie, and the tie goes to more
    tokens per target call, then to the earlier row. Raw tok/s plays no part."""
    exact = [i for i, r in enumerate(rows) if r.get("all_exact", True)]
    if not exact:
        raise RuntimeError("calibration found no exact setting: the method or the rollback is broken")
    best = max(rows[i]["model_speedup"] for i in exact)
    tied = [i for i in exact if rows[i]["model_speedup"] >= best * (1.0 - tolerance)]
    return max(tied, key=lambda i: (rows[i]["tokens_per_target_call"], -i))


# --- measuring the components (torch only here) --------------------------------------------------------

def _median_call(fn, calls: int, device) -> float:
    return _interleaved({0: fn}, calls, device)[0]


def _interleaved(fns: dict, calls: int, device) -> dict:
    """Median seconds of each fn over `calls` passes, every pass calling each fn once in turn: a burst of load
    on a shared machine then slows every fn alike instead of whichever block of calls it fell on."""
    from ..runtime.device import synchronize

    xs: dict = {k: [] for k in fns}
    for _ in range(calls):
        for k, fn in fns.items():
            synchronize(device)
            t0 = time.perf_counter()
            fn()
            synchronize(device)
            xs[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in xs.items()}


def _verifier(rt, context: Sequence[int]):
    """A recording session at `context` whose verify(n) is rolled back whole, so the context stays put (steady
    state: the first forward after a prefill is slower, so it is warmed first)."""
    p = list(context)
    s = rt.session(recording=True)
    s.prefill(p[:-1])

    def verify(n):
        s.verify([p[-1]] * n)
        s.rollback(n)

    verify(1)
    verify(1)
    return verify


def verify_times(rt, context: Sequence[int], block_lens: Sequence[int], calls: int = 12) -> dict[int, float]:
    """Median seconds of a verify of each block length at `context`, the lengths interleaved call by call."""
    verify = _verifier(rt, context)
    return _interleaved({n: (lambda n=n: verify(n)) for n in block_lens}, calls, rt.device)


def target_costs(rt, context: Sequence[int], block_size: int, prompts: Sequence[Sequence[int]] = (),
                 calls: int = 12) -> ComponentCosts:
    """t_decode (a greedy step: a non-recording session, as `decode.greedy` runs; each timed step grows its
    context by one row, as greedy does), t_verify[0..B] at `context`, interleaved with it call by call, and
    t_prefill (mean over `prompts` of the median prefill; 0 without prompts)."""
    p = list(context)
    g = rt.session(recording=False)
    g.prefill(p[:-1])
    g.verify([p[-1]])  # warm-up
    verify = _verifier(rt, p)
    fns = {"decode": lambda: g.verify([p[-1]]), **{w: (lambda w=w: verify(w + 1)) for w in range(block_size + 1)}}
    t = _interleaved(fns, calls, rt.device)
    pre = [_median_call(lambda q=q: rt.session(recording=False).prefill(list(q)), 3, rt.device) for q in prompts]
    return ComponentCosts(t_decode=t["decode"], t_verify=tuple(t[w] for w in range(block_size + 1)),
                          t_prefill=statistics.fmean(pre) if pre else 0.0)


@dataclass
class TimedProposer:
    """Wraps a proposer and keeps each component's seconds per call (the decode loop itself is unchanged):
    the Proposal's draft/select seconds per drafted block, observe() per round, begin() per decode."""

    inner: Any
    draft: list[float] = field(default_factory=list)
    select: list[float] = field(default_factory=list)
    observe_s: list[float] = field(default_factory=list)
    begin_s: list[float] = field(default_factory=list)

    @property
    def taps(self):
        return self.inner.taps

    @property
    def max_width(self):
        return self.inner.max_width

    def begin(self, prompt, hidden) -> None:
        t0 = time.perf_counter()
        self.inner.begin(prompt, hidden)
        self.begin_s.append(time.perf_counter() - t0)

    def propose(self, prefix, k):
        prop = self.inner.propose(prefix, k)
        self.draft.append(float(prop.draft_seconds))
        self.select.append(float(prop.select_seconds))
        return prop

    def observe(self, hidden) -> None:
        t0 = time.perf_counter()
        self.inner.observe(hidden)
        self.observe_s.append(time.perf_counter() - t0)

    def costs(self) -> ProposerCosts:
        """Medians per call: robust to the odd slow call a loaded machine adds."""
        med = lambda xs: statistics.median(xs) if xs else 0.0  # noqa: E731
        return ProposerCosts(t_draft=med(self.draft), t_observe=med(self.observe_s), t_select=med(self.select),
                             t_begin=med(self.begin_s))


def pooled_costs(timers: Sequence[TimedProposer]) -> ProposerCosts:
    """One ProposerCosts from several decodes' timers (medians over every call of all of them)."""
    pool = TimedProposer(None)
    for t in timers:
        pool.draft += t.draft
        pool.select += t.select
        pool.observe_s += t.observe_s
        pool.begin_s += t.begin_s
    return pool.costs()
