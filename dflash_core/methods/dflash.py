"""01 dflash: parallel block argmax of the DFlash drafter."""

from __future__ import annotations

from .base import MethodInfo
from .support.block import BlockProposer


class DFlashProposer(BlockProposer):
    def select(self, logits, hidden, prefix, k):
        return logits[:k].argmax(dim=-1), 0, {}  # stays on the device: the verify's transfer brings it back


INFO = MethodInfo(
    index=1, id="dflash", label="DFlash", mechanism="parallel block argmax", complexity="parallel draft + verify",
    proposer=DFlashProposer,
    stages=("fuse target taps", "draft block [anchor, MASK x B]", "argmax per position", "verify in one pass"),
    why_inactive="it is the baseline every other draft is compared with.")
