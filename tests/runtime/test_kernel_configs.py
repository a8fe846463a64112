"""The numerics-sensitive tests (marker `numerics`: two kernel paths compared within a stated tolerance) rerun
under a second kernel configuration, so a dependence on the CPU kind shows on any one machine.

Why: CI runs on one CPU kind, where two kernel paths' float sums may happen to round alike; on another kind
(an AVX2-only or an AVX512-BF16 AMD EPYC) they did not, and a bit-equality test failed there only. On an
AVX-512 machine the second configuration is the AVX2 path, asked of each library: ATen's vectorised kernels
(ATEN_CPU_CAPABILITY), MKL's GEMMs (MKL_ENABLE_INSTRUCTIONS) and oneDNN's (ONEDNN_MAX_CPU_ISA); on a machine
whose ATen path is already AVX2 or lower it is ATen's portable `default` path. The old padded-teacher test's
`torch.equal` passed on this lab's Xeon and failed under the AVX2 configuration, as on the EPYC."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NUMERICS_MODULES = ("tests/prepare/test_teacher.py",)  # every module holding a `numerics` test


def second_configuration() -> dict[str, str]:
    """The environment of the other kernel path (module docstring)."""
    import torch

    if torch.backends.cpu.get_cpu_capability().upper().startswith("AVX512"):
        return {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    return {"ATEN_CPU_CAPABILITY": "default"}


def test_every_numerics_test_lives_in_a_listed_module():
    """A `numerics` test outside NUMERICS_MODULES would never see the second configuration."""
    marked = [p.relative_to(REPO).as_posix() for p in (REPO / "tests").rglob("test_*.py")
              if p.name != Path(__file__).name and "@pytest.mark.numerics" in p.read_text("utf-8")]
    assert sorted(marked) == sorted(NUMERICS_MODULES)


@pytest.mark.slow
def test_the_numerics_tests_hold_under_a_second_kernel_configuration():
    env = {**os.environ, **second_configuration(), "PYTHONPATH": str(REPO)}
    env.pop("PYTEST_ADDOPTS", None)
    p = subprocess.run([sys.executable, "-m", "pytest", *NUMERICS_MODULES, "-m", "numerics", "-q", "-rP",
                        "-p", "no:cacheprovider", "-o", "log_cli=false"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    margins = sorted({ln for ln in p.stdout.splitlines() if ln.startswith("tolerance margin")})
    print("\n".join(margins))  # `pytest -rP` shows each tolerance's headroom on the second configuration
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    assert margins, "no tolerance margin was printed: the numerics tests did not run"
