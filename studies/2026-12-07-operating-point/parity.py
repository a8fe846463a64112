"""The lab's dflash against transformers' DFlash generator with the same drafter, on the mini target: both decode
the first benchmark prompts, alternating in one process (so machine drift hits both), the lab at the peer's block
(width B - 1: transformers drafts B - 1 per round) and at B; then one cProfile of each.

    python studies/2026-12-07-operating-point/parity.py [--tokens 96] [--prompts 4] [--threads 1] [--reps 3]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    import torch

    from dflash_core.bench.peers import reference_runner
    from dflash_core.methods import get_method
    from dflash_core.prepare.pipeline import load_prepared
    from dflash_core.runtime.decode import greedy, speculative
    from dflash_core.runtime.target import load_target
    from dflash_core.store.data import load_prompts

    torch.set_num_threads(args.threads)
    rt = load_target("mini", "cpu", None)
    prep = load_prepared(rt)
    B = prep.drafter.cfg.block_size
    ps = [rt.encode(t) for t in load_prompts("code").benchmark[:args.prompts]]
    refs = [greedy(rt, p, args.tokens)[0] for p in ps]
    peer = reference_runner(rt, ps, refs, args.tokens, "dflash_transformers", prep)
    build = get_method("dflash").build

    def lab(w: int) -> tuple[float, int]:
        wall = calls = 0
        for p, r in zip(ps, refs):
            ids, st = speculative(rt, build(rt, prep), p, args.tokens, w)
            assert ids == r, "lab dflash is not exact"
            wall, calls = wall + st.wall_seconds, calls + st.target_calls
        return wall, calls

    outs, _ = peer()
    assert outs == refs, "transformers' DFlash is not exact"
    for _ in range(args.reps):
        a, b, c = lab(B - 1), peer()[1], lab(B)
        print(f"lab w{B - 1} {a[0]:.3f} s ({a[1]} target calls)  transformers {b:.3f} s  lab w{B} {c[0]:.3f} s "
              f"({c[1]} calls)  peer/lab(w{B - 1}) {b / a[0]:.3f}", flush=True)
    for name, fn in ((f"lab w{B - 1}", lambda: lab(B - 1)), ("transformers", peer)):
        prof = cProfile.Profile()
        prof.enable()
        fn()
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(12)
        print(name, out.getvalue())


if __name__ == "__main__":
    main()
