"""The learned low-rank pair selector shared by methods 02, 03, 04, 05, 07 and 11, and its fitter.

It scores how well candidate token c follows token p, given the context vector x (the fused target
feature of the last context row, the same vector `draft_examples(...).context` holds):

    gate(x)   = tanh(W x + b)                                   [r]
    pair(p→c) = Σ_r a[p]_r · gate_r · b[c]_r · r^-0.5          a, b: [V, r] tables over the full vocab

It is trained by `prepare` (fitter "pair_selector") on the drafter's outputs along teacher trajectories:
cross-entropy over the drafter's top-K candidates of (drafter logit + pair(true previous token → cand));
positions whose label is not among the top-K are masked (top-K restricted training).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..base import Fitter
from .block import BlockProposer
from .fitting import (
    eval_rows,
    head_batches,
    head_meta,
    label_index,
    module_bytes,
    restricted_accuracy,
    start_head_fit,
    train_steps,
)

PAIR_FILE = "pair_selector.safetensors"


class PairSelector(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, rank: int = 16):
        super().__init__()
        self.rank = rank
        self.a = nn.Embedding(vocab_size, rank)
        self.b = nn.Embedding(vocab_size, rank)
        self.gate = nn.Linear(hidden_size, rank)
        nn.init.normal_(self.a.weight, std=0.1)
        nn.init.normal_(self.b.weight, std=0.1)

    def config(self) -> dict:
        return {"vocab_size": self.a.num_embeddings, "hidden_size": self.gate.in_features, "rank": self.rank}

    def gates(self, ctx: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., r], with the r^-0.5 scale folded in."""
        return torch.tanh(self.gate(ctx)) * self.rank ** -0.5

    def pair(self, prev: torch.Tensor, cand: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """prev [N, B], cand [N, B, K], g [N, r] -> pair(prev → cand) [N, B, K]."""
        left = self.a(prev) * g[:, None, :]
        return (left[:, :, None, :] * self.b(cand)).sum(-1)


class PairScorer:
    """pair(p→c) for one block: gate from the context vector, rows fetched once for the block's tokens.

    `count` is the number of pair scores evaluated (the methods' guidance work).
    """

    def __init__(self, sel: PairSelector, ctx: torch.Tensor, tokens):
        with torch.inference_mode():
            self.g = sel.gates(ctx.float())
            self.sel = sel
            uniq = sorted({int(t) for t in tokens})
            idx = torch.tensor(uniq, dtype=torch.long)
            ag = (sel.a.weight[idx] * self.g).tolist()
            bb = sel.b.weight[idx].tolist()
        self._ag = dict(zip(uniq, ag))
        self._b = dict(zip(uniq, bb))
        self.count = 0

    def _rows(self, t: int):
        if t not in self._ag:  # a token outside the prefetched set (not expected; kept correct anyway)
            with torch.inference_mode():
                self._ag[t] = (self.sel.a.weight[t] * self.g).tolist()
                self._b[t] = self.sel.b.weight[t].tolist()
        return self._ag[t], self._b[t]

    def __call__(self, left: int, rights) -> list[float]:
        """pair(left → r) for every r in rights (the `score_pair` callback of `common.gap_fill`)."""
        la = self._rows(int(left))[0]
        out = []
        for r in rights:
            rb = self._rows(int(r))[1]
            out.append(math.fsum(x * y for x, y in zip(la, rb)))
        self.count += len(out)
        return out

    def into(self, lefts, right: int) -> list[float]:
        """pair(l → right) for every l in lefts (backward consistency with a chosen right neighbour)."""
        rb = self._rows(int(right))[1]
        out = [math.fsum(x * y for x, y in zip(self._rows(int(t))[0], rb)) for t in lefts]
        self.count += len(out)
        return out

    def transitions(self, ids: list[list[int]]) -> list[list[list[float]]]:
        """trans[i-1][p][j] = pair(ids[i-1][p] → ids[i][j]) for i = 1..B-1, in one batched product."""
        if len(ids) < 2:
            return []
        with torch.inference_mode():
            left = torch.tensor([[self._rows(t)[0] for t in row] for row in ids[:-1]], dtype=torch.float64)
            right = torch.tensor([[self._rows(t)[1] for t in row] for row in ids[1:]], dtype=torch.float64)
            trans = torch.bmm(left, right.transpose(1, 2))
        self.count += trans.numel()
        return trans.tolist()


class ContextProposer(BlockProposer):
    """BlockProposer for the pair-scored methods: it loads the learned pair selector and remembers the
    taps of the last context row, whose fused features are the selector's context vector."""

    def __init__(self, rt, prepared, options: Any = None):
        super().__init__(rt, prepared, options)
        self.selector = prepared.module(PAIR_FILE, PairSelector)
        self._last_tap = None

    def begin(self, prompt: list[int], hidden: Any) -> None:
        super().begin(prompt, hidden)
        self._last_tap = None
        self._remember(hidden)

    def observe(self, hidden: Any) -> None:
        super().observe(hidden)
        self._remember(hidden)

    def _remember(self, hidden: Any) -> None:
        if hidden is not None and hidden.shape[0] > 0:
            self._last_tap = hidden[-1:]

    @torch.inference_mode()
    def context(self) -> torch.Tensor:
        """Fused target feature [H] (float32, CPU) of the last context row: `draft_examples(...).context`."""
        p = next(self.drafter.parameters())
        if self._last_tap is None:
            return torch.zeros(self.drafter.cfg.hidden_size)
        return self.drafter.fuse(self._last_tap.to(device=p.device, dtype=p.dtype))[0].float().cpu()

    def block_scorer(self, ids, prev: int, ctx: torch.Tensor | None = None) -> PairScorer:
        """The pair scorer of one block: the context vector, the previous token and every candidate id."""
        return PairScorer(self.selector, self.context() if ctx is None else ctx,
                          [prev, *(t for row in ids for t in row)])


def fit_pair_selector(ctx) -> dict:
    ex, sel, held, train_idx, meta = start_head_fit(
        ctx, 2, lambda: PairSelector(ctx.rt.vocab_size, ctx.drafter.cfg.hidden_size))
    prev_true = torch.cat([ex.prev[:, None], ex.labels[:, :-1]], dim=1)  # [N, B] true previous tokens
    idx, present = label_index(ex.topk_ids, ex.labels)

    def scores(rows):
        g = sel.gates(ex.context[rows])
        return ex.topk_vals[rows] + sel.pair(prev_true[rows], ex.topk_ids[rows], g)

    def loss_of(rows):
        m = present[rows]
        return nn.functional.cross_entropy(scores(rows)[m], idx[rows][m]) if bool(m.any()) else None

    losses = train_steps(sel.parameters(), loss_of, head_batches(train_idx, ctx.cfg.aux_steps, ctx.cfg.seed + 3))
    sel.eval()
    ev = eval_rows(held, train_idx)
    with torch.no_grad():  # metrics at the inference default K = 8
        i8, p8 = label_index(ex.topk_ids[ev][..., :8], ex.labels[ev])
        base = restricted_accuracy(ex.topk_vals[ev][..., :8], i8, p8)
        tuned = restricted_accuracy(scores(ev)[..., :8], i8, p8)
    meta.update(stride=ex.stride, top_k=ex.topk_ids.shape[-1], label_in_top_k=float(present.float().mean()),
                drafter_top1_acc=base, with_pair_top1_acc=tuned, **head_meta(losses, held, sel),
                note="teacher-forced: pair(true previous token -> drafter top-K), restricted CE")
    return {"files": {PAIR_FILE: module_bytes(sel, sel.config())}, "meta": meta}


PAIR_FITTER = Fitter("pair_selector", (PAIR_FILE,), fit_pair_selector)
