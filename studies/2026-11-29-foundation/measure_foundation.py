"""Issue-2 figures: cached greedy vs transformers generate() (tiny and the 350M config), and cached vs
uncached greedy on the 350M config. One process, interleaved repeats, medians. Not a test: prints JSON."""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch

from dflash_core.runtime.decode import greedy
from dflash_core.runtime.target import TargetRuntime
from dflash_core.testing import TinySpec, build_real_350m, build_tiny


def per_token(fn, n, reps):
    xs = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        xs.append((time.perf_counter() - t0) / n)
    return statistics.median(xs), min(xs), max(xs)


def main(tokens_350m: int = 256, reps: int = 3) -> None:
    torch.set_num_threads(2)
    out = {}
    for name, model, n in (("tiny-fp32", build_tiny(TinySpec(dtype="float32")), 64),
                           ("lfm2-350m-config-fp32", build_real_350m("float32"), 32)):
        rt = TargetRuntime.from_model(model)
        prompt = [1] + list(range(10, 25))
        inp = torch.tensor([prompt])
        ours = lambda rt=rt, prompt=prompt, n=n: greedy(rt, prompt, n)  # noqa: E731
        gen = lambda model=model, inp=inp, n=n: model.generate(  # noqa: E731
            inp, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        ours(), gen()  # warm-up
        a, b = [], []
        for _ in range(reps):  # interleaved
            a.append(per_token(ours, n, 1)[0])
            b.append(per_token(gen, n, 1)[0])
        out[name] = {"tokens": n, "greedy_ms_per_token": 1000 * statistics.median(a),
                     "generate_ms_per_token": 1000 * statistics.median(b),
                     "ratio_greedy_over_generate": statistics.median(a) / statistics.median(b)}
        if name.startswith("lfm2"):
            unc = rt.with_options(cached=False)
            t0 = time.perf_counter()
            ids_c, _ = greedy(rt, prompt, tokens_350m)
            tc = time.perf_counter() - t0
            t0 = time.perf_counter()
            ids_u, _ = greedy(unc, prompt, tokens_350m)
            tu = time.perf_counter() - t0
            out[name].update({"cached_vs_uncached_tokens": tokens_350m, "cached_seconds": tc, "uncached_seconds": tu,
                              "uncached_over_cached": tu / tc, "same_ids": ids_c == ids_u})
        print(json.dumps({name: out[name]}), flush=True)
    json.dump(out, sys.stdout, indent=1)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 256)
