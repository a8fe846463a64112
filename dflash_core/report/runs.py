"""Find saved runs the way `pytest-benchmark compare` does: a path, a run id (0001) or a glob, searched in the
storage folder (default .benchmarks) across every machine folder under it."""

from __future__ import annotations

import re
from pathlib import Path

from .build import ReportInputError

RUN_ID = re.compile(r"^[0-9]{4}$")


def resolve_runs(args: list[str], storage: str | Path = ".benchmarks") -> list[Path]:
    """Each argument -> the saved files it names, in order, without duplicates."""
    from pytest_benchmark.storage.file import FileStorage  # its own query: the same matching as `compare`

    store = Path(storage)
    out: list[Path] = []
    for arg in args:
        if Path(arg).exists() and not Path(arg).is_dir():  # a FIFO or device too: load_saved refuses it by name
            found = [Path(arg)]
        elif not store.is_dir():
            raise ReportInputError(f"{arg!r} is not a file, and the storage folder {store} does not exist: run "
                                   "`pytest benchmarks --benchmark-autosave` first, or pass --storage DIR")
        else:
            try:
                found = FileStorage(store, logger=None).query(arg)
            except (ValueError, NotImplementedError) as exc:  # pathlib's glob refuses absolute patterns this way
                raise ReportInputError(f"{arg!r} is not a file, and not a run id or glob of {store} ({exc}): pass an "
                                       "existing file, a run id (0001) or a relative glob") from exc
        if not found:
            raise ReportInputError(f"no saved run matches {arg!r} under {store}: pass a run id (0001), a "
                                   "glob ('*_abc1234*'), 'MACHINE/0001' or a file path")
        if RUN_ID.match(arg) and len({p.parent for p in found}) > 1:
            raise ReportInputError(f"run id {arg} is ambiguous under {store}: "
                                   + ", ".join(str(p) for p in found)
                                   + "; pass 'MACHINE-FOLDER/" + arg + "' or a path")
        out.extend(p for p in found if p not in out)
    return out
