"""15 suffix_dflash (the lab's own, not one of the seed's 14): a suffix match where the text repeats, the DFlash
drafter's block elsewhere.

Each round the current suffix of prompt + output is looked up in an incremental index (`support.suffix`): if its
last `min_match` or more tokens occurred before, the proposal is what followed the longest such match (its most
recent occurrence), up to the width, and the drafter does not run; otherwise the proposal is plain dflash's
argmax block. Prompt lookup (transformers' `prompt_lookup_num_tokens`, a reference row in the report) is the
degenerate case with no drafter behind it; SuffixDecoding and ArcticInference combine the two the same way.
Lossless like every method: the target verifies every proposed token.

Guidance work = 0. Meta per round: suffix_rounds (1 where the match proposed), suffix_match_len (its length).
The cost model charges a drafter run to every drafted round, so it over-states this method's cost where the
match proposes (the wall clock does not).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..runtime.decode import Proposal
from .base import Calibration, MethodInfo
from .dflash import DFlashProposer
from .support.common import MethodOptions, opt
from .support.suffix import SuffixIndex

LONGEST = 8  # the longest suffix looked up (or min_match if larger): longer matches are rarer and no more precise


@dataclass(frozen=True)
class SuffixOptions(MethodOptions):
    min_match: int = opt(4, lo=1, integer=True)  # the shortest suffix whose earlier occurrence is trusted


class SuffixDFlashProposer(DFlashProposer):
    """dflash's argmax block (`select`), behind a suffix lookup that skips the drafter where it matches."""

    def begin(self, prompt: list[int], hidden) -> None:
        super().begin(prompt, hidden)
        n = self.options.min_match
        self.index = SuffixIndex(n, max(n, LONGEST))
        self.index.extend(prompt)

    def propose(self, prefix: list[int], k: int) -> Proposal:
        t0 = time.perf_counter()
        self.index.sync(prefix)
        hit = self.index.match()
        if hit is None:
            lookup = time.perf_counter() - t0
            prop = super().propose(prefix, k)
            prop.select_seconds += lookup
            prop.meta.update(suffix_rounds=0, suffix_match_len=0)
            return prop
        n, pos = hit
        ids = self.index.continuation(pos, k)
        return Proposal(ids=ids, draft_seconds=0.0, select_seconds=time.perf_counter() - t0,
                        meta={"suffix_rounds": 1, "suffix_match_len": n})


INFO = MethodInfo(
    index=15, id="suffix_dflash", label="Suffix match + DFlash", origin="lab",
    mechanism="continuation of the longest earlier suffix match, else DFlash argmax",
    complexity="O(1) index update per token; drafter only where no match", proposer=SuffixDFlashProposer,
    options=SuffixOptions, calibration=Calibration(grid={"min_match": (4, 2, 3, 6)}),
    stages=("index the new tokens", "look up the longest suffix seen before",
            "match: propose what followed it; else draft block, argmax", "verify"),
    why_inactive="no suffix of min_match tokens recurred in prompt + output, so every block was the drafter's.")
