"""Mechanism activity (docs/design.md §9): how often a method's draft differs from plain dflash's at the same
context, and what those differences did to accepted drafts.

`Shadowed` wraps a method's proposer with a plain dflash proposer (the shadow) that sees exactly the same
context: begin() and observe() go to both, and every propose() also asks the shadow for its block at the same
prefix and k. Only the method's proposal is returned, so the decode (and its output ids) is the method's own.
It runs only in untimed decodes: the shadow's drafter run would otherwise be billed to the method.

The shadow's drafts are never verified. The decode's output is greedy's (the exactness gate checks it), so
the drafts the shadow would have had accepted at round r are the longest prefix of its draft equal to the
output tokens at that round's position: no extra target forward. This is a per-round counterfactual (the
shadow at the method's context), not a separate dflash decode, which would reach other contexts.

Definitions (one round = one verify with k >= 1 drafts asked for; the method's draft as verified, the shadow's
cut to the same k):
  round differs      the two drafts are not the same list (a different token, or a different length)
  positions          per round, max(len(method draft), len(shadow draft)): every slot either of them drafted
  position differs   the two drafts hold different tokens there, or only one of them drafted it
  gained / lost      over rounds: max(0, a_method - a_dflash) / max(0, a_dflash - a_method) accepted drafts
  net                gained - lost (only rounds that differ can contribute)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..runtime.decode import Proposal
from .config import BASELINE


class Shadowed:
    """A proposer that decodes as `method` and records, each round, what `shadow` would have drafted."""

    def __init__(self, method: Any, shadow: Any):
        taps_m, taps_s = tuple(getattr(method, "taps", ()) or ()), tuple(getattr(shadow, "taps", ()) or ())
        if taps_m != taps_s:
            raise ValueError(f"the shadow reads target taps {taps_s}, the method {taps_m}: they cannot share a context")
        self.method, self.shadow = method, shadow
        self.taps = taps_m
        self.max_width = getattr(method, "max_width", None)
        self.rounds: list[dict] = []  # per propose(): position in the output, both drafts
        self._prompt_len = 0

    def begin(self, prompt: list[int], hidden: Any) -> None:
        self._prompt_len = len(prompt)
        self.method.begin(prompt, hidden)
        self.shadow.begin(prompt, hidden)

    def propose(self, prefix: list[int], k: int) -> Proposal:
        prop = self.method.propose(prefix, k)
        shadow = self.shadow.propose(list(prefix), k)
        self.rounds.append({"pos": len(prefix) - self._prompt_len, "draft": [int(t) for t in prop.ids[:k]],
                            "shadow": [int(t) for t in shadow.ids[:k]]})
        return prop

    def observe(self, hidden: Any) -> None:
        self.method.observe(hidden)
        self.shadow.observe(hidden)


def accepted_against(draft: Sequence[int], output: Sequence[int], pos: int) -> int:
    """Drafts a verify would accept: the longest prefix of `draft` equal to `output[pos:]` (greedy's tokens)."""
    a = 0
    while a < len(draft) and pos + a < len(output) and int(draft[a]) == int(output[pos + a]):
        a += 1
    return a


def empty_counts() -> dict:
    return {"rounds": 0, "rounds_differ": 0, "positions": 0, "positions_differ": 0, "gained": 0, "lost": 0,
            "accepted": 0, "shadow_accepted": 0}


def count_rounds(rounds: Sequence[dict], output: Sequence[int], counts: dict | None = None) -> dict:
    """Add one decode's `Shadowed.rounds` to `counts` (integers only, so decodes add up); `output` is that
    decode's committed ids (greedy's)."""
    c = empty_counts() if counts is None else counts
    for r in rounds:
        d, s, pos = r["draft"], r["shadow"], r["pos"]
        a_m, a_s = accepted_against(d, output, pos), accepted_against(s, output, pos)
        width = max(len(d), len(s))
        diff = sum(1 for i in range(width) if i >= len(d) or i >= len(s) or d[i] != s[i])
        c["rounds"] += 1
        c["rounds_differ"] += int(diff > 0)
        c["positions"] += width
        c["positions_differ"] += diff
        c["gained"] += max(0, a_m - a_s)
        c["lost"] += max(0, a_s - a_m)
        c["accepted"] += a_m
        c["shadow_accepted"] += a_s
    return c


def summary(method: str, counts: dict, why_inactive: str = "") -> dict:
    """The case's activity block for benchmark.json: the counts, their shares, net, and a status.

    status: `baseline` (dflash itself), `active` (some round's draft differs), `inactive` (none does: the
    method produced dflash's drafts throughout this run; `why` says why its mechanism can stay silent).
    """
    c = {k: int(counts.get(k, 0)) for k in empty_counts()}
    if method == BASELINE:
        status = "baseline"
    else:
        status = "active" if c["rounds_differ"] else "inactive"
    return {**c, "net": c["gained"] - c["lost"],
            "rounds_differ_share": c["rounds_differ"] / c["rounds"] if c["rounds"] else 0.0,
            "positions_differ_share": c["positions_differ"] / c["positions"] if c["positions"] else 0.0,
            "status": status, "why": why_inactive if status == "inactive" else ""}
