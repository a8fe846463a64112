"""08 act: adaptive verifier-suffix trimming of the DFlash proposal.

The proposal is DFlash's argmax block (method 01). Of the k drafts the loop asks for (k = min(width,
tokens left - 1)), ACT keeps the leading rows whose top1-top2 margin of the drafter's full-vocabulary
logits is >= tau and stops at the first row below tau, but never proposes fewer than one token. Trimmed
drafts cost no verify rows, so a low-confidence tail is not verified. tau = 0 keeps every row: plain
DFlash. tau is calibrated on calibration prompts only (`calibrate.calibrate_act`).

Guidance work = 0 (the margins come from the drafter's own logits). Meta per block: act_trimmed (drafts
cut), act_verified (drafts kept), act_blocks (1), act_margin_sum / act_margin_rows (mean margin), drafted
(drafts before the trim: the report's acceptance over drafted tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..runtime import transfer
from .base import Calibration, MethodInfo
from .support.block import BlockProposer
from .support.common import MethodOptions, opt

ACT_GRID = {"tau": (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)}  # the calibration grid (calibrate.ACT_GRID)


def act_keep(margins: list[float], tau: float) -> int:
    """How many leading drafts to verify: stop at the first margin below tau, never fewer than one."""
    keep = 0
    for m in margins:
        if m < tau:
            break
        keep += 1
    return max(1, keep)


def row_margins(logits) -> list[float]:
    """top1 - top2 of every row over the full vocabulary (inf when the vocabulary has one token)."""
    if logits.shape[-1] < 2:
        return [float("inf")] * logits.shape[0]
    top2 = logits.float().topk(2, dim=-1).values
    return (top2[:, 0] - top2[:, 1]).tolist()


@dataclass(frozen=True)
class ACTOptions(MethodOptions):
    tau: float = opt(0.0, lo=0.0)


class ACTProposer(BlockProposer):
    def select(self, logits, hidden, prefix, k):
        rows = logits[:k]
        if rows.shape[-1] < 2:
            full, margins = transfer.to_host(rows.argmax(dim=-1))[0], row_margins(rows)
        else:  # the argmax and the margins in the round's one selection transfer (runtime/transfer.py)
            top2 = rows.float().topk(2, dim=-1).values
            full, margins = transfer.to_host(rows.argmax(dim=-1), top2[:, 0] - top2[:, 1])
        tau = self.options.tau
        n = act_keep(margins, tau) if tau > 0 else len(full)
        n = max(1, min(n, len(full)))
        return full[:n], 0, {"act_trimmed": len(full) - n, "act_verified": n, "act_blocks": 1,
                             "act_margin_sum": float(sum(margins)), "act_margin_rows": len(margins),
                             "drafted": len(full)}


INFO = MethodInfo(
    index=8, id="act", label="ACT (adaptive trim)", mechanism="DFlash argmax trimmed at the first low-margin row",
    complexity="parallel draft + shorter verify", proposer=ACTProposer, options=ACTOptions,
    stages=("draft block, argmax per position", "top1-top2 margin of every row",
            "cut at the first row with margin < tau (keep >= 1)", "verify only the kept drafts"),
    calibration=Calibration(grid=ACT_GRID),
    why_inactive="its calibrated margin threshold tau never cut a block (tau = 0 keeps every row).")
