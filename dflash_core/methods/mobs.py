"""Anchored selectors over the drafter's top-K: 03 mobs, 04 jump_mobs, 05 fused_jump, 07 bmobs.

All four fix a few positions first ("anchors") and fill the rest with the learned pair selector
(`pairwise.PairScorer`: pair(p→c) from low-rank tables gated by the context vector). Candidates id[i, j]
and values v[i, j] are the drafter's top-K per position (K=8, `common.topk` tie rule); every argmax takes
the first maximum, i.e. the better-ranked candidate. prev is the anchor token of the block (the last
committed token), the true left neighbour of position 0.

03 mobs, middle-out bidirectional selection, O(B·K):
  * anchor a: B//2 for odd B. For even B the two centres are (B/2 - 1, B/2); the choice is the parity of
    `context_fingerprint(prefix)` (a SplitMix64 hash of the last 4 committed token ids): even -> left
    centre, odd -> right centre. Token ids, not float features, so it is the same on every device/dtype.
  * anchor token: v[a] + left term + right term, where the left term is pair(prev → c) when a = 0 (prev
    is then the real neighbour) and otherwise pair(top1[a-1] → c), and the right term is pair(c → top1[a+1])
    when a + 1 < B (top1 = the drafter's argmax of that neighbour). The seed scored the anchor against
    prev even when prev was not adjacent; here it is scored for consistency with the drafter's own
    guesses of both neighbours.
  * expand outward, dist = 1, 2, ...: left L = a - dist first, v[L] + pair(id[L] → chosen[L+1]) (+ pair(prev
    → id[0]) when L = 0); then right R = a + dist, v[R] + pair(chosen[R-1] → id[R]). Every adjacent link
    of the block and the prev link are scored exactly once.

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

07 bmobs: the Boltzmann middle anchor. Among the centres, the one with the smaller top1-top2 margin
  (ties: the left centre); its token by the deterministic Gumbel rule of 06 (`boltzmann.boltzmann_pick`)
  with T = 0.35 and its own salt; then the rest is filled outward from the anchor in MOBS order. The seed
  filled with Jacobi waves, which with anchor 2 of B=4 never scored the link between positions 0 and 1;
  the outward order scores every link.

Guidance work = all pair scores + jump/residual scores + Boltzmann scores evaluated for the whole block.
"""

from __future__ import annotations

import torch
from torch import nn

from ..artifacts import torch_bytes
from ..prepare import register_fitter
from . import MethodInfo, register
from .boltzmann import SALT_BMOBS, boltzmann_pick, row_margin
from .common import context_fingerprint, gap_fill, topk
from .pairwise import (
    PAIR_FILE,
    ContextProposer,
    PairScorer,
    batches,
    check_number,
    first_argmax,
    fit_examples,
    holdout_mask,
    label_index,
    load_blob,
    require_files,
    restricted_accuracy,
)

JUMP_FILE = "jump_head.pt"
FUSED_FILE = "fused_residual.pt"


# --- anchor rules and fills -------------------------------------------------------------------------

def centres(block: int) -> tuple[int, ...]:
    """The middle position(s) of a block: (B//2,) for odd B, (B/2 - 1, B/2) for even B."""
    return (block // 2,) if block % 2 else (block // 2 - 1, block // 2)


def mobs_anchor(block: int, fingerprint: int) -> int:
    """MOBS anchor: the centre; for even B the parity of the context fingerprint picks left (0) or right (1)."""
    c = centres(block)
    return c[fingerprint & 1] if len(c) == 2 else c[0]


def jump_positions(block: int) -> tuple[int, ...]:
    """Sparse anchor positions of 04/05: 1, 3, 5, ... (every other slot; the seed's offsets 2, 4 at B=4)."""
    return tuple(range(1, block, 2))


def _add(a: list[float], b: list[float]) -> list[float]:
    return [x + y for x, y in zip(a, b)]


def anchor_scores(anchor: int, ids, vals, scorer: PairScorer, prev: int) -> list[float]:
    """MOBS anchor scores: draft value + consistency with the left (prev at 0) and right top-1 neighbours."""
    s = list(vals[anchor])
    left = prev if anchor == 0 else ids[anchor - 1][0]
    s = _add(s, scorer(left, ids[anchor]))
    if anchor + 1 < len(ids):
        s = _add(s, scorer.into(ids[anchor], ids[anchor + 1][0]))
    return s


def expand_outward(chosen: list, anchor: int, ids, vals, scorer: PairScorer, prev: int) -> list[int]:
    """Fill every slot outward from a chosen anchor (left before right at each distance)."""
    chosen = list(chosen)
    B = len(ids)
    for dist in range(1, B):
        L, R = anchor - dist, anchor + dist
        if L >= 0:
            s = _add(vals[L], scorer.into(ids[L], chosen[L + 1]))
            if L == 0:
                s = _add(s, scorer(prev, ids[0]))
            chosen[L] = ids[L][first_argmax(s)]
        if R < B:
            s = _add(vals[R], scorer(chosen[R - 1], ids[R]))
            chosen[R] = ids[R][first_argmax(s)]
    return chosen


def mobs_select(ids, vals, scorer: PairScorer, prev: int, fingerprint: int) -> tuple[list[int], int]:
    B = len(ids)
    a = mobs_anchor(B, fingerprint)
    chosen: list = [None] * B
    chosen[a] = ids[a][first_argmax(anchor_scores(a, ids, vals, scorer, prev))]
    return expand_outward(chosen, a, ids, vals, scorer, prev), a


# --- 03 mobs ----------------------------------------------------------------------------------------

class MOBSProposer(ContextProposer):
    def __init__(self, rt, prepared, *, top_k: int = 8):
        super().__init__(rt, prepared)
        self.top_k = check_number("top_k", top_k, lo=1, integer=True)

    def select(self, logits, hidden, prefix, k):
        ids, vals = topk(logits, self.top_k)
        prev = int(prefix[-1])
        scorer = self.block_scorer(ids, prev)
        chosen, a = mobs_select(ids, vals, scorer, prev, context_fingerprint(prefix))
        return chosen, scorer.count, {"pair_scores": scorer.count, "mobs_anchor_sum": a}


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


def _load_module(prepared, name: str, cls):
    key = name + "#module"
    if key not in prepared.files:
        blob = load_blob(prepared, name)
        mod = cls(**blob["config"])
        mod.load_state_dict(blob["state_dict"])
        prepared.files[key] = mod.eval()
    return prepared.files[key]


class JumpMOBSProposer(ContextProposer):
    def __init__(self, rt, prepared, *, top_k: int = 8, jump_weight: float = 0.5):
        super().__init__(rt, prepared)
        require_files(prepared, (PAIR_FILE, JUMP_FILE))
        self.top_k = check_number("top_k", top_k, lo=1, integer=True)
        self.jump_weight = check_number("jump_weight", jump_weight)
        self.jump = _load_module(prepared, JUMP_FILE, JumpHead)

    def select(self, logits, hidden, prefix, k):
        ids, vals = topk(logits, self.top_k)
        prev = int(prefix[-1])
        ctx = self.context()
        scorer = self.block_scorer(ids, prev, ctx)
        pos = jump_positions(len(ids))
        if not pos:
            chosen, _ = mobs_select(ids, vals, scorer, prev, context_fingerprint(prefix))
            return chosen, scorer.count, {"pair_scores": scorer.count, "mobs_fallback": 1}
        with torch.inference_mode():
            q = self.jump.queries(ctx[None], torch.tensor(pos))
            jl = self.jump.score(q, torch.tensor([[ids[p] for p in pos]]))[0].tolist()
        chosen: list = [None] * len(ids)
        jump_scores = 0
        for p, row in zip(pos, jl):
            s = [v + self.jump_weight * j for v, j in zip(vals[p], row)]
            chosen[p] = ids[p][first_argmax(s)]
            jump_scores += len(row)
        chosen, _ = gap_fill(chosen, ids, vals, scorer, prev)
        return chosen, scorer.count + jump_scores, {"pair_scores": scorer.count, "jump_scores": jump_scores,
                                                    "jump_anchors": len(pos)}


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


class FusedJumpProposer(ContextProposer):
    def __init__(self, rt, prepared, *, top_k: int = 8, fused_weight: float = 1.0, min_margin: float = 0.0):
        super().__init__(rt, prepared)
        require_files(prepared, (PAIR_FILE, FUSED_FILE))
        self.top_k = check_number("top_k", top_k, lo=1, integer=True)
        self.fused_weight = check_number("fused_weight", fused_weight)
        self.min_margin = check_number("min_margin", min_margin, lo=0.0)
        self.fused = _load_module(prepared, FUSED_FILE, FusedResidual)

    def select(self, logits, hidden, prefix, k):
        ids, vals = topk(logits, self.top_k)
        prev = int(prefix[-1])
        scorer = self.block_scorer(ids, prev)
        pos = jump_positions(len(ids))
        chosen: list = [None] * len(ids)
        residual_scores = skipped = 0
        if pos:
            with torch.inference_mode():
                rows = hidden[list(pos)].float().cpu()
                q = self.fused.queries(rows[None], torch.tensor(pos))
                res = self.fused.score(q, torch.tensor([[ids[p] for p in pos]]))[0].tolist()
            for p, row in zip(pos, res):
                s = [v + self.fused_weight * r for v, r in zip(vals[p], row)]
                residual_scores += len(row)
                if self.min_margin > 0 and len(s) >= 2:
                    top = sorted(s, reverse=True)
                    if top[0] - top[1] < self.min_margin:
                        skipped += 1
                        continue
                chosen[p] = ids[p][first_argmax(s)]
        meta = {"residual_scores": residual_scores, "fused_anchors_skipped": skipped}
        if all(c is None for c in chosen):
            chosen, _ = mobs_select(ids, vals, scorer, prev, context_fingerprint(prefix))
            meta["mobs_fallback"] = 1
        else:
            chosen, _ = gap_fill(chosen, ids, vals, scorer, prev)
        meta["pair_scores"] = scorer.count
        return chosen, scorer.count + residual_scores, meta


# --- 07 bmobs ---------------------------------------------------------------------------------------

def bmobs_anchor(vals) -> int:
    """The centre with the smaller top1-top2 margin (ties: the left centre)."""
    cs = centres(len(vals))
    return min(cs, key=lambda c: (row_margin(vals[c]), c))


class BMOBSProposer(ContextProposer):
    def __init__(self, rt, prepared, *, top_k: int = 8, temperature: float = 0.35):
        super().__init__(rt, prepared)
        self.top_k = check_number("top_k", top_k, lo=1, integer=True)
        self.temperature = check_number("temperature", temperature, lo=0.0)

    def select(self, logits, hidden, prefix, k):
        ids, vals = topk(logits, self.top_k)
        prev = int(prefix[-1])
        scorer = self.block_scorer(ids, prev)
        a = bmobs_anchor(vals)
        seed = context_fingerprint(prefix) ^ SALT_BMOBS
        j, nb = boltzmann_pick(ids[a], vals[a], self.temperature, seed, a)
        chosen: list = [None] * len(ids)
        chosen[a] = ids[a][j]
        chosen = expand_outward(chosen, a, ids, vals, scorer, prev)
        return chosen, scorer.count + nb, {"pair_scores": scorer.count, "boltzmann_scores": nb,
                                           "bmobs_anchor_sum": a, "boltzmann_non_argmax": int(j != 0)}


# --- fitters ----------------------------------------------------------------------------------------

def _force_label(cand: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Candidates with the label put in the last slot where it is absent (every example gets a target)."""
    cand = cand.clone()
    absent = ~(cand == labels[..., None]).any(-1)
    cand[..., -1] = torch.where(absent, labels, cand[..., -1])
    return cand


@register_fitter("jump_head")
def fit_jump_head(ctx) -> dict:
    """CE of the jump logits over the drafter's top-K candidates (+ the label) at the anchor positions."""
    ex = fit_examples(ctx)
    B = ctx.drafter.cfg.block_size
    pos = torch.tensor(jump_positions(B), dtype=torch.long)
    torch.manual_seed(ctx.cfg.seed + 4)
    head = JumpHead(ctx.rt.vocab_size, ctx.drafter.cfg.hidden_size, B)
    held = holdout_mask(ex)
    train_idx = torch.nonzero(~held).flatten()
    losses: list[float] = []
    meta: dict = {"positions": pos.tolist(), "examples": int(ex.prev.shape[0]), "held_out": int(held.sum()),
                  "steps": ctx.cfg.aux_steps}
    if len(pos):
        labels = ex.labels[:, pos]
        cand = _force_label(ex.topk_ids[:, pos], labels)
        tgt, _ = label_index(cand, labels)
        opt = torch.optim.AdamW(head.parameters(), lr=3e-3, weight_decay=0.0)
        for rows in batches(train_idx, ctx.cfg.aux_steps, 64, ctx.cfg.seed + 5):
            s = head.score(head.queries(ex.context[rows], pos), cand[rows])
            loss = nn.functional.cross_entropy(s.flatten(0, 1), tgt[rows].flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        head.eval()
        ev = torch.nonzero(held).flatten() if bool(held.any()) else train_idx
        with torch.no_grad():
            ids = ex.topk_ids[ev][:, pos][..., :8]
            v = ex.topk_vals[ev][:, pos][..., :8]
            idx, present = label_index(ids, labels[ev])
            j = head.score(head.queries(ex.context[ev], pos), ids)
            meta.update(drafter_top1_acc=restricted_accuracy(v, idx, present),
                        with_jump_top1_acc=restricted_accuracy(v + 0.5 * j, idx, present),
                        jump_alone_top1_acc=restricted_accuracy(j, idx, present))
    meta.update(loss_first=losses[0] if losses else None, loss_final=losses[-1] if losses else None,
                eval="held-out trajectories" if bool(held.any()) else "train",
                parameters=int(sum(p.numel() for p in head.parameters())))
    sd = {k: v.detach().float().contiguous() for k, v in head.state_dict().items()}
    return {"files": {JUMP_FILE: torch_bytes({"config": head.config(), "state_dict": sd})}, "meta": meta}


fit_jump_head.files = (JUMP_FILE,)


@register_fitter("fused_residual")
def fit_fused_residual(ctx) -> dict:
    """0.7·CE(label) + 0.3·KL(target ‖ student) over the top-K, student = drafter logit + residual.

    The seed's teacher was softmax(drafter + 0.5·jump); here the teacher is the verifier itself (the
    target's logits of the same candidates), which is what acceptance is measured against.
    """
    ex = fit_examples(ctx)
    B = ctx.drafter.cfg.block_size
    pos = torch.tensor(jump_positions(B), dtype=torch.long)
    torch.manual_seed(ctx.cfg.seed + 6)
    res = FusedResidual(ctx.rt.vocab_size, ctx.drafter.cfg.hidden_size, B)
    held = holdout_mask(ex)
    train_idx = torch.nonzero(~held).flatten()
    losses: list[float] = []
    meta: dict = {"positions": pos.tolist(), "examples": int(ex.prev.shape[0]), "held_out": int(held.sum()),
                  "steps": ctx.cfg.aux_steps, "teacher": "target logits of the top-K candidates"}
    if len(pos):
        ids, vals = ex.topk_ids[:, pos], ex.topk_vals[:, pos]
        hid, teacher = ex.hidden[:, pos], ex.target_logits[:, pos]
        idx, present = label_index(ids, ex.labels[:, pos])
        opt = torch.optim.AdamW(res.parameters(), lr=3e-3, weight_decay=0.0)

        def student(rows):
            return vals[rows] + res.score(res.queries(hid[rows], pos), ids[rows])

        for rows in batches(train_idx, ctx.cfg.aux_steps, 64, ctx.cfg.seed + 7):
            s = student(rows)
            logp = torch.log_softmax(s, -1)
            m = present[rows]
            ce = nn.functional.nll_loss(logp[m], idx[rows][m]) if bool(m.any()) else s.sum() * 0
            t = torch.softmax(teacher[rows], -1)
            kl = (t * (torch.log(t.clamp_min(1e-12)) - logp)).sum(-1).mean()
            loss = 0.7 * ce + 0.3 * kl
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        res.eval()
        ev = torch.nonzero(held).flatten() if bool(held.any()) else train_idx
        with torch.no_grad():
            k8 = slice(0, 8)
            i8, p8 = label_index(ids[ev][..., k8], ex.labels[ev][:, pos])
            r8 = res.score(res.queries(hid[ev], pos), ids[ev][..., k8])
            meta.update(drafter_top1_acc=restricted_accuracy(vals[ev][..., k8], i8, p8),
                        with_residual_top1_acc=restricted_accuracy(vals[ev][..., k8] + r8, i8, p8))
    meta.update(loss_first=losses[0] if losses else None, loss_final=losses[-1] if losses else None,
                eval="held-out trajectories" if bool(held.any()) else "train",
                parameters=int(sum(p.numel() for p in res.parameters())))
    sd = {k: v.detach().float().contiguous() for k, v in res.state_dict().items()}
    return {"files": {FUSED_FILE: torch_bytes({"config": res.config(), "state_dict": sd})}, "meta": meta}


fit_fused_residual.files = (FUSED_FILE,)


register(MethodInfo(
    index=3, id="mobs", label="MOBS", mechanism="middle-out bidirectional selection with pair scores",
    complexity="O(B·K) pair scores per block", build=MOBSProposer, needs=(PAIR_FILE,),
    stages=("draft block, keep top-K per position", "pick the middle anchor (fingerprint parity for even B)",
            "anchor token: draft value + consistency with both neighbours", "expand outward left/right, verify")))

register(MethodInfo(
    index=4, id="jump_mobs", label="Jump-MOBS", mechanism="jump-head anchors at every other slot + gap fill",
    complexity="one jump-head query + O(B·K) scores per block", build=JumpMOBSProposer,
    needs=(PAIR_FILE, JUMP_FILE),
    stages=("draft block, keep top-K per position", "jump head scores top-K at slots 1, 3, ...",
            "fix those anchors: v + 0.5 x jump", "gap fill the rest with pair scores, verify")))

register(MethodInfo(
    index=5, id="fused_jump", label="Fused jump",
    mechanism="fused residual on drafter rows at sparse anchors + gap fill",
    complexity="O(B·K) residual and pair scores per block", build=FusedJumpProposer,
    needs=(PAIR_FILE, FUSED_FILE),
    stages=("draft block, keep top-K per position", "residual query from the drafter's hidden rows at 1, 3, ...",
            "fix those anchors: v + residual (top-K only)", "gap fill the rest with pair scores, verify")))

register(MethodInfo(
    index=7, id="bmobs", label="Boltzmann MOBS", mechanism="Boltzmann middle anchor + middle-out fill",
    complexity="O(K) hashed + O(B·K) pair scores per block", build=BMOBSProposer, needs=(PAIR_FILE,),
    stages=("draft block, keep top-K per position", "anchor: the less confident centre",
            "anchor token by hashed Gumbel at T=0.35", "fill outward with pair scores, verify")))
