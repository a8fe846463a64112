"""`torchrun` scale-out for `prepare`: the process group and the few collectives prepare uses.

`torchrun --nproc-per-node N -m dflash_core prepare ...` starts N processes with RANK / WORLD_SIZE /
MASTER_ADDR set; `init_from_env` joins them into one torch.distributed group (gloo on CPU, nccl on CUDA).
Without those variables (a plain `prepare`) every helper is the one-process identity, so the same code path
runs either way. Rank 0 alone writes artifacts and holds the home's lock (`artifacts.home_lock` lets the
other ranks through: they write nothing and only read after a barrier that follows rank 0's writes).
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any


def _dist():
    import torch.distributed as d

    return d if d.is_available() and d.is_initialized() else None


def rank() -> int:
    d = _dist()
    return d.get_rank() if d else 0


def world_size() -> int:
    d = _dist()
    return d.get_world_size() if d else 1


def launched() -> bool:
    """Whether this process was started by torchrun (or any launcher setting WORLD_SIZE > 1)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        return False


def init_from_env(device: str = "cpu") -> bool:
    """Join the launcher's process group once (gloo on CPU, nccl on CUDA); False when not launched."""
    import torch.distributed as d

    if not launched():
        return False
    if not d.is_initialized():
        # Rank 0 alone fits the methods while the others wait at a barrier: minutes on a real target, so the
        # collectives' timeout is hours, not the default 30 min.
        d.init_process_group(backend="nccl" if str(device).startswith("cuda") else "gloo", timeout=timedelta(hours=4))
    return True


def shutdown() -> None:
    """Leave the process group: a barrier (every rank done), then destroy it. Why: a rank that exits with the gloo
    group still alive can abort at interpreter exit ('terminate called without an active exception', SIGABRT,
    exit -6) after its work is done, and torchrun then fails the whole launch (seen in CI on the 2-rank test)."""
    d = _dist()
    if d:
        d.barrier()
        d.destroy_process_group()


def threads_per_rank(threads: int) -> int:
    """The torch threads of one rank: `threads` shared by the ranks on this machine (torchrun's LOCAL_WORLD_SIZE),
    so N ranks with --threads 2 on a 2-core box do not run 2N threads."""
    try:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    except ValueError:
        local = 1
    return max(1, threads // max(1, local)) if launched() else threads


def barrier() -> None:
    d = _dist()
    if d:
        d.barrier()


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank `src`'s `obj` on every rank (the identity in one process)."""
    d = _dist()
    if not d:
        return obj
    box = [obj if d.get_rank() == src else None]
    d.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(obj: Any) -> list[Any]:
    d = _dist()
    if not d:
        return [obj]
    out: list[Any] = [None] * d.get_world_size()
    d.all_gather_object(out, obj)
    return out


def all_reduce_sum(t):
    """Sum a tensor over the ranks, in place (float64 on CPU keeps the sum exact enough to compare). NCCL reduces
    CUDA tensors only, so under it a host tensor makes the round trip through this rank's GPU."""
    d = _dist()
    if not d:
        return t
    if d.get_backend() == "nccl" and t.device.type != "cuda":
        import torch

        on_gpu = t.to(torch.device("cuda", torch.cuda.current_device()))
        d.all_reduce(on_gpu)
        t.copy_(on_gpu.cpu())
        return t
    d.all_reduce(t)
    return t
