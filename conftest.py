"""Root conftest: command-line options, Hypothesis profiles, the GPU gate and the report plugin.

Nothing here imports torch at module level: the `pytest-benchmark` CLI imports this file too.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

pytest_plugins = ["dflash_core.report.plugin"]

# Profiles extend Hypothesis' built-in `ci` profile (derandomized, no deadline, no database), which
# Hypothesis loads by itself whenever CI is set. Model-backed properties never use a deadline.
settings.register_profile("dev", max_examples=10, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", settings.get_profile("ci"), max_examples=40,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors])
settings.register_profile("thorough", max_examples=400, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
if os.environ.get("CI"):
    settings.load_profile("ci")
else:
    settings.load_profile(os.environ.get("DFLASH_HYPOTHESIS_PROFILE", "dev"))


def pytest_addoption(parser):
    group = parser.getgroup("dflash", "DFlash Mini Lab")
    group.addoption("--target", default=os.environ.get("DFLASH_TARGET", "mini"),
                    help="target: 'mini' (embedded default), a local checkpoint directory, or a hub id")
    group.addoption("--device", default=os.environ.get("DFLASH_DEVICE", "cpu"),
                    help="device for benchmarks: cpu or cuda")
    group.addoption("--dtype", default=os.environ.get("DFLASH_DTYPE", "auto"),
                    help="target dtype: auto (float32 on CPU, DFLASH_GPU_DTYPE or float16 on CUDA), float32, "
                         "float64, float16, bfloat16")
    group.addoption("--kernels", default=os.environ.get("DFLASH_KERNELS", "auto"),
                    help="linear-layer execution path: auto (oneDNN prepacked for CPU float32 targets with hidden "
                         ">= 1024, else eager), eager, onednn")


def _cuda_ok() -> bool:
    import torch  # lazy: only when a gpu-marked item is about to run

    return torch.cuda.is_available()


def pytest_runtest_setup(item):
    """The GPU gate: skip gpu items cleanly without CUDA, fail them loudly when a GPU is required."""
    if item.get_closest_marker("gpu") is None:
        return
    if _cuda_ok():
        return
    from dflash_core.device import require_gpu

    if require_gpu():
        pytest.fail("DFLASH_REQUIRE_GPU=1 but CUDA is not available on this machine: run on a GPU runner "
                    "with a CUDA build of torch, or unset DFLASH_REQUIRE_GPU", pytrace=False)
    pytest.skip("CUDA not available (set DFLASH_REQUIRE_GPU=1 to make this a failure)")
