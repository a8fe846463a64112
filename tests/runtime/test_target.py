"""Target runtime: the real from_pretrained path (through a locally saved checkpoint) and the 350M config."""

from __future__ import annotations

import pytest

from dflash_core.runtime.decode import greedy, speculative
from dflash_core.runtime.proposers import OracleProposer
from dflash_core.runtime.target import load_target
from dflash_core.testing import TinySpec, build_real_350m, build_tiny


def test_save_pretrained_round_trip_is_exact(tmp_path):
    model = build_tiny(TinySpec(pattern="CCACAC", dtype="float32"))
    model.save_pretrained(tmp_path / "ckpt")
    rt = load_target(str(tmp_path / "ckpt"), "cpu", "float64")
    assert rt.info["kind"] == "local"
    assert [layer for layer in rt.config.layer_types].count("conv") == 4
    prompt = [3, 14, 15, 92, 65]
    ref, _ = greedy(rt, prompt, 24)
    got, stats = speculative(rt, OracleProposer(prompt, ref, rt.vocab_size, frozenset({1, 5, 6})), prompt, 24, 4)
    assert got == ref
    assert stats.target_calls < 24


def test_verify_returns_taps_for_every_block_row():
    from dflash_core.runtime.target import TargetRuntime

    rt = TargetRuntime.from_model(build_tiny(TinySpec()))
    sess = rt.session()
    pre = sess.prefill([1, 2, 3, 4], taps=(0, 2))
    assert pre.hidden.shape == (4, 2 * rt.hidden_size)
    out = sess.verify([pre.ids[0], 7, 8], taps=(0, 2))
    assert len(out.ids) == 3 and out.hidden.shape == (3, 2 * rt.hidden_size)


@pytest.mark.slow
def test_real_350m_config_random_weights_is_exact(tmp_path):
    """The real LFM2-350M layout, built directly in float32, saved and reloaded through from_pretrained."""
    model = build_real_350m("float32")
    assert model.config.layer_types.count("full_attention") == 6
    assert sum(p.numel() for p in model.parameters()) > 300e6
    model.save_pretrained(tmp_path / "lfm2-350m-random")
    del model
    rt = load_target(str(tmp_path / "lfm2-350m-random"), "cpu", "float32")
    prompt = [1, 1000, 2000, 3000, 4000, 5000]
    ref, gstats = greedy(rt, prompt, 12, record_margins=True)
    assert len(set(ref)) > 1  # non-degenerate at this size even with std 0.02
    got, _ = speculative(rt, OracleProposer(prompt, ref, rt.vocab_size, frozenset({2, 7})), prompt, 12, 4)
    from dflash_core.runtime.exactness import classify

    assert classify(got, ref, gstats.margins, rt.dtype).ok
