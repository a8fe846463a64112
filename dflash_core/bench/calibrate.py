"""Calibration on calibration prompts only (never benchmark prompts): choose a method's setting among exact
settings by the deterministic cost-model speedup (dflash_core.bench.costmodel), never by raw tokens/s.

Each setting decodes every calibration prompt once (`repeats` times if asked): the rounds are deterministic,
and the decode's proposer is timed per component (costmodel.TimedProposer), so the objective is built from
the setting's own rounds, its own selection cost, the drafter's costs (the drafter forward is the same for
every setting, so its medians per call are pooled over all of them: timing noise cannot split settings whose
rounds are equal) and the target's verify costs measured once in isolation (`costs`). The best model speedup
wins; settings within 1 % of it tie and the tie goes to more tokens per target call, then to the earlier
(simpler) setting in grid order (costmodel.choose). tok/s is still recorded in the table, for reading only.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import BadInputError
from ..methods import Calibration, get_method
from ..runtime.decode import greedy, speculative
from ..stats.summary import median_iqr
from ..store.data import refuse_benchmark
from .costmodel import (
    OBJECTIVE,
    ComponentCosts,
    ProposerCosts,
    TimedProposer,
    choose,
    model_speedup,
    pooled_costs,
    target_costs,
)


@dataclass
class Trial:
    setting: dict
    key: str
    tokens_per_second: list[float] = field(default_factory=list)
    acceptance: list[float] = field(default_factory=list)
    tokens_per_call: list[float] = field(default_factory=list)
    guidance: list[float] = field(default_factory=list)
    rounds: list[list] = field(default_factory=list)  # each decode's trace (one round list per decode)
    timers: list[TimedProposer] = field(default_factory=list)
    target_calls: int = 0
    new_tokens: int = 0
    exact: bool = True

    def merged(self, other: "Trial") -> "Trial":
        """This setting's decodes and those of `other` (the same setting on more prompts) as one trial."""
        lists = ("tokens_per_second", "acceptance", "tokens_per_call", "guidance", "rounds", "timers")
        return Trial(self.setting, self.key, **{k: getattr(self, k) + getattr(other, k) for k in lists},
                     target_calls=self.target_calls + other.target_calls, new_tokens=self.new_tokens + other.new_tokens,
                     exact=self.exact and other.exact)

    def summary(self, costs: ComponentCosts | None = None, shared: ProposerCosts | None = None) -> dict:
        """The table row. `shared`: the drafter's costs (draft, observe, begin) pooled over every setting, since
        the drafter forward does not depend on the setting, with this setting's own selection cost; None: use
        `costs` whole (an injected table). Without `costs` the row has no model speedup (reading tok/s only)."""
        med, iqr = median_iqr(self.tokens_per_second)
        full = costs if shared is None or costs is None else costs.with_proposer(
            replace(shared, t_select=pooled_costs(self.timers).t_select))
        return {"setting": self.setting, "key": self.key, "all_exact": self.exact,
                "model_speedup": float(model_speedup(self.rounds, full)) if full is not None else None,
                "tokens_per_target_call": self.new_tokens / self.target_calls if self.target_calls else 0.0,
                **{k: getattr(full, k) if full is not None else None for k in ("t_draft", "t_observe", "t_select")},
                "tokens_per_second_median": med, "tokens_per_second_iqr": iqr, "trials": len(self.tokens_per_second),
                "mean_acceptance_rate": statistics.fmean(self.acceptance) if self.acceptance else 0.0,
                "mean_tokens_per_target_call": statistics.fmean(self.tokens_per_call) if self.tokens_per_call
                else 0.0,
                "mean_guidance_work": statistics.fmean(self.guidance) if self.guidance else 0.0}


def summarize_trials(trials: Sequence[Trial], costs: ComponentCosts, timed: bool = True,
                     drafter: ProposerCosts | None = None) -> list[dict]:
    """The table: each trial priced by the cost model (`timed=False`: `costs` used whole, an injected table).
    `drafter`: the drafter's draft/observe/begin seconds timed elsewhere (a replayed decode reads cached blocks, so
    its own draft timings are not the drafter's); each trial keeps its own selection seconds."""
    shared = drafter if drafter is not None else pooled_costs([tm for t in trials for tm in t.timers])
    return [t.summary(costs, shared if timed else None) for t in trials]


def setting_key(setting: dict) -> str:
    return "|".join(f"{k}={setting[k]}" for k in sorted(setting))


def calibration_costs(rt, prompts: Sequence[Sequence[int]], width: int, costs: ComponentCosts | None
                      ) -> ComponentCosts:
    """The target's verify costs for calibration: `costs` when given (a session measures them once), else timed
    at the first calibration prompt. Prefill is left out: it is the same for every setting (see costmodel)."""
    if costs is None:
        costs = target_costs(rt, list(prompts[0]), width)
    if len(costs.t_verify) <= width:
        raise BadInputError(f"the cost table covers widths 0..{len(costs.t_verify) - 1}, not {width}: measure "
                            "target costs up to the drafter's block size (costmodel.target_costs)")
    return replace(costs, t_prefill=0.0)


def run_trials(rt, prompts: Sequence[Sequence[int]], refs: Sequence[Sequence[int]], tokens: int,
               settings: Sequence[dict], make_proposer: Callable[[dict], Any], width: int, *, repeats: int = 1,
               warmup: bool = True) -> list[Trial]:
    """Decode every prompt with every setting `repeats` times (setting order rotated per prompt and repeat),
    each with a timed proposer and a trace: the rounds and component seconds the cost model prices."""
    trials = [Trial(dict(s), setting_key(s)) for s in settings]
    if warmup and prompts:
        speculative(rt, make_proposer(settings[0]), list(prompts[0]), min(tokens, 8), width)
    n = len(trials)
    for r in range(repeats):
        for pi, (p, ref) in enumerate(zip(prompts, refs)):
            shift = (pi * repeats + r) % n
            for t in trials[shift:] + trials[:shift]:
                timer, trace = TimedProposer(make_proposer(t.setting)), []
                ids, st = speculative(rt, timer, list(p), tokens, width, trace=trace)
                t.exact &= ids == list(ref)
                t.rounds.append(trace)
                t.timers.append(timer)
                t.target_calls += st.target_calls
                t.new_tokens += st.new_tokens
                t.tokens_per_second.append(st.tokens_per_second)
                t.acceptance.append(st.acceptance_rate)
                t.tokens_per_call.append(st.tokens_per_target_call)
                t.guidance.append(st.guidance_work)
    return trials


def _record(table: list[dict], prompts: int, tokens: int, repeats: int, width: int, cost: ComponentCosts) -> dict:
    best = table[choose(table)]
    return {"selected": best["setting"], "selected_key": best["key"], "table": table,
            "protocol": {"prompts": prompts, "tokens": tokens, "repeats": repeats, "width": width,
                         "order": "rotated per (prompt, repeat)", "objective": OBJECTIVE,
                         "statistic": "cost-model speedup of the setting's own rounds (costmodel.model_speedup); "
                                      "drafter costs pooled over the settings, selection cost per setting",
                         "target_costs": cost.to_dict()}}


def calibrate(rt, prompts: Sequence[Sequence[int]], tokens: int, settings: Sequence[dict],
              make_proposer: Callable[[dict], Any], width: int, *, repeats: int = 1, warmup: bool = True,
              costs: ComponentCosts | None = None, refs: Sequence[Sequence[int]] | None = None,
              timed: bool = True, drafter: ProposerCosts | None = None) -> dict:
    """Decode every calibration prompt with every setting `repeats` times (order rotated) and choose by the
    cost-model speedup (module docstring).

    `make_proposer(setting)` builds the method's proposer for one setting; `costs` the target's component
    costs (measured here when None); `refs` the prompts' greedy outputs (computed when None). With
    `timed=False` the proposer costs in `costs` are used as given (an injected cost table) instead of timed.
    Returns {"selected": setting, "table": [summary...], "protocol": {...}}; raises if no setting is exact.
    `rt` may be a `bench.replay.ReplayRuntime` (the width model's decodes) with the drafter's costs timed
    elsewhere (`drafter`, see `summarize_trials`).
    """
    prompts = [list(p) for p in prompts]
    refs = [list(r) for r in refs] if refs is not None else [greedy(rt, p, tokens)[0] for p in prompts]
    cost = calibration_costs(rt, prompts, width, costs)
    trials = run_trials(rt, prompts, refs, tokens, settings, make_proposer, width, repeats=repeats, warmup=warmup)
    return _record(summarize_trials(trials, cost, timed, drafter), len(prompts), tokens, repeats, width, cost)


def _refuse_benchmark_prompts(rt, prepared, prompts_ids, prompt_texts, family: str | None, purpose: str) -> None:
    """Held-out discipline: calibration prompts, as text or as the decoded ids, may share no n-gram with a
    benchmark prompt (the one guard, `heldout`, via `data.refuse_benchmark`). A replayed decode's prompt holds the
    target's own continuation, which the width model checks itself (`store.data.clean_segments`): the caller
    passes the calibration prompts' ids here instead (`held_out_ids`)."""
    fam = family or prepared.manifest.get("seeds", {}).get("family") or ("code" if rt.name == "mini" else "english")
    if prompt_texts is not None:
        refuse_benchmark(list(prompt_texts), fam, purpose)
    if rt.tokenizer is not None:
        refuse_benchmark([rt.decode(list(p)) for p in prompts_ids], fam, f"{purpose} (prompt ids)")


def successive_halving(rt, prompts, tokens: int, settings: Sequence[dict], make_proposer, width: int, *,
                       repeats: int = 1, stage1_prompts: int = 2, keep: int = 4, costs: ComponentCosts | None = None,
                       refs: Sequence[Sequence[int]] | None = None, timed: bool = True,
                       drafter: ProposerCosts | None = None, warmup: bool = True) -> dict:
    """Stage 1: every setting on the first <= `stage1_prompts` prompts; the `keep` best exact settings
    (cost-model speedup, then tokens per target call, then less guidance work, then grid order) go to stage 2
    on all prompts, where the harness chooses (costmodel.choose). Stage 2 decodes only the prompts stage 1 did
    not and reuses the survivors' stage-1 decodes; the target costs and greedy references serve both stages."""
    prompts = [list(p) for p in prompts]
    first = prompts[:max(1, min(stage1_prompts, len(prompts)))]
    refs = [list(r) for r in refs] if refs is not None else [greedy(rt, p, tokens)[0] for p in prompts]
    costs = calibration_costs(rt, prompts, width, costs)
    t1 = run_trials(rt, first, refs[:len(first)], tokens, settings, make_proposer, width, repeats=repeats,
                    warmup=warmup)
    rows = summarize_trials(t1, costs, timed, drafter)
    st1 = _record(rows, len(first), tokens, repeats, width, costs)
    ranked = sorted((i for i, r in enumerate(rows) if r["all_exact"]),
                    key=lambda i: (-rows[i]["model_speedup"], -rows[i]["tokens_per_target_call"],
                                   rows[i]["mean_guidance_work"], i))
    keep_i = sorted(ranked[:keep])
    survivors = [dict(settings[i]) for i in keep_i]
    # Stage 2 decodes only the prompts stage 1 did not: a decode's rounds are deterministic, so the survivors'
    # stage-1 decodes are reused, not repeated.
    rest = prompts[len(first):]
    t2 = run_trials(rt, rest, refs[len(first):], tokens, survivors, make_proposer, width, repeats=repeats,
                    warmup=False) if rest else [Trial(dict(s), setting_key(s)) for s in survivors]
    merged = [t1[i].merged(t) for i, t in zip(keep_i, t2)]
    st2 = _record(summarize_trials(merged, costs, timed, drafter), len(prompts), tokens, repeats, width, costs)
    full = len(settings) * len(prompts) * repeats
    halved = len(settings) * len(first) * repeats + len(survivors) * len(prompts) * repeats
    plan = {"total_configs": len(settings), "stage1_prompts": len(first), "stage2_prompts": len(prompts),
            "survivors": len(survivors), "repeats": repeats,
            "full_grid_prompt_config_evaluations": full,
            "successive_halving_prompt_config_evaluations": halved,
            "calibration_work_reduction_fraction": 1.0 - halved / full if full else 0.0, "training_steps": 0,
            "decodes": len(settings) * len(first) * repeats + len(survivors) * len(rest) * repeats}
    return {"plan": plan, "stage1": st1, "stage2": st2, "selected": st2["selected"],
            "selected_key": st2["selected_key"]}


def calibrate_method(rt, prepared, method_id: str, prompts_ids, tokens: int, width: int, *, repeats: int = 1,
                     grid: dict | None = None, prompt_texts=None, family: str | None = None,
                     stage1_prompts: int | None = None, held_out_ids=None, **kw: Any) -> dict:
    """Calibrate a registered method as its registry entry says (`methods.base.Calibration`): its grid (or
    `grid`, axis -> values, for a smaller search in tests) searched by the cost-model speedup, every setting on
    every prompt (`calibrate`) or by successive halving; `kw` as for `calibrate` (costs, refs, timed).

    Benchmark prompts are refused (as `prompt_texts`, or as ids when the target has a tokenizer). Returns the
    search's record ({"selected", "table"|"plan"/"stage1"/"stage2", ...}) with `selected_options`."""
    info = get_method(method_id)
    cal = info.calibration
    if cal is None or cal.reuses is not None:
        raise BadInputError(f"{method_id} has no calibration grid of its own: calibrate "
                            f"{cal.reuses if cal else 'a calibrated method'} instead")
    if grid is not None:
        cal = Calibration(grid={k: tuple(v) for k, v in grid.items()}, search=cal.search,
                          stage1_prompts=cal.stage1_prompts, keep=cal.keep)
    _refuse_benchmark_prompts(rt, prepared, prompts_ids if held_out_ids is None else held_out_ids, prompt_texts,
                              family, f"{method_id} calibration")
    ids = [list(p) for p in prompts_ids]

    def build(setting: dict):
        return info.build(rt, prepared, **setting)

    if cal.search == "halving":
        # stage 1 on a quarter of the decodes at least: the replay gives many short decodes where the prompts gave few
        first = stage1_prompts or max(cal.stage1_prompts, len(ids) // 4)
        out = successive_halving(rt, ids, tokens, cal.settings(), build, width, repeats=repeats,
                                 stage1_prompts=first, keep=cal.keep, **kw)
    else:
        out = calibrate(rt, ids, tokens, cal.settings(), build, width, repeats=repeats, **kw)
    return {**out, "selected_options": dict(out["selected"])}
