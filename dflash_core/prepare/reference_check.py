"""Whether the shipped reference bundle is current: what today's prepare would build for its target (the recipe,
PrepareConfig's and MiniTargetConfig's defaults, the fitters' files). Apart from prepare/reference.py because it
reads the pipeline's recipe, and the pipeline imports the reference."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from ..errors import ArtifactError
from ..methods import fit_files
from ..safeio import read_json
from ..store.artifacts import META_FILE
from .minitarget import MiniTargetConfig
from .pipeline import RECIPE, TRAJ_FILE, PrepareConfig
from .prepared import DRAFTER_FILE
from .reference import REGENERATE

# Recorded but not part of what the model is: the threads it trained with (identical weights with 1 and 2 on one CPU
# kind) and the resolved bf16 autocast (the machine's; the shipped build records its own value).
UNCOMPARED_MINI = ("threads", "autocast_bf16")


def _plain(obj) -> object:
    return json.loads(json.dumps(obj, default=str))


def staleness(imported: dict) -> list[str]:
    """Why an imported reference (`import_reference`'s result) is not what today's prepare would build for its
    target (empty: it is current). Reads the verified, imported manifests, never the tar directly."""
    fix = f"regenerate it: {REGENERATE}"
    why = []
    doc = read_json(Path(imported["artifact_dir"]) / "manifest.json", "the reference's manifest", ArtifactError, fix)
    if doc.get("recipe") != RECIPE:
        why.append(f"its prepare recipe is {doc.get('recipe')!r}, today's is {RECIPE!r}")
    want = {k: v for k, v in _plain(PrepareConfig().to_dict()).items() if k != "threads"}
    have = {k: v for k, v in (doc.get("prepare_config") or {}).items() if k != "threads"}
    if have != want:
        diff = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
        why.append(f"its prepare config differs in {diff}")
    missing = sorted({DRAFTER_FILE, TRAJ_FILE, *fit_files()} - set(doc.get("files") or {}))
    if missing:
        why.append(f"it lacks the files {missing} that today's fitters write")
    meta = read_json(Path(imported["target_dir"]) / META_FILE, "the reference's mini target metadata", ArtifactError,
                     fix)
    want_m = {k: v for k, v in _plain(asdict(MiniTargetConfig())).items() if k not in UNCOMPARED_MINI}
    have_m = {k: v for k, v in (meta.get("config") or {}).items() if k not in UNCOMPARED_MINI}
    if have_m != want_m:
        diff = sorted(k for k in set(want_m) | set(have_m) if want_m.get(k) != have_m.get(k))
        why.append(f"its mini target config differs in {diff}")
    return why
