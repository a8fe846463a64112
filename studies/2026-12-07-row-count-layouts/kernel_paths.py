"""Decode speed of greedy and speculative methods on each linear-layer path, in one process (docs/performance.md).

The target is loaded once per path (`--paths eager,tuned`) with the prepared artifacts on each, and each of the
first `--prompts` benchmark prompts is decoded for `--tokens` new tokens by `normal` and by every `--methods` x
`--widths`, the paths alternating inside each of `--reps` repetitions so that a drift of the machine falls on
all of them alike. Prints one JSON document: per path the probe's layout table, and per (method, width) the
median seconds per token over the repetitions, its ratio to the same path's greedy and to the first path's greedy,
tokens per target call, and whether every decode equalled greedy's ids on its path. Not the ranking and not a
test (nothing is asserted): the bench's statistics rank methods; this shows what a path does to a verify's cost.
With `--curve ROWS` it needs no artifacts: the median time of one target forward of each row count after a
48-token context (the verify-cost curve of docs/performance.md), per path, the paths alternating call by call.

    python studies/2026-12-07-row-count-layouts/kernel_paths.py --target DIR --home H [--paths eager,tuned] \
        [--methods dflash] [--widths 1,4,16]
    python studies/2026-12-07-row-count-layouts/kernel_paths.py --target DIR --curve 1,2,3,5,9,17 [--reps 15]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dflash_core.errors import BadInputError, guarded  # noqa: E402


def _ints(text: str, what: str, lo: int, hi: int) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise BadInputError(f"{what} must be comma-separated integers, got {text[:40]!r}") from None
    if not vals or any(not lo <= v <= hi for v in vals):
        raise BadInputError(f"{what} must be integers in {lo}..{hi}, got {text[:40]!r}")
    return vals


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--home", default=None)
    ap.add_argument("--paths", default="eager,tuned")
    ap.add_argument("--methods", default="dflash")
    ap.add_argument("--widths", default="1,4,16")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--curve", default=None, help="row counts: time forwards of these sizes instead of decoding")
    a = ap.parse_args(argv)
    from dflash_core.methods import get_method
    from dflash_core.options import KERNEL_CHOICES

    paths = [p for p in a.paths.split(",") if p]
    if not paths or any(p not in KERNEL_CHOICES for p in paths) or len(set(paths)) != len(paths):
        raise BadInputError(f"--paths must name distinct paths of {', '.join(KERNEL_CHOICES)}, got {a.paths[:60]!r}")
    methods = [m for m in a.methods.split(",") if m]
    for m in methods:
        get_method(m)  # an unknown id is refused with the registry's message
    widths = _ints(a.widths, "--widths", 1, 64)
    curve = None if a.curve is None else _ints(a.curve, "--curve", 1, 512)
    for name, v, hi in (("--prompts", a.prompts, 64), ("--tokens", a.tokens, 4096), ("--reps", a.reps, 100),
                        ("--threads", a.threads, 256)):
        if not 1 <= v <= hi:
            raise BadInputError(f"{name} must be in 1..{hi}, got {v}")

    import torch

    from dflash_core.methods.runner import run_method
    from dflash_core.prepare.pipeline import PrepareConfig, family_for
    from dflash_core.prepare.prepared import load_prepared
    from dflash_core.runtime.decode import greedy
    from dflash_core.runtime.target import load_target
    from dflash_core.store.data import load_prompts

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(a.threads)
    rts = {p: load_target(a.target, "cpu", "float32", home=a.home, kernels=p) for p in paths}
    if a.curve is not None:
        return _curve(rts, paths, curve, a)
    preps = {p: load_prepared(rt, home=a.home) for p, rt in rts.items()}
    first = rts[paths[0]]
    prompts = [first.encode(t) for t in load_prompts(family_for(first, PrepareConfig())).benchmark[: a.prompts]]
    cases = [("normal", 0)] + [(m, w) for m in methods for w in widths
                               if w <= preps[paths[0]].drafter.cfg.block_size]
    refs = {p: [greedy(rts[p], ids, a.tokens)[0] for ids in prompts] for p in paths}  # also a warm-up
    secs = {(p, c): [] for p in paths for c in cases}
    tpc, same = {}, {(p, c): True for p in paths for c in cases}
    for rep in range(a.reps):
        for c in cases:
            for p in paths[rep % len(paths):] + paths[: rep % len(paths)]:
                total = toks = calls = 0
                for i, ids in enumerate(prompts):
                    t0 = time.perf_counter()
                    got, st = run_method(c[0], rts[p], preps[p], ids, a.tokens, c[1] or None)
                    total += time.perf_counter() - t0
                    toks, calls = toks + st.new_tokens, calls + st.target_calls
                    same[(p, c)] &= got == refs[p][i]
                secs[(p, c)].append(total / toks)
                tpc[(p, c)] = toks / calls
        print(f"repetition {rep + 1}/{a.reps} done", file=sys.stderr, flush=True)
    med = {k: statistics.median(v) for k, v in secs.items()}
    base = med[(paths[0], ("normal", 0))]
    doc = {"target": a.target, "threads": a.threads, "prompts": len(prompts), "tokens": a.tokens, "reps": a.reps,
           "paths": {p: {"kernels": rts[p].kernels, "kernel_layouts": rts[p].info.get("kernel_layouts")}
                     for p in paths},
           "rows": [{"path": p, "method": c[0], "width": c[1], "ms_per_token": round(med[(p, c)] * 1000, 2),
                     "speedup_vs_own_greedy": round(med[(p, ("normal", 0))] / med[(p, c)], 3),
                     f"speedup_vs_{paths[0]}_greedy": round(base / med[(p, c)], 3),
                     "tokens_per_target_call": round(tpc[(p, c)], 3), "equals_greedy": same[(p, c)]}
                    for c in cases for p in paths]}
    print(json.dumps(doc, indent=1))
    return 0


def _curve(rts: dict, paths: list[str], rows: list[int], a) -> int:
    """Median seconds of a forward of n rows after a 48-token context, per path (each timed block rolled back)."""
    ctx = list(range(1000, 1049))
    sessions = {}
    for p in paths:
        sessions[p] = rts[p].session(recording=True)
        sessions[p].prefill(ctx[:-1])
    got = {(p, n): [] for p in paths for n in rows}
    for rep in range(a.reps + 2):  # two unrecorded warm-up rounds
        for n in rows:
            for p in paths[rep % len(paths):] + paths[: rep % len(paths)]:
                t0 = time.perf_counter()
                sessions[p].verify([ctx[-1]] * n)
                dt = time.perf_counter() - t0
                sessions[p].rollback(n)
                if rep >= 2:
                    got[(p, n)].append(dt)
    med = {k: statistics.median(v) for k, v in got.items()}
    one = med[(paths[0], rows[0])]
    doc = {"target": a.target, "threads": a.threads, "reps": a.reps, "context": len(ctx) - 1,
           "paths": {p: {"kernels": rts[p].kernels, "kernel_layouts": rts[p].info.get("kernel_layouts")}
                     for p in paths},
           "rows": [{"path": p, "rows": n, "ms": round(med[(p, n)] * 1000, 2),
                     f"over_{paths[0]}_{rows[0]}_row": round(med[(p, n)] / one, 3),
                     "over_own_first": round(med[(p, n)] / med[(p, rows[0])], 3)} for n in rows for p in paths]}
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))
