"""Artifact cache: where prepared files live, their manifest, and verification (DESIGN contract 5).

Every file is written atomically (temp file + os.replace) and listed in `manifest.json` with SHA-256
and byte size. Loading re-hashes each file; a flipped byte, a wrong size, a missing file or a manifest
made for another target is refused with a message naming the file and the `--refresh` fix.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import re
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .errors import ArtifactError

MANIFEST = "manifest.json"
FORMAT_VERSION = 1


def dflash_home(home: str | Path | None = None) -> Path:
    """DFLASH_HOME, default ~/.cache/dflash-mini-lab."""
    if home is not None:
        return Path(home).expanduser()
    return Path(os.environ.get("DFLASH_HOME", "~/.cache/dflash-mini-lab")).expanduser()


def mini_target_dir(home: str | Path | None = None) -> Path:
    return dflash_home(home) / "targets" / "mini"


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_atomic(path: str | Path, data: bytes) -> None:
    """Write to a temp file in the same directory, fsync, then os.replace: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json_atomic(path: str | Path, obj: Any) -> None:
    write_atomic(path, (json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n").encode("utf-8"))


def torch_bytes(obj: Any) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def target_identity(rt) -> dict:
    """What makes prepared artifacts valid for a target: its name, config hash and weight sizes."""
    if "identity" in getattr(rt, "info", {}):  # computed at load, before a kernel path repacked the weights
        return {**rt.info["identity"], "name": rt.name}
    cfg = rt.model.config.to_json_string(use_diff=False)
    cfg = re.sub(r'\s*"(transformers_version|_name_or_path|dtype|torch_dtype)":[^\n]*\n', "\n", cfg)
    # A strided sample of every parameter: cheap, and it tells apart checkpoints that share a config
    # (e.g. the real 350M weights and a random-weight copy of its config).
    import torch

    h = hashlib.sha256()
    with torch.no_grad():
        for name, p in sorted(rt.model.state_dict().items()):
            flat = p.detach().reshape(-1)[:: 997].to(device="cpu", dtype=torch.float32)
            h.update(name.encode())
            h.update(flat.numpy().tobytes())
    ident = {"name": rt.name, "config_sha256": sha256_bytes(cfg.encode()), "weights_sample_sha256": h.hexdigest(),
             "parameters": int(sum(p.numel() for p in rt.model.parameters())),
             "vocab_size": rt.vocab_size, "hidden_size": rt.hidden_size, "num_layers": rt.num_layers}
    return ident


def target_key(identity: dict) -> str:
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(identity["name"]).name or "target")[:48]
    return f"{stem}-{identity['config_sha256'][:8]}{identity['weights_sample_sha256'][:8]}"


def artifact_dir(identity: dict, home: str | Path | None = None) -> Path:
    return dflash_home(home) / "artifacts" / target_key(identity)


def versions() -> dict:
    import numpy
    import torch
    import transformers

    from . import __version__

    return {"dflash_core": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "numpy": numpy.__version__, "python": platform.python_version()}


def file_entry(path: Path) -> dict:
    return {"sha256": sha256_file(path), "bytes": path.stat().st_size}


def write_manifest(directory: Path, identity: dict, files: dict[str, dict], extra: dict) -> dict:
    doc = {"format_version": FORMAT_VERSION, "target": identity, "files": files, "versions": versions(),
           "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"), **extra}
    write_json_atomic(directory / MANIFEST, doc)
    return doc


def read_manifest(directory: Path, identity: dict | None, required: tuple[str, ...] = ()) -> dict:
    """Load and verify a manifest and its files. Every failure names the file and the fix."""
    fix = f"run `python -m dflash_core prepare --target {identity['name'] if identity else '<target>'} --refresh`"
    mpath = directory / MANIFEST
    if not mpath.is_file():
        raise ArtifactError(f"no prepared artifacts in {directory} ({MANIFEST} missing): {fix}")
    try:
        doc = json.loads(mpath.read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"{mpath} is not valid JSON ({exc}): {fix}") from exc
    if doc.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(f"{mpath} has format_version {doc.get('format_version')!r}, expected "
                            f"{FORMAT_VERSION}: {fix}")
    if identity is not None:
        have = doc.get("target", {})
        for k in ("config_sha256", "weights_sample_sha256", "parameters", "vocab_size"):
            if have.get(k) != identity.get(k):
                raise ArtifactError(f"{mpath} was prepared for another target ({k}: {have.get(k)!r} != "
                                    f"{identity.get(k)!r}): {fix}")
    files = doc.get("files", {})
    for name in required:
        if name not in files:
            raise ArtifactError(f"{mpath} lacks {name!r}, which this method needs: {fix} (it builds {name})")
    for name, meta in files.items():
        p = directory / name
        if not p.is_file():
            raise ArtifactError(f"artifact {p} listed in the manifest is missing: {fix}")
        size = p.stat().st_size
        if size != meta.get("bytes"):
            raise ArtifactError(f"artifact {p} has {size} bytes, the manifest says {meta.get('bytes')}: "
                                f"the file is truncated or replaced; {fix}")
        digest = sha256_file(p)
        if digest != meta.get("sha256"):
            raise ArtifactError(f"artifact {p} fails its SHA-256 check ({digest[:12]}... != "
                                f"{str(meta.get('sha256'))[:12]}...): the file is corrupt; {fix}")
    return doc
