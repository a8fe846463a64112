"""Methods 02-08: selection rules on crafted inputs, token-exactness against greedy, prepare and artifacts."""

from __future__ import annotations

import itertools
import json
import math
import shutil
from functools import lru_cache

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dflash_core.decode import greedy, speculative
from dflash_core.errors import ArtifactError, BadInputError
from dflash_core.methods import get_method
from dflash_core.methods.act import act_keep
from dflash_core.methods.boltzmann import (
    SALT_BOLTZMANN,
    boltzmann_pick,
    row_temperature,
)
from dflash_core.methods.common import context_fingerprint, gap_fill, gumbel, uniform
from dflash_core.methods.mobs import (
    FUSED_FILE,
    JUMP_FILE,
    anchor_scores,
    bmobs_anchor,
    centres,
    expand_outward,
    jump_positions,
    mobs_anchor,
    mobs_select,
)
from dflash_core.methods.pairwise import PAIR_FILE, PairScorer, PairSelector, viterbi

from .strategies import prompts

METHODS_02_08 = ["dflash2", "mobs", "jump_mobs", "fused_jump", "boltzmann", "bmobs", "act"]
NEW_FILES = {PAIR_FILE: "pair_selector", JUMP_FILE: "jump_head", FUSED_FILE: "fused_residual"}
MAX_BUDGET = 32


# --- a recording pair scorer for the rule tests ---------------------------------------------------------

class RecordingScorer:
    """Same interface as PairScorer; pair(p→c) from a plain function, every call recorded."""

    def __init__(self, fn=lambda p, c: 0.0):
        self.fn = fn
        self.calls: list[tuple] = []
        self.count = 0

    def __call__(self, left, rights):
        self.calls.append(("fwd", left, tuple(rights)))
        self.count += len(rights)
        return [self.fn(left, r) for r in rights]

    def into(self, lefts, right):
        self.calls.append(("bwd", tuple(lefts), right))
        self.count += len(lefts)
        return [self.fn(c, right) for c in lefts]


def grid_ids(B: int, K: int) -> list[list[int]]:
    """Candidate ids that encode their position: 100*i + j (so recorded calls say which slot was scored)."""
    return [[100 * i + j for j in range(K)] for i in range(B)]


# --- 02: the DP equals brute-force enumeration ----------------------------------------------------------

def brute_force(vals, start, trans) -> tuple[list[int], float]:
    """All K^B paths, same summation order as the DP; ties: smallest path compared from the last position."""
    B, K = len(vals), len(vals[0])
    best = None
    for path in itertools.product(range(K), repeat=B):
        acc = vals[0][path[0]] + start[path[0]]
        for i in range(1, B):
            acc = acc + trans[i - 1][path[i - 1]][path[i]] + vals[i][path[i]]
        key = (acc, tuple(-j for j in reversed(path)))
        if best is None or key > best[0]:
            best = (key, list(path))
    return best[1], best[0][0]


@st.composite
def dp_problems(draw, values):
    B = draw(st.integers(1, 5))
    K = draw(st.integers(1, 4))
    vals = [[draw(values) for _ in range(K)] for _ in range(B)]
    start = [draw(values) for _ in range(K)]
    trans = [[[draw(values) for _ in range(K)] for _ in range(K)] for _ in range(B - 1)]
    return vals, start, trans


@given(dp_problems(st.integers(-3, 3).map(float)))
def test_viterbi_equals_brute_force_with_ties(problem):
    """Small integer scores: exact arithmetic and many ties, so the tie rule is checked too."""
    vals, start, trans = problem
    assert viterbi(vals, start, trans) == brute_force(vals, start, trans)[0]


@given(st.integers(0, 2**31 - 1), st.integers(1, 5), st.integers(1, 4))
def test_viterbi_with_random_pair_tables_equals_brute_force(seed, B, K):
    g = torch.Generator().manual_seed(seed)
    V, H = 24, 6
    sel = PairSelector(V, H, rank=4)
    with torch.no_grad():
        for p in sel.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    ids = [torch.randperm(V, generator=g)[:K].tolist() for _ in range(B)]
    vals = [sorted(torch.randn(K, generator=g).tolist(), reverse=True) for _ in range(B)]
    ctx = torch.randn(H, generator=g)
    prev = int(torch.randint(V, (1,), generator=g))
    scorer = PairScorer(sel, ctx, [prev, *(t for r in ids for t in r)])
    start, trans = scorer(prev, ids[0]), scorer.transitions(ids)
    assert scorer.count == K + (B - 1) * K * K
    # the pair formula, straight from the definition
    with torch.no_grad():
        gate = torch.tanh(sel.gate(ctx)).double()
        a, b = sel.a.weight.detach().double(), sel.b.weight.detach().double()
    for i in range(1, B):
        for p_, c_ in itertools.product(range(K), repeat=2):
            want = float((a[ids[i - 1][p_]] * gate * b[ids[i][c_]]).sum() * 4 ** -0.5)
            assert math.isclose(trans[i - 1][p_][c_], want, rel_tol=1e-5, abs_tol=1e-6)
    path = viterbi(vals, start, trans)
    best_path, best = brute_force(vals, start, trans)
    score = vals[0][path[0]] + start[path[0]]
    for i in range(1, B):
        score = score + trans[i - 1][path[i - 1]][path[i]] + vals[i][path[i]]
    assert math.isclose(score, best, rel_tol=0, abs_tol=1e-9)
    scores = sorted((sum([vals[0][q[0]], start[q[0]]] + [trans[i - 1][q[i - 1]][q[i]] + vals[i][q[i]]
                                                            for i in range(1, B)]), q)
                    for q in itertools.product(range(K), repeat=B))
    if len(scores) == 1 or scores[-1][0] - scores[-2][0] > 1e-6:
        assert path == best_path


def test_viterbi_prefers_a_strong_pair_over_the_argmax():
    vals = [[1.0, 0.9], [1.0, 0.9]]
    trans = [[[0.0, 0.0], [0.0, 5.0]]]  # only the (second, second) link is good
    assert viterbi(vals, [0.0, 0.0], trans) == [1, 1]
    assert viterbi(vals, [0.0, 0.0], [[[0.0, 0.0], [0.0, 0.0]]]) == [0, 0]


# --- 03 / 07: anchor rules and outward order --------------------------------------------------------------

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


# --- 06: Boltzmann and the hash ------------------------------------------------------------------------

def test_hash_is_deterministic_and_uniform():
    seed = context_fingerprint([3, 1, 4, 1, 5]) ^ SALT_BOLTZMANN
    draws = [uniform(seed, pos, tok) for pos in range(8) for tok in range(2500)]
    assert draws == [uniform(seed, pos, tok) for pos in range(8) for tok in range(2500)]
    assert len(draws) == 20000 and all(0.0 < u < 1.0 for u in draws)
    bins = [0] * 20
    for u in draws:
        bins[min(int(u * 20), 19)] += 1
    chi2 = sum((c - 1000) ** 2 / 1000 for c in bins)
    assert chi2 < 43.8, f"chi-square {chi2:.1f} over 19 degrees of freedom (p < 0.001 bound 43.8)"
    g = [gumbel(seed, 0, tok) for tok in range(20000)]
    assert abs(sum(g) / len(g) - 0.5772) < 0.03  # Gumbel mean = Euler-Mascheroni constant
    assert uniform(seed, 0, 1) != uniform(seed, 0, 2) != uniform(seed, 1, 1)


def test_row_temperature():
    assert row_temperature([1.0, 1.0], 0.15) == pytest.approx(0.15)
    assert row_temperature([1.0, 0.0], 0.15) == pytest.approx(0.15 * math.exp(-1.0))
    assert row_temperature([50.0, 0.0], 0.15) == pytest.approx(0.02 * 0.15)  # floor


@given(st.lists(st.floats(-50, 50), min_size=1, max_size=8, unique=True), st.integers(0, 2**64 - 1),
       st.integers(0, 7), st.floats(0, 1e-9))
def test_boltzmann_at_zero_temperature_is_argmax(values, seed, pos, temperature):
    vals = sorted(values, reverse=True)
    if len(vals) >= 2 and min(a - b for a, b in zip(vals, vals[1:])) < 1e-6:
        vals = [float(len(vals) - i) for i in range(len(vals))]  # keep the rows well separated
    ids = list(range(10, 10 + len(vals)))
    j, n = boltzmann_pick(ids, vals, temperature, seed, pos)
    assert j == 0
    assert n in (0, len(vals)) and (n == 0 if temperature == 0 or len(vals) < 2 else True)


def test_boltzmann_explores_at_high_temperature():
    ids, vals = list(range(8)), [1.0 - 0.01 * i for i in range(8)]
    picks = {boltzmann_pick(ids, vals, 100.0, seed, 0)[0] for seed in range(200)}
    assert len(picks) >= 6  # a flat row at high temperature follows the hashed Gumbel


# --- 08: ACT trimming --------------------------------------------------------------------------------

def test_act_keep_examples():
    assert act_keep([3.0, 2.0, 0.1, 5.0], 1.0) == 2  # stops at the first row below tau
    assert act_keep([0.1, 5.0, 5.0], 1.0) == 1  # never below one token
    assert act_keep([0.0, 0.0], 0.0) == 2  # tau = 0 keeps everything
    assert act_keep([], 1.0) == 1


@given(st.lists(st.floats(0, 10), min_size=1, max_size=8), st.floats(0, 10))
def test_act_keep_property(margins, tau):
    n = act_keep(margins, tau)
    first_low = next((i for i, m in enumerate(margins) if m < tau), len(margins))
    assert 1 <= n <= len(margins) and n == max(1, first_low)
    assert all(m >= tau for m in margins[:first_low])
    if tau == 0:
        assert n == len(margins)


# --- builds on the tiny prepared target -------------------------------------------------------------

def _crafted_logits(margins: list[float], V: int, seed: int = 0) -> torch.Tensor:
    """Rows whose argmax is a random id and whose top1-top2 gap is exactly the given margin."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for m in margins:
        r = torch.rand(V, generator=g, dtype=torch.float64)  # in [0, 1)
        top = int(torch.randint(V, (1,), generator=g))
        r[top] = float(r.max()) + 1.0  # unique max
        second = float(torch.cat([r[:top], r[top + 1:]]).max())
        r[top] = second + m
        rows.append(r)
    return torch.stack(rows)


def test_act_select_trims_at_first_low_margin_row(tiny_prepared):
    rt, prep = tiny_prepared.rt, tiny_prepared.prepared
    V = rt.vocab_size
    logits = _crafted_logits([3.0, 2.0, 0.5, 4.0], V)
    argmax = logits.argmax(-1).tolist()
    act = get_method("act").build(rt, prep, tau=1.0)
    ids, guidance, meta = act.select(logits, None, [1], 4)
    assert ids == argmax[:2] and guidance == 0 and meta["act_trimmed"] == 2 and meta["act_verified"] == 2
    ids, _, meta = act.select(logits, None, [1], 1)
    assert ids == argmax[:1] and meta["act_trimmed"] == 0
    low = _crafted_logits([0.1, 3.0, 3.0, 3.0], V, seed=1)
    assert act.select(low, None, [1], 4)[0] == low.argmax(-1).tolist()[:1]  # never below one token
    plain = get_method("act").build(rt, prep, tau=0.0)
    assert plain.select(low, None, [1], 4)[0] == low.argmax(-1).tolist()


def test_boltzmann_select_at_zero_temperature_is_dflash(tiny_prepared):
    rt, prep = tiny_prepared.rt, tiny_prepared.prepared
    logits = _crafted_logits([0.3, 0.01, 2.0, 0.2], rt.vocab_size, seed=3)
    prop = get_method("boltzmann").build(rt, prep, temperature=0.0)
    ids, guidance, _ = prop.select(logits, None, [4, 5, 6], 4)
    assert ids == logits.argmax(-1).tolist() and guidance == 0
    hot = get_method("boltzmann").build(rt, prep, temperature=1e-12)
    assert hot.select(logits, None, [4, 5, 6], 4)[0] == ids
    warm = get_method("boltzmann").build(rt, prep)
    ids2, guidance2, _ = warm.select(logits, None, [4, 5, 6], 4)
    assert guidance2 == 4 * 8 and ids2 == warm.select(logits, None, [4, 5, 6], 4)[0]  # deterministic


def test_context_vector_matches_the_fit_data(tiny_prepared):
    """At inference the context vector is the fused feature of the last context row, as draft_examples has it."""
    from dflash_core.train import trajectory_taps

    rt, prep = tiny_prepared.rt, tiny_prepared.prepared
    seq = [5, 9, 14, 3, 22, 7, 8]
    taps = trajectory_taps(rt, seq, prep.drafter.cfg.taps)
    prop = get_method("mobs").build(rt, prep)
    dt = next(prep.drafter.parameters()).dtype
    with torch.no_grad():
        prop.begin(seq[:4], taps[:4])
        torch.testing.assert_close(prop.context(), prep.drafter.fuse(taps[3:4].to(dt))[0].float())
        prop.observe(taps[4:6])
        torch.testing.assert_close(prop.context(), prep.drafter.fuse(taps[5:6].to(dt))[0].float())


def test_registry_entries():
    for index, mid in enumerate(["dflash2", "mobs", "jump_mobs", "fused_jump", "boltzmann", "bmobs", "act"], 2):
        info = get_method(mid)
        assert info.index == index and info.build is not None
        assert len(info.stages) == 4 and all(isinstance(s, str) and s for s in info.stages)
        assert info.label and info.mechanism and info.complexity
    assert get_method("dflash2").needs == (PAIR_FILE,)
    assert get_method("jump_mobs").needs == (PAIR_FILE, JUMP_FILE)
    assert get_method("fused_jump").needs == (PAIR_FILE, FUSED_FILE)
    assert get_method("boltzmann").needs == () and get_method("act").needs == ()


def test_bad_options_are_refused(tiny_prepared):
    rt, prep = tiny_prepared.rt, tiny_prepared.prepared
    with pytest.raises(BadInputError, match="top_k"):
        get_method("dflash2").build(rt, prep, top_k=0)
    with pytest.raises(BadInputError, match="temperature"):
        get_method("boltzmann").build(rt, prep, temperature=-1.0)
    with pytest.raises(BadInputError, match="tau"):
        get_method("act").build(rt, prep, tau=float("nan"))


# --- exactness on the tiny target (float64, strict) ---------------------------------------------------

@lru_cache(maxsize=2048)
def _tiny_reference(rt, prompt: tuple[int, ...], budget: int) -> tuple[int, ...]:
    return tuple(greedy(rt, list(prompt), budget)[0])


def _options(method: str, data) -> dict:
    if method == "act":
        return {"tau": data.draw(st.sampled_from([0.0, 0.25, 1.0, 4.0, 1e9]), label="tau")}
    if method in ("boltzmann", "bmobs"):
        return {"temperature": data.draw(st.sampled_from([0.0, 0.15, 0.35, 5.0]), label="T"),
                "top_k": data.draw(st.sampled_from([1, 2, 8]), label="K")}
    opts = {"top_k": data.draw(st.sampled_from([1, 3, 8]), label="K")}
    if method == "fused_jump":
        opts["min_margin"] = data.draw(st.sampled_from([0.0, 0.5, 1e9]), label="min_margin")
    return opts


@pytest.mark.exactness
@pytest.mark.parametrize("method", METHODS_02_08)
@settings(deadline=None)
@given(prompt=prompts(96, max_len=40), budget=st.integers(0, MAX_BUDGET), data=st.data())
def test_method_is_exact_on_tiny_float64(tiny_prepared, method, prompt, budget, data):
    rt, prep = tiny_prepared.rt, tiny_prepared.prepared
    assert rt.dtype == torch.float64 and rt.vocab_size == 96
    B = prep.drafter.cfg.block_size
    width = data.draw(st.integers(1, B), label="width")
    proposer = get_method(method).build(rt, prep, **_options(method, data))
    got, stats = speculative(rt, proposer, list(prompt), budget, width, method=method)
    assert got == list(_tiny_reference(rt, prompt, budget))
    assert stats.new_tokens == budget and stats.accepted <= stats.proposed <= stats.draft_calls * width
    assert sum((a + 1) * c for a, c in enumerate(stats.accept_counts)) == budget
    assert stats.guidance_work >= 0 and all(isinstance(v, (int, float)) for v in stats.meta.values())
    if method == "act" and stats.draft_calls:
        assert stats.meta["act_verified"] == stats.proposed
        assert stats.meta["act_verified"] + stats.meta["act_trimmed"] == stats.meta["act_margin_rows"]


@pytest.mark.exactness
def test_act_at_tau_zero_is_dflash(tiny_prepared):
    from dflash_core.runner import run_method

    rt, prep = tiny_prepared.rt, tiny_prepared.prepared
    for prompt in ([5], [7, 8, 9, 10], list(range(3, 30))):
        a_ids, a = run_method("act", rt, prep, prompt, 24, 3, tau=0.0)
        d_ids, d = run_method("dflash", rt, prep, prompt, 24, 3)
        assert a_ids == d_ids and (a.target_calls, a.accepted, a.proposed) == (d.target_calls, d.accepted, d.proposed)
        assert a.meta["act_trimmed"] == 0


@pytest.mark.exactness
def test_guidance_counts_per_block(tiny_prepared):
    """The counters follow one definition: every candidate score evaluated beyond the drafter's argmax."""
    from dflash_core.runner import run_method

    rt, prep = tiny_prepared.rt, tiny_prepared.prepared
    B, K = prep.drafter.cfg.block_size, 8
    per_block = {"dflash2": K + (B - 1) * K * K, "boltzmann": B * K, "act": 0}
    for mid, want in per_block.items():
        _, st_ = run_method(mid, rt, prep, [5, 6, 7], 20, B)
        assert st_.guidance_work == want * st_.draft_calls, mid
    _, st_ = run_method("mobs", rt, prep, [5, 6, 7], 20, B)
    # anchor: left + right consistency (2K), each other slot one link (K), plus the prev link at slot 0 (K)
    assert st_.guidance_work == (2 * K + (B - 1) * K + K) * st_.draft_calls
    _, st_ = run_method("jump_mobs", rt, prep, [5, 6, 7], 20, B)
    assert st_.meta["jump_scores"] == len(jump_positions(B)) * K * st_.draft_calls


# --- prepare: heads in the manifest, missing artifacts refused ------------------------------------------

def test_prepare_stores_the_new_heads(tiny_prepared):
    man = tiny_prepared.prepared.manifest
    for fname, fit in NEW_FILES.items():
        assert man["files"][fname]["bytes"] > 0 and len(man["files"][fname]["sha256"]) == 64
        meta = man["fits"][fit]
        assert meta["examples"] > 0 and meta["steps"] > 0 and meta["loss_final"] is not None
    blob = tiny_prepared.prepared.load_torch(PAIR_FILE)
    assert blob["config"]["vocab_size"] == tiny_prepared.rt.vocab_size
    assert set(blob["state_dict"]) >= {"a.weight", "b.weight", "gate.weight", "gate.bias"}


@pytest.mark.parametrize("method,missing", [("dflash2", PAIR_FILE), ("mobs", PAIR_FILE), ("bmobs", PAIR_FILE),
                                            ("jump_mobs", JUMP_FILE), ("fused_jump", FUSED_FILE)])
def test_missing_artifact_names_the_prepare_to_run(tiny_prepared, tmp_path, method, missing):
    from dflash_core.prepare import load_prepared

    home = tmp_path / "home"
    shutil.copytree(tiny_prepared.home, home)
    out = next((home / "artifacts").iterdir())
    man = json.loads((out / "manifest.json").read_text())
    del man["files"][missing]
    (out / "manifest.json").write_text(json.dumps(man))
    rt = tiny_prepared.rt
    prep = load_prepared(rt, home=home)  # the drafter alone still verifies
    with pytest.raises(ArtifactError, match=rf"lacks '{missing}'.*python -m dflash_core prepare --target .* --refresh"):
        get_method(method).build(rt, prep)
    with pytest.raises(ArtifactError, match=rf"lacks '{missing}'.*prepare"):
        load_prepared(rt, home=home, required=get_method(method).needs)


# --- ACT calibration --------------------------------------------------------------------------------

def test_calibrate_act_on_tiny(tiny_prepared):
    from dflash_core.calibrate import calibrate_act

    rt, prep = tiny_prepared.rt, tiny_prepared.prepared
    res = calibrate_act(rt, prep, [[5, 6, 7], [11, 12]], 6, 3, repeats=1, grid=(0.0, 1.0))
    assert res["selected_tau"] in (0.0, 1.0)
    assert [row["setting"]["tau"] for row in res["table"]] == [0.0, 1.0]
    assert all(row["all_exact"] and row["trials"] == 2 for row in res["table"])


def test_calibrate_act_refuses_benchmark_prompts(tiny_prepared):
    from dflash_core.calibrate import calibrate_act
    from dflash_core.data import load_prompts

    rt, prep = tiny_prepared.rt, tiny_prepared.prepared
    bench = load_prompts("english").benchmark[0]
    with pytest.raises(BadInputError, match="benchmark"):
        calibrate_act(rt, prep, [[5, 6, 7]], 6, 3, repeats=1, prompt_texts=[bench], family="english")
