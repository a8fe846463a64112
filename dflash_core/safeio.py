"""Reading untrusted files with stated limits, and writing files with the user's normal modes.

Every JSON document the lab reads from disk or from a bundle (saved runs, benchmark.json, manifests, bundle.json,
checkpoint and drafter configs) goes through `read_json`: a regular file (never a FIFO or a device, which would
block or never end), at most `MAX_JSON_BYTES`, UTF-8, no NaN/Infinity literals, nested at most `MAX_JSON_DEPTH`
levels. Anything else is the caller's error class with the file's name, never a traceback. The limits are listed
in docs/hostile-input.md.
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any

from .errors import DFlashError

MAX_JSON_BYTES = 64 << 20  # 64 MiB: the largest saved run the lab writes is well under 1 MiB
MAX_JSON_DEPTH = 64  # the lab's own documents nest at most ~8 levels


def current_umask() -> int:
    """The process umask (read by setting and restoring it: the only portable way)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def normal_mode(path: str | Path, directory: bool = False) -> None:
    """chmod `path` to what a plain open/mkdir would give under the umask (0644 / 0755 under 022).

    Why: libraries that save through temp files (transformers' `save_pretrained`, `tempfile.mkstemp`) leave 0600,
    so another user of a shared home, or the host user of a container volume, cannot read the weights."""
    os.chmod(path, (0o777 if directory else 0o666) & ~current_umask())


def normal_modes(directory: str | Path) -> None:
    """`normal_mode` for a directory and every regular file directly inside it (not following links)."""
    directory = Path(directory)
    normal_mode(directory, directory=True)
    for p in directory.iterdir():
        if stat.S_ISREG(os.lstat(p).st_mode):
            normal_mode(p)


def check_regular_file(path: str | Path, what: str, error: type[DFlashError], fix: str,
                       max_bytes: int | None = None) -> os.stat_result:
    """stat (following links, so a hub cache's blob links work) and require a regular file of bounded size.

    A FIFO would block `open` forever and a device such as /dev/zero never ends: both are refused before opening."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise error(f"{what} {path} cannot be read ({exc.strerror or exc}): {fix}") from exc
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode) or
                stat.S_ISBLK(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file")
        raise error(f"{what} {path} is {kind}, not a regular file: {fix}")
    if max_bytes is not None and st.st_size > max_bytes:
        raise error(f"{what} {path} has {st.st_size} bytes, more than the {max_bytes}-byte limit for it: {fix}")
    return st


def json_depth_ok(obj: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when `obj` nests at most `limit` containers deep (iterative: no recursion on hostile input)."""
    stack = [(obj, 1)]
    while stack:
        x, d = stack.pop()
        if isinstance(x, (dict, list)):
            if d > limit:
                return False
            stack.extend((v, d + 1) for v in (x.values() if isinstance(x, dict) else x))
    return True


def parse_json(text: str | bytes, where: str, error: type[DFlashError], fix: str,
               max_depth: int = MAX_JSON_DEPTH) -> Any:
    """json.loads with the lab's limits: no NaN/Infinity, bounded nesting, every failure an `error`."""
    def no_const(c):
        raise error(f"{where}: non-finite number {c} in JSON (NaN and Infinity are not JSON): {fix}")

    def bounded_float(s: str) -> float:
        v = float(s)
        if not math.isfinite(v):  # 1e400 parses to inf
            raise error(f"{where}: number {s[:40]} is beyond a float's range: {fix}")
        return v

    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise error(f"{where} is not UTF-8 text ({exc.reason} at byte {exc.start}): {fix}") from exc
    try:
        doc = json.loads(text, parse_constant=no_const, parse_float=bounded_float)
    except DFlashError:
        raise
    except RecursionError as exc:
        raise error(f"{where} nests deeper than this lab reads ({max_depth} levels): {fix}") from exc
    except ValueError as exc:  # JSONDecodeError, and int() of a >4300-digit number
        raise error(f"{where} is not valid JSON ({str(exc)[:160]}): {fix}") from exc
    if not json_depth_ok(doc, max_depth):
        raise error(f"{where} nests deeper than this lab reads ({max_depth} levels): {fix}")
    return doc


def read_json(path: str | Path, what: str, error: type[DFlashError], fix: str,
              max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Read one JSON file under the limits above (see the module docstring)."""
    check_regular_file(path, what, error, fix, max_bytes)
    try:
        with open(path, "rb") as f:
            raw = f.read(max_bytes + 1)
    except OSError as exc:
        raise error(f"{what} {path} cannot be read ({exc.strerror or exc}): {fix}") from exc
    if len(raw) > max_bytes:
        raise error(f"{what} {path} is larger than the {max_bytes}-byte limit: {fix}")
    return parse_json(raw, f"{what} {path}", error, fix, max_depth)


def check_out_parent(out: Path, error: type[DFlashError]) -> None:
    """An --out the command can create: its nearest existing ancestor is a directory this user can write, checked
    before anything is loaded or packed (a read-only or misspelt place failed only after minutes of work)."""
    for parent in Path(out).parents:
        if parent.exists():
            if not parent.is_dir():
                raise error(f"--out {out}: {parent} is not a directory: choose another --out")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise error(f"--out {out}: permission denied on {parent} (read-only or not yours): choose a folder "
                            "you can write")
            return


def check_writable_dir(path: Path, what: str, error: type[DFlashError], fix: str) -> None:
    """`path` is a directory this user can write, or can be created as one: its nearest existing ancestor is a
    writable directory. Checked before long work whose result lands there (a report folder under a file or on a
    read-only mount failed only after the whole benchmark had run)."""
    path = Path(path)
    for p in (path, *path.parents):
        if p.exists():
            if not p.is_dir():
                raise error(f"{what} {path}: {p} is not a directory: {fix}")
            if not os.access(p, os.W_OK | os.X_OK):
                raise error(f"{what} {path}: permission denied on {p} (read-only or not yours): {fix}")
            return


def finite(x: Any) -> bool:
    """A real number (not a bool) that is finite, and small enough to be a float."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    try:
        return math.isfinite(float(x))
    except OverflowError:
        return False
