"""Tokens per target call (tau) of plain dflash on the held-out benchmark prompts, per verify width.

tau is a count, not a timing: it is the same on a loaded and a quiet machine (given the same artifacts), so
this is how drafter recipes are compared without a benchmark session. Each benchmark prompt of the target's
family is decoded for `--tokens` new tokens at every width; tau = new tokens / target calls over all prompts
(what the report's "tokens per target call" gives for the same prompts and tokens).

    python scripts/measure_tau.py --target mini --home DIR [--widths 8,10,12,14,15,16] [--prompts 4] [--tokens 48]

Prints one JSON document: the artifact directory, the drafter's recorded held-out accuracy and tau per width.

When to run: after changing the drafter's recipe, to compare drafters by tokens per target call without a benchmark
session.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> dict:
    import torch

    from dflash_core.methods.runner import run_method
    from dflash_core.prepare.pipeline import PrepareConfig, family_for
    from dflash_core.prepare.prepared import load_prepared
    from dflash_core.runtime.target import load_target
    from dflash_core.store.data import load_prompts

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="mini")
    ap.add_argument("--home", default=None)
    ap.add_argument("--widths", default="8,10,12,14,15,16")
    ap.add_argument("--prompts", type=int, default=4, help="benchmark prompts (the bench default is 4)")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--with-calibration", action="store_true",
                    help="also the calibration prompts (held out from training as well): a larger, less noisy sample")
    a = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(a.threads)
    rt = load_target(a.target, "cpu", "float32", home=a.home)
    prep = load_prepared(rt, home=a.home)
    ps = load_prompts(family_for(rt, PrepareConfig()))
    prompts = list(ps.benchmark[: a.prompts]) + (list(ps.calibration) if a.with_calibration else [])
    ids = [rt.encode(p) for p in prompts]
    tau = {}
    for w in (int(x) for x in a.widths.split(",")):
        if w > prep.drafter.cfg.block_size:
            continue
        toks = calls = 0
        for p in ids:
            _, st = run_method("dflash", rt, prep, p, a.tokens, w)
            toks, calls = toks + st.new_tokens, calls + st.target_calls
        tau[w] = toks / calls
        print(f"width {w}: tau {tau[w]:.3f}", file=sys.stderr, flush=True)
    d = prep.manifest.get("drafter", {})
    doc = {"artifacts": str(prep.directory), "recipe": prep.manifest.get("recipe"), "prompts": len(ids),
           "tokens": a.tokens, "heldout_position_accuracy": d.get("heldout_position_accuracy"),
           "best_step": d.get("best_step"), "steps_run": d.get("steps_run"), "tau": tau,
           "best_width": max(tau, key=tau.get) if tau else None}
    print(json.dumps(doc))
    return doc


if __name__ == "__main__":
    main()
