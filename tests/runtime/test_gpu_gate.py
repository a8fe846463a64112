"""The GPU legs on a machine without CUDA: they skip cleanly, and DFLASH_REQUIRE_GPU=1 turns each into a failure
(the gate in the root conftest). Runs a child pytest on two GPU items of tests/runtime/test_gpu.py; skipped where
CUDA is present (there the items run for real)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ITEMS = ["tests/runtime/test_gpu.py::test_device_check_on_gpu",
         "tests/runtime/test_gpu.py::test_negative_control_attention_only_rollback_is_caught_on_cuda"]


def _child(require: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "DFLASH_REQUIRE_GPU")}
    env["DFLASH_REQUIRE_GPU"] = require
    return subprocess.run([sys.executable, "-m", "pytest", *ITEMS, "-p", "no:cacheprovider", "-q", "-rsf",
                           "-o", "log_cli=false"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_gpu_legs_skip_without_cuda_and_fail_when_a_gpu_is_required():
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is present: the GPU legs run for real (tests/runtime/test_gpu.py)")
    free = _child("0")
    assert free.returncode == 0, free.stdout[-2000:]
    assert "2 skipped" in free.stdout and "CUDA not available" in free.stdout
    required = _child("1")
    assert required.returncode == 1, required.stdout[-2000:]
    # the gate fails each item in its setup, which pytest counts as an error: exit 1, never a pass or a skip
    assert "2 errors" in required.stdout and "skipped" not in required.stdout
    assert "DFLASH_REQUIRE_GPU=1 but CUDA is not available" in required.stdout


STEPS = ("device_check", "import_mini", "gpu_exactness", "gpu_bench", "dtypes", "tiny_ckpt", "prepare_cuda")


def test_the_device_script_dry_run_on_a_cpu_skips_the_cuda_steps_and_exits_3(tmp_path):
    """scripts/device_gpu_check.sh without CUDA: every CUDA step says SKIP, what the CPU can check passes, and it
    exits 3 (docs/gpu.md: 'dry run'), not 0: a dry run never reads as a passed GPU check."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is present: the script runs for real")
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "DFLASH_REQUIRE_GPU")}
    env["OUT"] = str(tmp_path)
    r = subprocess.run(["bash", "scripts/device_gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 3, r.stdout[-3000:] + r.stderr[-2000:]
    for s in STEPS:
        assert f"STEP {s} SKIP" in r.stdout
    assert "STEP gpu_legs_skip ok" in r.stdout and "STEP versions ok" in r.stdout
    assert (tmp_path / "pytest-device.ini").is_file()
