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


# Per method, option values that exercise its non-default paths (trimming, many coins, gated pair
# rescoring, MOBS fallback, ...); a drawn subset of the keys is passed, the rest keep their defaults.
METHOD_OPTIONS: dict[str, dict[str, tuple]] = {
    "dflash": {},
    "dflash2": {"top_k": (1, 3, 8)},
    "mobs": {"top_k": (1, 3, 8)},
    "jump_mobs": {"top_k": (1, 3, 8), "jump_weight": (0.0, 0.5, 5.0)},
    "fused_jump": {"top_k": (1, 3, 8), "min_margin": (0.0, 0.5, 1e9)},
    "boltzmann": {"temperature": (0.0, 0.15, 5.0), "top_k": (1, 2, 8)},
    "bmobs": {"temperature": (0.0, 0.35, 5.0), "top_k": (1, 2, 8)},
    "act": {"tau": (0.0, 0.25, 1.0, 4.0, 1e9)},
    "dspark_lite": {"floor": (0.0, 0.35, 0.9)},
    "boltzmann_v10": {"temperature": (0.03, 2.0), "cutoff": (0.15, 50.0), "budget": (0, 1, 2)},
    "gated_mobs_v11": {"gate": (0.0, 0.08), "budget": (0, 3), "top_k": (4, 8), "temperature": (0.04, 5.0)},
    "parareal_v12": {"correction_rounds": (0, 2, 4), "damping": (0.75, 1.0)},
    "minop_v13": {"temperature": (0.03, 2.0), "cutoff": (0.15, 50.0)},
    "simple_parareal_v14": {"switch_threshold": (0.0, 1e9), "max_corrections": (0, 1, 2)},
    "suffix_dflash": {"min_match": (1, 2, 4, 9)},
}


@st.composite
def method_options(draw, method: str) -> dict:
    """Options for `method`: each of its option axes is left at the default or set to a drawn value."""
    out = {}
    for name, values in METHOD_OPTIONS[method].items():
        value = draw(st.sampled_from((None, *values)), label=name)
        if value is not None:
            out[name] = value
    return out


@st.composite
def top2_lists(draw, max_block: int = 8):
    B = draw(st.integers(1, max_block))
    vals, ids = [], []
    for _ in range(B):
        v1 = draw(st.floats(-5, 5))
        v2 = v1 - draw(st.sampled_from([0.0, 0.01, 0.1, 0.3, 1.0, 5.0]))
        t1, t2 = draw(st.lists(st.integers(0, 95), min_size=2, max_size=2, unique=True))
        vals.append([v1, v2])
        ids.append([t1, t2])
    return ids, vals


@st.composite
def tied_logits(draw):
    """[B, V] float logits drawn from a few levels, so ties at the top are common."""
    import torch

    B, V = draw(st.integers(1, 8)), draw(st.integers(2, 40))
    levels = draw(st.lists(st.floats(-8, 8, width=32), min_size=1, max_size=4))
    rows = [[draw(st.sampled_from(levels)) for _ in range(V)] for _ in range(B)]
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    return torch.tensor(rows, dtype=dtype)
