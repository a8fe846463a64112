"""Speculative decoding is token-exact against greedy, for every proposer regime and every method (Hypothesis).

Strict in float64; under the tie certificate of docs/design.md §1 in float32. The negative control (a
rollback that crops attention K/V only) must be caught by the same property.
"""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from dflash_core.methods import get_method, speculative_ids
from dflash_core.runtime.decode import greedy, speculative
from dflash_core.runtime.exactness import classify
from dflash_core.runtime.proposers import OracleProposer, RandomProposer
from dflash_core.runtime.target import TargetRuntime
from dflash_core.testing import PATTERNS, TinySpec, build_tiny

from ..support.helpers import check_invariants, check_method_property, check_path_exactness, reference
from ..support.strategies import decode_cases

VOCAB = TinySpec().vocab_size
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
pytestmark = pytest.mark.exactness


@cache
def _runtime(pattern: str, dtype: str, device: str, rollback: str = "exact") -> TargetRuntime:
    model = build_tiny(TinySpec(pattern=pattern, dtype=dtype, seed=len(pattern))).to(device)
    return TargetRuntime.from_model(model, name=f"tiny-{pattern}-{dtype}", rollback=rollback)


def _reference(rt: TargetRuntime, prompt: tuple[int, ...]):
    """Greedy ids and top-2 gaps for the largest budget; smaller budgets are prefixes (no EOS stop)."""
    return reference(rt, tuple(prompt))


def assert_oracle_exact(rt: TargetRuntime, case) -> None:
    ref, margins = _reference(rt, case.prompt)
    want = list(ref[: case.budget])
    prop = OracleProposer(case.prompt, ref, VOCAB, case.corrupt)
    got, stats = speculative(rt, prop, list(case.prompt), case.budget, case.width)
    verdict = classify(got, want, margins, rt.dtype)
    assert verdict.kind == "exact", f"{verdict} for prompt={case.prompt} budget={case.budget} width={case.width}"
    check_invariants(stats, case.width, case.budget)
    if not case.corrupt and case.budget > 1:
        assert stats.accepted == stats.proposed  # an uncorrupted oracle is always fully accepted


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pattern", sorted(PATTERNS))
@given(case=decode_cases(VOCAB))
def test_oracle_and_corrupted_oracle_are_exact_float64(pattern, device, case):
    assert_oracle_exact(_runtime(pattern, "float64", device), case)


@pytest.mark.parametrize("device", DEVICES)
@given(case=decode_cases(VOCAB))
def test_random_proposer_is_exact_float64(device, case):
    rt = _runtime("CACA", "float64", device)
    ref, _ = _reference(rt, case.prompt)
    got, stats = speculative(rt, RandomProposer(VOCAB, seed=len(case.prompt)), list(case.prompt), case.budget,
                             case.width)
    assert got == list(ref[: case.budget])
    check_invariants(stats, case.width, case.budget)


@pytest.mark.parametrize("device", DEVICES)
@given(case=decode_cases(VOCAB))
def test_float32_is_exact_or_tie_certified(device, case):
    rt = _runtime("CCAC", "float32", device)
    ref, margins = _reference(rt, case.prompt)
    prop = OracleProposer(case.prompt, ref, VOCAB, case.corrupt)
    got, stats = speculative(rt, prop, list(case.prompt), case.budget, case.width)
    verdict = classify(got, list(ref[: case.budget]), margins, rt.dtype)
    assert verdict.ok, f"diverged beyond the float32 tie tolerance: {verdict}"
    assert stats.new_tokens == case.budget


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pattern", ["CACA", "ACCA"])
@given(case=decode_cases(VOCAB, max_width=1))
def test_cached_greedy_equals_uncached_and_generate(pattern, device, case):
    import torch

    rt = _runtime(pattern, "float64", device)
    cached, _ = greedy(rt, list(case.prompt), case.budget)
    uncached, _ = greedy(rt.with_options(cached=False), list(case.prompt), case.budget)
    assert cached == uncached
    if case.budget:
        inp = torch.tensor([list(case.prompt)], device=rt.device)
        gen = rt.model.generate(inp, max_new_tokens=case.budget, do_sample=False, eos_token_id=None,
                                pad_token_id=0)
        assert gen[0, len(case.prompt):].tolist() == cached


@pytest.mark.parametrize("device", DEVICES)
@given(case=decode_cases(VOCAB))
def test_uncached_speculative_is_exact(device, case):
    rt = _runtime("CACA", "float64", device).with_options(cached=False)
    assert_oracle_exact(rt, case)


@pytest.mark.parametrize("pattern", ["CACA", "CCACAC"])
def test_negative_control_attention_only_rollback_is_caught(pattern):
    """Cropping only attention K/V leaves the conv windows advanced: the property must fail."""
    kv_only = _runtime(pattern, "float64", "cpu", rollback="kv_only")

    # No shrinking: we only need to know a counterexample exists, and shrinking it costs minutes.
    @settings(phases=(Phase.explicit, Phase.generate), max_examples=60, database=None)
    @given(case=decode_cases(VOCAB))
    def prop(case):
        assert_oracle_exact(kv_only, case)

    with pytest.raises(AssertionError, match="diverged"):
        prop()


def test_eos_stop_is_respected():
    rt = _runtime("CACA", "float64", "cpu")
    prompt = [5, 6, 7]
    ref, _ = greedy(rt, prompt, 40)
    eos = ref[10]  # pretend the 11th greedy token is EOS
    rt.model.config.eos_token_id = eos
    try:
        want, gstats = greedy(rt, prompt, 40, stop_at_eos=True)
        got, sstats = speculative(rt, OracleProposer(prompt, ref, VOCAB), prompt, 40, 4, stop_at_eos=True)
    finally:
        rt.model.config.eos_token_id = 2
    assert want == ref[: ref.index(eos) + 1]
    assert got == want and sstats.stopped_at_eos and gstats.stopped_at_eos


def test_onednn_path_is_exact_and_keeps_the_artifact_identity(tmp_path):
    """The prepacked oneDNN path (fast path) under the same contract: speculative == greedy on that
    path, and its greedy agrees with eager greedy up to certified ties; the target identity is unchanged."""
    import torch

    from dflash_core.runtime.kernels import apply_kernels
    from dflash_core.runtime.target import load_target
    from dflash_core.store.artifacts import target_identity

    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch build has no oneDNN")
    build_tiny(TinySpec(pattern="CCACAC", dtype="float32", seed=3)).save_pretrained(tmp_path)
    eager = load_target(str(tmp_path), "cpu", "float32", kernels="eager")
    fast = load_target(str(tmp_path), "cpu", "float32", kernels="onednn")
    assert fast.kernels == "onednn" and type(fast.model.lm_head).__name__ == "MkldnnLinear"
    assert target_identity(fast) == target_identity(eager)
    with pytest.raises(Exception, match="CPU float32"):
        apply_kernels(build_tiny(TinySpec(dtype="float64")), "onednn")
    check_path_exactness(fast, eager, VOCAB)


@pytest.mark.parametrize("path", ["onednn", "tuned"])
def test_every_method_runs_exact_on_the_onednn_and_tuned_paths_with_a_draft_vocabulary(tmp_path, path):
    """`--kernels onednn` and `tuned` (what `auto` picks for a real target, whose probe may choose oneDNN) with a
    drafter over a draft vocabulary, as prepare trains at a real vocabulary: every speculative method decodes what
    greedy decodes on that path. Until 8586539 the first dflash draft crashed on the oneDNN path (the prepacked
    head's weight has no row gather)."""
    from dataclasses import replace

    import torch

    from dflash_core.prepare.pipeline import prepare
    from dflash_core.prepare.prepared import load_prepared
    from dflash_core.runtime.target import load_target
    from dflash_core.testing import tiny_prepare_config

    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch build has no oneDNN")
    ckpt, home = tmp_path / "ckpt", tmp_path / "home"
    build_tiny(TinySpec(pattern="CCACAC", dtype="float32", seed=3)).save_pretrained(ckpt)
    cfg = tiny_prepare_config()
    cfg = replace(cfg, train=replace(cfg.train, draft_vocab=48))
    prepare(str(ckpt), home=home, cfg=cfg, rt=load_target(str(ckpt), "cpu", "float32"), progress=False)
    fast = load_target(str(ckpt), "cpu", "float32", kernels=path)
    prep = load_prepared(fast, home=home)
    assert prep.drafter.cfg.draft_vocab == 48
    assert type(fast.model.lm_head).__name__ == {"onednn": "MkldnnLinear", "tuned": "TunedLinear"}[path]
    prompt = [1, 7, 9, 11, 13, 17, 19]
    ref, st_ref = greedy(fast, prompt, 24, record_margins=True)
    for method in speculative_ids():
        got, _ = speculative(fast, get_method(method).build(fast, prep), list(prompt), 24, 3, method=method)
        assert classify(got, ref, st_ref.margins, torch.float32).kind == "exact", method


@pytest.mark.parametrize("method", speculative_ids())
@settings(deadline=None)
@given(data=st.data())
def test_every_method_is_exact_on_tiny_float64(tiny_prepared, method, data):
    """The one method property: every speculative id, drawn options, prompt, budget and width, float64 strict."""
    check_method_property(tiny_prepared.rt, tiny_prepared.prepared, method, data)
