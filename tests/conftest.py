"""Shared fixtures: a tiny prepared target (fast, every fitter runs in miniature) and the mini target."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from dflash_core.testing import tiny_prepare_config

from .support.browser import chromium  # noqa: F401  (the one headless browser fixture of the session)

TINY_PREP = tiny_prepare_config()


def pytest_collection_modifyitems(config, items):
    """Tests that use the prepared mini target carry the `mini` marker (deselected unless asked for)."""
    for item in items:
        if "mini_prepared" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.mini)


@dataclass
class PreparedTarget:
    rt: Any  # runtime the tests decode with
    prepared: Any  # artifacts loaded onto rt's device and dtype
    home: Any
    path: Any


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No DFLASH_* knob from the caller's shell, an empty artifact home (in-process commands). Child processes
    get theirs from `tests.support.envs.child_env`."""
    import os

    for var in [v for v in os.environ if v.startswith("DFLASH_")]:
        monkeypatch.delenv(var)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("DFLASH_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def tiny_prepared(tmp_path_factory) -> PreparedTarget:
    """A tiny hybrid LFM2 saved to disk, prepared with every fitter, loaded back in float64 (strict)."""
    from dflash_core.prepare.pipeline import prepare
    from dflash_core.prepare.prepared import load_prepared
    from dflash_core.runtime.target import load_target
    from dflash_core.testing import TinySpec, build_tiny

    root = tmp_path_factory.mktemp("tiny-prepared")
    ckpt = root / "ckpt"
    build_tiny(TinySpec(dtype="float32", pattern="CCACAC")).save_pretrained(ckpt)
    home = root / "home"
    rt32 = load_target(str(ckpt), "cpu", "float32")
    prepare(str(ckpt), home=home, cfg=TINY_PREP, rt=rt32, progress=False)
    rt64 = load_target(str(ckpt), "cpu", "float64")
    return PreparedTarget(rt=rt64, prepared=load_prepared(rt64, home=home), home=home, path=ckpt)


@pytest.fixture(scope="session")
def mini_prepared() -> PreparedTarget:
    """The embedded mini target with its real artifacts (built once into DFLASH_HOME, then reused)."""
    from dflash_core.prepare.pipeline import prepare
    from dflash_core.prepare.prepared import load_prepared
    from dflash_core.runtime.target import load_target

    path = prepare("mini", progress=False)
    rt = load_target("mini", "cpu", "float32")
    return PreparedTarget(rt=rt, prepared=load_prepared(rt), home=None, path=path)
