"""The explicit method registry. Ids are stable: they are test ids, benchmark names and report keys.

`METHOD_LIST` is the one list of the 15 methods, in index order. Each entry (`base.MethodInfo`) owns
everything about its method: how to build its proposer, its options dataclass, the prepare fitters whose
files it needs and its calibration grid. `prepare` runs `fitters()`; nothing registers itself on import.
Adding a method: one module with an INFO and one line here (docs/adding-a-method.md).
"""

from __future__ import annotations

from dataclasses import replace

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
)
from .base import FitContext, Fitter, MethodInfo

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
)

# Mechanism activity (DESIGN contract 9): one sentence per method on when its draft equals plain dflash's,
# shown by the report beside a method labelled "inactive here" (its draft never differed in the run).
WHY_INACTIVE: dict[str, str] = {
    "dflash": "it is the baseline every other draft is compared with.",
    "dflash2": "its pair-selector path kept the drafter's argmax at every position.",
    "mobs": "its middle-out selection kept the drafter's argmax at every position.",
    "jump_mobs": "its jump-head anchors and gap filling kept the drafter's argmax at every position.",
    "fused_jump": "its fused-residual anchors and gap filling kept the drafter's argmax at every position.",
    "boltzmann": "its temperature collapsed on confident rows, so the Gumbel draw never beat the argmax.",
    "bmobs": "its Boltzmann middle anchor and MOBS fill kept the drafter's argmax at every position.",
    "act": "its calibrated margin threshold tau never cut a block (tau = 0 keeps every row).",
    "dspark_lite": "its Markov correction never changed a top-1 choice and the survival floor never cut a block.",
    "boltzmann_v10": "no routed slot's Boltzmann coin chose the runner-up (or no margin fell below the cutoff).",
    "gated_mobs_v11": "its uncertainty gate never opened, or the re-chosen slots kept the argmax.",
    "parareal_v12": "its fitted residual correction never reordered a slot's top candidate.",
    "minop_v13": "its one routed slot's Boltzmann coin never chose the runner-up (or no margin fell below "
                 "the cutoff).",
    "simple_parareal_v14": "its fitted gap estimate never drops below the switch threshold.",
}
METHOD_LIST = tuple(replace(m, why_inactive=WHY_INACTIVE[m.id]) if m.id in WHY_INACTIVE and not m.why_inactive
                    else m for m in METHOD_LIST)

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


def fitters() -> tuple[Fitter, ...]:
    """Every fitter some method needs, once each, in registry order (each fitter seeds itself, so the order
    does not change the files)."""
    seen: dict[str, Fitter] = {}
    for m in METHOD_LIST:
        for f in m.fitters:
            if seen.setdefault(f.name, f) is not f:
                raise ValueError(f"two different fitters are named {f.name!r}")
    return tuple(seen.values())


def fit_files() -> tuple[str, ...]:
    """Every artifact file the fitters write (what a complete prepare must list besides the drafter)."""
    return tuple(name for f in fitters() for name in f.files)


__all__ = ["FitContext", "Fitter", "MethodInfo", "METHODS", "METHOD_LIST", "fit_files", "fitters", "get_method",
           "method_ids", "speculative_ids"]
