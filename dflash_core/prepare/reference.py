"""The shipped reference bundle: one mini target and its prepared artifacts, the same on every machine.

Trained weights depend on the CPU's kernels, so each CPU kind that builds the mini target measures its own model
(docs/mini-target.md). The repository ships one build instead, as an ordinary verified bundle
(`reference/mini.dflash-bundle.tar.gz`, written by `scripts/make_reference_bundle.py`): `prepare` imports it into a
home that has no standard mini target, through `bundle.import_bundle`, so every file is checked against its
SHA-256 and size before use, exactly as a bundle a user hands over (it is a file in the repository, still untrusted).
`--rebuild-mini` (DFLASH_REBUILD_MINI=1) or `--mini-seed N` build locally instead.

`staleness` says why the bundle no longer matches what today's `prepare` would build (another recipe, prepare
config, mini-target config or set of fit files), so a recipe change that forgets to regenerate it fails a test.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

from ..errors import BundleError, DFlashError
from ..safeio import read_json
from ..store.artifacts import TARGET_MANIFEST
from .bundle import TARGET_DIR, _read_first, check_bundle_doc, import_bundle

REFERENCE_DIR = Path(__file__).resolve().parents[2] / "reference"
REFERENCE_BUNDLE = REFERENCE_DIR / "mini.dflash-bundle.tar.gz"
REGENERATE = "python scripts/make_reference_bundle.py"


def reference_bundle() -> Path | None:
    """The shipped bundle, or None (an installed wheel without the repository's reference/ folder)."""
    return REFERENCE_BUNDLE if REFERENCE_BUNDLE.is_file() else None


def is_reference_build(target_dir: Path) -> bool:
    """Whether the mini target in `target_dir` is the shipped reference (its weights file's SHA-256, as its own
    manifest records it, equals the bundle's). Reads only bundle.json, checked like any bundle's."""
    path = reference_bundle()
    if path is None or not (target_dir / TARGET_MANIFEST).is_file():
        return False
    try:
        with tarfile.open(path, "r|*") as tar:
            doc = _read_first(tar, path)
        check_bundle_doc(doc, path)
        mine = read_json(target_dir / TARGET_MANIFEST, "target manifest", DFlashError, "")
        want = doc["files"].get(f"{TARGET_DIR}/model.safetensors", {}).get("sha256")
        have = ((mine.get("files") or {}).get("model.safetensors") or {}).get("sha256")
        return bool(want) and want == have
    except (DFlashError, tarfile.TarError, OSError, EOFError, AttributeError):
        return False  # unreadable: not provably the reference, so nothing is replaced


def import_reference(home, path: Path | None = None) -> dict:
    """Verify and install the reference bundle into `home` (bundle.import_bundle: every file's SHA-256 and size).
    A damaged file is refused with its name and the fix for a repository file."""
    path = path or REFERENCE_BUNDLE
    try:
        return import_bundle(path, home)
    except BundleError as exc:
        raise BundleError(f"the shipped reference bundle is refused: {exc}. Restore it from git (`git checkout -- "
                          f"{path.parent.name}/`), regenerate it (`{REGENERATE}`), or build the mini target "
                          "locally (`python -m dflash_core prepare --rebuild-mini`)") from exc
