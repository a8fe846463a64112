"""Tiny hybrid LFM2 builders for tests and quick checks.

Init std >= 0.1 on purpose: with the default 0.02 and tied embeddings a tiny model's greedy output just
echoes tokens, and a broken conv-state rollback goes unnoticed (docs/design.md §3).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .prepare import minitarget as mt
from .prepare.pipeline import PrepareConfig, prepare
from .prepare.train import TrainConfig
from .runtime.target import load_target

# Layer patterns the exactness tests sweep: conv-first, attention-first, mixed, conv-heavy.
PATTERNS: dict[str, tuple[str, ...]] = {
    "CACA": ("conv", "full_attention", "conv", "full_attention"),
    "ACCA": ("full_attention", "conv", "conv", "full_attention"),
    "CCAC": ("conv", "conv", "full_attention", "conv"),
    "CCACAC": ("conv", "conv", "full_attention", "conv", "full_attention", "conv"),
}

# The real LFM2-350M layout (docs/design.md, "The real LFM2-350M layout").
REAL_350M_ATTENTION = (2, 5, 8, 10, 12, 14)


@dataclass(frozen=True)
class TinySpec:
    pattern: str = "CACA"
    vocab_size: int = 96
    hidden_size: int = 48
    intermediate_size: int = 96
    num_heads: int = 4
    num_kv_heads: int = 2
    max_position_embeddings: int = 256
    init_std: float = 0.2
    seed: int = 0
    dtype: str = "float64"


def tiny_config(spec: TinySpec):
    from transformers import Lfm2Config

    layer_types = list(PATTERNS[spec.pattern])
    return Lfm2Config(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=len(layer_types), layer_types=layer_types, num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads, block_auto_adjust_ff_dim=False,
        max_position_embeddings=spec.max_position_embeddings, initializer_range=spec.init_std,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=True)


def build_tiny(spec: TinySpec = TinySpec()):
    """A seeded random tiny Lfm2ForCausalLM in eval mode, in spec.dtype."""
    import torch
    from transformers import Lfm2ForCausalLM

    torch.manual_seed(spec.seed)
    model = Lfm2ForCausalLM(tiny_config(spec)).to(getattr(torch, spec.dtype)).eval()
    return model


def build_tiny_llama(dtype: str = "float64", seed: int = 0, **over):
    """A random 4-layer Llama (vocab 96, hidden 48, grouped KV heads): the attention-only type beside the tiny LFM2,
    for checks that must hold for both (right or left padding, RoPE positions); `over` sets other config fields."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=96, hidden_size=48, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2, **over)
    return LlamaForCausalLM(cfg).to(getattr(torch, dtype)).eval()


def real_350m_config(dtype: str = "float32"):
    """LFM2-350M's architecture: hidden 1024, 16 layers (attention at 2,5,8,10,12,14), vocab 65536."""
    from transformers import Lfm2Config

    layer_types = ["full_attention" if i in REAL_350M_ATTENTION else "conv" for i in range(16)]
    return Lfm2Config(
        vocab_size=65536, hidden_size=1024, intermediate_size=6656, block_auto_adjust_ff_dim=True,
        block_multiple_of=256, block_ffn_dim_multiplier=1.0, num_hidden_layers=16, layer_types=layer_types,
        num_attention_heads=16, num_key_value_heads=8, conv_L_cache=3, conv_bias=False,
        max_position_embeddings=128000, rope_theta=1000000.0, norm_eps=1e-5, bos_token_id=1, eos_token_id=7,
        pad_token_id=0, tie_word_embeddings=True, initializer_range=0.02, dtype=dtype)


def build_real_350m(dtype: str = "float32", seed: int = 0):
    """Random-weight 350M LFM2, built directly in its dtype to halve peak memory."""
    import torch
    from transformers import Lfm2ForCausalLM

    torch.manual_seed(seed)
    td = getattr(torch, dtype)
    prev = torch.get_default_dtype()
    try:
        if td.is_floating_point:
            torch.set_default_dtype(td)
        model = Lfm2ForCausalLM(real_350m_config(dtype))
    finally:
        torch.set_default_dtype(prev)
    return model.eval()


def tiny_prepare_config():
    """A prepare configuration that runs every step and fitter in seconds (for tests only)."""
    return PrepareConfig(traj_tokens=24, random_seeds=12, n_taps=2, block_size=4, drafter_heads=4,
                         train=TrainConfig(steps=20, batch_sequences=4, anchors_per_sequence=4),
                         aux_steps=10, aux_max_examples=64)


def build_tiny_lab(root, *, progress: bool = False) -> dict:
    """A tiny hybrid LFM2 with a real byte-level tokenizer saved to `root/ckpt`, prepared (every fitter, in
    miniature) into `root/home`: a whole lab target in seconds (benchmark plugin tests, GPU smoke checks)."""
    root = Path(root)
    ckpt, home = root / "ckpt", root / "home"
    tcfg = mt.MiniTargetConfig(vocab_size=320, corpus_files=3, threads=1)
    tok = mt.train_tokenizer(mt.corpus_texts(tcfg), tcfg)
    build_tiny(TinySpec(dtype="float32", pattern="CCACAC", vocab_size=len(tok))).save_pretrained(ckpt)
    tok.save_pretrained(ckpt)
    rt = load_target(str(ckpt), "cpu", "float32")
    prepare(str(ckpt), home=home, cfg=tiny_prepare_config(), rt=rt, progress=progress)
    return {"ckpt": ckpt, "home": home, "tokenizer": rt.tokenizer is not None}

