"""Greedy and speculative decoding as a few small functions (gpt-fast style).

`greedy` is the exact reference (method 00). `speculative` drafts with a proposer, verifies the block in
one target forward, accepts the longest matching prefix, commits the correction (or, after full
acceptance, the bonus token) and rolls the target cache back. Both return `(ids, DecodeStats)`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from .device import synchronize
from .errors import BadInputError
from .target import TargetRuntime


@dataclass
class Proposal:
    """A drafted block. `ids` may be shorter than asked (e.g. ACT trims); the loop never verifies more."""

    ids: list[int]
    draft_seconds: float = 0.0
    select_seconds: float = 0.0
    guidance: int = 0  # selector/correction work, one definition for all methods (see methods/common.py)
    meta: dict = field(default_factory=dict)


class Proposer(Protocol):
    """Where methods plug in. The loop calls begin() once, then propose()/observe() once per round."""

    taps: tuple[int, ...]  # target layers whose outputs the proposer wants (empty: none)
    max_width: int | None  # the largest block it can draft (None: unbounded)

    def begin(self, prompt: list[int], hidden: Any) -> None:
        """Start a decode: `hidden` holds the taps for every prompt row (or None)."""

    def propose(self, prefix: list[int], k: int) -> Proposal:
        """Draft up to k tokens that follow `prefix` (prompt + committed; its last token is the anchor)."""

    def observe(self, hidden: Any) -> None:
        """Taps of the rows just verified and kept (all committed tokens but the newest)."""


@dataclass
class DecodeStats:
    """Contract 4 of DESIGN.md. Counts are exact integers; seconds come from perf_counter."""

    method: str = "normal"
    width: int = 0
    new_tokens: int = 0
    target_calls: int = 0
    draft_calls: int = 0
    proposed: int = 0
    accepted: int = 0
    accept_counts: list[int] = field(default_factory=list)  # histogram over target calls, bins 0..width
    position_proposed: list[int] = field(default_factory=list)  # per draft position i: times proposed
    position_accepted: list[int] = field(default_factory=list)  # per draft position i: times accepted
    wall_seconds: float = 0.0
    target_seconds: float = 0.0
    draft_seconds: float = 0.0
    select_seconds: float = 0.0
    guidance_work: int = 0
    stopped_at_eos: bool = False
    margins: list[float] | None = None  # greedy only, when asked: top1-top2 gap of every emitted token
    meta: dict = field(default_factory=dict)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_target_call(self) -> float:
        return self.new_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        """Conditional acceptance at draft position i: accepted_i / proposed_i."""
        return [a / p if p else 0.0 for a, p in zip(self.position_accepted, self.position_proposed)]

    @property
    def overhead_seconds(self) -> float:
        """Wall time outside target and drafter forwards and selection: the loop's own cost."""
        return max(0.0, self.wall_seconds - self.target_seconds - self.draft_seconds - self.select_seconds)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(acceptance_rate=self.acceptance_rate, tokens_per_target_call=self.tokens_per_target_call,
                 tokens_per_second=self.tokens_per_second, per_position_acceptance=self.per_position_acceptance,
                 overhead_seconds=self.overhead_seconds)
        return d


def _check_budget(n) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise BadInputError(f"token budget must be an integer >= 0, got {n!r}")
    return n


def _cut_at_eos(tokens: list[int], eos: int | None) -> tuple[list[int], bool]:
    if eos is not None and eos in tokens:
        return tokens[: tokens.index(eos) + 1], True
    return tokens, False


def greedy(runtime: TargetRuntime, prompt_ids: Sequence[int], max_new_tokens: int, *,
           stop_at_eos: bool = False, record_margins: bool = False) -> tuple[list[int], DecodeStats]:
    """Method 00: one target forward per token. The exact reference for every other method."""
    n = _check_budget(max_new_tokens)
    prompt = runtime.check_prompt(prompt_ids, n)
    eos = runtime.eos_token_id if stop_at_eos else None
    stats = DecodeStats(method="normal", width=0, accept_counts=[0])
    margins: list[float] = []
    out: list[int] = []
    synchronize(runtime.device)
    t0 = time.perf_counter()
    if n:
        sess = runtime.session(recording=False)
        step = sess.prefill(prompt, margins=record_margins)
        while True:
            stats.target_calls += 1
            stats.accept_counts[0] += 1
            stats.target_seconds += step.seconds
            out.append(step.ids[-1])
            if record_margins:
                margins.append(step.margins[-1])
            if len(out) >= n or (eos is not None and out[-1] == eos):
                break
            step = sess.verify([out[-1]], margins=record_margins)
    synchronize(runtime.device)
    stats.wall_seconds = time.perf_counter() - t0
    stats.new_tokens = len(out)
    stats.stopped_at_eos = eos is not None and bool(out) and out[-1] == eos
    stats.margins = margins if record_margins else None
    return out, stats


def speculative(runtime: TargetRuntime, proposer: Proposer, prompt_ids: Sequence[int], max_new_tokens: int,
                width: int, *, method: str = "speculative", stop_at_eos: bool = False,
                trace: list | None = None) -> tuple[list[int], DecodeStats]:
    """Draft-verify-accept loop. Each target call commits accepted + 1 tokens (correction or bonus).

    With `trace` (a list), one dict per verify round is appended: the draft, how many were accepted and
    the committed correction/bonus token (the report's mechanism explorer replays these).
    """
    n = _check_budget(max_new_tokens)
    cap = getattr(proposer, "max_width", None)
    if isinstance(width, bool) or not isinstance(width, int) or width < 1 or (cap is not None and width > cap):
        hi = cap if cap is not None else "B"
        raise BadInputError(f"verify width must be an integer in 1..{hi} (the drafter's block size), got {width!r}")
    prompt = runtime.check_prompt(prompt_ids, n)
    eos = runtime.eos_token_id if stop_at_eos else None
    taps = tuple(getattr(proposer, "taps", ()) or ())
    stats = DecodeStats(method=method, width=width, accept_counts=[0] * (width + 1),
                        position_proposed=[0] * width, position_accepted=[0] * width)
    out: list[int] = []
    synchronize(runtime.device)
    t0 = time.perf_counter()
    if n:
        sess = runtime.session(recording=True)
        step = sess.prefill(prompt, taps=taps)
        stats.target_calls += 1
        stats.accept_counts[0] += 1
        stats.target_seconds += step.seconds
        out.append(step.ids[-1])
        t_obs = time.perf_counter()
        proposer.begin(prompt, step.hidden)
        stats.draft_seconds += time.perf_counter() - t_obs  # drafter context K/V: drafter work, not loop overhead
        while len(out) < n and not (eos is not None and out[-1] == eos):
            k = min(width, n - len(out) - 1)  # verifying k drafts yields up to k + 1 tokens: never overshoot
            drafts: list[int] = []
            if k > 0:
                prop = proposer.propose(prompt + out, k)
                drafts = [int(t) for t in prop.ids[:k]]
                stats.draft_calls += 1
                stats.draft_seconds += prop.draft_seconds
                stats.select_seconds += prop.select_seconds
                stats.guidance_work += int(prop.guidance)
                for key, val in prop.meta.items():
                    if isinstance(val, (int, float)) and not isinstance(val, bool):
                        stats.meta[key] = stats.meta.get(key, 0) + val
            step = sess.verify([out[-1]] + drafts, taps=taps)
            stats.target_calls += 1
            stats.target_seconds += step.seconds
            g = step.ids
            a = 0
            while a < len(drafts) and drafts[a] == g[a]:
                a += 1
            sess.rollback(len(drafts) - a)
            stats.proposed += len(drafts)
            stats.accepted += a
            stats.accept_counts[a] += 1
            for i in range(len(drafts)):
                stats.position_proposed[i] += 1
                stats.position_accepted[i] += int(i < a)
            out.extend(drafts[:a])
            out.append(g[a])  # the correction, or after full acceptance the bonus token
            if trace is not None:
                trace.append({"draft": drafts, "accepted": a, "token": g[a], "bonus": a == len(drafts)})
            t_obs = time.perf_counter()
            proposer.observe(step.hidden[: a + 1] if step.hidden is not None else None)
            stats.draft_seconds += time.perf_counter() - t_obs
            if eos is not None and eos in out[-(a + 1):]:
                break
    out, hit = _cut_at_eos(out[:n], eos)
    synchronize(runtime.device)
    stats.wall_seconds = time.perf_counter() - t0
    stats.new_tokens = len(out)
    stats.stopped_at_eos = hit
    return out, stats
