"""Write the three report files atomically into reports/<device>/."""

from __future__ import annotations

import json
from pathlib import Path

from ..artifacts import write_atomic
from .html import render_index, render_report


def write_report(doc: dict, root: str | Path) -> Path:
    out = Path(root) / doc["device"]
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "benchmark.json", (json.dumps(doc, indent=2, sort_keys=True, allow_nan=False) + "\n").encode())
    write_atomic(out / "report.html", render_report(doc).encode("utf-8"))
    write_atomic(out / "index.html", render_index(doc).encode("utf-8"))
    return out
