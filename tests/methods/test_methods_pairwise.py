"""02 dflash2 and the shared pair selector: the DP equals brute force, the pair formula, the context vector."""

from __future__ import annotations

import itertools
import math

import torch
from hypothesis import given
from hypothesis import strategies as st

from dflash_core.methods import get_method
from dflash_core.methods.pairwise import viterbi
from dflash_core.methods.support.selector import PairScorer, PairSelector


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


def test_context_vector_matches_the_fit_data(tiny_prepared):
    """At inference the context vector is the fused feature of the last context row, as draft_examples has it."""
    from dflash_core.runtime.target import trajectory_taps

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


def test_dflash2_guidance_is_k_plus_b_minus_one_k_squared(tiny_prepared):
    """Guidance work = every pair score evaluated: K (prev link) + (B-1)·K² (transitions) per block."""
    from dflash_core.methods.runner import run_method

    rt, prep = tiny_prepared.rt, tiny_prepared.prepared
    B, K = prep.drafter.cfg.block_size, 8
    _, st_ = run_method("dflash2", rt, prep, [5, 6, 7], 20, B)
    assert st_.guidance_work == (K + (B - 1) * K * K) * st_.draft_calls
