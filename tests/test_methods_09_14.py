"""Methods 09-14: unit properties on crafted inputs, the fits, held-out discipline and exactness.

09 dspark_lite, 10 boltzmann_v10, 11 gated_mobs_v11, 12 parareal_v12, 13 minop_v13, 14 simple_parareal_v14.
"""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dflash_core.calibrate import calibrate_dspark, calibrate_v10, calibrate_v11
from dflash_core.decode import greedy, speculative
from dflash_core.errors import BadInputError
from dflash_core.methods import get_method
from dflash_core.methods.common import topk
from dflash_core.methods.dspark import DSPARK_FILE, DSparkHeads, fit_dspark
from dflash_core.methods.gated_mobs import gated_mobs, gated_slots
from dflash_core.methods.parareal import (
    V12_FEATURES,
    V12_FILE,
    V14_FILE,
    V12Model,
    fit_v12,
    fit_v14,
    refuse_benchmark_trajectories,
    ridge,
    split_by_trajectory,
    standardised_ridge,
    v14_choose,
    v14_design,
)
from dflash_core.methods.routing import route_v10, route_v13, top2, v13_options
from dflash_core.prepare import FitContext, PrepareConfig

from .strategies import prompts
from .test_exactness import check_invariants

IDS = ("dspark_lite", "boltzmann_v10", "gated_mobs_v11", "parareal_v12", "minop_v13", "simple_parareal_v14")
FILES = {"dspark": DSPARK_FILE, "parareal_v12": V12_FILE, "simple_parareal_v14": V14_FILE}

# Settings that exercise each method's non-default paths (trimming, many coins, gated pair rescoring, ...).
OPTIONS = {
    "dspark_lite": [{}, {"floor": 0.35}, {"floor": 0.9}],
    "boltzmann_v10": [{}, {"temperature": 2.0, "cutoff": 50.0, "budget": 2}, {"budget": 0}],
    "gated_mobs_v11": [{}, {"gate": 0.0, "budget": 3, "top_k": 8, "temperature": 5.0}],
    "parareal_v12": [{}, {"correction_rounds": 4, "damping": 1.0}],
    "minop_v13": [{}, {"temperature": 2.0, "cutoff": 50.0}],
    "simple_parareal_v14": [{}, {"switch_threshold": 1e9, "max_corrections": 1}],
}


# --- unit properties on crafted inputs ----------------------------------------------------------------

def _heads(bias: float = 0.0) -> DSparkHeads:
    V, r = 8, 2
    prev = torch.zeros(V, r)
    prev[1] = torch.tensor([1.0, 0.0])
    prev[2] = torch.tensor([0.0, 1.0])
    nxt = torch.zeros(V, r)
    nxt[3] = torch.tensor([10.0, 0.0])
    nxt[4] = torch.tensor([0.0, 10.0])
    return DSparkHeads(prev, nxt, torch.ones(4), torch.zeros(5), torch.zeros(r), bias)


def test_markov_step_is_sequential():
    h = _heads()
    # slot 1's scores depend on its predecessor
    assert h.scores(1, 1, [3, 4], [0.0, 0.0]) != h.scores(1, 2, [3, 4], [0.0, 0.0])
    # changing slot 0's choice (via its draft values) changes slot 1's choice
    ids = [[1, 2], [3, 4]]
    a, _ = h.walk(ids, [[1.0, 0.0], [0.0, 0.0]], [0.0, 0.0], prev_token=0, floor=0.0)
    b, _ = h.walk(ids, [[0.0, 1.0], [0.0, 0.0]], [0.0, 0.0], prev_token=0, floor=0.0)
    assert a == [1, 3] and b == [2, 4]


@given(floor=st.floats(0.0, 0.999), bias=st.floats(-30, 30), n=st.integers(1, 4),
       terms=st.lists(st.floats(-5, 5), min_size=4, max_size=4))
def test_survival_gate_keeps_at_least_one_token(floor, bias, n, terms):
    h = _heads(bias)
    ids = [[1, 2], [3, 4], [3, 4], [3, 4]][:n]
    vals = [[0.5, 0.0]] * n
    chosen, info = h.walk(ids, vals, terms[:n], prev_token=0, floor=floor)
    assert 1 <= len(chosen) <= n
    if floor == 0.0:
        assert len(chosen) == n
    # the cut is at the first slot whose running survival drops below the floor
    surv, keep = 1.0, 0
    for p in range(n):
        surv *= min(max(h.confidence(terms[p], [0, *chosen][p]), 1e-6), 1.0)
        if floor > 0 and surv < floor:
            break
        keep += 1
    assert len(chosen) == max(1, keep)


def test_survival_gate_with_zero_confidence_keeps_one():
    chosen, info = _heads(bias=-50.0).walk([[1, 2], [3, 4], [3, 4]], [[1.0, 0.0]] * 3, [0.0] * 3, 0, floor=0.5)
    assert chosen == [1] and info["scored"] == 1


@st.composite
def top2_lists(draw, max_block: int = 8):
    B = draw(st.integers(1, max_block))
    vals, ids = [], []
    for _ in range(B):
        v1 = draw(st.floats(-5, 5))
        v2 = v1 - draw(st.sampled_from([0.0, 0.01, 0.1, 0.3, 1.0, 5.0]))
        t1, t2 = draw(st.lists(st.integers(0, 95), min_size=2, max_size=2, unique=True))
        vals.append([v1, v2])
        ids.append([t1, t2])
    return ids, vals


@given(case=top2_lists(), fp=st.integers(0, 2**64 - 1), T=st.sampled_from([0.03, 0.1, 1.0, 100.0]),
       cutoff=st.sampled_from([0.0, 0.05, 0.35, 2.0]), budget=st.integers(0, 4))
def test_v10_routes_only_below_cutoff_and_within_budget(case, fp, T, cutoff, budget):
    ids, vals = case
    chosen, info = route_v10(ids, vals, fp, temperature=T, cutoff=cutoff, budget=budget, slope=1.5)
    changed = [i for i in range(len(ids)) if chosen[i] != ids[i][0]]
    assert info["sampled"] <= budget and len(changed) <= budget
    for i in changed:
        assert vals[i][0] - vals[i][1] < cutoff and chosen[i] == ids[i][1]
    assert info["uncertain"] == sum(v[0] - v[1] < cutoff for v in vals)


def _rule_top2(row: list[float]) -> list[int]:
    return sorted(range(len(row)), key=lambda i: (-row[i], i))[:2]


@st.composite
def tied_logits(draw):
    """[B, V] float logits drawn from a few levels, so ties at the top are common."""
    B, V = draw(st.integers(1, 8)), draw(st.integers(2, 40))
    levels = draw(st.lists(st.floats(-8, 8, width=32), min_size=1, max_size=4))
    rows = [[draw(st.sampled_from(levels)) for _ in range(V)] for _ in range(B)]
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    return torch.tensor(rows, dtype=dtype)


@given(logits=tied_logits())
def test_top2_follows_the_common_topk_rule(logits):
    ids, vals = top2(logits)
    x = logits.float().tolist()
    assert ids.tolist() == [_rule_top2(r) for r in x]
    assert vals.tolist() == [[r[i] for i in _rule_top2(r)] for r in x]
    c_ids, _ = topk(logits, 2)
    for row, got, want in zip(x, c_ids, ids.tolist()):
        top = sorted(row, reverse=True)
        # common.topk looks at k + 4 candidates, so its rule holds whenever <= 6 values tie at the top-2 level
        if sum(v >= top[1] for v in row) <= 6:
            assert got == want


@given(logits=tied_logits(), fp=st.integers(0, 2**64 - 1), T=st.sampled_from([0.03, 0.16, 2.0]),
       cutoff=st.sampled_from([0.0, 0.05, 0.35, 50.0]), slope=st.sampled_from([0.0, 1.5]))
def test_v13_equals_v10_with_budget_one(logits, fp, T, cutoff, slope):
    cfg = {"temperature": T, "cutoff": cutoff, "slope": slope}
    i10, v10 = top2(logits.float().cpu())  # V10: full logits on the host
    i13, v13 = top2(logits)  # V13: on the drafter's device
    a, ia = route_v10(i10.tolist(), v10.tolist(), fp, budget=1, **cfg)
    b, ib = route_v13(i13.tolist(), v13.tolist(), fp, **cfg)
    assert a == b and ia == ib


def test_v13_options_keep_t_cutoff_slope_and_force_budget_one(tiny_prepared):
    sel = {"temperature": 0.06, "cutoff": 0.35, "budget": 2, "slope": 1.5}
    assert v13_options(sel) == {"temperature": 0.06, "cutoff": 0.35, "slope": 1.5}
    build = get_method("minop_v13").build
    build(tiny_prepared.rt, tiny_prepared.prepared, budget=1, **v13_options(sel))
    with pytest.raises(BadInputError, match="budget is fixed to 1"):
        build(tiny_prepared.rt, tiny_prepared.prepared, **sel)


@given(case=top2_lists(), coef=st.tuples(st.floats(-3, 3), st.floats(-2, 2), st.floats(-3, 3)),
       damping=st.floats(0, 1), threshold=st.floats(-5, 5), maxc=st.integers(0, 3))
def test_v14_switches_at_most_max_corrections(case, coef, damping, threshold, maxc):
    ids, vals = case
    chosen, work, meta = v14_choose(ids, vals, coef, damping=damping, threshold=threshold, max_corrections=maxc)
    changed = [i for i in range(len(ids)) if chosen[i] != ids[i][0]]
    assert len(changed) == meta["v14_switched_positions"] <= maxc
    assert all(chosen[i] == ids[i][1] for i in changed)
    assert work == 6 * len(ids)
    one, _, _ = v14_choose(ids, vals, coef, damping=damping, threshold=threshold, max_corrections=1)
    assert sum(c != r[0] for c, r in zip(one, ids)) <= 1


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


# --- the fits ---------------------------------------------------------------------------------------

def test_ridge_recovers_known_coefficients():
    g = torch.Generator().manual_seed(0)
    X = torch.cat([torch.ones(500, 1, dtype=torch.float64), torch.randn(500, 8, generator=g, dtype=torch.float64)], 1)
    beta = torch.linspace(-2, 2, 9, dtype=torch.float64)
    y = X @ beta + 1e-6 * torch.randn(500, generator=g, dtype=torch.float64)
    torch.testing.assert_close(ridge(X, y, 1e-9), beta, atol=1e-5, rtol=0)


def test_v12_standardised_ridge_recovers_known_model():
    g = torch.Generator().manual_seed(1)
    X = torch.randn(2000, 8, generator=g, dtype=torch.float64) * torch.linspace(0.1, 3, 8, dtype=torch.float64) + 2.0
    X[:, 3] = 0.5  # a constant column: scale 1, its coefficient 0
    w = torch.tensor([0.5, -1.0, 0.25, 0.0, 2.0, -0.3, 0.1, 0.7], dtype=torch.float64)
    y = 0.3 + X @ w
    coef, mean, scale = standardised_ridge(X, y, 1e-9)
    torch.testing.assert_close(coef[1:] / scale, w, atol=1e-6, rtol=0)  # raw-space weights
    model = V12Model(coef, mean, scale, {"residual_clip": 1e9})
    torch.testing.assert_close(model.residual(X), y, atol=1e-6, rtol=0)


def test_v14_ridge_recovers_known_coefficients():
    g = torch.Generator().manual_seed(2)
    B = 8
    G = torch.rand(400, B, generator=g, dtype=torch.float64) * 6
    pos = torch.arange(B, dtype=torch.float64) / (B - 1)
    F = -0.7 + 0.4 * G + 1.3 * pos
    coef = ridge(v14_design(G, B), F.reshape(-1), 1e-9)
    torch.testing.assert_close(coef, torch.tensor([-0.7, 0.4, 1.3], dtype=torch.float64), atol=1e-6, rtol=0)


def test_split_is_by_trajectory():
    anchors = [(t, a) for t in range(10) for a in range(5)]
    train, hold, tr_ids, ho_ids = split_by_trajectory(anchors, seed=3)
    assert set(tr_ids).isdisjoint(ho_ids) and sorted(tr_ids + ho_ids) == list(range(10)) and len(ho_ids) == 2
    for (t, _), h in zip(anchors, hold.tolist()):
        assert h == (t in ho_ids)
    assert (train ^ hold).all()


def test_prepare_stores_the_fits_in_the_manifest(tiny_prepared):
    man = tiny_prepared.prepared.manifest
    for fit, fname in FILES.items():
        assert fname in man["files"] and man["files"][fname]["bytes"] > 0
        meta = man["fits"][fit]
        assert meta["train_examples"] > 0 and "holdout_examples" in meta
        assert set(meta["train_trajectories"]).isdisjoint(meta["holdout_trajectories"])
        assert meta["split"].startswith("by trajectory")
    assert set(man["fits"]["parareal_v12"]["coefficients"]) == {"intercept", *V12_FEATURES}
    assert "train_residual_mse" in man["fits"]["parareal_v12"]
    assert set(man["fits"]["simple_parareal_v14"]["coefficients"]) == {"intercept", "coarse_gap_weight",
                                                                       "position_weight"}
    assert man["fits"]["simple_parareal_v14"]["holdout_metrics"]["rows"] > 0
    assert "final_markov_loss" in man["fits"]["dspark"]
    doc = json.loads((tiny_prepared.prepared.directory / V12_FILE).read_text())
    assert doc["feature_names"] == list(V12_FEATURES) and len(doc["coefficients"]) == 9
    doc14 = json.loads((tiny_prepared.prepared.directory / V14_FILE).read_text())
    assert doc14["config"] == {"damping": 1.0, "switch_threshold": 0.0, "max_corrections": 1}


def test_v12_refuses_a_top_k_other_than_fitted(tiny_prepared):
    with pytest.raises(BadInputError, match="top_k"):
        get_method("parareal_v12").build(tiny_prepared.rt, tiny_prepared.prepared, top_k=4)


# --- held-out discipline -----------------------------------------------------------------------------

class _ByteRuntime:
    """A stand-in target with a byte tokenizer: enough for the fitters' benchmark check."""

    tokenizer = object()
    vocab_size = 260

    def encode(self, text):
        return [1, *text.encode()]

    def decode(self, ids):
        return bytes(i for i in ids if i != 1).decode()


def _fit_ctx(prompt_text: str) -> FitContext:
    rt = _ByteRuntime()
    p = rt.encode(prompt_text)
    return FitContext(rt=rt, drafter=None, trajectories=[p + [40, 41, 42, 43, 44, 45]], prompt_lens=[len(p)],
                      cfg=PrepareConfig(), family="code", progress=False)


@pytest.mark.parametrize("fitter", [fit_dspark, fit_v12, fit_v14])
def test_fitters_refuse_benchmark_prompts(fitter):
    from dflash_core.data import load_prompts

    with pytest.raises(BadInputError, match="benchmark"):
        fitter(_fit_ctx(load_prompts("code").benchmark[0]))
    refuse_benchmark_trajectories(_fit_ctx(load_prompts("code").train[0]), "a fit")  # train seeds pass


@pytest.mark.parametrize("calib", [calibrate_dspark, calibrate_v10, calibrate_v11])
def test_calibration_refuses_benchmark_prompts(tiny_prepared, calib):
    from dflash_core.data import load_prompts

    text = load_prompts("code").benchmark[1]
    with pytest.raises(BadInputError, match="benchmark"):
        calib(tiny_prepared.rt, tiny_prepared.prepared, [[5, 6, 7]], 4, prompt_texts=[text], family="code")


def test_successive_halving_calibration(tiny_prepared):
    rt, prep = tiny_prepared.rt, tiny_prepared.prepared
    cal = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]]
    grid = {"temperature": (0.03, 0.10), "cutoff": (0.05, 0.15, 0.35), "budget": (1,), "slope": (1.5,)}
    out = calibrate_v10(rt, prep, cal, 6, repeats=1, grid=grid)
    plan = out["plan"]
    assert plan["total_configs"] == 6 and plan["stage1_prompts"] == 2 and plan["survivors"] == 4
    assert plan["successive_halving_prompt_config_evaluations"] == 6 * 2 + 4 * 3
    assert len(out["stage1"]["table"]) == 6 and len(out["stage2"]["table"]) == 4
    assert out["selected"] in [r["setting"] for r in out["stage2"]["table"]]
    assert out["v13"]["routing_budget"] == 1 and "budget" not in out["v13"]["options"]
    v11 = calibrate_v11(rt, prep, cal[:2], 6, repeats=1, grid={"temperature": (0.04,), "gate": (0.08, 0.16),
                                                                "budget": (1, 3), "top_k": (4,),
                                                                "pair_weight": (1.0,), "early": (0.15,)})
    assert v11["plan"]["total_configs"] == 4 and v11["selected"] in [r["setting"] for r in v11["stage2"]["table"]]
    ds = calibrate_dspark(rt, prep, cal[:2], 6, repeats=1, floors=(0.0, 0.5))
    assert ds["selected_floor"] in (0.0, 0.5) and all(r["all_exact"] for r in ds["table"])


# --- exactness ---------------------------------------------------------------------------------------

class _Recorder:
    """Wraps a proposer and records the verified part of every proposal."""

    def __init__(self, inner):
        self.inner, self.taps, self.max_width, self.drafts = inner, inner.taps, inner.max_width, []

    def begin(self, prompt, hidden):
        self.inner.begin(prompt, hidden)

    def propose(self, prefix, k):
        prop = self.inner.propose(prefix, k)
        self.drafts.append(list(prop.ids[:k]))
        return prop

    def observe(self, hidden):
        self.inner.observe(hidden)


@pytest.mark.exactness
@pytest.mark.parametrize("method", IDS)
@settings(deadline=None)
@given(data=st.data())
def test_exact_on_tiny_float64(tiny_prepared, method, data):
    rt, prep = tiny_prepared.rt, tiny_prepared.prepared
    B = prep.drafter.cfg.block_size
    prompt = list(data.draw(prompts(rt.vocab_size, max_len=24), label="prompt"))
    budget = data.draw(st.integers(0, 32), label="budget")
    width = data.draw(st.integers(1, B), label="width")
    opts = data.draw(st.sampled_from(OPTIONS[method]), label="options")
    ref, _ = greedy(rt, prompt, budget)
    prop = get_method(method).build(rt, prep, **opts)
    got, stats = speculative(rt, prop, prompt, budget, width, method=method)
    assert got == ref
    check_invariants(stats, width, budget)
    assert stats.guidance_work >= 0


@pytest.mark.exactness
@settings(deadline=None)
@given(prompt=prompts(96, max_len=24), budget=st.integers(1, 32), T=st.sampled_from([0.03, 2.0]),
       cutoff=st.sampled_from([0.15, 50.0]))
def test_v13_drafts_equal_v10_budget_one_on_tiny(tiny_prepared, prompt, budget, T, cutoff):
    rt, prep = tiny_prepared.rt, tiny_prepared.prepared
    B = prep.drafter.cfg.block_size
    cfg = {"temperature": T, "cutoff": cutoff, "slope": 1.5}
    r10 = _Recorder(get_method("boltzmann_v10").build(rt, prep, budget=1, **cfg))
    r13 = _Recorder(get_method("minop_v13").build(rt, prep, **cfg))
    a, sa = speculative(rt, r10, list(prompt), budget, B)
    b, sb = speculative(rt, r13, list(prompt), budget, B)
    assert a == b and r10.drafts == r13.drafts and sa.guidance_work == sb.guidance_work

