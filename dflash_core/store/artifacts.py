"""Artifact cache: where prepared files live, their manifest, and verification (docs/design.md §5).

Every file is written atomically (temp file + os.replace, with the umask's normal mode) and listed in
`manifest.json` with SHA-256 and byte size. Loading re-hashes each file; a flipped byte, a wrong size, a
missing file or a manifest made for another target is refused with a message naming the file and the
`--refresh` fix. Artifacts are keyed by the target's *content* (full weights, config, tokenizer), so the
same checkpoint in another folder finds the same artifacts. A built target directory (the mini target)
carries its own `target_manifest.json`, checked before the weights are loaded. `prepare` holds the home's
lock (`<home>/.prepare.lock`) while it writes; readers take the same lock, so they wait for a writer.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import re
import secrets
import stat
import sys
import threading
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from .. import __version__
from ..errors import ArtifactError, BadInputError
from ..options import env_value
from ..safeio import read_json
from .journal import recover_imports

MANIFEST = "manifest.json"
TARGET_MANIFEST = "target_manifest.json"  # inside a built target directory (the mini target)
META_FILE = "mini_target_meta.json"  # the mini target (and any copy of it) says what it is: prompt family, corpus
LOCK_FILE = ".prepare.lock"
FORMAT_VERSION = 1
# What a manifest's target identity must match for the artifacts to belong to a runtime (content, not names).
IDENTITY_KEYS = ("content_sha256", "config_sha256", "weights_sha256", "tokenizer_sha256", "parameters",
                 "vocab_size")


def dflash_home(home: str | Path | None = None) -> Path:
    """DFLASH_HOME, default ~/.cache/dflash-mini-lab."""
    return Path(home if home is not None else env_value("home")).expanduser()


def check_home(home: str | Path | None = None) -> Path:
    """The home, refused up front when it (or a folder above it) exists and is not a directory."""
    d = dflash_home(home)
    for p in [d, *d.parents]:
        if p.exists():
            if not p.is_dir():
                raise BadInputError(f"the home {d} (--home / DFLASH_HOME) cannot be a folder: {p} is a file; pass "
                                    "a directory")
            break
    return d


def mini_target_dir(home: str | Path | None = None, seed: int | None = None) -> Path:
    """The mini target's folder: targets/mini for the standard build, targets/mini-seed-N for the one trained with
    seed N (`seed`, else DFLASH_MINI_SEED), so independent mini targets never share a folder in one home."""
    seed = env_value("mini_seed") if seed is None else seed
    return dflash_home(home) / "targets" / ("mini" if seed is None else f"mini-seed-{int(seed)}")


def hash_file_into(h, path: str | Path):
    """Feed a file's bytes to hash `h` in 1 MiB chunks (memory independent of the file's size); returns `h`."""
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h


def sha256_file(path: str | Path) -> str:
    return hash_file_into(hashlib.sha256(), path).hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_atomic(path: str | Path, data: bytes) -> None:
    """Write to a temp file in the same directory, fsync, then os.replace: readers never see half a file.

    The temp file is opened with mode 0o666 so the umask decides the final mode (0644 under the usual 022),
    like any other file the user writes; `tempfile.mkstemp` would force 0600 and hide reports from a web
    server or the host user of a container volume.
    """
    write_atomic_set({Path(path): data})


def _stage(path: Path, data: bytes) -> Path:
    """`data` in a fsynced temp file beside `path` (removed again on any failure); an OSError names `path` (a
    failed write has no file name of its own, and a full disk read "while writing a file")."""
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{PART_SUFFIX}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException as exc:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.filename is None:
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    return tmp


def write_atomic_set(files: dict[Path, bytes]) -> None:
    """Write several files as one: every one is staged (fsynced) before the first is moved in, so a full disk or
    a failure while writing any of them leaves all the previous files whole (a report's three files never mix
    two runs that way; a kill between the renames, microseconds apart, still can)."""
    staged: list[tuple[Path, Path]] = []
    try:
        for path, data in files.items():
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            staged.append((_stage(path, data), path))
        for tmp, path in staged:
            os.replace(tmp, path)
    except BaseException:
        for tmp, _ in staged:
            if os.path.lexists(tmp):
                os.unlink(tmp)
        raise


PART_SUFFIX = ".part"


def remove_stale_parts(folder: Path) -> list[Path]:
    """Remove the temp files (`.NAME.PID.HEX.part`) a killed writer left in `folder`: those whose process is gone.
    A live writer's (another process writing the same folder now) stay."""
    gone = []
    for p in Path(folder).glob(f".*{PART_SUFFIX}"):
        parts = p.name.split(".")
        pid = parts[-3] if len(parts) >= 4 else ""
        if not pid.isdigit() or _alive(int(pid)) or not stat.S_ISREG(os.lstat(p).st_mode):
            continue
        p.unlink(missing_ok=True)
        gone.append(p)
    return gone


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def write_json_atomic(path: str | Path, obj: Any) -> None:
    write_atomic(path, (json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n").encode("utf-8"))


TREE_KEY = "dflash_tree"  # safetensors metadata entry: the JSON skeleton of the nested artifact
TENSOR_REF = "$tensor"  # in the skeleton, {"$tensor": key} stands for the tensor stored under `key`


def tensor_bytes(obj: Any) -> bytes:
    """A nested artifact (dicts/lists of tensors, numbers, strings) as safetensors bytes.

    Tensors are stored under their path in the tree ("state_dict/layers.0.q.weight": "/" joins the levels,
    since state-dict keys already use dots); everything else rides as a JSON skeleton in the safetensors
    metadata header, where {"$tensor": key} marks each tensor. Loading is `load_tensor_file`: nothing is ever
    unpickled (safetensors is a flat header + raw buffers), unlike the torch.save files this replaces.
    """
    import torch
    from safetensors.torch import save

    tensors: dict[str, Any] = {}

    def walk(x: Any, path: tuple[str, ...]) -> Any:
        if isinstance(x, torch.Tensor):
            key = "/".join(path) or "tensor"
            if key in tensors:
                raise ValueError(f"two tensors of the artifact map to the key {key!r} (a dict key contains '/')")
            tensors[key] = x.detach().to("cpu").contiguous().clone()  # clone: safetensors refuses shared storage
            return {TENSOR_REF: key}
        if isinstance(x, dict):
            if any(not isinstance(k, str) or k == TENSOR_REF for k in x):
                raise ValueError(f"artifact dict keys must be strings other than {TENSOR_REF!r}: {list(x)[:5]}")
            return {k: walk(v, (*path, k)) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [walk(v, (*path, str(i))) for i, v in enumerate(x)]
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        raise TypeError(f"an artifact holds tensors, dicts, lists and JSON scalars, not {type(x).__name__}")

    skeleton = walk(obj, ())
    # One metadata entry only: safetensors writes its metadata map in hash order, which varies between
    # processes, and prepare's files must be byte-reproducible (same SHA-256 every build).
    return save(tensors, metadata={TREE_KEY: json.dumps(skeleton, sort_keys=True)})


def load_tensor_file(path: str | Path) -> Any:
    """Read an artifact written from `tensor_bytes` (safetensors; no unpickling, no code runs).

    A file that is not such an artifact (corrupt header, a torch.save pickle, a bare checkpoint without the
    skeleton) is an ArtifactError naming the file and the fix.
    """
    from safetensors import SafetensorError, safe_open

    fix = "rebuild it with `python -m dflash_core prepare --target <target> --refresh`"
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        skeleton = json.loads(meta[TREE_KEY]) if TREE_KEY in meta else None
    except (SafetensorError, OSError, ValueError) as exc:
        raise ArtifactError(f"artifact {path} is not a readable safetensors file ({type(exc).__name__}: "
                            f"{str(exc).splitlines()[0][:160] if str(exc) else ''}); the lab loads only "
                            f"safetensors and never unpickles: {fix}") from exc
    if skeleton is None:
        raise ArtifactError(f"artifact {path} is a safetensors file without the lab's {TREE_KEY!r} metadata "
                            f"(not written by prepare): {fix}")

    def build(x: Any) -> Any:
        if isinstance(x, dict):
            if set(x) == {TENSOR_REF}:
                if x[TENSOR_REF] not in tensors:
                    raise ArtifactError(f"artifact {path} names a tensor {x[TENSOR_REF]!r} it does not hold: "
                                        f"the file is corrupt; {fix}")
                return tensors[x[TENSOR_REF]]
            return {k: build(v) for k, v in x.items()}
        if isinstance(x, list):
            return [build(v) for v in x]
        return x

    return build(skeleton)


# --- target identity (content, not names) --------------------------------------------------------

def config_digest(config) -> str:
    """SHA-256 of the model config without fields that name a place, a dtype or a library version."""
    cfg = config.to_json_string(use_diff=False)
    cfg = re.sub(r'\s*"(transformers_version|_name_or_path|dtype|torch_dtype)":[^\n]*\n', "\n", cfg)
    return sha256_bytes(cfg.encode())


def weights_digest(model) -> str:
    """SHA-256 of every parameter and buffer, at float32, in name order: every weight counts (a single
    flipped bit in any tensor changes it), and the precision a run uses does not."""
    import torch

    h = hashlib.sha256()
    with torch.no_grad():
        for name, p in sorted(model.state_dict().items()):
            t = p.detach().to(device="cpu", dtype=torch.float32).contiguous()
            h.update(name.encode())
            h.update(str(tuple(t.shape)).encode())
            h.update(memoryview(t.numpy()).cast("B"))
    return h.hexdigest()


def tokenizer_digest(tokenizer) -> str | None:
    """SHA-256 of the tokenizer's own serialisation (vocabulary, merges, pre/post-processing, specials)."""
    if tokenizer is None:
        return None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    body = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
    specials = {k: getattr(tokenizer, k, None) for k in ("bos_token_id", "eos_token_id", "pad_token_id",
                                                          "unk_token_id")}
    return sha256_bytes((body + json.dumps(specials, sort_keys=True)).encode())


def compute_identity(model, tokenizer, name: str) -> dict:
    """What makes prepared artifacts valid for a target: a hash of its full weights, config and tokenizer."""
    cfg = model.config
    ident = {"name": name, "model_type": str(getattr(cfg, "model_type", "model")),
             "config_sha256": config_digest(cfg), "weights_sha256": weights_digest(model),
             "tokenizer_sha256": tokenizer_digest(tokenizer),
             "parameters": int(sum(p.numel() for p in model.parameters())),
             "vocab_size": int(cfg.vocab_size), "hidden_size": int(cfg.hidden_size),
             "num_layers": int(cfg.num_hidden_layers)}
    content = {k: ident[k] for k in ("config_sha256", "weights_sha256", "tokenizer_sha256")}
    ident["content_sha256"] = sha256_bytes(json.dumps(content, sort_keys=True).encode())
    return ident


def target_identity(rt) -> dict:
    """The runtime's identity: computed at load (float32, before any cast or kernel repacking), else now."""
    info = getattr(rt, "info", {})
    if "identity" in info:
        return {**info["identity"], "name": rt.name}
    return compute_identity(rt.model, rt.tokenizer, rt.name)


def target_key(identity: dict) -> str:
    """Directory name of a target's artifacts: its architecture plus its content hash (no folder names)."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", str(identity.get("model_type") or "target"))[:24]
    return f"{stem}-{identity['content_sha256'][:16]}"


def artifact_dir(identity: dict, home: str | Path | None = None) -> Path:
    return dflash_home(home) / "artifacts" / target_key(identity)


def check_inside_home(path: str | Path, home: str | Path | None = None) -> None:
    """Refuse a link on the way from the home to `path` (a folder prepare writes into): a link planted at
    `<home>/artifacts` made prepare write a whole artifact folder outside the home. Checked by lstat, component by
    component, before anything is created; a home that is itself a link is the user's choice and stays allowed."""
    root = dflash_home(home)
    try:
        rel = Path(os.path.abspath(path)).relative_to(os.path.abspath(root))
    except ValueError:
        raise BadInputError(f"{path} is not inside the home {root}: prepare writes only there") from None
    cur = Path(os.path.abspath(root))
    for part in rel.parts:
        cur = cur / part
        if not os.path.lexists(cur):
            return
        if os.path.islink(cur) or not cur.is_dir():
            kind = "a link" if os.path.islink(cur) else "not a folder"
            raise BadInputError(f"{cur} is {kind}, so prepare would write outside the home {root} (or fail midway): "
                                "make it a plain folder (or remove it); nothing was written")


# --- the home's lock -------------------------------------------------------------------------------

def home_lock_path(home: str | Path | None = None) -> Path:
    # absolute: one lock object per home however it is spelled (the lock is reentrant per object only)
    return Path(os.path.abspath(dflash_home(home) / LOCK_FILE))


def _rank() -> int:
    """This process's rank in a torchrun group, 0 outside one. Only `prepare.distributed` joins a group, and it
    has imported torch by then, so a process without torch loaded is rank 0 (the lock need not import torch)."""
    d = sys.modules.get("torch.distributed")
    return d.get_rank() if d is not None and d.is_available() and d.is_initialized() else 0


_LOCK_DEPTH = threading.local()  # per thread: how deep each home's lock is held (recovery runs at depth 1 only)


def check_lock_file(path: Path) -> None:
    """The lock file is absent or a regular file of the home. A link (its target may lie outside the home), a FIFO
    or a folder planted there made the lock fail to open, and the command then ran silently unlocked."""
    try:
        st = os.lstat(path)
    except OSError:
        return  # absent (created on acquire) or an unreadable home: the read-only fallback below decides
    if not stat.S_ISREG(st.st_mode):
        kind = ("a link" if stat.S_ISLNK(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode)
                else "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file")
        raise ArtifactError(f"the home's lock {path} is {kind}, not the lab's lock file: remove it (the lab "
                            "creates it again) and rerun")


@contextmanager
def home_lock(home: str | Path | None = None, *, wait_message: str = ""):
    """Hold the home's lock (reentrant in one thread). A second process or thread waits for the holder,
    so a reader never sees a half-rewritten home and never races a rebuild. The outermost holder first repairs
    what a killed `import` left (`journal.recover_imports`), so no command sees a home without its artifacts.

    In a torchrun group only rank 0 takes it: it holds it for the group (the other ranks write nothing and
    read only after a barrier that follows rank 0's writes), so ranks never wait on each other's lock."""
    if _rank() > 0:
        yield
        return

    path = home_lock_path(home)
    check_lock_file(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(path), is_singleton=True)
    except OSError:  # a read-only home (e.g. an imported bundle on a read-only mount): nobody writes it
        yield
        return
    try:
        lock.acquire(timeout=0)
    except Timeout:
        logging.getLogger("dflash_core.prepare.pipeline").info(
            "waiting for another process that holds %s%s", path, f" ({wait_message})" if wait_message else "")
        lock.acquire()
    except OSError:
        yield
        return
    depth = _LOCK_DEPTH.__dict__.setdefault("by_path", {})
    key = str(path)
    depth[key] = depth.get(key, 0) + 1
    try:
        if depth[key] == 1:  # the outermost holder: nothing else of this home is in progress
            recover_imports(path.parent)  # an import a kill interrupted is finished or undone first
        yield
    finally:
        depth[key] -= 1
        lock.release()


def _home_of(directory: Path) -> Path | None:
    """The home an artifact or target directory lives in (`<home>/artifacts/<key>`, `<home>/targets/<name>`)."""
    if directory.parent.name in ("artifacts", "targets"):
        return directory.parent.parent
    return None


@contextmanager
def reading_lock(directory: Path):
    """Wait for (and hold) the lock of the home `directory` lives in; no lock outside a home."""
    home = _home_of(Path(directory))
    if home is None:
        yield
        return
    with home_lock(home, wait_message="prepare is writing it"):
        yield


def versions() -> dict:
    import numpy
    import torch
    import transformers

    return {"dflash_core": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "numpy": numpy.__version__, "python": platform.python_version()}


def file_entry(path: Path) -> dict:
    return {"sha256": sha256_file(path), "bytes": path.stat().st_size}


def write_manifest(directory: Path, identity: dict, files: dict[str, dict], extra: dict) -> dict:
    doc = {"format_version": FORMAT_VERSION, "target": identity, "files": files, "versions": versions(),
           "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"), **extra}
    write_json_atomic(directory / MANIFEST, doc)
    return doc


def _load_manifest_doc(mpath: Path, fix: str, what: str) -> dict:
    """Parse a manifest and check its shape: valid JSON of the wrong shape is corruption, not a crash."""
    doc = read_json(mpath, what, ArtifactError, fix)  # a regular file, bounded size and nesting, no NaN
    if not isinstance(doc, dict):
        raise ArtifactError(f"{mpath} is not a {what} (a JSON object was expected, found "
                            f"{type(doc).__name__}): the file is corrupt; {fix}")
    if doc.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(f"{mpath} has format_version {doc.get('format_version')!r}, expected "
                            f"{FORMAT_VERSION}: {fix}")
    files = doc.get("files", {})
    if not isinstance(files, dict):
        raise ArtifactError(f"{mpath}: 'files' must map file names to {{sha256, bytes}}, found "
                            f"{type(files).__name__}: the file is corrupt; {fix}")
    for name, meta in files.items():
        if (not isinstance(meta, dict) or not isinstance(meta.get("sha256"), str)
                or not isinstance(meta.get("bytes"), int) or "/" in name or name.startswith(".")):
            raise ArtifactError(f"{mpath}: entry {name!r} is not a {{sha256, bytes}} record of a file in "
                                f"{mpath.parent}: the file is corrupt; {fix}")
    if not isinstance(doc.get("target", {}), dict):
        raise ArtifactError(f"{mpath}: 'target' must be an object: the file is corrupt; {fix}")
    return doc


def _check_files(directory: Path, files: dict, mpath: Path, fix: str, kind: str) -> None:
    for name, meta in files.items():
        p = directory / name
        if not p.is_file():
            raise ArtifactError(f"{kind} {p} listed in {mpath.name} is missing: {fix}")
        size = p.stat().st_size
        if size != meta["bytes"]:
            raise ArtifactError(f"{kind} {p} has {size} bytes, {mpath.name} says {meta['bytes']}: "
                                f"the file is truncated or replaced; {fix}")
        digest = sha256_file(p)
        if digest != meta["sha256"]:
            raise ArtifactError(f"{kind} {p} fails its SHA-256 check ({digest[:12]}... != "
                                f"{meta['sha256'][:12]}...): the file is corrupt; {fix}")


def read_manifest(directory: Path, identity: dict | None, required: tuple[str, ...] = ()) -> dict:
    """Load and verify a manifest and its files (waiting for a writer that holds the home's lock).
    Every failure names the file and the fix."""
    fix = f"run `python -m dflash_core prepare --target {identity['name'] if identity else '<target>'} --refresh`"
    mpath = directory / MANIFEST
    with reading_lock(directory):
        if not mpath.is_file():
            raise ArtifactError(f"no prepared artifacts in {directory} ({MANIFEST} missing): {fix}")
        doc = _load_manifest_doc(mpath, fix, "manifest")
        if identity is not None:
            have = doc.get("target", {})
            for k in IDENTITY_KEYS:
                if have.get(k) != identity.get(k):
                    raise ArtifactError(f"{mpath} was prepared for another target ({k}: {have.get(k)!r} != "
                                        f"{identity.get(k)!r}): {fix}")
        files = doc.get("files", {})
        for name in required:
            if name not in files:
                raise ArtifactError(f"{mpath} lacks {name!r}, which this method needs: {fix} (it builds {name})")
        _check_files(directory, files, mpath, fix, "artifact")
    return doc


# --- a built target's own manifest ----------------------------------------------------------------

def write_target_manifest(directory: str | Path) -> dict:
    """List every file of a built target directory with SHA-256 and size (`target_manifest.json`)."""
    directory = Path(directory)
    files = {p.name: file_entry(p) for p in sorted(directory.iterdir())
             if p.is_file() and p.name != TARGET_MANIFEST and not p.name.startswith(".")}
    doc = {"format_version": FORMAT_VERSION, "files": files}
    write_json_atomic(directory / TARGET_MANIFEST, doc)
    return doc


def verify_target_files(directory: str | Path, fix: str) -> dict:
    """Check a target directory against its `target_manifest.json`; a flipped byte, a truncated
    model.safetensors or a corrupt tokenizer.json is an ArtifactError naming the file and `fix`."""
    directory = Path(directory)
    mpath = directory / TARGET_MANIFEST
    if not mpath.is_file():
        raise ArtifactError(f"the target in {directory} has no {TARGET_MANIFEST} (its weights cannot be "
                            f"verified): {fix}")
    doc = _load_manifest_doc(mpath, fix, "target manifest")
    _check_files(directory, doc["files"], mpath, fix, "target file")
    return doc
