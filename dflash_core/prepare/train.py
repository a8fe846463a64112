"""Teacher trajectories and drafter training (DFlash recipe, sized for 2 CPU cores).

Teacher data are the target's own greedy continuations of the train seeds; the drafter learns to
predict the next B tokens of that trajectory from the target's hidden states of the context and the
anchor token. Loss: cross-entropy with position decay w_k = exp(-(k-1)/gamma) (DFlash paper).
Many anchors per sequence are trained in one forward with a block mask: each block sees the context
rows strictly before its anchor and its own B+1 rows, exactly what it sees at inference.
"""

from __future__ import annotations

import copy
import logging
import math
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
from torch.nn import functional as F

from ..runtime.drafter import DFlashDrafter, DrafterConfig, init_drafter
from ..runtime.target import TargetRuntime

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
    val_fraction: float = 0.1  # whole trajectories held out (seeded) to stop on and to report
    eval_every: int = 50  # steps between held-out evaluations
    patience: int = 4  # evaluations without a better held-out accuracy before stopping early
    val_sequences: int = 128  # held-out trajectories evaluated (a fixed seeded subset when there are more)


TEACHER_BATCH = 128  # prompts per batched teacher forward: fills 2 cores on the mini target, small in memory


def length_buckets(seqs: Sequence[Sequence[int]], size: int) -> list[list[int]]:
    """Indices of `seqs` grouped by length (then chunked to `size`): batches that need no padding."""
    by_len: dict[int, list[int]] = {}
    for i, s in enumerate(seqs):
        by_len.setdefault(len(s), []).append(i)
    return [idx[j:j + size] for _, idx in sorted(by_len.items()) for j in range(0, len(idx), size)]


def trajectories(rt: TargetRuntime, prompts: Sequence[Sequence[int]], new_tokens: int, progress: bool = False,
                 batch: int = TEACHER_BATCH):
    """prompt + the target's greedy continuation (exactly `new_tokens`, no EOS stop), for every prompt.

    Prompts of equal length run as one cached batch (`target.batch_greedy`, no padding): identical ids to
    one-at-a-time greedy in float64; in float32 a near-tie can flip, which teacher data tolerates (it is
    training data, not a decode under test). `batch=1` is the one-at-a-time reference.
    """
    from ..progress import logged
    from ..runtime.target import batch_greedy

    prompts = [list(p) for p in prompts]
    out: list[list[int] | None] = [None] * len(prompts)
    buckets = length_buckets(prompts, batch)
    for idx in logged(buckets, "teacher batches", len(buckets), log, bar=progress):
        for i, cont in zip(idx, batch_greedy(rt, [prompts[i] for i in idx], new_tokens)):
            out[i] = prompts[i] + cont
    return out


def trajectory_taps(rt: TargetRuntime, seq: Sequence[int], taps: Sequence[int]) -> torch.Tensor:
    """Hidden-state taps of every row of `seq` from one forward (same rows the loop feeds the drafter)."""
    sess = rt.session(recording=False)
    out = sess.prefill(list(seq), taps=taps)
    return out.hidden.detach().cpu()


def trajectories_taps(rt: TargetRuntime, seqs: Sequence[Sequence[int]], taps: Sequence[int],
                      batch: int = TEACHER_BATCH, progress: bool = False) -> list[torch.Tensor]:
    """`trajectory_taps` of every sequence, equal-length sequences batched into one forward."""
    from ..progress import logged
    from ..runtime.target import batch_taps

    out: list[torch.Tensor | None] = [None] * len(seqs)
    buckets = length_buckets(seqs, batch)
    for idx in logged(buckets, "target taps", len(buckets), log, bar=progress):
        for i, h in zip(idx, batch_taps(rt, [seqs[i] for i in idx], taps)):
            out[i] = h
    return out


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


def split_trajectories(n: int, seed: int, fraction: float) -> tuple[list[int], list[int]]:
    """(train, held-out) trajectory indices: a seeded permutation, ~`fraction` held out (at least one, never
    all, none when n < 2 or fraction is 0). Whole trajectories: neighbouring anchors share their context."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    k = min(max(1, round(n * fraction)), n - 1) if n >= 2 and fraction > 0 else 0
    return sorted(order[k:]), sorted(order[:k])


@torch.no_grad()
def eval_accuracy(drafter: DFlashDrafter, embed, head, seqs, feats, idx: list[int], anchors: int, seed: int,
                  batch: int) -> tuple[list[float], float]:
    """Teacher-forced per-position accuracy (and loss) of the drafter on trajectories `idx`, at fixed seeded
    anchors (the same anchors every call, so successive evaluations compare like with like)."""
    cfg = drafter.cfg
    gen = torch.Generator().manual_seed(seed)
    was = drafter.training
    drafter.eval()
    hits = torch.zeros(cfg.block_size, dtype=torch.float64)
    loss_sum, n = 0.0, 0
    for j in range(0, len(idx), batch):
        part = idx[j:j + batch]
        tok, ft, anc = _batch(seqs, feats, part, cfg, anchors, gen)
        with torch.autocast("cpu", enabled=False):
            loss, acc = block_loss(drafter, embed, head, tok, ft, anc, 4.0)
        hits += acc.double() * len(part)
        loss_sum += float(loss) * len(part)
        n += len(part)
    drafter.train(was)
    return (hits / max(n, 1)).tolist(), loss_sum / max(n, 1)


def train_drafter(rt: TargetRuntime, seqs: list[list[int]], dcfg: DrafterConfig, tcfg: TrainConfig,
                  progress: bool = False) -> tuple[DFlashDrafter, dict]:
    """Train a drafter on teacher trajectories; returns it (eval mode) and metrics for the manifest.

    Refuses trajectories that share an n-gram with a held-out prompt (the one guard, `heldout`).
    """
    from ..progress import Progress
    from .heldout import check_sequences

    check_sequences(rt, seqs, "drafter training")

    t0 = time.perf_counter()
    embed = rt.model.get_input_embeddings()
    head = rt.model.get_output_embeddings()
    seqs = [s for s in seqs if len(s) > dcfg.block_size + 2]
    feats = trajectories_taps(rt, seqs, dcfg.taps, progress=progress)
    train_ids, val_ids = split_trajectories(len(seqs), tcfg.seed, tcfg.val_fraction)
    if len(val_ids) > tcfg.val_sequences:
        val_ids = sorted(random.Random(tcfg.seed + 2).sample(val_ids, tcfg.val_sequences))
    drafter = init_drafter(dcfg, tcfg.seed).to(embed.weight.dtype)  # train in the target's dtype
    for p in list(embed.parameters()) + list(head.parameters()):
        p.requires_grad_(False)
    opt = torch.optim.AdamW(drafter.parameters(), lr=tcfg.lr, weight_decay=tcfg.weight_decay)
    gen = torch.Generator().manual_seed(tcfg.seed + 1)
    losses, accs, curve = [], [], []
    best: dict = {"score": -1.0, "step": 0, "state": None, "acc": None, "loss": None}
    since_best = 0
    drafter.train()
    bar = Progress("train drafter", tcfg.steps, log, bar=progress)

    def evaluate(step: int) -> None:
        nonlocal since_best
        acc, vloss = eval_accuracy(drafter, embed, head, seqs, feats, val_ids, tcfg.anchors_per_sequence,
                                   tcfg.seed + 3, tcfg.batch_sequences)
        score = sum(acc) / len(acc)
        curve.append({"step": step, "heldout_mean_accuracy": score, "heldout_loss": vloss})
        log.info("step %d: held-out accuracy per position %s (mean %.3f), loss %.3f", step,
                 " ".join(f"{a:.2f}" for a in acc), score, vloss)
        if score > best["score"]:
            best.update(score=score, step=step, state=copy.deepcopy(drafter.state_dict()), acc=acc, loss=vloss)
            since_best = 0
        else:
            since_best += 1

    for step in range(tcfg.steps):
        lr = tcfg.lr * min(1.0, (step + 1) / tcfg.warmup) * 0.5 * (1 + math.cos(math.pi * step / tcfg.steps))
        for g in opt.param_groups:
            g["lr"] = lr
        idx = [train_ids[i] for i in
               torch.randint(len(train_ids), (min(tcfg.batch_sequences, len(train_ids)),), generator=gen).tolist()]
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
        if val_ids and ((step + 1) % tcfg.eval_every == 0 or step + 1 == tcfg.steps):
            evaluate(step + 1)
            if since_best >= tcfg.patience:
                log.info("held-out accuracy did not improve for %d evaluations: stopping at step %d (best %d)",
                         since_best, step + 1, best["step"])
                break
    bar.close()
    if best["state"] is not None:
        drafter.load_state_dict(best["state"])  # the best held-out state, not the last one
    drafter.eval()
    tail = max(1, min(50, len(losses)))
    # the train split evaluated exactly like the held-out one (same anchors rule, same count): the gap is overfit
    train_eval = sorted(random.Random(tcfg.seed + 4).sample(train_ids, min(len(train_ids), max(len(val_ids), 1))))
    train_acc, train_loss = eval_accuracy(drafter, embed, head, seqs, feats, train_eval, tcfg.anchors_per_sequence,
                                          tcfg.seed + 3, tcfg.batch_sequences)
    metrics = {
        "train_config": asdict(tcfg),
        "sequences": len(seqs),
        "train_sequences": len(train_ids),
        "heldout_sequences": len(val_ids),
        "final_loss": sum(losses[-tail:]) / tail,
        "first_loss": losses[0] if losses else None,
        "position_accuracy": [sum(a[k] for a in accs[-tail:]) / tail for k in range(dcfg.block_size)],
        "train_position_accuracy": train_acc,
        "train_eval_loss": train_loss,
        "heldout_position_accuracy": best["acc"],
        "heldout_loss": best["loss"],
        "best_step": best["step"] if best["state"] is not None else len(losses),
        "steps_run": len(losses),
        "heldout_curve": curve,
        "seconds": time.perf_counter() - t0,
    }
    return drafter, metrics
