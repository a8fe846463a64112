"""Issue-8 profile of the real LFM2-350M configuration (random weights, built locally), CPU, 2 threads.

For each execution path (eager fp32, oneDNN-prepacked fp32, eager bf16) it measures, in one process:
per-token time of our cached greedy (`normal`) vs transformers `generate()` greedy, and the verify-cost
curve t_verify(w)/t_decode for w = 1..16 at a fixed context. Medians and IQR over repeats; JSON on stdout.
Not a test (timings are never asserted). Usage: python studies/2026-11-29-fast-path-goals/profile_350m.py \
    [tokens] [repeats]
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch

from dflash_core.runtime.decode import greedy
from dflash_core.runtime.kernels import apply_kernels
from dflash_core.runtime.target import TargetRuntime
from dflash_core.testing import build_real_350m


def med_iqr(xs):
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return {"median": statistics.median(xs), "iqr": q[2] - q[0], "n": len(xs)}


def verify_curve(rt: TargetRuntime, ctx: list[int], widths, calls: int) -> dict:
    s = rt.session(recording=True)  # steady state: one session, each timed block rolled back whole
    s.prefill(ctx[:-1])

    def timed(n_rows: int) -> float:
        xs = []
        for _ in range(calls):
            t0 = time.perf_counter()
            s.verify([ctx[-1]] * n_rows)
            xs.append(time.perf_counter() - t0)
            s.rollback(n_rows)
        return statistics.median(xs)

    timed(1)
    t1 = timed(1)
    return {"t_decode_ms": 1000 * t1, "ratio": {w: timed(w + 1) / t1 for w in widths}}


def profile(path: str, dtype: str, tokens: int, reps: int) -> dict:
    model = build_real_350m(dtype)
    apply_kernels(model, path)
    rt = TargetRuntime.from_model(model, name=f"350m-{path}-{dtype}")
    prompt = [1] + list(range(100, 131))
    inp = torch.tensor([prompt])
    ours = lambda: greedy(rt, prompt, tokens)[0]  # noqa: E731
    gen = lambda: model.generate(inp, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,  # noqa: E731
                                 pad_token_id=0)[0, len(prompt):].tolist()
    same = ours() == gen()  # also the warm-up
    a, b = [], []
    for _ in range(reps):  # interleaved, so drift hits both
        t0 = time.perf_counter()
        ours()
        a.append(1000 * (time.perf_counter() - t0) / tokens)
        t0 = time.perf_counter()
        gen()
        b.append(1000 * (time.perf_counter() - t0) / tokens)
    ctx = prompt + list(range(200, 216))
    return {"path": path, "dtype": dtype, "tokens": tokens, "normal_ms_per_token": med_iqr(a),
            "generate_ms_per_token": med_iqr(b), "normal_over_generate": statistics.median(a) / statistics.median(b),
            "normal_ids_equal_generate": same, "verify_cost": verify_curve(rt, ctx, range(1, 17), calls=5)}


def main() -> None:
    tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 32
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    torch.set_num_threads(2)
    out = []
    for path, dtype in (("eager", "float32"), ("onednn", "float32"), ("eager", "bfloat16")):
        with torch.inference_mode():
            r = profile(path, dtype, tokens, reps)
        print(json.dumps(r), file=sys.stderr, flush=True)
        out.append(r)
    json.dump({"machine": {"threads": torch.get_num_threads(), "torch": torch.__version__}, "profiles": out},
              sys.stdout, indent=1)


if __name__ == "__main__":
    main()
