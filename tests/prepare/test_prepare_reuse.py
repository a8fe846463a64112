"""`prepare --drafter` reuses what it can prove is the same: the home's own artifacts for the home's own drafter,
the target's teacher trajectories for any drafter (by their teacher key), and a verified manifest on a repeat call
(which then does nothing). Each fit logs its progress."""

from __future__ import annotations

import json
import logging
import shutil
import time

import pytest

from dflash_core import __main__ as cli
from dflash_core.prepare import teacher
from dflash_core.prepare.pipeline import TRAJ_FILE, prepare
from dflash_core.prepare.prepared import load_prepared
from dflash_core.runtime.target import load_target
from dflash_core.testing import tiny_prepare_config


@pytest.fixture(scope="module")
def exported(tiny_prepared, tmp_path_factory):
    """The tiny home's own drafter, written by `export-drafter`."""
    out = tmp_path_factory.mktemp("export") / "drafter"
    assert cli.main(["export-drafter", "--target", str(tiny_prepared.path), "--home", str(tiny_prepared.home),
                     "--out", str(out)]) == 0
    return out


@pytest.fixture
def home(tiny_prepared, tmp_path):
    """A copy of the prepared tiny home (its own drafter, trajectories and fits)."""
    return shutil.copytree(tiny_prepared.home, tmp_path / "home")


def _prepare(tiny_prepared, home, drafter):
    rt32 = load_target(str(tiny_prepared.path), "cpu", "float32")
    return prepare(str(tiny_prepared.path), home=home, cfg=tiny_prepare_config(), rt=rt32, progress=False,
                   drafter=str(drafter))


def _forbid(monkeypatch, *what):
    from dflash_core.methods.base import Fitter

    if "trajectories" in what:
        monkeypatch.setattr("dflash_core.prepare.pipeline.teacher_data",
                            lambda *a, **k: pytest.fail("teacher trajectories regenerated"))
    if "fits" in what:
        monkeypatch.setattr(Fitter, "__call__", lambda self, ctx: pytest.fail(f"{self.name} was refitted"))


def test_the_homes_own_drafter_reuses_its_artifacts_and_a_repeat_does_nothing(tiny_prepared, exported, home,
                                                                               monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="dflash_core")
    _forbid(monkeypatch, "trajectories", "fits")
    monkeypatch.setattr("dflash_core.prepare.pipeline.train_drafter",
                        lambda *a, **k: pytest.fail("an imported drafter was trained"))
    out = _prepare(tiny_prepared, home, exported)
    own = tiny_prepared.prepared.directory.name
    doc = json.loads((out / "manifest.json").read_text())
    assert "--drafter-" in out.name and doc["reused"]["from"].endswith(own)
    assert doc["drafter"]["imported"] is True and doc["drafter"]["source"] == str(exported)
    mine = json.loads((home / "artifacts" / own / "manifest.json").read_text())
    assert {k: v["sha256"] for k, v in doc["files"].items()} == {k: v["sha256"] for k, v in mine["files"].items()}
    prepared = load_prepared(tiny_prepared.rt, home=home, drafter=str(exported))
    assert prepared.directory == out
    before = (out / "manifest.json").read_bytes()
    caplog.clear()
    t0 = time.perf_counter()
    assert _prepare(tiny_prepared, home, exported) == out
    assert time.perf_counter() - t0 < 60  # seconds, not a prepare
    assert (out / "manifest.json").read_bytes() == before
    assert any("present and verified" in r.getMessage() for r in caplog.records)


def _other_drafter(exported, tmp_path):
    """The exported drafter with one weight changed: another drafter for the same target."""
    from safetensors.torch import load_file, save_file

    d = shutil.copytree(exported, tmp_path / "other")
    f = next(d.glob("*.safetensors"))
    sd = load_file(str(f))
    name = sorted(sd)[0]
    sd[name] = sd[name] * 1.01
    save_file(sd, str(f), metadata={"format": "pt"})
    return d


def test_another_drafter_reuses_the_targets_teacher_trajectories(tiny_prepared, exported, home, tmp_path,
                                                                  monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="dflash_core")
    _forbid(monkeypatch, "trajectories")
    other = _other_drafter(exported, tmp_path)
    out = _prepare(tiny_prepared, home, other)
    own = home / "artifacts" / tiny_prepared.prepared.directory.name
    doc = json.loads((out / "manifest.json").read_text())
    assert "reused" not in doc and doc["teacher"]["reused_from"] == str(own)  # fitted anew, on the same trajectories
    assert doc["teacher"]["key"] == json.loads((own / "manifest.json").read_text())["teacher"]["key"]
    assert (out / TRAJ_FILE).read_bytes() == (own / TRAJ_FILE).read_bytes()
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("fit: optimisation steps: ") and " left" in m for m in messages)
    assert any(m.startswith("fit examples (top-") for m in messages)  # every fit reports its progress


def test_trajectories_with_another_teacher_key_are_regenerated(tiny_prepared, exported, home, tmp_path, monkeypatch):
    own = home / "artifacts" / tiny_prepared.prepared.directory.name
    m = json.loads((own / "manifest.json").read_text())
    m["teacher"]["key"] = "0" * 64  # built for another target, recipe or seeds
    (own / "manifest.json").write_text(json.dumps(m))
    calls = []
    real = teacher.teacher_data
    monkeypatch.setattr("dflash_core.prepare.pipeline.teacher_data", lambda *a, **k: calls.append(1) or real(*a, **k))
    out = _prepare(tiny_prepared, home, _other_drafter(exported, tmp_path))
    assert calls == [1] and "reused_from" not in json.loads((out / "manifest.json").read_text())["teacher"]


def test_a_tampered_trajectory_file_is_not_reused(tiny_prepared, exported, home, tmp_path, monkeypatch):
    own = home / "artifacts" / tiny_prepared.prepared.directory.name
    raw = (own / TRAJ_FILE).read_text()
    (own / TRAJ_FILE).write_text(raw.replace("[", "[ ", 1))  # same JSON, other bytes: its SHA-256 no longer matches
    calls = []
    real = teacher.teacher_data
    monkeypatch.setattr("dflash_core.prepare.pipeline.teacher_data", lambda *a, **k: calls.append(1) or real(*a, **k))
    _prepare(tiny_prepared, home, _other_drafter(exported, tmp_path))
    assert calls == [1]


def test_a_manifest_from_before_teacher_keys_is_reused_when_its_seeds_match(tiny_prepared, exported, home, tmp_path,
                                                                          monkeypatch):
    own = home / "artifacts" / tiny_prepared.prepared.directory.name
    m = json.loads((own / "manifest.json").read_text())
    del m["teacher"]["key"]
    (own / "manifest.json").write_text(json.dumps(m))
    _forbid(monkeypatch, "trajectories")
    out = _prepare(tiny_prepared, home, _other_drafter(exported, tmp_path))
    assert json.loads((out / "manifest.json").read_text())["teacher"]["reused_from"] == str(own)
