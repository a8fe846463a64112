"""The one held-out guard (docs/design.md §6): no benchmark or calibration prompt may share a normalised
n-gram with any training text.

Every consumer of training text calls it: the mini target's corpus (its build, and `prepare`, which cuts
train seeds from it), the train seeds, the teacher trajectories (dropped and counted when they leak),
drafter training and every fitter (refused when a leaking trajectory is force-fed), and calibration
(checked against the benchmark prompts).

The unit. Text is NFKC-normalised and case-folded, then split into *units*: runs of word characters
(identifiers, words, numbers) and single punctuation characters; whitespace only separates units. So
indentation, line breaks, spacing and case cannot hide a near-duplicate: `def  __init__( self,config )`
and `DEF __init__(self, config):` give the same units. Units, not the target's tokens, on purpose: the
guard must check the mini target's corpus before its tokenizer exists (the tokenizer is trained on that
corpus), and a check must not change meaning with the target.

The size, N_UNITS = 8. A held-out prompt's n-grams are its runs of 8 consecutive units; a prompt shorter
than 8 units is one n-gram as a whole (it may not appear as a run of units in training text). Why 8:
the shared scaffolding of code, `( self , hidden_states ) :` or `. transpose ( 1 , 2 )`, is 7 units or
fewer, so it does not make every prompt unusable; one code line is 8-15 units, so an 8-gram catches a
copied line or a copied half-line; contamination studies of LLM benchmarks use 8 to 13 (word) n-grams,
and the low end is the strict one. A prompt is only held out from training text that shares a whole
8-unit run with it: a 7-unit common fragment is allowed.

The held-out set is the benchmark and calibration prompts of every family in `data/prompts.json`, not
only the family a run uses: the family is a prepare option, and a wrong choice must not open a hole.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ..errors import BadInputError

N_UNITS = 8
UNIT_RULE = r"NFKC + casefold, units = \w+ runs and single punctuation characters, n = 8"
_UNIT = re.compile(r"\w+|[^\w\s]")

Gram = tuple[str, ...]


def units(text: str) -> list[str]:
    """The normalised units of `text` (see the module docstring)."""
    return _UNIT.findall(unicodedata.normalize("NFKC", text).casefold())


def grams_of(text: str, n: int = N_UNITS) -> set[Gram]:
    """The held-out n-grams of one prompt: its runs of n units, or all its units when it has fewer."""
    u = units(text)
    if not u:
        return set()
    if len(u) <= n:
        return {tuple(u)}
    return {tuple(u[i:i + n]) for i in range(len(u) - n + 1)}


@dataclass(frozen=True)
class HeldOut:
    """The n-grams of some held-out prompts, each mapped to the prompt it comes from."""

    grams: dict[Gram, str]
    n: int = N_UNITS

    def __bool__(self) -> bool:
        return bool(self.grams)


def held_out(prompts: Iterable[str], n: int = N_UNITS) -> HeldOut:
    grams: dict[Gram, str] = {}
    for p in prompts:
        for g in grams_of(p, n):
            grams.setdefault(g, p)
    return HeldOut(grams, n)


def leaks(text: str, held: HeldOut) -> list[Gram]:
    """The held-out n-grams that occur as runs of units in `text` (empty: the text is clean)."""
    if not held:
        return []
    u = units(text)
    lengths = sorted({len(g) for g in held.grams})
    firsts = {g[0] for g in held.grams}
    found: dict[Gram, None] = {}
    # Only windows that start with the first unit of some held-out gram are built: a corpus file has
    # ~10^4 units, the held-out set ~10^2 grams, so this keeps the scan linear and cheap.
    for i, w in enumerate(u):
        if w not in firsts:
            continue
        for L in lengths:
            g = tuple(u[i:i + L])
            if len(g) == L and g in held.grams:
                found.setdefault(g, None)
    return list(found)


def _describe(gram: Gram) -> str:
    return " ".join(gram)


DEFAULT_FIX = "remove that text from the training text, or choose a held-out prompt that is absent from it"


def check_clean(texts: Sequence[str], held: HeldOut, consumer: str, names: Sequence[str] | None = None,
                fix: str = DEFAULT_FIX) -> None:
    """Refuse training text that shares an n-gram with a held-out prompt. `consumer` names who was given the
    text, `names` (optional, one per text) each text (a file, a seed), `fix` what to do about it."""
    for i, t in enumerate(texts):
        hit = leaks(t, held)
        if hit:
            where = names[i] if names is not None else f"text {i}"
            raise BadInputError(
                f"{consumer}: {where} shares the {held.n}-unit run {_describe(hit[0])!r} with the held-out "
                f"(benchmark or calibration) prompt {held.grams[hit[0]]!r} ({len(hit)} shared n-gram(s)); "
                f"held-out prompts must not overlap training text (docs/design.md §6): {fix}")


def filter_clean(texts: Sequence[str], held: HeldOut) -> tuple[list[int], list[int]]:
    """For generated or cut material that is dropped rather than refused: (kept indexes, dropped indexes)."""
    keep, drop = [], []
    for i, t in enumerate(texts):
        (drop if leaks(t, held) else keep).append(i)
    return keep, drop


def decoder_of(rt) -> Callable[[Sequence[int]], str] | None:
    """How to turn a target's token ids into text, or None when the target has no tokenizer (then its
    train seeds are seeded random ids: no text, nothing a prompt could leak into)."""
    if getattr(rt, "tokenizer", None) is None:
        return None
    return rt.decode


NO_TEXT_REASON = "the target has no tokenizer: its train seeds are seeded random ids, which have no text to check"
