"""Execution paths for the target's linear layers (the same path for `normal` and every method).

* `eager`: transformers as loaded (ATen's default fp32/bf16 GEMM).
* `onednn`: every `nn.Linear` (projections, MLP, LM head) swapped for torch's own prepacked oneDNN linear
  (`torch.utils.mkldnn.MkldnnLinear`): the weight is reordered once into oneDNN's blocked layout instead of
  on every call, which is what makes small-row (decode and verify) matmuls cheaper on CPU. Embedding
  lookups keep the dense table. CPU float32 only.
* `tuned`: every `nn.Linear` runs each call in the layout (loaded [out, in], a transposed copy, or oneDNN's
  prepacked weight) that a probe at load time measured fastest at the call's row count on this CPU
  (`runtime/layouts.py`): decode's one row and a verify's w + 1 rows want different kernels. CPU float32 only.
"""

from __future__ import annotations

from ..errors import BadInputError

KERNELS = ("eager", "onednn", "tuned")
# `auto` picks the tuned path for CPU float32 targets with hidden size >= 512 (SmolLM2's 576, the 350M's 1,024):
# its probe holds the eager and oneDNN layouts among its candidates, so it keeps oneDNN where that measures faster
# (the 350M config on an AVX512-BF16 EPYC: normal 72 vs 102 ms/token) and the transposed layout where a verify's
# rows run faster in it (docs/performance.md). On the mini target (hidden 384) prepacking made decode slower (9.6
# vs 8.7 ms/token) and its matmuls are small, so it stays eager and its reference results stay as they are.
AUTO_MIN_HIDDEN = 512


def resolve_kernels(kernels: str, device, dtype, hidden_size: int) -> str:
    import torch

    if kernels == "auto":
        ok = (getattr(device, "type", str(device)) == "cpu" and dtype == torch.float32
              and hidden_size >= AUTO_MIN_HIDDEN)
        return "tuned" if ok else "eager"
    if kernels not in KERNELS:
        raise BadInputError(f"unknown kernel path {kernels!r}: use auto or one of {KERNELS}")
    return kernels


def tune(model) -> dict:
    """Probe `model`'s linear layouts on this machine, switch it (in place) to the `tuned` path on that table
    (keeping the probe's copies of the weights in the layouts it chose), and return the table as data for the
    reports."""
    from .layouts import apply_tuned, probe

    _check_cpu_float32(model, "tuned")  # before the probe spends seconds on a model the path refuses
    copies: dict = {}
    table = probe(model, copies=copies)
    apply_tuned(model, table, copies)
    return table.to_dict()


def _check_cpu_float32(model, path: str) -> None:
    import torch

    p = next(model.parameters())
    if p.device.type != "cpu" or p.dtype != torch.float32:
        raise BadInputError(f"--kernels {path} is for CPU float32 targets (this one is {p.device.type} {p.dtype}); "
                            "use --kernels eager")


def apply_kernels(model, path: str = "eager", table=None):
    """Switch `model` (in place) to an execution path; returns the model. `tuned` takes a `layouts.LayoutTable`
    (None: probe `model` now)."""
    import torch
    from torch import nn

    if path not in KERNELS:
        raise BadInputError(f"unknown kernel path {path!r}: use one of {KERNELS}")
    if path == "eager":
        return model
    _check_cpu_float32(model, path)
    if path == "tuned":
        if table is None:
            tune(model)
            return model
        from .layouts import apply_tuned

        return apply_tuned(model, table)
    if not torch.backends.mkldnn.is_available():
        raise BadInputError("--kernels onednn needs a torch build with oneDNN (mkldnn); use --kernels eager")
    from torch.utils.mkldnn import MkldnnLinear

    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, MkldnnLinear(child, torch.float32))
    return model
