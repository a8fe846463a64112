"""tox's install_command: `pip install`, plus the index torch must come from (the `./lab` rule, below).

tox installs an env's `deps` (torch alone, pinned) before the package, so torch is in place when pip resolves
the package's own `torch==2.13.0`. Where torch comes from is `./lab`'s rule (its torch_index_args; the tests
run both over the same cases, tests/cli/test_lab_setup.py):

1. TORCH_INDEX_URL set: that index, as an extra index (a wheel index's `2.13.0+cpu` / `2.13.0+cu128` sorts above
   PyPI's `2.13.0`, so it wins; an extra index, not `--index-url`, because the package's other dependencies
   are on PyPI).
2. an NVIDIA driver answers (`nvidia-smi -L`): nothing added; PyPI's torch 2.13.0 for Linux x86_64 is the CUDA
   build.
3. pip as configured finds torch 2.13.0 with no index at all (a `--no-index` dry run: find-links, local wheel
   folders from pip.conf or PIP_* variables): nothing added; the local wheel is used, nothing is downloaded.
4. otherwise the CPU index as an extra index, so a machine without CUDA never pulls the multi-GB CUDA build.

Hand-written: tox substitutions cannot add an option only when a condition holds, and an empty
PIP_EXTRA_INDEX_URL would erase the one from pip's config files.

When to run: never by hand: tox runs it as its install_command (tox.ini).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

TORCH_PIN = "torch==2.13.0"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# the dry run of rule 3, the same arguments as ./lab's
LOCAL_PROBE = ["-m", "pip", "install", "--dry-run", "--no-index", "--no-deps", "--ignore-installed", "-q", TORCH_PIN]


def nvidia_driver(environ: dict) -> bool:
    """An NVIDIA driver answers: `nvidia-smi` is on PATH and lists devices."""
    exe = shutil.which("nvidia-smi", path=environ.get("PATH"))
    return exe is not None and subprocess.call([exe, "-L"], stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL) == 0


def local_torch() -> bool:
    """pip, as configured here, finds torch 2.13.0 without any index (never touches the network)."""
    return subprocess.call([sys.executable, *LOCAL_PROBE], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) == 0


def torch_index_args(environ: dict, driver: bool | None = None, local: bool | None = None) -> list[str]:
    """The pip arguments that choose torch's index (rules 1-4 above); `driver`/`local` given skip the checks."""
    url = environ.get("TORCH_INDEX_URL", "").strip()
    if url:
        return ["--extra-index-url", url]
    if nvidia_driver(environ) if driver is None else driver:
        return []
    if local_torch() if local is None else local:
        return []
    return ["--extra-index-url", CPU_INDEX]


def pip_command(argv: list[str], environ: dict | None = None, driver: bool | None = None,
                local: bool | None = None) -> list[str]:
    env = os.environ if environ is None else environ
    return [sys.executable, "-m", "pip", "install", *torch_index_args(env, driver, local), *argv]


if __name__ == "__main__":
    sys.exit(subprocess.call(pip_command(sys.argv[1:])))
