"""Regenerate the shipped reference bundle (reference/mini.dflash-bundle.tar.gz) with the project's own pipeline.

    python scripts/make_reference_bundle.py [--threads 2] [--keep-home DIR]

In a fresh, private home: build the standard mini target locally (weights rounded to bf16 right after training,
so the drafter and every fit are trained against the rounded model), run `prepare` (teacher, drafter, every
method's fits), export the verified bundle, import it into a second fresh home to check it, and print the bundle's
size and the model's hashes. About 10 minutes on a quiet 2-core box (60 min when the box was loaded by parallel
work). Run it after changing the prepare recipe, PrepareConfig or MiniTargetConfig
(tests/prepare/test_reference_bundle.py fails until you do), then commit the bundle.

When to run: after changing the prepare recipe, PrepareConfig or MiniTargetConfig
(tests/prepare/test_reference_bundle.py fails until you do).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's dflash_core, whatever is installed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2, help="torch threads for the build (recorded, not compared)")
    ap.add_argument("--keep-home", default=None, help="build in this (new) directory and keep it")
    ap.add_argument("--out", default=None, help="bundle to write (default: the shipped path)")
    ap.add_argument("--keep-target", action="store_true",
                    help="take the mini target from the shipped bundle (verified) instead of training it again, and "
                    "prepare its artifacts afresh: for a change of the prepare recipe only (the build is ~60 %% of "
                    "the time)")
    a = ap.parse_args(argv)
    os.environ.pop("DFLASH_MINI_SEED", None)  # the standard mini target, whatever the shell says

    from dflash_core.prepare.bundle import export_bundle
    from dflash_core.prepare.minitarget import MiniTargetConfig, build_mini_target
    from dflash_core.prepare.pipeline import prepare
    from dflash_core.prepare.reference import REFERENCE_BUNDLE, import_reference
    from dflash_core.prepare.reference_check import staleness
    from dflash_core.progress import ensure_console_logging
    from dflash_core.store.artifacts import mini_target_dir

    ensure_console_logging()
    out = Path(a.out) if a.out else REFERENCE_BUNDLE
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dflash-reference-") as tmp:
        home = Path(a.keep_home) if a.keep_home else Path(tmp) / "home"
        if home.exists() and any(home.iterdir()):
            raise SystemExit(f"error: --keep-home {home} is not empty: name a new directory")
        if a.keep_target:
            got = import_reference(home)  # then prepare rebuilds what today's recipe does not reuse
            shutil.rmtree(got["artifact_dir"])
        else:
            build_mini_target(mini_target_dir(home, seed=None), MiniTargetConfig(threads=a.threads))
        prepare("mini", home=home, threads=a.threads)
        doc = export_bundle(out, "mini", home)
        check = import_reference(Path(tmp) / "check", out)  # what every user's prepare will do
        stale = staleness(check)
        if stale:
            raise SystemExit(f"error: the bundle just written is stale ({'; '.join(stale)})")
    ident = doc["target"]
    print(json.dumps({"bundle": str(out.relative_to(ROOT) if out.is_relative_to(ROOT) else out),
                      "bytes": out.stat().st_size, "mib": round(out.stat().st_size / 2**20, 2),
                      "files": len(doc["files"]), "content_sha256": ident["content_sha256"],
                      "weights_sha256": ident["weights_sha256"], "artifact_dir": doc["artifact_dir"],
                      "minutes": round((time.perf_counter() - t0) / 60, 1)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
