"""Every speculative method (01-14) is exact on the prepared mini target, with Hypothesis (float32: exact
or tie-certified, docs/design.md §1). Needs the prepared mini target, so these carry the `mini` marker.

Prompts are drawn from all three held-out-disciplined sets of the code family (train seeds included: the
property is about the decode loop, not generalisation) and cut at a drawn token, so anchors land inside
identifiers and mid-line as well as at line starts; budgets and widths are drawn too.
"""

from __future__ import annotations

from functools import lru_cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dflash_core.methods import speculative_ids
from dflash_core.methods.runner import run_method
from dflash_core.runtime.exactness import classify

from ..support.helpers import reference

pytestmark = [pytest.mark.exactness, pytest.mark.slow]
MAX_BUDGET = 40


@lru_cache(maxsize=1)
def _texts() -> tuple[str, ...]:
    from dflash_core.store.data import load_prompts

    ps = load_prompts("code")
    return tuple(ps.train) + tuple(ps.calibration) + tuple(ps.benchmark)


@st.composite
def mini_cases(draw, block_size: int):
    text = draw(st.sampled_from(_texts()))
    cut = draw(st.floats(0.3, 1.0))
    budget = draw(st.integers(0, MAX_BUDGET))
    width = draw(st.integers(1, block_size))
    return text, cut, budget, width


@pytest.mark.parametrize("method", speculative_ids())
def test_every_method_is_exact_on_mini(mini_prepared, method):
    rt, prep = mini_prepared.rt, mini_prepared.prepared
    B = prep.drafter.cfg.block_size

    @settings(max_examples=settings().max_examples)
    @given(mini_cases(B))
    def prop(case):
        text, cut, budget, width = case
        ids = rt.encode(text)
        prompt = tuple(ids[: max(2, round(len(ids) * cut))])
        ref, margins = reference(rt, prompt, MAX_BUDGET)
        got, stats = run_method(method, rt, prep, list(prompt), budget, width)
        verdict = classify(got, ref[:budget], margins, rt.dtype)
        assert verdict.ok, f"{method} w={width} budget={budget} prompt={text!r}[:{len(prompt)} ids]: {verdict}"
        assert stats.new_tokens == budget
        assert sum((a + 1) * c for a, c in enumerate(stats.accept_counts)) == budget

    prop()
