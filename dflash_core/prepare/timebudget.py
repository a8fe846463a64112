"""The prepare budget: how long a real target's whole `prepare` may take, and the training time that leaves.

prepare's steps run in order: teacher trajectories, teacher-forced text, drafter training, the methods' fits. Only
training's length is free (it keeps its best held-out state whenever it stops), so a budget for the whole run caps
training at what is left once the time spent so far, the fits still to come and a safety share are taken off.

The fits' cost is projected before training by building the fit examples of one forward group of the planned
trajectories (the group holding the median length) with a freshly initialised drafter of the trained one's shape:
the code path the fits run, so the same kernels and the same target. Three timed parts (the group's target forward,
the heads' drafting, the corrections' drafting) are scaled by rows and anchors separately, because the two example
sets read different trajectories at different anchor strides (`methods/support/fitting.py`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace

import torch

from ..errors import BadInputError
from ..methods import FitContext
from ..methods.support.examples import (
    ExampleRequest,
    draft_example_sets,
    forward_groups,
    planned_anchors,
    target_rows_batch,
)
from ..methods.support.fitting import CORRECTION_TOP_K, HEAD_TOP_K, correction_plan, head_plan, plan_request
from ..runtime.drafter import DFlashDrafter
from .train import LARGE_VOCAB, resolve_draft_vocab

log = logging.getLogger(__name__)

# 'auto' at a real vocabulary: the lab's goal for a real target's prepare on 2 cores (issue 39); none for the mini
# target, whose recipe has no time-based step at all (its weights are reproducible bit for bit).
PREPARE_BUDGET = 30.0
# The fitters' own optimisation on top of building their examples: 126 / 103 s on SmolLM2 and 270 / 240 s at the
# 350M shape (docs/real-targets.md, 2026-12-07), so the examples' projection is scaled up by a quarter.
FIT_OVERHEAD = 1.25
SAFETY_SHARE = 0.05  # of the budget, kept back for the final evaluations, writing the artifacts and timing noise
MIN_TRAIN_SECONDS = 120.0  # training never gets less, even when the teacher alone spent the budget (it says so)


def resolve_prepare_budget(value, vocab: int, train_budget_off: bool = False) -> float | None:
    """Minutes, or None (no budget): 'auto' is PREPARE_BUDGET at a vocabulary >= LARGE_VOCAB (a real target) and
    None for the mini target, and None where the training budget is 'off' (its promise: the step count alone decides,
    a drafter reproducible on any machine); 'off' and None are None; a number must be finite and > 0."""
    if value == "auto":
        return PREPARE_BUDGET if vocab >= LARGE_VOCAB and not train_budget_off else None
    if value is None or value == "off":
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise BadInputError(f"--prepare-budget must be 'auto', 'off' or a number of minutes > 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class FitProjection:
    """Measured parts of one probe group and the projected seconds of the whole fits."""

    probe_trajectories: int
    target_seconds: float  # the probe group's target forward
    head_seconds: float  # the heads' drafting of the probe group (its own forward taken off)
    correction_seconds: float  # the corrections' drafting likewise
    scale_rows: float  # planned target rows / probe rows
    scale_head: float  # planned head anchors / probe head anchors
    scale_correction: float  # planned correction anchors / probe correction anchors
    seconds: float  # the projection, FIT_OVERHEAD included

    def record(self) -> dict:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def probe_group(lengths: Sequence[int], union: Sequence[int], vocab: int) -> list[int]:
    """The `forward_groups` group of `union` (trajectory indices) that holds its median-length trajectory: the fits
    forward groups of about one length, so one group of the middle length stands for a typical one."""
    groups = forward_groups([lengths[i] for i in union], vocab)
    middle = sorted(range(len(union)), key=lambda j: (lengths[union[j]], j))[len(union) // 2]
    return [union[g] for grp in groups if middle in grp for g in grp]


def _examples(ctx, req: ExampleRequest) -> int:
    """How many examples `req` takes (`planned_anchors`: the plan's cap applied)."""
    return sum(map(len, planned_anchors(ctx, req).values()))


def project_fit_seconds(ctx, clock: Callable[[], float] = time.perf_counter) -> FitProjection:
    """Time the fits' example building on one probe group of `ctx` (its drafter need not be trained: the cost is
    the shapes') and scale each part to the planned sets. `clock` is injectable so a test can give the parts known
    costs."""
    head, corr = head_plan(ctx), correction_plan(ctx)
    union = sorted(set(head.trajectories) | set(corr.trajectories))
    lengths = [len(t) for t in ctx.trajectories]
    vocab = ctx.rt.vocab_size
    probe = probe_group(lengths, union, vocab)
    t0 = clock()
    target_rows_batch(ctx.rt, [ctx.trajectories[i] for i in probe], ctx.drafter.cfg.taps, True)
    t_target = clock() - t0
    parts, scales = [], []
    for top_k, plan in ((min(HEAD_TOP_K, vocab), head), (min(CORRECTION_TOP_K, vocab), corr)):
        full = plan_request(top_k, plan)
        req = replace(full, max_examples=None, trajectories=tuple(probe))  # the same set, on the probe only
        n_probe = _examples(ctx, req)
        if not n_probe:  # no anchor in the probe: nothing to time, nothing scaled
            parts.append(0.0)
            scales.append(0.0)
            continue
        t0 = clock()
        draft_example_sets(ctx, [req])
        parts.append(max(0.0, clock() - t0 - t_target))  # its own target forward is the part timed above
        scales.append(_examples(ctx, full) / n_probe)
    scale_rows = sum(lengths[i] for i in union) / max(1, sum(lengths[i] for i in probe))
    seconds = FIT_OVERHEAD * (t_target * scale_rows + parts[0] * scales[0] + parts[1] * scales[1])
    return FitProjection(len(probe), t_target, parts[0], parts[1], scale_rows, scales[0], scales[1], seconds)


def probe_drafter(dcfg, tcfg):
    """A freshly initialised drafter of the shape training will give: the auto draft vocabulary at its cap (the
    largest head it may choose, so the projection errs long), under a forked RNG so training's draws are unchanged."""
    dv = resolve_draft_vocab(tcfg.draft_vocab, dcfg.vocab_size)
    k = 0 if dv == "off" else min(dcfg.vocab_size, int(tcfg.draft_vocab_max) if dv == "auto" else int(dv))
    with torch.random.fork_rng(devices=[]):
        return DFlashDrafter(replace(dcfg, draft_vocab=k)).eval()


def training_cap(budget_minutes: float, elapsed: float, fit_seconds: float) -> tuple[float, dict]:
    """(seconds of training the prepare budget leaves, the record): the budget less what is spent, the projected
    fits and SAFETY_SHARE of it, never below MIN_TRAIN_SECONDS."""
    total = 60.0 * budget_minutes
    left = total - elapsed - fit_seconds - SAFETY_SHARE * total
    cap = max(MIN_TRAIN_SECONDS, left)
    rec = {"budget_minutes": budget_minutes, "elapsed_before_training": round(elapsed, 1),
           "projected_fit_seconds": round(fit_seconds, 1), "safety_seconds": round(SAFETY_SHARE * total, 1),
           "training_cap_seconds": round(cap, 1), "projected_to_fit": left >= MIN_TRAIN_SECONDS}
    return cap, rec


def plan_training(rt, dcfg, tcfg, trajectories: list[list[int]], prompt_lens: list[int], cfg, family: str,
                  budget_minutes: float, t_start: float) -> tuple[float, dict]:
    """The training cap for this prepare run and its record (the probe's parts included); logs the plan."""
    ctx = FitContext(rt, probe_drafter(dcfg, tcfg), trajectories, prompt_lens, cfg, family, False)
    proj = project_fit_seconds(ctx)
    cap, rec = training_cap(budget_minutes, time.perf_counter() - t_start, proj.seconds)
    rec["fit_probe"] = proj.record()
    if rec["projected_to_fit"]:
        log.info("prepare budget %g min: %.0f s spent, fits projected at %.0f s (from the fit examples of the %d probe "
                 "trajectories above): training may take %.0f s", budget_minutes, rec["elapsed_before_training"],
                 proj.seconds, proj.probe_trajectories, cap)
    else:
        log.warning("prepare budget %g min: %.0f s spent and fits projected at %.0f s leave no training time; "
                    "training gets its floor of %.0f s and the budget will be exceeded (raise --prepare-budget)",
                    budget_minutes, rec["elapsed_before_training"], proj.seconds, cap)
    return cap, rec
