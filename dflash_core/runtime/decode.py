"""Greedy and speculative decoding as a few small functions (gpt-fast style).

`greedy` is the exact reference (method 00). `speculative` drafts with a proposer, verifies the block in
one target forward, accepts the longest matching prefix, commits the correction (or, after full
acceptance, the bonus token) and rolls the target cache back, one `speculative_round` per target call.
Both return `(ids, DecodeStats)`; each target call is one `DecodeStats.record`, and `DecodeStats.merge`
pools the stats of several decodes (the benchmark's per-case figures).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from ..errors import BadInputError
from .device import synchronize
from .target import TargetRuntime, TargetSession
from .transfer import seconds_between


@dataclass
class Proposal:
    """A drafted block. `ids` may be shorter than asked (e.g. ACT trims); the loop never verifies more.

    `ids` is a host list, or a 1-D long tensor on the target's device when the method selects there (dflash: the
    drafts reach the verify forward without a transfer). `marks` (three `transfer.mark`s: draft start, draft end,
    select end) replace the two seconds when the work ran on a GPU queue: they are read after the round's transfer.
    """

    ids: Any
    draft_seconds: float = 0.0
    select_seconds: float = 0.0
    guidance: int = 0  # selector/correction work, one definition for all methods (see methods/common.py)
    meta: dict = field(default_factory=dict)
    marks: tuple | None = None

    def settle(self) -> None:
        """Turn device marks into seconds (after the round's transfer, so reading them waits for nothing)."""
        if self.marks is not None:
            t0, t1, t2 = self.marks
            self.draft_seconds, self.select_seconds = seconds_between(t0, t1), seconds_between(t1, t2)
            self.marks = None


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
    """docs/design.md §4. Counts are exact integers; seconds come from perf_counter."""

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
    prefill_seconds: float = 0.0  # the prefill's target call (in target_seconds too): the cost model prices it apart
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

    def record(self, proposed: int, accepted: int, target_seconds: float, proposal: Proposal | None = None) -> None:
        """One target call: `proposed` drafts were verified and the first `accepted` kept (a prefill or a greedy
        step is a call with none proposed). `proposal` is the drafter's work for the round, if it drafted."""
        self.target_calls += 1
        self.target_seconds += target_seconds
        self.proposed += proposed
        self.accepted += accepted
        self.accept_counts[accepted] += 1
        for i in range(proposed):
            self.position_proposed[i] += 1
            self.position_accepted[i] += int(i < accepted)
        if proposal is not None:
            proposal.settle()
            self.draft_calls += 1
            self.draft_seconds += proposal.draft_seconds
            self.select_seconds += proposal.select_seconds
            self.guidance_work += int(proposal.guidance)
            for key, val in proposal.meta.items():
                if isinstance(val, (int, float)) and not isinstance(val, bool):
                    self.meta[key] = self.meta.get(key, 0) + val

    @classmethod
    def merge(cls, parts: Sequence["DecodeStats"]) -> "DecodeStats":
        """The stats of several decodes of one method as one: counts, histograms and seconds add up, so the
        derived rates (acceptance, tokens per call, per-position acceptance) are pooled, not averaged."""
        parts = list(parts)
        if not parts:
            raise ValueError("merge needs at least one DecodeStats")
        methods = {p.method for p in parts}
        if len(methods) > 1:
            raise ValueError(f"merge combines decodes of one method, got {sorted(methods)}")
        out = cls(method=parts[0].method, width=max(p.width for p in parts),
                  accept_counts=[0] * max(len(p.accept_counts) for p in parts),
                  position_proposed=[0] * max(len(p.position_proposed) for p in parts),
                  position_accepted=[0] * max(len(p.position_accepted) for p in parts),
                  stopped_at_eos=any(p.stopped_at_eos for p in parts),
                  margins=None if any(p.margins is None for p in parts) else [m for p in parts for m in p.margins])
        for p in parts:
            for name in ("new_tokens", "target_calls", "draft_calls", "proposed", "accepted", "guidance_work",
                         "wall_seconds", "target_seconds", "prefill_seconds", "draft_seconds", "select_seconds"):
                setattr(out, name, getattr(out, name) + getattr(p, name))
            for name in ("accept_counts", "position_proposed", "position_accepted"):
                acc = getattr(out, name)
                for i, c in enumerate(getattr(p, name)):
                    acc[i] += c
            for key, val in p.meta.items():
                if isinstance(val, (int, float)) and not isinstance(val, bool):
                    out.meta[key] = out.meta.get(key, 0) + val
        return out


def _check_budget(n) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise BadInputError(f"token budget must be an integer >= 0, got {n!r}")
    return n


def _cut_at_eos(tokens: list[int], eos: int | None) -> tuple[list[int], bool]:
    if eos is not None and eos in tokens:
        return tokens[: tokens.index(eos) + 1], True
    return tokens, False


def _start(runtime: TargetRuntime, prompt_ids: Sequence[int], n: int, stop_at_eos: bool
           ) -> tuple[list[int], int | None, float]:
    """The shared prologue: check the prompt, choose the EOS to stop at, start the clock on an idle device."""
    prompt = runtime.check_prompt(prompt_ids, n)
    eos = runtime.eos_token_id if stop_at_eos else None
    synchronize(runtime.device)
    return prompt, eos, time.perf_counter()


def _finish(runtime: TargetRuntime, stats: DecodeStats, out: list[int], n: int, eos: int | None,
            t0: float) -> tuple[list[int], DecodeStats]:
    """The shared epilogue: trim to the budget and the first EOS, stop the clock, count what was emitted."""
    out, hit = _cut_at_eos(out[:n], eos)
    synchronize(runtime.device)
    stats.wall_seconds = time.perf_counter() - t0
    stats.new_tokens = len(out)
    stats.stopped_at_eos = hit
    return out, stats


def greedy(runtime: TargetRuntime, prompt_ids: Sequence[int], max_new_tokens: int, *,
           stop_at_eos: bool = False, record_margins: bool = False) -> tuple[list[int], DecodeStats]:
    """Method 00: one target forward per token. The exact reference for every other method."""
    n = _check_budget(max_new_tokens)
    stats = DecodeStats(method="normal", width=0, accept_counts=[0], margins=[] if record_margins else None)
    out: list[int] = []
    prompt, eos, t0 = _start(runtime, prompt_ids, n, stop_at_eos)
    if n:
        sess = runtime.session(recording=False)
        step = sess.prefill(prompt, margins=record_margins)
        stats.prefill_seconds = step.seconds
        while True:
            stats.record(0, 0, step.seconds)
            out.append(step.ids[-1])
            if stats.margins is not None:
                stats.margins.append(step.margins[-1])
            if len(out) >= n or (eos is not None and out[-1] == eos):
                break
            step = sess.verify([out[-1]], margins=record_margins)
    return _finish(runtime, stats, out, n, eos, t0)


def _check_width(width, proposer: Proposer) -> int:
    cap = getattr(proposer, "max_width", None)
    if isinstance(width, bool) or not isinstance(width, int) or width < 1 or (cap is not None and width > cap):
        hi = cap if cap is not None else "B"
        raise BadInputError(f"verify width must be an integer in 1..{hi} (the drafter's block size), got {width!r}")
    return width


def speculative_round(sess: TargetSession, proposer: Proposer, prompt: list[int], out: list[int], k: int,
                      taps: tuple[int, ...], stats: DecodeStats, trace: list | None = None) -> int:
    """One round: propose k drafts after prompt + out, verify [anchor, drafts] in one target forward, accept
    the longest prefix that matches the target's argmax, roll the rejected rows back, commit the accepted
    drafts plus the correction (or, after full acceptance, the bonus token) to `out`. Returns the accepted count.
    """
    prop = proposer.propose(prompt + out, k) if k > 0 else None
    if prop is not None and not isinstance(prop.ids, list):  # drafts on the device: they join the anchor there
        step = sess.verify(_with_anchor(out[-1], prop.ids[:k]), taps=taps)
        drafts = step.block[1:]  # their host copy came back in the verify's one transfer
    else:
        drafts = [int(t) for t in prop.ids[:k]] if prop is not None else []
        step = sess.verify([out[-1]] + drafts, taps=taps)
    g = step.ids
    a = 0
    while a < len(drafts) and drafts[a] == g[a]:
        a += 1
    sess.rollback(len(drafts) - a)
    stats.record(len(drafts), a, step.seconds, prop)
    out.extend(drafts[:a])
    out.append(g[a])  # the correction, or after full acceptance the bonus token
    if trace is not None:
        # seconds: this round's verify forward, timed inside the loop (the cost model fits t_verify(k) on them)
        trace.append({"draft": drafts, "accepted": a, "token": g[a], "bonus": a == len(drafts),
                      "seconds": float(step.seconds)})
    t_obs = time.perf_counter()
    proposer.observe(step.hidden[: a + 1] if step.hidden is not None else None)
    stats.draft_seconds += time.perf_counter() - t_obs
    return a


def _with_anchor(anchor: int, drafts):
    """[anchor, d1..dk] as one long tensor on the drafts' device (a host-to-device copy: no synchronisation)."""
    import torch

    return torch.cat([torch.tensor([anchor], dtype=torch.long, device=drafts.device), drafts.to(torch.long)])


def speculative(runtime: TargetRuntime, proposer: Proposer, prompt_ids: Sequence[int], max_new_tokens: int,
                width: int, *, method: str = "speculative", stop_at_eos: bool = False,
                trace: list | None = None) -> tuple[list[int], DecodeStats]:
    """Draft-verify-accept loop. Each target call commits accepted + 1 tokens (correction or bonus).

    With `trace` (a list), one dict per verify round is appended: the draft, how many were accepted and
    the committed correction/bonus token (the report's mechanism explorer replays these).
    """
    n = _check_budget(max_new_tokens)
    width = _check_width(width, proposer)
    taps = tuple(getattr(proposer, "taps", ()) or ())
    stats = DecodeStats(method=method, width=width, accept_counts=[0] * (width + 1),
                        position_proposed=[0] * width, position_accepted=[0] * width)
    out: list[int] = []
    prompt, eos, t0 = _start(runtime, prompt_ids, n, stop_at_eos)
    if n:
        sess = runtime.session(recording=True)
        step = sess.prefill(prompt, taps=taps)
        stats.record(0, 0, step.seconds)
        stats.prefill_seconds = step.seconds
        out.append(step.ids[-1])
        t_obs = time.perf_counter()
        proposer.begin(prompt, step.hidden)
        stats.draft_seconds += time.perf_counter() - t_obs  # drafter context K/V: drafter work, not loop overhead
        while len(out) < n and not (eos is not None and out[-1] == eos):
            k = min(width, n - len(out) - 1)  # verifying k drafts yields up to k + 1 tokens: never overshoot
            a = speculative_round(sess, proposer, prompt, out, k, taps, stats, trace)
            if eos is not None and eos in out[-(a + 1):]:
                break
    return _finish(runtime, stats, out, n, eos, t0)
