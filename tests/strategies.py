"""Hypothesis strategies for decode cases (small, bounded, no filter/assume in the hot path)."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

MAX_PROMPT = 64
MAX_BUDGET = 48
MAX_WIDTH = 8


@dataclass(frozen=True)
class DecodeCase:
    prompt: tuple[int, ...]
    budget: int
    width: int
    corrupt: frozenset[int]


def prompts(vocab: int, min_len: int = 1, max_len: int = MAX_PROMPT):
    """Token-id prompts of length min_len..max_len; ids avoid 0 (pad) to look like real text."""
    return st.lists(st.integers(1, vocab - 1), min_size=min_len, max_size=max_len).map(tuple)


@st.composite
def decode_cases(draw, vocab: int, max_width: int = MAX_WIDTH, max_budget: int = MAX_BUDGET):
    """A prompt, a token budget 0..max_budget, a width 1..max_width and a set of corrupted draft positions.

    The corruption mask makes an oracle drafter wrong exactly at those continuation positions, so
    acceptance is partial in a controlled way (all-accept and all-reject are its two extremes).
    """
    prompt = draw(prompts(vocab))
    budget = draw(st.integers(0, max_budget))
    width = draw(st.integers(1, max_width))
    mode = draw(st.sampled_from(["none", "all", "some"]))
    if mode == "none":
        corrupt = frozenset()
    elif mode == "all":
        corrupt = frozenset(range(max_budget + max_width + 1))
    else:
        corrupt = frozenset(draw(st.sets(st.integers(0, max_budget + max_width), max_size=24)))
    return DecodeCase(prompt, budget, width, corrupt)
