"""Train drafter variants (block 8, 2 layers at block 8, block 16) on one set of teacher data
and compare held-out accuracy per second of drafting. Writes a JSON and prints a markdown table.

    python studies/2026-11-30-drafter-variants/drafter_variants.py --out drafter-variants.json [--steps N] [--threads 1]

Not a test and not a prepare: nothing is written into the home. See studies/drafter_lab/variants.py for the formulas.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: import the checkout's dflash_core
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dflash_core.errors import BadInputError  # noqa: E402
from dflash_core.prepare.pipeline import PrepareConfig  # noqa: E402
from studies.drafter_lab import variants as V  # noqa: E402  (the shared drafter-variants code)

log = logging.getLogger("dflash_core.variants")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="mini", help="'mini' (from the home) or a local checkpoint directory")
    p.add_argument("--home", default=None, help="DFLASH_HOME to load the mini target from (default: the lab's)")
    p.add_argument("--steps", type=int, default=None, help="training steps per variant (default: PrepareConfig's)")
    p.add_argument("--rounds", type=int, default=300, help="timed block calls per variant (interleaved)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--trajectories", default=None,
                   help="a prepare-written trajectories.json to reuse instead of generating the teacher data")
    p.add_argument("--out", default="drafter-variants.json", help="JSON output path (written atomically)")
    p.add_argument("--progress", action="store_true", help="progress bars")
    return p.parse_args(argv)


def load_local_target(target: str, home: str | None):
    """The target on CPU in float32, as prepare trains with it; a hub id is refused (this never downloads)."""
    from dflash_core.runtime.target import load_target, resolve_target_source

    kind, _ = resolve_target_source(target, home)
    if kind == "hub":
        raise BadInputError(f"{target!r} is a hub id: this script loads only 'mini' or a local checkpoint "
                            "directory (download it first and pass the directory)")
    return load_target(target, "cpu", "float32", home=home)


def sha256_file(path: str) -> str:
    """SHA-256 of a reused trajectories file, to match against the manifest prepare wrote beside it."""
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def machine() -> dict:
    """What the timings ran on, and how loaded it was."""
    import torch

    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "loadavg": list(os.getloadavg()), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads()}


def run(args: argparse.Namespace, base: PrepareConfig | None = None) -> dict:
    """Teacher data once, every variant trained on it, drafting timed interleaved; returns the JSON document."""
    from dflash_core.runtime.drafter import default_taps

    base = base or PrepareConfig()
    rt = load_local_target(args.target, args.home)
    variants = V.default_variants()
    cfgs = [V.variant_config(base, v, args.steps) for v in variants]
    if args.trajectories:
        t0 = time.perf_counter()
        trajs = V.load_trajectories(args.trajectories, rt.vocab_size)
        teacher = {"source": str(args.trajectories), "sha256": sha256_file(args.trajectories),
                   "seconds": time.perf_counter() - t0, "sequences": len(trajs)}
    else:
        trajs, teacher = V.teacher_data(rt, base, progress=args.progress)
    held = V.check_same_split(trajs, cfgs)
    load_before = machine()
    drafters, metrics = {}, {}
    for v, cfg in zip(variants, cfgs):
        log.info("training %s (%d layers, block %d, %s steps)", v.name, v.layers, v.block_size, cfg.train.steps)
        drafters[v.name], metrics[v.name] = V.train_variant(rt, trajs, cfg, progress=args.progress)
    seq = max((trajs[i] for i in held), key=len)
    taps = default_taps(rt.num_layers, min(base.n_taps, rt.num_layers))
    ctx = V.context_taps(rt, seq[:-1], taps)
    times = V.time_drafting(rt, drafters, ctx, seq[-1], args.rounds)
    rows = [V.variant_row(v, metrics[v.name], times[v.name]) for v in variants]
    return {"what": "drafter variants on one teacher set and one held-out split",
            "target": rt.name, "settings": {"steps": [c.train.steps for c in cfgs], "rounds": args.rounds,
                                            "threads": args.threads, "context_rows": len(seq) - 1,
                                            "base_config": base.to_dict()},
            "formulas": {"expected_accepted": "sum_k prod_{j<=k} a_j (positions independent; low estimate)",
                         "expected_accepted_nested": "sum_k min_{j<=k} a_j (nested correctness; upper bound)",
                         "accepted_per_draft_second": "expected_accepted / median seconds of one block call",
                         "accuracy": "train.eval_accuracy on the held-out trajectories, best held-out state"},
            "teacher": teacher, "heldout_trajectories": len(held),
            "machine": {"before_training": load_before, "after_timing": machine()},
            "rows": rows, "winner": V.winner(rows)}


def main(argv: list[str] | None = None) -> dict:
    from dflash_core.progress import ensure_console_logging
    from dflash_core.runtime.device import torch_threads
    from dflash_core.store.artifacts import write_json_atomic

    args = parse_args(argv)
    if args.threads < 1:
        raise BadInputError(f"--threads must be an integer >= 1, got {args.threads!r}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    ensure_console_logging()
    with torch_threads(args.threads):
        doc = run(args)
    write_json_atomic(args.out, doc)
    print(V.markdown_table(doc["rows"]))
    w = doc["winner"]
    ratio = "n/a" if w["over_default"] is None else f"{w['over_default']:.3f}x"
    print(f"\nwinner: {w['variant']} at {w['positions']} positions, {ratio} the block-8 baseline's expected accepted "
          f"drafts per drafting second; JSON: {args.out}")
    return doc


if __name__ == "__main__":
    main()
