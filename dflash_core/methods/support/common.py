"""The rules every method shares, one definition each: the top-k tie rule, option checks, first argmax,
the stateless hash and the anchored gap fill.

Tie rule (every top-k in the lab, at inference and in the fit data): higher value first, then the LOWER
token id. torch.topk's order among equal values is unspecified, so ties are broken explicitly.

Guidance work (one definition for every method): the number of candidate scores a selector or
corrector evaluates beyond the drafter's own argmax (pair scores, jump/residual scores, Boltzmann
scores, correction rows). Plain DFlash has 0.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ...errors import BadInputError
from ...runtime import transfer

# --- the tie rule -----------------------------------------------------------------------------------


def tie_sort(ids, vals, *others):
    """Reorder the last dim by (value desc, id asc); `others` (same shape) follow the same order."""
    o = ids.argsort(dim=-1, stable=True)
    ids, vals, others = ids.gather(-1, o), vals.gather(-1, o), [t.gather(-1, o) for t in others]
    o = (-vals).argsort(dim=-1, stable=True)
    return (ids.gather(-1, o), vals.gather(-1, o), *[t.gather(-1, o) for t in others])


def topk_tensors(logits, k: int):
    """Top-k per row by the tie rule, on the logits' device: (ids [..., k] long, values [..., k] float32).

    torch.topk finds the k-th value; rows where more than k values reach it (a tie at the boundary) are
    re-ranked by a stable full sort, so which tied ids are kept also follows the rule. More than k values reach
    the k-th exactly when the (k+1)-th largest equals it, so one topk of k+1 finds those rows: counting them over
    the whole row cost ~2 ms a call in the 350M fits (65,536 ids), more than the topk (they make ~16k such calls).
    """
    import torch

    x = logits.float()
    n = x.shape[-1]
    k = max(1, min(int(k), n))
    vals, ids = torch.topk(x, min(k + 1, n), dim=-1)
    tied = vals[..., k] >= vals[..., k - 1] if k < n else torch.zeros(vals.shape[:-1], dtype=torch.bool,
                                                                       device=vals.device)
    ids, vals = tie_sort(ids[..., :k], vals[..., :k])
    if bool(tied.any()):
        rows = x[tied]
        o = (-rows).argsort(dim=-1, stable=True)[..., :k]
        ids[tied] = o
        vals[tied] = rows.gather(-1, o)
    return ids, vals


def topk(logits, k: int) -> tuple[list[list[int]], list[list[float]]]:
    """`topk_tensors` as host lists: (ids [R][k], values [R][k])."""
    ids, vals = topk_tensors(logits, k)
    return tuple(transfer.to_host(ids, vals))  # one transfer for both (runtime/transfer.py)


def top2(logits):
    """Top-2 per row on the logits' device (only these B x 2 ids and values need to leave it)."""
    return topk_tensors(logits, 2)


def first_argmax(scores) -> int:
    """Index of the first maximum (candidates are ranked, so ties go to the better-ranked one)."""
    best, bi = scores[0], 0
    for i in range(1, len(scores)):
        if scores[i] > best:
            best, bi = scores[i], i
    return bi


# --- options ------------------------------------------------------------------------------------------

def check_number(name: str, value: Any, *, lo: float | None = None, integer: bool = False) -> Any:
    """Validate a method option; raise BadInputError naming the option and the allowed range."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and integer:
        ok = int(value) == value
    if ok and lo is not None:
        ok = value >= lo
    if not ok:
        kind = "an integer" if integer else "a finite number"
        rng = f" >= {lo}" if lo is not None else ""
        raise BadInputError(f"method option {name} must be {kind}{rng}, got {value!r}")
    return int(value) if integer else float(value)


def opt(default: Any, *, lo: float | None = None, above: float | None = None, below: float | None = None,
        integer: bool = False) -> Any:
    """An options field: a number >= lo, > above, < below. A None default means "from the artifact"."""
    return field(default=default, metadata={"lo": lo, "above": above, "below": below, "integer": integer})


@dataclass(frozen=True)
class MethodOptions:
    """Base of every method's frozen options dataclass: fields declared with `opt`, checked on creation."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.default is None:
                continue
            m = f.metadata
            value = check_number(f.name, value, lo=m.get("lo"), integer=m.get("integer", False))
            if m.get("above") is not None and not value > m["above"]:
                raise BadInputError(f"method option {f.name} must be > {m['above']}, got {value!r}")
            if m.get("below") is not None and not value < m["below"]:
                raise BadInputError(f"method option {f.name} must be < {m['below']}, got {value!r}")
            object.__setattr__(self, f.name, value)
        self.check()

    def check(self) -> None:
        """Checks across fields (subclasses)."""

    @classmethod
    def describe(cls) -> str:
        return ", ".join(f"{f.name}={'<fitted>' if f.default is None else f.default}" for f in fields(cls))

    @classmethod
    def parse(cls, method_id: str, options: dict) -> "MethodOptions":
        """Options by keyword -> the dataclass; an unknown or bad option is a BadInputError naming the valid ones."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise BadInputError(f"{method_id} has no option(s) {unknown}: its options are {cls.describe()}")
        try:
            return cls(**options)
        except BadInputError as exc:
            raise BadInputError(f"{method_id}: {exc} (its options are {cls.describe()})") from None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TopKOptions(MethodOptions):
    """The candidates per position of the top-K selectors (02, 03)."""

    top_k: int = opt(8, lo=1, integer=True)


# --- the stateless hash -------------------------------------------------------------------------------

MASK64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    """SplitMix64 finaliser on a Python int (mod 2^64): a stateless, platform-independent hash."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & MASK64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & MASK64
    x ^= x >> 31
    return x


def context_fingerprint(prefix, n: int = 4) -> int:
    """Hash of the last n committed token ids. Ids, not float features: identical on every device and dtype
    (the seed hashed float embeddings, which changed between CPU and GPU)."""
    h = 0x243F6A8885A308D3
    for t in list(prefix)[-n:]:
        h = splitmix64(h ^ (int(t) & MASK64))
    return h


def uniform(*keys: int) -> float:
    """A deterministic uniform in (0, 1) from integer keys (no RNG state)."""
    x = 0
    for k in keys:
        x = splitmix64(x ^ (int(k) & MASK64))
    return ((x >> 11) + 0.5) / float(1 << 53)


def gumbel(*keys: int) -> float:
    u = min(max(uniform(*keys), 1e-12), 1 - 1e-12)
    return -math.log(-math.log(u))


# --- the anchored gap fill ----------------------------------------------------------------------------

def gap_fill(chosen: list[int | None], cand_ids, cand_vals, score_pair, prev: int) -> tuple[list[int], int]:
    """Anchored gap fill (Jacobi waves): fill empty slots next to filled ones from a snapshot.

    score_pair(left_token, right_tokens[list]) -> list of scores. Each slot's score is its draft value plus
    the pair score with its left neighbour (or `prev` at slot 0) and with its right neighbour when filled.
    Returns (filled block, number of pair scores evaluated).
    """
    chosen = list(chosen)
    n = len(chosen)
    work = 0
    while any(c is None for c in chosen):
        snap = list(chosen)
        frontier = [i for i in range(n) if snap[i] is None and (
            i == 0 or snap[i - 1] is not None or (i + 1 < n and snap[i + 1] is not None))]
        if not frontier:
            raise RuntimeError("gap fill found no frontier")
        for i in frontier:
            cands = cand_ids[i]
            s = list(cand_vals[i])
            left = prev if i == 0 else snap[i - 1]
            if left is not None:
                ps = score_pair(left, cands)
                s = [a + b for a, b in zip(s, ps)]
                work += len(cands)
            if i + 1 < n and snap[i + 1] is not None:
                right = snap[i + 1]
                ps = [score_pair(c, [right])[0] for c in cands]
                s = [a + b for a, b in zip(s, ps)]
                work += len(cands)
            j = max(range(len(s)), key=lambda q: (s[q], -q))
            chosen[i] = cands[j]
    return chosen, work
