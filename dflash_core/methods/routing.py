"""10 boltzmann_v10 and 13 minop_v13: sparse uncertainty routing between a slot's top-1 and top-2.

Shared policy. For slot i let m_i = v1_i - v2_i (top1 - top2 draft logit). Only slots with m_i < cutoff
are uncertain. An uncertain slot switches to its runner-up by a deterministic Boltzmann coin:
p2 = 1 / (1 + exp(min(60, m / T_eff))), T_eff = max(1e-5, T / (1 + slope * m)), m = max(0, m_i),
switch iff uniform(context_fingerprint(prefix), i, t1, t2) < p2 (no RNG state; keyed on token ids).
Uncertain slots are visited by priority m_i * (1 + 0.2 * i) (ascending, lower slot first on ties).

* 10 `boltzmann_v10`: the full B x V logits go to the host, top-2 is taken there, and the first `budget`
  uncertain slots by priority get a coin. Guidance work: 2 per coin (two candidate scores).
  Config (T, cutoff, budget, slope) chosen by successive halving on calibration prompts
  (`calibrate.calibrate_v10`); the default is the seed's frozen in-grid selection.
* 13 `minop_v13`: the same policy with the top-2 computed on the drafter's device (only B x 2 ids and
  values leave it) and a routing budget forced to ONE slot: the argmin of the priority among uncertain
  slots. From V10's calibrated choice it keeps T, cutoff and slope; V10's budget is NOT kept (always 1),
  so V13 equals V10 exactly when V10's selected budget is 1 and differs by policy otherwise (seed flaw 3,
  now explicit: build V13 from V10's selection with `v13_options(selected)`). Guidance work: 2 per
  routed block.

Tie order (seed flaw 4): V10 and V13 take their top-2 with the same function, `common.top2`, the lab's
one tie rule (higher value first, then the lower token id), on any device and for any number of ties.
Selection runs on the full block of B slots; the verify width trims the block afterwards.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import BadInputError
from .base import Calibration, MethodInfo
from .support.block import BlockProposer, Top2Proposer
from .support.common import MethodOptions, context_fingerprint, opt, top2, uniform

POSITION_WEIGHT = 0.2  # priority m_i * (1 + 0.2 i): later slots need a smaller margin to be routed first
V10_DEFAULTS = {"temperature": 0.03, "cutoff": 0.15, "budget": 1, "slope": 1.5}  # seed's frozen in-grid pick
V10_GRID = {"temperature": (0.03, 0.06, 0.10, 0.16), "cutoff": (0.05, 0.15, 0.35), "budget": (1, 2),
            "slope": (1.5,)}


def priority(m: float, i: int) -> float:
    return m * (1.0 + POSITION_WEIGHT * i)


def switch_probability(m: float, temperature: float, slope: float) -> float:
    m = max(0.0, m)
    t = max(1e-5, temperature / (1.0 + slope * m))
    return 1.0 / (1.0 + math.exp(min(60.0, m / t)))


def coin(fp: int, pos: int, t1: int, t2: int, m: float, temperature: float, slope: float) -> bool:
    """The deterministic Boltzmann two-way decision: True switches slot `pos` to its runner-up t2."""
    return uniform(fp, pos, t1, t2) < switch_probability(m, temperature, slope)


def margins(vals) -> list[float]:
    return [float(v[0]) - float(v[1]) for v in vals]


def route_v10(ids, vals, fp: int, *, temperature: float, cutoff: float, budget: int, slope: float):
    """V10 on host top-2 lists. Returns (chosen ids, {"uncertain", "sampled", "switched"})."""
    m = margins(vals)
    chosen = [int(r[0]) for r in ids]
    eligible = sorted((i for i in range(len(ids)) if m[i] < cutoff), key=lambda i: priority(m[i], i))
    sampled = eligible[:max(0, int(budget))]
    switched = 0
    for i in sampled:
        if coin(fp, i, int(ids[i][0]), int(ids[i][1]), m[i], temperature, slope):
            chosen[i] = int(ids[i][1])
            switched += 1
    return chosen, {"uncertain": len(eligible), "sampled": len(sampled), "switched": switched}


def route_v13(ids, vals, fp: int, *, temperature: float, cutoff: float, slope: float):
    """V13: at most one routed slot, the first minimum of the priority among uncertain slots."""
    m = margins(vals)
    chosen = [int(r[0]) for r in ids]
    pos, best = None, math.inf
    n_unc = 0
    for i in range(len(ids)):
        if m[i] < cutoff:
            n_unc += 1
            p = priority(m[i], i)
            if p < best:
                pos, best = i, p
    switched = 0
    if pos is not None and coin(fp, pos, int(ids[pos][0]), int(ids[pos][1]), m[pos], temperature, slope):
        chosen[pos] = int(ids[pos][1])
        switched = 1
    return chosen, {"uncertain": n_unc, "sampled": int(pos is not None), "switched": switched}


@dataclass(frozen=True)
class RoutingOptions(MethodOptions):
    temperature: float = opt(V10_DEFAULTS["temperature"], above=0.0)
    cutoff: float = opt(V10_DEFAULTS["cutoff"], lo=0.0)
    budget: int = opt(V10_DEFAULTS["budget"], lo=0, integer=True)
    slope: float = opt(V10_DEFAULTS["slope"], lo=0.0)


@dataclass(frozen=True)
class MinOpOptions(MethodOptions):
    """V10's options with the budget fixed to one slot (accepted only as 1, for V10-shaped settings)."""

    temperature: float = opt(V10_DEFAULTS["temperature"], above=0.0)
    cutoff: float = opt(V10_DEFAULTS["cutoff"], lo=0.0)
    slope: float = opt(V10_DEFAULTS["slope"], lo=0.0)
    budget: int = opt(1, lo=0, integer=True)

    def check(self) -> None:
        if self.budget != 1:
            raise BadInputError("minop_v13 routes at most one slot (its budget is fixed to 1); build it from "
                                "V10's selection with routing.v13_options(selected), which drops the budget")


class BoltzmannV10Proposer(BlockProposer):
    def select(self, logits, hidden, prefix, k):
        host = logits.float().cpu()  # the seed's path: full B x V logits leave the device
        ids_t, vals_t = top2(host)
        ids, vals = ids_t.tolist(), vals_t.tolist()
        o = self.options
        chosen, info = route_v10(ids, vals, context_fingerprint(prefix), temperature=o.temperature,
                                 cutoff=o.cutoff, budget=o.budget, slope=o.slope)
        B = len(ids)
        return chosen, 2 * info["sampled"], {"v10_candidate_scores": 2 * info["sampled"],
                                             "v10_uncertain_positions": info["uncertain"],
                                             "v10_sampled_positions": info["sampled"],
                                             "v10_switched_positions": info["switched"],
                                             "v10_fast_argmax_positions": B - info["sampled"]}


def v13_options(v10_selected: dict) -> dict:
    """V13's options from V10's calibrated setting: keeps T, cutoff, slope; drops the budget (forced to 1)."""
    return {k: v10_selected[k] for k in ("temperature", "cutoff", "slope") if k in v10_selected}


class MinOpV13Proposer(Top2Proposer):
    def choose(self, ids, vals, prefix):
        o = self.options
        chosen, info = route_v13(ids, vals, context_fingerprint(prefix), temperature=o.temperature,
                                 cutoff=o.cutoff, slope=o.slope)
        B = len(ids)
        return chosen, 2 * info["sampled"], {"v13_candidate_scores": 2 * info["sampled"],
                                             "v13_routed_positions": info["sampled"],
                                             "v13_uncertain_positions": info["uncertain"],
                                             "v13_switched_positions": info["switched"],
                                             "v13_fast_argmax_positions": B - info["sampled"],
                                             "v13_top2_values_transferred": 2 * B}


INFO_V10 = MethodInfo(
    index=10, id="boltzmann_v10", label="V10 Advanced Boltzmann", mechanism="sparse uncertainty routing",
    complexity="host top-2 over B x V, then O(budget) coins", proposer=BoltzmannV10Proposer, options=RoutingOptions,
    stages=("draft block; logits to host", "top-2 and margin per slot", "route <= budget uncertain slots",
            "Boltzmann coin top-1 vs top-2; verify"),
    calibration=Calibration(grid=V10_GRID, search="halving"),
    why_inactive="no routed slot's Boltzmann coin chose the runner-up (or no margin fell below the cutoff).")

INFO_V13 = MethodInfo(
    index=13, id="minop_v13", label="V13 MinOp", mechanism="V10 policy, fused top-2, one-slot budget",
    complexity="device top-2; only B x 2 leave; O(B) routing", proposer=MinOpV13Proposer, options=MinOpOptions,
    stages=("draft block", "top-2 on the drafter's device", "least-confident uncertain slot only",
            "V10 Boltzmann coin; verify"),
    calibration=Calibration(reuses="boltzmann_v10", adapt=v13_options),
    why_inactive=("its one routed slot's Boltzmann coin never chose the runner-up (or no margin fell below "
                  "the cutoff)."))
