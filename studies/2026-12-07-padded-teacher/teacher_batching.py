"""Time prepare's teacher pass with length buckets against left-padded batches, on prepare's own seeds.

Runs `teacher.teacher_data` (the code prepare runs) once per mode in the order given, in one process, on the
target's train seeds as prepare cuts them (`--train-seeds`: the corpus seeds, plus the family's own), with
prepare's taps and no top-k; prints seconds and tokens/s per run, then how many trajectories the last run of
each mode made identically. Float32 (the teacher dtype `auto` gives where bf16 is emulated; on a native-bf16
CPU the comparison holds per dtype). Not a test: timings are never asserted.

    python studies/2026-12-07-padded-teacher/teacher_batching.py --target DIR [--train-seeds 2368] [--tokens 64] \
        [--modes length,padded]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(argv=None) -> int:
    import torch

    from dflash_core.errors import BadInputError
    from dflash_core.prepare.pipeline import PrepareConfig, family_for, train_seed_ids
    from dflash_core.prepare.teacher import teacher_data
    from dflash_core.runtime.drafter import default_taps
    from dflash_core.runtime.target import load_target, pads_exactly

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="a local checkpoint directory (or 'mini')")
    ap.add_argument("--train-seeds", type=int, default=PrepareConfig().corpus_seeds)
    ap.add_argument("--tokens", type=int, default=PrepareConfig().traj_tokens)
    ap.add_argument("--modes", default="length,padded", help="comma-separated runs, in order (repeat to alternate)")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    modes = a.modes.split(",")
    if not set(modes) <= {"length", "padded"} or not 1 <= a.train_seeds <= 1_000_000 or not 1 <= a.tokens <= 4096:
        raise BadInputError("--modes takes length and padded, --train-seeds 1..1000000, --tokens 1..4096")
    torch.set_num_threads(a.threads)
    rt = load_target(a.target, "cpu", "float32")
    if "padded" in modes and not pads_exactly(rt):
        raise BadInputError(f"{a.target} is not a model type that pads exactly: run --modes length")
    cfg = PrepareConfig(corpus_seeds=a.train_seeds)
    seeds = train_seed_ids(rt, cfg, family_for(rt, cfg))
    taps = default_taps(rt.num_layers, min(cfg.n_taps, rt.num_layers))
    last = {}
    for mode in modes:
        t0 = time.perf_counter()
        last[mode] = teacher_data(rt, seeds, a.tokens, taps, 0, padded=mode == "padded")
        dt = time.perf_counter() - t0
        print(f"{mode}: {dt:.1f} s, {len(seeds) * a.tokens / dt:.0f} tok/s ({len(seeds)} seeds x {a.tokens}, "
              f"taps {taps})", flush=True)
    if len(last) == 2:
        same = sum(x == y for x, y in zip(last["length"].sequences, last["padded"].sequences))
        print(f"identical trajectories: {same} / {len(seeds)}")
    return 0


if __name__ == "__main__":
    from dflash_core.errors import guarded

    sys.exit(guarded(main))  # bad input: one `error:` line and exit 2
