"""The DFlash block drafter, conditioned on target hidden states (upstream z-lab/dflash design).

* Taps: the outputs of a few target layers (residual stream, before the final norm) are concatenated,
  fused by `fc` (n_taps*H -> H, no bias) and an RMSNorm.
* KV injection: in every drafter layer, keys/values are [that layer's k/v projection of the fused context |
  its k/v projection of the block]. Queries come from the block only. Context rows never pass through
  the layers; they only supply K/V.
* The block `[anchor, MASK x B]` attends non-causally to itself and to all context rows. Each MASK
  position predicts its own token; the anchor's output is discarded. B is the number of drafted tokens.
* Embeddings and LM head are the target's (frozen, shared). The MASK rows are the target's embedding of
  `mask_token_id`, as upstream and transformers' `MuseGlimmerAssistantModel` do (prepare uses the target's
  pad token, which never occurs in text); so the drafter converts 1:1 to that format (`hf_drafter`).
* Attention may be grouped-query (`num_kv_heads` < `num_heads`) and `head_dim` may be set explicitly, so a
  published transformers-format drafter loads too; prepare trains plain multi-head attention.
* The drafter keeps its own cache of context K/V (`DraftState`), extended with the rows each verify keeps;
  block K/V are never cached.
* Draft vocabulary (FR-Spec, EAGLE-3's draft-to-target map): with `draft_vocab` K > 0 the drafter's head is the
  target head's rows of K target ids (buffer `d2t`, the K most frequent tokens of the teacher data), so drafting
  and training pay a K x H head instead of V x H. Drafted logits are scattered back to the full vocabulary (the
  other ids get `OOV_LOGIT`), so every method sees [B, V] logits in target ids; the target still verifies over
  its full vocabulary, so exactness does not depend on the map.
* Anchor feature (EAGLE's input, `anchor_feature`): 'anchor' adds a learned projection (`feat`, H -> H) of the
  fused context row just before the anchor to the anchor row, 'mask' to the MASK rows, 'block' to every row.
  Why: with one layer a MASK row's query is the same for every block (the MASK embedding at a relative
  position), so it can only mix the anchor's embedding and the context linearly before the MLP; the feature
  puts the target's latest state into the rows themselves. 'off' is upstream's drafter (and the only one the
  transformers format holds).
* Anchor embedding (`anchor_embed`): every MASK row is the MASK embedding plus the anchor's. Why: with one layer
  the MASK rows' queries are otherwise the same for every block, so attention cannot look anything up by the
  anchor (an induction copy: "what followed this token before") and the MLP sees the anchor only mixed into an
  attention average. No parameters; the transformers format has no counterpart, so the export refuses it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class DrafterConfig:
    hidden_size: int
    vocab_size: int
    taps: tuple[int, ...]
    block_size: int = 4
    num_layers: int = 1
    num_heads: int = 4
    intermediate_size: int = 512
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    mask_token_id: int = 0  # the target token whose embedding fills the B MASK rows of a block
    kv_heads: int | None = None  # None: num_heads (plain multi-head attention)
    attn_head_dim: int | None = None  # None: hidden_size // num_heads
    draft_vocab: int = 0  # K > 0: the head covers the K target ids of buffer `d2t` (0: the full vocabulary)
    anchor_feature: str = "off"  # 'anchor' | 'mask' | 'block': the fused row before the anchor added to those rows
    anchor_embed: bool = False  # the anchor's embedding added to every MASK row (content-dependent queries)

    @property
    def head_dim(self) -> int:
        return self.attn_head_dim or self.hidden_size // self.num_heads

    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads or self.num_heads

    def to_dict(self) -> dict:
        d = asdict(self)
        d["taps"] = list(self.taps)
        if not self.anchor_embed:  # a drafter without it writes the bytes it wrote before the option existed
            del d["anchor_embed"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "DrafterConfig":
        d = dict(d)
        d["taps"] = tuple(d["taps"])
        return cls(**d)


ANCHOR_FEATURES = ("off", "anchor", "mask", "block")


# The logit of a target id outside the draft vocabulary: exp underflows to 0, while p * log p stays finite (0) and
# squares stay far from float32's range, so softmax, entropy and temperature code need no special case.
OOV_LOGIT = -1e9


def check_draft_map(cfg: DrafterConfig, d2t, where: str) -> None:
    """A drafter config and map are hostile input: K in 1..vocab, the map [K] integer, in range, unique."""
    k = cfg.draft_vocab
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= cfg.vocab_size:
        raise ValueError(f"{where}: draft_vocab must be an integer in 0..{cfg.vocab_size}, got {k!r}")
    if not k:
        if d2t is not None:
            raise ValueError(f"{where}: a draft-to-target map without draft_vocab")
        return
    if d2t is None or not isinstance(d2t, torch.Tensor):
        raise ValueError(f"{where}: draft_vocab {k} but no draft-to-target map d2t")
    if d2t.dtype.is_floating_point or d2t.dtype.is_complex or d2t.dtype == torch.bool or tuple(d2t.shape) != (k,):
        raise ValueError(f"{where}: the draft-to-target map must be an integer tensor of shape [{k}], got "
                         f"{str(d2t.dtype).replace('torch.', '')} {list(d2t.shape)}")
    if int(d2t.min()) < 0 or int(d2t.max()) >= cfg.vocab_size:
        raise ValueError(f"{where}: the draft-to-target map has ids outside the vocabulary 0..{cfg.vocab_size - 1}")
    if torch.unique(d2t).numel() != k:
        raise ValueError(f"{where}: the draft-to-target map repeats a target id")


def default_taps(num_target_layers: int, n: int) -> tuple[int, ...]:
    """Upstream's rule: n layer ids spread evenly from layer 1 to layer L-3 (n=1: the middle layer)."""
    if n == 1:
        return (num_target_layers // 2,)
    lo, hi = 1, max(1, num_target_layers - 3)
    return tuple(int(round(lo + (hi - lo) * i / (n - 1))) for i in range(n))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding on [..., T, D] at integer positions `pos` [T] (or [N, T])."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = pos.to(torch.float32).unsqueeze(-1) * inv  # [..., T, D/2]
    while ang.dim() < x.dim():
        ang = ang.unsqueeze(-3)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class DrafterLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        h, nh, hd, nkv = cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.num_kv_heads
        self.cfg = cfg
        self.in_norm = RMSNorm(h, cfg.norm_eps)
        self.q = nn.Linear(h, nh * hd, bias=False)
        self.k = nn.Linear(h, nkv * hd, bias=False)
        self.v = nn.Linear(h, nkv * hd, bias=False)
        self.o = nn.Linear(nh * hd, h, bias=False)
        self.q_norm = RMSNorm(hd, cfg.norm_eps)
        self.k_norm = RMSNorm(hd, cfg.norm_eps)
        self.mlp_norm = RMSNorm(h, cfg.norm_eps)
        self.gate = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.up = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, h, bias=False)

    def _heads(self, x):  # [N, T, heads*hd] -> [N, heads, T, hd]
        n, t, _ = x.shape
        return x.view(n, t, -1, self.cfg.head_dim).transpose(1, 2)

    def context_kv(self, fused: torch.Tensor, pos: torch.Tensor):
        """K/V of fused context rows [N, T, H] at positions `pos` (the KV injection)."""
        k = rope(self.k_norm(self._heads(self.k(fused))), pos, self.cfg.rope_theta)
        v = self._heads(self.v(fused))
        return k, v

    def forward(self, x, pos, ctx_k, ctx_v, mask=None):
        """x: block hidden [N, Tb, H] at positions `pos`; attends to context K/V and to the whole block."""
        hx = self.in_norm(x)
        q = rope(self.q_norm(self._heads(self.q(hx))), pos, self.cfg.rope_theta)
        k = rope(self.k_norm(self._heads(self.k(hx))), pos, self.cfg.rope_theta)
        v = self._heads(self.v(hx))
        k = torch.cat([ctx_k, k], dim=2)
        v = torch.cat([ctx_v, v], dim=2)
        rep = self.cfg.num_heads // self.cfg.num_kv_heads
        if rep > 1:  # grouped-query attention: query head i reads kv head i // rep
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=False)
        n, _, t, _ = att.shape
        x = x + self.o(att.transpose(1, 2).reshape(n, t, -1))
        hm = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(hm)) * self.up(hm))


class DFlashDrafter(nn.Module):
    """Drafts B tokens per block from the target's fused hidden states. Embedding and head are passed in."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(len(cfg.taps) * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.layers = nn.ModuleList([DrafterLayer(cfg) for _ in range(cfg.num_layers)])
        self.final_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        k = cfg.draft_vocab  # checked before the map is allocated: a config is hostile input
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= cfg.vocab_size:
            raise ValueError(f"draft_vocab must be an integer in 0..{cfg.vocab_size}, got {str(k)[:40]!r}")
        if cfg.draft_vocab:
            self.register_buffer("d2t", torch.arange(cfg.draft_vocab, dtype=torch.long))
        if not isinstance(cfg.anchor_embed, bool):
            raise ValueError(f"anchor_embed must be true or false, got {str(cfg.anchor_embed)[:40]!r}")
        if cfg.anchor_feature not in ANCHOR_FEATURES:
            raise ValueError(f"anchor_feature must be one of {ANCHOR_FEATURES}, got {str(cfg.anchor_feature)[:40]!r}")
        if cfg.anchor_feature != "off":  # drawn outside the global RNG, so every other weight inits as without it
            with torch.random.fork_rng(devices=[]):
                self.feat = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)
        self._head_cache: tuple | None = None

    def set_draft_map(self, d2t: torch.Tensor) -> None:
        """Install the draft-to-target map [K] (checked: shape, range, uniqueness)."""
        check_draft_map(self.cfg, d2t, "draft vocabulary")
        self.d2t.copy_(d2t.to(torch.long))
        self._head_cache = None

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        check_draft_map(self.cfg, state_dict.get("d2t"), "drafter weights")
        self._head_cache = None
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def head_rows(self, weight: torch.Tensor) -> torch.Tensor:
        """The head's rows the drafter predicts over: all of `weight` [V, H], or its K draft-vocabulary rows
        (cached per head weight and version, so a decode gathers them once). A head prepacked for oneDNN
        (`--kernels onednn`) holds an opaque mkldnn weight that has no row gather: its
        rows are taken from a dense copy."""
        if not self.cfg.draft_vocab:
            return weight
        c = self._head_cache
        if c is None or c[0] is not weight or c[1] != weight._version or c[2].device != weight.device:
            with torch.no_grad():
                dense = weight.to_dense() if weight.is_mkldnn else weight
                c = (weight, weight._version, dense.index_select(0, self.d2t.to(weight.device)))
            self._head_cache = c
        return c[2]

    def logits(self, hidden: torch.Tensor, head: nn.Module) -> torch.Tensor:
        """Logits [.., V] in target ids of hidden rows [.., H], with or without a draft vocabulary."""
        if not self.cfg.draft_vocab:
            return head(hidden.to(head.weight.dtype))
        return self.full_logits(hidden, head)

    def draft_space_logits(self, hidden: torch.Tensor, head: nn.Module) -> torch.Tensor:
        """Logits [.., K] of hidden rows [.., H] over the draft vocabulary, column j for target id d2t[j]
        ([.., V] in target ids without a draft vocabulary): the head's product before any scatter."""
        w = self.head_rows(head.weight)
        logits = hidden.to(w.dtype) @ w.T
        bias = getattr(head, "bias", None)
        if bias is not None and bias.is_mkldnn:  # a prepacked head's bias (zeros where the head has none)
            bias = bias.to_dense()
        if bias is None:
            return logits
        return logits + (bias.index_select(0, self.d2t.to(bias.device)) if self.cfg.draft_vocab else bias)

    def draft_ids_ascending(self) -> bool:
        """Whether d2t lists its target ids in increasing order (prepare's maps do; a loaded map need not):
        then the tie rule's order over draft columns is its order over target ids."""
        if not self.cfg.draft_vocab:
            return False
        d = self.d2t
        return d.numel() < 2 or bool((d[1:] > d[:-1]).all())

    def full_logits(self, hidden: torch.Tensor, head: nn.Module) -> torch.Tensor:
        """Logits [.., V] in target ids of hidden rows [.., H]: the head over the draft vocabulary, scattered."""
        logits = self.draft_space_logits(hidden, head)
        if not self.cfg.draft_vocab:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.cfg.vocab_size), OOV_LOGIT)
        full[..., self.d2t.to(full.device)] = logits
        return full

    def fuse(self, taps: torch.Tensor) -> torch.Tensor:
        return self.hidden_norm(self.fc(taps))

    def block_input(self, anchors: torch.Tensor, embed: nn.Module) -> torch.Tensor:
        """[N] anchor ids -> [N, B+1, H]: the target's embeddings of [anchor, mask_token_id x B]."""
        ids = torch.cat([anchors.view(-1, 1), anchors.new_full((anchors.numel(), self.cfg.block_size),
                                                               self.cfg.mask_token_id)], dim=1)
        x = embed(ids)
        if self.cfg.anchor_embed:  # [anchor, MASK + anchor x B]
            x = torch.cat([x[:, :1], x[:, 1:] + x[:, :1]], dim=1)
        return x

    def with_feature(self, x: torch.Tensor, prev: torch.Tensor | None) -> torch.Tensor:
        """Block rows [N, M*(B+1), H] plus the projected fused row before each block's anchor, `prev`
        [N, M, H] (zeros where the anchor has no context), on the rows `anchor_feature` names."""
        if self.cfg.anchor_feature == "off" or prev is None:
            return x
        n, q, h = x.shape
        rows = torch.zeros(self.cfg.block_size + 1, dtype=torch.bool, device=x.device)  # the rows that get it
        rows[{"anchor": slice(0, 1), "mask": slice(1, None), "block": slice(None)}[self.cfg.anchor_feature]] = True
        add = self.feat(prev.to(x.dtype)).unsqueeze(2)  # [N, M, 1, H]
        blocks = x.view(n, -1, self.cfg.block_size + 1, h)
        return torch.where(rows.view(1, 1, -1, 1), blocks + add, blocks).reshape(n, q, h)

    def forward(self, x, taps, pos, ctx_pos, mask=None, prev_rows=None):
        """Training forward (inference drafts through `DraftState`): block inputs x [N, Q, H] at positions `pos`
        over the context taps [N, T, n_taps*H] at `ctx_pos`, under `mask` [N, 1, Q, T+Q]; returns the final-normed
        rows [N, Q, H]. `prev_rows` [N, M]: each block's context row before its anchor (-1: none), for
        `anchor_feature`. A module forward so DistributedDataParallel can wrap the drafter."""
        fused = self.fuse(taps)
        if self.cfg.anchor_feature != "off" and prev_rows is not None:
            idx = prev_rows.clamp(min=0).unsqueeze(-1).expand(-1, -1, fused.shape[-1])
            prev = fused.gather(1, idx) * (prev_rows >= 0).unsqueeze(-1).to(fused.dtype)
            x = self.with_feature(x, prev)
        h = x
        for layer in self.layers:
            ck, cv = layer.context_kv(fused, ctx_pos)
            h = layer(h, pos, ck, cv, mask)
        return self.final_norm(h)

    def run_block(self, x, pos, ctx, mask=None):
        """ctx: list of (k, v) per layer. Returns final-normed hidden rows of the B mask positions."""
        for layer, (ck, cv) in zip(self.layers, ctx):
            x = layer(x, pos, ck, cv, mask)
        return self.final_norm(x[:, 1:])


class DraftState:
    """Incremental drafter context: per-layer context K/V for the committed rows seen so far."""

    def __init__(self, drafter: DFlashDrafter):
        self.drafter = drafter
        self.length = 0
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.last: torch.Tensor | None = None  # the last fused context row [H] (`anchor_feature`)

    @torch.inference_mode()
    def extend(self, taps: torch.Tensor) -> None:
        """Append context rows [n, n_taps*H] at the next positions."""
        if taps is None or taps.shape[0] == 0:
            return
        d = self.drafter
        p = next(d.parameters())
        fused = d.fuse(taps.to(p.dtype).to(p.device).unsqueeze(0))
        pos = torch.arange(self.length, self.length + taps.shape[0], device=p.device)
        new = [layer.context_kv(fused, pos) for layer in d.layers]
        if self.kv is None:
            self.kv = new
        else:
            self.kv = [(torch.cat([k, nk], 2), torch.cat([v, nv], 2)) for (k, v), (nk, nv) in zip(self.kv, new)]
        self.last = fused[0, -1]
        self.length += taps.shape[0]

    @torch.inference_mode()
    def draft(self, anchor: int, embed: nn.Module, head: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [B, V] and hidden rows [B, H] for the block anchored at the next position."""
        hidden = self.draft_hidden(anchor, embed)
        return self.drafter.logits(hidden, head), hidden

    @torch.inference_mode()
    def draft_hidden(self, anchor: int, embed: nn.Module) -> torch.Tensor:
        """The block's hidden rows [B, H] without the head: a caller drafting many blocks from one context
        applies the head to all of them at once (`DFlashDrafter.logits`), which streams its weight once."""
        d = self.drafter
        p = next(d.parameters())
        x = d.block_input(torch.tensor([anchor], device=p.device), embed).to(p.dtype)
        if d.cfg.anchor_feature != "off":
            prev = self.last if self.last is not None else x.new_zeros(d.cfg.hidden_size)
            x = d.with_feature(x, prev.view(1, 1, -1))
        pos = torch.arange(self.length, self.length + d.cfg.block_size + 1, device=p.device)
        ctx = self.kv if self.kv is not None else [
            (x.new_zeros(1, d.cfg.num_kv_heads, 0, d.cfg.head_dim),) * 2 for _ in d.layers]
        return d.run_block(x, pos, ctx)[0]


@torch.inference_mode()
def anchored_blocks(drafter: DFlashDrafter, taps: torch.Tensor, anchors: torch.Tensor, ids: torch.Tensor,
                    embed: nn.Module) -> torch.Tensor:
    """The hidden rows [M, B, H] of M blocks drafted from one sequence, all in one forward: block m is anchored at
    position anchors[m] (token ids[m]) and reads the context rows < anchors[m] of the sequence's taps [T, F].

    What `DraftState.draft_hidden` gives at each anchor after extending the state to it, up to the float
    summation order (the context's K/V computed once for all T rows, the later rows masked out per block), at
    one pass over the weights instead of one per anchor: the fits' examples draft every anchor of a trajectory,
    and per anchor a block of 17 rows streams every drafter weight from memory.
    """
    d = drafter
    p = next(d.parameters())
    anchors, ids = anchors.to(device=p.device, dtype=torch.long), ids.to(device=p.device, dtype=torch.long)
    if anchors.dim() != 1 or ids.shape != anchors.shape:
        raise ValueError(f"anchors and ids must be two [M] tensors, got {tuple(anchors.shape)} and {tuple(ids.shape)}")
    if anchors.numel() and not (0 <= int(anchors.min()) and int(anchors.max()) <= taps.shape[0]):
        raise ValueError(f"anchors must lie in 0..{taps.shape[0]} (the context rows the taps hold)")
    fused = d.fuse(taps.to(device=p.device, dtype=p.dtype).unsqueeze(0))  # [1, T, H]
    t, m, rows = fused.shape[1], anchors.numel(), d.cfg.block_size + 1
    x = d.block_input(ids, embed).to(p.dtype)  # [M, B+1, H]
    if d.cfg.anchor_feature != "off":  # the fused row before each anchor, as DraftState.last holds it (none: zeros)
        prev = fused[0].index_select(0, (anchors - 1).clamp(min=0)) if t else x.new_zeros(m, x.shape[-1])
        x = d.with_feature(x, (prev * (anchors > 0).unsqueeze(-1).to(prev.dtype)).unsqueeze(1))
    pos = anchors.unsqueeze(1) + torch.arange(rows, device=p.device)  # [M, B+1]
    seen = torch.arange(t, device=p.device) < anchors.unsqueeze(1)  # [M, T]: context rows each block reads
    mask = torch.cat([seen, seen.new_ones(m, rows)], dim=1).view(m, 1, 1, t + rows)
    ctx = []
    for layer in d.layers:
        k, v = layer.context_kv(fused, torch.arange(t, device=p.device))
        ctx.append((k.expand(m, -1, -1, -1), v.expand(m, -1, -1, -1)))
    return d.run_block(x, pos, ctx, mask)


def parameter_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def init_drafter(cfg: DrafterConfig, seed: int) -> DFlashDrafter:
    torch.manual_seed(seed)
    d = DFlashDrafter(cfg)
    for _name, p in d.named_parameters():
        if p.dim() == 2:
            nn.init.normal_(p, std=1.0 / math.sqrt(p.shape[1]))
    if cfg.anchor_feature != "off":  # silent at init: the drafter starts as upstream's and the feature grows in (at
        nn.init.zeros_(d.feat.weight)  # the generic scale its normed input swamped the target's small embeddings)
    return d
