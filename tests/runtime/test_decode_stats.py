"""DecodeStats.record (one round's figures), DecodeStats.merge (several decodes as one) and the one median/IQR.

Hand-made inputs with hand-computed answers: a pooled rate differs from a mean of rates, a padded histogram
from a truncated one, and the inclusive quartiles (numpy's default) from the exclusive ones.
"""

from __future__ import annotations

import pytest

from dflash_core.runtime.decode import DecodeStats, Proposal
from dflash_core.stats.summary import median_iqr


def _fresh(width: int, method: str = "m") -> DecodeStats:
    return DecodeStats(method=method, width=width, accept_counts=[0] * (width + 1),
                       position_proposed=[0] * width, position_accepted=[0] * width)


def test_record_counts_one_round_and_its_proposal():
    st = _fresh(3)
    st.record(0, 0, 0.5)  # the prefill: a target call with nothing proposed
    st.record(3, 1, 0.25, Proposal(ids=[4, 5, 6], draft_seconds=0.125, select_seconds=0.0625, guidance=2,
                                   meta={"routed": 3, "flag": True, "name": "x"}))
    st.record(2, 2, 0.25, Proposal(ids=[7, 8], draft_seconds=0.125, meta={"routed": 1}))
    assert (st.target_calls, st.draft_calls, st.proposed, st.accepted) == (3, 2, 5, 3)
    assert st.accept_counts == [1, 1, 1, 0]
    assert st.position_proposed == [2, 2, 1] and st.position_accepted == [2, 1, 0]
    assert st.per_position_acceptance == [1.0, 0.5, 0.0]
    assert (st.target_seconds, st.draft_seconds, st.select_seconds) == (1.0, 0.25, 0.0625)
    assert st.guidance_work == 2
    assert st.meta == {"routed": 4}, "only numeric, non-bool meta adds up"


def test_merge_pools_counts_pads_histograms_and_adds_seconds():
    a = DecodeStats(method="m", width=2, new_tokens=5, target_calls=3, draft_calls=2, proposed=4, accepted=1,
                    accept_counts=[2, 1, 0], position_proposed=[2, 2], position_accepted=[1, 0], wall_seconds=1.0,
                    target_seconds=0.5, draft_seconds=0.25, select_seconds=0.125, guidance_work=3,
                    margins=[0.5, 1.5], meta={"k": 2})
    b = DecodeStats(method="m", width=4, new_tokens=9, target_calls=2, draft_calls=1, proposed=2, accepted=2,
                    accept_counts=[1, 0, 1, 0, 0], position_proposed=[1, 1, 0, 0], position_accepted=[1, 1, 0, 0],
                    wall_seconds=2.0, target_seconds=1.0, draft_seconds=0.5, select_seconds=0.0,
                    stopped_at_eos=True, margins=[2.5], meta={"k": 1, "j": 4})
    m = DecodeStats.merge([a, b])
    assert (m.method, m.width, m.new_tokens, m.target_calls, m.draft_calls) == ("m", 4, 14, 5, 3)
    assert (m.proposed, m.accepted, m.guidance_work) == (6, 3, 3)
    assert m.accept_counts == [3, 1, 1, 0, 0]
    assert m.position_proposed == [3, 3, 0, 0] and m.position_accepted == [2, 1, 0, 0]
    assert m.per_position_acceptance == [2 / 3, 1 / 3, 0.0, 0.0]
    assert m.acceptance_rate == 0.5  # pooled 3/6, not the mean of 1/4 and 2/2
    assert m.tokens_per_target_call == 14 / 5  # pooled, not the mean of 5/3 and 9/2
    assert (m.wall_seconds, m.target_seconds, m.draft_seconds, m.select_seconds) == (3.0, 1.5, 0.75, 0.125)
    assert m.overhead_seconds == 3.0 - 1.5 - 0.75 - 0.125
    assert m.stopped_at_eos is True and m.margins == [0.5, 1.5, 2.5] and m.meta == {"k": 3, "j": 4}
    assert a.accept_counts == [2, 1, 0] and b.new_tokens == 9, "merge must not change its inputs"


def test_merge_of_one_is_a_copy_and_margins_need_every_part():
    a = DecodeStats(method="normal", new_tokens=3, target_calls=3, accept_counts=[3], margins=[1.0, 2.0, 3.0])
    b = DecodeStats(method="normal", new_tokens=2, target_calls=2, accept_counts=[2])
    assert DecodeStats.merge([a]).to_dict() == a.to_dict()
    both = DecodeStats.merge([a, b])
    assert both.margins is None and both.accept_counts == [5] and both.position_proposed == []


def test_merge_refuses_nothing_and_mixed_methods():
    with pytest.raises(ValueError, match="at least one"):
        DecodeStats.merge([])
    with pytest.raises(ValueError, match="one method"):
        DecodeStats.merge([DecodeStats(method="a"), DecodeStats(method="b")])


@pytest.mark.parametrize("xs", [[1.0, 2.0, 3.0, 4.0], [5.0, 1.0, 3.0, 2.0, 9.0], [0.3, 0.1], [2.0, 2.0, 7.5]])
def test_median_iqr_is_numpy_default_percentiles(xs):
    import numpy as np

    med, iqr = median_iqr(xs)
    q1, q3 = np.percentile(xs, [25, 75])  # numpy's default: linear interpolation (type 7)
    assert med == pytest.approx(float(np.median(xs))) and iqr == pytest.approx(float(q3 - q1))


def test_median_iqr_small_samples():
    assert median_iqr([]) == (0.0, 0.0)
    assert median_iqr([4.5]) == (4.5, 0.0)
    assert median_iqr([1.0, 2.0, 3.0, 4.0]) == (2.5, 1.5)  # the exclusive method would say 2.5


def test_calibration_tables_use_the_same_iqr():
    from dflash_core.bench.calibrate import Trial

    row = Trial({"tau": 1.0}, "tau=1.0", tokens_per_second=[4.0, 1.0, 3.0, 2.0]).summary()
    assert (row["tokens_per_second_median"], row["tokens_per_second_iqr"]) == median_iqr([1.0, 2.0, 3.0, 4.0])
    assert row["tokens_per_second_iqr"] == 1.5 and row["trials"] == 4
