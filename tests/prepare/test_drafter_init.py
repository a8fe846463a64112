"""A drafter initialised from the target's last attention layers (prepare/drafter_init.py): the copied weights are
the target's, shapes come from the target (LFM2's adjusted MLP width included), a mismatch is refused by name."""

from __future__ import annotations

import pytest
import torch

from dflash_core.errors import BadInputError
from dflash_core.prepare.drafter_init import attention_layers, init_from_target, target_shaped
from dflash_core.runtime.drafter import DrafterConfig, init_drafter


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=80, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True)
    return LlamaForCausalLM(cfg).eval()


def _base(model) -> DrafterConfig:
    return DrafterConfig(hidden_size=model.config.hidden_size, vocab_size=model.config.vocab_size, taps=(1,),
                         block_size=4, num_layers=2, num_heads=2, intermediate_size=16)


def test_the_last_layers_are_copied_into_a_target_shaped_drafter():
    """Break: copy the first layers, or skip the MLP, and the comparison fails."""
    model = _llama()
    cfg = target_shaped(_base(model), model)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size) == (4, 2, 8, 80)
    d = init_drafter(cfg, 1)
    used = init_from_target(d, model)
    assert used == [1, 2]
    for dl, i in zip(d.layers, used):
        src = model.model.layers[i]
        assert torch.equal(dl.q.weight, src.self_attn.q_proj.weight)
        assert torch.equal(dl.o.weight, src.self_attn.o_proj.weight)
        assert torch.equal(dl.down.weight, src.mlp.down_proj.weight)
        assert torch.equal(dl.in_norm.weight, src.input_layernorm.weight)
        assert torch.equal(dl.q_norm.weight, torch.ones_like(dl.q_norm.weight))  # a Llama layer has none


def test_lfm2_uses_its_attention_layers_and_its_adjusted_mlp_width():
    from dflash_core.testing import TinySpec, build_tiny

    model = build_tiny(TinySpec(dtype="float32"))
    attn = attention_layers(model)
    assert attn and all(model.config.layer_types[i] == "full_attention" for i in attn)
    cfg = target_shaped(_base(model), model)
    last = model.model.layers[attn[-1]]
    assert cfg.intermediate_size == last.feed_forward.w1.weight.shape[0]
    d = init_drafter(DrafterConfig(**{**cfg.to_dict(), "taps": (1,), "num_layers": 1}), 1)
    init_from_target(d, model)
    assert torch.equal(d.layers[0].k_norm.weight, last.self_attn.k_layernorm.weight)


def test_a_drafter_of_another_shape_is_refused_by_name():
    model = _llama()
    with pytest.raises(BadInputError, match="target_shaped"):
        init_from_target(init_drafter(_base(model), 1), model)


def test_a_checkpoint_of_another_initialisation_is_not_resumed():
    """The init hook's record is part of the checkpoint key, so a killed run resumes only its own initialisation
    (no record: the key is what it always was). Break: leave `init` out of the key and the keys are equal."""
    from dflash_core.prepare.teacher import TeacherData
    from dflash_core.prepare.train import TrainConfig, _checkpoint_key

    data, cfg, tcfg = TeacherData([[1, 2, 3]], [1], None), _base(_llama()), TrainConfig()
    plain = _checkpoint_key(data, cfg, tcfg)
    assert _checkpoint_key(data, cfg, tcfg, None) == plain
    assert _checkpoint_key(data, cfg, tcfg, {"from": "target", "layers": [1, 2]}) != plain
