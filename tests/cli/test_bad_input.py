"""Bad input gets a clear error that names the problem and the fix."""

from __future__ import annotations

import pytest

from dflash_core.errors import BadInputError, DeviceError, TargetNotFoundError
from dflash_core.runtime.decode import greedy, speculative
from dflash_core.runtime.device import resolve_device, resolve_dtype
from dflash_core.runtime.proposers import RandomProposer
from dflash_core.runtime.target import TargetRuntime, load_target
from dflash_core.testing import TinySpec, build_tiny


@pytest.fixture(scope="module")
def rt():
    return TargetRuntime.from_model(build_tiny(TinySpec(max_position_embeddings=32)))


@pytest.mark.parametrize("width", [0, -1, 9])
def test_width_outside_1_to_b(rt, width):
    prop = RandomProposer(rt.vocab_size, max_width=8)
    with pytest.raises(BadInputError, match=r"width must be an integer in 1\.\.8"):
        speculative(rt, prop, [1, 2], 4, width)


@pytest.mark.parametrize("budget", [-1, 2.5, None])
def test_negative_or_non_integer_budget(rt, budget):
    with pytest.raises(BadInputError, match="token budget must be an integer >= 0"):
        greedy(rt, [1, 2], budget)


def test_empty_prompt(rt):
    with pytest.raises(BadInputError, match="empty prompt"):
        greedy(rt, [], 3)


def test_empty_text_prompt(rt):
    with pytest.raises(BadInputError, match="empty prompt"):
        rt.encode("   ")


def test_prompt_longer_than_context(rt):
    with pytest.raises(BadInputError, match="longer than the target's context of 32"):
        greedy(rt, list(range(1, 40)), 1)
    with pytest.raises(BadInputError, match="lower --tokens or shorten the prompt"):
        greedy(rt, list(range(1, 20)), 20)


def test_token_ids_out_of_vocab(rt):
    with pytest.raises(BadInputError, match="outside 0..95"):
        greedy(rt, [1, 500], 2)


def test_unknown_device():
    with pytest.raises(DeviceError, match="unknown device 'tpu'"):
        resolve_device("tpu")


def test_cuda_without_cuda_is_an_error_not_a_fallback():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the error path is for CPU-only machines")
    with pytest.raises(DeviceError, match="no silent CPU fallback|There is no silent CPU fallback"):
        resolve_device("cuda")


@pytest.mark.parametrize("dtype", ["int8", "float8", "half-ish"])
def test_unsupported_dtype(dtype):
    with pytest.raises(DeviceError, match="unsupported dtype"):
        resolve_dtype(dtype, resolve_device("cpu"))


def test_float16_on_cpu_is_refused():
    with pytest.raises(DeviceError, match="float16 is not supported on CPU"):
        resolve_dtype("float16", resolve_device("cpu"))


@pytest.mark.parametrize("name", ["", "no/such/thing/here", "./missing-dir", "weights.bin"])
def test_unknown_target(name):
    with pytest.raises(TargetNotFoundError, match="target"):
        load_target(name)


def test_unreachable_hub_says_how_to_use_a_local_checkpoint(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(TargetNotFoundError, match="--target /path/to/checkpoint"):
        load_target("nobody-here/not-a-model")


@pytest.mark.parametrize("name", ["cpu:7", "cpu:0", "CPU", "cuda:", "cuda:x", " cpu", "cuda:-1", "../../elsewhere"])
def test_device_names_other_than_cpu_cuda_cuda_n_are_refused(name):
    """torch accepts 'cpu:7' and ignores the index; the lab refuses every spelling but cpu, cuda and cuda:N."""
    with pytest.raises(DeviceError, match="unknown device"):
        resolve_device(name)


def test_cuda_index_beyond_the_device_count_is_refused(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(DeviceError, match=r"'cuda:3' does not exist: this machine has 1 CUDA device"):
        resolve_device("cuda:3")
