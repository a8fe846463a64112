"""Teacher trajectories and drafter training (DFlash recipe, sized for 2 CPU cores).

Teacher data are the target's own greedy continuations of the train seeds; the drafter learns to
predict the next B tokens of that trajectory from the target's hidden states of the context and the
anchor token. Loss: cross-entropy with position decay w_k = exp(-(k-1)/gamma) (DFlash paper).
Many anchors per sequence are trained in one forward with a block mask: each block sees the context
rows strictly before its anchor and its own B+1 rows, exactly what it sees at inference.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
from torch.nn import functional as F

from .decode import greedy
from .drafter import DFlashDrafter, DrafterConfig, init_drafter
from .target import TargetRuntime

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 600
    batch_sequences: int = 16
    anchors_per_sequence: int = 8
    lr: float = 3e-3
    weight_decay: float = 0.01
    gamma: float = 4.0
    seed: int = 7
    warmup: int = 30


def trajectories(rt: TargetRuntime, prompts: Sequence[Sequence[int]], new_tokens: int, progress: bool = False):
    """prompt + the target's greedy continuation, for every prompt (cached greedy, exact)."""
    from .progress import logged

    out = []
    for p in logged(prompts, "teacher trajectories", len(prompts), log, bar=progress):
        ids, _ = greedy(rt, list(p), new_tokens)
        out.append(list(p) + ids)
    return out


def trajectory_taps(rt: TargetRuntime, seq: Sequence[int], taps: Sequence[int]) -> torch.Tensor:
    """Hidden-state taps of every row of `seq` from one forward (same rows the loop feeds the drafter)."""
    sess = rt.session(recording=False)
    out = sess.prefill(list(seq), taps=taps)
    return out.hidden.detach().cpu()


def _batch(seqs, feats, idx, cfg: DrafterConfig, anchors: int, gen: torch.Generator):
    B = cfg.block_size
    n = len(idx)
    T = max(len(seqs[i]) for i in idx)
    Fdim = feats[idx[0]].shape[1]
    tok = torch.zeros(n, T, dtype=torch.long)
    ft = torch.zeros(n, T, Fdim, dtype=feats[idx[0]].dtype)
    anc = torch.zeros(n, anchors, dtype=torch.long)
    for r, i in enumerate(idx):
        L = len(seqs[i])
        tok[r, :L] = torch.tensor(seqs[i])
        ft[r, :L] = feats[i]
        hi = L - B - 1  # anchor a needs labels a+1..a+B < L
        anc[r] = 1 + (torch.rand(anchors, generator=gen) * hi).long().clamp(max=hi - 1)
    return tok, ft, anc


def block_loss(drafter: DFlashDrafter, embed, head, tok, ft, anc, gamma: float):
    """Position-decayed CE of all anchors' blocks, computed in one masked forward per batch."""
    cfg = drafter.cfg
    B = cfg.block_size
    n, T = tok.shape
    M = anc.shape[1]
    fused = drafter.fuse(ft)
    ctx_pos = torch.arange(T).expand(n, T)
    ctx = [layer.context_kv(fused, ctx_pos) for layer in drafter.layers]
    offs = torch.arange(B + 1)
    pos = (anc.unsqueeze(-1) + offs).reshape(n, M * (B + 1))
    anchor_tok = tok.gather(1, anc)  # [n, M]
    x = torch.cat([drafter.block_input(anchor_tok[:, m], embed) for m in range(M)], dim=1)
    # mask [n, 1, M*(B+1), T + M*(B+1)]: context rows strictly before the anchor, plus the own block
    q_blk = torch.arange(M).repeat_interleave(B + 1)
    ctx_ok = torch.arange(T).view(1, 1, T) < anc.repeat_interleave(B + 1, dim=1).unsqueeze(-1)
    blk_ok = (q_blk.view(-1, 1) == q_blk.view(1, -1)).expand(n, -1, -1)
    mask = torch.cat([ctx_ok, blk_ok], dim=-1).unsqueeze(1)
    h = x
    for layer, (ck, cv) in zip(drafter.layers, ctx):
        h = layer(h, pos, ck, cv, mask)
    h = drafter.final_norm(h).view(n, M, B + 1, -1)[:, :, 1:]
    logits = head(h)
    labels = tok.gather(1, (anc.unsqueeze(-1) + 1 + torch.arange(B)).view(n, -1)).view(n, M, B)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none").view(n, M, B)
    w = torch.exp(-torch.arange(B, dtype=torch.float32) / gamma)
    loss = (ce * w).sum(-1).mean() / w.sum()
    acc = (logits.argmax(-1) == labels).float().mean(dim=(0, 1))
    return loss, acc


def train_drafter(rt: TargetRuntime, seqs: list[list[int]], dcfg: DrafterConfig, tcfg: TrainConfig,
                  progress: bool = False) -> tuple[DFlashDrafter, dict]:
    """Train a drafter on teacher trajectories; returns it (eval mode) and metrics for the manifest.

    Refuses trajectories that share an n-gram with a held-out prompt (the one guard, `heldout`).
    """
    from .heldout import check_sequences
    from .progress import Progress, logged

    check_sequences(rt, seqs, "drafter training")

    t0 = time.perf_counter()
    embed = rt.model.get_input_embeddings()
    head = rt.model.get_output_embeddings()
    seqs = [s for s in seqs if len(s) > dcfg.block_size + 2]
    feats = [trajectory_taps(rt, s, dcfg.taps) for s in logged(seqs, "target taps", len(seqs), log, bar=progress)]
    drafter = init_drafter(dcfg, tcfg.seed).to(embed.weight.dtype)  # train in the target's dtype
    for p in list(embed.parameters()) + list(head.parameters()):
        p.requires_grad_(False)
    opt = torch.optim.AdamW(drafter.parameters(), lr=tcfg.lr, weight_decay=tcfg.weight_decay)
    gen = torch.Generator().manual_seed(tcfg.seed + 1)
    losses, accs = [], []
    drafter.train()
    bar = Progress("train drafter", tcfg.steps, log, bar=progress)
    for step in range(tcfg.steps):
        lr = tcfg.lr * min(1.0, (step + 1) / tcfg.warmup) * 0.5 * (1 + math.cos(math.pi * step / tcfg.steps))
        for g in opt.param_groups:
            g["lr"] = lr
        idx = torch.randint(len(seqs), (min(tcfg.batch_sequences, len(seqs)),), generator=gen).tolist()
        tok, ft, anc = _batch(seqs, feats, idx, dcfg, tcfg.anchors_per_sequence, gen)
        with torch.autocast("cpu", enabled=False):
            loss, acc = block_loss(drafter, embed, head, tok, ft, anc, tcfg.gamma)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        accs.append(acc.tolist())
        bar.update(1, f"loss {losses[-1]:.3f}")
    bar.close()
    drafter.eval()
    tail = max(1, min(50, len(losses)))
    metrics = {
        "train_config": asdict(tcfg),
        "sequences": len(seqs),
        "final_loss": sum(losses[-tail:]) / tail,
        "first_loss": losses[0] if losses else None,
        "position_accuracy": [sum(a[k] for a in accs[-tail:]) / tail for k in range(dcfg.block_size)],
        "seconds": time.perf_counter() - t0,
    }
    return drafter, metrics
