"""Exactness verdicts (docs/design.md §1): exact, tie-certified, or diverged.

A block forward and a one-token forward run different kernels. In float64 they agree to ~1e-14, so the
check is strict equality of token ids. In float32 (rarely) and fp16/bf16 (often) they can pick different
argmaxes at a near-tie. There a divergence is certified as a tie only when greedy's own top1-top2 logit
gap at the first differing position is below the dtype's stated tolerance. Ties are reported, never
silently counted as passes; any other divergence fails.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# Largest top1-top2 logit gap at which a block/one-token kernel difference may flip an argmax.
TIE_TOLERANCE: dict[str, float] = {
    "float64": 0.0,  # strict
    "float32": 1e-4,
    "bfloat16": 0.5,
    "float16": 0.1,
}


@dataclass(frozen=True)
class Verdict:
    kind: str  # "exact" | "tie" | "diverged"
    position: int | None = None  # first differing index, if any
    gap: float | None = None  # greedy's top1-top2 gap there

    @property
    def ok(self) -> bool:
        return self.kind != "diverged"


def dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def classify(candidate: Sequence[int], reference: Sequence[int], margins: Sequence[float] | None,
             dtype) -> Verdict:
    """Compare token ids; certify a first divergence as a tie only below the dtype's tolerance."""
    cand, ref = list(candidate), list(reference)
    if cand == ref:
        return Verdict("exact")
    i = next((j for j, (a, b) in enumerate(zip(cand, ref)) if a != b), min(len(cand), len(ref)))
    tol = TIE_TOLERANCE.get(dtype_name(dtype), 0.0)
    if margins is not None and i < len(margins) and i < min(len(cand), len(ref)) and margins[i] < tol:
        return Verdict("tie", i, float(margins[i]))
    gap = float(margins[i]) if margins is not None and i < len(margins) else None
    return Verdict("diverged", i, gap)
