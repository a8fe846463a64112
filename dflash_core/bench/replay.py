"""The width model's data: decodes replayed on the target's fixed greedy trajectory, with no target forward.

Why: a speculative decode commits exactly the greedy continuation, so what the target answers to any verify along
the way is already known once that continuation and its hidden-state taps are: the argmax after each accepted row
is the next greedy token, and the taps of the rows a round keeps are the trajectory's own rows. A `ReplayRuntime`
stands in for the target in `decode.speculative` and answers every verify from one uncached forward over the
trajectory, so the loop, the method's real proposer (its drafter forward, its selection, its history) and the
accepted counts are exactly a real decode's, at the drafter's cost alone. Calibration can then read thousands of
drafted blocks per width, where decoding 3 prompts x 24 tokens with the target saw too few rounds to show what a
wide block buys (a 24-token decode ends before a 16-wide block pays).

What differs from a decode with the target: the taps come from one forward over the whole trajectory instead of
cached block forwards, equal up to float summation order, so a draft at a near tie may flip; the replay prices
rounds, it proves nothing about exactness (the benchmark's cases do that, against the target).

A long trajectory is cut into segments of the benchmark's decode length (`segments`), each replayed as its own
decode (prompt: everything before it), so every replayed decode has the benchmark's round structure (the prefill
emits the first token, the last round is short) and a long calibration text gives many decodes, not one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import BadInputError
from ..runtime.decode import greedy
from ..runtime.drafter import anchored_blocks
from ..runtime.target import StepOutput, uncached_rows


@dataclass(frozen=True)
class Trajectory:
    """A prompt, its greedy continuation, and the taps of every row a decode of it feeds the target."""

    prompt: tuple[int, ...]
    tokens: tuple[int, ...]
    taps: Any  # [len(prompt) + len(tokens) - 1, n_taps * hidden]: rows prompt + tokens[:-1]
    layers: tuple[int, ...]  # the target layers the taps come from
    source: int = 0  # which calibration trajectory it is (a segment keeps its trajectory's: drafts are shared)

    def segment(self, start: int, length: int) -> "Trajectory":
        """The decode of `length` tokens that starts after `start` tokens of the continuation (its prompt: the
        prompt and those tokens). The taps are a view: the rows a decode of it feeds are a prefix of ours."""
        if not (0 <= start and 1 <= length and start + length <= len(self.tokens)):
            raise ValueError(f"segment [{start}, {start + length}) outside a continuation of {len(self.tokens)}")
        rows = len(self.prompt) + start + length - 1
        return Trajectory(self.prompt + self.tokens[:start], self.tokens[start:start + length], self.taps[:rows],
                          self.layers, self.source)


def trajectories(rt, prompts: Sequence[Sequence[int]], conts: Sequence[Sequence[int]] | int,
                 layers: Sequence[int]) -> list[Trajectory]:
    """Each prompt with its greedy continuation (`conts`, or an int: decode that many tokens with the cached greedy
    decode, the exactness reference) and the taps of its rows from one uncached, right-padded forward."""
    if isinstance(conts, int):
        conts = [greedy(rt, list(p), conts)[0] for p in prompts]
    conts = [[int(t) for t in c] for c in conts]
    if any(not c for c in conts):
        raise ValueError("replay: a trajectory needs at least one continuation token")
    seqs = [list(p) + c[:-1] for p, c in zip(prompts, conts)]
    if layers:
        rows = uncached_rows(rt, seqs, tuple(layers), with_logits=False)
    else:  # a proposer without taps: no forward needed, the rows only count
        import torch

        rows = [(torch.zeros(len(s), 0), None) for s in seqs]
    return [Trajectory(tuple(int(t) for t in p), tuple(c), h.to(rt.device), tuple(int(x) for x in layers), i)
            for i, (p, c, (h, _)) in enumerate(zip(prompts, conts, rows))]


def segments(trajs: Sequence[Trajectory], length: int, stride: int | None = None) -> list[Trajectory]:
    """Every trajectory cut into decodes of `length` tokens starting every `stride` tokens (default `length`:
    consecutive; a shorter stride gives overlapping decodes, each a decode of its own from another start). A tail
    shorter than `length` is dropped: its round structure is not the benchmark's."""
    stride = length if stride is None else stride
    if length < 1 or stride < 1:
        raise ValueError(f"segment length and stride must be >= 1, got {length} and {stride}")
    return [t.segment(s, length) for t in trajs for s in range(0, len(t.tokens) - length + 1, stride)]


class CachedDrafts:
    """Every anchor's drafted block along one trajectory, from batched drafter passes (`drafter.anchored_blocks`:
    each block reads the context rows before its anchor), computed a chunk of anchors at a time on first use.

    Why: a block drafted at an anchor depends only on the rows before it, which the trajectory fixes, so every
    method and every width that drafts at that anchor reads the same block; one batched pass streams the drafter's
    weights once per chunk instead of once per round. Equal to `DraftState.draft` up to float summation order."""

    CHUNK = 64

    def __init__(self, drafter, traj: Trajectory, embed):
        self.drafter, self.traj, self.embed = drafter, traj, embed
        self.seq = traj.prompt + traj.tokens
        self.hidden: dict[int, Any] = {}  # anchor row -> hidden rows [B, H]
        self.logits: dict[int, Any] = {}  # anchor row -> logits [B, V]

    def block(self, row: int, anchor: int, head) -> tuple[Any, Any]:
        if not (0 < row < len(self.seq)) or self.seq[row] != anchor:
            raise ValueError(f"replay: no anchor {anchor} at row {row} of the trajectory")
        import torch

        with torch.inference_mode():
            if row not in self.hidden:
                self._chunk(row)
            if row not in self.logits:
                self.logits[row] = self.drafter.logits(self.hidden[row], head)
        return self.logits[row], self.hidden[row]

    def _chunk(self, row: int) -> None:
        import torch

        last = min(len(self.seq) - 1, self.traj.taps.shape[0])  # an anchor reads rows < it: at most the taps held
        rows = list(range(row, min(row + self.CHUNK, last + 1)))
        dev = next(self.drafter.parameters()).device
        hid = anchored_blocks(self.drafter, self.traj.taps, torch.tensor(rows, device=dev),
                              torch.tensor([self.seq[r] for r in rows], device=dev), self.embed)
        for i, r in enumerate(rows):
            self.hidden[r] = hid[i]


class ReplayDraftState:
    """`runtime.drafter.DraftState` for a replayed decode: extending counts the context rows, drafting reads the
    trajectory's cached block at the next anchor (`CachedDrafts`)."""

    def __init__(self, cache: CachedDrafts):
        self.cache = cache
        self.length = 0

    def extend(self, taps) -> None:
        if taps is not None:
            self.length += int(taps.shape[0])

    def draft(self, anchor: int, embed, head) -> tuple[Any, Any]:
        return self.cache.block(self.length, int(anchor), head)


class ReplaySession:
    """`TargetSession`'s prefill/verify/rollback answered from a trajectory (module docstring)."""

    def __init__(self, runtime: "ReplayRuntime"):
        self.rt = runtime
        self.traj: Trajectory | None = None
        self.rows = 0  # rows the "target" has absorbed: the prompt, then each verified block, less rollbacks
        self.forwards = 0

    def _taps(self, start: int, n: int, taps: Sequence[int]):
        if not taps:
            return None
        if tuple(int(t) for t in taps) != self.traj.layers:
            raise ValueError(f"the trajectory holds taps of layers {self.traj.layers}, the proposer asks for "
                             f"{tuple(taps)}")
        return self.traj.taps[start:start + n]

    def prefill(self, prompt: list[int], *, taps: Sequence[int] = (), margins: bool = False) -> StepOutput:
        self.traj = self.rt.trajectory(prompt)
        self.rows = len(prompt)
        self.forwards += 1
        return StepOutput(ids=[self.traj.tokens[0]], hidden=self._taps(0, len(prompt), taps))

    def verify(self, block: list[int], *, taps: Sequence[int] = (), margins: bool = False) -> StepOutput:
        """The greedy token after each row of `block` while the block follows the trajectory; after the first row
        that leaves it the target's answer is unknown (-1), and the loop never reads it (it commits the answer
        after the accepted rows only)."""
        if not isinstance(block, list):  # drafts handed over on the device (a 1-D tensor)
            block = [int(x) for x in block.tolist()]
        t, p = self.traj, len(self.traj.prompt)
        at = self.rows - p  # index in t.tokens of block[0], the last committed token
        if not block or at < 0 or at >= len(t.tokens) or block[0] != t.tokens[at]:
            raise ValueError("replay: the block does not start at the trajectory's next committed token")
        ids, on = [], True
        for i in range(len(block)):
            on = on and (i == 0 or block[i] == t.tokens[at + i])
            nxt = at + 1 + i
            ids.append(t.tokens[nxt] if on and nxt < len(t.tokens) else -1)
        hidden = self._taps(self.rows, len(block), taps)
        self.rows += len(block)
        self.forwards += 1
        return StepOutput(ids=ids, hidden=hidden, block=list(block))

    def rollback(self, n_rejected: int) -> None:
        if n_rejected < 0:
            raise BadInputError(f"cannot roll back a negative number of tokens ({n_rejected})")
        self.rows -= n_rejected


class ReplayRuntime:
    """A `TargetRuntime` whose sessions replay `trajs` (everything but the sessions and the prompt check is the
    real runtime's: proposers built on it read the target's embeddings and head as usual)."""

    def __init__(self, rt, trajs: Sequence[Trajectory], *, cached_drafts: bool = True):
        self._rt = rt
        self._by_prompt = {t.prompt: t for t in trajs}
        self._full = {t.source: t for t in sorted(trajs, key=lambda t: len(t.taps))}  # each source's longest
        self._drafts: dict[tuple[int, int], CachedDrafts] = {}
        self.cached_drafts = cached_drafts

    def __getattr__(self, name: str):
        return getattr(self._rt, name)

    @property
    def real(self):
        return self._rt

    def trajectory(self, prompt: Sequence[int]) -> Trajectory:
        t = self._by_prompt.get(tuple(int(x) for x in prompt))
        if t is None:
            raise ValueError("replay: no trajectory for this prompt")
        return t

    def check_prompt(self, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
        t = self.trajectory(prompt_ids)
        if max_new_tokens > len(t.tokens):
            raise ValueError(f"replay: {max_new_tokens} tokens asked of a trajectory of {len(t.tokens)}")
        return list(t.prompt)

    def session(self, *, recording: bool = True) -> ReplaySession:
        return ReplaySession(self)

    def draft_state(self, drafter, prompt: Sequence[int]):
        """The drafter state a block proposer begins a replayed decode with: the cached blocks of the prompt's
        trajectory (None without `cached_drafts`: the proposer drafts for itself, as in a real decode)."""
        if not self.cached_drafts:
            return None
        t = self.trajectory(prompt)
        key = (t.source, id(drafter))
        if key not in self._drafts:
            self._drafts[key] = CachedDrafts(drafter, self._full[t.source], self._rt.model.get_input_embeddings())
        return ReplayDraftState(self._drafts[key])
