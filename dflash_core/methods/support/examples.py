"""Training data for the methods' auxiliary heads and fits, built once from the teacher trajectories.

For each trajectory and anchor position a (the last committed token), the drafter is run as at inference
(context = target taps of rows < a; all anchors of a trajectory in one forward, `drafter.anchored_blocks`, equal to
decode's one block at a time up to the float summation order); we keep its logits' top-K, its hidden rows, the fused
context vector of the last context row, the previous token and the true next B tokens (labels).
The top-K follows the lab's tie rule (`common.topk_tensors`), as inference does.

Each trajectory costs one target forward (taps and target logits together), so the fits read an evenly
spread subset of the trajectories (`fitting.plan_examples`) rather than a few anchors of every one; the example
sets are built in one pass (`draft_example_sets`), so a trajectory two sets read is forwarded once, and
trajectories of about one length share a forward (`target_rows_batch`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ...progress import logged
from ...runtime.drafter import anchored_blocks
from ...runtime.target import trajectory_taps, uncached_rows
from .common import topk_tensors

log = logging.getLogger(__name__)

HEAD_CHUNK = 32  # blocks per drafter forward and head product: 512 rows, [512, V] float32 logits (134 MB at V 65,536)
GROUP_LOGITS = 1 << 25  # target logits of one batched forward: 32 M floats (128 MB), 8 SmolLM2 trajectories


@dataclass
class DraftExamples:
    anchors: list[tuple[int, int]]  # (trajectory index, anchor position)
    prev: torch.Tensor  # [N] anchor token id (the last committed token)
    labels: torch.Tensor  # [N, B] true next B tokens (teacher greedy continuation)
    topk_ids: torch.Tensor  # [N, B, K]
    topk_vals: torch.Tensor  # [N, B, K] drafter logits of those ids
    logits: torch.Tensor | None  # [N, B, V] full drafter logits (only when asked; memory heavy)
    hidden: torch.Tensor  # [N, B, H] drafter hidden rows
    context: torch.Tensor  # [N, H] fused target feature of the last context row (the "context vector")
    target_logits: torch.Tensor | None  # [N, B, K] target logits of the top-K ids at the B positions
    stride: int = 1  # anchor stride the examples were taken with
    trajectories: list[int] = field(default_factory=list)  # trajectory indices the anchors come from (sorted)


def target_rows(rt, seq: Sequence[int], taps: Sequence[int], with_logits: bool):
    """(taps [T, F], target logits [T, V] float32 or None) of every row of `seq` from ONE uncached forward.

    Bit for bit what `target.trajectory_taps` and a separate logits forward give (tests check it), at half
    the target forwards.
    """
    if not with_logits:
        return trajectory_taps(rt, seq, taps), None
    return uncached_rows(rt, [seq], taps, with_logits=True)[0]


def chunk_topk(drafter, hidden: torch.Tensor, head, top_k: int, full: bool):
    """(top-k ids [N, B, k] in target ids, their values, the [N, B, V] logits or None) of drafted rows.

    Over the draft vocabulary the top-k is taken from the K head columns and mapped through d2t, not from the
    [N, B, V] scatter: filling and scattering 65,536 columns per row cost more than the head's product itself
    in the 350M fits (4.1 of 14.0 s in studies/2026-12-06-fit-examples-head-batched/). The same ids by the tie rule: the
    map is ascending, so (value desc, column asc) is (value desc, target id asc), and k <= K keeps every
    out-of-vocabulary id (logit -1e9) out of the top-k. Other maps, or full logits asked for, take the scatter.
    """
    k_space = (not full and drafter.draft_ids_ascending() and top_k <= drafter.cfg.draft_vocab)
    if not k_space:
        lgs = drafter.logits(hidden, head).float().cpu()
        ids, vals = topk_tensors(lgs, top_k)
        return ids, vals, lgs if full else None
    ids, vals = topk_tensors(drafter.draft_space_logits(hidden, head).float().cpu(), top_k)
    return drafter.d2t.cpu()[ids], vals, None


@dataclass(frozen=True)
class ExampleRequest:
    """One set of fit examples: the drafter's top-`top_k` at every `stride`-th continuation anchor of the given
    trajectories (None: all), capped at `max_examples` anchors taken in trajectory order."""

    top_k: int = 8
    stride: int = 1
    max_examples: int | None = None
    trajectories: tuple[int, ...] | None = None
    keep_full_logits: bool = False
    with_target: bool = True


def anchor_positions(ctx, ti: int, stride: int) -> list[int]:
    """The continuation anchors of trajectory `ti` at `stride`: from its prompt's last token while a full block of
    labels follows."""
    return list(range(max(ctx.prompt_lens[ti], 1), len(ctx.trajectories[ti]) - ctx.drafter.cfg.block_size, stride))


def planned_anchors(ctx, req: ExampleRequest) -> dict[int, list[int]]:
    """Trajectory index -> the anchors `req` takes from it (ascending), the cap applied in trajectory order."""
    chosen = range(len(ctx.trajectories)) if req.trajectories is None else sorted(set(req.trajectories))
    out: dict[int, list[int]] = {}
    left = req.max_examples
    for ti in chosen:
        if left is not None and left <= 0:
            break
        here = anchor_positions(ctx, ti, req.stride)
        out[ti] = here if left is None else here[:left]
        left = None if left is None else left - len(out[ti])
    return out


def target_rows_batch(rt, seqs: Sequence[Sequence[int]], taps: Sequence[int], with_logits: bool) -> list[tuple]:
    """`target_rows` of several sequences from ONE uncached forward, right-padded (`target.uncached_rows`): the
    fits' 70-90-row forwards ran at ~0.7 of the rate of 8 in one forward on SmolLM2
    (studies/2026-12-07-one-pass-fit-examples/)."""
    if len(seqs) == 1:
        return [target_rows(rt, seqs[0], taps, with_logits)]
    return uncached_rows(rt, seqs, taps, with_logits)


def forward_groups(lengths: Sequence[int], vocab: int, rows_cap: int | None = None) -> list[list[int]]:
    """Indices into `lengths` grouped for `target_rows_batch`: by ascending length (little padding), as many as
    keep the group's [rows, vocab] logits within `rows_cap` floats (default GROUP_LOGITS; at least one a group)."""
    rows_cap = GROUP_LOGITS if rows_cap is None else rows_cap
    out: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda j: (lengths[j], j)):
        if out and (len(out[-1]) + 1) * lengths[i] * max(1, vocab) <= rows_cap:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def _target_rows_by_group(rt, ctx, indices: list[int], taps, with_logits: bool):
    """(trajectory index, taps, target logits) for each index, the target run once per `forward_groups` group."""
    for grp in forward_groups([len(ctx.trajectories[ti]) for ti in indices], rt.vocab_size):
        picked = [indices[g] for g in grp]
        yield from zip(picked, target_rows_batch(rt, [ctx.trajectories[ti] for ti in picked], taps, with_logits))


@torch.no_grad()
def draft_example_sets(ctx, requests: Sequence[ExampleRequest]) -> list[DraftExamples]:
    """Every request's examples in one pass over the trajectories any of them reads: each trajectory costs one
    target forward (shared by the requests that read it, batched with trajectories of about its length), then
    the drafter's passes for each request's anchors."""
    rt, drafter = ctx.rt, ctx.drafter
    plans = [planned_anchors(ctx, r) for r in requests]
    union = sorted(set().union(*plans))
    logits_needed = any(r.with_target for r in requests)
    found: list[dict[int, dict]] = [{} for _ in requests]
    what = ", ".join(f"top-{r.top_k}, stride {r.stride}" for r in requests)
    # a target forward and drafter passes per trajectory: minutes in a default prepare, so it reports progress
    rows = _target_rows_by_group(rt, ctx, union, drafter.cfg.taps, logits_needed)
    for ti, (taps, tlog) in logged(rows, f"fit examples ({what})", len(union), log):
        for r, plan, got in zip(requests, plans, found):
            if ti in plan:
                got[ti] = _draft_at(ctx, ctx.trajectories[ti], plan[ti], taps, tlog if r.with_target else None, r)
    return [_assemble(r, plan, got) for r, plan, got in zip(requests, plans, found)]


def draft_examples(ctx, top_k: int = 8, stride: int = 1, keep_full_logits: bool = False,
                   with_target: bool = True, max_examples: int | None = None,
                   trajectories: Sequence[int] | None = None) -> DraftExamples:
    """Run the drafter at every `stride`-th continuation anchor of the trajectories with the given indices
    (None: all; train data only), stopping after `max_examples` anchors."""
    req = ExampleRequest(top_k, stride, max_examples, None if trajectories is None else tuple(trajectories),
                         keep_full_logits, with_target)
    return draft_example_sets(ctx, [req])[0]


def _draft_at(ctx, seq: Sequence[int], here: list[int], taps: torch.Tensor, tlog: torch.Tensor | None,
              req: ExampleRequest) -> dict:
    """One trajectory's examples at the anchors `here`: lists of per-anchor tensors under `DraftExamples`' names."""
    drafter, rt = ctx.drafter, ctx.rt
    B = drafter.cfg.block_size
    embed, head = rt.model.get_input_embeddings(), rt.model.get_output_embeddings()
    out: dict[str, list] = {k: [] for k in ("anchors", "prev", "labels", "ids", "vals", "logits", "hidden",
                                            "context", "tgt")}
    fused_rows = drafter.fuse(taps.to(next(drafter.parameters()).dtype))  # the context vector of every row
    # One drafter forward and one head product per chunk of this trajectory's anchors (`anchored_blocks`), not
    # one per anchor: per anchor a 17-row block streams every drafter weight, and at the 350M shape the head's
    # K x H weight (64 MB at K 16,384) costs 13 ms for 16 rows against ~4 ms a block in a 768-row product.
    for lo in range(0, len(here), HEAD_CHUNK):
        part = here[lo:lo + HEAD_CHUNK]
        hids = anchored_blocks(drafter, taps, torch.tensor(part), torch.tensor([seq[a] for a in part]), embed)
        ids, vals, lgs = chunk_topk(drafter, hids, head, req.top_k, req.keep_full_logits)
        for j, a in enumerate(part):
            out["anchors"].append(a)
            out["prev"].append(seq[a])
            out["labels"].append(torch.tensor(seq[a + 1:a + 1 + B]))
            out["ids"].append(ids[j])
            out["vals"].append(vals[j])
            out["hidden"].append(hids[j].float().cpu())
            out["context"].append(fused_rows[a - 1].float().cpu())
            if lgs is not None:
                out["logits"].append(lgs[j].clone())
            if tlog is not None:
                # target logits at rows a..a+B-1 predict tokens a+1..a+B: gather the drafter's candidates
                out["tgt"].append(tlog[a:a + B].gather(1, ids[j]))
    return out


def _assemble(req: ExampleRequest, plan: dict[int, list[int]], got: dict[int, dict]) -> DraftExamples:
    """One request's examples in trajectory order, then anchor order."""
    order = sorted(plan)
    cat = lambda k: [x for ti in order for x in got[ti][k]]  # noqa: E731
    anchors = [(ti, a) for ti in order for a in got[ti]["anchors"]]
    return DraftExamples(
        anchors=anchors, prev=torch.tensor(cat("prev"), dtype=torch.long), labels=torch.stack(cat("labels")),
        topk_ids=torch.stack(cat("ids")), topk_vals=torch.stack(cat("vals")),
        logits=torch.stack(cat("logits")) if req.keep_full_logits else None, hidden=torch.stack(cat("hidden")),
        context=torch.stack(cat("context")), target_logits=torch.stack(cat("tgt")) if req.with_target else None,
        stride=req.stride, trajectories=sorted({t for t, _ in anchors}))
