"""06 boltzmann: deterministic, confidence-adaptive exploration among the drafter's top-K (training-free).

Per drafted position i, with top-K values v[i, ·] (ranked by `common.topk`) and margin m_i = v[i,0] - v[i,1]:

    T_i      = max(T · exp(-m_i), 0.02 · T)          T = 0.15 by default
    chosen_i = id[i, first argmax_j ( v[i, j] / T_i + g(seed, i, id[i, j]) )]

g is a Gumbel variate from the stateless SplitMix64 hash (`common.gumbel`): no RNG state, identical on
every device. seed = context_fingerprint(prefix) XOR salt: a hash of the last committed token ids (the
seed hashed float embeddings, which changed between CPU and GPU). A confident row (large margin) gets a
low temperature and keeps its argmax; an uncertain row explores. T = 0 (or K < 2) is plain argmax, and
as T -> 0 the rule tends to argmax. Guidance work = B·K Boltzmann scores per block.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .base import MethodInfo
from .support.block import BlockProposer
from .support.common import MethodOptions, context_fingerprint, first_argmax, gumbel, opt, topk

SALT_BOLTZMANN = 0xD6B017
SALT_BMOBS = 0xB00B5
MIN_TEMPERATURE_FRACTION = 0.02


def row_margin(vals_row: list[float]) -> float:
    """top1 - top2 of a ranked row (0 when fewer than two candidates)."""
    return max(0.0, vals_row[0] - vals_row[1]) if len(vals_row) >= 2 else 0.0


def row_temperature(vals_row: list[float], temperature: float) -> float:
    """T_i = max(T · exp(-margin), 0.02 · T): confident rows are sharpened, never below 2% of T."""
    return max(temperature * math.exp(-row_margin(vals_row)), MIN_TEMPERATURE_FRACTION * temperature)


def boltzmann_pick(ids_row: list[int], vals_row: list[float], temperature: float, seed: int,
                   position: int) -> tuple[int, int]:
    """Index of the chosen candidate and the number of Boltzmann scores evaluated.

    T <= 0 or a single candidate: the argmax (index 0 of the ranked row), with no scores evaluated.
    """
    if temperature <= 0 or len(ids_row) < 2:
        return 0, 0
    t = row_temperature(vals_row, temperature)
    if not t > 0:  # a subnormal T underflowed: the T -> 0 limit, argmax
        return 0, 0
    scores = [v / t + gumbel(seed, position, tok) for tok, v in zip(ids_row, vals_row)]
    return first_argmax(scores), len(scores)


@dataclass(frozen=True)
class BoltzmannOptions(MethodOptions):
    top_k: int = opt(8, lo=1, integer=True)
    temperature: float = opt(0.15, lo=0.0)


class BoltzmannProposer(BlockProposer):
    def select(self, logits, hidden, prefix, k):
        ids, vals = topk(logits, self.options.top_k)
        seed = context_fingerprint(prefix) ^ SALT_BOLTZMANN
        chosen, work, explored = [], 0, 0
        for i, (ir, vr) in enumerate(zip(ids, vals)):
            j, n = boltzmann_pick(ir, vr, self.options.temperature, seed, i)
            chosen.append(ir[j])
            work += n
            explored += int(j != 0)
        return chosen, work, {"boltzmann_scores": work, "boltzmann_non_argmax": explored}


INFO = MethodInfo(
    index=6, id="boltzmann", label="Boltzmann (deterministic)",
    mechanism="confidence-adaptive Gumbel-max exploration among the top-K, hashed (no RNG state)",
    complexity="O(B·K) hashed scores per block", proposer=BoltzmannProposer, options=BoltzmannOptions,
    stages=("draft block, keep top-K per position", "temperature per row from its top1-top2 margin",
            "add a hashed Gumbel to v/T for every candidate", "argmax per position, verify"),
    why_inactive="its temperature collapsed on confident rows, so the Gumbel draw never beat the argmax.")
