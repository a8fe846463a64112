"""`python -m tests.hostile.probe`: build the material, run the chosen cases, print each verdict and the totals."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from . import __doc__ as DOC
from .cases import cases
from .judge import Result, error_lines, probe
from .material import prepare_material

VERDICTS = ("held", "traceback", "defect", "skipped")


def select(only: str | None) -> list:
    """The cases whose group or name contains `only` (all of them without it)."""
    return [c for c in cases() if only is None or only in c.name or only in c.group]


def totals(results: list[Result]) -> dict[str, int]:
    counts = {k: sum(r.verdict == k for r in results) for k in VERDICTS}
    counts["hung"] = sum(r.outcome is not None and r.outcome.timed_out for r in results)
    counts["tried"] = len(results) - counts["skipped"]
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.hostile.probe", description=DOC,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default: a new temp folder); its "
                    "material (the tiny lab, bundles, drafter, saved runs) is reused by the next run")
    ap.add_argument("--lab", type=Path, default=None, help="reuse a tiny lab built by build_tiny_lab")
    ap.add_argument("--only", default=None, help="run the cases whose group or name contains this")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds before a case counts as hung")
    ap.add_argument("--show", action="store_true", help="print each case's error line (what the user reads)")
    a = ap.parse_args(argv)
    work = a.work or Path(tempfile.mkdtemp(prefix="dflash-probe-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    shared = prepare_material(work, a.lab)
    todo = select(a.only)
    results = []
    for i, case in enumerate(todo, 1):
        r = probe(case, shared, work, a.timeout)
        results.append(r)
        secs = f"{r.outcome.seconds:5.1f}s" if r.outcome else "   -  "
        print(f"[{i:3d}/{len(todo)}] {r.verdict:9s} {secs} {case.group:14s} {case.name}"
              + (f"  -- {r.why}" if r.why else ""), flush=True)
        if a.show and r.outcome is not None:
            for line in error_lines(r.outcome.err)[:1]:
                print(f"{'':18s}{line[:300]}", flush=True)
    n = totals(results)
    print(f"\ntried {n['tried']} / held {n['held']} / tracebacks {n['traceback']} / defects {n['defect']} (hangs "
          f"{n['hung']}, skipped {n['skipped']}) in {time.perf_counter() - t0:.0f}s; work folder {work}")
    return 0 if n["traceback"] == n["defect"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
