"""The drafter's large-vocabulary loss: chunked linear cross-entropy is the exact cross-entropy (float64), its
gradient is autograd's, soft targets give -sum p log q, bf16 matmuls stay close, and the importance-sampled
rows estimate the position-decayed loss without bias."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from dflash_core.prepare.loss import chunk_rows, linear_cross_entropy
from dflash_core.prepare.train import block_loss, sample_rows
from dflash_core.runtime.drafter import DrafterConfig, init_drafter


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
def test_chunked_loss_and_gradient_equal_full_cross_entropy_in_float64(chunk):
    torch.manual_seed(0)
    h = torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(300, 16, dtype=torch.float64)
    y = torch.randint(300, (50,))
    weights = torch.rand(50, dtype=torch.float64)
    loss, top = linear_cross_entropy(h, w, y, chunk=chunk)
    (loss * weights).sum().backward()
    got = h.grad.clone()
    h.grad = None
    ref = F.cross_entropy(h @ w.T, y, reduction="none")
    (ref * weights).sum().backward()
    torch.testing.assert_close(loss, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(got, h.grad, rtol=0, atol=1e-12)
    assert torch.equal(top, (h @ w.T).argmax(-1))


def test_soft_targets_are_minus_sum_p_log_q():
    torch.manual_seed(1)
    h = torch.randn(20, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(40, 8, dtype=torch.float64)
    ids = torch.randint(40, (20, 4))
    ids[:, 1] = ids[:, 0]  # a repeated id (label also in the top-k) must count twice, as the formula says
    probs = torch.softmax(torch.randn(20, 4, dtype=torch.float64), -1)
    loss, _ = linear_cross_entropy(h, w, ids, probs, chunk=6)
    loss.sum().backward()
    got = h.grad.clone()
    h.grad = None
    ref = -(probs * torch.log_softmax(h @ w.T, -1).gather(1, ids)).sum(-1)
    ref.sum().backward()
    torch.testing.assert_close(loss, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(got, h.grad, rtol=0, atol=1e-12)


def test_bfloat16_matmuls_stay_close_to_float32():
    torch.manual_seed(2)
    h = torch.randn(64, 32)
    w = torch.randn(500, 32) * 0.2
    y = torch.randint(500, (64,))
    exact, _ = linear_cross_entropy(h, w, y)
    fast, _ = linear_cross_entropy(h, w, y, compute_dtype=torch.bfloat16)
    assert fast.dtype == torch.float32
    torch.testing.assert_close(fast, exact, rtol=0.02, atol=0.02)


def test_chunks_bound_the_logits_held_at_once():
    assert chunk_rows(65536) * 65536 <= 1 << 25 and chunk_rows(2048) == 16384


def test_sampled_rows_estimate_the_full_loss_without_bias():
    torch.manual_seed(3)
    cfg = DrafterConfig(hidden_size=16, vocab_size=30, taps=(0,), block_size=6, num_layers=1, num_heads=2,
                        intermediate_size=32)
    d = init_drafter(cfg, 0).double()
    embed = torch.nn.Embedding(30, 16).double()
    head = torch.nn.Linear(16, 30, bias=False).double()
    tok = torch.randint(30, (2, 24))
    ft = torch.randn(2, 24, 16, dtype=torch.float64)
    anc = torch.tensor([[3, 9, 14], [5, 11, 16]])
    with torch.no_grad():
        full, _ = block_loss(d, embed, head, tok, ft, anc, 2.0)
        gen = torch.Generator().manual_seed(0)
        draws = [block_loss(d, embed, head, tok, ft, anc, 2.0, keep=sample_rows(2, 3, 6, 2.0, gen))[0]
                 for _ in range(3000)]
        keep = sample_rows(2, 3, 6, 2.0, torch.Generator().manual_seed(1))
    mean = torch.stack(draws).mean()
    assert abs(float(mean / full) - 1) < 0.02  # unbiased: the sampling error of 3000 draws is well under 2 %
    assert bool(keep[..., 0].all()) and 0 < int(keep.sum()) < keep.numel()  # the first row always, not all rows


def test_the_feature_term_is_the_decayed_cosine_gap_to_the_tap_at_the_row_predicting_each_label():
    from dflash_core.prepare.train import block_inputs

    torch.manual_seed(4)
    cfg = DrafterConfig(hidden_size=16, vocab_size=30, taps=(0, 1), block_size=5, num_layers=1, num_heads=2,
                        intermediate_size=32)
    d = init_drafter(cfg, 0).double()
    embed = torch.nn.Embedding(30, 16).double()
    head = torch.nn.Linear(16, 30, bias=False).double()
    tok = torch.randint(30, (2, 20))
    ft = torch.randn(2, 20, 32, dtype=torch.float64)  # two taps: the regression target is the last one
    anc = torch.tensor([[2, 7, 11], [4, 9, 13]])
    gamma = 3.0
    with torch.no_grad():
        base, _ = block_loss(d, embed, head, tok, ft, anc, gamma)
        with_feat, _ = block_loss(d, embed, head, tok, ft, anc, gamma, feature_weight=0.7)
        x, pos, ctx_pos, mask = block_inputs(d, embed, tok, anc)
        h = d(x, ft, pos, ctx_pos, mask, None).view(2, 3, 6, -1)[:, :, 1:]
    want, wsum = 0.0, sum(math.exp(-j / gamma) for j in range(5))
    for i in range(2):
        for m in range(3):
            for j in range(5):  # block row j+1 drafts label a+j+1, which the target's row a+j predicted
                tgt = ft[i, int(anc[i, m]) + j, 16:]
                want += math.exp(-j / gamma) * (1 - float(F.cosine_similarity(h[i, m, j], tgt, dim=0)))
    want /= 2 * 3 * wsum
    assert float(with_feat - base) == pytest.approx(0.7 * want, rel=1e-9)


@pytest.mark.parametrize("bad", [-0.1, 101, True, "1", float("nan")])
def test_bad_feature_weights_are_refused(bad):
    from dflash_core.errors import BadInputError
    from dflash_core.prepare.train import check_feature_weight

    with pytest.raises(BadInputError, match="feature_weight"):
        check_feature_weight(bad)


@pytest.mark.parametrize("knob, value", [("feature_weight", 0.5), ("select", "loss"), ("select", "accepted")])
def test_late_train_knobs_are_left_out_of_the_recorded_config_at_their_default_and_recorded_when_set(knob, value):
    from dataclasses import replace

    from dflash_core.prepare.pipeline import PrepareConfig

    cfg = PrepareConfig()
    assert knob not in cfg.to_dict()["train"]  # homes and the reference bundle stay current
    assert replace(cfg, train=replace(cfg.train, **{knob: value})).to_dict()["train"][knob] == value


def test_an_explicit_accuracy_rule_records_what_drafters_selected_before_the_knob_were_recorded_with():
    from dataclasses import replace

    from dflash_core.prepare.pipeline import PrepareConfig

    cfg = PrepareConfig()
    assert replace(cfg, train=replace(cfg.train, select="accuracy")).to_dict() == cfg.to_dict()


@pytest.mark.parametrize("top_k, weight, match", [
    (-1, 0.5, "distill_top_k"), (4096, 0.5, "distill_top_k"), (True, 0.5, "distill_top_k"),
    (8.0, 0.5, "distill_top_k"), (8, 1.5, "distill_weight"), (8, -0.1, "distill_weight"),
    (8, float("nan"), "distill_weight"), (8, "1", "distill_weight"),
])
def test_prepare_refuses_bad_distillation_knobs_before_any_work(tmp_path, top_k, weight, match):
    # a weight above 1 gave the label a negative probability: the soft cross-entropy then rewards missing it
    from dataclasses import replace

    from dflash_core.errors import BadInputError
    from dflash_core.prepare.pipeline import PrepareConfig, prepare
    from dflash_core.prepare.train import TrainConfig

    cfg = PrepareConfig(train=replace(TrainConfig(), distill_top_k=top_k, distill_weight=weight))
    with pytest.raises(BadInputError, match=match):
        prepare("mini", home=tmp_path / "home", cfg=cfg, progress=False)
    assert not (tmp_path / "home").exists()
