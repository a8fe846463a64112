"""`prepare --device` (prepare/devices.py): the CPU recipe unchanged, a GPU asked for where there is none refused
before any work. The CUDA leg (teacher and training on the GPU, recorded in the manifest) is in
tests/runtime/test_gpu.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dflash_core.testing import TinySpec, build_tiny, tiny_prepare_config


def _files(out) -> dict:
    doc = json.loads((out / "manifest.json").read_text())
    return {k: (v["sha256"], v["bytes"]) for k, v in doc["files"].items()}, doc


def test_prepare_device_cpu_builds_byte_identical_artifacts_and_the_manifest_it_wrote_before(tmp_path):
    """--device cpu is the recipe every home and the reference bundle were built with: the same files, bit for bit,
    the same artifact folder, and a manifest without a device record or a device key in its config (so the
    recorded configs of existing homes and of the shipped bundle compare equal)."""
    from dflash_core.prepare.pipeline import prepare

    ckpt = tmp_path / "ckpt"
    build_tiny(TinySpec(pattern="CCACAC", dtype="float32", seed=3)).save_pretrained(ckpt)
    plain = prepare(str(ckpt), home=tmp_path / "a", cfg=tiny_prepare_config(), progress=False)
    cpu = prepare(str(ckpt), home=tmp_path / "b", cfg=tiny_prepare_config(), progress=False, device="cpu")
    (files_a, doc_a), (files_b, doc_b) = _files(plain), _files(cpu)
    assert plain.name == cpu.name
    assert files_a == files_b and len(files_a) > 3
    assert doc_a["prepare_config"] == doc_b["prepare_config"]
    assert "device" not in doc_b and "device" not in doc_b["prepare_config"]


def test_prepare_refuses_cuda_without_cuda_before_any_work(tmp_path):
    import torch

    from dflash_core.errors import DeviceError
    from dflash_core.prepare.pipeline import prepare

    if torch.cuda.is_available():
        pytest.skip("CUDA is present: tests/runtime/test_gpu.py prepares on it")
    home = tmp_path / "home"
    with pytest.raises(DeviceError, match="CUDA is not available"):
        prepare(str(tmp_path / "nowhere"), home=home, cfg=tiny_prepare_config(), progress=False, device="cuda")
    assert not home.exists()
    r = subprocess.run([sys.executable, "-m", "dflash_core", "prepare", "--target", "mini", "--home", str(home),
                        "--device", "cuda"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "--device cpu" in lines[0]
    assert not home.exists()


def test_the_device_plan_of_the_cpu_is_the_recipes_own():
    from dflash_core.errors import DeviceError
    from dflash_core.prepare.devices import plan_device

    plan = plan_device("cpu")
    assert plan.on_cpu and plan.backend == "gloo" and plan.teacher_batch is None and plan.forced_batch is None
    with pytest.raises(DeviceError, match="unknown device"):
        plan_device("tpu")
