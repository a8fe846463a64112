"""A Llama-family checkpoint as target (a 135M Llama went through prepare): load_target, taps,
exact rollback, prepare and every speculative method stay token-exact against greedy (float64), and the mask
token passes over a pad that doubles as EOS."""

from __future__ import annotations

import pytest

from dflash_core.prepare.drafter_format import mask_token_for
from dflash_core.runtime.decode import greedy, speculative


def tiny_llama(dtype: str = "float32", **over):
    from dflash_core.testing import build_tiny_llama

    return build_tiny_llama(dtype, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2, **over)


@pytest.fixture(scope="module")
def llama_lab(tmp_path_factory):
    from dflash_core.prepare.pipeline import prepare
    from dflash_core.runtime.target import load_target
    from dflash_core.testing import tiny_prepare_config

    root = tmp_path_factory.mktemp("llama")
    tiny_llama().save_pretrained(root / "ckpt")
    rt32 = load_target(str(root / "ckpt"), "cpu", "float32")
    prepare(str(root / "ckpt"), home=root / "home", cfg=tiny_prepare_config(), rt=rt32, progress=False)
    return root


def test_mask_token_skips_a_pad_that_is_eos():
    assert mask_token_for(tiny_llama().config) == 0  # pad 2 == eos 2: unk is unset, so id 0
    assert mask_token_for(tiny_llama(unk_token_id=5).config) == 5
    from dflash_core.testing import TinySpec, tiny_config

    assert mask_token_for(tiny_config(TinySpec())) == 0  # LFM2: its own pad token, as before


def test_llama_rollback_and_taps_are_exact(llama_lab):
    from dflash_core.runtime.target import load_target

    rt = load_target(str(llama_lab / "ckpt"), "cpu", "float64")
    ref, _ = greedy(rt, [5, 6, 7], 12)
    s = rt.session()
    out = s.prefill([5, 6, 7], taps=(0, 3))
    assert out.hidden.shape == (3, 2 * 48) and out.ids == ref[:1]
    s.verify([ref[0], 1, 2, 3])  # three wrong drafts, rolled back
    s.rollback(3)
    assert s.verify([ref[1]]).ids == [ref[2]]


@pytest.mark.exactness
def test_every_method_is_exact_on_a_prepared_llama(llama_lab):
    from dflash_core.methods import get_method, speculative_ids
    from dflash_core.prepare.prepared import load_prepared
    from dflash_core.runtime.target import load_target

    rt = load_target(str(llama_lab / "ckpt"), "cpu", "float64")
    prep = load_prepared(load_target(str(llama_lab / "ckpt"), "cpu", "float32"), home=llama_lab / "home")
    prep.drafter = prep.drafter.double()
    assert prep.manifest["target"]["model_type"] == "llama"
    for prompt in ([5], list(range(3, 30))):
        ref, _ = greedy(rt, prompt, 24)
        for method in speculative_ids():
            for w in (1, 4):
                got, _ = speculative(rt, get_method(method).build(rt, prep), prompt, 24, w, method=method)
                assert got == ref, (method, w)


def test_the_assisted_decoding_peer_builds_for_a_llama(llama_lab):
    """The benchmark's assisted-decoding reference truncates the target to its first half of layers; a Llama
    config has no per-layer kinds to truncate (it failed with AttributeError on SmolLM2)."""
    import torch

    from dflash_core.bench.peers import early_exit_assistant
    from dflash_core.runtime.target import load_target

    rt = load_target(str(llama_lab / "ckpt"), "cpu", "float32")
    m = early_exit_assistant(rt)
    assert len(m.model.layers) == m.config.num_hidden_layers == 2 and rt.num_layers == 4
    out = rt.model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=6, do_sample=False, assistant_model=m,
                            pad_token_id=0)
    ref, _ = greedy(rt, [5, 6, 7], 6)
    assert out[0, 3:].tolist() == ref


def test_the_peer_rows_decode_through_an_eos_that_greedy_emits(llama_lab):
    """transformers' generate stops at EOS, and min_new_tokens only forbids it, so on SmolLM2, whose greedy
    emitted `<|im_end|>` inside a benchmark prompt's 32 tokens, every peer row diverged from greedy and the run
    exited 1. Here the EOS id is a token greedy emits mid-decode: each peer must still give greedy's ids."""
    from dflash_core.bench.peers import REFERENCES, reference_runner
    from dflash_core.prepare.prepared import load_prepared
    from dflash_core.runtime.target import load_target

    rt = load_target(str(llama_lab / "ckpt"), "cpu", "float32")
    prep = load_prepared(rt, home=llama_lab / "home")
    prompts = [[5, 6, 7], list(range(3, 30))]
    refs = [greedy(rt, p, 16)[0] for p in prompts]
    eos = next(t for t in refs[0][2:] if t not in refs[0][:2])  # first emitted after two other ids
    rt.model.generation_config.eos_token_id = eos
    for kind in REFERENCES:
        outs, _ = reference_runner(rt, prompts, refs, 16, kind, prep)()
        assert outs == refs, kind
    assert rt.model.generation_config.eos_token_id == eos  # restored after each pass
