"""02 dflash2: top-K predecessor-aware dynamic programming (Viterbi) with a learned low-rank pair selector.

The pair selector scores how well candidate token c follows token p, given the context vector x (the
fused target feature of the last context row, the same vector `draft_examples(...).context` holds):

    gate(x)   = tanh(W x + b)                                   [r]
    pair(p→c) = Σ_r a[p]_r · gate_r · b[c]_r · r^-0.5          a, b: [V, r] tables over the full vocab

It is trained by `prepare` (fitter "pair_selector") on the drafter's outputs along teacher trajectories:
cross-entropy over the drafter's top-K candidates of (drafter logit + pair(true previous token → cand));
positions whose label is not among the top-K are masked (top-K restricted training).

dflash2 selection over the B drafted positions, candidates id[i, j] with drafter values v[i, j]
(top-K per row, K=8, ranked by `common.topk`'s tie rule):

    dp[j]        = v[0, j] + pair(prev → id[0, j])            prev = the anchor (last committed token)
    S_i[p, j]    = dp[p] + pair(id[i-1, p] → id[i, j]) + v[i, j]
    back_i[j]    = first argmax_p S_i[p, j]                   (ties: the better-ranked predecessor)
    dp[j]        = S_i[back_i[j], j]
    end          = first argmax_j dp[j], then backtrack.

Guidance work = K + (B-1)·K² pair scores per block (the whole block is selected; the verify width trims after).

This module also holds what the other selector modules (mobs.py) share: the context-vector proposer base,
the pair scorer, the artifact check and the cached draft examples for the fitters.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..artifacts import torch_bytes
from ..errors import ArtifactError, BadInputError
from ..prepare import register_fitter
from . import MethodInfo, register
from .common import BlockProposer, topk

PAIR_FILE = "pair_selector.pt"
FIT_TOP_K = 16  # candidates per position the fitters train on (inference default K=8 is a subset)


# --- shared helpers for methods 02-05, 07 ------------------------------------------------------------

def check_number(name: str, value: Any, *, lo: float | None = None, integer: bool = False) -> Any:
    """Validate a method option; raise BadInputError naming the option and the allowed range."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and integer:
        ok = int(value) == value
    if ok and lo is not None:
        ok = value >= lo
    if not ok:
        kind = "an integer" if integer else "a finite number"
        rng = f" >= {lo}" if lo is not None else ""
        raise BadInputError(f"method option {name} must be {kind}{rng}, got {value!r}")
    return int(value) if integer else float(value)


def require_files(prepared, names: tuple[str, ...]) -> None:
    """Refuse to build when the manifest lacks a file this method needs (names the prepare to run)."""
    files = prepared.manifest.get("files", {})
    target = prepared.manifest.get("target", {}).get("name", "<target>")
    for name in names:
        if name not in files:
            raise ArtifactError(
                f"{prepared.directory / 'manifest.json'} lacks {name!r}, which this method needs: run "
                f"`python -m dflash_core prepare --target {target} --refresh` (it builds {name})")


def load_blob(prepared, name: str) -> dict:
    """torch.load a verified artifact once per Prepared (cached in prepared.files)."""
    require_files(prepared, (name,))
    if name not in prepared.files:
        prepared.files[name] = prepared.load_torch(name)
    return prepared.files[name]


def first_argmax(scores) -> int:
    """Index of the first maximum (candidates are ranked, so ties go to the better-ranked one)."""
    best, bi = scores[0], 0
    for i in range(1, len(scores)):
        if scores[i] > best:
            best, bi = scores[i], i
    return bi


class ContextProposer(BlockProposer):
    """BlockProposer for the pair-scored methods (02, 03, 04, 05, 07, 11): it loads the learned pair selector
    and remembers the taps of the last context row, whose fused features are the selector's context vector."""

    def __init__(self, rt, prepared, **options: Any):
        super().__init__(rt, prepared, **options)
        self.selector = load_pair_selector(prepared)
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

    def block_scorer(self, ids, prev: int, ctx: torch.Tensor | None = None) -> "PairScorer":
        """The pair scorer of one block: the context vector, the previous token and every candidate id."""
        return PairScorer(self.selector, self.context() if ctx is None else ctx,
                          [prev, *(t for row in ids for t in row)])


# --- the learned pair selector --------------------------------------------------------------------

class PairSelector(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, rank: int = 16):
        super().__init__()
        self.rank = rank
        self.a = nn.Embedding(vocab_size, rank)
        self.b = nn.Embedding(vocab_size, rank)
        self.gate = nn.Linear(hidden_size, rank)
        nn.init.normal_(self.a.weight, std=0.1)
        nn.init.normal_(self.b.weight, std=0.1)

    def gates(self, ctx: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., r], with the r^-0.5 scale folded in."""
        return torch.tanh(self.gate(ctx)) * self.rank ** -0.5

    def pair(self, prev: torch.Tensor, cand: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """prev [N, B], cand [N, B, K], g [N, r] -> pair(prev → cand) [N, B, K]."""
        left = self.a(prev) * g[:, None, :]
        return (left[:, :, None, :] * self.b(cand)).sum(-1)


def pair_config(sel: PairSelector) -> dict:
    return {"vocab_size": sel.a.num_embeddings, "hidden_size": sel.gate.in_features, "rank": sel.rank}


def load_pair_selector(prepared) -> PairSelector:
    key = PAIR_FILE + "#module"
    if key not in prepared.files:
        blob = load_blob(prepared, PAIR_FILE)
        sel = PairSelector(**blob["config"])
        sel.load_state_dict(blob["state_dict"])
        prepared.files[key] = sel.eval()
    return prepared.files[key]


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


def viterbi(vals: list[list[float]], start: list[float], trans: list[list[list[float]]]) -> list[int]:
    """Best path through B rows of K candidates: Σ v[i, j_i] + start[j_0] + Σ trans[i-1][j_{i-1}][j_i].

    Ties: every argmax takes the first maximum (the better-ranked candidate), so among equally scored
    paths the one chosen is the smallest when compared from the last position backwards.
    Returns the chosen candidate index per row.
    """
    B = len(vals)
    dp = [v + s for v, s in zip(vals[0], start)]
    backs: list[list[int]] = []
    for i in range(1, B):
        tr = trans[i - 1]
        new, back = [], []
        for j, vj in enumerate(vals[i]):
            best, bp = dp[0] + tr[0][j], 0
            for p in range(1, len(dp)):
                s = dp[p] + tr[p][j]
                if s > best:
                    best, bp = s, p
            new.append(best + vj)
            back.append(bp)
        dp = new
        backs.append(back)
    j = first_argmax(dp)
    path = [j]
    for back in reversed(backs):
        j = back[j]
        path.append(j)
    return path[::-1]


class DFlash2Proposer(ContextProposer):
    def __init__(self, rt, prepared, *, top_k: int = 8):
        super().__init__(rt, prepared)
        self.top_k = check_number("top_k", top_k, lo=1, integer=True)

    def select(self, logits, hidden, prefix, k):
        ids, vals = topk(logits, self.top_k)
        prev = int(prefix[-1])
        scorer = self.block_scorer(ids, prev)
        start = scorer(prev, ids[0])
        path = viterbi(vals, start, scorer.transitions(ids))
        chosen = [ids[i][j] for i, j in enumerate(path)]
        return chosen, scorer.count, {"pair_scores": scorer.count}


# --- the fitter -----------------------------------------------------------------------------------

FIT_TARGET_EXAMPLES = 4096  # enough for aux_steps x 64-example batches; more only slows prepare down


def fit_stride(ctx) -> int:
    """Anchor stride so the examples (about min(aux_max_examples, 4096)) are spread over every trajectory.

    Every anchor costs one drafter run on its whole context, so a stride keeps prepare to minutes on
    2 CPU cores; spreading (rather than stopping after the first trajectories) keeps held-out trajectories.
    """
    B = ctx.drafter.cfg.block_size
    total = sum(max(0, len(seq) - B - max(plen, 1)) for seq, plen in zip(ctx.trajectories, ctx.prompt_lens))
    want = min(ctx.cfg.aux_max_examples or FIT_TARGET_EXAMPLES, FIT_TARGET_EXAMPLES)
    return max(1, math.ceil(total / max(1, want)))


def fit_examples(ctx):
    """Draft examples shared by the fitters of methods 02-05 (computed once per prepare run)."""
    from .data import draft_examples

    key = ("_methods_02_08_examples", ctx.cfg.aux_max_examples)
    cache = ctx.__dict__.setdefault("_cache_methods_02_08", {})
    if key not in cache:
        k = min(FIT_TOP_K, ctx.rt.vocab_size)
        cache[key] = draft_examples(ctx, top_k=k, stride=fit_stride(ctx), with_target=True,
                                    max_examples=ctx.cfg.aux_max_examples)
    return cache[key]


def label_index(ids: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each label sits among its row's candidates: (index [..], present mask [..])."""
    hit = ids == labels[..., None]
    return hit.float().argmax(-1), hit.any(-1)


def holdout_mask(ex) -> torch.Tensor:
    """Examples of every 5th trajectory are held out of the optimisation (when there are >= 5 trajectories).

    Whole trajectories, not single anchors: neighbouring anchors of one trajectory share most of their
    context, so holding out single anchors would leak. With fewer trajectories nothing is held out and
    the metrics are reported on the training examples (meta `eval` says which).
    """
    traj = torch.tensor([ti for ti, _ in ex.anchors], dtype=torch.long)
    if len(set(traj.tolist())) < 5:
        return torch.zeros(len(traj), dtype=torch.bool)
    return traj % 5 == 4


def batches(train_idx: torch.Tensor, steps: int, size: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        yield train_idx[torch.randint(len(train_idx), (min(size, len(train_idx)),), generator=gen)]


def restricted_accuracy(scores: torch.Tensor, idx: torch.Tensor, present: torch.Tensor) -> float:
    if not bool(present.any()):
        return 0.0
    return float((scores.argmax(-1) == idx)[present].float().mean())


@register_fitter("pair_selector")
def fit_pair_selector(ctx) -> dict:
    ex = fit_examples(ctx)
    torch.manual_seed(ctx.cfg.seed + 2)
    sel = PairSelector(ctx.rt.vocab_size, ctx.drafter.cfg.hidden_size)
    prev_true = torch.cat([ex.prev[:, None], ex.labels[:, :-1]], dim=1)  # [N, B] true previous tokens
    idx, present = label_index(ex.topk_ids, ex.labels)
    n = prev_true.shape[0]
    held = holdout_mask(ex)
    train_idx = torch.nonzero(~held).flatten()
    opt = torch.optim.AdamW(sel.parameters(), lr=3e-3, weight_decay=0.0)

    def scores(rows):
        g = sel.gates(ex.context[rows])
        return ex.topk_vals[rows] + sel.pair(prev_true[rows], ex.topk_ids[rows], g)

    losses = []
    for rows in batches(train_idx, ctx.cfg.aux_steps, 64, ctx.cfg.seed + 3):
        m = present[rows]
        if not bool(m.any()):
            continue
        loss = nn.functional.cross_entropy(scores(rows)[m], idx[rows][m])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    sel.eval()
    ev = torch.nonzero(held).flatten() if bool(held.any()) else train_idx
    with torch.no_grad():  # metrics at the inference default K = 8
        i8, p8 = label_index(ex.topk_ids[ev][..., :8], ex.labels[ev])
        base = restricted_accuracy(ex.topk_vals[ev][..., :8], i8, p8)
        tuned = restricted_accuracy(scores(ev)[..., :8], i8, p8)
    sd = {k: v.detach().float().contiguous() for k, v in sel.state_dict().items()}
    blob = torch_bytes({"config": pair_config(sel), "state_dict": sd})
    meta = {"examples": n, "held_out": int(held.sum()), "steps": ctx.cfg.aux_steps, "stride": fit_stride(ctx),
            "eval": "held-out trajectories" if bool(held.any()) else "train", "top_k": ex.topk_ids.shape[-1],
            "label_in_top_k": float(present.float().mean()), "loss_first": losses[0] if losses else None,
            "loss_final": losses[-1] if losses else None, "drafter_top1_acc": base,
            "with_pair_top1_acc": tuned, "parameters": int(sum(p.numel() for p in sel.parameters())),
            "note": "teacher-forced: pair(true previous token -> drafter top-K), restricted CE"}
    return {"files": {PAIR_FILE: blob}, "meta": meta}


fit_pair_selector.files = (PAIR_FILE,)

register(MethodInfo(
    index=2, id="dflash2", label="DFlash2 (pair DP)", mechanism="top-K Viterbi with a learned low-rank pair selector",
    complexity="O(B·K²) pair scores per block", build=DFlash2Proposer, needs=(PAIR_FILE,),
    stages=("draft block, keep top-K per position", "gate the pair tables with the context vector",
            "Viterbi over B positions with pair(prev→cand) links", "backtrack the best path, verify")))
