"""The import journal: how a bundle's verified directories move into a home so that a kill at any moment
leaves the home as before or as after (docs/design.md §10).

An import stages everything in a `.import-*` folder inside the home, writes a journal naming the directories,
then moves each one in (`move_in`). The next holder of the home's lock (`artifacts.home_lock`) calls
`recover_imports`: a stage with a journal is rolled forward, one without is rolled back. It lives here, below
`prepare/bundle.py`, because the lock every layer takes runs it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

TARGET_DIR = "targets/mini"
JOURNAL = "journal.json"
STAGE_PREFIX = ".import-"
MAX_JOURNAL_BYTES = 64 << 10  # the journal names at most two directories
ARTIFACT_DIR = re.compile(r"^artifacts/[A-Za-z0-9._-]{1,24}-[0-9a-f]{16}$")

log = logging.getLogger("dflash_core.prepare.bundle")  # the import's own log, where its warnings always were


def _no_step(name: str) -> None:
    """Recovery passes no named points."""


def _flat(rel: str) -> str:
    return rel.replace("/", "__")


def _unflat(name: str) -> str | None:
    rel = name.replace("__", "/")
    return rel if rel == TARGET_DIR or ARTIFACT_DIR.match(rel) else None


def move_in(stage: Path, home: Path, rel: str, step: Callable[[str], None] = _no_step) -> None:
    """One directory into place: the present one aside into stage/old, the new one from stage/bundle.
    Idempotent, so recovery can call it again after a kill at any point. `step` names each point passed
    (backup:REL, moved:REL): the import's tests kill the process there."""
    src, dest = stage / "bundle" / rel, home / rel
    if not src.is_dir():
        return  # already moved in
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists() or dest.is_symlink():
        backup = stage / "old" / _flat(rel)
        while backup.exists() or backup.is_symlink():
            backup = backup.with_name(backup.name + ".again")
        os.replace(dest, backup)
        step(f"backup:{rel}")
    os.replace(src, dest)
    step(f"moved:{rel}")


def _journal_dirs(stage: Path) -> list[str] | None:
    """The directories a stage's journal names (None: no readable journal, so no move had begun)."""
    path = stage / JOURNAL
    try:
        # lstat before open: a FIFO planted here hung every command that takes the home's lock, and a link to
        # /dev/zero read until memory ran out. Not our regular file: no journal, so the stage is rolled back.
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_JOURNAL_BYTES:
            return None
        doc = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    dirs = doc.get("dirs") if isinstance(doc, dict) else None
    if not isinstance(dirs, list) or not all(isinstance(d, str) and (d == TARGET_DIR or ARTIFACT_DIR.match(d))
                                             for d in dirs):
        return None
    return dirs


def recover_imports(home: str | Path) -> list[str]:
    """Finish or undo every import a kill interrupted in `home` (call it holding the home's lock).

    A stage with a journal is rolled forward: its verified directories are moved in. A stage without one is
    rolled back: a directory an older release had moved aside before it was killed goes back where it was. The
    stage is then removed. Returns what was done, one line per stage."""
    home = Path(home)
    done = []
    try:
        stages = sorted(p for p in home.iterdir() if p.name.startswith(STAGE_PREFIX))
    except OSError:
        return done
    for stage in stages:
        if stage.is_symlink() or not stage.is_dir():
            stage.unlink(missing_ok=True)
            continue
        dirs = _journal_dirs(stage)
        if dirs is not None:
            for rel in dirs:
                move_in(stage, home, rel)
            done.append(f"finished the interrupted import in {stage.name} ({', '.join(dirs)})")
        else:
            old = stage / "old"
            for p in sorted(old.iterdir()) if old.is_dir() else []:
                rel = _unflat(p.name)
                if rel is not None and not (home / rel).exists():
                    (home / rel).parent.mkdir(parents=True, exist_ok=True)
                    os.replace(p, home / rel)
            done.append(f"rolled back the interrupted import in {stage.name}")
        (stage / JOURNAL).unlink(missing_ok=True)
        shutil.rmtree(stage, ignore_errors=True)
    for line in done:
        log.warning("%s", line)
    return done
