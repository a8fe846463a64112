"""The floating-point settings an exactness run depends on: pinned before it, recorded in every report.

A float32 matmul on an Ampere-or-later GPU may run in TF32 (10 mantissa bits) and an fp16/bf16 matmul may reduce
in reduced precision, by torch's and cuBLAS' defaults; either changes logits, so greedy and a verify block would
no longer be compared on the computation the contract names. `pin_exact` turns both off through torch's current
API (`torch.backends.{cuda.matmul,cudnn,cudnn.conv,cudnn.rnn}.fp32_precision = "ieee"`, torch >= 2.9, which 2.11
and 2.13 both have) and never touches the legacy `allow_tf32` flags there: torch raises a RuntimeError when the two
APIs are mixed in one process. Only a torch without `fp32_precision` gets the legacy flags.
`numerics_record` says what is in force (plus the GPU's driver and clocks and the conv kernel transformers uses),
for reports and manifests.
`NonFiniteLogits` is what the target's forward raises when its logits hold inf/NaN (`TargetSession._forward`: the
flag rides in the forward's one transfer).
"""

from __future__ import annotations

import functools
import importlib.util
import shutil
import subprocess

from ..errors import DFlashError

FP32_BACKENDS = ("cuda.matmul", "cudnn", "cudnn.conv", "cudnn.rnn")


class NonFiniteLogits(DFlashError):
    """A forward produced inf/NaN logits: the dtype overflowed or the device is faulty; no argmax can be trusted."""


def _backend(path: str):
    import torch

    obj = torch.backends
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def has_precision_api() -> bool:
    """Whether this torch has the `fp32_precision` API (torch >= 2.9)."""
    try:
        return isinstance(_backend("cuda.matmul").fp32_precision, str)
    except (AttributeError, RuntimeError):
        return False


def pin_exact() -> dict:
    """TF32 and reduced-precision reductions off for every CUDA matmul and cuDNN op; returns `numerics_state()`.

    Process-wide and idempotent: an exactness run calls it before loading anything (conftest does for every GPU
    test, the bench session for a CUDA run), so no test's outcome depends on which test happened to run first."""
    import torch

    if has_precision_api():
        for path in FP32_BACKENDS:
            b = _backend(path)
            if b is not None and hasattr(b, "fp32_precision"):
                b.fp32_precision = "ieee"
    else:  # pragma: no cover - torch < 2.9 only
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    return numerics_state()


def numerics_state() -> dict:
    """The settings in force, read through the same API `pin_exact` writes (never the other one)."""
    import torch

    m = torch.backends.cuda.matmul
    # no torch.get_float32_matmul_precision(): a legacy read, which raises once the new API has been used
    out: dict = {"torch": torch.__version__, "cuda_build": torch.version.cuda,
                 "fp16_reduced_precision_reduction": bool(m.allow_fp16_reduced_precision_reduction),
                 "bf16_reduced_precision_reduction": bool(m.allow_bf16_reduced_precision_reduction)}
    if has_precision_api():
        for path in FP32_BACKENDS:
            b = _backend(path)
            out[f"{path}.fp32_precision"] = getattr(b, "fp32_precision", None) if b is not None else None
    else:  # pragma: no cover - torch < 2.9 only
        out["cuda.matmul.allow_tf32"] = bool(m.allow_tf32)
        out["cudnn.allow_tf32"] = bool(torch.backends.cudnn.allow_tf32)
    out["exact"] = pinned(out)
    return out


def pinned(state: dict) -> bool:
    """Whether `state` (a `numerics_state`) has TF32 and reduced-precision reductions off everywhere."""
    tf32_off = all(state.get(f"{p}.fp32_precision") in ("ieee", None) for p in FP32_BACKENDS) \
        if "cuda.matmul.fp32_precision" in state else not (state.get("cuda.matmul.allow_tf32")
                                                           or state.get("cudnn.allow_tf32"))
    return bool(tf32_off and not state["fp16_reduced_precision_reduction"]
                and not state["bf16_reduced_precision_reduction"])


def conv_kernel() -> str:
    """Which short-convolution path transformers' LFM2 takes: the `causal_conv1d` CUDA kernel when importable,
    else torch's own conv1d (the two sum in different orders)."""
    return "causal_conv1d" if importlib.util.find_spec("causal_conv1d") is not None else "torch conv1d"


@functools.lru_cache(maxsize=4)
def gpu_facts(index: int = 0) -> dict:
    """Driver and clocks from nvidia-smi (max and application clocks: stable; current clocks are volatile and
    left out); {} without nvidia-smi. Cached: one subprocess per process."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {}
    fields = ("driver_version", "clocks.max.sm", "clocks.max.mem", "clocks.applications.graphics",
              "clocks.applications.memory", "power.limit", "persistence_mode")
    try:
        out = subprocess.run([smi, f"--id={index}", f"--query-gpu={','.join(fields)}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {}
    vals = [v.strip() for v in out.splitlines()[0].split(",")] if out else []
    return dict(zip(fields, vals)) if len(vals) == len(fields) else {}


def numerics_record(device) -> dict:
    """What a report or manifest records about the numerics of a run on `device`: the settings in force, and on
    CUDA the GPU, its driver and clocks and the conv kernel."""
    import torch

    rec = numerics_state()
    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_available():
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        p = torch.cuda.get_device_properties(idx)
        rec.update(gpu=p.name, capability=f"{p.major}.{p.minor}", conv_kernel=conv_kernel(), **gpu_facts(idx))
    return rec

