"""Resident memory of drafter training at a real target's shape, sampled each second, on synthetic teacher data.

Why: at the 350M architecture prepare's training phase peaks ~5 GiB above the target plus the teacher's taps, and a
training rerun alone showed the same growth; this isolates training (no teacher pass: the taps are random tensors
of the teacher's shapes, which training cannot tell from real ones for memory) so allocator settings and code
changes can be compared in minutes. The figures are in this folder's README with the machine they were taken on.

    python studies/2026-12-04-train-memory-heap-trim/probe_train_memory.py --target /tmp/real/lfm2-350m-random \
        --minutes 3 --out mem.json
    GLIBC_TUNABLES=glibc.malloc.mmap_threshold=131072 \
        python studies/2026-12-04-train-memory-heap-trim/probe_train_memory.py ...
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path


def rss_gib() -> float:
    """This process's resident set (VmRSS), GiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def main(argv=None) -> dict:
    import torch

    from dflash_core.prepare.drafter_format import mask_token_for
    from dflash_core.prepare.pipeline import PrepareConfig
    from dflash_core.prepare.teacher import TeacherData
    from dflash_core.prepare.train import train_drafter
    from dflash_core.progress import ensure_console_logging
    from dflash_core.runtime.drafter import DrafterConfig, default_taps
    from dflash_core.runtime.target import load_target

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--sequences", type=int, default=2392, help="generated trajectories (prepare's seed count)")
    ap.add_argument("--prompt", type=int, default=16, help="prompt tokens per trajectory")
    ap.add_argument("--minutes", type=float, default=3.0, help="training budget")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--taps-dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-trim", action="store_true", help="training without its malloc_trim at each evaluation "
                    "(runtime/allocator.py): the growth it prevents")
    ap.add_argument("--teacher", type=int, default=0, help="> 0: real teacher data instead of random tensors: the "
                    "target's greedy trajectories of the first N of prepare's train seeds (teacher.teacher_data)")
    ap.add_argument("--save-rows", default=None, help="first save the data as prepare's teacher file in this "
                    "folder (teacher.save_rows), as a prepare with a work folder does")
    a = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    ensure_console_logging()
    torch.set_num_threads(a.threads)
    if a.no_trim:
        import dflash_core.prepare.train as train_mod

        train_mod.trim_free_memory = lambda: False
    samples: list[tuple[float, float]] = []
    t0 = time.perf_counter()
    done = threading.Event()

    def sample() -> None:
        while not done.wait(1.0):
            samples.append((time.perf_counter() - t0, rss_gib()))

    threading.Thread(target=sample, daemon=True).start()
    base = PrepareConfig()
    rt = load_target(a.target, "cpu", "float32")
    after_load = rss_gib()
    taps = default_taps(rt.num_layers, min(base.n_taps, rt.num_layers))
    g = torch.Generator().manual_seed(0)
    L = a.prompt + base.traj_tokens
    if a.teacher:
        from dflash_core.prepare.pipeline import family_for, train_seed_ids
        from dflash_core.prepare.teacher import teacher_data

        seeds = train_seed_ids(rt, base, family_for(rt, base))[: a.teacher]
        data = teacher_data(rt, seeds, base.traj_tokens, taps, 0)
        a.sequences = len(seeds)
    else:
        seqs = [torch.randint(3, rt.vocab_size, (L,), generator=g).tolist() for _ in range(a.sequences)]
        feats = [torch.randn(L - 1, len(taps) * rt.hidden_size, generator=g).to(getattr(torch, a.taps_dtype))
                 for _ in range(a.sequences)]
        data = TeacherData(seqs, [a.prompt] * a.sequences, feats, None, None, tuple(taps))
    after_data = rss_gib()
    if a.save_rows:
        from dflash_core.prepare.teacher import rows_of, save_rows

        save_rows(Path(a.save_rows) / "teacher.safetensors", rows_of(data), "probe")
    after_save = rss_gib()
    dcfg = DrafterConfig(hidden_size=rt.hidden_size, vocab_size=rt.vocab_size, taps=taps,
                         block_size=base.block_size, num_layers=base.drafter_layers, num_heads=base.drafter_heads,
                         intermediate_size=base.drafter_intermediate or 2 * rt.hidden_size,
                         mask_token_id=mask_token_for(rt.config))
    tcfg = replace(base.train, budget_minutes=a.minutes)
    t1 = time.perf_counter()
    _, m = train_drafter(rt, data.sequences, dcfg, tcfg, teacher=data)
    done.set()
    train = [r for t, r in samples if t >= t1 - t0]
    doc = {"target": a.target, "threads": a.threads, "sequences": a.sequences, "taps_dtype": a.taps_dtype,
           "trim": not a.no_trim, "malloc_env": {k: v for k, v in os.environ.items() if "MALLOC" in k},
           "rss_after_load_gib": after_load, "rss_after_data_gib": after_data, "rss_after_save_gib": after_save,
           "rss_train_max_gib": max(train, default=float("nan")), "steps_run": m["steps_run"],
           "train_seconds": m.get("train_seconds"),
           "rss_timeline": [(round(t, 1), round(r, 3)) for t, r in samples[::5]]}
    print(json.dumps({k: v for k, v in doc.items() if k != "rss_timeline"}), file=sys.stderr)
    if a.out:
        Path(a.out).write_text(json.dumps(doc, indent=1), encoding="utf-8")
    return doc


if __name__ == "__main__":
    main()
