"""00 normal: cached greedy decoding, the exact reference and the 1.000x baseline."""

from __future__ import annotations

from .base import MethodInfo

INFO = MethodInfo(
    index=0, id="normal", label="Normal greedy", mechanism="one cached target forward per token",
    complexity="N target forwards", proposer=None,
    stages=("target forward", "argmax on device", "commit 1 token", "repeat"))
