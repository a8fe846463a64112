"""Fingerprint every method on a prepared target: ids and target calls per (method, options, width, prompt).

Why: a refactor of the methods must not change behaviour. Run this before and after on the same prepared
home and diff the two JSON files; any difference in ids or target calls is a behaviour change. The
artifact sha256s from the manifest are included, so a refit that changed a file shows up too.

    python scripts/method_fingerprint.py --home /tmp/fp-home --build-tiny > before.json   # tiny, in seconds
    python scripts/method_fingerprint.py --home ~/.cache/dflash-mini-lab --target mini > mini.json
    diff before.json after.json

When to run: before and after a refactor of the methods, on the same prepared home; diff the two outputs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# Fingerprint the checkout this script lives in, not whatever `dflash_core` the environment has installed
# (a script's sys.path[0] is scripts/, so without this an editable install elsewhere would win).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TOKENS = 24
ID_PROMPTS = ([5], [7, 8, 9, 10], list(range(3, 40)), [11, 3, 11, 3, 11, 60, 61])
# non-default options that exercise more of a method's code (calibrated settings look like these)
VARIANTS: dict[str, tuple[dict, ...]] = {
    "act": ({"tau": 0.5},),
    "boltzmann": ({"temperature": 1.0},),
    "bmobs": ({"temperature": 1.0, "top_k": 4},),
    "dspark_lite": ({"floor": 0.3},),
    "boltzmann_v10": ({"temperature": 0.5, "cutoff": 2.0, "budget": 2, "slope": 1.5},),
    "gated_mobs_v11": ({"temperature": 0.5, "gate": 0.01, "budget": 3, "top_k": 8},),
    "minop_v13": ({"temperature": 0.5, "cutoff": 2.0, "slope": 1.5},),
    "simple_parareal_v14": ({"switch_threshold": 1.0, "max_corrections": 2},),
    "fused_jump": ({"min_margin": 0.1},),
}


def build_tiny(home: Path) -> str:
    """A tiny hybrid LFM2 (no tokenizer) saved under home and prepared with the test configuration."""
    from dflash_core.prepare.pipeline import prepare
    from dflash_core.runtime.target import load_target
    from dflash_core.testing import TinySpec, tiny_prepare_config
    from dflash_core.testing import build_tiny as build

    ckpt = home / "tiny-ckpt"
    if not (ckpt / "config.json").is_file():
        build(TinySpec(dtype="float32", pattern="CCACAC")).save_pretrained(ckpt)
    rt = load_target(str(ckpt), "cpu", "float32")
    prepare(str(ckpt), home=home, cfg=tiny_prepare_config(), rt=rt, progress=False)
    return str(ckpt)


def fingerprint(target: str, home, dtype: str) -> dict:
    import torch

    from dflash_core.methods import method_ids
    from dflash_core.methods.runner import run_method
    from dflash_core.prepare.pipeline import load_prepared
    from dflash_core.runtime.target import load_target

    torch.set_num_threads(1)
    rt = load_target(target, "cpu", dtype, home=home)
    prepared = load_prepared(rt, home=home)
    if rt.tokenizer is None:
        prompts = [list(p) for p in ID_PROMPTS]
    else:
        from dflash_core.store.data import load_prompts

        family = prepared.manifest.get("seeds", {}).get("family", "code")
        prompts = [rt.encode(t) for t in load_prompts(family).calibration[:3]]
    B = prepared.drafter.cfg.block_size
    runs = {}
    for mid in method_ids():
        for opts in ({}, *VARIANTS.get(mid, ())):
            for w in range(1, B + 1) if mid != "normal" else (None,):
                for pi, p in enumerate(prompts):
                    ids, st = run_method(mid, rt, prepared, p, TOKENS, w, **opts)
                    key = f"{mid}|{json.dumps(opts, sort_keys=True)}|w{w}|p{pi}"
                    runs[key] = {"ids": ids, "target_calls": st.target_calls}
    files = {k: v["sha256"] for k, v in sorted(prepared.manifest.get("files", {}).items())}
    return {"target": target, "dtype": dtype, "tokens": TOKENS, "artifacts": files, "runs": runs}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", required=True, help="DFLASH_HOME holding the prepared artifacts")
    ap.add_argument("--target", help="target name or checkpoint directory (default: the --build-tiny one)")
    ap.add_argument("--build-tiny", action="store_true", help="build and prepare a tiny target into --home")
    ap.add_argument("--dtype", default="float32")
    a = ap.parse_args(argv)
    home = Path(a.home)
    target = build_tiny(home) if a.build_tiny else a.target
    if not target:
        ap.error("give --target or --build-tiny")
    json.dump(fingerprint(target, home, a.dtype), sys.stdout, indent=1, sort_keys=True)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
