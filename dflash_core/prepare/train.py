"""Drafter training (DFlash recipe), sized for 2 CPU cores and for real targets' vocabularies.

Teacher data (`teacher`) are the target's own greedy continuations of the train seeds, with the target's taps
and top-k logits captured while generating them. The drafter learns to predict the next B tokens of a
trajectory from the target's hidden states of the context and the anchor token. Loss: cross-entropy with
position decay w_k = exp(-(k-1)/gamma) (DFlash paper), optionally against a mix of the label and the target's
top-k distribution (distillation). Many anchors per sequence are trained in one forward with a block mask:
each block sees the context rows strictly before its anchor and its own B+1 rows, exactly what it sees at
inference.

What keeps a step cheap at vocab 49k-65k (`studies/drafter_lab/profile_train_step.py`): only the B block rows reach the
head, through `loss.linear_cross_entropy` (chunked, exact, no [rows, vocab] tensor kept for backward), its
matmuls in bfloat16 where the CPU has native bf16 dot products; taps come from the teacher pass.

Under `torchrun` the global batch is drawn identically on every rank and each rank trains on its share of
the rows through DistributedDataParallel, so N ranks follow the same trajectory as one process (up to the
order of the gradient sum). With a work directory, training checkpoints every `checkpoint_every` steps and a
killed run resumes from the last checkpoint to the same result.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import math
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from ..errors import ArtifactError, BadInputError
from ..progress import Progress, logged
from ..runtime.allocator import trim_free_memory
from ..runtime.drafter import DFlashDrafter, DrafterConfig, init_drafter
from ..runtime.precision import train_in_bf16
from ..runtime.target import TargetRuntime, batch_taps
from ..store.artifacts import load_tensor_file, tensor_bytes, write_atomic
from ..store.data import check_sequences
from . import distributed as dist
from .loss import linear_cross_entropy
from .teacher import TEACHER_BATCH, TeacherData, length_buckets, teacher_data  # noqa: F401  (re-exported)

log = logging.getLogger(__name__)

MATMUL_DTYPES = ("auto", "float32", "bfloat16")
ANCHOR_RULES = ("continuation", "all")
CHECKPOINT_FILE = "train-checkpoint.safetensors"
# Where the head dominates a training step (studies.drafter_lab.profile_train_step): at the mini's vocab 2,048 bf16 and
# sampled head rows save nothing (355 vs 365 ms per step) and cost held-out accuracy (0.50 against 0.55 at 600
# steps, docs/real-targets.md); at 49k-65k they make a step 4-5x cheaper.
LARGE_VOCAB = 16384
# The schedule's 'auto' values. The mini target's are the recipe it was tuned with (docs/mini-target.md). At a real
# vocabulary the drafter is data- and step-starved: on SmolLM2-135M (2,392 seeds) held-out accuracy at position 1
# rose 0.31 -> 0.40 from 600 to 3,000 steps with the held-out loss still falling, and the held-out score went up to
# 12 evaluations without a new best on the way (patience 4 stopped it at step 900). The budget caps the time those
# steps take where training is slow (float32 on a CPU without native bf16: ~0.6 s a step at 135M; a 350M drafter
# costs ~2x a step), so prepare stays near its 30 minutes; where it binds, the run depends on the machine's speed
# and the manifest says so (`stopped`, `steps_run`). docs/real-targets.md has the measurements.
MINI_STEPS, MINI_PATIENCE = 600, 4
# Train knobs added after homes and the reference bundle were built: at these defaults they train what was trained
# before them, so they are left out of every recorded config and key (pipeline.LATE_KNOBS' rule for TrainConfig).
# `select` has two: 'auto' (an unresolved config) and 'accuracy' (what 'auto' resolves to below a real vocabulary, and
# what every drafter was selected by before the knob): prepare records the resolved rule, so the mini's recorded
# config (the reference bundle's) is unchanged and a real target's names 'loss'.
LATE_TRAIN_KNOBS = {"feature_weight": (0.0,), "select": ("auto", "accuracy"), "seed_labels": ("auto", "text")}
SEED_LABELS = ("text", "target")  # TrainConfig.seed_labels, besides 'auto'
REAL_VOCAB_SEED_LABELS = "target"  # 'auto' at a real vocabulary: design contract 12 (labels from the target); the
# mini keeps 'text' (its reference bundle's recipe) until a measurement there says otherwise
# The anchor rules: 'all' (from position 1), 'continuation' (from the last prompt token: the anchors a decode drafts
# from, whose labels are all generated), 'seed' (inside the seed text only: an analysis split, never trained on).
ANCHOR_RULES = ("all", "continuation", "seed")
# The held-out figures a kept training state can be chosen on (TrainConfig.select), each as "higher is better".
SELECT_RULES = ("accuracy", "loss", "accepted")
# 'auto' at a real vocabulary: over six paired SmolLM2 runs (seeds 7-10, two data sizes) the state kept by the
# held-out loss accepted +0.014 tokens per block more than the accuracy rule's on a common held-out set, never fewer
# (Wilcoxon p 0.06: not a 95 % claim); the accuracy rule once kept step 600 of 2,000 (docs/real-targets.md).
REAL_VOCAB_SELECT = "loss"
REAL_VOCAB_STEPS, REAL_VOCAB_PATIENCE, REAL_VOCAB_BUDGET = 3000, 20, 15.0


@dataclass(frozen=True)
class TrainConfig:
    steps: int | str = "auto"  # auto: MINI_STEPS below LARGE_VOCAB, REAL_VOCAB_STEPS at a real vocabulary
    batch_sequences: int = 16
    anchors_per_sequence: int = 8
    lr: float = 3e-3
    weight_decay: float = 0.01
    gamma: float = 4.0
    seed: int = 7
    warmup: int = 30
    val_fraction: float = 0.1  # whole trajectories held out (seeded) to stop on and to report
    eval_every: int = 50  # steps between held-out evaluations
    patience: int | str = "auto"  # evaluations without a better held-out accuracy before stopping early; auto:
    # MINI_PATIENCE below LARGE_VOCAB, REAL_VOCAB_PATIENCE at a real vocabulary
    val_sequences: int = 128  # held-out trajectories evaluated (a fixed seeded subset when there are more)
    anchors: str = "all"  # 'continuation': anchors only where the labels are the target's own tokens
    seed_labels: str = "auto"  # 'target': anchors inside the seed text are labelled with the target's own argmax
    # there (the teacher's first forward records it), each label valid only while the seed follows the target's
    # predictions (the forced text's rule), so no human token is a label; 'text': the seed's own tokens; auto =
    # text below LARGE_VOCAB (the mini's recipe, left out of recorded configs: LATE_TRAIN_KNOBS),
    # REAL_VOCAB_SEED_LABELS at a real vocabulary
    distill_top_k: int = 0  # > 0: soft targets from the target's top-k logits (teacher pass), mixed with the label
    distill_weight: float = 0.5  # share of the target's top-k distribution in the soft target
    matmul_dtype: str = "auto"  # training matmuls (head + drafter autocast): auto = bfloat16 at a real vocabulary
    # (>= LARGE_VOCAB) on a CPU with native bf16, else float32
    budget_minutes: float | str | None = "auto"  # stop (best held-out state kept) after this much training time;
    # None: the steps decide; auto: None below LARGE_VOCAB, REAL_VOCAB_BUDGET minutes at a real vocabulary
    checkpoint_every: int = 50  # steps between training checkpoints (with a work directory; 0: none)
    draft_vocab: str | int = "auto"  # the drafter's head over the K most frequent teacher tokens (`draft_vocabulary`):
    # an integer K, 'off', or auto = at a real vocabulary (>= LARGE_VOCAB) the K that covers `draft_coverage`
    draft_coverage: float = 0.99  # share of the training labels the auto draft vocabulary covers
    draft_vocab_min: int = 8192  # the auto K's floor: on 7,776 SmolLM2 labels 99 % train coverage gave K 1,280 and
    # covered only 76 % of the held-out labels (a map fitted to a small sample caps the acceptance)
    draft_vocab_max: int = 16384  # the auto K's ceiling: the head is a draft call's and a training step's biggest
    # matmul, and a target with flat outputs (the random-init 350M) needed K 54,528 of 65,536 for 99 %, which made a
    # 350M draft call's head 31 ms against 5.0 ms at 16,384 (docs/real-targets.md); ids outside it are misses
    feature_weight: float = 0.0  # > 0: also pull each block row's hidden state toward the target's own hidden state
    # at the row that predicts the same token (the last tap, by cosine; EAGLE's feature regression): a dense target
    # per row where the label gives one id. 0: off, and left out of every recorded config (LATE_TRAIN_KNOBS)
    row_sampling: str = "auto"  # importance-sample the block rows that reach the head (`sample_rows`): on, off, or
    # auto = on at a real vocabulary (>= LARGE_VOCAB), where the head dominates a step
    select: str = "auto"  # the held-out figure that picks the kept state and drives `patience`: 'accuracy' (mean
    # over the block's positions), 'loss' (lowest), 'accepted' (mean run of correct drafts from position 1 per block,
    # the teacher-forced image of tokens per target call), or auto = accuracy below LARGE_VOCAB (the mini's recipe),
    # REAL_VOCAB_SELECT at a real vocabulary; auto and accuracy are left out of recorded configs (LATE_TRAIN_KNOBS)


def matmul_autocast(dtype: torch.dtype, device_type: str = "cpu"):
    """bf16 autocast of the drafter's matmuls when training in bf16 (master weights, norms and the optimizer stay
    float32) on `device_type` ('cpu' or 'cuda'); a no-op context otherwise."""
    if dtype == torch.bfloat16:
        return torch.autocast(device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def on_device(dev: torch.device):
    """Factory calls (torch.ones, torch.arange, ...) default to `dev` inside: the loss builds its masks and weights
    where the drafter is. Nothing on the CPU (the code the CPU recipe ran, untouched)."""
    return contextlib.nullcontext() if dev.type == "cpu" else torch.device(dev)


def _to(dev: torch.device, *tensors):
    """The batch's host tensors on the drafter's device (the identity on the CPU)."""
    return tuple(None if t is None else t.to(dev) for t in tensors)


def train_config_dict(tcfg: "TrainConfig") -> dict:
    """`tcfg` as a dict, its LATE_TRAIN_KNOBS left out at their defaults (what configs recorded before them)."""
    d = asdict(tcfg)
    for k, defaults in LATE_TRAIN_KNOBS.items():
        if d[k] in defaults:
            del d[k]
    return d


MAX_DISTILL_TOP_K = 1024  # the teacher keeps k ids and logits per generated token (12 bytes each) in memory


def check_feature_weight(w) -> None:
    if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0.0 <= w <= 100.0:
        raise BadInputError(f"train feature_weight must be a number in 0..100, got {str(w)[:40]!r}")


def check_distill(top_k, weight) -> None:
    """Distillation knobs refused before a teacher pass: a weight outside 0..1 makes negative target probabilities."""
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 0 <= top_k <= MAX_DISTILL_TOP_K:
        raise BadInputError(f"train distill_top_k must be an integer in 0..{MAX_DISTILL_TOP_K}, "
                            f"got {str(top_k)[:40]!r}")
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0.0 <= weight <= 1.0:
        raise BadInputError(f"train distill_weight must be a number in 0..1, got {str(weight)[:40]!r}")


def resolve_matmul_dtype(name: str, vocab: int, device: str = "cpu") -> torch.dtype:
    """'auto': bfloat16 at a real vocabulary where the lab's bf16 rule allows it (runtime/precision.py: native bf16
    only, several times faster there), else float32. 'bfloat16' where bf16 would be emulated is refused."""
    if name == "auto":
        return torch.bfloat16 if vocab >= LARGE_VOCAB and train_in_bf16(device) else torch.float32
    if name == "bfloat16" and not train_in_bf16(device):
        raise BadInputError(f"matmul_dtype 'bfloat16' on {device}, which has no native bf16 (torch would emulate it "
                            "~60x slower): use matmul_dtype 'auto' or 'float32'")
    return getattr(torch, name)


def resolve_schedule(tcfg: TrainConfig, vocab: int) -> TrainConfig:
    """`tcfg` with its 'auto' steps, patience, budget and selection rule resolved for a target vocabulary of `vocab`;
    bad values refused before anything trains."""
    real = vocab >= LARGE_VOCAB
    steps = (REAL_VOCAB_STEPS if real else MINI_STEPS) if tcfg.steps == "auto" else tcfg.steps
    patience = (REAL_VOCAB_PATIENCE if real else MINI_PATIENCE) if tcfg.patience == "auto" else tcfg.patience
    budget = (REAL_VOCAB_BUDGET if real else None) if tcfg.budget_minutes == "auto" else tcfg.budget_minutes
    for name, v in (("steps", steps), ("patience", patience)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise BadInputError(f"train {name} must be 'auto' or an integer >= 1, got {v!r}")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float))
                               or not 0 < budget < float("inf")):
        raise BadInputError(f"train budget_minutes must be 'auto', None or a number of minutes > 0, got {budget!r}")
    return replace(tcfg, steps=steps, patience=patience, budget_minutes=None if budget is None else float(budget),
                   select=resolve_select(tcfg.select, vocab), seed_labels=resolve_seed_labels(tcfg.seed_labels, vocab))


def resolve_row_sampling(value, vocab: int) -> bool:
    """'auto': sample the head rows at a real vocabulary only; 'on'/'off' (or a bool) as given."""
    if value == "auto":
        return vocab >= LARGE_VOCAB
    return value in (True, "on")


DRAFT_VOCAB_ROUND = 256  # K is rounded up to a multiple of this (matmul-friendly), never above the vocabulary


def resolve_draft_vocab(value, vocab: int) -> str | int:
    """'auto' (on at a real vocabulary only), 'off', or an integer K in 1..vocab; anything else is refused."""
    if value == "auto":
        return "auto" if vocab >= LARGE_VOCAB else "off"
    if value in ("off", 0):
        return "off"
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= vocab:
        raise BadInputError(f"draft_vocab must be 'auto', 'off' or an integer in 1..{vocab}, got {value!r}")
    return value


def label_counts(data: TeacherData, idx: Sequence[int], vocab: int) -> torch.Tensor:
    """How often each target id is a training label of trajectories `idx`: the target's own tokens (the
    generated continuations, the target's argmax of teacher-forced text), what a decode will draft."""
    counts = torch.zeros(vocab, dtype=torch.long)
    for i in idx:
        own = data.own_tokens(i)
        if own.numel():
            counts += torch.bincount(own.clamp(0, vocab - 1), minlength=vocab)
    return counts


def check_draft_bounds(coverage, floor, cap) -> None:
    """The auto draft vocabulary's knobs, refused with one BadInputError before any counting."""
    if isinstance(coverage, bool) or not isinstance(coverage, (int, float)) or not 0 < coverage <= 1:
        raise BadInputError(f"draft_coverage must be a number in (0, 1], got {coverage!r}")
    for name, v in (("draft_vocab_min", floor), ("draft_vocab_max", cap)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise BadInputError(f"{name} must be an integer >= 0, got {v!r}")
    if cap and floor > cap:
        raise BadInputError(f"draft_vocab_min {floor} is above draft_vocab_max {cap}: lower the floor or raise the cap")


def check_train_knobs(tcfg: TrainConfig) -> None:
    """The TrainConfig knobs checked up front, refused at once: prepare calls this before the teacher
    pass (minutes), `train_drafter` for its direct callers."""
    check_draft_bounds(tcfg.draft_coverage, tcfg.draft_vocab_min, tcfg.draft_vocab_max)
    check_feature_weight(tcfg.feature_weight)
    check_distill(tcfg.distill_top_k, tcfg.distill_weight)
    resolve_select(tcfg.select, LARGE_VOCAB)
    resolve_seed_labels(tcfg.seed_labels, LARGE_VOCAB)
    if tcfg.anchors not in ANCHOR_RULES[:2]:
        raise BadInputError(f"train anchors must be one of {', '.join(ANCHOR_RULES[:2])}, "
                            f"got {str(tcfg.anchors)[:40]!r}")


def resolve_seed_labels(value, vocab: int) -> str:
    """TrainConfig.seed_labels with 'auto' resolved for a target vocabulary of `vocab`; anything else is refused."""
    if value == "auto":
        return REAL_VOCAB_SEED_LABELS if vocab >= LARGE_VOCAB else "text"
    if not isinstance(value, str) or value not in SEED_LABELS:
        raise BadInputError(f"train seed_labels must be one of auto, {', '.join(SEED_LABELS)}, got {str(value)[:40]!r}")
    return value


def resolve_select(value, vocab: int) -> str:
    """TrainConfig.select with 'auto' resolved for a target vocabulary of `vocab`; anything else is refused."""
    if value == "auto":
        return REAL_VOCAB_SELECT if vocab >= LARGE_VOCAB else "accuracy"
    if not isinstance(value, str) or value not in SELECT_RULES:
        raise BadInputError(f"train select must be one of auto, {', '.join(SELECT_RULES)}, got {str(value)[:40]!r}")
    return value


def draft_vocabulary(counts: torch.Tensor, size: str | int, coverage: float, floor: int = 0,
                     cap: int = 0) -> torch.Tensor:
    """The draft-to-target map: the K most frequent ids (ties by id, so it is deterministic), K given or the
    fewest covering `coverage` of the counts, rounded up to DRAFT_VOCAB_ROUND, at least `floor` and at most `cap`
    (0: no cap); sorted by target id. A given K is used as is."""
    check_draft_bounds(coverage, floor, cap)
    vocab = counts.numel()
    order = sorted(range(vocab), key=lambda t: (-int(counts[t]), t))
    if size == "auto":
        total = int(counts.sum())
        cum = torch.cumsum(counts[order], 0)
        need = int(torch.searchsorted(cum, torch.tensor(math.ceil(coverage * total)))) + 1 if total else 1
        size = max(int(floor), -(-need // DRAFT_VOCAB_ROUND) * DRAFT_VOCAB_ROUND)
        size = min(vocab, size, cap or vocab)
    return torch.tensor(sorted(order[:int(size)]), dtype=torch.long)


def coverage_of(counts: torch.Tensor, d2t: torch.Tensor) -> float | None:
    total = int(counts.sum())
    return float(counts[d2t].sum()) / total if total else None


# --- teacher data (kept here for the callers that predate `teacher`) -----------------------------------

def trajectories(rt: TargetRuntime, prompts: Sequence[Sequence[int]], new_tokens: int, progress: bool = False,
                 batch: int = TEACHER_BATCH):
    """prompt + the target's greedy continuation (exactly `new_tokens`, no EOS stop), for every prompt.

    Prompts of equal length run as one cached batch (`target.batch_greedy`, no padding): identical ids to
    one-at-a-time greedy in float64; in float32 a near-tie can flip, which teacher data tolerates (it is
    training data, not a decode under test). `batch=1` is the one-at-a-time reference.
    """
    return teacher_data(rt, prompts, new_tokens, batch=batch, progress=progress).sequences


def trajectories_taps(rt: TargetRuntime, seqs: Sequence[Sequence[int]], taps: Sequence[int],
                      batch: int = TEACHER_BATCH, progress: bool = False) -> list[torch.Tensor]:
    """`trajectory_taps` of every sequence, equal-length sequences batched into one forward."""
    out: list[torch.Tensor | None] = [None] * len(seqs)
    buckets = length_buckets(seqs, batch)
    for idx in logged(buckets, "target taps", len(buckets), log, show=progress):
        for i, h in zip(idx, batch_taps(rt, [seqs[i] for i in idx], taps)):
            out[i] = h
    return out


# --- batches --------------------------------------------------------------------------------------------

def anchor_range(length: int, prompt_len: int, B: int, rule: str) -> tuple[int, int]:
    """[lo, hi] of the anchors of one trajectory: labels a+1..a+B must exist; 'continuation' starts at the last
    prompt token (the first anchor a decode drafts from), falling back to every anchor when that leaves none;
    'seed' ends before it (anchors inside the seed text; callers keep trajectories with such anchors)."""
    hi = length - B - 1
    if rule == "seed":
        hi = min(hi, prompt_len - 2)
    lo = max(1, prompt_len - 1) if rule == "continuation" else 1
    return (lo, hi) if lo <= hi else (1, hi)


def draw_anchors(data: TeacherData, idx: Sequence[int], anchors: int, B: int, rule: str,
                 gen: torch.Generator) -> torch.Tensor:
    """[len(idx), anchors] anchor positions, uniform in each trajectory's `anchor_range`, from `gen`."""
    out = torch.zeros(len(idx), anchors, dtype=torch.long)
    for r, i in enumerate(idx):
        lo, hi = anchor_range(len(data.sequences[i]), data.prompt_lens[i], B, rule)
        out[r] = lo + (torch.rand(anchors, generator=gen) * (hi - lo + 1)).long().clamp(max=hi - lo)
    return out


def _batch(data: TeacherData, idx: Sequence[int]):
    """Tokens [n, T] and taps [n, T, F] of trajectories `idx`, zero-padded to the longest."""
    seqs, feats = data.sequences, data.taps
    n, T = len(idx), max(len(seqs[i]) for i in idx)
    tok = torch.zeros(n, T, dtype=torch.long)
    ft = torch.zeros(n, T, feats[idx[0]].shape[1], dtype=feats[idx[0]].dtype)
    for r, i in enumerate(idx):
        tok[r, :len(seqs[i])] = torch.tensor(seqs[i])
        ft[r, :feats[i].shape[0]] = feats[i]
    return tok, ft


def _preds(data: TeacherData, idx: Sequence[int], tok: torch.Tensor, relabel: bool = False) -> torch.Tensor | None:
    """The labels' source [n, T] of a batch: the target's predictions of teacher-forced text, the tokens themselves
    for generated trajectories, and with `relabel` the target's predictions of their seed text (`prompt_preds`);
    None when nothing differs from the tokens (no forced text, no relabelled seed)."""
    seeds = [r for r, i in enumerate(idx) if relabel and data.prompt_preds is not None and not data.forced(i)
             and data.prompt_preds[i] is not None and data.prompt_preds[i].numel()]
    if not seeds and not any(data.forced(i) for i in idx):
        return None
    out = tok.clone()
    for r, i in enumerate(idx):
        if data.forced(i):
            out[r, :data.preds[i].numel()] = data.preds[i]
    for r in seeds:
        pp = data.prompt_preds[idx[r]]
        out[r, 1:1 + pp.numel()] = pp  # row j's argmax predicts token j + 1
    return out


def prompt_predictions(rt: TargetRuntime, data: TeacherData, batch: int = 32,
                       progress: bool = False) -> list[torch.Tensor | None]:
    """The target's argmax at every prompt row but the last of each generated trajectory (None for forced text),
    from forwards over the prompts, for teacher data that did not record them (reused trajectories, studies)."""
    out: list[torch.Tensor | None] = [None] * len(data)
    heads = {i: data.sequences[i][:data.prompt_lens[i] - 1] for i in range(len(data))
             if not data.forced(i) and data.prompt_lens[i] > 1}
    order = sorted(heads)
    buckets = length_buckets([heads[i] for i in order], batch)
    for bucket in logged(buckets, "seed predictions", len(buckets), log, show=progress):
        idx = [order[j] for j in bucket]
        inp = torch.tensor([heads[i] for i in idx], dtype=torch.long, device=rt.device)
        with torch.inference_mode():
            top = rt.model(input_ids=inp, use_cache=False).logits.argmax(-1).cpu()
        for r, i in enumerate(idx):
            out[i] = top[r].clone()
    for i in range(len(data)):
        if out[i] is None and not data.forced(i):
            out[i] = torch.zeros(0, dtype=torch.long)
    return out


def soft_targets(data: TeacherData, idx: Sequence[int], anc: torch.Tensor, labels: torch.Tensor, B: int,
                 top_k: int, weight: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [n, M, B, 1+k], probs [...]) per block row: the label with 1 - weight and the target's top-k
    softmax with `weight` where the teacher pass recorded it (rows of the continuation), else the label alone."""
    n, M = anc.shape
    k = top_k if (top_k and data.top_ids is not None) else 0
    ids = labels.unsqueeze(-1).expand(n, M, B, 1 + k).clone()
    probs = torch.zeros(n, M, B, 1 + k)
    probs[..., 0] = 1.0
    if not k:
        return ids, probs
    for r, i in enumerate(idx):
        first = data.prompt_lens[i] - 1  # teacher row 0 is sequence row prompt_len - 1
        tid, tlog = data.top_ids[i][:, :k], data.top_logits[i][:, :k].float()
        for m in range(M):
            rows = anc[r, m].item() + torch.arange(B) - first
            ok = (rows >= 0) & (rows < tid.shape[0])
            if bool(ok.any()):
                sel = rows[ok]
                ids[r, m, ok, 1:] = tid[sel]
                probs[r, m, ok, 1:] = weight * torch.softmax(tlog[sel], dim=-1)
                probs[r, m, ok, 0] = 1.0 - weight
    return ids, probs


def block_inputs(drafter: DFlashDrafter, embed, tok: torch.Tensor, anc: torch.Tensor):
    """The masked forward's inputs for anchors `anc` [n, M]: block embeddings, positions and the mask."""
    B = drafter.cfg.block_size
    n, T = tok.shape
    M = anc.shape[1]
    pos = (anc.unsqueeze(-1) + torch.arange(B + 1)).reshape(n, M * (B + 1))
    anchor_tok = tok.gather(1, anc)  # [n, M]
    with torch.no_grad():
        x = drafter.block_input(anchor_tok.reshape(-1), embed).view(n, M * (B + 1), -1)
    # mask [n, 1, M*(B+1), T + M*(B+1)]: context rows strictly before the anchor, plus the own block
    q_blk = torch.arange(M).repeat_interleave(B + 1)
    ctx_ok = torch.arange(T).view(1, 1, T) < anc.repeat_interleave(B + 1, dim=1).unsqueeze(-1)
    blk_ok = (q_blk.view(-1, 1) == q_blk.view(1, -1)).expand(n, -1, -1)
    mask = torch.cat([ctx_ok, blk_ok], dim=-1).unsqueeze(1)
    return x, pos, torch.arange(T).expand(n, T), mask


def valid_labels(tok: torch.Tensor, preds: torch.Tensor, anc: torch.Tensor, B: int) -> torch.Tensor:
    """[n, M, B]: which labels of the blocks at anchors `anc` [n, M] hold, where the labels are the target's
    predictions `preds` [n, T] of text `tok` [n, T] (teacher-forced text, a relabelled seed): label k is the greedy
    continuation only while the text before it is the target's own prediction, so the first differing token ends
    the block's valid labels (label 1 always holds: it reads only the context)."""
    n, M = anc.shape
    at = (anc.unsqueeze(-1) + 1 + torch.arange(B)).view(n, -1)
    match = (tok.gather(1, at) == preds.gather(1, at)).view(n, M, B)
    return torch.cat([torch.ones(n, M, 1, dtype=torch.bool), match[..., :-1]], -1).cumprod(-1).bool()


def sample_rows(n: int, M: int, B: int, gamma: float, gen: torch.Generator) -> torch.Tensor:
    """Which block rows reach the head [n, M, B]: row k is kept with probability w_k = exp(-(k-1)/gamma) (the first
    always). A kept row then counts with weight w_k / w_k = 1, so the loss is an unbiased estimate of the
    position-decayed loss over every row, at sum_k w_k of B rows per block (4.4 of 16 at gamma 4): the head,
    the costly part at a real vocabulary, sees a quarter of the rows."""
    w = torch.exp(-torch.arange(B, dtype=torch.float64) / gamma)
    return torch.rand(n, M, B, generator=gen, dtype=torch.float64) < w


def accepted_runs(hits: torch.Tensor) -> torch.Tensor:
    """Per block, its leading correct drafts ([..., B] of 0/1 -> [...]): what one verification of the block accepts
    (the target's own token after them is the +1 of tokens per target call)."""
    return hits.cumprod(-1).sum(-1)


def block_loss(drafter, embed, head, tok, ft, anc, gamma: float, targets=None, *,
               compute_dtype: torch.dtype | None = None, norm_blocks: int | None = None, model=None,
               keep: torch.Tensor | None = None, preds: torch.Tensor | None = None, feature_weight: float = 0.0,
               runs: bool = False):
    """Position-decayed CE of all anchors' blocks in one masked forward; (loss, accuracy per position [B]), and
    with `runs` a third item: the mean over blocks of the run of correct drafts from position 1 (a row that does not
    train, e.g. past the end of followed teacher-forced text, ends the run).

    `targets`: (ids, probs) from `soft_targets`, else the labels. `norm_blocks`: the blocks of the whole global
    batch (DDP: each rank's loss is its share of the global mean, times the world size, since DDP averages).
    `model`: what runs the forward (the DDP wrapper of `drafter`), default `drafter` itself. `keep`: the rows
    `sample_rows` drew (the others skip the head; accuracy is over the kept rows of each position). `preds`
    [n, T]: the target's prediction of every token (teacher-forced text): the labels, valid only as long as
    the text follows them. A draft vocabulary (`cfg.draft_vocab`) puts the head over its K rows only.
    `feature_weight` > 0 adds (1 - cosine) between block row k's hidden state and the last tap at row a+k-1 (the
    target's hidden state that predicts label k), position-decayed like the CE, over the rows whose label trains.
    """
    dev = next(drafter.parameters()).device
    if dev.type != "cpu":  # a GPU run: the batch's host tensors join the drafter there, and so do the loss's own
        tok, ft, anc, keep, preds = _to(dev, tok, ft, anc, keep, preds)
        targets = None if targets is None else _to(dev, *targets)
        with on_device(dev):
            return _block_loss(drafter, embed, head, tok, ft, anc, gamma, targets, compute_dtype=compute_dtype,
                               norm_blocks=norm_blocks, model=model, keep=keep, preds=preds,
                               feature_weight=feature_weight, runs=runs)
    return _block_loss(drafter, embed, head, tok, ft, anc, gamma, targets, compute_dtype=compute_dtype,
                       norm_blocks=norm_blocks, model=model, keep=keep, preds=preds, feature_weight=feature_weight,
                       runs=runs)


def _block_loss(drafter, embed, head, tok, ft, anc, gamma: float, targets=None, *,
                compute_dtype: torch.dtype | None = None, norm_blocks: int | None = None, model=None,
                keep: torch.Tensor | None = None, preds: torch.Tensor | None = None, feature_weight: float = 0.0,
                runs: bool = False):
    cfg = drafter.cfg
    sampled = keep
    B = cfg.block_size
    n, M = anc.shape
    x, pos, ctx_pos, mask = block_inputs(drafter, embed, tok, anc)
    prev = (anc - 1) if cfg.anchor_feature != "off" else None  # the context row before each anchor (-1: none)
    h = (model or drafter)(x.to(ft.dtype), ft, pos, ctx_pos, mask, prev).view(n, M, B + 1, -1)[:, :, 1:]
    at = (anc.unsqueeze(-1) + 1 + torch.arange(B)).view(n, -1)
    labels = (tok if preds is None else preds).gather(1, at).view(n, M, B)
    ids, probs = targets if targets is not None else (labels.unsqueeze(-1), torch.ones(n, M, B, 1))
    w = torch.exp(-torch.arange(B, dtype=torch.float64) / gamma)
    if keep is None:
        keep = torch.ones(n, M, B, dtype=torch.bool)
    if preds is not None:
        keep = keep & valid_labels(tok, preds, anc, B)
    weight = drafter.head_rows(head.weight)
    loss_rows = keep
    if cfg.draft_vocab:  # labels into draft ids; a label outside the draft vocabulary trains nothing, counts as a miss
        t2d = torch.full((cfg.vocab_size,), -1, dtype=torch.long)
        t2d[drafter.d2t] = torch.arange(cfg.draft_vocab)
        ids = t2d[ids]
        probs = torch.where(ids >= 0, probs, 0.0)
        probs = probs / probs.sum(-1, keepdim=True).clamp(min=1e-12)
        loss_rows = keep & (ids[..., 0] >= 0)
        ids = ids.clamp(min=0)
    row_w = (w.expand(n, M, B)[loss_rows] if sampled is None else  # importance weight w_k / P(kept) = 1
             torch.ones(int(loss_rows.sum()), dtype=torch.float64))
    ce, top = linear_cross_entropy(h[loss_rows], weight, ids[loss_rows], probs[loss_rows], compute_dtype=compute_dtype)
    if cfg.draft_vocab:
        top = drafter.d2t[top]
    blocks = norm_blocks or n * M
    loss = (ce * row_w.to(ce.dtype)).sum() / (blocks * float(w.sum())) * (dist.world_size() if norm_blocks else 1)
    if feature_weight:
        H = h.shape[-1]
        rows_at = (anc.unsqueeze(-1) + torch.arange(B)).view(n, -1)  # row a+k-1 predicts label k
        tgt = ft[..., -H:].gather(1, rows_at.unsqueeze(-1).expand(-1, -1, H)).view(n, M, B, H)
        dt = torch.promote_types(h.dtype, torch.float32)  # float32 at least (bf16 autocast), float64 kept
        cos = F.cosine_similarity(h.to(dt), tgt.to(dt), dim=-1)
        fw = (w.to(cos.dtype).expand(n, M, B)[loss_rows] if sampled is None else  # as the CE's row weights
              torch.ones(int(loss_rows.sum()), dtype=cos.dtype))
        feat = ((1.0 - cos[loss_rows]) * fw).sum() / (blocks * float(w.sum()))
        loss = loss + feature_weight * feat * (dist.world_size() if norm_blocks else 1)
    hits = torch.zeros(n, M, B)
    hits[loss_rows] = (top == labels[loss_rows]).float()
    acc = hits.sum(dim=(0, 1)) / keep.sum(dim=(0, 1)).clamp(min=1)
    if runs:
        return loss, acc, accepted_runs(hits).mean()
    return loss, acc


def split_trajectories(n: int, seed: int, fraction: float) -> tuple[list[int], list[int]]:
    """(train, held-out) trajectory indices: a seeded permutation, ~`fraction` held out (at least one, never
    all, none when n < 2 or fraction is 0). Whole trajectories: neighbouring anchors share their context."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    k = min(max(1, round(n * fraction)), n - 1) if n >= 2 and fraction > 0 else 0
    return sorted(order[k:]), sorted(order[:k])


def eval_anchors(data: TeacherData, i: int, anchors: int, B: int, rule: str, seed: int) -> torch.Tensor:
    """Trajectory i's evaluation anchors: seeded by (seed, i), so they do not depend on batching or sharding."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + i)
    return draw_anchors(data, [i], anchors, B, rule, gen)[0]


@dataclass(frozen=True)
class HeldoutEval:
    """One teacher-forced evaluation: accuracy per block position, the training loss, and the mean accepted run."""
    accuracy: list[float]
    loss: float
    accepted: float

    @property
    def mean_accuracy(self) -> float:
        return sum(self.accuracy) / len(self.accuracy)

    def score(self, rule: str) -> float:
        """The figure `rule` (SELECT_RULES) ranks states by, higher is better."""
        if rule == "loss":
            return -self.loss
        if rule == "accepted":
            return self.accepted
        return self.mean_accuracy


@torch.no_grad()
def heldout_eval(drafter: DFlashDrafter, embed, head, data, feats, idx: list[int], anchors: int, seed: int,
                 batch: int, *, rule: str = "all", compute_dtype: torch.dtype | None = None,
                 shard: bool = False, relabel: bool = False) -> HeldoutEval:
    """Teacher-forced per-position accuracy, loss and accepted run of the drafter on trajectories `idx`, at fixed
    seeded anchors (the same anchors every call, so successive evaluations compare like with like).

    `data`: TeacherData, or plain sequences with their taps in `feats`. `shard`: each rank evaluates every
    world-th trajectory and the sums are reduced, so all ranks get the whole result. `relabel`: seed anchors are
    scored on the target's own predictions (`_preds`), as TrainConfig.seed_labels 'target' trains them.
    """
    if not isinstance(data, TeacherData):
        data = TeacherData([list(s) for s in data], [1] * len(data), list(feats))
    cfg = drafter.cfg
    was = drafter.training
    drafter.eval()
    mine = idx[dist.rank()::dist.world_size()] if shard else idx
    sums = torch.zeros(cfg.block_size + 3, dtype=torch.float64)  # hits per position, run, loss sum, count
    for j in range(0, len(mine), batch):
        part = mine[j:j + batch]
        tok, ft = _batch(data, part)
        anc = torch.stack([eval_anchors(data, i, anchors, cfg.block_size, rule, seed) for i in part])
        with matmul_autocast(compute_dtype, next(drafter.parameters()).device.type):
            loss, acc, run = block_loss(drafter, embed, head, tok, ft, anc, 4.0, compute_dtype=compute_dtype,
                                        preds=_preds(data, part, tok, relabel), runs=True)
        sums[:-3] += acc.double().cpu() * len(part)
        sums[-3] += float(run) * len(part)
        sums[-2] += float(loss) * len(part)
        sums[-1] += len(part)
    if shard:
        dist.all_reduce_sum(sums)
    drafter.train(was)
    n = max(float(sums[-1]), 1.0)
    return HeldoutEval((sums[:-3] / n).tolist(), float(sums[-2]) / n, float(sums[-3]) / n)


def eval_accuracy(drafter: DFlashDrafter, embed, head, data, feats, idx: list[int], anchors: int, seed: int,
                  batch: int, *, rule: str = "all", compute_dtype: torch.dtype | None = None,
                  shard: bool = False, relabel: bool = False) -> tuple[list[float], float]:
    """`heldout_eval`'s (accuracy per position, loss)."""
    ev = heldout_eval(drafter, embed, head, data, feats, idx, anchors, seed, batch, rule=rule,
                      compute_dtype=compute_dtype, shard=shard, relabel=relabel)
    return ev.accuracy, ev.loss


# --- checkpoints ------------------------------------------------------------------------------------------

def save_checkpoint(path: Path, state: dict) -> None:
    """The training state as safetensors (+ JSON skeleton): nothing is pickled, so loading runs no code."""
    write_atomic(path, tensor_bytes(state))


def load_checkpoint(path: Path, key: str) -> dict | None:
    if not path.is_file():
        return None
    try:
        state = load_tensor_file(path)
    except ArtifactError as exc:
        log.warning("ignoring an unreadable training checkpoint %s: %s", path, exc)
        return None
    return state if state.get("key") == key else None


def _opt_state(opt) -> dict:
    sd = opt.state_dict()
    return {"state": {str(k): v for k, v in sd["state"].items()}, "param_groups": sd["param_groups"]}


def _load_opt_state(opt, blob: dict) -> None:
    opt.load_state_dict({"state": {int(k): v for k, v in blob["state"].items()},
                         "param_groups": blob["param_groups"]})


# --- training ---------------------------------------------------------------------------------------------

def train_drafter(rt: TargetRuntime, seqs, dcfg: DrafterConfig, tcfg: TrainConfig, progress: bool = False,
                  *, teacher: TeacherData | None = None, work: Path | None = None,
                  init=None, observe=None, time_cap: float | None = None) -> tuple[DFlashDrafter, dict]:
    """Train a drafter on teacher trajectories; returns it (eval mode) and metrics for the manifest.

    `teacher`: trajectories with their taps (and top-k logits) from the teacher pass; without it the taps of
    `seqs` are computed here. `work`: where checkpoints go and a killed run resumes from. `init`: called on the
    freshly initialised drafter before training (e.g. `drafter_init.init_from_target`); returns a record.
    `observe(step, drafter, curve_row)`: called after each held-out evaluation (a study keeps states to compare
    selection rules); it must not change the drafter.
    `time_cap`: seconds of training a prepare budget leaves (`timebudget.training_cap`), a second limit beside
    `tcfg.budget_minutes`; not part of the checkpoint key (a resumed run keeps counting its training seconds).
    Refuses trajectories that share an n-gram with a held-out prompt (the one guard, `heldout`).
    """
    if teacher is None:
        teacher = TeacherData([list(s) for s in seqs], [1] * len(seqs), None)
    check_sequences(rt, teacher.sequences, "drafter training")
    check_train_knobs(tcfg)
    tcfg = resolve_schedule(tcfg, dcfg.vocab_size)

    t0 = time.perf_counter()
    B = dcfg.block_size
    embed = rt.model.get_input_embeddings()
    head = rt.model.get_output_embeddings()
    data = teacher.select([i for i, s in enumerate(teacher.sequences) if len(s) > B + 2])
    if data.taps is None or data.tap_layers not in ((), tuple(dcfg.taps)):
        data.taps = trajectories_taps(rt, data.sequences, dcfg.taps, progress=progress)
    relabel = tcfg.seed_labels == "target"
    if relabel and data.prompt_preds is None:  # trajectories reused without the teacher pass: one prompt forward
        data.prompt_preds = prompt_predictions(rt, data, progress=progress)
    matmul_dtype = rt.dtype
    if rt.dtype == torch.float32:
        matmul_dtype = resolve_matmul_dtype(tcfg.matmul_dtype, dcfg.vocab_size, str(rt.device))
    row_sampling = resolve_row_sampling(tcfg.row_sampling, dcfg.vocab_size)
    distill = tcfg.distill_top_k if data.top_ids is not None else 0
    generated = [i for i in range(len(data)) if not data.forced(i)]
    train_ids, val_ids = split_trajectories(len(generated), tcfg.seed, tcfg.val_fraction)
    # held out: generated trajectories only (the figures stay comparable); teacher-forced text all trains
    train_ids = [generated[i] for i in train_ids] + [i for i in range(len(data)) if data.forced(i)]
    val_ids = [generated[i] for i in val_ids]
    if len(val_ids) > tcfg.val_sequences:
        val_ids = sorted(random.Random(tcfg.seed + 2).sample(val_ids, tcfg.val_sequences))
    dv = resolve_draft_vocab(tcfg.draft_vocab, dcfg.vocab_size)
    d2t, vocab_record = None, {"draft_vocab": "off"}
    if dv != "off":  # chosen on the train split only; its coverage of the held-out labels is the honest figure
        counts = label_counts(data, train_ids, dcfg.vocab_size)
        d2t = draft_vocabulary(counts, dv, tcfg.draft_coverage, tcfg.draft_vocab_min, tcfg.draft_vocab_max)
        dcfg = replace(dcfg, draft_vocab=int(d2t.numel()))
        vocab_record = {"draft_vocab": int(d2t.numel()), "vocab": dcfg.vocab_size, "rule": str(dv),
                        "train_coverage": coverage_of(counts, d2t),
                        "heldout_coverage": coverage_of(label_counts(data, val_ids, dcfg.vocab_size), d2t),
                        "train_labels": int(counts.sum()), "floor": tcfg.draft_vocab_min, "cap": tcfg.draft_vocab_max}
        vocab_record["capped"] = (dv == "auto" and bool(tcfg.draft_vocab_max) and d2t.numel() == tcfg.draft_vocab_max
                                  and vocab_record["train_coverage"] < tcfg.draft_coverage)
        log.info("draft vocabulary: %d of %d ids, covering %.4f of the train labels and %s of the held-out ones",
                 d2t.numel(), dcfg.vocab_size, vocab_record["train_coverage"], vocab_record["heldout_coverage"])
    # initialised on the CPU (the same weights on every device), then trained where the target is, in its dtype
    drafter = init_drafter(dcfg, tcfg.seed).to(device=embed.weight.device, dtype=embed.weight.dtype)
    init_record = init(drafter) if init is not None else None
    if d2t is not None:
        drafter.set_draft_map(d2t)
    for p in list(embed.parameters()) + list(head.parameters()):
        p.requires_grad_(False)
    model = drafter
    if dist.world_size() > 1:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(drafter)
    opt = torch.optim.AdamW(drafter.parameters(), lr=tcfg.lr, weight_decay=tcfg.weight_decay)
    gen = torch.Generator().manual_seed(tcfg.seed + 1)
    st: dict = {"step": 0, "losses": [], "accs": [], "curve": [], "since_best": 0, "train_seconds": 0.0,
                "best": {"score": None, "step": 0, "state": None, "acc": None, "loss": None}}
    key = _checkpoint_key(data, dcfg, tcfg, init_record)
    ckpt = work / CHECKPOINT_FILE if work is not None else None
    resumed = load_checkpoint(ckpt, key) if ckpt is not None else None
    resumed_step = None
    if resumed is not None:
        drafter.load_state_dict(resumed["drafter"])
        _load_opt_state(opt, resumed["optimizer"])
        gen.set_state(resumed["generator"])
        st = resumed["loop"]
        resumed_step = st["step"]
        log.info("resuming drafter training from the checkpoint at step %d (%s)", st["step"], ckpt)
    drafter.train()
    bar = Progress("train drafter", tcfg.steps, log, show=progress)
    if st["step"]:
        bar.update(st["step"])
    budget = 60.0 * tcfg.budget_minutes if tcfg.budget_minutes else None
    capped = time_cap is not None and (budget is None or time_cap < budget)  # the prepare budget binds first
    budget = time_cap if capped else budget

    def evaluate(step: int) -> None:
        ev = heldout_eval(drafter, embed, head, data, None, val_ids, tcfg.anchors_per_sequence, tcfg.seed + 3,
                          tcfg.batch_sequences, rule=tcfg.anchors, compute_dtype=matmul_dtype, shard=True,
                          relabel=relabel)
        acc, vloss, score = ev.accuracy, ev.loss, ev.score(tcfg.select)
        st["curve"].append({"step": step, "heldout_mean_accuracy": ev.mean_accuracy, "heldout_loss": vloss,
                            "heldout_accepted": ev.accepted})
        trim_free_memory()  # else glibc keeps the steps' freed buffers: gigabytes at 350M (runtime/allocator.py)
        log.info("step %d: held-out accuracy per position %s (mean %.3f), loss %.3f, accepted run %.3f", step,
                 " ".join(f"{a:.2f}" for a in acc), ev.mean_accuracy, vloss, ev.accepted)
        if observe is not None:
            observe(step, drafter, st["curve"][-1])
        if st["best"]["state"] is None or score > st["best"]["score"]:
            st["best"] = {"score": score, "step": step, "state": copy.deepcopy(drafter.state_dict()), "acc": acc,
                          "loss": vloss}
            st["since_best"] = 0
        else:
            st["since_best"] += 1

    stop = None
    while st["step"] < tcfg.steps and stop is None:
        t_step = time.perf_counter()
        step = st["step"]
        frac = step / tcfg.steps
        if budget:
            frac = max(frac, st["train_seconds"] / budget)
        lr = tcfg.lr * min(1.0, (step + 1) / tcfg.warmup) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0)))
        for g in opt.param_groups:
            g["lr"] = lr
        idx = [train_ids[i] for i in
               torch.randint(len(train_ids), (min(tcfg.batch_sequences, len(train_ids)),), generator=gen).tolist()]
        anc = draw_anchors(data, idx, tcfg.anchors_per_sequence, B, tcfg.anchors, gen)
        keep = sample_rows(len(idx), anc.shape[1], B, tcfg.gamma, gen) if row_sampling else None
        r, w = dist.rank(), dist.world_size()
        mine = list(range(r, len(idx), w))  # this rank's share of the global batch
        if mine:
            sub = [idx[j] for j in mine]
            tok, ft = _batch(data, sub)
            preds = _preds(data, sub, tok, relabel)
            anc_r = anc[mine]
            labels = tok.gather(1, (anc_r.unsqueeze(-1) + 1 + torch.arange(B)).view(len(sub), -1)).view(
                len(sub), -1, B)
            targets = soft_targets(data, sub, anc_r, labels, B, distill, tcfg.distill_weight) if distill else None
            with matmul_autocast(matmul_dtype, next(drafter.parameters()).device.type):
                loss, acc = block_loss(drafter, embed, head, tok, ft, anc_r, tcfg.gamma, targets,
                                       compute_dtype=matmul_dtype, norm_blocks=len(idx) * anc.shape[1], model=model,
                                       keep=keep[mine] if keep is not None else None, preds=preds,
                                       feature_weight=tcfg.feature_weight)
        else:  # more ranks than sequences: a zero contribution still joins DDP's gradient reduction
            loss = sum(p.sum() * 0.0 for p in drafter.parameters())
            acc = torch.zeros(B, device=next(drafter.parameters()).device)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        st["step"] = step = step + 1
        st["tokens_seen"] = st.get("tokens_seen", 0) + len(idx) * anc.shape[1] * B  # block labels drawn
        global_loss = dist.all_reduce_sum(torch.tensor([float(loss.detach()) / w], dtype=torch.float64))
        st["losses"].append(float(global_loss[0]))  # the global batch's loss (each rank's share summed)
        st["accs"].append(acc.tolist())
        left = f", ~{max(0.0, budget - st['train_seconds']):.0f}s of the budget left" if budget else ""
        bar.update(1, f"loss {st['losses'][-1]:.3f}{left}")
        out_of_time = bool(budget and st["train_seconds"] + time.perf_counter() - t_step >= budget)
        if val_ids and (step % tcfg.eval_every == 0 or step == tcfg.steps or out_of_time):
            evaluate(step)
            if st["since_best"] >= tcfg.patience:
                stop = (f"held-out {tcfg.select} did not improve for {st['since_best']} evaluations: stopping at step "
                        f"{step} (best {st['best']['step']})")
        if out_of_time and stop is None:
            spent = (f"the {budget:.0f} s of training the prepare budget leaves are" if capped
                     else f"the training budget of {tcfg.budget_minutes} min is")
            stop = f"{spent} spent: stopping at step {step}"
        st["train_seconds"] += time.perf_counter() - t_step  # evaluations count against the budget too
        if ckpt is not None and tcfg.checkpoint_every and step % tcfg.checkpoint_every == 0 and stop is None:
            if dist.rank() == 0:
                save_checkpoint(ckpt, {"key": key, "drafter": drafter.state_dict(), "optimizer": _opt_state(opt),
                                       "generator": gen.get_state(), "loop": st})
            dist.barrier()
    if stop:
        log.info(stop)
    best = st["best"]
    if best["state"] is not None:
        drafter.load_state_dict(best["state"])  # the best held-out state, not the last one
    drafter.eval()
    losses, accs = st["losses"], st["accs"]
    tail = max(1, min(50, len(losses)))
    # Reported figures in float32 whatever the training matmuls used: the decode's argmax is float32.
    exact = rt.dtype
    final = (heldout_eval(drafter, embed, head, data, None, val_ids, tcfg.anchors_per_sequence, tcfg.seed + 3,
                          tcfg.batch_sequences, rule=tcfg.anchors, compute_dtype=exact, shard=True, relabel=relabel)
             if val_ids else HeldoutEval(None, None, None))
    heldout_acc, heldout_loss = final.accuracy, final.loss
    # the anchors a decode drafts from (the last seed token on: every label generated, so no relabelling applies)
    decode = (heldout_eval(drafter, embed, head, data, None, val_ids, tcfg.anchors_per_sequence, tcfg.seed + 3,
                           tcfg.batch_sequences, rule="continuation", compute_dtype=exact, shard=True)
              if val_ids else HeldoutEval(None, None, None))
    if val_ids:
        log.info("held-out accuracy per position at %s anchors %s; at decode anchors %s (accepted run %.3f)",
                 tcfg.anchors, " ".join(f"{a:.2f}" for a in heldout_acc),
                 " ".join(f"{a:.2f}" for a in decode.accuracy), decode.accepted)
    # the train split evaluated exactly like the held-out one (same anchors rule, same count): the gap is overfit
    train_eval = sorted(random.Random(tcfg.seed + 4).sample(train_ids, min(len(train_ids), max(len(val_ids), 1))))
    train_acc, train_loss = eval_accuracy(drafter, embed, head, data, None, train_eval, tcfg.anchors_per_sequence,
                                          tcfg.seed + 3, tcfg.batch_sequences, rule=tcfg.anchors, compute_dtype=exact,
                                          shard=True, relabel=relabel)
    metrics = {
        "train_config": train_config_dict(tcfg),
        "matmul_dtype": str(matmul_dtype).replace("torch.", ""),
        "row_sampling": row_sampling,
        "distilled_top_k": distill,
        "draft_vocabulary": vocab_record,
        "forced_sequences": sum(1 for i in range(len(data)) if data.forced(i)),
        "init": init_record,
        "tokens_seen": st.get("tokens_seen", 0),
        "world_size": dist.world_size(),
        "resumed_from_step": resumed_step,
        "sequences": len(data),
        "train_sequences": len(train_ids),
        "heldout_sequences": len(val_ids),
        "final_loss": sum(losses[-tail:]) / tail if losses else None,
        "first_loss": losses[0] if losses else None,
        "position_accuracy": [sum(a[k] for a in accs[-tail:]) / tail for k in range(B)] if accs else None,
        "train_position_accuracy": train_acc,
        "train_eval_loss": train_loss,
        "heldout_position_accuracy": heldout_acc,
        "heldout_loss": heldout_loss,
        "heldout_accepted": final.accepted,
        "heldout_anchors": tcfg.anchors,  # the rule of the held-out figures above (labels: seed_labels)
        "heldout_decode_position_accuracy": decode.accuracy,  # at the anchors a decode drafts from
        "heldout_decode_accepted": decode.accepted,
        "heldout_selection_accuracy": best["acc"],  # the same evaluation in the training matmuls' dtype
        "best_step": best["step"] if best["state"] is not None else len(losses),
        "steps_run": len(losses),
        "stopped": stop or "all steps run",
        "heldout_curve": st["curve"],
        "train_seconds": st["train_seconds"],
        "time_cap_seconds": time_cap,
        "seconds": time.perf_counter() - t0,
    }
    if ckpt is not None and dist.rank() == 0:
        ckpt.unlink(missing_ok=True)
    return drafter, metrics


def _checkpoint_key(data: TeacherData, dcfg: DrafterConfig, tcfg: TrainConfig, init: dict | None = None) -> str:
    """What a checkpoint must have been written for: the same data, drafter, recipe, initialisation (the `init`
    hook's record, when there is one) and world size."""
    doc = {"seqs": hashlib.sha256(json.dumps(data.sequences).encode()).hexdigest(), "drafter": dcfg.to_dict(),
           "train": {k: v for k, v in train_config_dict(tcfg).items() if k != "budget_minutes"},
           "world": dist.world_size()}
    if init is not None:
        doc["init"] = init
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()
