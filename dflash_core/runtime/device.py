"""Device and dtype resolution. Never falls back silently: asking for CUDA without CUDA is an error."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import DeviceError
from ..options import env_value

DTYPES = ("float32", "float64", "float16", "bfloat16")


def require_gpu() -> bool:
    """True when the environment demands a GPU (GPU runners set DFLASH_REQUIRE_GPU=1)."""
    return bool(env_value("require_gpu"))


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


_DEVICE_NAME = re.compile(r"cpu|cuda(:[0-9]+)?")
# The device names a saved run or a report may record (what a report folder and a model card are named after):
# anything else (a path such as "../../x", markup) is refused where it is read.
DEVICE_RE = re.compile(r"^(cpu|cuda(:[0-9]+)?|mps)$")


def check_device_name(name: object) -> str:
    """Refuse anything but 'cpu', 'cuda' and 'cuda:N' by its spelling (no torch import: cheap, checked first).

    torch itself accepts 'cpu:7' and ignores the index; the lab has one CPU device, so that is refused.
    """
    if not isinstance(name, str) or not name:
        raise DeviceError(f"device must be a string such as 'cpu' or 'cuda', got {name!r}")
    if not _DEVICE_NAME.fullmatch(name):
        raise DeviceError(f"unknown device {name!r}: use 'cpu', 'cuda' or 'cuda:N' (N a CUDA device index)")
    return name


def resolve_device(name: str):
    """Map 'cpu', 'cuda' or 'cuda:N' to a torch.device, refusing what this machine lacks."""
    import torch

    kind = check_device_name(name).split(":", 1)[0]
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(
                f"device {name!r} was asked for but CUDA is not available on this machine "
                f"(torch {torch.__version__}, built with CUDA {torch.version.cuda}); "
                "run with --device cpu, or install a CUDA build of torch on a GPU machine. "
                "There is no silent CPU fallback."
            )
        dev = torch.device(name)
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise DeviceError(
                f"device {name!r} does not exist: this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
        return dev
    return torch.device("cpu")


def resolve_dtype(name: str | None, device) -> "object":
    """Map a dtype name to torch.dtype. None/'auto' means float32 on CPU and DFLASH_GPU_DTYPE or float16 on CUDA."""
    import torch

    if name in (None, "", "auto"):
        if device.type == "cuda":
            name = env_value("gpu_dtype")
        else:
            name = "float32"
    if name not in DTYPES:
        raise DeviceError(f"unsupported dtype {name!r}: choose one of {', '.join(DTYPES)}")
    if device.type == "cpu" and name == "float16":
        raise DeviceError("dtype float16 is not supported on CPU (slow and inexact kernels); use float32 or bfloat16")
    return getattr(torch, name)


def synchronize(device) -> None:
    """Wait for queued kernels so a timer around device work measures the work, not the launch."""
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        torch.cuda.synchronize(device)


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run a block with n intra-op threads, then restore the caller's count (results and timings depend on it)."""
    import torch

    prev = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(prev)
