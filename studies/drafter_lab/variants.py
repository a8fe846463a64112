"""Drafter variants on one set of teacher data: layers and block size, compared fairly.

Teacher trajectories are generated once (exactly as `prepare` does), then every variant trains on the same
trajectories with the same held-out split (`train.split_trajectories` on the same count) and is scored by
the lab's own held-out eval. Drafting cost is one `DraftState.draft` block call (plus the argmax the decode
loop takes) at a real trajectory's context, timed call by call interleaved across variants so machine load
hits every variant alike.

Expected accepted drafts per block come from the held-out per-position accuracies a_1..a_n:
* `expected_accepted` (the headline): sum_k prod_{j<=k} a_j, i.e. positions treated as independent. The
  teacher-forced accuracies are marginal and errors are positively correlated along a block, so this is a
  low estimate.
* `expected_accepted_nested`: sum_k min_{j<=k} a_j, i.e. a correct position implies every earlier one
  correct: the largest value the marginals allow (an upper bound).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dflash_core.errors import BadInputError
from dflash_core.prepare.pipeline import PrepareConfig
from dflash_core.stats.summary import median_iqr

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Variant:
    name: str
    layers: int
    block_size: int


# The three drafters studies/2026-11-30-drafter-variants/ compares, fixed (not derived from PrepareConfig, whose
# default block was 8 when the comparison ran and is 16 since the real decode chose it): one layer at block 8 (the
# baseline of
# the comparison), a second layer at block 8, and block 16.
def default_variants() -> list[Variant]:
    """The three variants of studies/2026-11-30-drafter-variants/ (the comparison's baseline first); the rest of
    each config (heads, taps, steps) comes from the base config in `variant_config`."""
    return [Variant("block8", 1, 8), Variant("layers2", 2, 8), Variant("block16", 1, 16)]


def variant_config(base: PrepareConfig, v: Variant, steps: int | None = None) -> PrepareConfig:
    """`base` with the variant's layers and block size (and `steps` training steps when given)."""
    cfg = replace(base, drafter_layers=v.layers, block_size=v.block_size)
    if steps is not None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise BadInputError(f"--steps must be an integer >= 1, got {steps!r}")
        cfg = replace(cfg, train=replace(cfg.train, steps=steps))
    return cfg


def drafter_config(rt, cfg: PrepareConfig):
    """The DrafterConfig prepare trains for `cfg` (same taps, heads, width and MASK token)."""
    from dflash_core.prepare.drafter_format import mask_token_for
    from dflash_core.runtime.drafter import DrafterConfig, default_taps

    return DrafterConfig(hidden_size=rt.hidden_size, vocab_size=rt.vocab_size,
                         taps=default_taps(rt.num_layers, min(cfg.n_taps, rt.num_layers)),
                         block_size=cfg.block_size, num_layers=cfg.drafter_layers, num_heads=cfg.drafter_heads,
                         intermediate_size=cfg.drafter_intermediate or 2 * rt.hidden_size,
                         mask_token_id=mask_token_for(rt.config))


def expected_accepted(acc: Sequence[float]) -> float:
    """sum_k prod_{j<=k} a_j: expected accepted drafts per block if positions were independent (low)."""
    total, run = 0.0, 1.0
    for a in acc:
        run *= float(a)
        total += run
    return total


def expected_accepted_nested(acc: Sequence[float]) -> float:
    """sum_k min_{j<=k} a_j: expected accepted drafts if correctness is nested (the marginals' upper bound)."""
    total, run = 0.0, 1.0
    for a in acc:
        run = min(run, float(a))
        total += run
    return total


def teacher_data(rt, cfg: PrepareConfig, progress: bool = False) -> tuple[list[list[int]], dict]:
    """Teacher trajectories exactly as prepare builds them (seeds, batched greedy, held-out drop), once."""
    import torch

    from dflash_core.prepare.pipeline import drop_leaking_trajectories, family_for, train_seed_ids
    from dflash_core.prepare.train import trajectories

    torch.manual_seed(cfg.seed)
    seeds = train_seed_ids(rt, cfg, family_for(rt, cfg))
    t0 = time.perf_counter()
    trajs = trajectories(rt, seeds, cfg.traj_tokens, progress=progress)
    seconds = time.perf_counter() - t0
    trajs, seeds, held = drop_leaking_trajectories(rt, trajs, seeds)
    return trajs, {"source": "generated", "seconds": seconds, "sequences": len(trajs), "held_out": held}


def load_trajectories(path: str | Path, vocab_size: int) -> list[list[int]]:
    """The `sequences` of a trajectories.json written by prepare (same generator, saves its teacher time)."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BadInputError(f"cannot read trajectories {p}: {exc}; pass the trajectories.json of a prepared "
                            "home, or omit --trajectories to generate them") from exc
    seqs = doc.get("sequences") if isinstance(doc, dict) else None
    ok = isinstance(seqs, list) and seqs and all(
        isinstance(s, list) and s and all(isinstance(t, int) and 0 <= t < vocab_size for t in s) for s in seqs)
    if not ok:
        raise BadInputError(f"{p} holds no list of token-id sequences within the target's vocabulary "
                            f"({vocab_size}): pass the trajectories.json prepare wrote for this target")
    return seqs


def heldout_split(trajs: list[list[int]], cfg: PrepareConfig) -> list[int]:
    """The held-out trajectory indices `train_drafter` uses for `cfg` (its length filter, split and cap), so a
    caller can check that every variant is scored on the same trajectories."""
    import random

    from dflash_core.prepare.train import split_trajectories

    keep = [i for i, s in enumerate(trajs) if len(s) > cfg.block_size + 2]
    _, val = split_trajectories(len(keep), cfg.train.seed, cfg.train.val_fraction)
    if len(val) > cfg.train.val_sequences:
        val = sorted(random.Random(cfg.train.seed + 2).sample(val, cfg.train.val_sequences))
    return [keep[i] for i in val]


def check_same_split(trajs: list[list[int]], cfgs: Sequence[PrepareConfig]) -> list[int]:
    """The one held-out split all `cfgs` share; refused when a block size drops short trajectories."""
    splits = [heldout_split(trajs, c) for c in cfgs]
    if any(s != splits[0] for s in splits):
        raise BadInputError("the variants would be scored on different held-out trajectories (a larger block "
                            "drops trajectories shorter than block + 3): raise traj_tokens or drop the variant")
    return splits[0]


def train_variant(rt, trajs: list[list[int]], cfg: PrepareConfig, progress: bool = False) -> tuple[Any, dict]:
    """Train one variant with prepare's recipe; returns (drafter, metrics + wall seconds + parameters)."""
    import torch

    from dflash_core.prepare.train import train_drafter
    from dflash_core.runtime.drafter import parameter_count

    torch.manual_seed(cfg.seed)
    t0 = time.perf_counter()
    drafter, metrics = train_drafter(rt, trajs, drafter_config(rt, cfg), cfg.train, progress=progress)
    metrics = {**metrics, "wall_seconds": time.perf_counter() - t0, "parameters": parameter_count(drafter)}
    return drafter, metrics


def context_taps(rt, seq: Sequence[int], taps: Sequence[int]):
    """Target taps of every row of `seq`: the drafting context every variant is timed at."""
    from dflash_core.runtime.target import trajectory_taps

    return trajectory_taps(rt, seq, taps)


def _block_call(drafter, ctx, anchor: int, embed, head) -> Callable[[], None]:
    """One decode-loop drafter call: a DraftState at the context, drafting a block and taking its argmax."""
    from dflash_core.runtime.drafter import DraftState

    state = DraftState(drafter)
    state.extend(ctx)

    def call() -> None:
        logits, _ = state.draft(anchor, embed, head)
        logits.argmax(-1)

    return call


def time_drafting(rt, drafters: dict[str, Any], ctx, anchor: int, rounds: int, warmup: int = 10
                  ) -> dict[str, list[float]]:
    """Seconds of `rounds` block calls per drafter, interleaved call by call (order rotated every round)."""
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise BadInputError(f"--rounds must be an integer >= 1, got {rounds!r}")
    embed, head = rt.model.get_input_embeddings(), rt.model.get_output_embeddings()
    calls = {name: _block_call(d, ctx, anchor, embed, head) for name, d in drafters.items()}
    names = list(calls)
    for _ in range(warmup):
        for n in names:
            calls[n]()
    out: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            calls[n]()
            out[n].append(time.perf_counter() - t0)
    return out


def figures(acc: Sequence[float], seconds: float, positions: int) -> dict:
    """Derived figures for the first `positions` drafts of a block drafted in `seconds`."""
    a = list(acc)[:positions]
    e, nested = expected_accepted(a), expected_accepted_nested(a)
    return {"positions": positions, "mean_accuracy": sum(a) / len(a), "expected_accepted": e,
            "expected_accepted_nested": nested, "accepted_per_draft_second": e / seconds,
            "nested_accepted_per_draft_second": nested / seconds}


def variant_row(v: Variant, metrics: dict, times: list[float]) -> dict:
    """One result row: training record, drafting time (median, IQR) and the derived figures."""
    med, iqr = median_iqr(times)
    acc = metrics["heldout_position_accuracy"]
    positions = sorted({min(8, v.block_size), v.block_size})
    return {"variant": v.name, "layers": v.layers, "block_size": v.block_size, "parameters": metrics["parameters"],
            "heldout_position_accuracy": acc, "heldout_loss": metrics["heldout_loss"],
            "heldout_sequences": metrics["heldout_sequences"], "train_sequences": metrics["train_sequences"],
            "steps_run": metrics["steps_run"], "best_step": metrics["best_step"],
            "train_seconds": metrics["wall_seconds"], "draft_seconds_median": med, "draft_seconds_iqr": iqr,
            "draft_calls": len(times), "at": [figures(acc, med, p) for p in positions]}


def winner(rows: list[dict]) -> dict:
    """The (variant, positions) with the most expected accepted drafts per drafting second, and its ratio
    to the first (baseline) variant's full block."""
    entries = [(r["variant"], f) for r in rows for f in r["at"]]
    name, best = max(entries, key=lambda e: e[1]["accepted_per_draft_second"])
    base = rows[0]["at"][-1]["accepted_per_draft_second"]
    ratio = best["accepted_per_draft_second"] / base if base > 0 else None  # None: the baseline accepts nothing
    return {"variant": name, "positions": best["positions"], "accepted_per_draft_second":
            best["accepted_per_draft_second"], "over_default": ratio,
            "baseline": rows[0]["variant"], "criterion": "expected_accepted / draft_seconds_median"}


def markdown_table(rows: list[dict]) -> str:
    """The comparison as a markdown table, one line per (variant, positions)."""
    head = ("| variant | layers | block | positions | params | mean held-out acc | E[accepted] (indep.) | "
            "E[accepted] (nested) | draft ms/block (median, IQR) | accepted / draft s | train s | steps (best) |")
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        for f in r["at"]:
            lines.append(
                f"| {r['variant']} | {r['layers']} | {r['block_size']} | {f['positions']} | {r['parameters']:,} | "
                f"{f['mean_accuracy']:.3f} | {f['expected_accepted']:.3f} | {f['expected_accepted_nested']:.3f} | "
                f"{1e3 * r['draft_seconds_median']:.3f} ({1e3 * r['draft_seconds_iqr']:.3f}) | "
                f"{f['accepted_per_draft_second']:.0f} | {r['train_seconds']:.1f} | "
                f"{r['steps_run']} ({r['best_step']}) |")
    return "\n".join(lines)
