"""`python -m dflash_core.report SAVED.json [...] [--out reports]`: rebuild the report from saved runs."""

from __future__ import annotations

import argparse
import sys

from ..errors import DFlashError
from .build import build_report, load_saved
from .write import write_report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dflash_core.report", description=__doc__)
    ap.add_argument("saved", nargs="+", help="pytest-benchmark JSON files (.benchmarks/.../NNNN_*.json)")
    ap.add_argument("--out", default="reports", help="report root; files go to <out>/<device>/")
    a = ap.parse_args(argv)
    try:
        docs = [load_saved(p) for p in a.saved]
        doc = build_report(docs, list(a.saved))
        out = write_report(doc, a.out)
    except DFlashError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0 if doc["exactness"]["all_exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
