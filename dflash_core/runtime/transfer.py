"""The one door from the device to the host, and clocks that do not open it.

A CUDA decode loses more to host synchronisations than to arithmetic at the lab's sizes: each `.tolist()`,
`.item()` or `torch.cuda.synchronize()` drains the queue and idles the GPU until the host launches again. So
the decode keeps ids on the device and crosses to the host once per round, for acceptance (gpt-fast's one
`.item()` per speculative round), plus once where a method selects on the host. Every crossing the decode
makes goes through `to_host` (tests count its calls per round: tests/runtime/test_syncs.py), which moves several
tensors with one synchronisation. `mark` / `seconds_between` time device work with CUDA events, read only
after the round's one transfer has drained the queue, so timing adds no synchronisation either; on the CPU
both are plain `perf_counter` readings, as before.
"""

from __future__ import annotations

import time
from typing import Any


def to_host(*tensors) -> list[list]:
    """`[t.tolist() for t in tensors]` with one device synchronisation for all of them (none on the CPU)."""
    import torch

    dev = next((t.device for t in tensors if t.device.type != "cpu"), None)
    if dev is None:
        return [t.tolist() for t in tensors]
    outs = [t.to("cpu", non_blocking=True) for t in tensors]  # into pinned buffers, queued on the stream
    torch.cuda.current_stream(dev).synchronize()  # the one synchronisation
    return [o.tolist() for o in outs]


def mark(device) -> Any:
    """A point in time on `device`'s queue: a recorded CUDA event there, `perf_counter()` on the CPU."""
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        ev = torch.cuda.Event(enable_timing=True)
        ev.record(torch.cuda.current_stream(device))
        return ev
    return time.perf_counter()


def seconds_between(a: Any, b: Any) -> float:
    """Seconds from mark `a` to mark `b`; for CUDA events call it after a transfer has drained the queue."""
    if isinstance(a, float):
        return b - a
    return a.elapsed_time(b) / 1000.0
