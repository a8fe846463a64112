"""Root conftest: command-line options, Hypothesis profiles, the GPU gate and the report plugin.

Nothing heavy is imported at module level (no torch, no hypothesis): the `pytest-benchmark` CLI imports
this file before pytest reads pytest.ini, and a module imported that early can no longer be
assertion-rewritten, which `filterwarnings = error` turns into a crash.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["dflash_core.report.plugin"]


def pytest_addoption(parser):
    from dflash_core.errors import DFlashError
    from dflash_core.options import add_pytest_option, pytest_options

    group = parser.getgroup("dflash", "DFlash Mini Lab")
    try:
        for name in pytest_options("root"):
            add_pytest_option(group, name)
    except DFlashError as exc:
        raise pytest.UsageError(str(exc)) from exc


@pytest.hookimpl(tryfirst=True)  # before Hypothesis' own plugin, so --hypothesis-profile still wins
def pytest_configure(config):
    """Register the Hypothesis profiles (here, not at import: see the module docstring)."""
    import os

    from hypothesis import HealthCheck, settings

    from dflash_core.errors import DFlashError
    from dflash_core.options import env_value

    # Profiles extend Hypothesis' built-in `ci` profile (derandomized, no deadline, no database), which
    # Hypothesis loads by itself whenever CI is set. Model-backed properties never use a deadline.
    settings.register_profile("dev", max_examples=10, deadline=None,
                              suppress_health_check=[HealthCheck.too_slow])
    settings.register_profile("ci", settings.get_profile("ci"), max_examples=40,
                              suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors])
    settings.register_profile("thorough", max_examples=400, deadline=None,
                              suppress_health_check=[HealthCheck.too_slow])
    # one lent GPU call (scripts/device_gpu_check.sh): a few derandomized examples per property, every leg reached
    settings.register_profile("device", max_examples=4, deadline=None, derandomize=True, database=None,
                              suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors])
    if os.environ.get("CI"):
        settings.load_profile("ci")
        return
    try:
        settings.load_profile(env_value("hypothesis_profile"))
    except DFlashError as exc:
        raise pytest.UsageError(str(exc)) from exc


def _cuda_ok() -> bool:
    import torch  # lazy: only when a gpu-marked item is about to run

    return torch.cuda.is_available()


def pytest_runtest_setup(item):
    """The GPU gate: skip gpu items cleanly without CUDA, fail them loudly when a GPU is required; with CUDA, pin
    the exact numerics first (runtime/numerics.py)."""
    if item.get_closest_marker("gpu") is None:
        return
    if _cuda_ok():
        from dflash_core.runtime.numerics import pin_exact

        pin_exact()  # TF32 and reduced-precision reductions off before every GPU item, whatever ran before it
        return
    from dflash_core.runtime.device import require_gpu

    if require_gpu():
        pytest.fail("DFLASH_REQUIRE_GPU=1 but CUDA is not available on this machine: run on a GPU runner "
                    "with a CUDA build of torch, or unset DFLASH_REQUIRE_GPU", pytrace=False)
    pytest.skip("CUDA not available (set DFLASH_REQUIRE_GPU=1 to make this a failure)")
