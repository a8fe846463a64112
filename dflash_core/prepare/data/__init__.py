"""Prompt sets shipped with the lab: train seeds, calibration prompts, benchmark prompts (disjoint).

Disjoint in the sense of the held-out guard (`dflash_core.prepare.heldout`): no two splits share a normalised
8-unit n-gram (a prompt shorter than 8 units counts as one n-gram), not merely unequal strings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

from ...errors import BadInputError

SPLITS = ("train", "calibration", "benchmark")


@dataclass(frozen=True)
class PromptSet:
    family: str
    train: tuple[str, ...]
    calibration: tuple[str, ...]
    benchmark: tuple[str, ...]


def check_disjoint(sets: dict[str, tuple[str, ...]]) -> None:
    """Held-out discipline (docs/design.md §6): no two splits share a normalised n-gram, checked both ways
    (a short prompt of either split counts as one n-gram), through the one guard."""
    from ..heldout import check_clean, held_out

    names = list(sets)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            for x, y in ((a, b), (b, a)):
                check_clean(sets[x], held_out(sets[y]), f"the {x} prompts", names=[repr(p) for p in sets[x]],
                            fix=f"benchmark, calibration and train prompts must be disjoint: change the {x} or "
                            f"the {y} prompt in prompts.json")


def _families() -> dict:
    return json.loads(resources.files(__package__).joinpath("prompts.json").read_text("utf-8"))["families"]


def load_all_families() -> list[PromptSet]:
    """Every shipped family (the held-out guard holds out the benchmark and calibration prompts of all)."""
    fams = _families()
    return [_prompt_set(name, fams[name]) for name in sorted(fams)]


def load_prompts(family: str) -> PromptSet:
    fams = _families()
    if family not in fams:
        raise BadInputError(f"unknown prompt family {family!r}: choose one of {sorted(fams)}")
    return _prompt_set(family, fams[family])


def _prompt_set(family: str, f: dict) -> PromptSet:
    sets = {s: tuple(f[s]) for s in SPLITS}
    check_disjoint(sets)
    return PromptSet(family, sets["train"], sets["calibration"], sets["benchmark"])


def refuse_benchmark(prompts, family: str, purpose: str) -> None:
    """Calibration calls this: no prompt it is given may share an n-gram with a benchmark prompt (the guard)."""
    from ..heldout import check_clean, held_out

    check_clean(list(prompts), held_out(load_prompts(family).benchmark), f"{purpose} (benchmark prompts are held out)",
                names=[f"prompt {p!r}" for p in prompts],
                fix="use the calibration or train prompts, never a benchmark prompt or a variant of one")
