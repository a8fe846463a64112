"""The anchored selectors 03 mobs, 04 jump_mobs, 05 fused_jump, 07 bmobs and 11 gated_mobs_v11: anchor
rules, outward order, gap fill, gating, and their guidance counts."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dflash_core.methods.gated_mobs import gated_mobs, gated_slots
from dflash_core.methods.jump import jump_positions
from dflash_core.methods.mobs import anchor_scores, bmobs_anchor, centres, expand_outward, mobs_anchor, mobs_select
from dflash_core.methods.support.common import context_fingerprint, gap_fill

from ..support.helpers import RecordingScorer, grid_ids


def test_centres_and_anchor_rules():
    assert [centres(b) for b in (1, 2, 3, 4, 5, 8)] == [(0,), (0, 1), (1,), (1, 2), (2,), (3, 4)]
    for fp in range(8):
        assert mobs_anchor(4, fp) == (1 if fp % 2 == 0 else 2)  # even parity -> left centre
        assert mobs_anchor(5, fp) == 2 and mobs_anchor(1, fp) == 0
    assert jump_positions(4) == (1, 3) and jump_positions(8) == (1, 3, 5, 7) and jump_positions(1) == ()
    # the fingerprint sees token ids only, the last 4 of them
    assert context_fingerprint([9, 1, 2, 3, 4]) == context_fingerprint([7, 1, 2, 3, 4])
    assert context_fingerprint([1, 2, 3, 4]) != context_fingerprint([1, 2, 3, 5])


def test_bmobs_anchor_is_the_less_confident_centre():
    flat, sharp = [1.0, 0.9], [5.0, 0.0]
    assert bmobs_anchor([sharp, sharp, flat, sharp]) == 2
    assert bmobs_anchor([sharp, flat, sharp, sharp]) == 1
    assert bmobs_anchor([sharp, flat, flat, sharp]) == 1  # tie -> left centre
    assert bmobs_anchor([flat, flat, sharp, flat, flat]) == 2  # odd B: the one centre


@pytest.mark.parametrize("B,anchor", [(8, 3), (8, 4), (4, 1), (4, 2), (5, 2), (2, 0), (1, 0)])
def test_expand_outward_order_and_links(B, anchor):
    ids = grid_ids(B, 3)
    vals = [[1.0, 0.5, 0.0] for _ in range(B)]
    sc = RecordingScorer()
    chosen = [None] * B
    chosen[anchor] = ids[anchor][0]
    out = expand_outward(chosen, anchor, ids, vals, sc, prev=-1)
    assert all(c is not None for c in out) and out == [r[0] for r in ids]
    order, links = [], []
    for kind, x, y in sc.calls:
        if kind == "bwd":  # pair(ids[L] → chosen[L+1])
            order.append(x[0] // 100)
            links.append((x[0] // 100, y // 100))
        elif x == -1:  # pair(prev → ids[0])
            links.append((-1, 0))
        else:  # pair(chosen[R-1] → ids[R])
            order.append(y[0] // 100)
            links.append((x // 100, y[0] // 100))
    want = []
    for d in range(1, B):
        want += [p for p in (anchor - d, anchor + d) if 0 <= p < B]
    assert order == want
    # every link exactly once (the prev link of an anchor at 0 is scored with the anchor, see below)
    assert sorted(links) == [(-1, 0)] * (anchor > 0) + [(i, i + 1) for i in range(B - 1)]
    assert sc.count == 3 * len(links)


@pytest.mark.parametrize("B,anchor", [(4, 1), (4, 2), (2, 0), (1, 0), (5, 2), (8, 3)])
def test_mobs_anchor_token_scoring(B, anchor):
    """Position 0 is scored against prev (its real neighbour); otherwise against the drafter's top-1 neighbours."""
    ids = grid_ids(B, 3)
    vals = [[0.0, 0.0, 0.0] for _ in range(B)]
    sc = RecordingScorer()
    anchor_scores(anchor, ids, vals, sc, prev=-1)
    want_left = -1 if anchor == 0 else ids[anchor - 1][0]
    assert sc.calls[0] == ("fwd", want_left, tuple(ids[anchor]))
    if anchor + 1 < B:
        assert sc.calls[1:] == [("bwd", tuple(ids[anchor]), ids[anchor + 1][0])]
    else:
        assert len(sc.calls) == 1


def test_mobs_pair_scores_can_overrule_the_argmax():
    B, K = 4, 2
    ids = grid_ids(B, K)
    vals = [[1.0, 0.9] for _ in range(B)]

    def pair(p, c):  # every link strongly prefers the second-ranked candidate
        return 5.0 if c % 100 == 1 else 0.0

    chosen, a = mobs_select(ids, vals, RecordingScorer(pair), prev=-1, fingerprint=0)
    assert a == 1
    assert chosen == [ids[i][1] for i in range(B)]
    chosen, _ = mobs_select(ids, vals, RecordingScorer(), prev=-1, fingerprint=1)
    assert chosen == [r[0] for r in ids]  # no pair signal: the drafter's argmax


@given(st.integers(1, 8), st.integers(1, 4), st.data())
def test_gap_fill_fills_every_slot(B, K, data):
    ids = grid_ids(B, K)
    vals = [data.draw(st.lists(st.floats(-5, 5), min_size=K, max_size=K)) for _ in range(B)]
    mask = data.draw(st.lists(st.booleans(), min_size=B, max_size=B))
    chosen = [ids[i][K - 1] if m else None for i, m in enumerate(mask)]
    sc = RecordingScorer(lambda p, c: ((p * 31 + c * 17) % 7) / 7.0)
    out, work = gap_fill(chosen, ids, vals, sc, prev=-1)
    assert len(out) == B and all(c is not None for c in out)
    assert all(out[i] == chosen[i] for i in range(B) if chosen[i] is not None)
    assert all(out[i] in ids[i] for i in range(B))
    assert work == sc.count


@pytest.mark.parametrize("B", [2, 3, 4, 5, 8])
def test_gap_fill_after_jump_anchors_is_one_wave_with_both_links(B):
    ids = grid_ids(B, 3)
    chosen: list = [None] * B
    for p in jump_positions(B):
        chosen[p] = ids[p][0]
    sc = RecordingScorer()
    out, work = gap_fill(chosen, ids, [[0.0] * 3] * B, sc, prev=-1)
    empty = [i for i in range(B) if chosen[i] is None]
    links = sum(1 + int(i + 1 < B) for i in empty)  # left (or prev) always, right when inside the block
    assert work == 3 * links and all(c is not None for c in out)


def test_v11_touches_only_gated_slots():
    vals = [[5.0, 0.0, -1.0], [1.0, 0.99, 0.0], [3.0, 0.0, -2.0], [0.5, 0.5, 0.4]]
    ids = [[10, 11, 12], [20, 21, 22], [30, 31, 32], [40, 41, 42]]
    gated, u = gated_slots(vals, temperature=0.1, gate=0.2, budget=1, early=0.15)
    assert gated == [1]  # slots 1 and 3 are uncertain; slot 1 has the higher priority u / (1 + 0.15 i)

    def scorer(left, rights):  # a pair model that strongly prefers the runner-up
        return [0.0 if r % 10 == 0 else 1.0 for r in rights]

    scorer.into = lambda lefts, right: [0.0 for _ in lefts]
    chosen = gated_mobs(ids, vals, gated, scorer, prev=1, pair_weight=1.0)
    assert chosen == [10, 21, 30, 40]  # only the gated slot moved (to the pair-preferred runner-up)


def test_mobs_and_jump_guidance_counts(tiny_prepared):
    from dflash_core.methods.runner import run_method

    rt, prep = tiny_prepared.rt, tiny_prepared.prepared
    B, K = prep.drafter.cfg.block_size, 8
    _, st_ = run_method("mobs", rt, prep, [5, 6, 7], 20, B)
    # anchor: left + right consistency (2K), each other slot one link (K), plus the prev link at slot 0 (K)
    assert st_.guidance_work == (2 * K + (B - 1) * K + K) * st_.draft_calls
    _, st_ = run_method("jump_mobs", rt, prep, [5, 6, 7], 20, B)
    assert st_.meta["jump_scores"] == len(jump_positions(B)) * K * st_.draft_calls
