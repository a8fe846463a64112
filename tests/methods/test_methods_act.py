"""08 act: adaptive verifier-suffix trimming, and its calibration on calibration prompts only."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dflash_core.errors import BadInputError
from dflash_core.methods import get_method
from dflash_core.methods.act import act_keep

from ..support.helpers import crafted_logits


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


def test_act_select_trims_at_first_low_margin_row(tiny_prepared):
    rt, prep = tiny_prepared.rt, tiny_prepared.prepared
    V = rt.vocab_size
    logits = crafted_logits([3.0, 2.0, 0.5, 4.0], V)
    argmax = logits.argmax(-1).tolist()
    act = get_method("act").build(rt, prep, tau=1.0)
    ids, guidance, meta = act.select(logits, None, [1], 4)
    assert ids == argmax[:2] and guidance == 0 and meta["act_trimmed"] == 2 and meta["act_verified"] == 2
    ids, _, meta = act.select(logits, None, [1], 1)
    assert ids == argmax[:1] and meta["act_trimmed"] == 0
    low = crafted_logits([0.1, 3.0, 3.0, 3.0], V, seed=1)
    assert act.select(low, None, [1], 4)[0] == low.argmax(-1).tolist()[:1]  # never below one token
    plain = get_method("act").build(rt, prep, tau=0.0)
    assert plain.select(low, None, [1], 4)[0] == low.argmax(-1).tolist()


@pytest.mark.exactness
def test_act_at_tau_zero_is_dflash(tiny_prepared):
    from dflash_core.methods.runner import run_method

    rt, prep = tiny_prepared.rt, tiny_prepared.prepared
    for prompt in ([5], [7, 8, 9, 10], list(range(3, 30))):
        a_ids, a = run_method("act", rt, prep, prompt, 24, 3, tau=0.0)
        d_ids, d = run_method("dflash", rt, prep, prompt, 24, 3)
        assert a_ids == d_ids and (a.target_calls, a.accepted, a.proposed) == (d.target_calls, d.accepted, d.proposed)
        assert a.meta["act_trimmed"] == 0


def test_calibrate_act_on_tiny(tiny_prepared):
    from dflash_core.bench.calibrate import calibrate_method

    rt, prep = tiny_prepared.rt, tiny_prepared.prepared
    res = calibrate_method(rt, prep, "act", [[5, 6, 7], [11, 12]], 6, 3, grid={"tau": (0.0, 1.0)})
    assert res["selected"]["tau"] in (0.0, 1.0) and res["selected_options"] == res["selected"]
    assert [row["setting"]["tau"] for row in res["table"]] == [0.0, 1.0]
    assert all(row["all_exact"] and row["trials"] == 2 for row in res["table"])


def test_calibrate_act_refuses_benchmark_prompts(tiny_prepared):
    from dflash_core.bench.calibrate import calibrate_method
    from dflash_core.store.data import load_prompts

    rt, prep = tiny_prepared.rt, tiny_prepared.prepared
    bench = load_prompts("english").benchmark[0]
    with pytest.raises(BadInputError, match="benchmark"):
        calibrate_method(rt, prep, "act", [[5, 6, 7]], 6, 3, prompt_texts=[bench], family="english")


