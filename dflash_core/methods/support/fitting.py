"""Fit helpers every fitter shares: the drafter's fit examples (built once per prepare run), the hold-out
of whole trajectories, head training and closed-form ridge (the held-out guard runs in `Fitter.__call__`).

Two sets of fit examples exist on purpose: the selector heads (02-05) train on the top-16 candidates at
every HEAD_STRIDE-th anchor, about 4096 examples; the corrections (09, 12, 14) on the top-8 at every anchor,
about 12288. Each trajectory costs one target forward however few of its anchors are kept, so the examples
come from just enough trajectories, evenly spread over all of them (`plan_examples`), each read densely.
Both come from one pass of `examples.draft_example_sets` (a trajectory both read is forwarded once) and are
cached on the FitContext, so each is computed once however many fitters read it.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ...progress import logged
from ...runtime.drafter import parameter_count
from ...store.artifacts import tensor_bytes
from .examples import DraftExamples, ExampleRequest, anchor_positions, draft_example_sets

log = logging.getLogger(__name__)

HEAD_TOP_K = 16  # candidates per position the selector heads train on (inference default K=8 is a subset)
HEAD_TARGET_EXAMPLES = 4096  # enough for aux_steps x 64-example batches; more only slows prepare down
CORRECTION_TARGET_EXAMPLES = 12288  # about every anchor of the 224 trajectories prepare made before batching:
# the corrections' fits cost grows with their examples, so more teacher data must not make prepare slower
CORRECTION_TOP_K = 8  # candidates per slot for the corrections (V12 K, DSpark K, V14 uses the first 2)
HOLDOUT_FRACTION = 0.2
HEAD_STRIDE = 4  # the heads' anchor stride: neighbouring anchors share most of their context, so 1 in 4
CORRECTION_STRIDE = 1  # the corrections read every anchor of their trajectories
MIN_FIT_TRAJECTORIES = 10  # at least this many trajectories (when there are) so the split holds some out


# --- fit examples -----------------------------------------------------------------------------------

def _anchors_of(ctx, ti: int, stride: int) -> int:
    """How many anchors `draft_examples` takes from trajectory `ti` at `stride`."""
    return len(anchor_positions(ctx, ti, stride))


def spread_indices(total: int, n: int) -> list[int]:
    """`n` of range(total), evenly spread and deterministic: the middle index of each of n equal bins."""
    n = max(0, min(n, total))
    first = [-(-i * total // n) for i in range(n + 1)]  # first index of bin i (bins are >= 1 index wide)
    return [(first[i] + first[i + 1] - 1) // 2 for i in range(n)]


@dataclass(frozen=True)
class ExamplePlan:
    """Which trajectories (sorted indices) and anchor stride give the fit examples, capped at `target`."""

    trajectories: list[int]
    stride: int
    target: int


def plan_examples(ctx, target: int, max_stride: int) -> ExamplePlan:
    """Just enough evenly spread trajectories, read at a stride <= `max_stride`, to reach `target` examples.

    The stride is never sparser than reading every trajectory would need, and grows only when even
    MIN_FIT_TRAJECTORIES trajectories hold more anchors than the target (small runs), so they all contribute.
    """
    N, target = len(ctx.trajectories), max(1, int(target))
    count = lambda idx, s: sum(_anchors_of(ctx, i, s) for i in idx)  # noqa: E731
    floor = spread_indices(N, MIN_FIT_TRAJECTORIES)
    # never sparser than reading every trajectory would need (few anchors in all: every one of them)
    stride = max(1, min(int(max_stride), -(-count(range(N), 1) // target)))
    while count(floor, stride) > target and stride < max((len(t) for t in ctx.trajectories), default=1):
        stride += 1
    longest = max((_anchors_of(ctx, i, stride) for i in range(N)), default=0)
    n = max(len(floor), -(-target // max(1, longest)))
    while n < N and count(spread_indices(N, n), stride) < target:
        n += 1
    return ExamplePlan(spread_indices(N, n), stride, target)


def plan_request(top_k: int, plan: ExamplePlan) -> ExampleRequest:
    """The examples request of a plan: its trajectories at its stride, capped at its target, with target logits."""
    return ExampleRequest(top_k=top_k, stride=plan.stride, max_examples=plan.target,
                          trajectories=tuple(plan.trajectories), with_target=True)


def cached_sets(ctx, wanted: Sequence[tuple[int, ExamplePlan]]) -> list[DraftExamples]:
    """`draft_examples` with target logits for each (top_k, plan), computed once per prepare run; the sets not
    cached yet are built in one pass, so a trajectory two of them read costs one target forward."""
    keys = [("draft_examples", k, p.stride, p.target, tuple(p.trajectories)) for k, p in wanted]
    first: dict = {}
    for i, key in enumerate(keys):
        if key not in ctx.cache:
            first.setdefault(key, i)  # a set asked for twice is built once
    todo = list(first.values())
    for i, ex in zip(todo, draft_example_sets(ctx, [plan_request(*wanted[i]) for i in todo]) if todo else ()):
        ctx.cache[keys[i]] = ex
    return [ctx.cache[key] for key in keys]


def cached_examples(ctx, *, top_k: int, plan: ExamplePlan) -> DraftExamples:
    """One set of `cached_sets`."""
    return cached_sets(ctx, [(top_k, plan)])[0]


def head_plan(ctx) -> ExamplePlan:
    """The heads' examples: about min(aux_max_examples, 4096), every HEAD_STRIDE-th anchor."""
    want = min(ctx.cfg.aux_max_examples or HEAD_TARGET_EXAMPLES, HEAD_TARGET_EXAMPLES)
    return plan_examples(ctx, want, HEAD_STRIDE)


def correction_plan(ctx) -> ExamplePlan:
    """The corrections' examples: about min(aux_max_examples, 12288), every anchor."""
    cap = min(ctx.cfg.aux_max_examples or CORRECTION_TARGET_EXAMPLES, CORRECTION_TARGET_EXAMPLES)
    return plan_examples(ctx, cap, CORRECTION_STRIDE)


def _fit_sets(ctx) -> list[DraftExamples]:
    """The heads' and the corrections' examples, both built at the first fitter's request (one pass)."""
    return cached_sets(ctx, [(min(HEAD_TOP_K, ctx.rt.vocab_size), head_plan(ctx)),
                             (min(CORRECTION_TOP_K, ctx.rt.vocab_size), correction_plan(ctx))])


def head_examples(ctx) -> DraftExamples:
    """Fit examples of the selector heads (02 pair selector, 04 jump head, 05 fused residual)."""
    return _fit_sets(ctx)[0]


def correction_examples(ctx) -> DraftExamples:
    """Fit examples of the corrections (09, 12, 14)."""
    return _fit_sets(ctx)[1]


def examples_meta(ex: DraftExamples) -> dict:
    """What a fit's meta records about its examples: trajectories read, anchors kept, anchor stride."""
    return {"example_trajectories": int(len(ex.trajectories)), "example_anchors": int(len(ex.anchors)),
            "anchor_stride": int(ex.stride)}


# --- hold-out -----------------------------------------------------------------------------------------

def split_by_trajectory(anchors, seed: int, fraction: float = HOLDOUT_FRACTION):
    """The one hold-out policy of every fitter: a seeded permutation of the trajectory indices, ~20% (at
    least one, never all) held out. Returns (train_mask, holdout_mask, train_ids, hold_ids).

    Whole trajectories, not single anchors or example order: neighbouring anchors of one trajectory share
    most of their context, so holding out single anchors would leak. With one trajectory nothing is held
    out and the metrics are reported on the training examples (meta `eval` says which).
    """
    traj = sorted({t for t, _ in anchors})
    order = list(traj)
    random.Random(seed).shuffle(order)
    n_hold = min(max(1, round(len(order) * fraction)), len(order) - 1) if len(order) >= 2 else 0
    hold = sorted(order[:n_hold])
    train = sorted(order[n_hold:])
    hs = set(hold)
    hmask = torch.tensor([t in hs for t, _ in anchors], dtype=torch.bool)
    return ~hmask, hmask, train, hold


# --- head training ------------------------------------------------------------------------------------

def batches(train_idx: torch.Tensor, steps: int, size: int, generator: torch.Generator) -> Batches:
    """`steps` batches of `size` rows drawn with replacement from train_idx."""
    return Batches(train_idx, steps, size, generator)


class Batches:
    """`batches`' rows, drawn lazily (the generator's draws happen in the same order as a generator function's, so
    fits are unchanged) and sized, so `train_steps` can report its progress."""

    def __init__(self, train_idx: torch.Tensor, steps: int, size: int, generator: torch.Generator):
        self.train_idx, self.steps, self.size, self.generator = train_idx, int(steps), size, generator

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        for _ in range(self.steps):
            yield self.train_idx[torch.randint(len(self.train_idx), (self.size,), generator=self.generator)]


def head_batches(train_idx: torch.Tensor, steps: int, seed: int, size: int = 64):
    """The selector heads' batches: min(size, rows) per step, from a generator seeded with `seed`."""
    return batches(train_idx, steps, min(size, len(train_idx)), torch.Generator().manual_seed(seed))


# When the fits' optimisation must end (a perf_counter time), set by prepare under a budget (`fit_deadline`): the
# optimisation is the one part of a fit whose length does not follow the data, so a budget stops it rather than
# projecting it. A context variable, not an argument of every fitter: the deadline is prepare's, not a method's.
_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("fit_deadline", default=None)
CUT: contextvars.ContextVar[list | None] = contextvars.ContextVar("fit_cuts", default=None)


@contextlib.contextmanager
def fit_deadline(at: float | None):
    """Within it, `train_steps` stops at `at` (None: no deadline); each stop is appended to the yielded list."""
    cuts: list = []
    t1, t2 = _DEADLINE.set(at), CUT.set(cuts)
    try:
        yield cuts
    finally:
        _DEADLINE.reset(t1)
        CUT.reset(t2)


def train_steps(params, loss_of, row_batches, *, lr: float = 3e-3, weight_decay: float = 0.0,
                clip: float | None = None) -> list[float]:
    """AdamW over `row_batches`; `loss_of(rows)` returns the loss (None skips the batch). Returns the losses.
    Under a `fit_deadline` it stops once the deadline has passed (at least one step is taken) and records it."""
    params = list(params)
    deadline = _DEADLINE.get()
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    losses = []
    # a sized `row_batches` (`batches`) logs progress: prepare fits several heads for minutes without a line
    steps = logged(row_batches, "fit: optimisation steps", len(row_batches), log) \
        if hasattr(row_batches, "__len__") else row_batches
    for i, rows in enumerate(steps):
        if deadline is not None and losses and time.perf_counter() > deadline:
            log.warning("fit: the prepare budget's time is spent: optimisation stopped at step %d of %s", i,
                        len(row_batches) if hasattr(row_batches, "__len__") else "?")
            cuts = CUT.get()
            if cuts is not None:
                cuts.append({"step": i, "steps": len(row_batches) if hasattr(row_batches, "__len__") else None})
            break
        loss = loss_of(rows)
        if loss is None:
            continue
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def label_index(ids: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each label sits among its row's candidates: (index [..], present mask [..])."""
    hit = ids == labels[..., None]
    return hit.float().argmax(-1), hit.any(-1)


def restricted_accuracy(scores: torch.Tensor, idx: torch.Tensor, present: torch.Tensor) -> float:
    if not bool(present.any()):
        return 0.0
    return float((scores.argmax(-1) == idx)[present].float().mean())


def eval_rows(held: torch.Tensor, train_idx: torch.Tensor) -> torch.Tensor:
    """Rows the metrics are computed on: the held-out ones, or the training ones when none is held out."""
    return torch.nonzero(held).flatten() if bool(held.any()) else train_idx


def start_head_fit(ctx, seed_offset: int, build):
    """What every head fit (02 pair selector, 04 jump head, 05 fused residual) starts from: the head
    examples, the head built under the fitter's own seed, and the hold-out (same seed).

    Returns (examples, head, held-out mask, training rows, meta with the example counts and the split).
    """
    ex = head_examples(ctx)
    torch.manual_seed(ctx.cfg.seed + seed_offset)
    head = build()
    train, held, train_ids, hold_ids = split_by_trajectory(ex.anchors, ctx.cfg.seed + seed_offset)
    meta = {"examples": int(ex.prev.shape[0]), "held_out": int(held.sum()), "steps": ctx.cfg.aux_steps,
            **examples_meta(ex), **split_meta(train_ids, hold_ids)}
    return ex, head, held, torch.nonzero(train).flatten(), meta


def split_meta(train_ids: list[int], hold_ids: list[int]) -> dict:
    """What the manifest records about a fitter's hold-out."""
    return {"train_trajectories": train_ids, "holdout_trajectories": hold_ids,
            "split": "by trajectory (seeded permutation)"}


def head_meta(losses: list[float], held: torch.Tensor, module: torch.nn.Module) -> dict:
    return {"loss_first": losses[0] if losses else None, "loss_final": losses[-1] if losses else None,
            "eval": "held-out trajectories" if bool(held.any()) else "train",
            "parameters": parameter_count(module)}


def module_bytes(module: torch.nn.Module, config: dict) -> bytes:
    """A head as artifact bytes: {"config", "state_dict" (float32)}, loadable by `Prepared.module`."""
    sd = {k: v.detach().float().contiguous() for k, v in module.state_dict().items()}
    return tensor_bytes({"config": config, "state_dict": sd})


# --- closed-form ridge --------------------------------------------------------------------------------

def ridge(X: torch.Tensor, y: torch.Tensor, lam: float) -> torch.Tensor:
    """Closed-form ridge in float64: (X'X + lam I')^-1 X'y, column 0 (the intercept) unregularised."""
    X, y = X.double(), y.double()
    A, b = X.T @ X, X.T @ y
    reg = torch.eye(A.shape[0], dtype=torch.float64) * lam
    reg[0, 0] = 0.0
    try:
        return torch.linalg.solve(A + reg, b)
    except RuntimeError:  # singular (e.g. a constant column with lam = 0): least-norm solution
        return torch.linalg.pinv(A + reg) @ b
