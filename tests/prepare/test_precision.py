"""The lab's one bf16 rule (runtime/precision.py), with the detector forced both ways: no training step runs
under bf16 on a CPU that would emulate it (the mini target's autocast, the drafter's matmul dtype)."""

from __future__ import annotations

import pytest

from dflash_core.errors import BadInputError
from dflash_core.runtime import precision

AVX2_ONLY = "processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu avx2\n"
SAPPHIRE = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"


@pytest.fixture
def cpu(monkeypatch):
    """Force the detector: cpu(True) or cpu(False)."""

    def force(native: bool) -> None:
        monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: native)

    return force


@pytest.mark.parametrize("text, native", [(AVX2_ONLY, False), (SAPPHIRE, True), ("", False),
                                          ("flags : avx512_bf16x\n", False), ("model name : amx_bf16\n", False)])
def test_the_detector_reads_the_flags_lines_only(tmp_path, monkeypatch, text, native):
    info = tmp_path / "cpuinfo"
    info.write_text(text)
    monkeypatch.setattr(precision, "CPUINFO", str(info))
    precision.cpu_has_native_bf16.cache_clear()
    try:
        assert precision.cpu_has_native_bf16() is native
    finally:
        precision.cpu_has_native_bf16.cache_clear()


def test_a_machine_without_cpuinfo_trains_in_float32(tmp_path, monkeypatch):
    monkeypatch.setattr(precision, "CPUINFO", str(tmp_path / "missing"))
    precision.cpu_has_native_bf16.cache_clear()
    try:
        assert precision.train_in_bf16("cpu") is False
    finally:
        precision.cpu_has_native_bf16.cache_clear()


def _autocast_seen_by_one_mini_step(cfg) -> bool:
    """Run the mini target's real training step on a tiny model; return whether its forward ran under autocast."""
    import torch
    from transformers import Lfm2ForCausalLM

    from dflash_core.prepare import minitarget as mt

    torch.manual_seed(0)
    model = Lfm2ForCausalLM(mt.model_config(cfg)).float()
    seen: list[bool] = []
    model.register_forward_pre_hook(lambda m, a: seen.append(torch.is_autocast_enabled("cpu")))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    mt._train_step(model, opt, torch.randint(3, cfg.vocab_size, (2, 9)), cfg)
    return seen == [True]


TINY = dict(vocab_size=64, hidden_size=32, num_layers=2, attention_layers=(1,), num_heads=2, num_kv_heads=1,
            intermediate_size=64, max_position_embeddings=64)


@pytest.mark.parametrize("native", [False, True])
def test_the_mini_target_autocasts_only_where_bf16_is_native(cpu, native):
    from dflash_core.prepare import minitarget as mt

    cpu(native)
    cfg = mt.MiniTargetConfig(**TINY)
    assert cfg.autocast_bf16 is None  # the default asks the rule
    assert mt.resolve_autocast(cfg).autocast_bf16 is native
    assert _autocast_seen_by_one_mini_step(cfg) is native


def test_asking_the_mini_target_for_emulated_bf16_is_refused(cpu):
    from dflash_core.prepare import minitarget as mt

    cpu(False)
    with pytest.raises(BadInputError, match="native bf16"):
        mt.resolve_autocast(mt.MiniTargetConfig(autocast_bf16=True))
    assert mt.resolve_autocast(mt.MiniTargetConfig(autocast_bf16=False)).autocast_bf16 is False


@pytest.mark.parametrize("native", [False, True])
def test_the_drafter_trains_in_bf16_only_where_it_is_native(cpu, native):
    import torch

    from dflash_core.prepare.train import LARGE_VOCAB, resolve_matmul_dtype

    cpu(native)
    want = torch.bfloat16 if native else torch.float32
    assert resolve_matmul_dtype("auto", LARGE_VOCAB) == want
    assert resolve_matmul_dtype("auto", 2048) == torch.float32  # the mini's vocabulary: fp32 everywhere
    assert resolve_matmul_dtype("float32", LARGE_VOCAB) == torch.float32
    if native:
        assert resolve_matmul_dtype("bfloat16", LARGE_VOCAB) == torch.bfloat16
    else:
        with pytest.raises(BadInputError, match="no native bf16"):
            resolve_matmul_dtype("bfloat16", LARGE_VOCAB)


@pytest.mark.parametrize("native", [False, True])
def test_the_teacher_runs_in_bf16_only_where_asked_and_native(cpu, native):
    """prepare's teacher passes: by default ('auto') bfloat16 at a real vocabulary where it is native, float32 where
    it would be emulated; 'bfloat16' given is refused there; a value outside the choices is refused."""
    from types import SimpleNamespace

    import torch

    from dflash_core.prepare.pipeline import PrepareConfig, resolve_teacher_dtype
    from dflash_core.prepare.train import LARGE_VOCAB

    cpu(native)
    real = SimpleNamespace(dtype=torch.float32, device=torch.device("cpu"), vocab_size=LARGE_VOCAB)
    assert resolve_teacher_dtype(PrepareConfig(), real) == ("bfloat16" if native else "float32")
    f64 = SimpleNamespace(dtype=torch.float64, device=torch.device("cpu"), vocab_size=LARGE_VOCAB)
    assert resolve_teacher_dtype(PrepareConfig(teacher_dtype="bfloat16"), f64) == "float64"  # keeps its dtype
    if native:
        assert resolve_teacher_dtype(PrepareConfig(teacher_dtype="bfloat16"), real) == "bfloat16"
    else:
        with pytest.raises(BadInputError, match="no native bf16"):
            resolve_teacher_dtype(PrepareConfig(teacher_dtype="bfloat16"), real)
    for bad in ("bf16", "Auto", 16, None, True):
        with pytest.raises(BadInputError, match="teacher_dtype"):
            resolve_teacher_dtype(PrepareConfig(teacher_dtype=bad), real)


def test_the_teacher_autocast_puts_the_matmuls_in_bf16_and_only_them():
    from types import SimpleNamespace

    import torch

    from dflash_core.prepare.pipeline import teacher_autocast

    rt = SimpleNamespace(device=torch.device("cpu"))
    a = torch.randn(4, 8)
    with teacher_autocast(rt, "bfloat16"):
        assert (a @ a.T).dtype == torch.bfloat16 and (a + a).dtype == torch.float32
    with teacher_autocast(rt, "float32"):
        assert (a @ a.T).dtype == torch.float32


def test_the_teacher_casts_the_linear_weights_once_for_the_same_numbers_and_gives_them_back():
    """bf16 teacher passes hold bf16 copies of the Linear weights (autocast re-casts them at every forward in
    inference mode, 41 % of a 350M teacher step): the tokens and taps are bit for bit those of plain autocast,
    the tied embedding reads its float32 table meanwhile, and the float32 Parameters themselves come back."""
    import torch

    from dflash_core.prepare.pipeline import teacher_autocast
    from dflash_core.runtime.target import TargetRuntime, batch_teacher
    from dflash_core.testing import TinySpec, build_tiny

    rt = TargetRuntime.from_model(build_tiny(TinySpec(pattern="CCACAC", dtype="float32", seed=3)))
    before = {n: p for n, p in rt.model.named_parameters()}
    prompts = [[5, 9, 17, 33, 2 + i] for i in range(6)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want_ids, want_taps, _, _ = batch_teacher(rt, prompts, 12, (1, 3))
    with teacher_autocast(rt, "bfloat16"):
        head = rt.model.get_output_embeddings()
        assert head.weight.dtype == torch.bfloat16
        assert rt.model.get_input_embeddings().weight.dtype == torch.float32
        ids, taps, _, _ = batch_teacher(rt, prompts, 12, (1, 3))
    assert ids == want_ids
    assert torch.equal(taps, want_taps)
    after = dict(rt.model.named_parameters())
    assert after.keys() == before.keys() and all(after[n] is before[n] for n in before)
    assert all(p.dtype == torch.float32 for p in after.values())
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the model is float32 again: plain autocast agrees
        assert batch_teacher(rt, prompts, 12, (1, 3))[0] == want_ids
