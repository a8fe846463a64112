"""Subprocess side of tests/prepare/test_distributed.py (not collected: no test_ prefix).

    python tests/support/prepare_worker.py prepare CKPT HOME STEPS EVERY [--stall]   # one prepare (torchrun-able)
    python tests/support/prepare_worker.py train64 OUT                              # DDP training of a float64 drafter

`--stall`: after the first training checkpoint is written, write CKPT-stalled beside the home and sleep, so the
test can SIGKILL the run at a known point (the production code has no such hook: it is patched in here).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def tiny_config(steps: int, every: int):
    from dflash_core.testing import tiny_prepare_config

    cfg = tiny_prepare_config()
    return replace(cfg, train=replace(cfg.train, steps=steps, checkpoint_every=every, eval_every=10, patience=100))


def run_prepare(ckpt: str, home: str, steps: int, every: int, stall: bool) -> None:
    from dflash_core.prepare import train
    from dflash_core.prepare.pipeline import prepare

    if stall:
        real = train.save_checkpoint

        def save_then_stall(path, state):
            real(path, state)
            (Path(home).parent / "stalled").write_text(str(state["loop"]["step"]))
            time.sleep(600)

        train.save_checkpoint = save_then_stall
    out = prepare(ckpt, home=home, cfg=tiny_config(steps, every), progress=False)
    print(out)


def train64():
    """A float64 drafter trained on a tiny float64 target; under torchrun each rank trains its share (DDP)."""
    import random

    from dflash_core.prepare.train import TrainConfig, train_drafter
    from dflash_core.runtime.drafter import DrafterConfig
    from dflash_core.runtime.target import TargetRuntime
    from dflash_core.testing import TinySpec, build_tiny

    rt = TargetRuntime.from_model(build_tiny(TinySpec(pattern="CACA", dtype="float64", vocab_size=64, hidden_size=32,
                                                      intermediate_size=64)))
    r = random.Random(0)
    seqs = [[(a + d * i) % 63 + 1 for i in range(18)] for a, d in ((r.randrange(1, 64), r.randrange(1, 4))
                                                                   for _ in range(24))]
    dcfg = DrafterConfig(hidden_size=32, vocab_size=64, taps=(1, 3), block_size=4, num_layers=1, num_heads=4,
                         intermediate_size=64)
    tcfg = TrainConfig(steps=30, batch_sequences=6, anchors_per_sequence=4, lr=0.01, warmup=3, eval_every=10,
                       patience=100, row_sampling="on", seed=5)
    return train_drafter(rt, seqs, dcfg, tcfg)


def run_train64(out: str) -> None:
    from safetensors.torch import save_file

    from dflash_core.prepare import distributed as dist

    dist.init_from_env("cpu")
    drafter, metrics = train64()
    if dist.rank() == 0:
        save_file({k: v.contiguous() for k, v in drafter.state_dict().items()}, out)
        keep = {"world_size": metrics["world_size"], "steps_run": metrics["steps_run"],
                "final_loss": metrics["final_loss"], "heldout": metrics["heldout_position_accuracy"]}
        Path(out + ".json").write_text(json.dumps(keep))


if __name__ == "__main__":
    from dflash_core.prepare import distributed as dist

    mode = sys.argv[1]
    try:
        if mode == "prepare":
            run_prepare(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), "--stall" in sys.argv)
        elif mode == "train64":
            run_train64(sys.argv[2])
        else:
            sys.exit(f"unknown mode {mode!r}")
    finally:
        dist.shutdown()  # as the CLI does: a rank exiting with its gloo group alive can abort at exit
