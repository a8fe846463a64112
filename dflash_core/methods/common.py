"""Pieces shared by the drafter-based methods: the block proposer base class and timing.

Guidance work (one definition for every method): the number of candidate scores a selector or
corrector evaluates beyond the drafter's own argmax (pair scores, jump/residual scores, Boltzmann
scores, correction rows). Plain DFlash has 0.
"""

from __future__ import annotations

import time
from typing import Any

from ..decode import Proposal
from ..device import synchronize
from ..drafter import DraftState


class BlockProposer:
    """Runs the DFlash drafter once per round; subclasses choose the block from its logits."""

    def __init__(self, rt, prepared, **options: Any):
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
        self.state = DraftState(self.drafter)
        self.state.extend(hidden)

    def observe(self, hidden: Any) -> None:
        self.state.extend(hidden)

    def propose(self, prefix: list[int], k: int) -> Proposal:
        t0 = time.perf_counter()
        logits, hidden = self.state.draft(prefix[-1], self.embed, self.head)
        synchronize(self.rt.device)
        t1 = time.perf_counter()
        ids, guidance, meta = self.select(logits, hidden, prefix, k)
        t2 = time.perf_counter()
        return Proposal(ids=list(ids), draft_seconds=t1 - t0, select_seconds=t2 - t1, guidance=guidance,
                        meta=meta)

    def select(self, logits, hidden, prefix: list[int], k: int) -> tuple[list[int], int, dict]:
        raise NotImplementedError
