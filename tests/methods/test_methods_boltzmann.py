"""The hashed Boltzmann rules: 06 boltzmann, 10 boltzmann_v10 and 13 minop_v13 (sparse uncertainty routing)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dflash_core.errors import BadInputError
from dflash_core.methods import get_method
from dflash_core.methods.boltzmann import SALT_BOLTZMANN, boltzmann_pick, row_temperature
from dflash_core.methods.routing import route_v10, route_v13, v13_options
from dflash_core.methods.support.common import context_fingerprint, gumbel, top2, uniform
from dflash_core.runtime.decode import speculative

from ..support.helpers import Recorder, crafted_logits
from ..support.strategies import prompts, tied_logits, top2_lists


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


def test_boltzmann_select_at_zero_temperature_is_dflash(tiny_prepared):
    rt, prep = tiny_prepared.rt, tiny_prepared.prepared
    logits = crafted_logits([0.3, 0.01, 2.0, 0.2], rt.vocab_size, seed=3)
    prop = get_method("boltzmann").build(rt, prep, temperature=0.0)
    ids, guidance, _ = prop.select(logits, None, [4, 5, 6], 4)
    assert ids == logits.argmax(-1).tolist() and guidance == 0
    hot = get_method("boltzmann").build(rt, prep, temperature=1e-12)
    assert hot.select(logits, None, [4, 5, 6], 4)[0] == ids
    warm = get_method("boltzmann").build(rt, prep)
    ids2, guidance2, _ = warm.select(logits, None, [4, 5, 6], 4)
    assert guidance2 == 4 * 8 and ids2 == warm.select(logits, None, [4, 5, 6], 4)[0]  # deterministic


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


@pytest.mark.exactness
@settings(deadline=None)
@given(prompt=prompts(96, max_len=24), budget=st.integers(1, 32), T=st.sampled_from([0.03, 2.0]),
       cutoff=st.sampled_from([0.15, 50.0]))
def test_v13_drafts_equal_v10_budget_one_on_tiny(tiny_prepared, prompt, budget, T, cutoff):
    rt, prep = tiny_prepared.rt, tiny_prepared.prepared
    B = prep.drafter.cfg.block_size
    cfg = {"temperature": T, "cutoff": cutoff, "slope": 1.5}
    r10 = Recorder(get_method("boltzmann_v10").build(rt, prep, budget=1, **cfg))
    r13 = Recorder(get_method("minop_v13").build(rt, prep, **cfg))
    a, sa = speculative(rt, r10, list(prompt), budget, B)
    b, sb = speculative(rt, r13, list(prompt), budget, B)
    assert a == b and r10.drafts == r13.drafts and sa.guidance_work == sb.guidance_work


