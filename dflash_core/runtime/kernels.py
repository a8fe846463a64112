"""Execution paths for the target's linear layers (the same path for `normal` and every method).

* `eager`: transformers as loaded (ATen's default fp32/bf16 GEMM).
* `onednn`: every `nn.Linear` (projections, MLP, LM head) swapped for torch's own prepacked oneDNN linear
  (`torch.utils.mkldnn.MkldnnLinear`): the weight is reordered once into oneDNN's blocked layout instead of
  on every call, which is what makes small-row (decode and verify) matmuls cheaper on CPU. Embedding
  lookups keep the dense table. CPU float32 only.
"""

from __future__ import annotations

from ..errors import BadInputError

KERNELS = ("eager", "onednn")
# `auto` picks oneDNN only where it measured faster (docs/performance.md): CPU float32 targets with hidden size
# >= 1024 (350M config: normal 72 vs 102 ms/token, t_verify(4)/t_decode 1.4 vs 2.0). On the mini target
# (hidden 384) prepacking made decode slower (9.6 vs 8.7 ms/token), so it stays eager.
AUTO_MIN_HIDDEN = 1024


def resolve_kernels(kernels: str, device, dtype, hidden_size: int) -> str:
    import torch

    if kernels == "auto":
        ok = (getattr(device, "type", str(device)) == "cpu" and dtype == torch.float32
              and hidden_size >= AUTO_MIN_HIDDEN and torch.backends.mkldnn.is_available())
        return "onednn" if ok else "eager"
    if kernels not in KERNELS:
        raise BadInputError(f"unknown kernel path {kernels!r}: use auto or one of {KERNELS}")
    return kernels


def apply_kernels(model, path: str = "eager"):
    """Switch `model` (in place) to an execution path; returns the model."""
    import torch
    from torch import nn

    if path not in KERNELS:
        raise BadInputError(f"unknown kernel path {path!r}: use one of {KERNELS}")
    if path == "eager":
        return model
    p = next(model.parameters())
    if p.device.type != "cpu" or p.dtype != torch.float32:
        raise BadInputError(f"--kernels onednn is for CPU float32 targets (this one is {p.device.type} {p.dtype}); "
                            "use --kernels eager")
    if not torch.backends.mkldnn.is_available():
        raise BadInputError("--kernels onednn needs a torch build with oneDNN (mkldnn); use --kernels eager")
    from torch.utils.mkldnn import MkldnnLinear

    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, MkldnnLinear(child, torch.float32))
    return model
