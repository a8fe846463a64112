"""Write the three report files into <root>/<device type>/, rendered in full before any is written."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from ..errors import ReportInputError
from ..runtime.device import DEVICE_RE
from ..store.artifacts import remove_stale_parts, write_atomic_set
from .html import render_index, render_report


def report_dir(root: str | Path, device: object) -> Path:
    """<root>/<device type>: only a known device name, so a saved run can't point the files outside root."""
    if not isinstance(device, str) or not DEVICE_RE.match(device):
        raise ReportInputError(f"device {str(device)[:60]!r} is not a device name (cpu, cuda, cuda:N, mps); "
                               "the report folder is named after it")
    return Path(root) / device.split(":")[0]


RUN_STEM = re.compile(r"^([0-9]{4})_")  # pytest-benchmark's autosaved file names: 0001_<commit>_<date>.json


def pooled_name(sources: list[str]) -> str:
    """The folder name of a pooled report: `pooled-0001-0002` from autosaved run ids, else `pooled-<hash of the
    sources>`. Why a folder of its own: `report 0001 0002 --out reports` used to overwrite the single run's report
    in reports/<device>/ with the pooled one; now both stand side by side."""
    ids = [m.group(1) for s in sources if (m := RUN_STEM.match(Path(s).name))]
    if len(ids) == len(sources) and len(ids) <= 8 and len(set(ids)) == len(ids):
        return "pooled-" + "-".join(ids)
    return "pooled-" + hashlib.sha256("\n".join(sources).encode()).hexdigest()[:12]


def render_all(doc: dict) -> dict[str, bytes]:
    """All three files in memory: a renderer that fails leaves the previous report whole."""
    return {"benchmark.json": (json.dumps(doc, indent=2, sort_keys=True, allow_nan=False) + "\n").encode(),
            "report.html": render_report(doc).encode("utf-8"),
            "index.html": render_index(doc).encode("utf-8")}


def write_report(doc: dict, root: str | Path, pooled: str | None = None) -> Path:
    """The report's three files in <root>/<device>/, or in <root>/<device>/<pooled>/ for a pooled report (beside the
    single run's, never over it)."""
    out = report_dir(root, doc.get("device"))
    if pooled is not None:
        out = out / pooled
    files = render_all(doc)
    out.mkdir(parents=True, exist_ok=True)
    remove_stale_parts(out)  # what a writer killed mid-write left
    write_atomic_set({out / name: data for name, data in files.items()})  # the three as one set
    return out
