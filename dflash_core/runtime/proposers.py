"""Proposers that need no training, for tests and upper bounds.

`OracleProposer` replays a known greedy continuation (tau = w + 1 when uncorrupted); corrupting chosen
positions exercises partial acceptance deterministically. `RandomProposer` proposes seeded random ids
(acceptance ~ 0), exercising the reject path on every round.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .decode import Proposal


@dataclass
class OracleProposer:
    """Replays `reference` (the greedy continuation of `prompt`); positions in `corrupt` are made wrong."""

    prompt: Sequence[int]
    reference: Sequence[int]
    vocab_size: int
    corrupt: frozenset[int] = frozenset()
    max_width: int | None = None
    taps: tuple[int, ...] = ()

    def begin(self, prompt: list[int], hidden: Any) -> None:
        if list(prompt) != list(self.prompt):
            raise ValueError("OracleProposer was built for another prompt")

    def propose(self, prefix: list[int], k: int) -> Proposal:
        start = len(prefix) - len(self.prompt)
        ids = []
        for pos in range(start, start + k):
            tok = self.reference[pos] if pos < len(self.reference) else 0
            if pos in self.corrupt:
                tok = (tok + 1) % self.vocab_size
            ids.append(int(tok))
        return Proposal(ids=ids)

    def observe(self, hidden: Any) -> None:
        return None


@dataclass
class RandomProposer:
    """Seeded uniform random drafts."""

    vocab_size: int
    seed: int = 0
    max_width: int | None = None
    taps: tuple[int, ...] = ()
    _rng: random.Random = field(default=None, repr=False)  # type: ignore[assignment]

    def begin(self, prompt: list[int], hidden: Any) -> None:
        self._rng = random.Random(self.seed)

    def propose(self, prefix: list[int], k: int) -> Proposal:
        return Proposal(ids=[self._rng.randrange(self.vocab_size) for _ in range(k)])

    def observe(self, hidden: Any) -> None:
        return None
