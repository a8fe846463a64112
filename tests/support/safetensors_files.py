"""Hostile safetensors files for the drafter-loading tests and the probe: a real file whose header claims another
shape or dtype for one weight, still a valid file (offsets laid out again), its data zeros and sparse, so a claim
of gigabytes costs no disk and no memory until a loader reads it."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def with_header(src: Path, dst: Path, name: str, shape: list[int] | None = None, dtype: str | None = None) -> Path:
    """`src` rewritten to `dst` with weight `name` claiming `shape` and/or `dtype` in its header."""
    raw = src.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header[name]["shape"] = shape or header[name]["shape"]
    header[name]["dtype"] = dtype or header[name]["dtype"]
    at = 0
    for k in sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0]):
        end = at + math.prod(header[k]["shape"]) * DTYPE_BYTES[header[k]["dtype"]]
        header[k]["data_offsets"] = [at, end]
        at = end
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(8 + len(text) + at)
    return dst
