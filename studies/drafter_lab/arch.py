"""Drafter architectures compared on one teacher set of a real checkpoint: held-out accuracy per position and tau.

Why: on SmolLM2-135M the default drafter (one layer, random init) is right 31 % of the time at the first drafted
position with training accuracy equal to held-out (underfit). This script generates the teacher data once (a
subset of prepare's train seeds, plus teacher-forced text), then trains each variant with the same split, steps
and seed: `base` (prepare's default), `anchor`/`mask`/`block` (the anchor feature, `DrafterConfig.anchor_feature`),
`deepN` (N layers), `initN` (N target-shaped layers copied from the target's last attention layers,
`prepare/drafter_init.py`). Scored by the held-out per-position accuracy (float32) and by
plain dflash's tokens per target call on the benchmark prompts. Nothing is written into the home.

    python -m studies.drafter_lab.arch --target DIR --seeds 800 --forced-tokens 65536 --steps 300 \
        --variants base,deep3,init3 --out arch.json
    # data scaling: nested shares of the teacher data, one common held-out set
    # (--selection-study: also the state each TrainConfig.select rule keeps, from the same run)
    python -m studies.drafter_lab.arch --target DIR --seeds 100000 --corpus-seeds 4000 --steps 3000 --budget off \
        --shares 0.5,1 --out scaling.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import NoReturn

# Task templates for --templated: the corpus's sentence starts wrapped as chat, QA, summary, translation, math and
# code prompts, so the teacher's trajectories are the target's own task-style outputs (the benchmark prompts are
# tagged by such tasks). Worded unlike the benchmark prompts; the held-out guard drops any trajectory that leaks.
TEMPLATES = [
    "Human: {s}... what do you think about that?\nBot:",
    "Human: Can you help me understand this: \"{s}\"\nBot: Sure.",
    "Q: What is meant by \"{s}\"?\nA:",
    "Read this and answer.\nPassage: {s}.\nQ: Who is speaking here, and to whom?\nA:",
    "Text: {s}.\nA shorter version of the text:",
    "Please give the Spanish for this sentence: {s}\nSpanish:",
    "Please give the Italian for this sentence: {s}\nItalian:",
    "Exercise: a country spends {a} million dollars in each of {b} years. How much does it spend in total?\n"
    "Worked answer:",
    "Exercise: there are {a} members in one house and {b} in the other. How many members are there?\nWorked answer:",
    "# {s}\n# a small Python helper for the idea above\ndef ",
    "// {s}\n// the same idea as a JavaScript function\nfunction ",
]


def templated_seeds(rt, seeds: list[list[int]], share: float, keep_first: int = 24, seed: int = 11) -> list[list[int]]:
    """Seeds after the family's own `keep_first`, each wrapped in a random TEMPLATES entry with probability
    `share` (seeded)."""
    import random

    r = random.Random(seed)
    out = []
    for i, s in enumerate(seeds):
        if i < keep_first or r.random() < 1 - share:
            out.append(s)
            continue
        text = rt.decode(list(s)).strip().rstrip(".,;:")
        out.append(rt.encode(r.choice(TEMPLATES).format(s=text, a=r.randrange(2, 90), b=r.randrange(2, 30))))
    return out


def fail(message: str) -> NoReturn:
    """Bad input: one `error:` line and exit 2 (1 is kept for a failed result, as the lab's CLI does)."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def parse_shares(text: str) -> list[float]:
    try:
        shares = [float(x) for x in text.split(",")]
    except ValueError:
        shares = []
    if not shares or not all(0 < x <= 1 for x in shares):
        fail(f"--shares must be numbers in (0, 1], got {text[:40]!r}")
    return shares


VARIANT = re.compile(r"(base|anchor|mask|block|deep\d|init\d)(\+emb)*")


def checked_knobs(a, base):
    """The training config and widths the arguments ask for, every knob checked before the target loads:
    (TrainConfig, widths)."""
    from dflash_core.errors import BadInputError
    from dflash_core.prepare.train import check_train_knobs

    if a.heldout_cache and not a.shares:
        fail("--heldout-cache needs --shares (it replaces the common held-out set)")
    if a.selection_study and not a.shares:
        fail("--selection-study needs --shares (it scores states on the common held-out set)")
    if a.shares:
        parse_shares(a.shares)
    bad = [v for v in a.variants.split(",") if not VARIANT.fullmatch(v)]
    if bad:
        fail(f"unknown variant {bad[0][:40]!r} (base, anchor, mask, block, deepN, initN, each with an optional +emb)")
    try:
        widths = [int(w) for w in a.widths.split(",")]
        budget = a.budget if a.budget == "auto" else None if a.budget == "off" else float(a.budget)
    except ValueError:
        fail(f"--widths must be integers and --budget minutes, 'off' or 'auto', got {a.widths[:40]!r}, "
             f"{a.budget[:40]!r}")
    from dflash_core.prepare.pipeline import check_teacher_dtype, refuse_emulated_teacher

    try:  # prepare's own checks: a bad value, and bf16 where it would be emulated (the target loads on the CPU)
        check_teacher_dtype(a.teacher_dtype)
        refuse_emulated_teacher(a.teacher_dtype, "cpu")
    except BadInputError as exc:
        fail(str(exc))
    if a.distill_top_k and a.teacher_top_k and a.teacher_top_k < a.distill_top_k:
        fail("--teacher-top-k must be at least --distill-top-k (the teacher set records the logits distilled)")
    tcfg = replace(base.train, steps=a.steps, patience=100, budget_minutes=budget,
                   **{k: v for k, v in (("lr", a.lr), ("anchors_per_sequence", a.anchors), ("batch_sequences", a.batch),
                                        ("gamma", a.gamma), ("anchors", a.anchor_rule),
                                        ("feature_weight", a.feature_weight), ("distill_top_k", a.distill_top_k),
                                        ("distill_weight", a.distill_weight), ("seed", a.train_seed),
                                        ("select", a.select))
                      if v is not None})
    try:
        check_train_knobs(tcfg)
    except BadInputError as exc:
        fail(str(exc))
    return tcfg, widths


def variant_config(name: str, dcfg, model):
    """(drafter config, init callable or None) of a variant name: base, deepN, initN."""
    from dflash_core.prepare.drafter_init import target_shaped

    if name == "base":
        return dcfg, None
    if name.endswith("+emb"):  # the anchor's embedding on the MASK rows (DrafterConfig.anchor_embed), on any variant
        cfg, how = variant_config(name[:-4], dcfg, model)
        return replace(cfg, anchor_embed=True), how
    if name in ("anchor", "mask", "block"):  # the fused row before the anchor added to the anchor row / every block row
        return replace(dcfg, anchor_feature=name), None
    m = re.fullmatch(r"(deep|init)(\d)", name)
    if not m:
        fail(f"unknown variant {name!r} (base, anchor, mask, block, deepN, initN, each with an optional +emb)")
    cfg = replace(dcfg, num_layers=int(m.group(2)))
    if m.group(1) == "deep":
        return cfg, None
    return target_shaped(cfg, model), "target"


def tau_by_task(rt, drafter, ps, tokens: int, width: int) -> dict:
    """Plain dflash's tokens per target call per task family of the benchmark prompts (all of them), at `width`."""
    from studies.drafter_lab.recipes import tau_per_width

    out = {}
    for task in dict.fromkeys(ps.benchmark_tasks):
        prompts = [rt.encode(p) for p, t in zip(ps.benchmark, ps.benchmark_tasks) if t == task]
        out[task] = tau_per_width(rt, drafter, prompts, tokens, [width])[width]
    return out


def retapped(rt, teacher, taps, cache):
    """The teacher set's taps at other layers (`--taps`): one batched forward over every trajectory, kept beside
    a --teacher-cache as <cache>.taps-<layers>.pt so parallel runs of a tap study pay it once."""
    import torch

    from dflash_core.prepare.train import trajectories_taps

    side = None if cache is None else cache.with_name(f"{cache.name}.taps-{'-'.join(map(str, taps))}.pt")
    if side is not None and side.is_file():
        feats = torch.load(side, weights_only=True)
        if len(feats) == len(teacher) and all(f.shape[0] == len(s) - 1 for f, s in zip(feats, teacher.sequences)):
            return feats
        fail(f"{side} does not match the teacher set: delete it")
    t0 = time.perf_counter()
    # the teacher keeps the taps of the first L-1 rows (the last row feeds no label)
    feats = [f[:-1].clone() for f in trajectories_taps(rt, teacher.sequences, taps, progress=True)]
    print(f"taps {list(taps)} of {len(feats)} trajectories in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    if side is not None:
        torch.save(feats, side)
    return feats


def load_teacher_cache(path: Path):
    """A --teacher-cache file: (teacher set, seeds kept, its teacher dtype; caches written before the flag hold
    float32 sets). The script's own scratch file: tensors and ints only."""
    import torch

    from dflash_core.prepare.teacher import TeacherData

    blob = torch.load(path, weights_only=True)
    return TeacherData(**blob["teacher"]), blob["seeds_kept"], blob.get("teacher_dtype", "float32")


def reference_set(a, teacher, seeds_kept):
    """The --heldout-cache teacher set, checked to hold the same seeds (in order) and taps as this run's; or None."""
    if not a.heldout_cache:
        return None
    path = Path(a.heldout_cache)
    if not path.is_file():
        fail(f"--heldout-cache {path} is not a file: build it with --teacher-cache first")
    ref, ref_seeds, _ = load_teacher_cache(path)
    if [list(s) for s in ref_seeds] != [list(s) for s in seeds_kept] or len(ref) != len(teacher):
        fail(f"--heldout-cache {path} holds other seeds than this run's teacher set: build it with the same --seeds")
    if tuple(ref.tap_layers) != tuple(teacher.tap_layers):
        fail(f"--heldout-cache {path} is tapped at layers {list(ref.tap_layers)}, this run at "
             f"{list(teacher.tap_layers)}")
    return ref


def data_scaling(a, rt, teacher, forced, dcfg, tcfg, prompts, widths, reference=None) -> dict:
    """Prepare's drafter trained on nested shares of the generated trajectories, each scored on one common held-out
    set that no share trains on. Why: a row per data size with its own held-out split mixes the data's effect with
    the split's; here the shares grow by adding trajectories (a seeded order) and the held-out set is fixed, so the
    rows differ in training data only. `reference` (--heldout-cache: a teacher set of the same seeds) gives the
    held-out continuations instead, so runs on teachers of different dtypes are scored on the same float32 text."""
    import random

    import torch

    from dflash_core.prepare.train import SELECT_RULES, HeldoutEval, heldout_eval, train_drafter
    from studies.drafter_lab.recipes import tau_per_width

    order = list(range(len(teacher)))
    random.Random(tcfg.seed + 11).shuffle(order)
    n_held = min(a.common_heldout, len(order) // 5)
    held, rest = (reference or teacher).select(sorted(order[:n_held])), order[n_held:]
    embed, head = rt.model.get_input_embeddings(), rt.model.get_output_embeddings()

    def common(d) -> dict:
        """A drafter scored on the common held-out set (float32) and by tau."""
        ev = heldout_eval(d, embed, head, held, None, list(range(len(held))), tcfg.anchors_per_sequence,
                          tcfg.seed + 3, tcfg.batch_sequences, rule=tcfg.anchors, compute_dtype=torch.float32)
        return {"common_heldout_accuracy": ev.accuracy, "common_heldout_loss": ev.loss,
                "common_heldout_accepted": ev.accepted, "tau": tau_per_width(rt, d, prompts, 48, widths)}

    rows = []
    for share in parse_shares(a.shares):
        part = teacher.select(sorted(rest[: max(2, round(len(rest) * share))]))
        data = part if forced is None else part.extend(forced)
        states: dict[int, dict] = {}

        def keep_state(step, drafter, _row, states=states):
            states[step] = {k: v.detach().clone() for k, v in drafter.state_dict().items()}

        t1 = time.perf_counter()
        drafter, m = train_drafter(rt, data.sequences, dcfg, tcfg, teacher=data,
                                   observe=keep_state if a.selection_study else None)
        seconds = time.perf_counter() - t1
        row = {"share": share, "trajectories": len(part), "generated_tokens": sum(len(s) for s in part.sequences),
               "train_seconds": seconds, "steps_run": m["steps_run"], "best_step": m["best_step"],
               "tokens_seen": m["tokens_seen"], "own_heldout_accuracy": m["heldout_position_accuracy"],
               "heldout_curve": m["heldout_curve"], "draft_vocabulary": m["draft_vocabulary"]} | common(drafter)
        if a.selection_study:  # the state each rule would keep, from the one run, scored on the common set
            curve = m["heldout_curve"]
            evs = [HeldoutEval([r["heldout_mean_accuracy"]], r["heldout_loss"], r["heldout_accepted"]) for r in curve]
            picks = {rule: curve[max(range(len(curve)), key=lambda i: evs[i].score(rule))]["step"]
                     for rule in SELECT_RULES} | {"last": curve[-1]["step"]}
            scored: dict[int, dict] = {}
            for rule, step in picks.items():
                if step not in scored:
                    drafter.load_state_dict(states[step])
                    scored[step] = {"step": step} | common(drafter)
                print(json.dumps({"rule": rule, "step": step, "tau": scored[step]["tau"],
                                  "accepted": round(scored[step]["common_heldout_accepted"], 4),
                                  "acc": [round(x, 3) for x in scored[step]["common_heldout_accuracy"][:4]]}),
                      file=sys.stderr, flush=True)
            row["selection"] = {rule: scored[step] for rule, step in picks.items()}
        acc = row["common_heldout_accuracy"]
        print(json.dumps({k: row[k] for k in ("share", "trajectories", "train_seconds", "tau", "common_heldout_loss")}
                         | {"acc": [round(x, 3) for x in acc[:6]]}), file=sys.stderr, flush=True)
        rows.append(row)
    return {"common_heldout_trajectories": len(held), "rows": rows}


def main(argv=None) -> dict:
    import torch

    from dflash_core.prepare.drafter_format import mask_token_for
    from dflash_core.prepare.drafter_init import init_from_target
    from dflash_core.prepare.pipeline import (
        PrepareConfig,
        drop_leaking_trajectories,
        family_for,
        forced_teacher,
        resolve_auto_teacher,
        resolve_teacher_dtype,
        teacher_autocast,
        train_seed_ids,
    )
    from dflash_core.prepare.teacher import teacher_data
    from dflash_core.prepare.train import SELECT_RULES, train_drafter
    from dflash_core.progress import ensure_console_logging
    from dflash_core.runtime.drafter import DrafterConfig, default_taps, parameter_count
    from dflash_core.runtime.target import load_target
    from dflash_core.store.data import load_prompts
    from studies.drafter_lab.recipes import tau_per_width

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--seeds", type=int, default=800, help="train seeds used (of prepare's)")
    ap.add_argument("--forced-tokens", type=int, default=65536)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--variants", default="base,deep3,init3")
    ap.add_argument("--widths", default="4,16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="drafter-arch.json")
    ap.add_argument("--templated", type=float, default=0.0, help="share of the corpus seeds wrapped in a task "
                    "template (TEMPLATES); 0: none")
    ap.add_argument("--tasks", action="store_true", help="also tau per task family over every benchmark prompt")
    ap.add_argument("--teacher-cache", default=None, help="a file to keep the generated teacher set in (built once, "
                    "reused; the teacher-forced text is not in it)")
    ap.add_argument("--forced-data", default=None, help="training text for the teacher-forced passes only (as "
                    "--train-data reads it; the seeds stay prepare's)")
    ap.add_argument("--taps", default=None, help="target layers tapped, e.g. 1,14,29 (default: prepare's rule)")
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--gamma", type=float, default=None, help="the loss's position decay (TrainConfig.gamma)")
    ap.add_argument("--anchor-rule", default=None, choices=("all", "continuation"), help="TrainConfig.anchors")
    ap.add_argument("--anchors", type=int, default=None, help="anchors per sequence per step")
    ap.add_argument("--batch", type=int, default=None, help="sequences per step")
    ap.add_argument("--budget", default="auto", help="training budget in minutes, 'off' for none, or 'auto' "
                    "(prepare's rule: 15 min at a real vocabulary)")
    ap.add_argument("--feature-weight", type=float, default=None, help="TrainConfig.feature_weight: the cosine pull "
                    "of each block row toward the target's hidden state (last tap) at the row predicting its label")
    ap.add_argument("--corpus-seeds", type=int, default=None, help="PrepareConfig.corpus_seeds: train seeds cut from "
                    "the training text (prepare's default 2,368); with --seeds, how much teacher data there is")
    ap.add_argument("--train-data", default=None, help="training text the seeds are cut from (as prepare's "
                    "--train-data; default the shipped corpus)")
    ap.add_argument("--shares", default=None, help="data scaling, e.g. 0.5,1: prepare's drafter (the first variant) "
                    "trained on nested shares of the generated trajectories, every row scored on one common held-out "
                    "set none of them trains on (--common-heldout trajectories)")
    ap.add_argument("--common-heldout", type=int, default=256)
    ap.add_argument("--distill-top-k", type=int, default=None, help="TrainConfig.distill_top_k: soft targets from "
                    "the target's top-k logits (the teacher set records them; a --teacher-cache must hold them)")
    ap.add_argument("--distill-weight", type=float, default=None, help="TrainConfig.distill_weight")
    ap.add_argument("--train-seed", type=int, default=None, help="TrainConfig.seed: the drafter's initialisation, "
                    "batches and splits (with --shares also the common held-out set), for a replicate of a comparison")
    ap.add_argument("--teacher-top-k", type=int, default=None, help="top-k logits recorded in a new teacher set "
                    "(default: --distill-top-k), so one --teacher-cache serves runs with and without distillation")
    ap.add_argument("--selection-study", action="store_true", help="with --shares: keep the state at every held-out "
                    "evaluation and score the one each TrainConfig.select rule (and the last step) would keep on the "
                    "common held-out set, all from one training run (patience is off here, so the run is the same)")
    ap.add_argument("--select", default=None, choices=("auto", *SELECT_RULES),
                    help="TrainConfig.select (default auto: loss at a real vocabulary)")
    ap.add_argument("--teacher-dtype", default="float32",
                    help="PrepareConfig.teacher_dtype of a new teacher set (and the forced text): bfloat16 trains on "
                    "the bf16 target's greedy labels, auto as prepare resolves it; float32 unless given, so a "
                    "comparison names both; tau is still measured in the float32 decode")
    ap.add_argument("--heldout-cache", default=None, help="with --shares: a --teacher-cache file of the same seeds "
                    "whose continuations form the common held-out set (a float32 set scores a bf16 teacher's drafter "
                    "on the text the float32 decode greedily makes)")
    ap.add_argument("--zero-taps", action="store_true", help="ablation: train and draft with every tap zeroed (the "
                    "drafter sees tokens only), to measure what the target's hidden states add")
    a = ap.parse_args(argv)
    base = replace(PrepareConfig(), forced_tokens=a.forced_tokens, teacher_dtype=a.teacher_dtype,
                   **{k: v for k, v in (("corpus_seeds", a.corpus_seeds), ("train_data", a.train_data))
                      if v is not None})
    tcfg, widths = checked_knobs(a, base)  # refused here, not after a teacher pass of minutes
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    ensure_console_logging()
    torch.set_num_threads(a.threads)
    rt = load_target(a.target, "cpu", "float32")
    a.teacher_dtype = resolve_auto_teacher(a.teacher_dtype, rt)  # 'auto' as prepare resolves it, for the cache's record
    base = replace(base, teacher_dtype=a.teacher_dtype)
    family = family_for(rt, base)
    torch.manual_seed(base.seed)
    seeds = train_seed_ids(rt, base, family)[: a.seeds]
    if a.templated:
        seeds = templated_seeds(rt, seeds, a.templated)
    taps = default_taps(rt.num_layers, min(base.n_taps, rt.num_layers))
    if a.taps:  # the teacher set is generated with prepare's taps; `retapped` replaces them once
        taps_train = tuple(int(t) for t in a.taps.split(","))
        if not all(0 <= t < rt.num_layers for t in taps_train):
            fail(f"--taps must name layers 0..{rt.num_layers - 1}, got {a.taps!r}")
    else:
        taps_train = taps
    t0 = time.perf_counter()
    cache = Path(a.teacher_cache) if a.teacher_cache else None
    if cache is not None and cache.is_file():  # the script's own scratch file: tensors and ints only
        teacher, seeds_kept, held_dtype = load_teacher_cache(cache)
        if held_dtype != a.teacher_dtype:
            fail(f"--teacher-cache {cache} holds a {held_dtype} teacher set; give --teacher-dtype {held_dtype} or "
                 "another file")
    else:
        with teacher_autocast(rt, resolve_teacher_dtype(base, rt)):
            teacher = teacher_data(rt, seeds, base.traj_tokens, taps, a.teacher_top_k or a.distill_top_k or 0)
        _, seeds_kept, held = drop_leaking_trajectories(rt, teacher.sequences, seeds)
        drop = set(held.get("dropped_indexes", []))
        teacher = teacher.select([i for i in range(len(teacher)) if i not in drop])
        if cache is not None:
            torch.save({"teacher": dict(vars(teacher)), "seeds_kept": [list(s) for s in seeds_kept],
                        "teacher_dtype": a.teacher_dtype}, cache)
    if tuple(teacher.tap_layers) != tuple(taps_train):
        teacher.taps, teacher.tap_layers = retapped(rt, teacher, taps_train, cache), tuple(taps_train)
    if a.distill_top_k and (teacher.top_ids is None or teacher.top_ids[0].shape[-1] < a.distill_top_k):
        fail(f"the teacher set records fewer than {a.distill_top_k} top-k logits: build a new --teacher-cache with "
             "--teacher-top-k of at least --distill-top-k")
    fcfg = replace(base, train_data=a.forced_data) if a.forced_data else base
    forced, forced_rec = forced_teacher(rt, fcfg, family, seeds_kept, taps_train, False)
    data = teacher if forced is None else teacher.extend(forced)
    if a.zero_taps:
        data.taps = [torch.zeros_like(t) for t in data.taps]
    t_teacher = time.perf_counter() - t0
    dcfg = DrafterConfig(hidden_size=rt.hidden_size, vocab_size=rt.vocab_size, taps=taps_train,
                         block_size=base.block_size, num_layers=base.drafter_layers, num_heads=base.drafter_heads,
                         intermediate_size=base.drafter_intermediate or 2 * rt.hidden_size,
                         mask_token_id=mask_token_for(rt.config))
    ps = load_prompts(family)
    prompts = [rt.encode(p) for p in ps.benchmark[:4]]
    if a.shares:
        doc = data_scaling(a, rt, teacher, forced, dcfg, tcfg, prompts, widths, reference_set(a, teacher, seeds_kept))
        doc |= {"target": a.target, "identity": rt.info.get("identity"), "teacher_seconds": t_teacher,
                "teacher_dtype": a.teacher_dtype, "heldout_cache": a.heldout_cache, "train_seed": tcfg.seed,
                "forced": forced_rec, "threads": a.threads, "machine": platform.processor() or platform.machine(),
                "loadavg": list(os.getloadavg())}
        Path(a.out).write_text(json.dumps(doc, indent=1), encoding="utf-8")
        return doc
    rows = []
    for name in a.variants.split(","):
        cfg, how = variant_config(name, dcfg, rt.model)

        def init(d, how=how):
            return {"from": "target", "layers": init_from_target(d, rt.model)} if how else None

        t1 = time.perf_counter()
        drafter, m = train_drafter(rt, data.sequences, cfg, tcfg, teacher=data, init=init)
        seconds = time.perf_counter() - t1
        # zeroed taps: decoding would feed the real ones, so tau says nothing; the held-out accuracy is the figure
        tau = None if a.zero_taps else tau_per_width(rt, drafter, prompts, 48, widths)
        by_task = tau_by_task(rt, drafter, ps, 48, max(widths)) if a.tasks and not a.zero_taps else None
        row = {"variant": name, "config": drafter.cfg.to_dict() | {"taps": list(drafter.cfg.taps)},
               "parameters": parameter_count(drafter), "init": m.get("init"), "train_seconds": seconds,
               "steps_run": m["steps_run"], "best_step": m["best_step"], "tokens_seen": m["tokens_seen"],
               "heldout_position_accuracy": m["heldout_position_accuracy"],
               "train_position_accuracy": m["train_position_accuracy"], "heldout_curve": m["heldout_curve"],
               "draft_vocabulary": m["draft_vocabulary"], "tau": tau, "tau_by_task": by_task}
        print(json.dumps({k: row[k] for k in ("variant", "parameters", "train_seconds", "tau", "tau_by_task")}
                         | {"acc": [round(x, 3) for x in row["heldout_position_accuracy"][:6]]}), file=sys.stderr,
              flush=True)
        rows.append(row)
    doc = {"target": a.target, "identity": rt.info.get("identity"), "teacher_seconds": t_teacher,
           "teacher_dtype": a.teacher_dtype, "sequences": len(data), "forced": forced_rec, "steps": a.steps,
           "threads": a.threads,
           "machine": platform.processor() or platform.machine(), "loadavg": list(os.getloadavg()), "rows": rows}
    Path(a.out).write_text(json.dumps(doc, indent=1), encoding="utf-8")
    return doc


if __name__ == "__main__":
    main()
