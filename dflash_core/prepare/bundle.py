"""Portable prepared bundles: one verified target and its artifacts, moved between machines (docs/design.md §10).

Trained weights depend on the CPU's kernels, so two machines that each run `prepare` measure two models.
`export_bundle` packs the home's verified state for one target (the mini target's directory when the target
is mini, always its artifact directory with `manifest.json`) into a tar file with `bundle.json`, which lists
every packed file's path, SHA-256 and size. `import_bundle` extracts into a temp directory inside the home
(tarfile's `data` filter, and any link or path outside the bundle is refused first), verifies every file
against `bundle.json` and against the manifests inside, and only then moves the directories into place
under the home's lock: a refused bundle leaves the home as it was.
"""

from __future__ import annotations

import io
import json
import os
import secrets
import shutil
import tarfile
from pathlib import Path, PurePosixPath

from ..errors import ArtifactError, BundleError
from .artifacts import (
    MANIFEST,
    _check_files,
    _load_manifest_doc,
    artifact_dir,
    dflash_home,
    file_entry,
    home_lock,
    mini_target_dir,
    read_manifest,
    sha256_file,
    target_key,
    verify_target_files,
)

BUNDLE_MANIFEST = "bundle.json"
BUNDLE_FORMAT = "dflash-bundle"
BUNDLE_VERSION = 1
REEXPORT = "export it again on the source machine (`python -m dflash_core export --out FILE`) and copy it whole"


def _members(home: Path, identity: dict, with_target: bool) -> list[tuple[str, Path]]:
    """(path in the bundle, file on disk) for the artifact directory and, for mini, the target directory."""
    out = []
    adir = artifact_dir(identity, home)
    out += [(f"artifacts/{adir.name}/{p.name}", p) for p in sorted(adir.iterdir())
            if p.is_file() and not p.name.startswith(".")]
    if with_target:
        tdir = mini_target_dir(home)
        out += [(f"targets/mini/{p.name}", p) for p in sorted(tdir.iterdir())
                if p.is_file() and not p.name.startswith(".")]
    return out


def export_bundle(out: str | Path, target: str = "mini", home: str | Path | None = None) -> dict:
    """Verify `target`'s prepared state in `home` and write it to `out` (atomically). Returns bundle.json's data.

    The target is loaded once (CPU float32) to compute its content identity, which names its artifact directory.
    """
    from ..runtime.target import load_target

    home = dflash_home(home)
    out = Path(out)
    with home_lock(home, wait_message="prepare is writing it"):
        rt = load_target(target, "cpu", "float32", home=home)  # verifies the mini target's own manifest
        identity = rt.info["identity"]
        adir = artifact_dir(identity, home)
        read_manifest(adir, identity)  # every artifact's SHA-256 and size, before anything is packed
        with_target = rt.info["kind"] == "mini"
        members = _members(home, identity, with_target)
        files = {name: file_entry(path) for name, path in members}
        doc = {"format": BUNDLE_FORMAT, "format_version": BUNDLE_VERSION, "target": identity,
               "artifact_dir": f"artifacts/{adir.name}", "target_dir": "targets/mini" if with_target else None,
               "files": files}
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.parent / f".{out.name}.{os.getpid()}.{secrets.token_hex(4)}.part"
        try:
            with tarfile.open(tmp, "w:gz", format=tarfile.PAX_FORMAT) as tar:
                body = (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()
                info = tarfile.TarInfo(BUNDLE_MANIFEST)
                info.size, info.mode = len(body), 0o644
                tar.addfile(info, io.BytesIO(body))
                for name, path in members:
                    info = tarfile.TarInfo(name)
                    info.size, info.mode = path.stat().st_size, 0o644
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, out)
        finally:
            if tmp.exists():
                tmp.unlink()
    return doc


def _safe_name(name: str) -> bool:
    p = PurePosixPath(name)
    return not p.is_absolute() and ".." not in p.parts and name == p.as_posix() and bool(p.parts)


def _extract(path: Path, dest: Path) -> None:
    """Extract regular files and directories only; anything else (links, devices, escaping paths) is refused."""
    try:
        with tarfile.open(path, "r:*") as tar:
            members = tar.getmembers()
            for m in members:
                if not (m.isfile() or m.isdir()) or not _safe_name(m.name):
                    kind = "link" if (m.issym() or m.islnk()) else "entry"
                    raise BundleError(f"bundle {path} holds an unsafe {kind} {m.name!r} (a link, an absolute path "
                                      f"or one that leaves the bundle): refused, the home is unchanged; {REEXPORT}")
            tar.extractall(dest, members=members, filter="data")
    except BundleError:
        raise
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:  # truncated gzip, bad header, ...
        raise BundleError(f"bundle {path} cannot be read ({type(exc).__name__}: {exc}): it is truncated or "
                          f"corrupt; the home is unchanged; {REEXPORT}") from exc


def _verify(root: Path, path: Path) -> dict:
    """Check the extracted tree against bundle.json and the manifests inside it; return bundle.json's data."""
    fail = f"the home is unchanged; {REEXPORT}"
    mpath = root / BUNDLE_MANIFEST
    try:
        doc = json.loads(mpath.read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise BundleError(f"bundle {path} has no readable {BUNDLE_MANIFEST} ({exc}): not a dflash bundle or "
                          f"corrupt; {fail}") from exc
    if not isinstance(doc, dict) or doc.get("format") != BUNDLE_FORMAT or doc.get("format_version") != BUNDLE_VERSION:
        raise BundleError(f"bundle {path}: {BUNDLE_MANIFEST} is not a {BUNDLE_FORMAT} version {BUNDLE_VERSION} "
                          f"manifest; {fail}")
    files, identity = doc.get("files"), doc.get("target")
    if not isinstance(files, dict) or not isinstance(identity, dict) or "content_sha256" not in identity:
        raise BundleError(f"bundle {path}: {BUNDLE_MANIFEST} lacks its file list or target identity; {fail}")
    adir_name = f"artifacts/{target_key(identity)}"
    if doc.get("artifact_dir") != adir_name:
        raise BundleError(f"bundle {path}: artifact directory {doc.get('artifact_dir')!r} is not the one its target "
                          f"identity names ({adir_name!r}); {fail}")
    allowed = {adir_name} | ({"targets/mini"} if doc.get("target_dir") == "targets/mini" else set())
    present = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()} - {BUNDLE_MANIFEST}
    if present != set(files):
        extra, missing = sorted(present - set(files)), sorted(set(files) - present)
        raise BundleError(f"bundle {path} does not match its {BUNDLE_MANIFEST} (missing {missing[:3]}, unlisted "
                          f"{extra[:3]}): truncated or altered; {fail}")
    for name, meta in files.items():
        if str(PurePosixPath(name).parent) not in allowed:
            raise BundleError(f"bundle {path}: {name!r} lies outside {sorted(allowed)}; {fail}")
        p = root / name
        if not isinstance(meta, dict) or p.stat().st_size != meta.get("bytes"):
            raise BundleError(f"bundle file {name} has {p.stat().st_size} bytes, {BUNDLE_MANIFEST} says "
                              f"{meta.get('bytes') if isinstance(meta, dict) else meta!r}: truncated; {fail}")
        digest = sha256_file(p)
        if digest != meta.get("sha256"):
            raise BundleError(f"bundle file {name} fails its SHA-256 check ({digest[:12]}... != "
                              f"{str(meta.get('sha256'))[:12]}...): corrupt; {fail}")
    try:  # the manifests inside agree with bundle.json and with the files
        adoc = _load_manifest_doc(root / adir_name / MANIFEST, fail, "manifest")
        for k in ("content_sha256", "config_sha256", "weights_sha256", "tokenizer_sha256"):
            if adoc["target"].get(k) != identity.get(k):
                raise BundleError(f"bundle {path}: {adir_name}/{MANIFEST} was prepared for another target ({k}: "
                                  f"{adoc['target'].get(k)!r} != {identity.get(k)!r} in {BUNDLE_MANIFEST}); {fail}")
        _check_files(root / adir_name, adoc["files"], root / adir_name / MANIFEST, fail, "bundle artifact")
        if "targets/mini" in allowed:
            verify_target_files(root / "targets/mini", fail)
    except BundleError:
        raise
    except (ArtifactError, KeyError, AttributeError) as exc:
        raise BundleError(f"bundle {path}: {exc}") from exc
    return doc


def import_bundle(path: str | Path, home: str | Path | None = None) -> dict:
    """Verify a bundle completely, then move its directories into `home` (replacing the same-named ones).

    Returns {"home", "target", "artifact_dir", "target_dir", "files"}. Any refusal leaves the home as it was.
    """
    path, home = Path(path), dflash_home(home)
    if not path.is_file():
        raise BundleError(f"no bundle at {path}: pass the file written by `python -m dflash_core export --out FILE`")
    home.mkdir(parents=True, exist_ok=True)
    with home_lock(home, wait_message="prepare is writing it"):
        stage = home / f".import-{os.getpid()}-{secrets.token_hex(4)}"
        stage.mkdir()
        try:
            root = stage / "bundle"
            root.mkdir()
            _extract(path, root)
            doc = _verify(root, path)
            dirs = [doc["artifact_dir"]] + ([doc["target_dir"]] if doc.get("target_dir") else [])
            old = stage / "old"
            old.mkdir()
            moved: list[tuple[Path, Path | None]] = []
            try:
                for rel in dirs:
                    dest = home / rel
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    backup = None
                    if dest.exists():
                        backup = old / rel.replace("/", "__")
                        os.replace(dest, backup)
                    moved.append((dest, backup))
                    os.replace(root / rel, dest)
            except OSError as exc:  # put back what was there (a directory moved aside, or nothing)
                for dest, backup in reversed(moved):
                    if backup is None or dest.exists():
                        shutil.rmtree(dest, ignore_errors=True)
                    if backup is not None:
                        os.replace(backup, dest)
                raise BundleError(f"could not move the bundle into {home} ({exc}): the home is unchanged") from exc
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    return {"home": str(home), "target": doc["target"].get("name"), "artifact_dir": str(home / doc["artifact_dir"]),
            "target_dir": str(home / doc["target_dir"]) if doc.get("target_dir") else None,
            "files": len(doc["files"])}
