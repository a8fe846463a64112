"""Portable prepared bundles: one verified target and its artifacts, moved between machines (docs/design.md §10).

Trained weights depend on the CPU's kernels, so two machines that each run `prepare` measure two models.
`export_bundle` packs the home's verified state for one target (the mini target's directory when the target
is mini, always its artifact directory) into a tar file whose first member, `bundle.json`, lists every packed
file's path, SHA-256 and size. Only the files the manifests list travel (`manifest.json` and its files,
`target_manifest.json` and its files), and only regular files: never a link, never a stray file.

A bundle is untrusted until checked (docs/hostile-input.md). `import_bundle` reads `bundle.json` first, before
anything is written, and validates it against a fixed schema (`check_bundle_doc`: known keys and types, 64-hex
hashes, `target_dir` null or `targets/mini`, file names of known kinds under the two directories only, a cap on
files and bytes). It then streams the tar once: each member must be a regular file listed there, of the listed
size, within the caps, and is hashed while it is written into a stage inside the home; anything unlisted (a
file, a folder, a link) is refused. Then the manifests inside must list exactly the packed files.

Crash safety: under the home's lock, a journal naming the directories is written before the first move; a kill
at any point leaves a `.import-*` stage that the next holder of the lock (`journal.recover_imports`, called by
`artifacts.home_lock`) rolls forward (journal present: the verified new directories go in) or back (no journal:
any directory moved aside goes back). So the home is as before or as after, never without its artifacts.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import secrets
import shutil
import stat
import tarfile
from pathlib import Path
from typing import Any

from ..errors import ArtifactError, BadInputError, BundleError, os_error_message
from ..runtime.target import load_target
from ..safeio import check_out_parent, parse_json
from ..store.artifacts import (
    MANIFEST,
    TARGET_MANIFEST,
    _check_files,
    _load_manifest_doc,
    artifact_dir,
    dflash_home,
    home_lock,
    mini_target_dir,
    read_manifest,
    target_key,
    verify_target_files,
    write_json_atomic,
)
from ..store.journal import ARTIFACT_DIR, JOURNAL, STAGE_PREFIX, TARGET_DIR, move_in, recover_imports

log = logging.getLogger(__name__)

BUNDLE_MANIFEST = "bundle.json"
BUNDLE_FORMAT = "dflash-bundle"
BUNDLE_VERSION = 1
REEXPORT = "export it again on the source machine (`python -m dflash_core export --out FILE`) and copy it whole"

# Limits (docs/hostile-input.md): the mini target's bundle is ~120 MB in ~20 files.
MAX_BUNDLE_JSON_BYTES = 4 << 20
MAX_BUNDLE_FILES = 512
MAX_BUNDLE_BYTES = 16 << 30
FREE_MARGIN_BYTES = 64 << 20  # left free on the home's filesystem after an import
HEX64 = re.compile(r"^[0-9a-f]{64}$")
FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# What may travel: prepared artifacts are JSON and safetensors; a target directory adds tokenizer files. Never
# code (`*.py`), never pickles (`*.bin`, `*.pt`).
ARTIFACT_SUFFIXES = (".json", ".safetensors")
TARGET_SUFFIXES = (".json", ".safetensors", ".txt", ".model", ".jinja", ".tiktoken")
TOP_KEYS = {"format", "format_version", "target", "artifact_dir", "target_dir", "files"}
HEX_KEYS = ("content_sha256", "config_sha256", "weights_sha256")
INT_KEYS = ("parameters", "vocab_size", "hidden_size", "num_layers")
OPTIONAL_STR_KEYS = ("tokenizer_sha256", "revision", "hub_commit")
IDENTITY_KEYS = {"name", "model_type", *HEX_KEYS, *INT_KEYS, *OPTIONAL_STR_KEYS}


def _step(name: str) -> None:
    """A named point of the import (extracted, journal, backup:REL, moved:REL, done). Tests replace this
    function to kill the process at each point and check that the next lock holder repairs the home."""


# --- export ------------------------------------------------------------------------------------------------

def _regular(path: Path, fix: str) -> os.stat_result:
    """lstat: a packed file must be a regular file itself, not a link to one (a link to /etc/passwd would carry
    that file's contents)."""
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise BundleError(f"{path} is {'a link' if stat.S_ISLNK(st.st_mode) else 'not a regular file'}: export "
                          f"packs regular files only; {fix}")
    return st


def _members(home: Path, identity: dict, with_target: bool) -> list[tuple[str, Path]]:
    """(path in the bundle, file on disk): each manifest and exactly the files it lists, after verifying them."""
    fix = f"run `python -m dflash_core prepare --target {identity.get('name', '<target>')} --refresh`"
    adir = artifact_dir(identity, home)
    adoc = read_manifest(adir, identity)  # every artifact's SHA-256 and size, before anything is packed
    out = [(f"artifacts/{adir.name}/{n}", adir / n) for n in [MANIFEST, *sorted(adoc["files"])]]
    if with_target:
        tdir = mini_target_dir(home)
        tdoc = verify_target_files(tdir, "run `python -m dflash_core prepare --target mini --refresh`")
        out += [(f"{TARGET_DIR}/{n}", tdir / n) for n in [TARGET_MANIFEST, *sorted(tdoc["files"])]]
    for _, path in out:
        _regular(path, fix)
    return out


def check_export_out(out: Path) -> None:
    """Refuse an --out that cannot become the bundle file, before anything is loaded or packed."""
    if out.is_dir() or (out.exists() and not out.is_file()):
        raise BadInputError(f"--out {out} exists and is not a regular file: name a new bundle file")
    check_out_parent(out, BadInputError)


def _pack(tmp: Path, doc: dict, members: list[tuple[str, Path]]) -> None:
    with tarfile.open(tmp, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        body = (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()
        info = tarfile.TarInfo(BUNDLE_MANIFEST)
        info.size, info.mode = len(body), 0o644
        tar.addfile(info, io.BytesIO(body))
        for name, path in members:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            with os.fdopen(fd, "rb") as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode) or st.st_size != doc["files"][name]["bytes"]:
                    raise BundleError(f"{path} changed while it was packed: export again")
                info = tarfile.TarInfo(name)
                info.size, info.mode = st.st_size, 0o644
                tar.addfile(info, f)
        tar.fileobj.flush()
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())


def export_bundle(out: str | Path, target: str = "mini", home: str | Path | None = None) -> dict:
    """Verify `target`'s prepared state in `home` and write it to `out` (atomically). Returns bundle.json's data.

    The target is loaded once (CPU float32) to compute its content identity, which names its artifact directory.
    """
    home = dflash_home(home)
    out = Path(out)
    check_export_out(out)
    with home_lock(home, wait_message="prepare is writing it"):
        rt = load_target(target, "cpu", "float32", home=home)  # verifies the mini target's own manifest
        identity = rt.info["identity"]
        adir = artifact_dir(identity, home)
        with_target = rt.info["kind"] == "mini"
        members = _members(home, identity, with_target)
        files = {name: {"sha256": _sha256(path), "bytes": os.lstat(path).st_size} for name, path in members}
        doc = {"format": BUNDLE_FORMAT, "format_version": BUNDLE_VERSION, "target": identity,
               "artifact_dir": f"artifacts/{adir.name}", "target_dir": TARGET_DIR if with_target else None,
               "files": files}
        check_bundle_doc(doc, Path("<export>"))  # what import will demand, checked before anything is written
        need = sum(f["bytes"] for f in files.values())
        _need_space(out.parent if out.parent.exists() else Path("."), need, f"--out {out}", "--out")
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.parent / f".{out.name}.{os.getpid()}.{secrets.token_hex(4)}.part"
        try:
            _pack(tmp, doc, members)
            os.replace(tmp, out)
        except OSError as exc:
            raise BundleError(os_error_message(exc, writing=str(out)) + "; nothing was written") from exc
        finally:
            if tmp.exists():
                tmp.unlink()
    return doc


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _need_space(where: Path, need: int, what: str, flag: str) -> None:
    """Refuse up front when the filesystem cannot hold `need` bytes (with a margin): a named disk-full error
    instead of a half-written file."""
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        return  # cannot tell: the write itself will say
    if free < need + FREE_MARGIN_BYTES:
        raise BundleError(f"no space left on device for {what}: it needs {need + FREE_MARGIN_BYTES} bytes in "
                          f"{where}, {free} are free: free space or choose another {flag}; nothing was written")


# --- bundle.json, untrusted until checked ----------------------------------------------------------------

def _bad(path: Path, what: str) -> BundleError:
    return BundleError(f"bundle {path}: {BUNDLE_MANIFEST} {what}: refused, the home is unchanged; {REEXPORT}")


def _check_identity(ident: Any, path: Path) -> None:
    if not isinstance(ident, dict) or set(ident) - IDENTITY_KEYS:
        extra = sorted(set(ident) - IDENTITY_KEYS)[:3] if isinstance(ident, dict) else type(ident).__name__
        raise _bad(path, f"has a target identity with unknown fields or of the wrong type ({extra})")
    for k in HEX_KEYS:
        if not (isinstance(ident.get(k), str) and HEX64.match(ident[k])):
            raise _bad(path, f"names target {k} {str(ident.get(k))[:70]!r}, not 64 lowercase hex digits")
    tok = ident.get("tokenizer_sha256")
    if tok is not None and not (isinstance(tok, str) and HEX64.match(tok)):
        raise _bad(path, f"names tokenizer_sha256 {str(tok)[:70]!r}, not 64 lowercase hex digits or null")
    for k in INT_KEYS:
        v = ident.get(k)
        if v is not None and not (isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2 ** 53):
            raise _bad(path, f"has target {k} {str(v)[:40]!r}, not an integer >= 0")
    for k in ("name", "model_type", "revision", "hub_commit"):
        v = ident.get(k)
        if v is not None and not (isinstance(v, str) and len(v) <= 4096):
            raise _bad(path, f"has target {k} of type {type(v).__name__}, not a short string")


def _check_files_doc(files: Any, adir: str, target_dir: str | None, path: Path) -> int:
    """Every listed file: a known kind of file directly under one of the two directories, with a 64-hex SHA-256
    and a size. Returns the total size."""
    if not isinstance(files, dict) or not files:
        raise _bad(path, "lists no files")
    if len(files) > MAX_BUNDLE_FILES:
        raise _bad(path, f"lists {len(files)} files, more than the {MAX_BUNDLE_FILES} a bundle may hold")
    dirs = {adir: ARTIFACT_SUFFIXES, **({target_dir: TARGET_SUFFIXES} if target_dir else {})}
    total = 0
    for name, meta in files.items():
        parent, _, base = str(name).rpartition("/")
        if parent not in dirs or not FILE_NAME.match(base) or not base.endswith(dirs[parent]):
            kinds = "/".join(dirs.get(parent, ARTIFACT_SUFFIXES))
            raise _bad(path, f"lists {str(name)[:80]!r}, which is not a {kinds} file directly under "
                       f"{' or '.join(sorted(dirs))}")
        if not (isinstance(meta, dict) and set(meta) == {"sha256", "bytes"} and isinstance(meta["sha256"], str)
                and HEX64.match(meta["sha256"]) and isinstance(meta["bytes"], int)
                and not isinstance(meta["bytes"], bool) and 0 <= meta["bytes"] <= MAX_BUNDLE_BYTES):
            raise _bad(path, f"has an entry for {name!r} that is not {{sha256: 64 hex digits, bytes: 0.."
                       f"{MAX_BUNDLE_BYTES}}}")
        total += meta["bytes"]
    if total > MAX_BUNDLE_BYTES:
        raise _bad(path, f"lists {total} bytes, more than the {MAX_BUNDLE_BYTES}-byte limit of a bundle")
    for d, manifest in ((adir, MANIFEST), *(((target_dir, TARGET_MANIFEST),) if target_dir else ())):
        if f"{d}/{manifest}" not in files:
            raise _bad(path, f"does not list {d}/{manifest}")
    return total


def check_bundle_doc(doc: Any, path: Path) -> int:
    """Validate bundle.json's data against the schema (see the module docstring). Returns the listed bytes."""
    if not isinstance(doc, dict) or doc.get("format") != BUNDLE_FORMAT or doc.get("format_version") != BUNDLE_VERSION:
        raise _bad(path, f"is not a {BUNDLE_FORMAT} version {BUNDLE_VERSION} manifest")
    if set(doc) != TOP_KEYS:
        raise _bad(path, f"has fields {sorted(map(str, set(doc) ^ TOP_KEYS))[:4]} beyond or missing from "
                   f"{sorted(TOP_KEYS)}")
    _check_identity(doc["target"], path)
    adir = doc["artifact_dir"]
    want = f"artifacts/{target_key(doc['target'])}"
    if not (isinstance(adir, str) and ARTIFACT_DIR.match(adir)) or adir != want:
        raise _bad(path, f"names artifact directory {str(adir)[:80]!r}, not the one its target identity names "
                   f"({want!r})")
    if doc["target_dir"] not in (None, TARGET_DIR):
        raise _bad(path, f"names target directory {str(doc['target_dir'])[:80]!r}; only null or {TARGET_DIR!r} "
                   "may travel")
    return _check_files_doc(doc["files"], adir, doc["target_dir"], path)


# --- import: read bundle.json first, then stream-check every member ---------------------------------------

def _inside(base: Path, p: Path) -> bool:
    b, q = os.path.realpath(base), os.path.realpath(p)
    return q == b or q.startswith(b.rstrip(os.sep) + os.sep)


def _write_member(tar: tarfile.TarFile, m: tarfile.TarInfo, dest: Path, meta: dict, path: Path) -> None:
    """Copy one member to `dest` (a new regular file), hashing as it goes; refuse a digest mismatch."""
    src = tar.extractfile(m)
    h = hashlib.sha256()
    left = m.size
    try:
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666)
    except OSError as exc:
        raise BundleError(os_error_message(exc, writing=str(dest)) + "; the home is unchanged") from exc
    with os.fdopen(fd, "wb") as out:
        while left:
            chunk = src.read(min(left, 1 << 20))  # a short read (truncated bundle) raises in tarfile
            if not chunk:
                raise BundleError(f"bundle {path}: {m.name} ends early: the bundle is truncated; the home is "
                                  f"unchanged; {REEXPORT}")
            h.update(chunk)
            left -= len(chunk)
            try:
                out.write(chunk)
            except OSError as exc:
                raise BundleError(os_error_message(exc, writing=str(dest)) + "; the home is unchanged") from exc
    if h.hexdigest() != meta["sha256"]:
        raise BundleError(f"bundle file {m.name} fails its SHA-256 check ({h.hexdigest()[:12]}... != "
                          f"{meta['sha256'][:12]}...): corrupt; the home is unchanged; {REEXPORT}")


def _read_first(tar: tarfile.TarFile, path: Path) -> dict:
    """bundle.json: the first member, a regular file of bounded size, checked before anything is written."""
    first = tar.next()
    if first is None or first.name != BUNDLE_MANIFEST or not first.isfile():
        raise BundleError(f"bundle {path} does not start with {BUNDLE_MANIFEST} (found "
                          f"{'nothing' if first is None else repr(first.name[:80])}): not a dflash bundle; refused "
                          f"before anything was written, the home is unchanged; {REEXPORT}")
    if first.size > MAX_BUNDLE_JSON_BYTES:
        raise _bad(path, f"has {first.size} bytes, more than the {MAX_BUNDLE_JSON_BYTES}-byte limit")
    raw = tar.extractfile(first).read(first.size)
    return parse_json(raw, f"bundle {path}: {BUNDLE_MANIFEST}", BundleError, f"the home is unchanged; {REEXPORT}")


def _extract(path: Path, root: Path, home: Path) -> dict:
    """Stream the bundle once into `root`: bundle.json first and checked, then only its listed files."""
    try:
        with tarfile.open(path, "r|*") as tar:  # stream mode: no member index built, no seeking
            doc = _read_first(tar, path)
            total = check_bundle_doc(doc, path)
            _need_space(home, total, f"bundle {path}", "--home")
            files = doc["files"]
            for d in {n.rpartition("/")[0] for n in files}:
                (root / d).mkdir(parents=True, exist_ok=True)
            seen: set[str] = set()
            while (m := tar.next()) is not None:
                name = m.name
                if not m.isfile() or name not in files or name in seen:
                    kind = ("link" if m.issym() or m.islnk() else "folder" if m.isdir() else
                            "duplicate file" if name in seen else "file" if m.isfile() else "special entry")
                    raise BundleError(f"bundle {path} holds an unlisted or unsafe {kind} {name[:80]!r} (only the "
                                      f"regular files {BUNDLE_MANIFEST} lists may travel): refused, the home is "
                                      f"unchanged; {REEXPORT}")
                if m.size != files[name]["bytes"]:
                    raise BundleError(f"bundle file {name} has {m.size} bytes, {BUNDLE_MANIFEST} says "
                                      f"{files[name]['bytes']}: truncated or altered; the home is unchanged; "
                                      f"{REEXPORT}")
                dest = root / name
                if not _inside(root, dest):
                    raise _bad(path, f"sends {name!r} outside the stage")
                _write_member(tar, m, dest, files[name], path)
                seen.add(name)
    except BundleError:
        raise
    except (tarfile.TarError, EOFError, OSError, ValueError, RecursionError) as exc:  # truncated gzip, bad header
        raise BundleError(f"bundle {path} cannot be read ({type(exc).__name__}: {str(exc)[:160]}): it is truncated "
                          f"or corrupt; the home is unchanged; {REEXPORT}") from exc
    missing = sorted(set(files) - seen)
    if missing:
        raise BundleError(f"bundle {path} does not match its {BUNDLE_MANIFEST} (missing {missing[:3]}): truncated "
                          f"or altered; the home is unchanged; {REEXPORT}")
    return doc


def _verify_inside(root: Path, doc: dict, path: Path) -> None:
    """The manifests inside list exactly the packed files and agree with bundle.json's target identity."""
    fail = f"the home is unchanged; {REEXPORT}"
    identity, adir = doc["target"], doc["artifact_dir"]
    packed = {d: {n.rpartition("/")[2] for n in doc["files"] if n.rpartition("/")[0] == d}
              for d in (adir, doc["target_dir"]) if d}
    try:
        adoc = _load_manifest_doc(root / adir / MANIFEST, fail, "manifest")
        if set(adoc["files"]) | {MANIFEST} != packed[adir]:
            raise BundleError(f"bundle {path}: {adir}/{MANIFEST} lists {sorted(adoc['files'])[:4]}..., not the "
                              f"packed files: stray or missing files; {fail}")
        for k in ("content_sha256", "config_sha256", "weights_sha256", "tokenizer_sha256"):
            if adoc["target"].get(k) != identity.get(k):
                raise BundleError(f"bundle {path}: {adir}/{MANIFEST} was prepared for another target ({k}: "
                                  f"{adoc['target'].get(k)!r} != {identity.get(k)!r} in {BUNDLE_MANIFEST}); {fail}")
        _check_files(root / adir, adoc["files"], root / adir / MANIFEST, fail, "bundle artifact")
        if doc["target_dir"]:
            tdoc = verify_target_files(root / TARGET_DIR, fail)
            if set(tdoc["files"]) | {TARGET_MANIFEST} != packed[TARGET_DIR]:
                raise BundleError(f"bundle {path}: {TARGET_DIR}/{TARGET_MANIFEST} does not list exactly the packed "
                                  f"files: stray or missing files; {fail}")
    except BundleError:
        raise
    except (ArtifactError, KeyError, AttributeError, TypeError) as exc:
        raise BundleError(f"bundle {path}: {exc}") from exc


def _install(stage: Path, home: Path, dirs: list[str]) -> None:
    """Journal first, then the moves: from here on, a kill is rolled forward by `recover_imports`."""
    for rel in dirs:
        parent = (home / rel).parent
        if parent.exists() and not _inside(home, parent):
            raise BundleError(f"{parent} leads outside the home {home} (a link): refused, the home is unchanged; "
                              "make it a plain folder")
    (stage / "old").mkdir()
    write_json_atomic(stage / JOURNAL, {"dirs": dirs})
    _step("journal")
    for rel in dirs:
        move_in(stage, home, rel, _step)
    (stage / JOURNAL).unlink()
    _step("done")


def import_bundle(path: str | Path, home: str | Path | None = None) -> dict:
    """Verify a bundle completely, then move its directories into `home` (replacing the same-named ones).

    Returns {"home", "target", "artifact_dir", "target_dir", "files"}. Any refusal leaves the home as it was.
    """
    path, home = Path(path), dflash_home(home)
    if not path.is_file():
        raise BundleError(f"no bundle at {path}: pass the file written by `python -m dflash_core export --out FILE`")
    if home.exists() and not home.is_dir():
        raise BadInputError(f"the home {home} is not a directory: pass a directory as --home (DFLASH_HOME)")
    try:
        home.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BundleError(os_error_message(exc, writing=str(home))) from exc
    with home_lock(home, wait_message="prepare is writing it"):  # also recovers what a killed import left
        stage = home / f"{STAGE_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        try:
            stage.mkdir()
        except OSError as exc:
            raise BundleError(os_error_message(exc, writing=str(stage)) + "; the home is unchanged") from exc
        installed = False
        try:
            root = stage / "bundle"
            root.mkdir()
            doc = _extract(path, root, home)
            _verify_inside(root, doc, path)
            _step("extracted")
            dirs = [doc["artifact_dir"]] + ([doc["target_dir"]] if doc["target_dir"] else [])
            try:
                _install(stage, home, dirs)
                installed = True
            except OSError as exc:
                try:
                    recover_imports(home)  # the journal is written: finish the moves now if the error was passing
                except OSError:
                    pass
                raise BundleError(os_error_message(exc) + f" while moving the bundle into {home}; any directory "
                                  "moved aside is put back by the next command that takes the home's lock (or run "
                                  "import again)") from exc
        finally:
            if installed or not (stage / JOURNAL).exists():
                shutil.rmtree(stage, ignore_errors=True)
    return {"home": str(home), "target": doc["target"].get("name"), "artifact_dir": str(home / doc["artifact_dir"]),
            "target_dir": str(home / doc["target_dir"]) if doc.get("target_dir") else None,
            "files": len(doc["files"])}
