"""GPU exactness (docs/design.md §1). Marked `gpu`: skipped without CUDA, a failure with DFLASH_REQUIRE_GPU=1.

float32 with TF32 off must be token-identical to greedy on the same GPU; float16 / bfloat16 get the
certificate: any divergence from sequential greedy must sit at a near-tie below the dtype's tolerance.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from dflash_core.runtime.decode import greedy, speculative
from dflash_core.runtime.exactness import classify
from dflash_core.runtime.proposers import OracleProposer

from ..support.strategies import decode_cases

pytestmark = [pytest.mark.gpu, pytest.mark.exactness]
VOCAB = 96


@pytest.fixture(scope="module")
def cuda_models():
    import torch

    from dflash_core.runtime.target import TargetRuntime
    from dflash_core.testing import TinySpec, build_tiny

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    out = {}
    for dt in ("float32", "float16", "bfloat16"):
        m = build_tiny(TinySpec(pattern="CCACAC", dtype="float32", seed=3)).to("cuda", getattr(torch, dt))
        out[dt] = TargetRuntime.from_model(m, name=f"tiny-cuda-{dt}")
    return out


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


def test_device_check_on_gpu():
    from dflash_core.runtime.devicecheck import device_check

    info = device_check("cuda")
    assert info["fp16_matmul_ok"] and info["name"]
