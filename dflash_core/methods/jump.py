"""Sparse-anchor selectors: 04 jump_mobs and 05 fused_jump, their heads and fitters.

Both fix the anchors at positions 1, 3, 5, ... with a learned head, fill the other slots with the pair
selector (`common.gap_fill`), and fall back to MOBS (`mobs.mobs_select`) when the block has no anchor.

04 jump_mobs: a jump head (trained by prepare, `jump_head.pt`) maps the context vector and a position
  embedding to a query; its logits are evaluated only for the top-K candidates of the sparse anchor
  positions 1, 3, 5, ... (every other slot, as the seed's offsets 2 and 4 for B=4). chosen[p] = first
  argmax of v[p] + w·jump[p] (w = 0.5), then `common.gap_fill` fills the other slots in one Jacobi wave
  (each has its left (or prev) and right neighbours fixed). No anchor inside the block (B = 1): MOBS.

05 fused_jump: no extra head forward on the context. A fused residual (`fused_residual.pt`) turns the
  drafter's own hidden row at each anchor position into a rank-r query scored against a codebook row of
  each top-K candidate ONLY (the seed scored all C candidates and then indexed them: its flaw 4).
  chosen[p] = first argmax of v[p] + w·residual[p] (w = 1.0); an anchor whose best-minus-second score is
  below `min_margin` (default 0: off) is left to the gap fill. Then gap fill as 04; no anchor: MOBS.

Guidance work = all pair scores + jump/residual scores + Boltzmann scores evaluated for the whole block.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .base import Fitter, MethodInfo
from .mobs import mobs_select
from .support.common import MethodOptions, context_fingerprint, first_argmax, gap_fill, opt, topk
from .support.fitting import (
    eval_rows,
    head_batches,
    head_meta,
    label_index,
    module_bytes,
    restricted_accuracy,
    start_head_fit,
    train_steps,
)
from .support.selector import PAIR_FITTER, ContextProposer

JUMP_FILE = "jump_head.safetensors"
FUSED_FILE = "fused_residual.safetensors"


def jump_positions(block: int) -> tuple[int, ...]:
    """Sparse anchor positions of 04/05: 1, 3, 5, ... (every other slot; the seed's offsets 2, 4 at B=4)."""
    return tuple(range(1, block, 2))


# --- 04 jump_mobs -----------------------------------------------------------------------------------

class JumpHead(nn.Module):
    """Context vector + position embedding -> query; logits evaluated for given candidate ids only."""

    def __init__(self, vocab_size: int, hidden_size: int, block_size: int, dim: int = 48):
        super().__init__()
        self.inp = nn.Linear(hidden_size, dim)
        self.offset = nn.Embedding(block_size, dim)
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Embedding(vocab_size, dim)
        self.out_bias = nn.Parameter(torch.zeros(vocab_size))
        nn.init.normal_(self.out.weight, std=dim ** -0.5)

    def config(self) -> dict:
        return {"vocab_size": self.out.num_embeddings, "hidden_size": self.inp.in_features,
                "block_size": self.offset.num_embeddings, "dim": self.inp.out_features}

    def queries(self, ctx: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """ctx [N, H], positions [P] -> [N, P, dim]."""
        return self.norm(torch.tanh(self.inp(ctx)[:, None, :] + self.offset(positions)[None]))

    def score(self, q: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
        """q [N, P, dim], cand [N, P, K] -> logits of those candidates [N, P, K]."""
        return (self.out(cand) * q[:, :, None, :]).sum(-1) + self.out_bias[cand]


@dataclass(frozen=True)
class JumpOptions(MethodOptions):
    top_k: int = opt(8, lo=1, integer=True)
    jump_weight: float = opt(0.5)


class AnchorProposer(ContextProposer):
    """The flow 04 and 05 share: the drafter's top-K per slot; a head adds a score to the candidates of the sparse
    anchor slots (`jump_positions`); an anchor whose scores pass `keep` is fixed to its best candidate; the other
    slots are gap-filled with pair scores between fixed anchors, or chosen by MOBS when no anchor was fixed.
    Subclasses give the head's scores (`anchor_scores`), `keep` and the names of their counts (`meta`)."""

    weight: float = 1.0

    def anchor_scores(self, ids, hidden, pos: list[int], ctx) -> list[list[float]]:
        raise NotImplementedError

    def keep(self, scores: list[float]) -> bool:
        return True

    def meta(self, head_scores: int, anchors: int, skipped: int) -> dict:
        raise NotImplementedError

    def select(self, logits, hidden, prefix, k):
        ids, vals = topk(logits, self.options.top_k)
        prev = int(prefix[-1])
        ctx = self.context()
        scorer = self.block_scorer(ids, prev, ctx)
        pos = jump_positions(len(ids))
        chosen: list = [None] * len(ids)
        head_scores = skipped = 0
        if pos:
            with torch.inference_mode():
                rows = self.anchor_scores(ids, hidden, pos, ctx)
            for p, row in zip(pos, rows):
                s = [v + self.weight * r for v, r in zip(vals[p], row)]
                head_scores += len(row)
                if not self.keep(s):
                    skipped += 1
                    continue
                chosen[p] = ids[p][first_argmax(s)]
        meta = self.meta(head_scores, len(pos), skipped)
        if all(c is None for c in chosen):
            chosen, _ = mobs_select(ids, vals, scorer, prev, context_fingerprint(prefix))
            meta["mobs_fallback"] = 1
        else:
            chosen, _ = gap_fill(chosen, ids, vals, scorer, prev)
        meta["pair_scores"] = scorer.count
        return chosen, scorer.count + head_scores, meta


class JumpMOBSProposer(AnchorProposer):
    """04: the jump head scores each anchor's candidates from the context vector; every anchor is fixed."""

    def __init__(self, rt, prepared, options: JumpOptions):
        super().__init__(rt, prepared, options)
        self.jump = prepared.module(JUMP_FILE, JumpHead)
        self.weight = options.jump_weight

    def anchor_scores(self, ids, hidden, pos, ctx):
        q = self.jump.queries(ctx[None], torch.tensor(pos))
        return self.jump.score(q, torch.tensor([[ids[p] for p in pos]]))[0].tolist()

    def meta(self, head_scores, anchors, skipped):
        return {"jump_scores": head_scores, "jump_anchors": anchors} if anchors else {}


# --- 05 fused_jump ----------------------------------------------------------------------------------

class FusedResidual(nn.Module):
    """Drafter hidden row + position embedding -> rank-r query; residual = query · codebook[cand] · r^-0.5."""

    def __init__(self, vocab_size: int, hidden_size: int, block_size: int, rank: int = 16):
        super().__init__()
        self.rank = rank
        self.proj = nn.Linear(hidden_size, rank)
        self.offset = nn.Embedding(block_size, rank)
        self.codebook = nn.Embedding(vocab_size, rank)

    def config(self) -> dict:
        return {"vocab_size": self.codebook.num_embeddings, "hidden_size": self.proj.in_features,
                "block_size": self.offset.num_embeddings, "rank": self.rank}

    def queries(self, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """hidden [N, P, H] (drafter rows at the positions), positions [P] -> [N, P, r]."""
        return torch.tanh(self.proj(hidden) + self.offset(positions)[None])

    def score(self, q: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
        """q [N, P, r], cand [N, P, K] -> residual of those candidates only [N, P, K]."""
        return (self.codebook(cand) * q[:, :, None, :]).sum(-1) * self.rank ** -0.5


@dataclass(frozen=True)
class FusedOptions(MethodOptions):
    top_k: int = opt(8, lo=1, integer=True)
    fused_weight: float = opt(1.0)
    min_margin: float = opt(0.0, lo=0.0)


class FusedJumpProposer(AnchorProposer):
    """05: a residual from the drafter's own hidden rows scores each anchor's candidates; an anchor whose best two
    corrected scores are closer than `min_margin` is left to the gap fill."""

    def __init__(self, rt, prepared, options: FusedOptions):
        super().__init__(rt, prepared, options)
        self.fused = prepared.module(FUSED_FILE, FusedResidual)
        self.weight = options.fused_weight

    def anchor_scores(self, ids, hidden, pos, ctx):
        rows = hidden[list(pos)].float().cpu()
        q = self.fused.queries(rows[None], torch.tensor(pos))
        return self.fused.score(q, torch.tensor([[ids[p] for p in pos]]))[0].tolist()

    def keep(self, scores):
        if self.options.min_margin <= 0 or len(scores) < 2:
            return True
        top = sorted(scores, reverse=True)
        return top[0] - top[1] >= self.options.min_margin

    def meta(self, head_scores, anchors, skipped):
        return {"residual_scores": head_scores, "fused_anchors_skipped": skipped}


# --- fitters ----------------------------------------------------------------------------------------

def _force_label(cand: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Candidates with the label put in the last slot where it is absent (every example gets a target)."""
    cand = cand.clone()
    absent = ~(cand == labels[..., None]).any(-1)
    cand[..., -1] = torch.where(absent, labels, cand[..., -1])
    return cand


def _anchor_fit(ctx, seed_offset: int, cls):
    """What both anchor heads start from: `start_head_fit` plus the anchor positions."""
    B = ctx.drafter.cfg.block_size
    pos = torch.tensor(jump_positions(B), dtype=torch.long)
    ex, head, held, train_idx, meta = start_head_fit(
        ctx, seed_offset, lambda: cls(ctx.rt.vocab_size, ctx.drafter.cfg.hidden_size, B))
    return ex, pos, head, held, train_idx, {"positions": pos.tolist(), **meta}


def fit_jump_head(ctx) -> dict:
    """CE of the jump logits over the drafter's top-K candidates (+ the label) at the anchor positions."""
    ex, pos, head, held, train_idx, meta = _anchor_fit(ctx, 4, JumpHead)
    losses: list[float] = []
    if len(pos):
        labels = ex.labels[:, pos]
        cand = _force_label(ex.topk_ids[:, pos], labels)
        tgt, _ = label_index(cand, labels)

        def loss_of(rows):
            s = head.score(head.queries(ex.context[rows], pos), cand[rows])
            return nn.functional.cross_entropy(s.flatten(0, 1), tgt[rows].flatten())

        losses = train_steps(head.parameters(), loss_of, head_batches(train_idx, ctx.cfg.aux_steps, ctx.cfg.seed + 5))
        head.eval()
        ev = eval_rows(held, train_idx)
        with torch.no_grad():
            ids = ex.topk_ids[ev][:, pos][..., :8]
            v = ex.topk_vals[ev][:, pos][..., :8]
            idx, present = label_index(ids, labels[ev])
            j = head.score(head.queries(ex.context[ev], pos), ids)
            meta.update(drafter_top1_acc=restricted_accuracy(v, idx, present),
                        with_jump_top1_acc=restricted_accuracy(v + 0.5 * j, idx, present),
                        jump_alone_top1_acc=restricted_accuracy(j, idx, present))
    meta.update(head_meta(losses, held, head))
    return {"files": {JUMP_FILE: module_bytes(head, head.config())}, "meta": meta}


def fit_fused_residual(ctx) -> dict:
    """0.7·CE(label) + 0.3·KL(target ‖ student) over the top-K, student = drafter logit + residual.

    The seed's teacher was softmax(drafter + 0.5·jump); here the teacher is the verifier itself (the
    target's logits of the same candidates), which is what acceptance is measured against.
    """
    ex, pos, res, held, train_idx, meta = _anchor_fit(ctx, 6, FusedResidual)
    meta["teacher"] = "target logits of the top-K candidates"
    losses: list[float] = []
    if len(pos):
        ids, vals = ex.topk_ids[:, pos], ex.topk_vals[:, pos]
        hid, teacher = ex.hidden[:, pos], ex.target_logits[:, pos]
        idx, present = label_index(ids, ex.labels[:, pos])

        def loss_of(rows):
            s = vals[rows] + res.score(res.queries(hid[rows], pos), ids[rows])
            logp = torch.log_softmax(s, -1)
            m = present[rows]
            ce = nn.functional.nll_loss(logp[m], idx[rows][m]) if bool(m.any()) else s.sum() * 0
            t = torch.softmax(teacher[rows], -1)
            kl = (t * (torch.log(t.clamp_min(1e-12)) - logp)).sum(-1).mean()
            return 0.7 * ce + 0.3 * kl

        losses = train_steps(res.parameters(), loss_of, head_batches(train_idx, ctx.cfg.aux_steps, ctx.cfg.seed + 7))
        res.eval()
        ev = eval_rows(held, train_idx)
        with torch.no_grad():
            k8 = slice(0, 8)
            i8, p8 = label_index(ids[ev][..., k8], ex.labels[ev][:, pos])
            r8 = res.score(res.queries(hid[ev], pos), ids[ev][..., k8])
            meta.update(drafter_top1_acc=restricted_accuracy(vals[ev][..., k8], i8, p8),
                        with_residual_top1_acc=restricted_accuracy(vals[ev][..., k8] + r8, i8, p8))
    meta.update(head_meta(losses, held, res))
    return {"files": {FUSED_FILE: module_bytes(res, res.config())}, "meta": meta}


JUMP_FITTER = Fitter("jump_head", (JUMP_FILE,), fit_jump_head)
FUSED_FITTER = Fitter("fused_residual", (FUSED_FILE,), fit_fused_residual)

INFO_JUMP = MethodInfo(
    index=4, id="jump_mobs", label="Jump-MOBS", mechanism="jump-head anchors at every other slot + gap fill",
    complexity="one jump-head query + O(B·K) scores per block", proposer=JumpMOBSProposer, options=JumpOptions,
    fitters=(PAIR_FITTER, JUMP_FITTER),
    stages=("draft block, keep top-K per position", "jump head scores top-K at slots 1, 3, ...",
            "fix those anchors: v + 0.5 x jump", "gap fill the rest with pair scores, verify"),
    why_inactive="its jump-head anchors and gap filling kept the drafter's argmax at every position.")

INFO_FUSED = MethodInfo(
    index=5, id="fused_jump", label="Fused jump",
    mechanism="fused residual on drafter rows at sparse anchors + gap fill",
    complexity="O(B·K) residual and pair scores per block", proposer=FusedJumpProposer, options=FusedOptions,
    fitters=(PAIR_FITTER, FUSED_FITTER),
    stages=("draft block, keep top-K per position", "residual query from the drafter's hidden rows at 1, 3, ...",
            "fix those anchors: v + residual (top-K only)", "gap fill the rest with pair scores, verify"),
    why_inactive="its fused-residual anchors and gap filling kept the drafter's argmax at every position.")
