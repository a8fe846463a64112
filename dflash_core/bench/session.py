"""The benchmark session, built once per pytest session: it loads the target, verifies (or prepares) the
artifacts, encodes the held-out benchmark prompts, computes the greedy outputs, measures the target's
component costs and runs every calibration on the calibration prompts only. It also builds the lab section of
benchmark.json, the only thing the report builder reads of the session."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from ..errors import ArtifactError
from ..methods import calibrated, speculative_ids
from ..options import env_value
from ..prepare.pipeline import PrepareConfig, family_for, load_prepared, prepare
from ..runtime.decode import greedy
from ..runtime.device import torch_threads
from ..runtime.numerics import pin_exact
from ..runtime.target import load_target
from ..store.data import check_disjoint, load_prompts
from ..store.prompt_file import read_prompt_file
from .budget import LADDER, MatrixCosts, plan_matrix
from .calibration import (
    auto_widths,
    calibrate_all,
    calibrate_own_widths,
    calibration_context,
    dflash_table,
    method_widths,
    ranking_width,
)
from .config import BUDGETED, BenchConfig, check_widths_fit
from .peers import REFERENCES, VERIFY_CURVE_CALLS
from .reuse import apply_reused, load_reused
from .state import BenchSession
from .userprompts import check_user_prompts

log = logging.getLogger(__name__)


def open_session(cfg: BenchConfig) -> BenchSession:
    """Load, prepare, encode, reference and calibrate. Calibration never sees benchmark prompts.

    Runs with `cfg.threads` torch threads and restores the caller's count (the measure_* functions set it
    again for their own work), so opening a session changes nothing outside it.
    """
    cfg = cfg.sized()
    with torch_threads(cfg.threads):
        return _open(cfg)


def _open(cfg: BenchConfig) -> BenchSession:
    # A hub revision reaches the child pytest of `bench` as DFLASH_REVISION (it has no pytest option).
    where = {"revision": rev} if (rev := env_value("revision")) else {}
    # `bench` prepared (and verified) the artifacts just before starting this pytest and says where: the target is
    # then loaded once, here, and `load_prepared` still checks every file against the manifest; a direct pytest run
    # prepares first (built on CPU float32 whatever the benchmark's device)
    handed = env_value("prepared")
    if not handed:
        prepare(cfg.target, progress=False, drafter=cfg.drafter, **where)
    started = time.perf_counter()  # the benchmark's budget counts from here (prepare not included)
    if cfg.device.startswith("cuda"):
        pin_exact()  # TF32 and reduced-precision reductions off: every case's exactness check reads these logits
    rt = load_target(cfg.target, cfg.device, cfg.dtype, kernels=cfg.kernels, **where)
    cfg = cfg.sized_for(rt.info.get("parameters"))  # a real target: the real-target defaults (bench.config)
    if cfg.resized:
        log.info("target of %s parameters: real-target benchmark size for %s, the matrix sized to %g min after "
                 "calibration (--bench-size full keeps the table's defaults)", f"{rt.info.get('parameters'):,}",
                 ", ".join(f"{k}={getattr(cfg, k)}" for k in cfg.resized), cfg.bench_budget)
    prepared = load_prepared(rt, drafter=cfg.drafter)
    if handed and prepared.directory.resolve() != Path(handed).resolve():
        raise ArtifactError(f"DFLASH_PREPARED names {handed}, but this target's artifacts are {prepared.directory}: "
                            "unset DFLASH_PREPARED (only `bench` sets it, for its own child pytest)")
    check_widths_fit(cfg.calibration_widths, int(prepared.drafter.cfg.block_size), "--bench-widths")
    family = family_for(rt, PrepareConfig())
    ps = load_prompts(family)
    check_disjoint({"train": ps.train, "calibration": ps.calibration, "benchmark": ps.benchmark})
    bench_prompts, bench_tasks, source = ps.benchmark, ps.benchmark_tasks, {"source": f"shipped:{family}"}
    if cfg.prompts_file:  # the user's prompts replace the family's, once checked as held out
        pf = read_prompt_file(cfg.prompts_file)
        source = {"source": "file", **check_user_prompts(rt, prepared, ps, pf)}
        bench_prompts, bench_tasks = pf.prompts, pf.tasks
    sess = BenchSession(cfg, rt, prepared, family, [], [], [], [])
    sess.prompt_source = source
    reused = None
    if cfg.calibration_from:
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
        sess.ranking_width = ranking_width(sess, sess.calibration_widths(), ctx)
    if cfg.tune or any(m.id not in sess.width_options for m in calibrated()):
        calibrate_all(sess, cal_texts, ctx)
    if not cfg.smoke:  # each method's own width (the smoke run measures the block size alone)
        auto = sess.choice_source == "auto"
        method_widths(sess, ctx, auto)
        calibrate_own_widths(sess, cal_texts, ctx)
    if cfg.budgeted_size:  # the matrix's size from what calibration measured, in what is left of the budget
        lens = [len(rt.encode(p)) for p in bench_prompts[:max(p for p, _, _ in LADDER)]]
        sess.size_plan = ({"chosen": reused.size, "reused_from": reused.source} if reused and reused.size else
                          size_matrix(sess, ctx, cfg.bench_budget * 60.0 - (time.perf_counter() - started), lens))
        sess.cfg = cfg = cfg.budgeted(sess.size_plan["chosen"])
    # the benchmark prompts and their greedy references, at the matrix's size (calibration never sees them)
    sess.prompts = list(bench_prompts[: cfg.prompt_limit])
    sess.prompt_tasks = list(bench_tasks[: cfg.prompt_limit])
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
    widths = sess.calibration_widths() or [sess.block_size]
    extra = tuple(w for _, w in sess.own_width_cases())
    rows = {r["width"]: r for r in (sess.width_choice or {}).get("table", [])}
    missing = [w for w in sorted({*widths, *extra}) if w not in rows]
    rows.update({r["setting"]["width"]: {"model_speedup": r["model_speedup"]}
                 for r in (dflash_table(sess, missing, ctx) if missing else [])})
    cc, B = sess.calibration_costs, sess.block_size
    t = float(cc.t_decode)
    costs = MatrixCosts(t_greedy=t, t_spec={w: t / max(float(rows[w]["model_speedup"]), 1e-6)
                                            for w in sorted({*widths, *extra})},
                        t_row=float(cc.t_verify[B]) / (B + 1), prompt_lens=tuple(prompt_lens),
                        t_fixed=VERIFY_CURVE_CALLS * float(sum(cc.t_verify[1:B + 1])))
    sess.matrix_costs = costs
    c = sess.cfg
    plan = plan_matrix(costs, budget_s, fixed={k: getattr(c, k) for k in BUDGETED if k in c.explicit},
                       caps={k: getattr(c, k) for k in BUDGETED}, rank_rounds=c.rank_rounds,
                       methods=len(speculative_ids()), widths=widths, ranking_width=sess.ranking_width,
                       references=(len(REFERENCES) + len({*widths, *extra})) if c.peer_rows else 0,
                       extra_widths=extra)
    ch = plan["chosen"]
    (log.info if plan["fits"] else log.warning)(
        "benchmark matrix sized to the %.1f min left of --bench-budget %s: %d prompt(s) x %d tokens, %d base "
        "round(s), %d ranking rounds at width(s) %s, projected %.1f min%s", budget_s / 60, c.bench_budget,
        ch["prompt_limit"], ch["tokens"], ch["rounds"], c.rank_rounds, ",".join(map(str, widths)),
        plan["tried"][-1]["projected_seconds"] / 60, "" if plan["fits"] else " (the smallest size: over budget)")
    return {**plan, "t_greedy": t, "t_spec": {str(w): v for w, v in costs.t_spec.items()}}
