"""The benchmark session, built once per pytest session: it loads the target, verifies (or prepares) the
artifacts, encodes the held-out benchmark prompts, computes the greedy outputs, measures the target's
component costs and runs every calibration on the calibration prompts only. It also builds the lab section of
benchmark.json, the only thing the report builder reads of the session."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from ..methods import calibrated
from ..options import env_value
from ..runtime.decode import greedy
from ..runtime.device import torch_threads
from .budget import LADDER
from .calibration import auto_widths, calibrate_all, calibration_context, calibration_widths, ranking_width
from .config import BenchConfig

log = logging.getLogger(__name__)


@dataclass
class BenchSession:
    cfg: BenchConfig
    rt: Any
    prepared: Any
    family: str
    prompts: list[str]
    prompt_ids: list[list[int]]
    greedy_outputs: list[list[int]]  # each benchmark prompt's greedy continuation: what exactness compares with
    margins: list[list[float]]
    calibration: dict = field(default_factory=dict)  # method -> calibration record (with "selected")
    options: dict = field(default_factory=dict)  # method -> proposer options chosen by calibration
    tuned_widths: dict = field(default_factory=dict)
    traces: dict = field(default_factory=dict)  # "<method>-w<width>" -> first prompt's verify rounds
    cases: dict = field(default_factory=dict)  # method -> widths measured (normal: [0])
    case_rounds: dict = field(default_factory=dict)  # "<method>-w<width>" -> CaseRounds (what the schedule extends)
    matrix_started: float | None = None  # perf_counter at the first measured case
    ranking_width: int | None = None  # chosen on calibration prompts before any case (calibration.ranking_width)
    ranking: dict | None = None  # schedule.run_ranking's record, once it ran
    bench_widths: list[int] = field(default_factory=list)  # the widths auto_widths chose (--bench-widths auto)
    width_choice: dict | None = None  # auto_widths' record: its cost-model table per width and the rule
    passes: dict | None = None  # run_passes' record: the base rounds after the first, round-robin over the cases
    width_options: dict = field(default_factory=dict)  # method -> {width: options calibrated at that width}
    choice_source: str = "auto"  # where the widths and options came from: auto, given, smoke or reused (chosen)
    calibration_costs: Any = None  # costmodel.ComponentCosts timed in the loop on calibration prompts
    size_plan: dict | None = None  # a real target's matrix size chosen to fit the budget (size_matrix)

    def options_for(self, method: str, width: int) -> dict:
        """The options calibrated at `width`; at an uncalibrated width those of the nearest calibrated one
        (the lower on a tie); a method calibrated at no width: `options` (its default: none)."""
        per = self.width_options.get(method) or {}
        if not per:
            return dict(self.options.get(method, {}))
        w = min(per, key=lambda c: (abs(c - width), c))
        return dict(per[w])

    @property
    def block_size(self) -> int:
        return int(self.prepared.drafter.cfg.block_size)

    def record_case(self, method: str, width: int, trace: list) -> None:
        """A measured case: its width joins the method's widths and its first 16 rounds become its trace."""
        ws = self.cases.setdefault(method, [])
        if width not in ws:
            ws.append(width)
            ws.sort()
        self.traces[f"{method}-w{width}"] = trace[:16]

    def widths(self) -> list[int]:
        """Every width a case was measured at (0 for normal), ascending."""
        return sorted({w for ws in self.cases.values() for w in ws})

    def token_text(self) -> dict[str, str]:
        """id -> its text, for the ids in the recorded traces (the explorer shows text, not bare ids)."""
        if getattr(self.rt, "tokenizer", None) is None:
            return {}
        ids = {int(t) for tr in self.traces.values() for r in tr for t in [*r["draft"], r["token"]]}
        return {str(i): self.rt.decode([i]) for i in sorted(ids)}

    def chosen(self) -> dict:
        """The widths and calibrated options this run chose (or reused), as `--calibration-from` reads them back:
        a later run that reuses them measures the same cases, which the gate and pooling require (report.match)."""
        from .calibration import calibration_widths

        return {"widths": calibration_widths(self), "source": self.choice_source, "ranking_width": self.ranking_width,
                "options": {mid: {str(w): dict(o) for w, o in per.items()} for mid, per in self.width_options.items()}}

    def cost_model_section(self) -> dict:
        """The cost model's constants and the target costs it used (costmodel), as plain data."""
        from .costmodel import OBJECTIVE, RATIO_BAND

        return {"objective": OBJECTIVE, "quiet_noise": self.cfg.noise_threshold, "ratio_band": list(RATIO_BAND),
                "source": "loop", "calibration_costs": self.calibration_costs.to_dict()
                if self.calibration_costs is not None else None}

    def lab_section(self) -> dict:
        """The `dflash` section of the saved benchmark JSON: settings, target, provenance, calibration,
        traces and the method registry, as plain data (the report builder reads nothing else of the session)."""
        from ..methods import METHODS
        from ..prepare.artifacts import target_identity, versions

        man = self.prepared.manifest
        return {
            "settings": {**self.cfg.to_dict(), "widths": self.widths(), "block_size": self.block_size,
                         "base_rounds_schedule": self.passes, "width_choice": self.width_choice,
                         "ranking_width": self.ranking_width, "chosen": self.chosen(), "size_plan": self.size_plan},
            "target": {**target_identity(self.rt), "dtype": str(self.rt.dtype).replace("torch.", ""),
                       "kernels": self.rt.kernels, "source": self.rt.source,
                       "mini_seed": (getattr(self.rt, "info", None) or {}).get("mini_seed")},
            "provenance": {"versions": versions(), "seeds": man.get("seeds"),
                           "artifacts": {"directory": str(self.prepared.directory), "files": man.get("files"),
                                         "created_utc": man.get("created_utc")},
                           "drafter": {k: man.get("drafter", {}).get(k) for k in (
                               "config", "parameters", "final_loss", "heldout_position_accuracy",
                               "train_position_accuracy", "heldout_sequences", "best_step")},
                           "fits": man.get("fits")},
            "calibration": self.calibration,
            "tuned_widths": self.tuned_widths,
            "traces": self.traces,
            # the prompt the traces continue (the first benchmark prompt): the explorer shows it before the text
            "trace_prompt": self.prompts[0] if self.prompts else None,
            "noise": {"threshold": self.cfg.noise_threshold, "figure": "robust"},
            "ranking_rounds": self.ranking,
            "cost_model": self.cost_model_section(),
            "token_text": self.token_text(),
            "methods": {mid: {"index": m.index, "label": m.label, "mechanism": m.mechanism,
                              "complexity": m.complexity, "stages": list(m.stages), "why_inactive": m.why_inactive}
                        for mid, m in METHODS.items()},
        }


def open_session(cfg: BenchConfig) -> BenchSession:
    """Load, prepare, encode, reference and calibrate. Calibration never sees benchmark prompts.

    Runs with `cfg.threads` torch threads and restores the caller's count (the measure_* functions set it
    again for their own work), so opening a session changes nothing outside it.
    """
    cfg = cfg.sized()
    with torch_threads(cfg.threads):
        return _open(cfg)


def _open(cfg: BenchConfig) -> BenchSession:
    from ..prepare.data import check_disjoint, load_prompts
    from ..prepare.pipeline import PrepareConfig, family_for, load_prepared, prepare
    from ..runtime.target import load_target

    # A hub revision reaches the child pytest of `bench` as DFLASH_REVISION (it has no pytest option).
    where = {"revision": rev} if (rev := env_value("revision")) else {}
    prepare(cfg.target, progress=False, drafter=cfg.drafter, **where)  # built on CPU float32 whatever the device
    started = time.perf_counter()  # the budget of a real target's benchmark counts from here (prepare not included)
    rt = load_target(cfg.target, cfg.device, cfg.dtype, kernels=cfg.kernels, **where)
    cfg = cfg.sized_for(rt.info.get("parameters"))  # a real target: the real-target defaults (bench.config)
    if cfg.resized:
        log.info("target of %s parameters: real-target benchmark size for %s, the matrix sized to %g min after "
                 "calibration (--bench-size full keeps the table's defaults)", f"{rt.info.get('parameters'):,}",
                 ", ".join(f"{k}={getattr(cfg, k)}" for k in cfg.resized), cfg.bench_budget)
    prepared = load_prepared(rt, drafter=cfg.drafter)
    family = family_for(rt, PrepareConfig())
    ps = load_prompts(family)
    check_disjoint({"train": ps.train, "calibration": ps.calibration, "benchmark": ps.benchmark})
    sess = BenchSession(cfg, rt, prepared, family, [], [], [], [])
    reused = None
    if cfg.calibration_from:
        from .reuse import apply_reused, load_reused

        apply_reused(sess, reused := load_reused(cfg.calibration_from))
        sess.choice_source = f"reused from {cfg.calibration_from}"
    elif cfg.calibration_widths:
        sess.choice_source = "given"
    cal_texts = list(ps.calibration[: cfg.calibration_prompt_limit])
    # once: auto_widths, the ranking width and every calibrator share it
    ctx = calibration_context(sess, cal_texts)
    if not cfg.calibration_widths and not sess.bench_widths:  # --bench-widths auto, nothing reused
        sess.choice_source = "smoke" if cfg.smoke else "auto"
        sess.bench_widths = [sess.block_size] if cfg.smoke else auto_widths(sess, cal_texts, ctx)
    if sess.ranking_width is None:  # reused runs rank at the width the reused run ranked at
        sess.ranking_width = ranking_width(sess, calibration_widths(sess), ctx)
    if cfg.tune or any(m.id not in sess.width_options for m in calibrated()):
        calibrate_all(sess, cal_texts, ctx)
    if cfg.budgeted_size:  # the matrix's size from what calibration measured, in what is left of the budget
        lens = [len(rt.encode(p)) for p in ps.benchmark[:max(p for p, _, _ in LADDER)]]
        sess.size_plan = ({"chosen": reused.size, "reused_from": reused.source} if reused and reused.size else
                          size_matrix(sess, ctx, cfg.bench_budget * 60.0 - (time.perf_counter() - started), lens))
        sess.cfg = cfg = cfg.budgeted(sess.size_plan["chosen"])
    # the benchmark prompts and their greedy references, at the matrix's size (calibration never sees them)
    sess.prompts = list(ps.benchmark[: cfg.prompt_limit])
    sess.prompt_ids = [rt.encode(p) for p in sess.prompts]
    for p in sess.prompt_ids:
        r, st = greedy(rt, p, cfg.tokens, record_margins=True)
        sess.greedy_outputs.append(r)
        sess.margins.append(st.margins)
    return sess


def size_matrix(sess: BenchSession, ctx: dict, budget_s: float, prompt_lens: list[int] = ()) -> dict:
    """bench.budget.plan_matrix on the costs calibration measured: the target's decode step in the loop, dflash's
    cost-model speedup at each benchmarked width (timed here on calibration prompts for a width the width table
    does not cover, e.g. widths given or reused), a prefill row and the verify-cost curve priced on the verify
    curve; `prompt_lens`: the benchmark prompts' lengths in order."""
    from ..methods import speculative_ids
    from .budget import MatrixCosts, plan_matrix
    from .calibration import dflash_table
    from .peers import REFERENCES, VERIFY_CURVE_CALLS

    widths = calibration_widths(sess) or [sess.block_size]
    rows = {r["width"]: r for r in (sess.width_choice or {}).get("table", [])}
    missing = [w for w in widths if w not in rows]
    rows.update({r["setting"]["width"]: {"model_speedup": r["model_speedup"]}
                 for r in (dflash_table(sess, missing, ctx) if missing else [])})
    cc, B = sess.calibration_costs, sess.block_size
    t = float(cc.t_decode)
    costs = MatrixCosts(t_greedy=t, t_spec={w: t / max(float(rows[w]["model_speedup"]), 1e-6) for w in widths},
                        t_row=float(cc.t_verify[B]) / (B + 1), prompt_lens=tuple(prompt_lens),
                        t_fixed=VERIFY_CURVE_CALLS * float(sum(cc.t_verify[1:B + 1])))
    c = sess.cfg
    plan = plan_matrix(costs, budget_s, fixed={k: getattr(c, k) for k in ("prompt_limit", "tokens", "rounds")
                                                if k in c.explicit}, rank_rounds=c.rank_rounds,
                       methods=len(speculative_ids()), widths=widths, ranking_width=sess.ranking_width,
                       references=(len(REFERENCES) + len(widths)) if c.peer_rows else 0)
    ch = plan["chosen"]
    (log.info if plan["fits"] else log.warning)(
        "benchmark matrix sized to the %.1f min left of --bench-budget %g: %d prompt(s) x %d tokens, %d base "
        "round(s), %d ranking rounds at width(s) %s, projected %.1f min%s", budget_s / 60, c.bench_budget,
        ch["prompt_limit"], ch["tokens"], ch["rounds"], c.rank_rounds, ",".join(map(str, widths)),
        plan["tried"][-1]["projected_seconds"] / 60, "" if plan["fits"] else " (the smallest size: over budget)")
    return {**plan, "t_greedy": t, "t_spec": {str(w): v for w, v in costs.t_spec.items()}}
