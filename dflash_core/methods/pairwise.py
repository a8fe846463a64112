"""02 dflash2: top-K predecessor-aware dynamic programming (Viterbi) with the learned pair selector
(`selector.py`: pair(p→c) from low-rank tables gated by the context vector).

dflash2 selection over the B drafted positions, candidates id[i, j] with drafter values v[i, j]
(top-K per row, K=8, ranked by the tie rule of `common.topk`):

    dp[j]        = v[0, j] + pair(prev → id[0, j])            prev = the anchor (last committed token)
    S_i[p, j]    = dp[p] + pair(id[i-1, p] → id[i, j]) + v[i, j]
    back_i[j]    = first argmax_p S_i[p, j]                   (ties: the better-ranked predecessor)
    dp[j]        = S_i[back_i[j], j]
    end          = first argmax_j dp[j], then backtrack.

Guidance work = K + (B-1)·K² pair scores per block (the whole block is selected; the verify width trims after).
"""

from __future__ import annotations

from .base import MethodInfo
from .support.common import TopKOptions, first_argmax, topk
from .support.selector import PAIR_FITTER, ContextProposer


def viterbi(vals: list[list[float]], start: list[float], trans: list[list[list[float]]]) -> list[int]:
    """Best path through B rows of K candidates: Σ v[i, j_i] + start[j_0] + Σ trans[i-1][j_{i-1}][j_i].

    Ties: every argmax takes the first maximum (the better-ranked candidate), so among equally scored
    paths the one chosen is the smallest when compared from the last position backwards.
    Returns the chosen candidate index per row.
    """
    B = len(vals)
    dp = [v + s for v, s in zip(vals[0], start)]
    backs: list[list[int]] = []
    for i in range(1, B):
        tr = trans[i - 1]
        new, back = [], []
        for j, vj in enumerate(vals[i]):
            best, bp = dp[0] + tr[0][j], 0
            for p in range(1, len(dp)):
                s = dp[p] + tr[p][j]
                if s > best:
                    best, bp = s, p
            new.append(best + vj)
            back.append(bp)
        dp = new
        backs.append(back)
    j = first_argmax(dp)
    path = [j]
    for back in reversed(backs):
        j = back[j]
        path.append(j)
    return path[::-1]


class DFlash2Proposer(ContextProposer):
    def select(self, logits, hidden, prefix, k):
        ids, vals = topk(logits, self.options.top_k)
        prev = int(prefix[-1])
        scorer = self.block_scorer(ids, prev)
        start = scorer(prev, ids[0])
        path = viterbi(vals, start, scorer.transitions(ids))
        chosen = [ids[i][j] for i, j in enumerate(path)]
        return chosen, scorer.count, {"pair_scores": scorer.count}


INFO = MethodInfo(
    index=2, id="dflash2", label="DFlash2 (pair DP)", mechanism="top-K Viterbi with a learned low-rank pair selector",
    complexity="O(B·K²) pair scores per block", proposer=DFlash2Proposer, options=TopKOptions, fitters=(PAIR_FITTER,),
    stages=("draft block, keep top-K per position", "gate the pair tables with the context vector",
            "Viterbi over B positions with pair(prev→cand) links", "backtrack the best path, verify"),
    why_inactive="its pair-selector path kept the drafter's argmax at every position.")
