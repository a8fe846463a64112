"""The per-dtype lines of the device check (dflash_core/bench/dtypes.py): run by scripts/device_gpu_check.sh on a
lent GPU, one JSON line per dtype on the prepared mini target. Run it by hand as
`python scripts/device_dtypes.py --device cuda --dtypes float32,float16,bfloat16` (a CPU: --device cpu
--dtypes float32,bfloat16). Exit 1 when any method diverged beyond its dtype's tie tolerance.

When to run: by scripts/device_gpu_check.sh on a lent GPU, or by hand on a GPU (docs/gpu.md)."""

from __future__ import annotations

import argparse
import json
import sys

from dflash_core.bench.dtypes import dtype_line
from dflash_core.prepare.prepared import load_prepared
from dflash_core.runtime.numerics import pin_exact
from dflash_core.runtime.target import load_target
from dflash_core.store.data import load_prompts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--target", default="mini")
    ap.add_argument("--dtypes", default="float32,float16,bfloat16")
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--width", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=2)
    a = ap.parse_args(argv)
    pin_exact()
    ok = True
    for dt in a.dtypes.split(","):
        rt = load_target(a.target, a.device, dt, kernels="eager")
        prompts = [rt.encode(t) for t in load_prompts(rt.info.get("family") or "english").calibration[:a.prompts]]
        line = dtype_line(rt, load_prepared(rt), prompts, a.tokens, a.width)
        ok &= line["all_ok"]
        print("DTYPE " + json.dumps(line, sort_keys=True), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
