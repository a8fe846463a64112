"""Prompt sets shipped with the lab: train seeds, calibration prompts, benchmark prompts (disjoint)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

from ..errors import BadInputError

SPLITS = ("train", "calibration", "benchmark")


@dataclass(frozen=True)
class PromptSet:
    family: str
    train: tuple[str, ...]
    calibration: tuple[str, ...]
    benchmark: tuple[str, ...]


def check_disjoint(sets: dict[str, tuple[str, ...]]) -> None:
    """Held-out discipline (DESIGN contract 6): no prompt may appear in two splits (after strip())."""
    names = list(sets)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            common = {p.strip() for p in sets[a]} & {p.strip() for p in sets[b]}
            if common:
                raise BadInputError(f"prompt sets {a!r} and {b!r} overlap: {sorted(common)[:3]}; "
                                    "benchmark, calibration and train prompts must be disjoint")


def load_prompts(family: str) -> PromptSet:
    doc = json.loads(resources.files(__package__).joinpath("prompts.json").read_text("utf-8"))
    fams = doc["families"]
    if family not in fams:
        raise BadInputError(f"unknown prompt family {family!r}: choose one of {sorted(fams)}")
    f = fams[family]
    sets = {s: tuple(f[s]) for s in SPLITS}
    check_disjoint(sets)
    return PromptSet(family, sets["train"], sets["calibration"], sets["benchmark"])


def refuse_benchmark(prompts, family: str, purpose: str) -> None:
    """Fitting and calibration code call this: benchmark prompts must never reach them."""
    bench = {p.strip() for p in load_prompts(family).benchmark}
    leaked = [p for p in prompts if p.strip() in bench]
    if leaked:
        raise BadInputError(f"{purpose} was given benchmark prompts {leaked[:2]}: use the train or calibration "
                            "prompts; benchmark prompts are held out")
