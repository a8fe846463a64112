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
import math
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
# The fits' optimisation (aux_steps AdamW steps per head, whatever the data's size) is not in the examples' projection:
# with 24 teacher trajectories the examples projected 12 s and the fits took ~6 minutes on a loaded 2-core machine.
# So the fits keep at least this share of the budget, and `fits_deadline` stops their optimisation where it ends.
FIT_FLOOR_SHARE = 0.15


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
    floor = FIT_FLOOR_SHARE * 60.0 * budget_minutes
    cap, rec = training_cap(budget_minutes, time.perf_counter() - t_start, max(proj.seconds, floor))
    rec["fit_probe"] = proj.record()
    rec["fit_floor_seconds"] = round(floor, 1)
    if rec["projected_to_fit"]:
        log.info("prepare budget %g min: %.0f s spent, fits projected at %.0f s (from the fit examples of the %d probe "
                 "trajectories above): training may take %.0f s", budget_minutes, rec["elapsed_before_training"],
                 proj.seconds, proj.probe_trajectories, cap)
    else:
        log.warning("prepare budget %g min: %.0f s spent and fits projected at %.0f s leave no training time; "
                    "training gets its floor of %.0f s and the budget will be exceeded (raise --prepare-budget)",
                    budget_minutes, rec["elapsed_before_training"], proj.seconds, cap)
    return cap, rec


# The teacher's greedy trajectories and the teacher-forced text together get at most this share of the prepare
# budget: training and the fits (what the budget buys) keep the rest. A 12-minute budget on a 262k-vocabulary
# target started a teacher projected at ~57 minutes when the budget sized training alone (issue 70).
GENERATION_SHARE = 0.4
PROBE_SEEDS = 8  # the first chunk of the sized teacher: timed, kept, and the rate the plan is logged from; small,
# because it runs before anything knows how slow the machine is (32 seeds took 8.8 of a 12-minute budget on a
# 2-core machine under load, before the refusal it led to); its small batches err long, so the plan errs short
MIN_CHUNK = 16  # a later chunk smaller than this is not started: the allowance is spent
MIN_SEEDS = 32  # below this the teacher set is too small to train on; a budget that cannot afford it is refused


@dataclass(frozen=True)
class Sized:
    """What `sized_generation` ran: the items kept (indexes into the given list, in the order run), the parts
    `generate` returned for them (one per chunk, in the same order) and the record for the manifest."""

    kept: list[int]
    parts: list
    record: dict


def sized_generation(generate: Callable[[list[int]], object], n: int, allowance: float, *, first: int,
                     order: Sequence[int] | None = None, clock: Callable[[], float] = time.perf_counter,
                     agree: Callable[[float], float] = lambda x: x, on_probe: Callable[[float], None] | None = None,
                     min_chunk: int = MIN_CHUNK) -> Sized:
    """Run `generate` over chunks of the `n` items (in `order`) until they are done or `allowance` seconds are
    spent: the first chunk (`first` items) is the probe, and each later chunk is as large as the latest chunk's
    seconds per item say fits in what is left. Every chunk's output is kept, so the probe costs nothing extra.

    A larger chunk runs larger batches, which cost less per item (the padded teacher: 104 tokens/s at 32 rows, 183 at
    128), so a projection from a smaller chunk errs long and the run ends inside its allowance; the next chunk then
    uses what that left. `agree` makes every rank of a torchrun group take rank 0's rate (the chunks must be the same
    on every rank); `on_probe(seconds per item)` sees the probe's rate before any other chunk starts (the plan's log
    line, the refusal of a budget that cannot hold). `clock` is injectable so a test gives chunks known costs."""
    order = list(range(n)) if order is None else list(order)
    kept: list[int] = []
    parts: list = []
    chunks: list[list] = []
    spent, size = 0.0, min(n, max(1, first))
    while size > 0:
        idx = order[len(kept):len(kept) + size]
        t0 = clock()
        parts.append(generate(idx))
        dt = clock() - t0
        spent += dt
        kept += idx
        chunks.append([len(idx), round(dt, 3)])
        rate = agree(dt / len(idx))
        if on_probe is not None and len(chunks) == 1:
            on_probe(rate)
        left = n - len(kept)
        fits = int(max(0.0, allowance - spent) / rate) if rate > 0 else left
        if fits < min(min_chunk, left):
            break
        # at most half of what still fits: a chunk is projected from the last one's rate, and load that arrives
        # makes it run long (a 1,460-seed chunk took 141 s where 108 s were left beside a CI run); at half, a chunk
        # up to twice as slow per item as the last still ends inside the allowance, and the last chunks are small
        size = min(left, max(min(min_chunk, left), fits // 2))
    record = {"given": n, "kept": len(kept), "allowance_seconds": round(allowance, 1), "seconds": round(spent, 1),
              "chunks": chunks}
    return Sized(kept, parts, record)


def generation_allowance(budget_minutes: float) -> float:
    """Seconds the teacher's trajectories and the teacher-forced text may take together."""
    return GENERATION_SHARE * 60.0 * budget_minutes


def check_budget_floor(budget_minutes: float) -> None:
    """A budget below what any prepare needs (training's floor and the safety share) is refused before any work."""
    floor = (MIN_TRAIN_SECONDS / 60.0) / (1.0 - SAFETY_SHARE - GENERATION_SHARE)
    if budget_minutes < floor:
        raise BadInputError(f"--prepare-budget {budget_minutes:g} cannot hold: drafter training alone takes at least "
                            f"{MIN_TRAIN_SECONDS / 60:g} min and gets {1 - SAFETY_SHARE - GENERATION_SHARE:.0%} of "
                            f"the budget: give --prepare-budget {math.ceil(10 * floor) / 10:g} or more, or 'off'")


def check_teacher_probe(budget_minutes: float, elapsed: float, seconds_per_seed: float, seeds: int) -> None:
    """After the probe: the teacher's minimum set (MIN_SEEDS, or every seed where there are fewer) plus training's
    floor and the safety share must fit the budget, else the run stops here with what to give instead."""
    need_seeds = min(MIN_SEEDS, seeds)
    total = 60.0 * budget_minutes
    need = elapsed + need_seeds * seconds_per_seed + MIN_TRAIN_SECONDS + SAFETY_SHARE * total
    if need > total:
        raise BadInputError(
            f"--prepare-budget {budget_minutes:g} cannot hold on this machine: the teacher makes a trajectory in "
            f"{seconds_per_seed:.2f} s, so its minimum of {need_seeds} trajectories, training's floor of "
            f"{MIN_TRAIN_SECONDS:.0f} s and the safety share need {need / 60:.1f} min: give --prepare-budget "
            f"{math.ceil(1.25 * need / 60)} or more, or 'off'")


def teacher_plan_line(budget_minutes: float, seeds: int, seconds_per_seed: float, allowance: float,
                      tokens: int, forced_budget: int) -> str:
    """The plan, logged after the probe and before anything else runs."""
    kept = min(seeds, int(allowance / seconds_per_seed)) if seconds_per_seed > 0 else seeds
    teacher_s = kept * seconds_per_seed
    train_s = max(MIN_TRAIN_SECONDS, 60.0 * budget_minutes * (1.0 - SAFETY_SHARE) - allowance)
    left = max(0.0, allowance - teacher_s)
    forced = f", then teacher-forced text up to {forced_budget} tokens in the {left:.0f} s the teacher leaves" \
        if forced_budget else ""
    return (f"prepare plan (budget {budget_minutes:g} min, {GENERATION_SHARE:.0%} for teacher data): teacher "
            f"~{kept} of {seeds} seeds x {tokens} tokens at {seconds_per_seed:.2f} s each (~{teacher_s:.0f} s; "
            f"a probe of the first seeds, whose small batches err long){forced}; training and the fits share the "
            f"other ~{train_s:.0f} s (the fits are projected once the teacher is done); total <= "
            f"{budget_minutes:g} min")


def fits_deadline(budget_minutes: float, t_start: float) -> float:
    """The perf_counter time the fits' optimisation must end by: the budget less its safety share."""
    return t_start + 60.0 * budget_minutes * (1.0 - SAFETY_SHARE)
