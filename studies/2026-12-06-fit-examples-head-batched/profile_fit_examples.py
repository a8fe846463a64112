"""Profile the fits' examples (`examples.draft_examples`) at the 350M shape: milliseconds per example and where they go.

The random-weight LFM2-350M architecture (`testing.build_real_350m`), a random one-layer prepare-shaped drafter
with a draft vocabulary of `--draft-vocab` ids (prepare's cap: 16,384), and random trajectories of 24 prompt +
64 generated tokens; one warm-up, then one cProfile'd pass over every anchor. Prints the milliseconds per
example and cProfile's top functions by own time. Not a test: timings are never asserted.

    python studies/2026-12-06-fit-examples-head-batched/profile_fit_examples.py [--threads 2] [--trajectories 6] \
        [--draft-vocab 16384]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
import types
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(argv=None) -> float:
    import torch

    from dflash_core.methods.support.examples import draft_examples
    from dflash_core.runtime.drafter import DrafterConfig, default_taps, init_drafter
    from dflash_core.runtime.target import TargetRuntime
    from dflash_core.testing import build_real_350m

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--trajectories", type=int, default=6)
    ap.add_argument("--draft-vocab", type=int, default=16384)
    ap.add_argument("--top", type=int, default=15, help="cProfile rows printed")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    model = build_real_350m()
    rt = TargetRuntime.from_model(model)
    V, H = model.config.vocab_size, model.config.hidden_size
    if not 0 <= a.draft_vocab <= V or a.trajectories < 1:
        sys.exit(f"error: --draft-vocab must be 0..{V} and --trajectories at least 1")
    cfg = DrafterConfig(hidden_size=H, vocab_size=V, taps=default_taps(model.config.num_hidden_layers, 3),
                        block_size=16, num_layers=1, num_heads=4, intermediate_size=2 * H, mask_token_id=V - 1,
                        draft_vocab=a.draft_vocab)
    drafter = init_drafter(cfg, 0)
    g = torch.Generator().manual_seed(0)
    if a.draft_vocab:
        drafter.set_draft_map(torch.randperm(V, generator=g)[:a.draft_vocab].sort().values)  # ascending, as prepare's
    trajs = [torch.randint(0, V, (24 + 64,), generator=g).tolist() for _ in range(a.trajectories)]
    ctx = types.SimpleNamespace(rt=rt, drafter=drafter, trajectories=trajs, prompt_lens=[24] * len(trajs))
    draft_examples(ctx, top_k=8, max_examples=8)  # warm-up: first touches of the weights
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    ex = draft_examples(ctx, top_k=8)
    prof.disable()
    ms = (time.perf_counter() - t0) / len(ex.anchors) * 1000
    print(f"{len(ex.anchors)} examples, {ms:.1f} ms each ({a.threads} threads, draft vocabulary {a.draft_vocab})")
    pstats.Stats(prof).sort_stats("tottime").print_stats(a.top)
    return ms


if __name__ == "__main__":
    main()
