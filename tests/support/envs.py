"""The one environment helper for child processes: the caller's environment without any DFLASH_* knob (so a
developer's shell cannot change what a test measures) and without transformers' progress-bar switch, with this
checkout first on PYTHONPATH. In-process commands use the `clean_env` fixture (tests/conftest.py)."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def child_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DFLASH_", "HF_HUB_DISABLE"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env.update(extra)
    return env
