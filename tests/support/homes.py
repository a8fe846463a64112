"""Helpers the bundle tests share: a home laid out like a prepared mini home (built from the tiny checkpoint), and a
snapshot of a folder tree to prove that nothing outside the home changed."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from dflash_core.store.artifacts import artifact_dir, target_identity, write_target_manifest


def make_mini_like_home(tiny_prepared, root: Path) -> Path:
    """`root/home` whose `targets/mini` is the tiny checkpoint (with its target manifest) plus its artifacts. Each
    test module builds its own (module-scoped fixtures), so one module's tampering never reaches another's."""
    home = root / "home"
    shutil.copytree(tiny_prepared.path, home / "targets" / "mini")
    write_target_manifest(home / "targets" / "mini")
    src = artifact_dir(target_identity(tiny_prepared.rt), tiny_prepared.home)
    shutil.copytree(src, home / "artifacts" / src.name)
    return home


def tree(root: Path, skip: Path | None = None) -> dict[str, str]:
    """Every entry under `root` (files with their SHA-256, folders, links with their target), except `skip`."""
    out = {}
    for p in sorted(root.rglob("*")):
        if skip is not None and (p == skip or skip in p.parents):
            continue
        rel = p.relative_to(root).as_posix()
        if p.is_symlink():
            out[rel] = "link:" + os.readlink(p)
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
        elif p.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = "other"
    return out
