"""A drafter initialised from the target's last decoder layers (EAGLE and DFlash drafters are target-shaped layers).

Why: a drafter trained from random init on 2 CPU cores sees ~1M labels, far too few for a real checkpoint (SmolLM2:
31 % right at the first drafted position, training accuracy equal to held-out: underfit). The target's own last
layers already map residual-stream states to next-token features, so starting the drafter's attention and MLP from
them gives training a head start. Only the shapes that match are copied: the drafter config must use the target
layer's heads, KV heads, head dim and MLP width (`target_shaped`); its per-head q/k norms (which a Llama layer
lacks) start at ones, the context fusion `fc` stays random.

Supported layer layouts (transformers' module names): Llama-style (`self_attn.{q,k,v,o}_proj`,
`mlp.{gate,up,down}_proj`, `input_layernorm`, `post_attention_layernorm`) and LFM2 attention layers
(`self_attn.{q,k,v}_proj`, `self_attn.out_proj`, `self_attn.{q,k}_layernorm`, `feed_forward.{w1,w3,w2}`,
`operator_norm`, `ffn_norm`); LFM2's conv layers are skipped (the last attention layers are used).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..errors import BadInputError
from ..runtime.drafter import DFlashDrafter, DrafterConfig

# drafter name -> candidate target names, first match wins
_ATTN = {"q": ("q_proj",), "k": ("k_proj",), "v": ("v_proj",), "o": ("o_proj", "out_proj")}
_MLP = {"gate": ("gate_proj", "w1"), "up": ("up_proj", "w3"), "down": ("down_proj", "w2")}
_NORMS = {"in_norm": ("input_layernorm", "operator_norm"), "mlp_norm": ("post_attention_layernorm", "ffn_norm")}
_QK_NORMS = {"q_norm": ("q_layernorm", "q_norm"), "k_norm": ("k_layernorm", "k_norm")}


def _first(module, names):
    for n in names:
        m = getattr(module, n, None)
        if m is not None:
            return m
    return None


def _mlp_of(layer):
    return _first(layer, ("mlp", "feed_forward"))


def attention_layers(model) -> list[int]:
    """Indexes of the target's decoder layers that have a copyable attention block and MLP, in order."""
    inner = getattr(model, "model", model)
    out = []
    for i, layer in enumerate(getattr(inner, "layers", [])):
        attn, mlp = getattr(layer, "self_attn", None), _mlp_of(layer)
        if attn is not None and mlp is not None and all(_first(attn, n) is not None for n in _ATTN.values()) \
                and all(_first(mlp, n) is not None for n in _MLP.values()):
            out.append(i)
    return out


def target_shaped(dcfg: DrafterConfig, model) -> DrafterConfig:
    """`dcfg` with the target layer's attention and MLP shapes and rope theta (what copying needs). The MLP width
    is read from the last attention layer's gate weight (LFM2 adjusts its configured width)."""
    config = model.config
    idx = attention_layers(model)
    if not idx:
        raise BadInputError("the target has no layer with a copyable attention block and MLP: use a random init")
    gate = _first(_mlp_of(getattr(model, "model", model).layers[idx[-1]]), _MLP["gate"])
    heads = int(config.num_attention_heads)
    kv = int(getattr(config, "num_key_value_heads", None) or heads)
    hd = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    rope = getattr(config, "rope_parameters", None) or {}
    theta = float(rope.get("rope_theta") or getattr(config, "rope_theta", None) or dcfg.rope_theta)
    return replace(dcfg, num_heads=heads, kv_heads=kv, attn_head_dim=hd, intermediate_size=int(gate.weight.shape[0]),
                   rope_theta=theta)


@torch.no_grad()
def init_from_target(drafter: DFlashDrafter, model) -> list[int]:
    """Copy the target's last `num_layers` attention layers into the drafter's layers (in order); returns the
    target layer indexes used. Refuses a shape mismatch with the layer and tensor named (call `target_shaped`)."""
    idx = attention_layers(model)[-drafter.cfg.num_layers:]
    if len(idx) < drafter.cfg.num_layers:
        raise BadInputError(f"the target has {len(idx)} copyable attention layers, the drafter "
                            f"{drafter.cfg.num_layers}")
    inner = getattr(model, "model", model)
    for dl, i in zip(drafter.layers, idx):
        src = inner.layers[i]
        pairs = [(getattr(dl, d), _first(src.self_attn, t)) for d, t in _ATTN.items()]
        pairs += [(getattr(dl, d), _first(_mlp_of(src), t)) for d, t in _MLP.items()]
        pairs += [(getattr(dl, d), _first(src, t)) for d, t in _NORMS.items()]
        pairs += [(getattr(dl, d), _first(src.self_attn, t)) for d, t in _QK_NORMS.items()]
        for dst, s in pairs:
            if s is None:
                continue  # a norm the target layer lacks stays at its init (ones)
            if dst.weight.shape != s.weight.shape:
                raise BadInputError(f"target layer {i}: weight {tuple(s.weight.shape)} does not fit the drafter's "
                                    f"{tuple(dst.weight.shape)}: shape the drafter with drafter_init.target_shaped")
            dst.weight.copy_(s.weight.to(dst.weight.dtype))
    return idx
