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


def tree(root: Path, skip: Path | list[Path] | None = None) -> dict[str, str]:
    """Every entry under `root` (files with their SHA-256, folders, links with their target), except `skip` (one
    path or several). A file over 64 MiB is recorded by its size and an unreadable one as such, so a hostile home
    (a 6 GB sparse file, a folder without permissions) cannot stall or crash the snapshot."""
    skips = [] if skip is None else [skip] if isinstance(skip, Path) else list(skip)
    out = {}
    for p in sorted(root.rglob("*")):
        if any(p == s or s in p.parents for s in skips):
            continue
        rel = p.relative_to(root).as_posix()
        try:
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_file():
                size = p.stat().st_size
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest() if size < (64 << 20) else f"size:{size}"
            else:
                out[rel] = "dir" if p.is_dir() else "other"
        except OSError:
            out[rel] = "unreadable"
    return out
