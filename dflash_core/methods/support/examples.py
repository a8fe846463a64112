"""Training data for the methods' auxiliary heads and fits, built once from the teacher trajectories.

For each trajectory and anchor position a (the last committed token), the drafter is run as at inference
(context = target taps of rows < a; all anchors of a trajectory in one forward, `drafter.anchored_blocks`, equal to
decode's one block at a time up to the float summation order); we keep its logits' top-K, its hidden rows, the fused
context vector of the last context row, the previous token and the true next B tokens (labels).
The top-K follows the lab's tie rule (`common.topk_tensors`), as inference does.

Each trajectory costs one target forward (taps and target logits together), so the fits read an evenly
spread subset of the trajectories (`fitting.plan_examples`) rather than a few anchors of every one.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ...progress import logged
from ...runtime.drafter import anchored_blocks
from ...runtime.target import trajectory_taps
from .common import topk_tensors

log = logging.getLogger(__name__)

HEAD_CHUNK = 32  # blocks per drafter forward and head product: 512 rows, [512, V] float32 logits (134 MB at V 65,536)


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
    ids_t = torch.tensor([list(seq)], dtype=torch.long, device=rt.device)
    with torch.inference_mode():
        out = rt.model(input_ids=ids_t, use_cache=False, output_hidden_states=[int(t) + 1 for t in taps])
        hidden = torch.cat([out.hidden_states[int(t) + 1][0] for t in taps], dim=-1).detach().cpu()
        logits = out.logits[0].float().cpu()
    return hidden, logits


def chunk_topk(drafter, hidden: torch.Tensor, head, top_k: int, full: bool):
    """(top-k ids [N, B, k] in target ids, their values, the [N, B, V] logits or None) of drafted rows.

    Over the draft vocabulary the top-k is taken from the K head columns and mapped through d2t, not from the
    [N, B, V] scatter: filling and scattering 65,536 columns per row cost more than the head's product itself
    in the 350M fits (4.1 of 14.0 s in `scripts/profile_fit_examples.py`). The same ids by the tie rule: the
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


@torch.no_grad()
def draft_examples(ctx, top_k: int = 8, stride: int = 1, keep_full_logits: bool = False,
                   with_target: bool = True, max_examples: int | None = None,
                   trajectories: Sequence[int] | None = None) -> DraftExamples:
    """Run the drafter at every `stride`-th continuation anchor of the trajectories with the given indices
    (None: all; train data only), stopping after `max_examples` anchors."""
    rt, drafter = ctx.rt, ctx.drafter
    B = drafter.cfg.block_size
    embed, head = rt.model.get_input_embeddings(), rt.model.get_output_embeddings()
    out = {k: [] for k in ("prev", "labels", "ids", "vals", "logits", "hidden", "context", "tgt")}
    anchors = []
    chosen = range(len(ctx.trajectories)) if trajectories is None else sorted(set(trajectories))
    # a target forward and drafter passes per trajectory: minutes in a default prepare, so it reports progress
    for ti in logged(chosen, f"fit examples (top-{top_k}, stride {stride})", len(chosen), log):
        seq, plen = ctx.trajectories[ti], ctx.prompt_lens[ti]
        taps, tlog = target_rows(rt, seq, drafter.cfg.taps, with_target)
        here = list(range(max(plen, 1), len(seq) - B, stride))
        if max_examples:
            here = here[:max(max_examples - len(anchors), 0)]
        fused_rows = drafter.fuse(taps.to(next(drafter.parameters()).dtype))  # the context vector of every row
        # One drafter forward and one head product per chunk of this trajectory's anchors (`anchored_blocks`), not
        # one per anchor: per anchor a 17-row block streams every drafter weight, and at the 350M shape the head's
        # K x H weight (64 MB at K 16,384) costs 13 ms for 16 rows against ~4 ms a block in a 768-row product.
        for lo in range(0, len(here), HEAD_CHUNK):
            part = here[lo:lo + HEAD_CHUNK]
            hids = anchored_blocks(drafter, taps, torch.tensor(part), torch.tensor([seq[a] for a in part]), embed)
            ids, vals, lgs = chunk_topk(drafter, hids, head, top_k, keep_full_logits)
            for j, a in enumerate(part):
                anchors.append((ti, a))
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
        if max_examples and len(anchors) >= max_examples:
            break
    return DraftExamples(
        anchors=anchors, prev=torch.tensor(out["prev"]), labels=torch.stack(out["labels"]),
        topk_ids=torch.stack(out["ids"]), topk_vals=torch.stack(out["vals"]),
        logits=torch.stack(out["logits"]) if keep_full_logits else None, hidden=torch.stack(out["hidden"]),
        context=torch.stack(out["context"]), target_logits=torch.stack(out["tgt"]) if with_target else None,
        stride=stride, trajectories=sorted({t for t, _ in anchors}))
