"""The mini target's size study (docs/mini-target.md): per-token cached decode time, how much of it is weight
matmuls rather than framework overhead, and training steps per second at a given size. Not a test: prints JSON.

    python studies/2026-11-29-mini-target-size/measure_mini_target.py [--hidden 384] [--layers 6]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: import the checkout's dflash_core
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dflash_core.prepare import minitarget as mt  # noqa: E402
from dflash_core.prepare.minitarget import MiniTargetConfig, _train_step, model_config  # noqa: E402
from dflash_core.runtime.device import torch_threads as _torch_threads  # noqa: E402


def measure_decode(
    model, context: int = 64, tokens: int = 64, threads: int = 2
) -> dict[str, float]:
    """Per-token cached decode time and how much of it is model compute rather than overhead.

    Why: the mini target should make a decode step cost model compute, not Python/framework
    overhead, or speculative-decoding speedups measured on it would be artefacts. Two estimates:
    `profiler_matmul_ms` = self time of aten::mm/addmm/bmm per token (torch.profiler), and
    `direct_matmul_ms` = the same weight matmuls (every nn.Linear + lm_head on one token) timed in
    a bare loop; each is also given as a fraction of the unprofiled decode time.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import DynamicCache

    with _torch_threads(threads):
        model.eval()
        gen = torch.Generator().manual_seed(0)
        prompt = torch.randint(3, model.config.vocab_size, (1, context), generator=gen)

        def prefill():
            cache = DynamicCache(config=model.config)
            out = model(input_ids=prompt, cache=cache, use_cache=True)
            return cache, out.logits[:, -1:].argmax(-1)

        def decode(cache, tok, n: int) -> list[float]:
            times = []
            for _ in range(n):
                t = time.perf_counter()
                out = model(input_ids=tok, cache=cache, use_cache=True)
                tok = out.logits[:, -1:].argmax(-1)
                times.append(time.perf_counter() - t)
            return times

        with torch.inference_mode():
            decode(*prefill(), 8)  # warm-up
            times = sorted(decode(*prefill(), tokens) + decode(*prefill(), tokens))
            decode_s = times[len(times) // 2]
            cache, tok = prefill()
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                decode(cache, tok, tokens)
            events = prof.key_averages()
            mm_us = sum(e.self_cpu_time_total for e in events if e.key in {"aten::mm", "aten::addmm", "aten::bmm"})
            # the same weight matmuls, no framework around them
            weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
            xs = {w.shape[1]: torch.randn(1, w.shape[1], generator=gen) for w in weights}
            reps = []
            for _ in range(5 + tokens):
                t = time.perf_counter()
                for w in weights:
                    torch.nn.functional.linear(xs[w.shape[1]], w)
                reps.append(time.perf_counter() - t)
            direct_s = sorted(reps[5:])[len(reps[5:]) // 2]
        profiled_mm_s = mm_us / 1e6 / tokens
        return {
            "decode_ms": 1000 * decode_s,
            "profiler_matmul_ms": 1000 * profiled_mm_s,
            "profiler_matmul_fraction": profiled_mm_s / decode_s,
            "direct_matmul_ms": 1000 * direct_s,
            "direct_matmul_fraction": direct_s / decode_s,
        }


def measure_train_throughput(cfg: MiniTargetConfig, steps: int = 6) -> float:
    """Training steps/s at cfg's size on random tokens (same shapes as real training)."""
    import torch
    from transformers import Lfm2ForCausalLM

    with _torch_threads(cfg.threads), torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = Lfm2ForCausalLM(model_config(cfg)).float().train()
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        x = torch.randint(3, cfg.vocab_size, (cfg.batch_size, cfg.seq_len + 1))
        times = []
        for _ in range(steps + 1):
            t = time.perf_counter()
            _train_step(model, opt, x, cfg)
            times.append(time.perf_counter() - t)
        times = sorted(times[1:])
        return 1.0 / times[len(times) // 2]



def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=MiniTargetConfig().hidden_size)
    ap.add_argument("--layers", type=int, default=MiniTargetConfig().num_layers)
    a = ap.parse_args(argv)
    from transformers import Lfm2ForCausalLM

    cfg = mt.with_size(MiniTargetConfig(), hidden_size=a.hidden, num_layers=a.layers)
    print(json.dumps({"decode": measure_decode(Lfm2ForCausalLM(model_config(cfg)).eval()),
                      "train_steps_per_second": measure_train_throughput(cfg)}, indent=2))


if __name__ == "__main__":
    main()
