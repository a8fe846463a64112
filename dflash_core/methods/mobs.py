"""Middle-out selectors over the drafter's top-K: 03 mobs and 07 bmobs (and the anchor rules 04/05 reuse).

Both fix one middle anchor and fill the rest outward with the learned pair selector
(`selector.PairScorer`: pair(p→c) from low-rank tables gated by the context vector). Candidates id[i, j]
and values v[i, j] are the drafter's top-K per position (K=8, `common.topk` tie rule); every argmax takes
the first maximum, i.e. the better-ranked candidate. prev is the anchor token of the block (the last
committed token), the true left neighbour of position 0.

03 mobs, 04 jump_mobs, 05 fused_jump, 07 bmobs.

All four fix a few positions first ("anchors") and fill the rest with the learned pair selector
(`pairwise.PairScorer`: pair(p→c) from low-rank tables gated by the context vector). Candidates id[i, j]
and values v[i, j] are the drafter's top-K per position (K=8, `common.topk` tie rule); every argmax takes
the first maximum, i.e. the better-ranked candidate. prev is the anchor token of the block (the last
committed token), the true left neighbour of position 0.

03 mobs, middle-out bidirectional selection, O(B·K):
  * anchor a: B//2 for odd B. For even B the two centres are (B/2 - 1, B/2); the choice is the parity of
    `context_fingerprint(prefix)` (a SplitMix64 hash of the last 4 committed token ids): even -> left
    centre, odd -> right centre. Token ids, not float features, so it is the same on every device/dtype.
  * anchor token: v[a] + left term + right term, where the left term is pair(prev → c) when a = 0 (prev
    is then the real neighbour) and otherwise pair(top1[a-1] → c), and the right term is pair(c → top1[a+1])
    when a + 1 < B (top1 = the drafter's argmax of that neighbour). The seed scored the anchor against
    prev even when prev was not adjacent; here it is scored for consistency with the drafter's own
    guesses of both neighbours.
  * expand outward, dist = 1, 2, ...: left L = a - dist first, v[L] + pair(id[L] → chosen[L+1]) (+ pair(prev
    → id[0]) when L = 0); then right R = a + dist, v[R] + pair(chosen[R-1] → id[R]). Every adjacent link
    of the block and the prev link are scored exactly once.

07 bmobs: the Boltzmann middle anchor. Among the centres, the one with the smaller top1-top2 margin
  (ties: the left centre); its token by the deterministic Gumbel rule of 06 (`boltzmann.boltzmann_pick`)
  with T = 0.35 and its own salt; then the rest is filled outward from the anchor in MOBS order. The seed
  filled with Jacobi waves, which with anchor 2 of B=4 never scored the link between positions 0 and 1;
  the outward order scores every link.

Guidance work = all pair scores + jump/residual scores + Boltzmann scores evaluated for the whole block.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import MethodInfo
from .boltzmann import SALT_BMOBS, BoltzmannOptions, boltzmann_pick, row_margin
from .support.common import TopKOptions, context_fingerprint, first_argmax, opt, topk
from .support.selector import PAIR_FITTER, ContextProposer, PairScorer

# --- anchor rules and fills -------------------------------------------------------------------------

def centres(block: int) -> tuple[int, ...]:
    """The middle position(s) of a block: (B//2,) for odd B, (B/2 - 1, B/2) for even B."""
    return (block // 2,) if block % 2 else (block // 2 - 1, block // 2)


def mobs_anchor(block: int, fingerprint: int) -> int:
    """MOBS anchor: the centre; for even B the parity of the context fingerprint picks left (0) or right (1)."""
    c = centres(block)
    return c[fingerprint & 1] if len(c) == 2 else c[0]


def _add(a: list[float], b: list[float]) -> list[float]:
    return [x + y for x, y in zip(a, b)]


def anchor_scores(anchor: int, ids, vals, scorer: PairScorer, prev: int) -> list[float]:
    """MOBS anchor scores: draft value + consistency with the left (prev at 0) and right top-1 neighbours."""
    s = list(vals[anchor])
    left = prev if anchor == 0 else ids[anchor - 1][0]
    s = _add(s, scorer(left, ids[anchor]))
    if anchor + 1 < len(ids):
        s = _add(s, scorer.into(ids[anchor], ids[anchor + 1][0]))
    return s


def expand_outward(chosen: list, anchor: int, ids, vals, scorer: PairScorer, prev: int) -> list[int]:
    """Fill every slot outward from a chosen anchor (left before right at each distance)."""
    chosen = list(chosen)
    B = len(ids)
    for dist in range(1, B):
        L, R = anchor - dist, anchor + dist
        if L >= 0:
            s = _add(vals[L], scorer.into(ids[L], chosen[L + 1]))
            if L == 0:
                s = _add(s, scorer(prev, ids[0]))
            chosen[L] = ids[L][first_argmax(s)]
        if R < B:
            s = _add(vals[R], scorer(chosen[R - 1], ids[R]))
            chosen[R] = ids[R][first_argmax(s)]
    return chosen


def mobs_select(ids, vals, scorer: PairScorer, prev: int, fingerprint: int) -> tuple[list[int], int]:
    B = len(ids)
    a = mobs_anchor(B, fingerprint)
    chosen: list = [None] * B
    chosen[a] = ids[a][first_argmax(anchor_scores(a, ids, vals, scorer, prev))]
    return expand_outward(chosen, a, ids, vals, scorer, prev), a


# --- 03 mobs ----------------------------------------------------------------------------------------

class MOBSProposer(ContextProposer):
    def select(self, logits, hidden, prefix, k):
        ids, vals = topk(logits, self.options.top_k)
        prev = int(prefix[-1])
        scorer = self.block_scorer(ids, prev)
        chosen, a = mobs_select(ids, vals, scorer, prev, context_fingerprint(prefix))
        return chosen, scorer.count, {"pair_scores": scorer.count, "mobs_anchor_sum": a}


# --- 07 bmobs ---------------------------------------------------------------------------------------

def bmobs_anchor(vals) -> int:
    """The centre with the smaller top1-top2 margin (ties: the left centre)."""
    cs = centres(len(vals))
    return min(cs, key=lambda c: (row_margin(vals[c]), c))


@dataclass(frozen=True)
class BMOBSOptions(BoltzmannOptions):
    """06's options with a warmer default: only the anchor is drawn, the fill is by pair scores."""

    temperature: float = opt(0.35, lo=0.0)


class BMOBSProposer(ContextProposer):
    def select(self, logits, hidden, prefix, k):
        ids, vals = topk(logits, self.options.top_k)
        prev = int(prefix[-1])
        scorer = self.block_scorer(ids, prev)
        a = bmobs_anchor(vals)
        seed = context_fingerprint(prefix) ^ SALT_BMOBS
        j, nb = boltzmann_pick(ids[a], vals[a], self.options.temperature, seed, a)
        chosen: list = [None] * len(ids)
        chosen[a] = ids[a][j]
        chosen = expand_outward(chosen, a, ids, vals, scorer, prev)
        return chosen, scorer.count + nb, {"pair_scores": scorer.count, "boltzmann_scores": nb,
                                           "bmobs_anchor_sum": a, "boltzmann_non_argmax": int(j != 0)}


INFO_MOBS = MethodInfo(
    index=3, id="mobs", label="MOBS", mechanism="middle-out bidirectional selection with pair scores",
    complexity="O(B·K) pair scores per block", proposer=MOBSProposer, options=TopKOptions, fitters=(PAIR_FITTER,),
    stages=("draft block, keep top-K per position", "pick the middle anchor (fingerprint parity for even B)",
            "anchor token: draft value + consistency with both neighbours", "expand outward left/right, verify"),
    why_inactive="its middle-out selection kept the drafter's argmax at every position.")

INFO_BMOBS = MethodInfo(
    index=7, id="bmobs", label="Boltzmann MOBS", mechanism="Boltzmann middle anchor + middle-out fill",
    complexity="O(K) hashed + O(B·K) pair scores per block", proposer=BMOBSProposer, options=BMOBSOptions,
    fitters=(PAIR_FITTER,),
    stages=("draft block, keep top-K per position", "anchor: the less confident centre",
            "anchor token by hashed Gumbel at T=0.35", "fill outward with pair scores, verify"),
    why_inactive="its Boltzmann middle anchor and MOBS fill kept the drafter's argmax at every position.")
