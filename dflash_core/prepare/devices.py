"""Where `prepare` runs: the device, the process group's backend and the batch sizes the device affords.

`prepare --device cpu` (the default) changes nothing: the CPU keeps the batch sizes its recipe was measured
with (`teacher.TEACHER_BATCH`, `PADDED_BATCH`, `FORCED_BATCH`), so the reference bundle's artifacts stay what
they are. `--device cuda` runs the teacher passes and drafter training on the GPU at larger teacher batches
(taps leave the device after every batch, so a batch costs the target's activations, not the taps), joins a
torchrun group over NCCL with one GPU per rank, and fits the methods on the CPU afterwards (small least-squares
fits and heads: the code the reference recipe measured, and no device copy of every fit's examples).
Everything chosen here goes into the manifest (`DevicePlan.record`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass

from ..runtime.device import check_device_name, resolve_device

# A GPU's teacher batch by its memory: 350M target, ~90 positions a row, 3 taps x 1,024 float32 per row
# (1.1 GB of taps at 1,024 rows, copied to the host after each batch) fits 40 GB with room for the cache.
GPU_TEACHER_BATCH = {40.0: 1024, 16.0: 512, 0.0: 256}
GPU_FORCED_BATCH = {40.0: 64, 16.0: 32, 0.0: 16}  # full logits [batch, 128, vocab]: 2.1 GB at 64 x 65,536


@dataclass(frozen=True)
class DevicePlan:
    """One prepare run's device facts. `teacher_batch` / `forced_batch` None: the CPU recipe's own sizes."""

    device: str
    backend: str
    teacher_batch: int | None = None
    forced_batch: int | None = None
    name: str = "cpu"
    memory_gib: float | None = None
    fits_device: str = "cpu"

    @property
    def on_cpu(self) -> bool:
        return self.device == "cpu"

    def record(self) -> dict:
        return asdict(self)


def _by_memory(table: dict[float, int], gib: float) -> int:
    return next(v for floor, v in sorted(table.items(), reverse=True) if gib >= floor)


def rank_device(device: str) -> str:
    """This rank's device: under torchrun on CUDA each local rank takes its own GPU (LOCAL_RANK), as NCCL needs."""
    if device.startswith("cuda") and ":" not in device and "LOCAL_RANK" in os.environ:
        try:
            return f"cuda:{int(os.environ['LOCAL_RANK'])}"
        except ValueError:
            return device
    return device


def plan_device(device: str) -> DevicePlan:
    """The plan for `device` ('cpu', 'cuda', 'cuda:N'); refuses CUDA where there is none (no silent fallback)."""
    name = check_device_name(device)
    if name == "cpu":
        return DevicePlan(device="cpu", backend="gloo")
    dev = resolve_device(rank_device(name))  # DeviceError without CUDA
    import torch

    torch.cuda.set_device(dev)  # NCCL's collectives and broadcast_object use the current device
    props = torch.cuda.get_device_properties(dev)
    gib = props.total_memory / 2**30
    return DevicePlan(device=str(dev), backend="nccl", teacher_batch=_by_memory(GPU_TEACHER_BATCH, gib),
                      forced_batch=_by_memory(GPU_FORCED_BATCH, gib), name=props.name, memory_gib=round(gib, 1))


@contextlib.contextmanager
def runtime_on(rt, device: str) -> Iterator:
    """`rt` with its model on `device` inside the block, back where it was afterwards (the fits' cost probe and
    the fits themselves run on the CPU whatever device trained)."""
    import torch

    was = rt.device
    target = torch.device(device)
    if target == torch.device(was):
        yield rt
        return
    rt.model.to(target)
    rt.device = target
    try:
        yield rt
    finally:
        rt.model.to(was)
        rt.device = was
