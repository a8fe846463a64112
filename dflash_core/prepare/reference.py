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

import json
from dataclasses import asdict
from pathlib import Path

REFERENCE_DIR = Path(__file__).resolve().parents[2] / "reference"
REFERENCE_BUNDLE = REFERENCE_DIR / "mini.dflash-bundle.tar.gz"
REGENERATE = "python scripts/make_reference_bundle.py"
# Recorded but not part of what the model is: the threads it trained with (identical weights with 1 and 2 on one CPU
# kind) and the resolved bf16 autocast (the machine's; the shipped build records its own value).
UNCOMPARED_MINI = ("threads", "autocast_bf16")


def reference_bundle() -> Path | None:
    """The shipped bundle, or None (an installed wheel without the repository's reference/ folder)."""
    return REFERENCE_BUNDLE if REFERENCE_BUNDLE.is_file() else None


def is_reference_build(target_dir: Path) -> bool:
    """Whether the mini target in `target_dir` is the shipped reference (its weights file's SHA-256, as its own
    manifest records it, equals the bundle's). Reads only bundle.json, checked like any bundle's."""
    import tarfile

    from ..errors import DFlashError
    from ..safeio import read_json
    from .artifacts import TARGET_MANIFEST
    from .bundle import TARGET_DIR, _read_first, check_bundle_doc

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
    from ..errors import BundleError
    from .bundle import import_bundle

    path = path or REFERENCE_BUNDLE
    try:
        return import_bundle(path, home)
    except BundleError as exc:
        raise BundleError(f"the shipped reference bundle is refused: {exc}. Restore it from git (`git checkout -- "
                          f"{path.parent.name}/`), regenerate it (`{REGENERATE}`), or build the mini target "
                          "locally (`python -m dflash_core prepare --rebuild-mini`)") from exc


def _plain(obj) -> object:
    return json.loads(json.dumps(obj, default=str))


def staleness(imported: dict) -> list[str]:
    """Why an imported reference (`import_reference`'s result) is not what today's prepare would build for its
    target (empty: it is current). Reads the verified, imported manifests, never the tar directly."""
    from ..errors import ArtifactError
    from ..methods import fit_files
    from ..safeio import read_json
    from .minitarget import META_FILE, MiniTargetConfig
    from .pipeline import RECIPE, TRAJ_FILE, PrepareConfig
    from .prepared import DRAFTER_FILE

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
