"""Issue-8: drafter cost per block and the loop's own overhead for every method on the real 350M configuration.

The random-weight 350M is saved locally and prepared with the small test configuration (block 8, the
drafter barely trained: acceptance is near zero, which is the worst case for overhead per token, since
every round pays the whole loop for one token). For each method, one decode of N tokens at width 4 on the
given kernel path; overhead = wall outside target forwards, drafter forwards (incl. context K/V) and
selection. JSON on stdout. Usage: python studies/2026-11-29-fast-path-goals/overhead_350m.py [tokens] [kernels]
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from dflash_core.methods import speculative_ids
from dflash_core.methods.runner import run_method
from dflash_core.prepare.pipeline import load_prepared, prepare
from dflash_core.runtime.target import load_target
from dflash_core.testing import build_real_350m, tiny_prepare_config


def main() -> None:
    tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 24
    kernels = sys.argv[2] if len(sys.argv) > 2 else "auto"
    torch.set_num_threads(2)
    root = Path(tempfile.mkdtemp(prefix="dflash-350m-"))
    build_real_350m("float32").save_pretrained(root / "ckpt")
    cfg = replace(tiny_prepare_config(), block_size=8, n_taps=3)
    prepare(str(root / "ckpt"), home=root / "home", cfg=cfg, progress=False)
    rt = load_target(str(root / "ckpt"), "cpu", "float32", home=root / "home", kernels=kernels)
    prep = load_prepared(rt, home=root / "home")
    prompt = [1] + list(range(100, 131))
    rows = {}
    for mid in ["normal", *speculative_ids()]:
        run_method(mid, rt, prep, prompt, 4, 4)  # warm-up
        _, st = run_method(mid, rt, prep, prompt, tokens, 4)
        d = st.to_dict()
        rows[mid] = {"wall_s": d["wall_seconds"], "target_s": d["target_seconds"], "draft_s": d["draft_seconds"],
                     "select_s": d["select_seconds"], "overhead_fraction": d["overhead_seconds"] / d["wall_seconds"],
                     "draft_ms_per_block": 1000 * d["draft_seconds"] / max(1, d["draft_calls"]),
                     "target_ms_per_call": 1000 * d["target_seconds"] / max(1, d["target_calls"]),
                     "tokens_per_target_call": d["tokens_per_target_call"]}
        print(mid, json.dumps(rows[mid]), file=sys.stderr, flush=True)
    json.dump({"kernels": rt.kernels, "tokens": tokens, "width": 4, "methods": rows}, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
