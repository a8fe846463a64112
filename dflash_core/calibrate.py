"""Calibration on calibration prompts only (never benchmark prompts): choose a method's setting among
exact settings by measured throughput over repeated, order-rotated trials, and return the full table.

The seed chose from one noisy run per setting; here every setting runs `repeats` times per prompt, the
order of settings is rotated each round so drift does not favour one, and the median tokens/s with its
spread (IQR, dflash_core.spread: the benchmark's definition) is recorded. Ties in median go to the earlier
(simpler) setting in grid order.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .decode import greedy, speculative
from .spread import median_iqr


@dataclass
class Trial:
    setting: dict
    key: str
    tokens_per_second: list[float] = field(default_factory=list)
    acceptance: list[float] = field(default_factory=list)
    tokens_per_call: list[float] = field(default_factory=list)
    guidance: list[float] = field(default_factory=list)
    exact: bool = True

    def summary(self) -> dict:
        med, iqr = median_iqr(self.tokens_per_second)
        return {"setting": self.setting, "key": self.key, "all_exact": self.exact,
                "tokens_per_second_median": med, "tokens_per_second_iqr": iqr, "trials": len(self.tokens_per_second),
                "mean_acceptance_rate": statistics.fmean(self.acceptance) if self.acceptance else 0.0,
                "mean_tokens_per_target_call": statistics.fmean(self.tokens_per_call) if self.tokens_per_call
                else 0.0,
                "mean_guidance_work": statistics.fmean(self.guidance) if self.guidance else 0.0}


def setting_key(setting: dict) -> str:
    return "|".join(f"{k}={setting[k]}" for k in sorted(setting))


def calibrate(rt, prompts: Sequence[Sequence[int]], tokens: int, settings: Sequence[dict],
              make_proposer: Callable[[dict], Any], width: int, *, repeats: int = 3,
              warmup: bool = True) -> dict:
    """Measure every setting on every calibration prompt `repeats` times in rotated order.

    `make_proposer(setting)` builds the method's proposer for one setting. Returns
    {"selected": setting, "table": [summary...], "protocol": {...}}; raises if no setting is exact.
    """
    refs = [greedy(rt, list(p), tokens)[0] for p in prompts]
    trials = [Trial(dict(s), setting_key(s)) for s in settings]
    if warmup and prompts:
        speculative(rt, make_proposer(settings[0]), list(prompts[0]), min(tokens, 8), width)
    n = len(trials)
    for r in range(repeats):
        for pi, (p, ref) in enumerate(zip(prompts, refs)):
            shift = (pi * repeats + r) % n
            for t in trials[shift:] + trials[:shift]:
                ids, st = speculative(rt, make_proposer(t.setting), list(p), tokens, width)
                t.exact &= ids == ref
                t.tokens_per_second.append(st.tokens_per_second)
                t.acceptance.append(st.acceptance_rate)
                t.tokens_per_call.append(st.tokens_per_target_call)
                t.guidance.append(st.guidance_work)
    table = [t.summary() for t in trials]
    exact = [row for row in table if row["all_exact"]]
    if not exact:
        raise RuntimeError("calibration found no exact setting: the method or the rollback is broken")
    best = max(exact, key=lambda row: (row["tokens_per_second_median"], -table.index(row)))
    return {"selected": best["setting"], "selected_key": best["key"], "table": table,
            "protocol": {"prompts": len(prompts), "tokens": tokens, "repeats": repeats, "width": width,
                         "order": "rotated per (prompt, repeat)", "statistic": "median tokens/s, IQR spread"}}


ACT_GRID = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)


def _refuse_benchmark_prompts(rt, prepared, prompts_ids, prompt_texts, family: str | None, purpose: str) -> None:
    """Held-out discipline: calibration prompts, as text or as the decoded ids, may share no n-gram with a
    benchmark prompt (the one guard, `heldout`, via `data.refuse_benchmark`)."""
    from .data import refuse_benchmark

    fam = family or prepared.manifest.get("seeds", {}).get("family") or ("code" if rt.name == "mini" else "english")
    if prompt_texts is not None:
        refuse_benchmark(list(prompt_texts), fam, purpose)
    if rt.tokenizer is not None:
        refuse_benchmark([rt.decode(list(p)) for p in prompts_ids], fam, f"{purpose} (prompt ids)")


def calibrate_act(rt, prepared, prompts_ids, tokens: int, width: int, repeats: int = 3, grid=ACT_GRID, *,
                  prompt_texts=None, family: str | None = None) -> dict:
    """Choose ACT's margin threshold tau (method 08) among exact settings by median tokens/s.

    Every tau is exact by construction (ACT only shortens what is verified), so the choice is a throughput
    measurement: repeated, order-rotated trials via `calibrate`, ties to the smaller tau (grid order).
    Benchmark prompts are refused (as `prompt_texts`, or as ids when the target has a tokenizer).
    """
    from .methods import get_method

    _refuse_benchmark_prompts(rt, prepared, prompts_ids, prompt_texts, family, "ACT calibration")
    info = get_method("act")
    settings = [{"tau": float(t)} for t in sorted(set(float(t) for t in grid))]
    out = calibrate(rt, [list(p) for p in prompts_ids], tokens, settings,
                    lambda s: info.build(rt, prepared, tau=s["tau"]), width, repeats=repeats)
    out["selected_tau"] = out["selected"]["tau"]
    return out


# --- methods 09-11 (V13 reuses V10's selection; V12/V14 are fitted by prepare, not calibrated) -------

DSPARK_FLOORS = (0.0, 0.05, 0.10, 0.20, 0.35, 0.50, 0.70)


def _grid(axes: dict) -> list[dict]:
    """Cartesian product of the axes, in axis order (the first axis varies slowest)."""
    import itertools

    keys = list(axes)
    return [dict(zip(keys, vals)) for vals in itertools.product(*(axes[k] for k in keys))]


def successive_halving(rt, prompts, tokens: int, settings: Sequence[dict], make_proposer, width: int, *,
                       repeats: int = 3, stage1_prompts: int = 2, keep: int = 4) -> dict:
    """Stage 1: every setting on the first <= `stage1_prompts` prompts; the `keep` best exact settings
    (median tokens/s, then less guidance work, then grid order) go to stage 2 on all prompts, where the
    harness chooses. Each stage is a full `calibrate` run (repeated, order-rotated trials)."""
    prompts = [list(p) for p in prompts]
    first = prompts[:max(1, min(stage1_prompts, len(prompts)))]
    st1 = calibrate(rt, first, tokens, settings, make_proposer, width, repeats=repeats)
    rows = st1["table"]
    ranked = sorted((i for i, r in enumerate(rows) if r["all_exact"]),
                    key=lambda i: (-rows[i]["tokens_per_second_median"], rows[i]["mean_guidance_work"], i))
    survivors = [dict(settings[i]) for i in sorted(ranked[:keep])]
    st2 = calibrate(rt, prompts, tokens, survivors, make_proposer, width, repeats=repeats)
    full = len(settings) * len(prompts) * repeats
    halved = len(settings) * len(first) * repeats + len(survivors) * len(prompts) * repeats
    plan = {"total_configs": len(settings), "stage1_prompts": len(first), "stage2_prompts": len(prompts),
            "survivors": len(survivors), "repeats": repeats,
            "full_grid_prompt_config_evaluations": full,
            "successive_halving_prompt_config_evaluations": halved,
            "calibration_work_reduction_fraction": 1.0 - halved / full if full else 0.0, "training_steps": 0}
    return {"plan": plan, "stage1": st1, "stage2": st2, "selected": st2["selected"],
            "selected_key": st2["selected_key"]}


def _method_builder(rt, prepared, method_id: str):
    from .methods import get_method

    info = get_method(method_id)
    return lambda s: info.build(rt, prepared, **s)


def calibrate_dspark(rt, prepared, prompts_ids, tokens: int, width: int | None = None, repeats: int = 3,
                     floors=DSPARK_FLOORS, *, prompt_texts=None, family: str | None = None) -> dict:
    """Choose DSpark-Lite's survival floor (method 09) among exact floors by median tokens/s (ties: lower)."""
    _refuse_benchmark_prompts(rt, prepared, prompts_ids, prompt_texts, family, "DSpark calibration")
    w = width or prepared.drafter.cfg.block_size
    settings = [{"floor": float(f)} for f in sorted(set(float(f) for f in floors))]
    out = calibrate(rt, [list(p) for p in prompts_ids], tokens, settings,
                    _method_builder(rt, prepared, "dspark_lite"), w, repeats=repeats)
    out["selected_floor"] = out["selected"]["floor"]
    return out


def calibrate_v10(rt, prepared, prompts_ids, tokens: int, width: int | None = None, repeats: int = 3,
                  grid: dict | None = None, *, prompt_texts=None, family: str | None = None) -> dict:
    """V10 (method 10) by successive halving over T x cutoff x budget (x slope); returns
    {plan, stage1, stage2, selected, v13}. `v13["options"]` are what V13 reuses: T, cutoff and slope of
    the selection; V13's budget is always 1 (so V13 == V10 only when the selected budget is 1)."""
    from .methods.routing import V10_GRID, v13_options

    _refuse_benchmark_prompts(rt, prepared, prompts_ids, prompt_texts, family, "V10 calibration")
    w = width or prepared.drafter.cfg.block_size
    out = successive_halving(rt, prompts_ids, tokens, _grid(grid or V10_GRID),
                             _method_builder(rt, prepared, "boltzmann_v10"), w, repeats=repeats)
    out["v13"] = {"options": v13_options(out["selected"]), "routing_budget": 1, "reuses_v10_config": True,
                  "v10_selected_budget": out["selected"]["budget"]}
    return out


def calibrate_v11(rt, prepared, prompts_ids, tokens: int, width: int | None = None, repeats: int = 3,
                  grid: dict | None = None, *, prompt_texts=None, family: str | None = None) -> dict:
    """V11 (method 11) by successive halving over T x gate x budget x top_k (x pair weight x early bias)."""
    from .methods.gated_mobs import V11_GRID

    _refuse_benchmark_prompts(rt, prepared, prompts_ids, prompt_texts, family, "V11 calibration")
    w = width or prepared.drafter.cfg.block_size
    return successive_halving(rt, prompts_ids, tokens, _grid(grid or V11_GRID),
                              _method_builder(rt, prepared, "gated_mobs_v11"), w, repeats=repeats)
