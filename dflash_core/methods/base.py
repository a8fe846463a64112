"""What a method is, as data: its registry entry, its fitters and the context they run in.

A leaf module (it imports nothing from `methods` or `prepare`), so method modules can declare their
fitters and `prepare` can run them without either importing the other: `prepare` reads the fitters
from the registry (`methods.fitters()`), and a method's artifact files are the files of its fitters.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import BadInputError
from ..store.data import check_sequences


@dataclass
class FitContext:
    """Everything a fitter may read: the float32 target, the trained drafter and the teacher trajectories.

    `cache` holds data several fitters share within one prepare run (e.g. the drafter's fit examples).
    """

    rt: Any
    drafter: Any
    trajectories: list[list[int]]
    prompt_lens: list[int]
    cfg: Any  # prepare.PrepareConfig
    family: str
    progress: bool = False
    cache: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Fitter:
    """One prepare step: `fit(ctx)` returns {"files": {name: bytes}, "meta": {...}}; `files` names what it writes."""

    name: str
    files: tuple[str, ...]
    fit: Callable[[FitContext], dict]

    def __call__(self, ctx: FitContext) -> dict:
        """Runs the fit after the held-out guard: every fitter is called through here, so none can skip it."""
        check_sequences(ctx.rt, ctx.trajectories, f"fitter {self.name!r}")
        return self.fit(ctx)


@dataclass(frozen=True)
class Calibration:
    """How `bench` calibrates a method on calibration prompts (never benchmark prompts).

    `grid` (axis -> values, simplest value first: ties go to the earlier setting) is searched with the
    cost-model objective: `search="grid"` decodes every setting on every prompt; `"halving"` screens every
    setting on the first `stage1_prompts` prompts and decides among the `keep` best on all of them, for grids of
    dozens of settings. A method that `reuses` another's choice searches nothing: its options are
    `adapt(that method's selected setting)` at each calibrated width.
    """

    grid: dict[str, tuple] = field(default_factory=dict)
    search: str = "grid"
    stage1_prompts: int = 1
    keep: int = 4
    reuses: str | None = None
    adapt: Callable[[dict], dict] | None = None

    def __post_init__(self) -> None:
        if self.search not in ("grid", "halving"):
            raise ValueError(f"calibration search must be 'grid' or 'halving', got {self.search!r}")
        if (self.reuses is None) == (not self.grid):
            raise ValueError("a calibration has a grid, or reuses another method's choice (with adapt), not both")
        if self.reuses is not None and self.adapt is None:
            raise ValueError("a calibration that reuses another method's choice needs adapt(selected) -> options")

    def settings(self) -> list[dict]:
        """The grid's settings: the cartesian product in axis order (the first axis varies slowest)."""
        keys = list(self.grid)
        return [dict(zip(keys, vals)) for vals in itertools.product(*(self.grid[k] for k in keys))]


ORIGINS = ("seed", "lab")


@dataclass(frozen=True)
class MethodInfo:
    """A registry entry. `proposer(rt, prepared, options)` builds the method; None for normal (plain greedy).

    `options` is the method's frozen options dataclass (`support.common.MethodOptions`), `fitters` the prepare
    steps whose files it needs (shared fitters are listed by every method that reads them), `calibration` how
    bench calibrates it (None: not calibrated), `origin` whether the seed study specified it or the lab added it.
    `why_inactive` is one sentence on why the method's draft can
    equal plain dflash's throughout a run (the report shows it beside a method labelled "inactive here").
    """

    index: int
    id: str
    label: str
    mechanism: str
    complexity: str
    proposer: Callable[..., Any] | None
    options: Any = None  # a MethodOptions subclass; None: the method takes no options
    fitters: tuple[Fitter, ...] = ()
    calibration: Calibration | None = None
    stages: tuple[str, ...] = ()
    why_inactive: str = ""
    origin: str = "seed"  # "seed": one of the seed study's 14 (reference/seed-methods-*.md); "lab": the lab's own

    def __post_init__(self) -> None:
        if self.origin not in ORIGINS:
            raise ValueError(f"method {self.id!r}: origin must be one of {ORIGINS}, got {self.origin!r}")

    @property
    def needs(self) -> tuple[str, ...]:
        """Artifact files beyond the drafter: the files of the method's fitters, in order."""
        return tuple(f for fitter in self.fitters for f in fitter.files)

    @property
    def build(self) -> Callable[..., Any] | None:
        """(rt, prepared, **options) -> proposer, or None for normal. Options are checked first
        (BadInputError naming the valid ones), then the artifacts the method needs."""
        if self.proposer is None:
            return None
        return self._build

    def _build(self, rt, prepared, **options: Any):
        opts = self.parse_options(options)
        prepared.require(self.needs, self.id)  # prepared.Prepared: names the `prepare --refresh` to run
        return self.proposer(rt, prepared, opts)

    def parse_options(self, options: dict) -> Any:
        if self.options is None:
            if options:
                raise BadInputError(f"{self.id} takes no options, got {sorted(options)}")
            return None
        return self.options.parse(self.id, options)
