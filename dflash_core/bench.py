"""The benchmark's working parts, kept out of the pytest files so they stay small and testable.

A `BenchSession` is built once per pytest session: it loads the target, verifies (or prepares) the
artifacts, encodes the held-out benchmark prompts, computes the greedy references, and runs every
calibration on the calibration prompts only. `measure_pair` times one method against `normal` in
interleaved rounds so the speedup is paired inside the run; `measure_reference` does the same for the
reference rows of dflash_core.references. The session also builds the lab section of benchmark.json.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from .decode import DecodeStats, greedy
from .device import synchronize, torch_threads
from .exactness import classify
from .options import BENCH_FIELDS, env_value, option
from .references import REFERENCES, reference_runner  # noqa: F401  (REFERENCES: the benchmark conftest's ids)
from .spread import median_iqr


def _default(name: str):
    return option(name).default


@dataclass(frozen=True)
class BenchConfig:
    """The benchmark's settings. Defaults, environment variables and pytest options come from `options.OPTIONS`
    (the defaults are sized so the README main command, prepare included, ends in < 20 min on 2 cores)."""

    target: str = _default("target")
    device: str = _default("device")
    dtype: str = _default("dtype")
    kernels: str = _default("kernels")  # linear-layer path for target and drafter alike (dflash_core.kernels)
    tokens: int = _default("tokens")
    prompt_limit: int = _default("prompt_limit")
    rounds: int = _default("rounds")
    calibration_tokens: int = _default("calibration_tokens")
    calibration_prompt_limit: int = _default("calibration_prompt_limit")
    calibration_repeats: int = 1  # decodes per (setting, prompt): the cost-model objective needs one
    calibration_widths: tuple[int, ...] = ()  # widths calibrated (each its own choice); (): the block size B
    threads: int = _default("threads")
    seed: int = _default("seed")
    noise_threshold: float = _default("noise_threshold")
    resolution: float = _default("resolution")  # rank groups' resolution (report.stats.rank_groups)
    race_max: int = _default("race_max")  # racing cap, a multiple of `rounds` (dflash_core.racing)
    drafter: str | None = _default("drafter")  # a transformers-format drafter instead of the trained one
    smoke: bool = False
    tune: bool = False
    references: bool = True

    @classmethod
    def from_env(cls, **explicit: Any) -> "BenchConfig":
        """Every table-backed field from its environment variable (or default); `explicit` values win."""
        kw = {name: env_value(name) for name in BENCH_FIELDS}
        kw.update({k: v for k, v in explicit.items() if v is not None})
        return cls(**kw)

    def sized(self) -> "BenchConfig":
        """--smoke: 1 prompt, 8 tokens, 1 round (and the smallest calibration)."""
        if not self.smoke:
            return self
        from dataclasses import replace

        return replace(self, tokens=8, prompt_limit=1, rounds=1, calibration_tokens=8, calibration_prompt_limit=1,
                       calibration_repeats=1, calibration_widths=tuple(self.calibration_widths))

    def to_dict(self) -> dict:
        return asdict(self)




@dataclass
class BenchSession:
    cfg: BenchConfig
    rt: Any
    prepared: Any
    family: str
    prompts: list[str]
    prompt_ids: list[list[int]]
    references: list[list[int]]
    margins: list[list[float]]
    calibration: dict = field(default_factory=dict)  # method -> calibration record (with "selected")
    options: dict = field(default_factory=dict)  # method -> proposer options chosen by calibration
    tuned_widths: dict = field(default_factory=dict)
    traces: dict = field(default_factory=dict)  # "<method>-w<width>" -> first prompt's verify rounds
    cases: dict = field(default_factory=dict)  # method -> widths measured (normal: [0])
    aa_rounds: dict = field(default_factory=dict)  # "start"/"end" -> A/A paired speedup rounds (measure_aa)
    case_rounds: dict = field(default_factory=dict)  # "<method>-w<width>" -> CaseRounds (what racing extends)
    matrix_started: float | None = None  # perf_counter at the first measured case (racing's time budget)
    race: dict | None = None  # racing.race's record, once run_race ran
    bench_widths: list[int] = field(default_factory=list)  # the widths auto_widths chose (--bench-widths auto)
    width_choice: dict | None = None  # auto_widths' record: its cost-model table per width and the rule
    passes: dict | None = None  # run_passes' record: the base rounds after the first, round-robin over the cases
    width_options: dict = field(default_factory=dict)  # method -> {width: options calibrated at that width}
    target_costs: Any = None  # costmodel.ComponentCosts at the benchmark context (session_costs)
    calibration_costs: Any = None  # the same at a calibration prompt's context (calibrate_all)

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

    def cost_model_section(self) -> dict:
        """The cost model's constants and the target costs it used (costmodel), as plain data."""
        from .costmodel import OBJECTIVE, QUIET_SPREAD, RATIO_BAND

        return {"objective": OBJECTIVE, "quiet_spread": QUIET_SPREAD, "ratio_band": list(RATIO_BAND),
                "target_costs": self.target_costs.to_dict() if self.target_costs is not None else None,
                "calibration_costs": self.calibration_costs.to_dict() if self.calibration_costs is not None
                else None}

    def lab_section(self) -> dict:
        """The `dflash` section of the saved benchmark JSON: settings, target, provenance, calibration,
        traces and the method registry, as plain data (the report builder reads nothing else of the session)."""
        from .artifacts import target_identity, versions
        from .methods import METHODS

        man = self.prepared.manifest
        return {
            "settings": {**self.cfg.to_dict(), "widths": self.widths(), "block_size": self.block_size,
                         "base_rounds_schedule": self.passes, "width_choice": self.width_choice},
            "target": {**target_identity(self.rt), "dtype": str(self.rt.dtype).replace("torch.", ""),
                       "kernels": self.rt.kernels, "source": self.rt.source},
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
            "noise": {"start": self.aa_rounds.get("start", []), "end": self.aa_rounds.get("end", []),
                      "threshold": self.cfg.noise_threshold},
            "race": self.race,
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
    from .data import check_disjoint, load_prompts
    from .prepare import PrepareConfig, family_for, load_prepared, prepare
    from .target import load_target

    # A hub revision reaches the child pytest of `bench` as DFLASH_REVISION (it has no pytest option).
    where = {"revision": rev} if (rev := env_value("revision")) else {}
    prepare(cfg.target, progress=False, drafter=cfg.drafter, **where)  # built on CPU float32 whatever the device
    rt = load_target(cfg.target, cfg.device, cfg.dtype, kernels=cfg.kernels, **where)
    prepared = load_prepared(rt, drafter=cfg.drafter)
    family = family_for(rt, PrepareConfig())
    ps = load_prompts(family)
    check_disjoint({"train": ps.train, "calibration": ps.calibration, "benchmark": ps.benchmark})
    prompts = list(ps.benchmark[: cfg.prompt_limit])
    ids = [rt.encode(p) for p in prompts]
    refs, margins = [], []
    for p in ids:
        r, st = greedy(rt, p, cfg.tokens, record_margins=True)
        refs.append(r)
        margins.append(st.margins)
    sess = BenchSession(cfg, rt, prepared, family, prompts, ids, refs, margins)
    session_costs(sess)
    cal_texts = list(ps.calibration[: cfg.calibration_prompt_limit])
    ctx = calibration_context(sess, cal_texts)  # once: auto_widths and every calibrator share it
    if not cfg.calibration_widths:  # --bench-widths auto
        sess.bench_widths = [sess.block_size] if cfg.smoke else auto_widths(sess, cal_texts, ctx)
    calibrate_all(sess, cal_texts, ctx)
    return sess


def auto_widths(sess: BenchSession, cal_texts: list[str], ctx: dict | None = None) -> list[int]:
    """The default verify widths (`--bench-widths auto`), read off the measured verify-cost curve.

    On calibration prompts (never benchmark ones), plain dflash is decoded at every width 1..B and each width
    priced by the cost model (`calibrate`: the session's measured t_verify(w) curve, the drafter's timed costs,
    the deterministic accepted counts), the noise-free objective of issue 14. The widths are the best width and
    the best of those at most half of it (the scaling a reader wants to see), so the curve of the machine, not a
    fixed list, decides: on a CPU where verify cost grows with the width they come out small, on a GPU where
    it is flat up to B they come out large. The table is kept in `width_choice` (benchmark.json settings).
    `ctx`: the session's `calibration_context` (built here when None)."""
    from .calibrate import calibrate
    from .costmodel import OBJECTIVE, choose
    from .methods import get_method

    ctx = ctx or calibration_context(sess, cal_texts)
    ids, refs = ctx["ids"], ctx["refs"]
    info = get_method("dflash")
    rows = []
    for w in range(1, sess.block_size + 1):
        rec = calibrate(sess.rt, ids, sess.cfg.calibration_tokens, [{"width": w}],
                        lambda s: info.build(sess.rt, sess.prepared), w, repeats=1, costs=sess.calibration_costs,
                        refs=refs)
        rows.append(rec["table"][0])
    best = rows[choose(rows)]["setting"]["width"]
    low = [r for r in rows if r["setting"]["width"] <= best // 2]
    widths = sorted({best, *([low[choose(low)]["setting"]["width"]] if low else [])})
    c = sess.calibration_costs
    sess.width_choice = {
        "objective": OBJECTIVE, "method": "dflash", "selected": widths,
        "rule": "the width with the best cost-model speedup, and the best of the widths at most half of it",
        "verify_over_decode": {str(w): float(c.t_verify[w] / c.t_decode) for w in range(1, sess.block_size + 1)},
        "table": [{"width": r["setting"]["width"], "model_speedup": r["model_speedup"],
                   "tokens_per_target_call": r["tokens_per_target_call"]} for r in rows]}
    return widths


def _cal_ids(sess: BenchSession, texts: list[str]) -> list[list[int]]:
    return [sess.rt.encode(t) for t in texts]


def _cal_kwargs(sess: BenchSession, texts: list[str]) -> dict:
    c = sess.cfg
    return {"tokens": c.calibration_tokens, "repeats": c.calibration_repeats, "prompt_texts": texts,
            "family": sess.family}


def _calibrator(name: str, **extra: Any):
    """Adapter: run `calibrate.<name>` at `width` on the calibration prompts (`ctx`: their ids, greedy
    references and the target's component costs, shared by every calibrator); its choice becomes the options."""

    def run(sess, texts, width, ctx):
        from . import calibrate

        rec = getattr(calibrate, name)(sess.rt, sess.prepared, ctx["ids"], width=width, costs=ctx["costs"],
                                       refs=ctx["refs"], **_cal_kwargs(sess, texts), **extra)
        return {**rec, "selected_options": dict(rec["selected"])}

    return run


def calibration_widths(sess: BenchSession) -> list[int]:
    """The widths calibrated: the benchmarked ones (given, else chosen by `auto_widths`) that fit the block size
    (the bench fixture refuses the others), else B alone."""
    given = sess.cfg.calibration_widths or tuple(sess.bench_widths)
    ws = sorted({int(w) for w in given if 1 <= int(w) <= sess.block_size})
    return ws or [sess.block_size]


def session_costs(sess: BenchSession):
    """The target's component costs at the benchmark context (first prompt plus half its reference, as
    `verify_cost_curve`), with the mean prefill of the benchmark prompts; measured once per session."""
    from .costmodel import target_costs

    if sess.target_costs is None:
        with torch_threads(sess.cfg.threads):
            ctx = sess.prompt_ids[0] + sess.references[0][: max(0, sess.cfg.tokens // 2)]
            sess.target_costs = target_costs(sess.rt, ctx, sess.block_size, sess.prompt_ids)
    return sess.target_costs


# method id -> function(session, calibration prompt texts, width, shared context) -> record with "selected_options"
# V10/V11 screen their grids on one prompt (stage 1) before all prompts decide (stage 2, reusing the stage-1
# decodes): with one deterministic decode per setting instead of two tok/s trials, a default bench's calibration,
# now run at each of its 3 widths, stays within the decodes the single-width calibration used (318 vs 324).
CALIBRATORS: dict[str, Any] = {"act": _calibrator("calibrate_act"), "dspark_lite": _calibrator("calibrate_dspark"),
                               "boltzmann_v10": _calibrator("calibrate_v10", stage1_prompts=1),
                               "gated_mobs_v11": _calibrator("calibrate_v11", stage1_prompts=1)}


def calibration_context(sess: BenchSession, cal_texts: list[str]) -> dict:
    """What every calibration shares: the calibration prompts' ids, their greedy references and the target's
    component costs at a calibration context (calibration never times benchmark prompts); the costs are
    measured once per session. Refuses calibration prompts that share an n-gram with a benchmark prompt."""
    from .costmodel import target_costs
    from .data import refuse_benchmark

    refuse_benchmark(cal_texts, sess.family, "calibration")
    ids = _cal_ids(sess, cal_texts)
    tokens = sess.cfg.calibration_tokens
    refs = [greedy(sess.rt, p, tokens)[0] for p in ids]
    if sess.calibration_costs is None:
        sess.calibration_costs = target_costs(sess.rt, ids[0] + refs[0][: max(0, tokens // 2)], sess.block_size)
    return {"ids": ids, "refs": refs, "costs": sess.calibration_costs}


def calibrate_all(sess: BenchSession, cal_texts: list[str], ctx: dict | None = None) -> None:
    """Every calibrator at every calibrated width; `ctx`: the session's `calibration_context` (built when None)."""
    from .costmodel import OBJECTIVE

    ctx = ctx or calibration_context(sess, cal_texts)
    widths = calibration_widths(sess)
    for mid, fn in CALIBRATORS.items():
        t0 = time.perf_counter()
        per = {w: fn(sess, cal_texts, w, ctx) for w in widths}
        sess.width_options[mid] = {w: dict(r.get("selected_options", r.get("selected", {}))) for w, r in per.items()}
        top = per[widths[-1]]
        sess.calibration[mid] = {"objective": OBJECTIVE, "selected": top["selected"],
                                 "selected_options": dict(sess.width_options[mid][widths[-1]]),
                                 "widths": {str(w): r for w, r in per.items()}, "seconds": time.perf_counter() - t0}
        sess.options[mid] = dict(sess.width_options[mid][widths[-1]])
    if "boltzmann_v10" in sess.calibration:  # V13 reuses V10's choice (T, cutoff, slope; budget fixed to 1)
        v10 = sess.calibration["boltzmann_v10"]
        per13 = {w: v10["widths"][str(w)]["v13"] for w in widths if "v13" in v10["widths"].get(str(w), {})}
        if per13:
            sess.width_options["minop_v13"] = {w: dict(v["options"]) for w, v in per13.items()}
            top = per13[max(per13)]
            sess.options["minop_v13"] = dict(top["options"])
            sess.calibration["minop_v13"] = {"reuses": "boltzmann_v10", "objective": OBJECTIVE, **top,
                                             "widths": {str(w): v for w, v in per13.items()}}
    if sess.cfg.tune:
        tune_widths(sess, cal_texts)


def tune_widths(sess: BenchSession, cal_texts: list[str]) -> None:
    """--tune: each speculative method's width among 1, 2, 4 (<= B), chosen on calibration prompts by the
    calibration objective (costmodel.choose: cost-model speedup, ties to tokens per target call, then the
    smaller width), with the options calibrated nearest that width."""
    from .calibrate import calibrate
    from .costmodel import OBJECTIVE, choose
    from .methods import get_method, speculative_ids

    ids = _cal_ids(sess, cal_texts)
    refs = [greedy(sess.rt, p, sess.cfg.calibration_tokens)[0] for p in ids]
    widths = sorted({min(w, sess.block_size) for w in (1, 2, 4)})
    for mid in speculative_ids():
        info = get_method(mid)
        rows = []
        for w in widths:
            opts = sess.options_for(mid, w)
            rec = calibrate(sess.rt, ids, sess.cfg.calibration_tokens, [{"width": w}],
                            lambda s, info=info, opts=opts: info.build(sess.rt, sess.prepared, **opts), w,
                            repeats=sess.cfg.calibration_repeats, costs=sess.calibration_costs, refs=refs)
            rows.append(rec["table"][0])
        best = rows[choose(rows)]
        sess.tuned_widths[mid] = {"selected": best["setting"]["width"], "table": rows, "objective": OBJECTIVE}


def decode_all(sess: BenchSession, method: str, width: int, trace: list | None = None,
               rounds: list | None = None):
    """Decode every benchmark prompt once with the options calibrated for `width`; returns (outputs, stats list,
    wall seconds summed). `trace` receives the first prompt's verify rounds, `rounds` one round list per prompt."""
    from .runner import run_method

    outs, stats = [], []
    opts = sess.options_for(method, width) if method != "normal" else {}
    for i, p in enumerate(sess.prompt_ids):
        tr = [] if rounds is not None else (trace if i == 0 else None)
        ids, st = run_method(method, sess.rt, sess.prepared, p, sess.cfg.tokens, width if method != "normal" else None,
                             trace=tr, **opts)
        if rounds is not None:
            rounds.append(tr)
            if i == 0 and trace is not None:
                trace.extend(tr)
        outs.append(ids)
        stats.append(st)
    return outs, stats, sum(s.wall_seconds for s in stats)


def verdicts(sess: BenchSession, outs: list[list[int]]) -> list[str]:
    return [classify(o, r, m, sess.rt.dtype).kind for o, r, m in zip(outs, sess.references, sess.margins)]


def _verdict_fields(kinds: list[str]) -> dict:
    return {"exact": all(k != "diverged" for k in kinds), "verdicts": {k: kinds.count(k) for k in sorted(set(kinds))}}


@dataclass
class PairedRounds:
    """What `paired_rounds` measured: round i's `walls[i]` ran right after `normal_walls[i]` (and, for a
    speculative case, right after `baseline_walls[i]`: plain dflash at the same width, `comparison_rounds`)."""

    normal_walls: list[float]
    walls: list[float]
    results: list  # what each timed round's runner returned beside its wall seconds
    baseline_walls: list[float] = field(default_factory=list)

    def figures(self, tokens: int) -> dict:
        """Speedup (per-round normal/candidate ratios) and tokens/s, each as median and IQR."""
        ratios = [n / m for n, m in zip(self.normal_walls, self.walls) if m > 0]
        sp, sp_iqr = median_iqr(ratios)
        tps, tps_iqr = median_iqr([tokens / w for w in self.walls if w > 0])
        return {"tokens_per_second": float(tps), "tokens_per_second_iqr": float(tps_iqr),
                "normal_tokens_per_second": float(median_iqr([tokens / w for w in self.normal_walls if w > 0])[0]),
                "speedup": float(sp), "speedup_iqr": float(sp_iqr), "speedup_rounds": [float(r) for r in ratios],
                "rounds": len(ratios)}  # the rounds paired with normal (a case's later rounds may have no normal leg)


BASELINE = "dflash"  # every speculative round also times plain dflash at its width, seconds before the method


def comparison_rounds(baseline_walls: list[float], walls: list[float]) -> list[float]:
    """Per round, baseline wall / method wall: how much faster than plain dflash at the same width the method
    ran, both timed within seconds of each other.

    Why: on the shared 2-core box the speedup over greedy switches between machine states minutes apart (a
    case's rounds came out bimodal, e.g. 2.3x and 2.8x for dflash, while rounds seconds apart agree to
    1-2 %); two speculative decodes at the same width are hit alike, so their ratio is what the rank groups
    compare. For dflash itself it is dflash against dflash: the comparison's own A/A noise."""
    return [b / m for b, m in zip(baseline_walls, walls) if m > 0]


def paired_rounds(sess: BenchSession, run, rounds: int, benchmark=None, warmup=None, baseline=None) -> PairedRounds:
    """Time `run()` (returns (wall seconds, result)) against `normal` in `rounds` interleaved rounds, after
    one untimed warm-up (`warmup()`, else `run()`; normal is warm: the session's references ran it).

    With a pytest-benchmark fixture, the rounds go through `benchmark.pedantic` and normal runs in its
    untimed setup right before each round, so each round's ratio is paired. `baseline()` (a wall in seconds), when
    given, runs in the setup too, after normal: the round's comparison leg (`comparison_rounds`).
    """
    pr = PairedRounds([], [], [])

    def run_normal():
        pr.normal_walls.append(decode_all(sess, "normal", 0)[2])
        if baseline is not None:
            pr.baseline_walls.append(baseline())

    def run_timed():
        wall, result = run()
        pr.walls.append(wall)
        pr.results.append(result)
        synchronize(sess.rt.device)

    (warmup or run)()
    if benchmark is not None:
        benchmark.pedantic(run_timed, setup=run_normal, rounds=rounds, warmup_rounds=0, iterations=1)
    else:
        for _ in range(rounds):
            run_normal()
            run_timed()
    return pr


def summarize(sess: BenchSession, method: str, width: int, stats_rounds: list[list], normal_walls: list[float],
              method_walls: list[float], kinds: list[str], baseline_walls: list[float] | None = None) -> dict:
    """Plain-number metrics for extra_info (no numpy scalars, no NaN): counts from the first timed round
    (every round decodes the same ids), seconds from all rounds."""
    first = DecodeStats.merge(stats_rounds[0])
    every = DecodeStats.merge([s for rnd in stats_rounds for s in rnd])
    # normal rounds are a prefix of the method's (the comparison-only rounds come after every base round):
    # the speedup over greedy pairs that prefix, tokens/s uses every round
    figs = PairedRounds(normal_walls, method_walls, []).figures(first.new_tokens)
    drafted = int(first.meta.get("drafted", first.proposed))  # trimming methods (ACT, DSpark) draft more
    vs = comparison_rounds(baseline_walls or [], method_walls)
    compared = {"vs_baseline_rounds": [float(x) for x in vs], "vs_baseline": float(median_iqr(vs)[0]),
                "baseline": BASELINE, "compared_rounds": len(vs)} if vs else {}
    return {**compared,
        "method": method, "device": str(sess.rt.device.type), "dtype": str(sess.rt.dtype).replace("torch.", ""),
        "width": int(width), "prompts": len(sess.prompt_ids), "tokens_per_prompt": sess.cfg.tokens,
        "rounds": figs["rounds"], "new_tokens": int(first.new_tokens),
        **{k: figs[k] for k in ("tokens_per_second", "tokens_per_second_iqr", "normal_tokens_per_second",
                                "speedup", "speedup_iqr", "speedup_rounds")},
        "acceptance_rate": float(first.acceptance_rate), "drafted": drafted,
        "acceptance_rate_drafted": float(first.accepted / drafted) if drafted else 0.0,
        "tokens_per_target_call": float(first.tokens_per_target_call),
        "target_calls": int(first.target_calls), "draft_calls": int(first.draft_calls),
        "proposed": int(first.proposed), "accepted": int(first.accepted),
        "accept_histogram": [int(x) for x in first.accept_counts],
        "per_position_acceptance": [float(x) for x in first.per_position_acceptance],
        "guidance_work": int(first.guidance_work),
        "target_seconds": float(every.target_seconds),
        "draft_seconds": float(every.draft_seconds),
        "select_seconds": float(every.select_seconds),
        "overhead_fraction": float(every.overhead_seconds / every.wall_seconds) if every.wall_seconds else 0.0,
        **_verdict_fields(kinds),
        "options": {k: v for k, v in (sess.options_for(method, width) if method != "normal" else {}).items()
                    if isinstance(v, (int, float, str))},
    }


def measure_pair(sess: BenchSession, method: str, width: int, rounds: int, benchmark=None) -> dict:
    """Time `method` against `normal` in `rounds` paired rounds (see `paired_rounds`); records the case's
    width and trace on the session, and its rounds for racing (`run_race`).

    The untimed warm-up of a speculative method is its activity decode (`activity_decode`): the method with a
    plain dflash shadow, never timed. The case's `activity` block comes from it."""
    if sess.matrix_started is None:
        sess.matrix_started = time.perf_counter()
    act: dict = {}

    def run():
        trace: list = []
        per_prompt: list = []
        outs, stats, wall = decode_all(sess, method, width, trace=trace, rounds=per_prompt)
        return wall, (outs, stats, trace, per_prompt)

    def warmup():
        act["activity"] = activity_decode(sess, method, width)

    def baseline():
        return decode_all(sess, BASELINE, width)[2]

    with torch_threads(sess.cfg.threads):
        pr = paired_rounds(sess, run, rounds, benchmark, warmup=None if method == "normal" else warmup,
                           baseline=None if method == "normal" else baseline)
        outs, _, trace, per_prompt = pr.results[0]
        kinds = verdicts(sess, outs)
        stats_rounds = [r[1] for r in pr.results]
        info = summarize(sess, method, width, stats_rounds, pr.normal_walls, pr.walls, kinds, pr.baseline_walls)
        info.update(cost_model_fields(sess, method, width, per_prompt, info["speedup"]))
    if act.get("activity") is not None:
        info["activity"] = act["activity"]
    sess.record_case(method, width, trace)
    sess.case_rounds[f"{method}-w{width}"] = CaseRounds(method, width, list(pr.normal_walls), list(pr.walls),
                                                        stats_rounds, kinds, dict(info),
                                                        _benchmark_sink(benchmark) if benchmark is not None else None,
                                                        list(pr.baseline_walls))
    return info


def activity_decode(sess: BenchSession, method: str, width: int) -> dict | None:
    """Mechanism activity of a case (DESIGN contract 9): decode every prompt once, untimed, with the method's
    proposer wrapped in `activity.Shadowed` beside a plain dflash proposer at the same context, and count
    where their drafts differ and what that did to accepted drafts (`activity.summary`). None for normal."""
    from .activity import BASELINE, Shadowed, count_rounds, summary
    from .decode import speculative
    from .methods import get_method

    info = get_method(method)
    if info.build is None:
        return None
    base = get_method(BASELINE)
    counts = None
    for p in sess.prompt_ids:
        prop = Shadowed(info.build(sess.rt, sess.prepared, **sess.options_for(method, width)),
                        base.build(sess.rt, sess.prepared, **sess.options_for(BASELINE, width)))
        ids, _ = speculative(sess.rt, prop, p, sess.cfg.tokens, width, method=method)
        counts = count_rounds(prop.rounds, ids, counts)
    return summary(method, counts or {}, info.why_inactive)


@dataclass
class CaseRounds:
    """A measured case's rounds, kept so racing can add paired rounds and recompute its figures."""

    method: str
    width: int
    normal_walls: list[float]
    walls: list[float]
    stats_rounds: list  # per round: the DecodeStats of every prompt
    kinds: list[str]  # exactness verdict per prompt
    info: dict  # the case's extra_info as measured (activity included)
    sink: Any = None  # (timer seconds, updated info) -> None: the case's pytest-benchmark record
    baseline_walls: list[float] = field(default_factory=list)  # plain dflash at this width, each round

    def speedups(self) -> list[float]:
        """Speedups over greedy: the rounds with a normal leg, which are a prefix of `walls` (`compare_round`)."""
        return [n / m for n, m in zip(self.normal_walls, self.walls) if m > 0]

    def compared(self) -> list[float]:
        """The rounds' ratios against plain dflash at the same width (`comparison_rounds`)."""
        return comparison_rounds(self.baseline_walls, self.walls)


def _benchmark_sink(benchmark):
    """Racing's extra rounds into the case's pytest-benchmark record, so the saved JSON the report is built from
    (DESIGN contract 7) holds every round: its timer reading joins `stats` and the recomputed figures replace
    `extra_info`'s. pytest-benchmark's Stats caches its figures on first read, so a fresh Stats is built."""

    def sink(seconds: float | None, info: dict) -> None:
        from pytest_benchmark.stats import Stats

        meta = getattr(benchmark, "stats", None)  # None under --benchmark-disable
        if seconds is not None and meta is not None:
            fresh = Stats()
            for x in [*meta.stats.data, seconds]:
                fresh.update(x)
            meta.stats = fresh
        benchmark.extra_info.update(info)

    return sink


def _refresh(sess: BenchSession, c: CaseRounds, seconds: float) -> None:
    """Recompute a case's figures after a round was added and pass the round to its pytest-benchmark record."""
    c.info.update(summarize(sess, c.method, c.width, c.stats_rounds, c.normal_walls, c.walls, c.kinds,
                            c.baseline_walls))
    if c.info.get("model_speedup"):  # the model is the case's own (deterministic) rounds: only the measured side moved
        from .costmodel import measured_over_model

        c.info["measured_over_model"] = float(measured_over_model(c.info["speedup"], c.info["model_speedup"]))
    if c.sink is not None:
        c.sink(seconds, c.info)


def _timed_method(sess: BenchSession, c: CaseRounds) -> float:
    """The method's leg of a round: appends its wall and stats; returns pytest-benchmark's timer reading."""
    t0 = time.perf_counter()
    _, stats, wall = decode_all(sess, c.method, c.width)
    synchronize(sess.rt.device)
    seconds = time.perf_counter() - t0  # pytest-benchmark's own timer reading of a round (perf_counter)
    c.walls.append(wall)
    c.stats_rounds.append(stats)
    return seconds


def race_round(sess: BenchSession, key: str) -> float:
    """One more paired round of case `key` (normal, the dflash leg, then the method, as `paired_rounds` pairs
    them); returns its speedup and passes the round and the recomputed figures to the case's record."""
    c = sess.case_rounds[key]
    if len(c.normal_walls) != len(c.walls):
        raise RuntimeError(f"{key}: a round with a normal leg after comparison-only rounds would misalign the "
                           "speedup pairs; run every base round before compare_round")
    with torch_threads(sess.cfg.threads):
        c.normal_walls.append(decode_all(sess, "normal", 0)[2])
        if c.method != "normal":
            c.baseline_walls.append(decode_all(sess, BASELINE, c.width)[2])
        seconds = _timed_method(sess, c)
    _refresh(sess, c, seconds)
    return c.normal_walls[-1] / c.walls[-1] if c.walls[-1] > 0 else 0.0


def compare_round(sess: BenchSession, key: str) -> float:
    """One more round of the ranking statistic for speculative case `key`: plain dflash at the case's width, then
    the method, seconds apart, and no normal leg; returns the round's ratio against dflash.

    Why no normal leg: the rank groups compare each method with dflash (`comparison_rounds`), and a greedy decode
    costs ~2.4x a speculative one on the mini target, so leaving it out buys about twice the rounds of the
    ranking statistic in the same time. The speedup over greedy keeps the base rounds that have a normal leg."""
    c = sess.case_rounds[key]
    if c.method == "normal":
        raise ValueError("compare_round is for speculative cases: normal has no dflash leg")
    with torch_threads(sess.cfg.threads):
        c.baseline_walls.append(decode_all(sess, BASELINE, c.width)[2])
        seconds = _timed_method(sess, c)
    _refresh(sess, c, seconds)
    return c.compared()[-1]


def case_keys(sess: BenchSession, *, with_normal: bool) -> list[str]:
    """The measured cases that are exact (normal, a normal-vs-normal pairing, only when `with_normal`)."""
    return [k for k, c in sess.case_rounds.items()
            if (with_normal or c.method != "normal") and all(v != "diverged" for v in c.kinds)]


def seeded_passes(pending, seed: int, step) -> int:
    """Round-robin passes: while `pending(passes done)` names cases, run `step(case)` once for each, in an order
    shuffled per pass by a generator seeded with `seed`. Returns the number of passes."""
    import random

    rng = random.Random(seed)
    done = 0
    while order := list(pending(done)):
        rng.shuffle(order)
        for k in order:
            step(k)
        done += 1
    return done


def run_passes(sess: BenchSession, passes: int, seed: int, step=None) -> dict:
    """The base rounds after each case's first, in `passes` round-robin passes over every exact case (normal
    included), each pass in its own seeded order.

    Why not all of a case's rounds back to back: on the shared 2-core box the machine's state drifts over
    minutes (the verify/decode cost ratio moved 10-15 % between runs), while rounds a few seconds apart agree
    to 1-2 %. Back-to-back rounds gave tight intervals that missed that drift, so two runs disagreed beyond
    their intervals; spread over the session, every case samples the same drift and its interval shows it.
    `step(sess, key)` runs one paired round of a case (default `race_round`)."""
    step = step or race_round
    keys = case_keys(sess, with_normal=True)
    t0 = time.perf_counter()
    passes = max(0, passes)
    seeded_passes(lambda done: list(keys) if done < passes else [], seed, lambda k: step(sess, k))
    rec = {"schedule": "round-robin", "passes": passes, "cases": len(keys),
           "seconds": time.perf_counter() - t0}
    sess.passes = rec
    return rec


def leading_width(cases: dict) -> int | None:
    """The width of the case with the highest median speedup over greedy (`report.stats.leading_width`): where the
    ranking is decided, since every method is compared there against plain dflash at that width."""
    import statistics

    from .report.stats import leading_width as lead

    return lead((statistics.median(c.speedups()), c.width) for c in cases.values() if c.speedups())


# Racing's time budget as a fraction of the base matrix's own time (its first case until the race starts, the
# round-robin passes included): half keeps the README main command under 20 min on 2 cores with prepare.
RACE_BUDGET_FRACTION = 0.5
# Before racing, every case at the leading width is topped up to this many x the base rounds of the ranking
# statistic (comparison-only rounds, round-robin). Why 4 (12 rounds by default): a case "separated" after 3 rounds
# had a bootstrap interval of about its min-max, and at 6 one outlier round still set an interval's edge, so two
# quiet runs put methods on either side of a group edge; replaying the three session-6 runs' rounds, groups of
# 12-round cases agreed between two simulated runs ~75 % of the time against ~25 % at 6 (docs/performance.md §11).
# A comparison round costs ~1 s on 2 cores, so 15 cases x 6 more rounds is ~90 s of the 20-minute budget.
RANK_MIN_FACTOR = 4


def top_up(sess: BenchSession, keys: list[str], rounds: int, seed: int, step=None) -> dict:
    """Comparison-only rounds (`compare_round`) until each of `keys` has `rounds` ratios against dflash, in
    round-robin passes in a seeded order per pass (`seeded_passes`, as `run_passes`, for the same reason: every
    case samples the machine's drift). Returns the record: `rounds`, `passes`, `added` per case, `seconds`."""
    step = step or compare_round
    t0 = time.perf_counter()
    added = {k: 0 for k in keys}

    def one(k: str) -> None:
        step(sess, k)
        added[k] += 1

    passes = seeded_passes(lambda _: [k for k in keys if len(sess.case_rounds[k].compared()) < rounds], seed, one)
    return {"rounds": rounds, "passes": passes, "added": added, "seconds": time.perf_counter() - t0}


def run_race(sess: BenchSession, clock=time.perf_counter) -> dict:
    """Rank the exact speculative cases at the leading width: top every one of them up to RANK_MIN_FACTOR x the
    base rounds of its ratio against dflash (`top_up`), then race them (`racing.race`, comparison-only rounds):
    cap `race_max` x `rounds` per case, a time budget of RACE_BUDGET_FRACTION x the base matrix's own time (from
    the first case until the race starts; the top-up is not charged to it). Each case's extra_info gets its
    `race` record; the session keeps the whole record."""
    from .racing import race

    keys = case_keys(sess, with_normal=False)
    start = sess.matrix_started if sess.matrix_started is not None else clock()
    budget = RACE_BUDGET_FRACTION * max(0.0, clock() - start)
    width = leading_width({k: sess.case_rounds[k] for k in keys})
    # The race is run on what the rank groups compare: each case against plain dflash at the leading width.
    raced = [k for k in keys if sess.case_rounds[k].width == width and sess.case_rounds[k].compared()]
    cap = sess.cfg.rounds * sess.cfg.race_max
    topped = top_up(sess, raced, min(cap, RANK_MIN_FACTOR * sess.cfg.rounds), sess.cfg.seed)
    rounds = {k: sess.case_rounds[k].compared() for k in raced}

    def step(k: str) -> float:
        return compare_round(sess, k)

    rec = race(rounds, step, sess.cfg.rounds, sess.cfg.race_max, budget, clock, resolution=sess.cfg.resolution)
    rec["width"] = width
    rec["statistic"] = "vs_baseline"
    rec["top_up"] = {k: v for k, v in topped.items() if k != "added"}
    for k in raced:
        c = sess.case_rounds[k]
        c.info["race"] = {**rec["cases"][k], "top_up_rounds": topped["added"][k]}
        if c.sink is not None:
            c.sink(None, c.info)
    sess.race = rec
    return rec


def case_costs(sess: BenchSession, method: str, width: int):
    """The case's component costs: the session's target costs and, for a speculative method, its proposer's
    per-call medians from one untimed decode of the first benchmark prompt (costmodel.TimedProposer)."""
    from .costmodel import TimedProposer
    from .decode import speculative
    from .methods import get_method

    costs = session_costs(sess)
    build = get_method(method).build
    if build is None:
        return costs
    timer = TimedProposer(build(sess.rt, sess.prepared, **sess.options_for(method, width)))
    speculative(sess.rt, timer, sess.prompt_ids[0], sess.cfg.tokens, width, method=method)
    return costs.with_proposer(timer.costs())


def cost_model_fields(sess: BenchSession, method: str, width: int, per_prompt: list, measured: float) -> dict:
    """extra_info's cost-model fields: `model_speedup` of the case's own rounds (every prompt; 1 for normal),
    `measured_over_model` (the median paired speedup over it) and the `component_costs` behind it."""
    from .costmodel import measured_over_model, model_speedup

    costs = case_costs(sess, method, width)
    model = model_speedup(per_prompt, costs) if method != "normal" else 1.0
    return {"model_speedup": float(model), "measured_over_model": float(measured_over_model(measured, model)),
            "component_costs": costs.to_dict()}


def measure_aa(sess: BenchSession, phase: str) -> list[float]:
    """The A/A noise gate's rounds: `normal` timed against `normal` with the cases' pairing (`paired_rounds`,
    `cfg.rounds` rounds). Every ratio would be 1 on a quiet machine; the report turns the start and end
    rounds into the session's noise figure (report.stats.aa_noise)."""

    def run():
        _, _, wall = decode_all(sess, "normal", 0)
        return wall, None

    with torch_threads(sess.cfg.threads):
        pr = paired_rounds(sess, run, sess.cfg.rounds)
    ratios = pr.figures(sess.cfg.tokens)["speedup_rounds"]
    sess.aa_rounds[phase] = ratios
    return ratios


def measure_reference(sess: BenchSession, kind: str, rounds: int, benchmark=None) -> dict:
    """Time reference `kind` (dflash_core.references) against `normal` in `rounds` paired rounds."""
    runner = reference_runner(sess.rt, sess.prompt_ids, sess.references, sess.cfg.tokens, kind, sess.prepared)

    def run():
        outs, wall = runner()
        return wall, outs

    with torch_threads(sess.cfg.threads):
        pr = paired_rounds(sess, run, rounds, benchmark)
    figs = pr.figures(sess.cfg.tokens * len(sess.prompt_ids))
    return {"reference": kind, "device": sess.rt.device.type,
            **{k: figs[k] for k in ("tokens_per_second", "tokens_per_second_iqr", "speedup", "speedup_iqr",
                                    "speedup_rounds", "rounds")},
            **_verdict_fields(verdicts(sess, pr.results[0]))}


def verify_cost_curve(sess: BenchSession, widths: list[int], calls: int = 12) -> dict:
    """t_verify(w) / t_decode at the first prompt's context: what a block verify costs in decode steps.

    Steady state, as inside the loop: one recording session, warmed by a verify, then each timed verify of
    `block_len` rows is rolled back whole so the context stays put (the first forward after a prefill is
    slower and would inflate both numbers).
    """
    with torch_threads(sess.cfg.threads):
        return _verify_cost_curve(sess, widths, calls)


def _verify_cost_curve(sess: BenchSession, widths: list[int], calls: int) -> dict:
    from .costmodel import verify_times

    p = sess.prompt_ids[0] + sess.references[0][: max(0, sess.cfg.tokens // 2)]
    t = verify_times(sess.rt, p, sorted({1, *(w + 1 for w in widths)}), calls)
    curve = {str(w): float(t[w + 1] / t[1]) for w in widths}
    return {"t_decode_seconds": float(t[1]), "ratio": curve, "calls_per_point": calls}
