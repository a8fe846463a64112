"""Prompt sets shipped with the lab: train seeds, calibration prompts, benchmark prompts (disjoint).

Disjoint in the sense of the held-out guard (`dflash_core.store.heldout`): no two splits share a normalised
8-unit n-gram (a prompt shorter than 8 units counts as one n-gram), not merely unequal strings.

A benchmark prompt is a string or `{"task": ..., "text": ...}`: its task family (chat, summarisation, qa, math,
translation, code, completion: Spec-Bench's kinds for an English target), by which the report breaks tau and
speedup down; a plain string's task is the prompt family's name.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

from ...errors import BadInputError
from ..heldout import NO_TEXT_REASON, HeldOut, check_clean, decoder_of, filter_clean, held_out

log = logging.getLogger(__name__)

SPLITS = ("train", "calibration", "benchmark")
TASK_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")  # a task family's id: the report uses it as a key and a label


@dataclass(frozen=True)
class PromptSet:
    family: str
    train: tuple[str, ...]
    calibration: tuple[str, ...]
    benchmark: tuple[str, ...]
    benchmark_tasks: tuple[str, ...] = ()  # the task family of each benchmark prompt (same order)


def check_disjoint(sets: dict[str, tuple[str, ...]]) -> None:
    """Held-out discipline (docs/design.md §6): no two splits share a normalised n-gram, checked both ways
    (a short prompt of either split counts as one n-gram), through the one guard."""
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


def shipped_held_out() -> HeldOut:
    """Every benchmark and calibration prompt of every family shipped in `prompts.json`."""
    return held_out(p for ps in load_all_families() for p in ps.benchmark + ps.calibration)


def read_shipped(name: str) -> str:
    """A text file shipped beside the prompts (the English seed corpus)."""
    return resources.files(__package__).joinpath(name).read_text("utf-8")


def load_prompts(family: str) -> PromptSet:
    fams = _families()
    if family not in fams:
        raise BadInputError(f"unknown prompt family {family!r}: choose one of {sorted(fams)}")
    return _prompt_set(family, fams[family])


def _prompt_set(family: str, f: dict) -> PromptSet:
    tagged = [e if isinstance(e, dict) else {"task": family, "text": e} for e in f["benchmark"]]
    for e in tagged:  # shipped data, but one typo must fail here, not as a report key
        if not isinstance(e.get("text"), str) or not TASK_RE.fullmatch(str(e.get("task"))):
            raise ValueError(f"prompts.json: family {family!r} has a benchmark entry that is not a string or "
                             f"{{'task': [a-z0-9_], 'text': str}}: {str(e)[:80]!r}")
    sets = {s: tuple(f[s]) for s in SPLITS if s != "benchmark"} | {"benchmark": tuple(e["text"] for e in tagged)}
    check_disjoint(sets)
    return PromptSet(family, sets["train"], sets["calibration"], sets["benchmark"],
                     tuple(e["task"] for e in tagged))


def refuse_benchmark(prompts, family: str, purpose: str) -> None:
    """Calibration calls this: no prompt it is given may share an n-gram with a benchmark prompt (the guard)."""
    check_clean(list(prompts), held_out(load_prompts(family).benchmark), f"{purpose} (benchmark prompts are held out)",
                names=[f"prompt {p!r}" for p in prompts],
                fix="use the calibration or train prompts, never a benchmark prompt or a variant of one")


def clean_segments(rt, seqs: Sequence[Sequence[int]], family: str) -> tuple[list[int], list[int]]:
    """(kept, dropped) indexes of generated token sequences (the width model's calibration decodes) by the held-out
    guard against the family's benchmark prompts: generated text is dropped where it leaks, never refused (the
    target wrote it, not the user). All kept when the target has no tokenizer (nothing to compare as text)."""
    decode = decoder_of(rt)
    if decode is None:
        return list(range(len(seqs))), []
    return filter_clean([decode(list(s)) for s in seqs], held_out(load_prompts(family).benchmark))


def check_sequences(rt, seqs: Sequence[Sequence[int]], consumer: str, held: HeldOut | None = None,
                    fix: str = "train on clean trajectories: prepare drops the ones that leak") -> bool:
    """Refuse token sequences (teacher trajectories) whose decoded text leaks a held-out prompt.

    The one check drafter training and every fitter run; `held` defaults to the shipped prompts. Returns False
    (and logs why) when the target has no tokenizer, True when the sequences were checked and are clean.
    """
    decode = decoder_of(rt)
    if decode is None:
        log.debug("%s: held-out check skipped: %s", consumer, NO_TEXT_REASON)
        return False
    check_clean([decode(list(s)) for s in seqs], held if held is not None else shipped_held_out(), consumer,
                names=[f"trajectory {i}" for i in range(len(seqs))], fix=fix)
    return True
