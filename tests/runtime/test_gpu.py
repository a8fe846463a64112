"""GPU legs of the exactness suite (docs/design.md §1, docs/gpu.md). Marked `gpu`: skipped cleanly without CUDA, a
failure with DFLASH_REQUIRE_GPU=1 (the root conftest's gate; tests/runtime/test_gpu_gate.py proves both on this CPU).

Every GPU test runs with TF32 and reduced-precision reductions off (`runtime.numerics.pin_exact`, called by the
gate before each GPU item, so no result depends on test order). float64 on CUDA is strict: every method, the
drafter and the oracle decode exactly greedy's ids; float32 must be exact or tie-certified; float16 / bfloat16 get
the certificate (divergence only at near-ties below the dtype's tolerance). The negative control (attention-only
rollback) must be caught on the GPU too.
"""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from dflash_core.methods import get_method, speculative_ids
from dflash_core.runtime.decode import greedy, speculative
from dflash_core.runtime.exactness import classify
from dflash_core.runtime.proposers import OracleProposer
from dflash_core.testing import TinySpec, build_tiny

from ..support.helpers import check_method_property, reference
from ..support.strategies import decode_cases

pytestmark = [pytest.mark.gpu, pytest.mark.exactness]
VOCAB = 96
FIXED_PROMPTS = ((1, 7, 9, 11, 13, 17, 19), (5, 6, 7), (3, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40))


@pytest.fixture(scope="module")
def cuda_models():
    import torch

    from dflash_core.runtime.target import TargetRuntime

    out = {}
    for dt in ("float32", "float16", "bfloat16"):
        m = build_tiny(TinySpec(pattern="CCACAC", dtype="float32", seed=3)).to("cuda", getattr(torch, dt))
        out[dt] = TargetRuntime.from_model(m, name=f"tiny-cuda-{dt}")
    return out


@cache
def _cuda_prepared(path: str, home: str, dtype: str):
    """The session's prepared tiny target (tests/conftest.py `tiny_prepared`, built on the CPU) loaded on CUDA."""
    from dflash_core.prepare.prepared import load_prepared
    from dflash_core.runtime.target import load_target

    rt = load_target(path, "cuda", dtype)
    return rt, load_prepared(rt, home=home)


def test_exactness_runs_with_tf32_and_reduced_precision_off():
    import torch

    from dflash_core.runtime.numerics import numerics_record

    rec = numerics_record(torch.device("cuda"))
    assert rec["exact"], rec
    assert rec["gpu"] and rec["conv_kernel"]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@settings(deadline=None)
@given(case=decode_cases(VOCAB, max_budget=32))
def test_cuda_speculative_is_exact_or_tie_certified(cuda_models, dtype, case):
    rt = cuda_models[dtype]
    ref, gst = greedy(rt, list(case.prompt), case.budget, record_margins=True)
    got, _ = speculative(rt, OracleProposer(case.prompt, ref, VOCAB, case.corrupt), list(case.prompt),
                         case.budget, case.width)
    verdict = classify(got, ref, gst.margins, rt.dtype)
    if dtype == "float32":
        assert verdict.kind == "exact", verdict
    else:
        assert verdict.ok, f"{dtype} diverged beyond its tie tolerance: {verdict}"


@pytest.mark.parametrize("method", speculative_ids())
@settings(deadline=None)
@given(data=st.data())
def test_every_method_is_exact_on_cuda_float64(tiny_prepared, method, data):
    """The CPU suite's one method property (test_exactness.py), on CUDA: float64, strict, drawn options."""
    check_method_property(*_cuda_prepared(str(tiny_prepared.path), str(tiny_prepared.home), "float64"), method, data)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("method", speculative_ids())
def test_every_method_is_exact_or_tie_certified_on_cuda(tiny_prepared, method, dtype):
    """Each method at the GPU's working dtypes: float32 (TF32 off) exact or tie-certified, fp16/bf16 certified."""
    rt, prep = _cuda_prepared(str(tiny_prepared.path), str(tiny_prepared.home), dtype)
    for prompt in FIXED_PROMPTS:
        ref, gst = greedy(rt, list(prompt), 24, record_margins=True)
        for width in (1, 3, prep.drafter.cfg.block_size):
            got, _ = speculative(rt, get_method(method).build(rt, prep), list(prompt), 24, width, method=method)
            verdict = classify(got, ref, gst.margins, rt.dtype)
            assert verdict.ok, f"{method} {dtype} width {width} prompt {prompt}: {verdict}"


def test_the_drafter_on_cuda_drafts_what_it_drafts_on_the_cpu(tiny_prepared):
    """The same drafter weights on CUDA float64: its block logits equal the CPU's within float64 rounding and its
    argmax block is the same ids."""
    import torch

    from dflash_core.runtime.drafter import DraftState

    rt_gpu, prep_gpu = _cuda_prepared(str(tiny_prepared.path), str(tiny_prepared.home), "float64")
    rt_cpu, prep_cpu = tiny_prepared.rt, tiny_prepared.prepared
    taps = tuple(prep_cpu.drafter.cfg.taps)
    for prompt in FIXED_PROMPTS:
        blocks = []
        for rt, prep in ((rt_cpu, prep_cpu), (rt_gpu, prep_gpu)):
            step = rt.session(recording=False).prefill(list(prompt), taps=taps)
            state = DraftState(prep.drafter)
            state.extend(step.hidden)
            logits, _ = state.draft(prompt[-1], rt.model.get_input_embeddings(), rt.model.get_output_embeddings())
            blocks.append(logits.double().cpu())
        torch.testing.assert_close(blocks[1], blocks[0], rtol=1e-9, atol=1e-9)
        assert blocks[1].argmax(-1).tolist() == blocks[0].argmax(-1).tolist()


def test_negative_control_attention_only_rollback_is_caught_on_cuda():
    """Cropping only attention K/V on the GPU leaves the conv windows advanced: the property must fail there too."""
    import torch

    from dflash_core.runtime.target import TargetRuntime

    model = build_tiny(TinySpec(pattern="CCACAC", dtype="float64", seed=6)).to("cuda", torch.float64)
    kv_only = TargetRuntime.from_model(model, name="tiny-cuda-kv-only", rollback="kv_only")
    exact = kv_only.with_options(rollback="exact")

    @settings(phases=(Phase.explicit, Phase.generate), max_examples=60, database=None, deadline=None)
    @given(case=decode_cases(VOCAB))
    def prop(case):
        ref, margins = reference(exact, case.prompt)
        got, _ = speculative(kv_only, OracleProposer(case.prompt, ref, VOCAB, case.corrupt), list(case.prompt),
                             case.budget, case.width)
        verdict = classify(got, list(ref[: case.budget]), margins, kv_only.dtype)
        assert verdict.kind == "exact", f"{verdict}"

    with pytest.raises(AssertionError, match="diverged"):
        prop()


def test_dflash_round_synchronises_the_gpu_once(tiny_prepared):
    """CUDA's own count: with torch's sync debug mode on, a dflash decode warns once per synchronising call; the
    decode makes one per target call (the acceptance transfer) plus the prefill's and the clock's two."""
    import warnings

    import torch

    rt, prep = _cuda_prepared(str(tiny_prepared.path), str(tiny_prepared.home), "float32")
    prompt = list(FIXED_PROMPTS[0])
    speculative(rt, get_method("dflash").build(rt, prep), prompt, 24, 4, method="dflash")  # warm-up
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            _, stats = speculative(rt, get_method("dflash").build(rt, prep), prompt, 24, 4, method="dflash")
    finally:
        torch.cuda.set_sync_debug_mode(0)
    syncs = [w for w in seen if "synchroniz" in str(w.message).lower()]
    assert len(syncs) <= stats.target_calls + 2, (len(syncs), stats.target_calls, [str(w.message) for w in syncs])


def test_prepare_on_cuda_trains_where_it_is_asked_and_records_it(tmp_path):
    """`prepare --device cuda` on a tiny target: teacher and training on the GPU, the manifest says so, and every
    method decodes exactly with the drafter it trained (float64 on the GPU)."""
    import json

    from dflash_core.prepare.pipeline import prepare
    from dflash_core.prepare.prepared import load_prepared
    from dflash_core.runtime.target import load_target
    from dflash_core.testing import tiny_prepare_config

    ckpt, home = tmp_path / "ckpt", tmp_path / "home"
    build_tiny(TinySpec(pattern="CCACAC", dtype="float32", seed=3)).save_pretrained(ckpt)
    out = prepare(str(ckpt), home=home, cfg=tiny_prepare_config(), progress=False, device="cuda")
    doc = json.loads((out / "manifest.json").read_text())
    assert doc["prepare_config"]["device"] == "cuda"
    assert doc["device"]["backend"] == "nccl" and doc["device"]["numerics"]["gpu"]
    rt = load_target(str(ckpt), "cuda", "float64")
    prep = load_prepared(rt, home=home)
    prompt = list(FIXED_PROMPTS[0])
    ref, _ = greedy(rt, prompt, 24)
    for method in speculative_ids():
        got, _ = speculative(rt, get_method(method).build(rt, prep), prompt, 24, 3, method=method)
        assert got == ref, method


def test_device_check_on_gpu():
    from dflash_core.runtime.devicecheck import device_check

    info = device_check("cuda")
    assert info["fp16_matmul_ok"] and info["name"] and info["numerics"]["exact"]
