"""Numerics pinned and recorded (runtime/numerics.py), the finite-logit check, and the peer drafter's dtype.

The TF32 / reduced-precision flags are process-wide settings that a CPU build of torch holds too, so pinning and
recording them is tested here; what they do to a GPU's kernels is tests/runtime/test_gpu.py's part.
"""

from __future__ import annotations

import pytest


@pytest.fixture
def restore_numerics():
    import torch

    from dflash_core.runtime.numerics import FP32_BACKENDS, _backend

    m = torch.backends.cuda.matmul
    saved = {p: _backend(p).fp32_precision for p in FP32_BACKENDS}
    red = (m.allow_fp16_reduced_precision_reduction, m.allow_bf16_reduced_precision_reduction)
    yield
    for p, v in saved.items():
        _backend(p).fp32_precision = v
    m.allow_fp16_reduced_precision_reduction, m.allow_bf16_reduced_precision_reduction = red


def test_pin_exact_turns_tf32_and_reduced_precision_reductions_off_through_the_current_api(restore_numerics):
    import torch

    from dflash_core.runtime.numerics import has_precision_api, numerics_record, numerics_state, pin_exact

    assert has_precision_api()  # torch 2.11 (the device image) and 2.13 (here) both have it
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    assert not numerics_state()["exact"]
    state = pin_exact()
    assert state["exact"] and state["cuda.matmul.fp32_precision"] == "ieee"
    assert state["cudnn.conv.fp32_precision"] == "ieee" and not state["bf16_reduced_precision_reduction"]
    rec = numerics_record("cpu")
    assert rec["exact"] and rec["torch"] == torch.__version__ and "gpu" not in rec


def test_the_target_refuses_non_finite_logits():
    import torch

    from dflash_core.runtime.decode import greedy
    from dflash_core.runtime.numerics import NonFiniteLogits
    from dflash_core.runtime.target import TargetRuntime
    from dflash_core.testing import TinySpec, build_tiny

    model = build_tiny(TinySpec(pattern="CACA", dtype="float32", seed=2))
    rt = TargetRuntime.from_model(model, name="tiny-inf")
    assert len(greedy(rt, [3, 4, 5], 4)[0]) == 4
    with torch.no_grad():
        model.get_output_embeddings().weight[7, 0] = float("inf")
    with pytest.raises(NonFiniteLogits, match="non-finite logits"):
        greedy(rt, [3, 4, 5], 4)


def test_the_transformers_peer_drafts_in_the_labs_drafter_dtype(tiny_prepared):
    """Beside a bfloat16 target the lab's drafter runs in float32; the `dflash_transformers` peer's drafter too,
    so that row compares implementations, not precisions. Its generate still runs end to end."""
    import torch

    from dflash_core.bench.peers import generate_all, transformers_dflash_assistant
    from dflash_core.prepare.prepared import load_prepared
    from dflash_core.runtime.target import load_target

    rt = load_target(str(tiny_prepared.path), "cpu", "bfloat16")
    prep = load_prepared(rt, home=tiny_prepared.home)
    lab = {p.dtype for p in prep.drafter.parameters()}
    peer = transformers_dflash_assistant(rt, prep)
    assert {p.dtype for p in peer.parameters()} == lab == {torch.float32}
    outs, _ = generate_all(rt, [[1, 7, 9, 11, 13]], 8, assistant_model=peer, speculation_type="dflash")
    assert len(outs[0]) == 8
