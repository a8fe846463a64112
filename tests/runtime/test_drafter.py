"""DFlash drafter: shapes, the incremental context cache, and the training block mask."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from dflash_core.prepare.train import block_loss
from dflash_core.runtime.drafter import DrafterConfig, DraftState, anchored_blocks, default_taps, init_drafter

H, V, B = 32, 50, 4


@pytest.fixture(scope="module")
def parts():
    torch.manual_seed(0)
    cfg = DrafterConfig(hidden_size=H, vocab_size=V, taps=(0, 2), block_size=B, num_layers=2, num_heads=4,
                        intermediate_size=64)
    d = init_drafter(cfg, seed=1).double().eval()
    embed = torch.nn.Embedding(V, H).double()
    head = torch.nn.Linear(H, V, bias=False).double()
    feats = torch.randn(20, 2 * H, dtype=torch.float64)
    toks = torch.randint(0, V, (20,))
    return d, embed, head, feats, toks


def test_default_taps_follow_upstream_rule():
    assert default_taps(16, 1) == (8,)
    assert default_taps(16, 3) == (1, 7, 13)
    assert default_taps(16, 4) == (1, 5, 9, 13)
    assert default_taps(6, 2) == (1, 3)


def test_draft_shapes(parts):
    d, embed, head, feats, toks = parts
    st = DraftState(d)
    st.extend(feats[:7])
    logits, hidden = st.draft(int(toks[7]), embed, head)
    assert logits.shape == (B, V) and hidden.shape == (B, H)
    assert st.length == 7


def test_incremental_extend_equals_one_shot(parts):
    d, embed, head, feats, toks = parts
    a, b = DraftState(d), DraftState(d)
    a.extend(feats[:12])
    for lo, hi in ((0, 3), (3, 4), (4, 12)):
        b.extend(feats[lo:hi])
    la, _ = a.draft(int(toks[12]), embed, head)
    lb, _ = b.draft(int(toks[12]), embed, head)
    torch.testing.assert_close(la, lb, rtol=0, atol=1e-12)


def _masked_logits(d, embed, head, feats, toks, anchors):
    """The training path: all anchors of one sequence in one masked forward."""
    with torch.no_grad():
        fused = d.fuse(feats.unsqueeze(0))
        T = feats.shape[0]
        ctx = [layer.context_kv(fused, torch.arange(T).view(1, T)) for layer in d.layers]
        anc = torch.tensor([anchors])
        M = len(anchors)
        pos = (anc.unsqueeze(-1) + torch.arange(B + 1)).view(1, -1)
        x = torch.cat([d.block_input(toks[a].view(1), embed) for a in anchors], dim=1)
        q_blk = torch.arange(M).repeat_interleave(B + 1)
        ctx_ok = torch.arange(T).view(1, 1, T) < anc.repeat_interleave(B + 1, dim=1).unsqueeze(-1)
        blk_ok = (q_blk.view(-1, 1) == q_blk.view(1, -1)).unsqueeze(0)
        mask = torch.cat([ctx_ok, blk_ok], -1).unsqueeze(1)
        h = x
        for layer, (ck, cv) in zip(d.layers, ctx):
            h = layer(h, pos, ck, cv, mask)
        h = d.final_norm(h).view(M, B + 1, -1)[:, 1:]
        return head(h)


def test_training_mask_matches_inference(parts):
    """Each block sees exactly the context rows before its anchor and its own rows, as at inference."""
    d, embed, head, feats, toks = parts
    anchors = [2, 9, 15]
    masked = _masked_logits(d, embed, head, feats, toks, anchors)
    for m, a in enumerate(anchors):
        st = DraftState(d)
        st.extend(feats[:a])
        want, _ = st.draft(int(toks[a]), embed, head)
        torch.testing.assert_close(masked[m], want, rtol=0, atol=1e-10)


@pytest.mark.parametrize("feature,embed_anchor,kv_heads", [("off", False, None), ("anchor", True, 2),
                                                          ("mask", False, 1), ("block", True, None)])
def test_anchored_blocks_draft_what_each_incremental_state_drafts(feature, embed_anchor, kv_heads):
    """All anchors of a sequence in one forward (the fits' examples): each block's hidden rows are what
    `DraftState` gives after extending to its anchor (float64), anchor 0 (no context) and the last row included,
    in any order and repeated; the context after an anchor is masked out of its block."""
    torch.manual_seed(0)
    cfg = DrafterConfig(hidden_size=H, vocab_size=V, taps=(0, 2), block_size=B, num_layers=2, num_heads=4,
                        intermediate_size=64, kv_heads=kv_heads, anchor_feature=feature, anchor_embed=embed_anchor)
    d = init_drafter(cfg, seed=1).double().eval()
    if feature != "off":
        with torch.no_grad():
            torch.nn.init.normal_(d.feat.weight, std=0.3)  # a trained feature, not init's silent one
    embed = torch.nn.Embedding(V, H).double()
    feats = torch.randn(20, 2 * H, dtype=torch.float64)
    toks = torch.randint(0, V, (20,))
    anchors = [7, 0, 19, 1, 12, 7]
    got = anchored_blocks(d, feats[:19], torch.tensor(anchors), toks[anchors], embed)
    assert got.shape == (len(anchors), B, H)
    for m, a in enumerate(anchors):
        st = DraftState(d)
        st.extend(feats[:a])
        torch.testing.assert_close(got[m], st.draft_hidden(int(toks[a]), embed), rtol=0, atol=1e-10)
    changed = feats[:19].clone()
    changed[7:] = torch.randn_like(changed[7:])
    torch.testing.assert_close(anchored_blocks(d, changed, torch.tensor([7]), toks[[7]], embed), got[:1],
                               rtol=0, atol=0)
    with pytest.raises(ValueError, match="anchors must lie in 0..19"):
        anchored_blocks(d, feats[:19], torch.tensor([20]), toks[[0]], embed)


def test_future_context_does_not_leak(parts):
    d, embed, head, feats, toks = parts
    base = _masked_logits(d, embed, head, feats, toks, [6])
    changed = feats.clone()
    changed[6:] = torch.randn_like(changed[6:])
    torch.testing.assert_close(_masked_logits(d, embed, head, changed, toks, [6]), base, rtol=0, atol=0)


def test_block_attends_non_causally(parts):
    """The first MASK row sees the later MASK rows: dropping them changes it (a causal block would not)."""
    d, embed, head, feats, toks = parts
    st = DraftState(d)
    st.extend(feats[:5])
    x = d.block_input(toks[5].view(1), embed)
    pos = torch.arange(5, 5 + B + 1)
    with torch.no_grad():
        full = d.run_block(x, pos, st.kv)[0, 0]
        short = d.run_block(x[:, :2], pos[:2], st.kv)[0, 0]
    assert (full - short).abs().max() > 1e-6


def test_block_loss_decreases_position_weighting(parts):
    d, embed, head, feats, toks = parts
    loss, acc = block_loss(d, embed, head, toks.view(1, -1), feats.unsqueeze(0), torch.tensor([[3, 8]]), gamma=4.0)
    assert loss.ndim == 0 and torch.isfinite(loss)
    assert acc.shape == (B,)


@pytest.mark.parametrize("where", ["anchor", "mask", "block"])
def test_anchor_feature_training_forward_matches_inference(where):
    """With `anchor_feature`, the drafter starts as upstream's (the feature's weight at zero); trained, the training
    forward (block_inputs + the row before each anchor) gives each block what DraftState.draft gives it, anchor 0
    (no context) included, and the feature is used: zeroing `feat` changes the drafts."""
    from dflash_core.prepare.train import block_inputs

    torch.manual_seed(0)
    cfg = DrafterConfig(hidden_size=H, vocab_size=V, taps=(0, 2), block_size=B, num_layers=1, num_heads=4,
                        intermediate_size=64, anchor_feature=where)
    d = init_drafter(cfg, seed=1).double().eval()
    embed = torch.nn.Embedding(V, H).double()
    head = torch.nn.Linear(H, V, bias=False).double()
    feats = torch.randn(20, 2 * H, dtype=torch.float64)
    toks = torch.randint(0, V, (20,))
    base = init_drafter(replace(cfg, anchor_feature="off"), seed=1).double().eval()
    sa, sb = DraftState(d), DraftState(base)
    sa.extend(feats[:9])
    sb.extend(feats[:9])  # at init the feature is silent: the drafter is upstream's, weight for weight
    torch.testing.assert_close(sa.draft(int(toks[9]), embed, head)[0], sb.draft(int(toks[9]), embed, head)[0],
                               rtol=0, atol=0)
    with torch.no_grad():
        torch.nn.init.normal_(d.feat.weight, std=0.3)  # a trained feature
    anchors = [0, 4, 11]
    anc = torch.tensor([anchors])
    x, pos, ctx_pos, mask = block_inputs(d, embed, toks.view(1, -1), anc)
    with torch.no_grad():
        h = d(x, feats.unsqueeze(0), pos, ctx_pos, mask, anc - 1).view(len(anchors), B + 1, -1)[:, 1:]
    for m, a in enumerate(anchors):
        st = DraftState(d)
        st.extend(feats[:a])
        want, _ = st.draft(int(toks[a]), embed, head)
        torch.testing.assert_close(head(h[m]), want, rtol=0, atol=1e-10)
    st = DraftState(d)
    st.extend(feats[:9])
    with_feat, _ = st.draft(int(toks[9]), embed, head)
    with torch.no_grad():
        d.feat.weight.zero_()
    without, _ = st.draft(int(toks[9]), embed, head)
    assert (with_feat - without).abs().max() > 1e-6


def test_anchor_feature_is_checked():
    with pytest.raises(ValueError, match="anchor_feature"):
        init_drafter(DrafterConfig(hidden_size=H, vocab_size=V, taps=(0,), anchor_feature="rows"), seed=0)


@pytest.mark.parametrize("where,rows", [("anchor", [0]), ("mask", list(range(1, B + 1))),
                                        ("block", list(range(B + 1)))])
def test_anchor_feature_lands_on_the_rows_it_names(where, rows):
    """'anchor' changes the anchor row only, 'mask' the B MASK rows only, 'block' every row; each block gets its
    own feature."""
    cfg = DrafterConfig(hidden_size=H, vocab_size=V, taps=(0,), block_size=B, anchor_feature=where)
    d = init_drafter(cfg, seed=0).double()
    with torch.no_grad():
        torch.nn.init.normal_(d.feat.weight)
        x = torch.randn(2, 3 * (B + 1), H, dtype=torch.float64)
        prev = torch.randn(2, 3, H, dtype=torch.float64)
        out = d.with_feature(x, prev).view(2, 3, B + 1, H)
    diff = (out - x.view(2, 3, B + 1, H)).abs().amax(dim=-1)  # [N, M, B+1]
    assert (diff[:, :, rows] > 0).all() and (diff.sum(dim=(0, 1)) > 0).nonzero().flatten().tolist() == rows
    torch.testing.assert_close(out[1, 2, rows[0]] - x.view(2, 3, B + 1, H)[1, 2, rows[0]], d.feat(prev[1, 2]))


def test_anchor_embed_training_forward_matches_inference_and_reaches_the_mask_rows():
    """`anchor_embed`: every MASK row is the MASK embedding plus the anchor's, the anchor row unchanged; the training
    forward gives each block what DraftState.draft gives it; and the drafts depend on it (the same weights without
    it draft otherwise)."""
    from dflash_core.prepare.train import block_inputs

    torch.manual_seed(0)
    cfg = DrafterConfig(hidden_size=H, vocab_size=V, taps=(0, 2), block_size=B, num_layers=1, num_heads=4,
                        intermediate_size=64, mask_token_id=3, anchor_embed=True)
    d = init_drafter(cfg, seed=1).double().eval()
    embed = torch.nn.Embedding(V, H).double()
    head = torch.nn.Linear(H, V, bias=False).double()
    feats = torch.randn(20, 2 * H, dtype=torch.float64)
    toks = torch.randint(0, V, (20,))
    with torch.no_grad():
        x = d.block_input(torch.tensor([7, 9]), embed)
    torch.testing.assert_close(x[1, 0], embed.weight[9], rtol=0, atol=0)
    for r in range(1, B + 1):
        torch.testing.assert_close(x[1, r], embed.weight[3] + embed.weight[9], rtol=0, atol=0)
    anchors = [0, 4, 11]
    anc = torch.tensor([anchors])
    xb, pos, ctx_pos, mask = block_inputs(d, embed, toks.view(1, -1), anc)
    with torch.no_grad():
        h = d(xb, feats.unsqueeze(0), pos, ctx_pos, mask).view(len(anchors), B + 1, -1)[:, 1:]
    for m, a in enumerate(anchors):
        st = DraftState(d)
        st.extend(feats[:a])
        want, _ = st.draft(int(toks[a]), embed, head)
        torch.testing.assert_close(head(h[m]), want, rtol=0, atol=1e-10)
    plain = init_drafter(replace(cfg, anchor_embed=False), seed=1).double().eval()
    plain.load_state_dict(d.state_dict())
    sa, sb = DraftState(d), DraftState(plain)
    sa.extend(feats[:9])
    sb.extend(feats[:9])
    assert (sa.draft(int(toks[9]), embed, head)[0] - sb.draft(int(toks[9]), embed, head)[0]).abs().max() > 1e-6


def test_anchor_embed_is_checked_and_off_writes_the_config_it_wrote_before():
    """A config is hostile input: a non-bool is refused. Off, the saved config has no `anchor_embed` key (drafters
    saved before the option hash as they did); on, it round-trips."""
    with pytest.raises(ValueError, match="anchor_embed"):
        init_drafter(DrafterConfig(hidden_size=H, vocab_size=V, taps=(0,), anchor_embed="yes"), seed=0)
    off = DrafterConfig(hidden_size=H, vocab_size=V, taps=(0,))
    assert "anchor_embed" not in off.to_dict() and DrafterConfig.from_dict(off.to_dict()) == off
    on = replace(off, anchor_embed=True)
    assert on.to_dict()["anchor_embed"] is True and DrafterConfig.from_dict(on.to_dict()) == on
