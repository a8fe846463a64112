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


# --- shared selection primitives (one definition each) -------------------------------------------

MASK64 = (1 << 64) - 1


def topk(logits, k: int):
    """Top-k per row with a documented tie rule: higher value first, then the LOWER token id first.

    torch.topk's order among equal values is unspecified, so ties are broken explicitly: every id whose
    value is >= the row's k-th largest value is a candidate (however many tie at the boundary), and the
    candidates are sorted on the host by (-value, id). Returns (ids [R][k], values [R][k]) as lists.
    """
    import torch

    k = max(1, min(int(k), logits.shape[-1]))
    x = logits.float()
    kth = torch.topk(x, k, dim=-1).values[..., -1:]
    ids_out, vals_out = [], []
    for r in range(x.shape[0]):
        idx = torch.nonzero(x[r] >= kth[r], as_tuple=True)[0]
        vals = x[r, idx]
        pairs = sorted(zip(vals.tolist(), idx.tolist()), key=lambda p: (-p[0], p[1]))[:k]
        ids_out.append([p[1] for p in pairs])
        vals_out.append([p[0] for p in pairs])
    return ids_out, vals_out


def splitmix64(x: int) -> int:
    """SplitMix64 finaliser on a Python int (mod 2^64): a stateless, platform-independent hash."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & MASK64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & MASK64
    x ^= x >> 31
    return x


def context_fingerprint(prefix, n: int = 4) -> int:
    """Hash of the last n committed token ids. Ids, not float features: identical on every device and dtype
    (the seed hashed float embeddings, which changed between CPU and GPU)."""
    h = 0x243F6A8885A308D3
    for t in list(prefix)[-n:]:
        h = splitmix64(h ^ (int(t) & MASK64))
    return h


def uniform(*keys: int) -> float:
    """A deterministic uniform in (0, 1) from integer keys (no RNG state)."""
    x = 0
    for k in keys:
        x = splitmix64(x ^ (int(k) & MASK64))
    return ((x >> 11) + 0.5) / float(1 << 53)


def gumbel(*keys: int) -> float:
    import math

    u = min(max(uniform(*keys), 1e-12), 1 - 1e-12)
    return -math.log(-math.log(u))


def gap_fill(chosen: list[int | None], cand_ids, cand_vals, score_pair, prev: int) -> tuple[list[int], int]:
    """Anchored gap fill (Jacobi waves): fill empty slots next to filled ones from a snapshot.

    score_pair(left_token, right_tokens[list]) -> list of scores. Each slot's score is its draft value plus
    the pair score with its left neighbour (or `prev` at slot 0) and with its right neighbour when filled.
    Returns (filled block, number of pair scores evaluated).
    """
    chosen = list(chosen)
    n = len(chosen)
    work = 0
    while any(c is None for c in chosen):
        snap = list(chosen)
        frontier = [i for i in range(n) if snap[i] is None and (
            i == 0 or snap[i - 1] is not None or (i + 1 < n and snap[i + 1] is not None))]
        if not frontier:
            raise RuntimeError("gap fill found no frontier")
        for i in frontier:
            cands = cand_ids[i]
            s = list(cand_vals[i])
            left = prev if i == 0 else snap[i - 1]
            if left is not None:
                ps = score_pair(left, cands)
                s = [a + b for a, b in zip(s, ps)]
                work += len(cands)
            if i + 1 < n and snap[i + 1] is not None:
                right = snap[i + 1]
                ps = [score_pair(c, [right])[0] for c in cands]
                s = [a + b for a, b in zip(s, ps)]
                work += len(cands)
            j = max(range(len(s)), key=lambda q: (s[q], -q))
            chosen[i] = cands[j]
    return chosen, work
