"""The lab's one rule for bfloat16 in training: bf16 only where the hardware computes it natively.

A CPU with AVX512-BF16 or AMX-BF16 runs bf16 matmuls several times faster than float32; one without them
(AVX2 only: most laptops and many cloud CPUs) has torch emulate bf16, ~60x slower than float32 (a 512x512
matmul: 203 ms against 3.5 ms on an AVX2-only AMD EPYC). So the mini target's autocast, the drafter's matmul
dtype and anything else that trains ask `train_in_bf16` and get float32 wherever bf16 would be emulated.
The fits train in float32 everywhere (small least-squares and tiny heads: nothing to gain).

The CPU flags come from /proc/cpuinfo (torch has no public query for them); a machine without that file (not
Linux) is taken as having no native bf16, the safe side: float32 is never slow.
"""

from __future__ import annotations

import contextlib
import functools

NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
CPUINFO = "/proc/cpuinfo"


def cpu_flags(text: str) -> frozenset[str]:
    """The CPU feature flags in a /proc/cpuinfo text (every 'flags' line; x86 only writes them)."""
    flags: set[str] = set()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            flags.update(value.split())
    return frozenset(flags)


@functools.lru_cache(maxsize=1)
def cpu_has_native_bf16() -> bool:
    """Whether this CPU has native bfloat16 dot products (AVX512-BF16 or AMX-BF16)."""
    try:
        with open(CPUINFO, encoding="ascii", errors="replace") as f:
            flags = cpu_flags(f.read())
    except OSError:
        return False
    return any(f in flags for f in NATIVE_BF16_FLAGS)


def train_in_bf16(device: str = "cpu") -> bool:
    """Whether training on `device` may run its matmuls in bfloat16: a CUDA device that supports bf16, or a CPU
    with native bf16 dot products. Never on a CPU that would emulate it."""
    if str(device).startswith("cuda"):
        import torch  # lazy: this module is read by the CLI's option checks, which must not import torch

        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    return cpu_has_native_bf16()


@contextlib.contextmanager
def bf16_linear_weights(model):
    """Within it, every `nn.Linear` of `model` holds a bfloat16 copy of its weight and bias; the float32 ones
    come back on exit, whatever happens inside.

    Why: under CPU autocast in inference mode torch casts each Linear's float32 weight to bf16 again at every
    forward (its cast cache is off there): on the 350M target at a 128-row teacher batch the casts were 41 % of
    the step and left bf16 1.3x faster than float32 where its matmuls alone are 3.8x (AMX, 2 threads). Casting
    once gives the very same numbers: autocast rounds float32 to bf16 the one way, so a weight already rounded
    is the weight it would have used. Only Linear modules: a tied embedding keeps its float32 table (the copy is
    a new Parameter on the Linear alone), and weights read outside a matmul (a conv's cached-decode update)
    are left as they are. The copies cost half the Linear weights' bytes while held.
    """
    import torch
    from torch import nn

    saved = []
    try:
        for mod in model.modules():
            if isinstance(mod, nn.Linear) and mod.weight.dtype == torch.float32:
                saved.append((mod, mod.weight, mod.bias))
                mod.weight = nn.Parameter(mod.weight.detach().to(torch.bfloat16), requires_grad=False)
                if mod.bias is not None:
                    mod.bias = nn.Parameter(mod.bias.detach().to(torch.bfloat16), requires_grad=False)
        yield model
    finally:
        for mod, w, b in saved:
            mod.weight, mod.bias = w, b
