"""`prepare`: build what the methods need, reproducibly, into the artifact cache.

Steps: (mini only) build the embedded target; teacher trajectories = the target's own greedy
continuations of the train seeds; hidden-state taps; train the DFlash drafter; then every registered
fitter (aux heads and fits of methods 02-14) adds its files. Everything lands in
`$DFLASH_HOME/artifacts/<target key>/` with a manifest of SHA-256, sizes, configs, versions and seeds.
"""

from __future__ import annotations

import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .artifacts import (
    artifact_dir,
    file_entry,
    read_manifest,
    target_identity,
    torch_bytes,
    write_atomic,
    write_json_atomic,
    write_manifest,
)
from .errors import ArtifactError
from .prepared import DRAFTER_FILE, Prepared, load_prepared  # noqa: F401  (re-exported: callers import them here)
from .train import TrainConfig

TRAJ_FILE = "trajectories.json"


@dataclass(frozen=True)
class PrepareConfig:
    family: str | None = None  # prompt family; None: 'code' for mini, 'english' otherwise
    traj_tokens: int = 64
    corpus_seeds: int = 192  # extra train seeds cut from the mini target's corpus (mini only)
    random_seeds: int = 0  # tokenizer-less targets: seeded random id prompts
    n_taps: int = 3
    block_size: int = 8
    drafter_layers: int = 1
    drafter_heads: int = 4
    drafter_intermediate: int | None = None  # None: 2 x target hidden
    train: TrainConfig = field(default_factory=TrainConfig)
    aux_steps: int = 300  # optimisation steps for each method head fitted after the drafter
    aux_max_examples: int | None = None  # cap on draft examples used by the fits (None: all)
    threads: int = 2
    seed: int = 7

    def to_dict(self) -> dict:
        return asdict(self)


def _log(msg: str) -> None:
    print(f"[prepare] {msg}", file=sys.stderr, flush=True)


def family_for(rt, cfg: PrepareConfig) -> str:
    if cfg.family:
        return cfg.family
    return "code" if rt.name == "mini" else "english"


def train_seed_ids(rt, cfg: PrepareConfig, family: str) -> list[list[int]]:
    """Encoded train seeds. Mini adds deterministic corpus lines; tokenizer-less targets get random ids."""
    from .data import load_prompts

    if rt.tokenizer is None:
        r = random.Random(cfg.seed)
        n = max(cfg.random_seeds, 8)
        return [[r.randrange(3, rt.vocab_size) for _ in range(r.randrange(2, 12))] for _ in range(n)]
    ps = load_prompts(family)
    texts = list(ps.train)
    if rt.name == "mini" and cfg.corpus_seeds:
        from .minitarget import MiniTargetConfig, corpus_texts

        held = {p.strip() for p in ps.benchmark + ps.calibration}
        lines = [ln.rstrip() for t in corpus_texts(MiniTargetConfig()) for ln in t.splitlines()]
        lines = [ln for ln in lines if 12 <= len(ln.strip()) <= 80 and ln.strip() not in held]
        r = random.Random(cfg.seed)
        texts += r.sample(lines, min(cfg.corpus_seeds, len(lines)))
    return [rt.encode(t) for t in texts]


def ensure_target(target: str, home, refresh: bool, progress: bool) -> None:
    if target != "mini":
        return
    from .artifacts import mini_target_dir

    d = mini_target_dir(home)
    if (d / "config.json").is_file() and not refresh:
        return
    from .minitarget import build_mini_target

    _log(f"building the embedded mini target into {d} (a few minutes on 2 cores)")
    build_mini_target(d, progress=progress)


def prepare(target: str = "mini", *, home=None, refresh: bool = False, progress: bool = True,
            cfg: PrepareConfig | None = None, rt=None) -> Path:
    """Build (or verify) every artifact for `target`; returns the artifact directory."""
    import torch

    from .drafter import DrafterConfig, default_taps, parameter_count
    from .methods import FitContext, fit_files, fitters
    from .target import load_target
    from .train import train_drafter, trajectories

    cfg = cfg or PrepareConfig()
    torch.set_num_threads(cfg.threads)
    t_start = time.perf_counter()
    if rt is None:
        ensure_target(target, home, refresh, progress)
        rt = load_target(target, "cpu", "float32", home=home)
    ident = target_identity(rt)
    out = artifact_dir(ident, home)
    if not refresh:
        try:
            read_manifest(out, ident, required=(DRAFTER_FILE, TRAJ_FILE, *fit_files()))
            _log(f"artifacts for {rt.name} are present and verified in {out}")
            return out
        except ArtifactError as exc:
            if (out / "manifest.json").exists():
                _log(f"rebuilding: {exc}")
    family = family_for(rt, cfg)
    torch.manual_seed(cfg.seed)
    seeds = train_seed_ids(rt, cfg, family)
    _log(f"teacher trajectories: {len(seeds)} seeds x {cfg.traj_tokens} greedy tokens")
    t0 = time.perf_counter()
    trajs = trajectories(rt, seeds, cfg.traj_tokens, progress=progress)
    t_traj = time.perf_counter() - t0
    dcfg = DrafterConfig(hidden_size=rt.hidden_size, vocab_size=rt.vocab_size,
                         taps=default_taps(rt.num_layers, min(cfg.n_taps, rt.num_layers)),
                         block_size=cfg.block_size, num_layers=cfg.drafter_layers, num_heads=cfg.drafter_heads,
                         intermediate_size=cfg.drafter_intermediate or 2 * rt.hidden_size)
    _log(f"training the drafter ({cfg.train.steps} steps, block {cfg.block_size}, taps {list(dcfg.taps)})")
    drafter, metrics = train_drafter(rt, trajs, dcfg, cfg.train, progress=progress)
    files: dict[str, dict] = {}
    sd = {k: v.detach().float().cpu().contiguous() for k, v in drafter.state_dict().items()}
    write_atomic(out / DRAFTER_FILE, torch_bytes({"config": dcfg.to_dict(), "state_dict": sd}))
    files[DRAFTER_FILE] = file_entry(out / DRAFTER_FILE)
    write_json_atomic(out / TRAJ_FILE, {"family": family, "prompt_lens": [len(s) for s in seeds],
                                        "sequences": trajs})
    files[TRAJ_FILE] = file_entry(out / TRAJ_FILE)
    fits: dict[str, Any] = {}
    ctx = FitContext(rt, drafter, trajs, [len(s) for s in seeds], cfg, family, progress)
    for fitter in fitters():
        _log(f"fitting {fitter.name}")
        res = fitter(ctx)
        for fname, data in res.get("files", {}).items():
            write_atomic(out / fname, data)
            files[fname] = file_entry(out / fname)
        fits[fitter.name] = res.get("meta", {})
    extra = {
        "prepare_config": cfg.to_dict(),
        "seeds": {"torch": cfg.seed, "train": cfg.train.seed, "family": family, "train_seed_count": len(seeds)},
        "drafter": {"config": dcfg.to_dict(), "parameters": parameter_count(drafter),
                    **metrics},
        "teacher": {"sequences": len(trajs), "tokens_per_seed": cfg.traj_tokens, "seconds": t_traj},
        "fits": fits,
        "prepare_seconds": time.perf_counter() - t_start,
    }
    write_manifest(out, ident, files, extra)
    _log(f"done in {time.perf_counter() - t_start:.1f}s -> {out}")
    return out
