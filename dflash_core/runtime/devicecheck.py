"""Device check run before any GPU benchmark: what the GPU is, and that it computes correctly.

Reports CUDA availability, device name, memory, compute capability, torch/CUDA/cuDNN versions, and runs
a real FP16 matrix multiplication on the GPU checked against a float64 CPU result. Asking for CUDA
without CUDA is an error (DeviceError), never a CPU fallback.
"""

from __future__ import annotations

from ..errors import DeviceError
from .device import resolve_device
from .numerics import numerics_record


def device_check(device: str = "cuda", size: int = 512, seed: int = 0) -> dict:
    import torch

    info: dict = {"torch": torch.__version__, "cuda_build": torch.version.cuda,
                  "cuda_available": torch.cuda.is_available(), "cpu_threads": torch.get_num_threads()}
    dev = resolve_device(device)  # raises DeviceError without CUDA
    if dev.type != "cuda":
        info["device"] = "cpu"
        return info
    idx = dev.index or 0
    p = torch.cuda.get_device_properties(idx)
    info.update(device=f"cuda:{idx}", name=p.name, capability=f"{p.major}.{p.minor}",
                memory_gib=round(p.total_memory / 2**30, 2), device_count=torch.cuda.device_count(),
                cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
                numerics=numerics_record(dev))  # through torch's current API only (numerics.py: never mix the two)
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(size, size, generator=g, dtype=torch.float64) / size**0.5
    b = torch.randn(size, size, generator=g, dtype=torch.float64)
    want = a.half().double() @ b.half().double()
    got = (a.half().to(dev) @ b.half().to(dev)).double().cpu()
    torch.cuda.synchronize(dev)
    err = (got - want).abs().max().item()
    # fp16 accumulation of `size` products of magnitude ~1: allow a few fp16 ulps of the result scale
    tol = 2e-2 * max(1.0, want.abs().max().item())
    info.update(fp16_matmul_max_abs_error=err, fp16_matmul_tolerance=tol, fp16_matmul_ok=bool(err <= tol))
    if not info["fp16_matmul_ok"]:
        raise DeviceError(f"the GPU's FP16 matmul disagrees with the CPU result (max error {err:.3g} > {tol:.3g}): "
                          "the device or driver is faulty; do not benchmark on it")
    return info
