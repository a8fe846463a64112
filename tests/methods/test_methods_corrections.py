"""The fitted corrections 09 dspark_lite, 12 parareal_v12 and 14 simple_parareal_v14: their rules on crafted
inputs, the fits (ridge, split by trajectory, manifest), held-out discipline and calibration."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dflash_core.bench.calibrate import calibrate_method
from dflash_core.errors import BadInputError
from dflash_core.methods import FitContext, calibrated, get_method
from dflash_core.methods.dspark import DSPARK_FILE, DSparkHeads
from dflash_core.methods.parareal_v12 import V12_FEATURES, V12_FILE, V12Model, standardised_ridge
from dflash_core.methods.parareal_v14 import V14_FILE, v14_choose, v14_design
from dflash_core.methods.support.fitting import ridge, split_by_trajectory
from dflash_core.prepare.pipeline import PrepareConfig

from ..support.strategies import top2_lists

FILES = {"dspark": DSPARK_FILE, "parareal_v12": V12_FILE, "simple_parareal_v14": V14_FILE}


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


@pytest.mark.parametrize("name", ["dspark", "parareal_v12", "simple_parareal_v14"])
def test_fitters_refuse_benchmark_prompts(name):
    """Through the registered Fitter, as prepare calls it: the one held-out guard runs before the fit."""
    from dflash_core.methods import fitters
    from dflash_core.store.data import check_sequences, load_prompts

    fitter = {f.name: f for f in fitters()}[name]
    with pytest.raises(BadInputError, match="benchmark"):
        fitter(_fit_ctx(load_prompts("code").benchmark[0]))
    ctx = _fit_ctx(load_prompts("code").train[0])
    assert check_sequences(ctx.rt, ctx.trajectories, "a fit")  # train seeds pass (checked, clean)


@pytest.mark.parametrize("method", ["dspark_lite", "boltzmann_v10", "gated_mobs_v11"])
def test_calibration_refuses_benchmark_prompts(tiny_prepared, method):
    from dflash_core.store.data import load_prompts

    text = load_prompts("code").benchmark[1]
    with pytest.raises(BadInputError, match="benchmark"):
        calibrate_method(tiny_prepared.rt, tiny_prepared.prepared, method, [[5, 6, 7]], 4, 4, prompt_texts=[text],
                         family="code")


def test_a_method_that_reuses_another_calibration_has_no_search_of_its_own(tiny_prepared):
    """V13 reuses V10's choice (registry: Calibration(reuses=...)): asking to search it names the method to run."""
    with pytest.raises(BadInputError, match="boltzmann_v10"):
        calibrate_method(tiny_prepared.rt, tiny_prepared.prepared, "minop_v13", [[5, 6, 7]], 4, 4)


def test_successive_halving_calibration(tiny_prepared):
    rt, prep = tiny_prepared.rt, tiny_prepared.prepared
    cal = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]]
    grid = {"temperature": (0.03, 0.10), "cutoff": (0.05, 0.15, 0.35), "budget": (1,), "slope": (1.5,)}
    out = calibrate_method(rt, prep, "boltzmann_v10", cal, 6, 4, grid=grid, stage1_prompts=2)
    plan = out["plan"]
    assert plan["total_configs"] == 6 and plan["stage1_prompts"] == 2 and plan["survivors"] == 4
    assert plan["successive_halving_prompt_config_evaluations"] == 6 * 2 + 4 * 3
    assert len(out["stage1"]["table"]) == 6 and len(out["stage2"]["table"]) == 4
    assert out["selected"] in [r["setting"] for r in out["stage2"]["table"]]
    v13 = get_method("minop_v13").calibration
    assert v13.reuses == "boltzmann_v10" and "budget" not in v13.adapt(out["selected"])
    v11 = calibrate_method(rt, prep, "gated_mobs_v11", cal[:2], 6, 4, grid={
        "temperature": (0.04,), "gate": (0.08, 0.16), "budget": (1, 3), "top_k": (4,), "pair_weight": (1.0,),
        "early": (0.15,)})
    assert v11["plan"]["total_configs"] == 4 and v11["selected"] in [r["setting"] for r in v11["stage2"]["table"]]
    ds = calibrate_method(rt, prep, "dspark_lite", cal[:2], 6, 4, grid={"floor": (0.0, 0.5)})
    assert ds["selected"]["floor"] in (0.0, 0.5) and all(r["all_exact"] for r in ds["table"])




@pytest.mark.parametrize("method", [m.id for m in calibrated() if m.calibration.reuses is None])
def test_every_calibrated_method_calibrates_through_the_registry(tiny_prepared, method):
    """Every method the registry calibrates runs its own search (its grid cut to two settings of the first axis) on
    calibration ids and selects an exact setting from its table; a new calibrated method is covered as it is."""
    cal = get_method(method).calibration
    first = next(iter(cal.grid))
    grid = {k: tuple(v[:2]) if k == first else tuple(v[:1]) for k, v in cal.grid.items()}
    out = calibrate_method(tiny_prepared.rt, tiny_prepared.prepared, method, [[5, 6, 7], [9, 10, 11, 12]], 6, 3,
                           grid=grid)
    table = out["table"] if "table" in out else out["stage2"]["table"]
    assert out["selected"] in [r["setting"] for r in table] and out["selected_options"] == out["selected"]
    assert all(r["all_exact"] for r in table)
