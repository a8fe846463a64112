"""Bundle surgery for the hostile-bundle tests and the probe: read a bundle's members, write members back as a
bundle, and copy one with bundle.json edited and members appended (each a way an attacker could cut one)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path


def members(path: Path) -> list[tuple[tarfile.TarInfo, bytes]]:
    with tarfile.open(path, "r:gz") as tar:
        return [(m, tar.extractfile(m).read() if m.isfile() else b"") for m in tar.getmembers()]


def write_tar(dst: Path, entries) -> Path:
    with tarfile.open(dst, "w:gz", compresslevel=1) as tar:
        for info, data in entries:
            if info.isfile():
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return dst


def member_info(name: str, kind=tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    i = tarfile.TarInfo(name)
    i.type, i.linkname, i.mode = kind, link, 0o644
    return i


def edit_bundle(src: Path, dst: Path, edit=None, extra=()) -> Path:
    """A copy of bundle `src` with bundle.json edited by `edit(doc)` and `extra` members appended."""
    out = []
    for m, data in members(src):
        if m.name == "bundle.json" and edit is not None:
            doc = json.loads(data)
            edit(doc)
            data = json.dumps(doc).encode()
        out.append((m, data))
    return write_tar(dst, out + list(extra))


def with_target_file(src: Path, dst: Path, name: str, data: bytes) -> Path:
    """A consistent bundle with one more target file, listed in bundle.json and target_manifest.json."""
    entry = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    out, tm_name, tm_entry = [], "targets/mini/target_manifest.json", None
    for m, d in members(src):
        if m.name == tm_name:
            tm = json.loads(d)
            tm["files"][name] = entry
            d = json.dumps(tm).encode()
            tm_entry = {"sha256": hashlib.sha256(d).hexdigest(), "bytes": len(d)}
        out.append((m, d))
    doc = json.loads(out[0][1])
    doc["files"][f"targets/mini/{name}"], doc["files"][tm_name] = entry, tm_entry
    out[0] = (out[0][0], json.dumps(doc).encode())
    return write_tar(dst, out + [(member_info(f"targets/mini/{name}"), data)])


class Zeros(io.RawIOBase):
    """`n` zero bytes, produced as they are read (a 2 GiB member without 2 GiB of memory)."""

    def __init__(self, n: int):
        self.left = n

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        k = min(len(b), self.left)
        b[:k] = bytes(k)
        self.left -= k
        return k


def zeros_bundle(dst: Path, size: int, head=()) -> Path:
    """A bundle of the members `head`, then `size` zero bytes as artifacts/zeros.safetensors, streamed."""
    with tarfile.open(dst, "w:gz", compresslevel=1) as tar:
        for info, data in head:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        z = member_info("artifacts/zeros.safetensors")
        z.size = size
        tar.addfile(z, io.BufferedReader(Zeros(size), 1 << 20))
    return dst
