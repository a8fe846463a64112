"""tox's install_command: `pip install`, plus TORCH_INDEX_URL (when set) as an extra index.

tox installs an env's `deps` (torch alone, pinned) before the package, so torch is in place when pip resolves
the package's own `torch==2.13.0` and a CUDA build is never pulled from the default index. Where the CPU wheel
comes from: TORCH_INDEX_URL (e.g. https://download.pytorch.org/whl/cpu) when set, else pip's own
configuration (a local wheel here). It is an extra index because pip takes the highest matching version and a
CPU index's `2.13.0+cpu` sorts above PyPI's `2.13.0`. Hand-written: tox substitutions cannot add an option
only when a variable is set, and an empty PIP_EXTRA_INDEX_URL would erase the one from pip's config files.
"""

from __future__ import annotations

import os
import subprocess
import sys


def pip_command(argv: list[str], environ: dict | None = None) -> list[str]:
    env = os.environ if environ is None else environ
    url = env.get("TORCH_INDEX_URL", "").strip()
    return [sys.executable, "-m", "pip", "install", *(["--extra-index-url", url] if url else []), *argv]


if __name__ == "__main__":
    sys.exit(subprocess.call(pip_command(sys.argv[1:])))
