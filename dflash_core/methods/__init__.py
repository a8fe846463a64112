"""The explicit method registry. Ids are stable: they are test ids, benchmark names and report keys.

`METHOD_LIST` is the one list of the methods, in index order. Each entry (`base.MethodInfo`) owns everything
about its method: how to build its proposer, its options dataclass, the prepare fitters whose files it needs,
how bench calibrates it (`base.Calibration`) and the sentence on why its draft can equal plain dflash's.
`prepare` runs `fitters()`, bench runs `calibrated()`; nothing registers itself on import.
Adding a method: one module with an INFO and one line here (docs/adding-a-method.md).
"""

from __future__ import annotations

from ..errors import UnknownMethodError
from . import (
    act,
    boltzmann,
    dflash,
    dspark,
    gated_mobs,
    jump,
    mobs,
    normal,
    pairwise,
    parareal_v12,
    parareal_v14,
    routing,
    suffix_dflash,
)
from .base import Calibration, FitContext, Fitter, MethodInfo

METHOD_LIST: tuple[MethodInfo, ...] = (
    normal.INFO,  # 00
    dflash.INFO,  # 01
    pairwise.INFO,  # 02 dflash2
    mobs.INFO_MOBS,  # 03
    jump.INFO_JUMP,  # 04 jump_mobs
    jump.INFO_FUSED,  # 05 fused_jump
    boltzmann.INFO,  # 06
    mobs.INFO_BMOBS,  # 07
    act.INFO,  # 08
    dspark.INFO,  # 09 dspark_lite
    routing.INFO_V10,  # 10 boltzmann_v10
    gated_mobs.INFO,  # 11 gated_mobs_v11
    parareal_v12.INFO,  # 12
    routing.INFO_V13,  # 13 minop_v13
    parareal_v14.INFO,  # 14 simple_parareal_v14
    suffix_dflash.INFO,  # 15, the lab's own
)

METHODS: dict[str, MethodInfo] = {m.id: m for m in METHOD_LIST}


def _check_registry() -> None:
    ids = [m.id for m in METHOD_LIST]
    if len(set(ids)) != len(ids) or [m.index for m in METHOD_LIST] != list(range(len(METHOD_LIST))):
        raise ValueError(f"the method registry needs unique ids and indexes 0..{len(METHOD_LIST) - 1} in order")


_check_registry()


def get_method(method_id: str) -> MethodInfo:
    if method_id not in METHODS:
        raise UnknownMethodError(f"unknown method {method_id!r}: choose one of {', '.join(method_ids())} "
                                 "(`python -m dflash_core methods` lists them)")
    return METHODS[method_id]


def method_ids() -> list[str]:
    """All ids in index order (00 first)."""
    return [m.id for m in METHOD_LIST]


def speculative_ids() -> list[str]:
    return [m.id for m in METHOD_LIST if m.proposer is not None]


def calibrated() -> list[MethodInfo]:
    """The methods bench calibrates, in registry order, every one after the method whose choice it reuses."""
    searched = [m for m in METHOD_LIST if m.calibration is not None and m.calibration.reuses is None]
    reusing = [m for m in METHOD_LIST if m.calibration is not None and m.calibration.reuses is not None]
    for m in reusing:
        if m.calibration.reuses not in {s.id for s in searched}:
            raise ValueError(f"{m.id} reuses the calibration of {m.calibration.reuses!r}, which searches none")
    return searched + reusing


def fitters() -> tuple[Fitter, ...]:
    """Every fitter some method needs, once each, in registry order (each fitter seeds itself, so the order
    does not change the files)."""
    seen: dict[str, Fitter] = {}
    for m in METHOD_LIST:
        for f in m.fitters:
            if seen.setdefault(f.name, f) is not f:
                raise ValueError(f"two different fitters are named {f.name!r}")
    return tuple(seen.values())


def markdown_table() -> str:
    """The README's table of the methods, generated from the registry (a test keeps the README in step)."""
    rows = ["| # | id | method | from | mechanism | prepare fits | calibrated on calibration prompts |",
            "|---|---|---|---|---|---|---|"]
    for m in METHOD_LIST:
        fits = ", ".join(f.name for f in m.fitters) or "—"
        cal = m.calibration
        how = ("—" if cal is None else f"reuses {cal.reuses}'s choice" if cal.reuses
               else ", ".join(cal.grid) + (" (successive halving)" if cal.search == "halving" else ""))
        origin = "seed" if m.origin == "seed" else "lab's own"
        rows.append(f"| {m.index:02d} | `{m.id}` | {m.label} | {origin} | {m.mechanism} | {fits} | {how} |")
    return "\n".join(rows)


def fit_files() -> tuple[str, ...]:
    """Every artifact file the fitters write (what a complete prepare must list besides the drafter)."""
    return tuple(name for f in fitters() for name in f.files)


__all__ = ["Calibration", "FitContext", "Fitter", "MethodInfo", "METHODS", "METHOD_LIST", "calibrated", "fit_files",
           "fitters", "markdown_table", "get_method", "method_ids", "speculative_ids"]
