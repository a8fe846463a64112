"""The block proposer every drafter-based method builds on: one DFlash drafter run per round, then the
method's `select` chooses the block from the drafter's logits (and hidden rows)."""

from __future__ import annotations

import time
from typing import Any

import torch

from ...runtime import transfer
from ...runtime.decode import Proposal
from ...runtime.drafter import DraftState
from ...runtime.transfer import mark
from .common import top2


class BlockProposer:
    """Runs the DFlash drafter once per round; subclasses choose the block from its logits."""

    def __init__(self, rt, prepared, options: Any = None):
        self.rt = rt
        self.prepared = prepared
        self.drafter = prepared.drafter
        self.taps = tuple(self.drafter.cfg.taps)
        self.block_size = self.drafter.cfg.block_size
        self.max_width = self.block_size
        self.embed = rt.model.get_input_embeddings()
        self.head = rt.model.get_output_embeddings()
        self.options = options
        self.state: DraftState | None = None

    def begin(self, prompt: list[int], hidden: Any) -> None:
        # A replayed decode (bench.replay: the width model) hands out the trajectory's cached blocks instead.
        replay = getattr(self.rt, "draft_state", None)
        self.state = (replay(self.drafter, prompt) if replay is not None else None) or DraftState(self.drafter)
        self.state.extend(hidden)

    def observe(self, hidden: Any) -> None:
        self.state.extend(hidden)

    def draft(self, prefix: list[int]):
        """One drafter run from the last committed token: (logits [B, V], hidden [B, H])."""
        return self.state.draft(prefix[-1], self.embed, self.head)

    def propose(self, prefix: list[int], k: int) -> Proposal:
        """Draft, then select. The stage clocks are `transfer.mark`s: on a GPU, CUDA events read after the round's
        one transfer (no synchronisation of their own); on the CPU `perf_counter`, as always."""
        dev = self.rt.device
        t0 = mark(dev)
        logits, hidden = self.draft(prefix)
        t1 = mark(dev)
        ids, guidance, meta = self.select(logits, hidden, prefix, k)
        t2 = mark(dev)
        ids = ids if isinstance(ids, torch.Tensor) else list(ids)
        if isinstance(t0, float):
            return Proposal(ids=ids, draft_seconds=t1 - t0, select_seconds=t2 - t1, guidance=guidance, meta=meta)
        return Proposal(ids=ids, guidance=guidance, meta=meta, marks=(t0, t1, t2))

    def select(self, logits, hidden, prefix: list[int], k: int) -> tuple[Any, int, dict]:
        """(the block: host ids, or a long tensor on the device when selected there; guidance work; meta)."""
        raise NotImplementedError


class Top2Proposer(BlockProposer):
    """For the top-2 methods (13, 14): top-2 on the drafter's device, then O(B) host work on B x 2 lists.

    No device synchronise before the transfer (`transfer.to_host` is the synchronisation); the draft time
    includes the top-2 and its transfer, as these methods always measured it.
    """

    def propose(self, prefix: list[int], k: int) -> Proposal:
        t0 = time.perf_counter()
        logits, _ = self.draft(prefix)
        ids, vals = transfer.to_host(*top2(logits))  # the only transfer: B x 2 ids and values
        t1 = time.perf_counter()
        chosen, guidance, meta = self.choose(ids, vals, prefix)
        t2 = time.perf_counter()
        return Proposal(ids=chosen[:k], draft_seconds=t1 - t0, select_seconds=t2 - t1, guidance=guidance,
                        meta=meta)

    def choose(self, ids: list[list[int]], vals: list[list[float]], prefix: list[int]):
        raise NotImplementedError
