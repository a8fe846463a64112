"""The probe's material: the tiny lab, a mini-like home, both kinds of bundle, an exported drafter, schema-7 saved
runs and their benchmark.json (each built once per work folder, on first use, and reused), and the tmpfs mounts of
the full-disk cases (bundle surgery: tests/support/bundles.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from ...support.envs import child_env
from ...support.report_data import bench_row, saved_run
from .judge import SkipCase, run

PY = sys.executable


def cli(*args: str) -> list[str]:
    return [PY, "-m", "dflash_core", *args]


def report(*args: str) -> list[str]:
    return [PY, "-m", "dflash_core.report", *args]


def saved(rounds: list[float], speedup: float, tau: float) -> dict:
    """A schema-7 saved run (tests/support/report_data.py) of greedy and dflash at width 2 with these rounds."""
    return saved_run([bench_row("normal", 0), bench_row("dflash", 2, speedup=speedup, rounds=rounds, tau=tau)])


class Material(dict):
    """The shared material of the cases: the tiny lab and its homes at once, the rest (bundles, the exported
    drafter, saved runs and their benchmark.json) built on a case's first use and kept in the work folder, so a run
    of a few cases pays only for what they use. Material that cannot be built raises KeyError: the case is
    skipped, with the reason printed."""

    def __init__(self, work: Path, **known):
        super().__init__(**known)
        self.work = work

    def __missing__(self, key: str):
        make = {"mini_bundle": self._mini_bundle, "local_bundle": self._local_bundle, "drafter": self._drafter,
                "base_run": lambda: self._runs()["base_run"], "base_bj": lambda: self._runs()["base_bj"],
                "slower_bj": lambda: self._runs()["slower_bj"]}.get(key)
        if make is None:
            raise KeyError(key)
        self[key] = make()
        return self[key]

    def _made(self, out: Path, argv: list[str]) -> Path:
        if not out.exists():
            o = run(argv, self["env"], self.work, 600)
            if o.rc != 0:
                print(f"warning: could not build the probe's {out.name} ({' '.join(argv[2:4])}): {o.err[-600:]}",
                      flush=True)
                raise KeyError(out.name)
        return out

    def _mini_bundle(self) -> Path:
        out = self.work / "mini.tar.gz"
        return self._made(out, cli("export", "--out", str(out), "--home", str(self["mini_home"])))

    def _local_bundle(self) -> Path:
        out = self.work / "local.tar.gz"
        return self._made(out, cli("export", "--out", str(out), "--target", str(self["ckpt"]), "--home",
                                   str(self["lab_home"])))

    def _drafter(self) -> Path:
        out = self.work / "drafter"
        return self._made(out, cli("export-drafter", "--out", str(out), "--target", str(self["ckpt"]), "--home",
                                   str(self["lab_home"])))

    def _runs(self) -> dict:
        """Two schema-7 saved runs (base, and one 69 % slower) and the benchmark.json `report` makes of each."""
        runs = self.work / "runs"
        runs.mkdir(exist_ok=True)
        docs = {"base": saved([1.45, 1.5, 1.55], 1.5, 3.0), "slower": saved([0.45, 0.46, 0.47], 0.46, 3.0)}
        for name, doc in docs.items():
            src, bj = runs / f"{name}.json", runs / f"{name}-report" / "cpu" / "benchmark.json"
            text = json.dumps(doc)
            if bj.is_file() and src.is_file() and src.read_text() == text:
                continue  # built from this very run before
            src.write_text(text)
            shutil.rmtree(bj.parent.parent, ignore_errors=True)
            self._made(bj, report(str(src), "--out", str(bj.parent.parent)))
        return {"base_run": runs / "base.json", "base_bj": runs / "base-report" / "cpu" / "benchmark.json",
                "slower_bj": runs / "slower-report" / "cpu" / "benchmark.json"}


def prepare_material(work: Path, lab: Path | None) -> Material:
    """The tiny lab (built, or reused from `lab` / the work folder) and a mini-like home made of it; the rest of
    the material comes on first use (`Material`)."""
    from dflash_core.store.artifacts import write_target_manifest
    from dflash_core.testing import build_tiny_lab

    lab = lab or work / "lab"
    if not (lab / "home" / "artifacts").is_dir():
        print(f"building the tiny lab in {lab} (a few minutes on a busy 2-core box)", flush=True)
        build_tiny_lab(lab)
    ckpt, lab_home = lab / "ckpt", lab / "home"
    adir = next((lab_home / "artifacts").iterdir())
    mini_home = work / "mini-home"
    if not mini_home.exists():
        shutil.copytree(ckpt, mini_home / "targets" / "mini")
        write_target_manifest(mini_home / "targets" / "mini")
        shutil.copytree(adir, mini_home / "artifacts" / adir.name)
    env = child_env(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    return Material(work, lab=lab, ckpt=ckpt, lab_home=lab_home, adir=adir.name, mini_home=mini_home, env=env,
                    root=os.geteuid() == 0 and shutil.which("mount") is not None)


# --- mounts (root only): a full or read-only filesystem ---------------------------------------------------------

def mount_tmpfs(where: Path, size: str, readonly: bool = False) -> Callable[[], None]:
    where.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    if r.returncode:
        raise SkipCase(f"cannot mount tmpfs: {r.stderr.decode()[:80]}")
    if readonly:
        subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
    return lambda: subprocess.run(["umount", "-l", str(where)], capture_output=True)
