"""11 gated_mobs_v11: uncertainty-gated sparse MOBS with the learned pair selector of 02.

Per block (the full B slots; the verify width trims afterwards), top-K per slot by `common.topk`:
  u_i = 1 / (1 + exp(min(60, max(0, v1_i - v2_i) / max(1e-5, T))))     runner-up Boltzmann mass
  gated = slots with u_i >= gate, by priority u_i / (1 + early * i) (desc; lower slot on ties), first `budget`
  if none is gated, the block is the drafter's argmax and the selector is not called at all;
  else, visiting gated slots middle-out (by |i - (B-1)/2|, then i), re-choose slot i among its K
  candidates by v_ij + w * pair(left -> c_j) + w * pair(c_j -> right), where left is the current choice
  of slot i-1 (the last committed token at slot 0) and right the current choice of slot i+1 (if any).
pair(p -> c) is `selector.PairScorer` (low-rank tables gated by the fused target feature of the last
context row, artifact `pair_selector.pt`, fitted by 02's fitter). Config chosen by successive halving on
calibration prompts (`calibrate.calibrate_v11`); the default is the seed's frozen in-grid selection.

Guidance work: the pair scores evaluated (K per left link, K per right link of each gated slot). The
seed also added one "gate evaluation" per slot; the gate is a margin test like V10's, which counts
nothing for it, so here it is reported in meta only (`v11_gate_evaluations`), not as guidance (flaw 9).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .base import Calibration, MethodInfo
from .support.common import MethodOptions, first_argmax, opt, topk
from .support.selector import PAIR_FITTER, ContextProposer

V11_DEFAULTS = {"temperature": 0.04, "gate": 0.08, "budget": 3, "top_k": 4, "pair_weight": 1.0, "early": 0.15}
V11_GRID = {"temperature": (0.04, 0.08), "gate": (0.08, 0.16), "budget": (1, 2, 3), "top_k": (4, 8),
            "pair_weight": (1.0,), "early": (0.15,)}


def runner_up_mass(margin: float, temperature: float) -> float:
    return 1.0 / (1.0 + math.exp(min(60.0, max(0.0, margin) / max(1e-5, temperature))))


def gated_slots(vals, *, temperature: float, gate: float, budget: int, early: float) -> tuple[list[int], list[float]]:
    """(slots to re-choose, ordered by priority; the uncertainty u_i of every slot)."""
    u = [runner_up_mass(float(v[0]) - float(v[1]), temperature) if len(v) > 1 else 0.0 for v in vals]
    elig = sorted((i for i in range(len(vals)) if u[i] >= gate), key=lambda i: (-u[i] / (1.0 + early * i), i))
    return elig[:max(0, int(budget))], u


def middle_out(slots: list[int], block: int) -> list[int]:
    return sorted(slots, key=lambda i: (abs(i - (block - 1) / 2), i))


def gated_mobs(ids, vals, gated: list[int], scorer, prev: int, pair_weight: float) -> list[int]:
    """Re-choose the gated slots middle-out with pair links to their current neighbours."""
    chosen = [int(r[0]) for r in ids]
    B = len(ids)
    for i in middle_out(gated, B):
        left = int(prev) if i == 0 else chosen[i - 1]
        s = [float(v) + pair_weight * p for v, p in zip(vals[i], scorer(left, ids[i]))]
        if i + 1 < B:
            s = [a + pair_weight * p for a, p in zip(s, scorer.into(ids[i], chosen[i + 1]))]
        chosen[i] = int(ids[i][first_argmax(s)])
    return chosen


@dataclass(frozen=True)
class GatedMOBSOptions(MethodOptions):
    temperature: float = opt(V11_DEFAULTS["temperature"], above=0.0)
    gate: float = opt(V11_DEFAULTS["gate"])
    budget: int = opt(V11_DEFAULTS["budget"], lo=0, integer=True)
    top_k: int = opt(V11_DEFAULTS["top_k"], lo=1, integer=True)
    pair_weight: float = opt(V11_DEFAULTS["pair_weight"])
    early: float = opt(V11_DEFAULTS["early"])


class GatedMOBSProposer(ContextProposer):
    def select(self, logits, hidden, prefix, k):
        c = self.options
        ids, vals = topk(logits, int(c.top_k))
        B = len(ids)
        gated, u = gated_slots(vals, temperature=c.temperature, gate=c.gate, budget=c.budget,
                               early=c.early)
        if len(ids[0]) < 2 or not gated:
            chosen, work = [int(r[0]) for r in ids], 0
        else:
            prev = int(prefix[-1])
            scorer = self.block_scorer(ids, prev)
            chosen = gated_mobs(ids, vals, gated, scorer, prev, float(c.pair_weight))
            work = scorer.count
        n_elig = sum(1 for x in u if x >= c.gate)
        return chosen, work, {"v11_pair_scores": work, "v11_gate_evaluations": B, "v11_gated_positions": len(gated),
                              "v11_eligible_positions": n_elig, "v11_fast_argmax_positions": B - len(gated),
                              "v11_uncertainty_sum": float(sum(u))}


INFO = MethodInfo(
    index=11, id="gated_mobs_v11", label="V11 Boltzmann-Gated MOBS", mechanism="uncertainty-gated sparse MOBS",
    complexity="bounded O(budget K) pair scores", proposer=GatedMOBSProposer, options=GatedMOBSOptions,
    fitters=(PAIR_FITTER,),
    stages=("draft block; top-K per slot", "runner-up Boltzmann mass gates <= budget slots",
            "middle-out pair rescoring of gated slots", "others keep argmax; verify"),
    calibration=Calibration(grid=V11_GRID, search="halving"),
    why_inactive="its uncertainty gate never opened, or the re-chosen slots kept the argmax.")
