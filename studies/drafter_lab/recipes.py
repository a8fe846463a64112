"""Drafter training recipes compared on one teacher set: held-out accuracy and real-decode tau.

The teacher data (taps and the target's top-k logits captured while generating, exactly as `prepare` builds
them) are generated once; each recipe (a set of TrainConfig overrides) trains a drafter on them with the same
held-out split, and is scored by the held-out per-position accuracy at continuation anchors (float32, the
decode's precision) and by plain dflash's tokens per target call on the benchmark prompts at each width
(`measure_tau`'s figure): `tau` on the benchmark's default sample (4 prompts x 48 tokens) and `tau_big` on a
larger one (`--tau-prompts` benchmark prompts, plus the calibration prompts with `--with-calibration`, x `--tokens`),
since tau over 192 tokens moves by a few target calls between equally good drafters. Nothing is written into the
home; `--save DIR` keeps each drafter.

    python -m studies.drafter_lab.recipes --target mini --home DIR --out recipes.json [--recipes base,cont,distill]

Recipes are named in RECIPES below; `--steps` overrides every recipe's step count.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

# name -> TrainConfig overrides. 'old' is the earlier recipe (all anchors, labels only, float32 head).
RECIPES: dict[str, dict] = {
    "old": {"anchors": "all", "distill_top_k": 0, "row_sampling": "off", "matmul_dtype": "float32"},
    "cont": {"anchors": "continuation", "distill_top_k": 0, "row_sampling": "off", "matmul_dtype": "float32"},
    "distill": {"anchors": "continuation", "distill_top_k": 8, "row_sampling": "off", "matmul_dtype": "float32"},
    "fast": {"anchors": "continuation", "distill_top_k": 8, "row_sampling": "on", "matmul_dtype": "bfloat16"},
    "fast_labels": {"anchors": "continuation", "distill_top_k": 0, "row_sampling": "on", "matmul_dtype": "bfloat16"},
    "long": {"anchors": "continuation", "distill_top_k": 8, "row_sampling": "off", "matmul_dtype": "float32",
             "steps": 1200, "patience": 6},
    "fast_long": {"anchors": "continuation", "distill_top_k": 8, "row_sampling": "on", "matmul_dtype": "bfloat16",
                  "steps": 1200, "patience": 6},
}


def tau_per_width(rt, drafter, prompts: list[list[int]], tokens: int, widths: list[int]) -> dict[int, float]:
    from dflash_core.methods.runner import run_method
    from dflash_core.prepare.prepared import Prepared

    prep = Prepared(directory=Path("."), manifest={}, drafter=drafter)
    out = {}
    for w in widths:
        toks = calls = 0
        for p in prompts:
            _, st = run_method("dflash", rt, prep, p, tokens, w)
            toks, calls = toks + st.new_tokens, calls + st.target_calls
        out[w] = toks / calls
    return out


def main(argv=None) -> dict:
    import torch

    from dflash_core.prepare.drafter_format import mask_token_for
    from dflash_core.prepare.pipeline import PrepareConfig, drop_leaking_trajectories, family_for, train_seed_ids
    from dflash_core.prepare.teacher import teacher_data
    from dflash_core.prepare.train import eval_accuracy, split_trajectories, train_drafter
    from dflash_core.progress import ensure_console_logging
    from dflash_core.runtime.drafter import DrafterConfig, default_taps
    from dflash_core.runtime.target import load_target
    from dflash_core.store.data import load_prompts

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="mini")
    ap.add_argument("--home", default=None)
    ap.add_argument("--recipes", default="old,cont,distill,fast")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--widths", default="8,12,15,16")
    ap.add_argument("--tokens", type=int, default=96, help="tokens per prompt of the larger tau sample")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="recipe-variants.json")
    ap.add_argument("--save", default=None, help="folder to save each recipe's drafter in (safetensors)")
    ap.add_argument("--tau-prompts", type=int, default=6, help="benchmark prompts of the larger tau sample")
    ap.add_argument("--with-calibration", action="store_true", help="add the calibration prompts (less noise)")
    a = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    ensure_console_logging()
    torch.set_num_threads(a.threads)
    base = PrepareConfig()
    rt = load_target(a.target, "cpu", "float32", home=a.home)
    family = family_for(rt, base)
    torch.manual_seed(base.seed)
    seeds = train_seed_ids(rt, base, family)
    taps = default_taps(rt.num_layers, min(base.n_taps, rt.num_layers))
    top_k = max(int(RECIPES[r].get("distill_top_k", 0)) for r in a.recipes.split(","))
    t0 = time.perf_counter()
    teacher = teacher_data(rt, seeds, base.traj_tokens, taps, top_k)
    t_teacher = time.perf_counter() - t0
    _, _, held = drop_leaking_trajectories(rt, teacher.sequences, seeds)
    drop = set(held.get("dropped_indexes", []))
    teacher = teacher.select([i for i in range(len(teacher)) if i not in drop])
    dcfg = DrafterConfig(hidden_size=rt.hidden_size, vocab_size=rt.vocab_size, taps=taps, block_size=base.block_size,
                         num_layers=base.drafter_layers, num_heads=base.drafter_heads,
                         intermediate_size=base.drafter_intermediate or 2 * rt.hidden_size,
                         mask_token_id=mask_token_for(rt.config))
    ps = load_prompts(family)
    prompts = [rt.encode(p) for p in ps.benchmark[:4]]  # the benchmark's default sample (4 prompts x 48 tokens)
    texts = list(ps.benchmark[: a.tau_prompts]) + (list(ps.calibration) if a.with_calibration else [])
    big = [rt.encode(p) for p in texts]
    widths = [int(w) for w in a.widths.split(",")]
    embed, head = rt.model.get_input_embeddings(), rt.model.get_output_embeddings()
    rows = []
    for name in a.recipes.split(","):
        over = dict(RECIPES[name])
        if a.steps:
            over["steps"] = a.steps
        tcfg = replace(base.train, **over)
        t1 = time.perf_counter()
        drafter, m = train_drafter(rt, teacher.sequences, dcfg, tcfg, teacher=teacher)
        seconds = time.perf_counter() - t1
        data = teacher.select([i for i, s in enumerate(teacher.sequences) if len(s) > dcfg.block_size + 2])
        _, val = split_trajectories(len(data), tcfg.seed, tcfg.val_fraction)
        if len(val) > tcfg.val_sequences:  # the held-out subset train_drafter evaluates
            val = sorted(random.Random(tcfg.seed + 2).sample(val, tcfg.val_sequences))
        # one yardstick for every recipe: continuation anchors, float32
        acc, _ = eval_accuracy(drafter, embed, head, data, None, val, tcfg.anchors_per_sequence, tcfg.seed + 3,
                               tcfg.batch_sequences, rule="continuation", compute_dtype=torch.float32)
        tau = tau_per_width(rt, drafter, prompts, 48, widths)
        tau_big = tau_per_width(rt, drafter, big, a.tokens, widths)
        if a.save:
            from safetensors.torch import save_file

            Path(a.save).mkdir(parents=True, exist_ok=True)
            state = {k: v.contiguous() for k, v in drafter.state_dict().items()}
            save_file(state, str(Path(a.save) / f"{name}.safetensors"))
        row = {"recipe": name, "overrides": over, "train_seconds": seconds, "steps_run": m["steps_run"],
               "best_step": m["best_step"], "heldout_continuation_accuracy": acc,
               "heldout_mean": sum(acc) / len(acc), "tau": tau, "best_tau": max(tau.values()),
               "tau_big": tau_big, "best_tau_big": max(tau_big.values())}
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)
    doc = {"target": a.target, "teacher_seconds": t_teacher, "sequences": len(teacher), "threads": a.threads,
           "loadavg": list(os.getloadavg()), "rows": rows}
    Path(a.out).write_text(json.dumps(doc, indent=1), encoding="utf-8")
    return doc


if __name__ == "__main__":
    main()
