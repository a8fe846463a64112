"""The explicit method registry. Ids are stable: they are test ids, benchmark names and report keys.

Each entry says how to build the method's proposer from verified artifacts; `normal` (00) has none and
runs plain greedy. Importing this package imports every method module, which registers them (and
their prepare fitters); nothing else happens at import.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import UnknownMethodError


@dataclass(frozen=True)
class MethodInfo:
    index: int
    id: str
    label: str
    mechanism: str
    complexity: str
    build: Callable[..., Any] | None  # (runtime, prepared, **options) -> Proposer; None for normal
    needs: tuple[str, ...] = ()  # artifact files beyond the drafter
    stages: tuple[str, ...] = field(default=())


METHODS: dict[str, MethodInfo] = {}


def register(info: MethodInfo) -> MethodInfo:
    if info.id in METHODS:
        raise ValueError(f"method id {info.id!r} registered twice")
    if any(m.index == info.index for m in METHODS.values()):
        raise ValueError(f"method index {info.index} registered twice")
    METHODS[info.id] = info
    return info


def get_method(method_id: str) -> MethodInfo:
    if method_id not in METHODS:
        raise UnknownMethodError(f"unknown method {method_id!r}: choose one of {', '.join(method_ids())} "
                                 "(`python -m dflash_core methods` lists them)")
    return METHODS[method_id]


def method_ids() -> list[str]:
    """All ids in index order (00 first)."""
    return [m.id for m in sorted(METHODS.values(), key=lambda m: m.index)]


def speculative_ids() -> list[str]:
    return [i for i in method_ids() if METHODS[i].build is not None]


from . import act, boltzmann, dflash, dspark, gated_mobs, mobs, normal, pairwise, parareal, routing  # noqa: E402,F401
