"""One line per target dtype: how far a block forward's logits are from one-token forwards', and what that does to
every method (its exactness verdict, tokens per target call and host transfers per target call).

Why: a verify block and greedy's one-token steps run different kernels; in float32 they agree up to rounding, in
float16 / bfloat16 they differ by more, and the contract (docs/design.md §1) certifies a divergence only at a
near-tie. The GPU's default dtype (`DFLASH_GPU_DTYPE`) should be the one whose block-vs-step difference the
verdicts show to be harmless; scripts/device_gpu_check.sh prints these lines on a lent GPU (docs/gpu.md).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..methods import get_method, speculative_ids
from ..runtime import transfer
from ..runtime.decode import greedy, speculative
from ..runtime.exactness import classify
from ..runtime.target import cache_kwargs


def block_vs_step(rt, prompt: Sequence[int], cont: Sequence[int]) -> dict:
    """Max |logit difference| between one forward over `cont` after the prompt and len(cont) one-token forwards,
    and how many of those rows' argmax differ."""
    import torch
    from transformers import DynamicCache

    def fresh():
        cache = DynamicCache(config=rt.model.config)
        rt.model(input_ids=torch.tensor([list(prompt)], device=rt.device), **cache_kwargs(rt.model, cache),
                 use_cache=True, logits_to_keep=1)
        return cache

    with torch.inference_mode():
        block = rt.model(input_ids=torch.tensor([list(cont)], device=rt.device), **cache_kwargs(rt.model, fresh()),
                         use_cache=True).logits[0].float()
        cache, steps = fresh(), []
        for t in cont:
            out = rt.model(input_ids=torch.tensor([[t]], device=rt.device), **cache_kwargs(rt.model, cache),
                           use_cache=True)
            steps.append(out.logits[0, -1].float())
        step = torch.stack(steps)
        diff = float((block - step).abs().max())
        flips = int((block.argmax(-1) != step.argmax(-1)).sum())
    return {"max_abs_logit_diff": diff, "argmax_flips": flips, "rows": len(cont)}


def dtype_line(rt, prepared, prompts: Sequence[Sequence[int]], tokens: int, width: int,
               methods: Sequence[str] | None = None) -> dict:
    """The line for `rt`'s dtype: block-vs-step difference on the first prompt's greedy continuation, then per
    method its verdict against greedy (worst over the prompts), tokens per target call and `transfer.to_host`
    calls per target call (the sync diet's figure, counted here as tests/runtime/test_syncs.py counts it)."""
    refs = [greedy(rt, list(p), tokens, record_margins=True) for p in prompts]
    line: dict = {"dtype": str(rt.dtype).replace("torch.", ""), "device": str(rt.device),
                  "block_vs_step": block_vs_step(rt, prompts[0], refs[0][0][:max(2, width + 1)]), "methods": {}}
    real = transfer.to_host
    for method in methods or speculative_ids():
        count = [0]

        def counted(*tensors, _real=real, _count=count):
            _count[0] += 1
            return _real(*tensors)

        transfer.to_host = counted
        try:
            kinds, calls, new = [], 0, 0
            for p, (ref, gst) in zip(prompts, refs):
                got, st = speculative(rt, get_method(method).build(rt, prepared), list(p), tokens, width,
                                      method=method)
                kinds.append(classify(got, ref, gst.margins, rt.dtype).kind)
                calls, new = calls + st.target_calls, new + st.new_tokens
        finally:
            transfer.to_host = real
        worst = "diverged" if "diverged" in kinds else ("tie" if "tie" in kinds else "exact")
        line["methods"][method] = {"verdict": worst, "tokens_per_target_call": new / max(calls, 1),
                                   "transfers_per_target_call": count[0] / max(calls, 1)}
    line["all_ok"] = all(m["verdict"] != "diverged" for m in line["methods"].values())
    return line
