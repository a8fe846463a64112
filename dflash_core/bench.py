"""The benchmark's working parts, kept out of the pytest files so they stay small and testable.

A `BenchSession` is built once per pytest session: it loads the target, verifies (or prepares) the
artifacts, encodes the held-out benchmark prompts, computes the greedy references, and runs every
calibration on the calibration prompts only. `measure_pair` times one method against `normal` in
interleaved rounds so the speedup is paired inside the run; `measure_reference` does the same for the
reference rows of dflash_core.references. The session also builds the lab section of benchmark.json.
"""

from __future__ import annotations

import statistics
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
    calibration_repeats: int = 2
    threads: int = _default("threads")
    seed: int = _default("seed")
    noise_threshold: float = _default("noise_threshold")
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
                       calibration_repeats=1)

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

    def lab_section(self) -> dict:
        """The `dflash` section of the saved benchmark JSON: settings, target, provenance, calibration,
        traces and the method registry, as plain data (the report builder reads nothing else of the session)."""
        from .artifacts import target_identity, versions
        from .methods import METHODS

        man = self.prepared.manifest
        return {
            "settings": {**self.cfg.to_dict(), "widths": self.widths(), "block_size": self.block_size},
            "target": {**target_identity(self.rt), "dtype": str(self.rt.dtype).replace("torch.", ""),
                       "kernels": self.rt.kernels, "source": self.rt.source},
            "provenance": {"versions": versions(), "seeds": man.get("seeds"),
                           "artifacts": {"directory": str(self.prepared.directory), "files": man.get("files"),
                                         "created_utc": man.get("created_utc")},
                           "drafter": {k: man.get("drafter", {}).get(k) for k in ("config", "parameters",
                                                                                   "final_loss")},
                           "fits": man.get("fits")},
            "calibration": self.calibration,
            "tuned_widths": self.tuned_widths,
            "traces": self.traces,
            "noise": {"start": self.aa_rounds.get("start", []), "end": self.aa_rounds.get("end", []),
                      "threshold": self.cfg.noise_threshold},
            "token_text": self.token_text(),
            "methods": {mid: {"index": m.index, "label": m.label, "mechanism": m.mechanism,
                              "complexity": m.complexity, "stages": list(m.stages)} for mid, m in METHODS.items()},
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
    calibrate_all(sess, list(ps.calibration[: cfg.calibration_prompt_limit]))
    return sess


def _cal_ids(sess: BenchSession, texts: list[str]) -> list[list[int]]:
    return [sess.rt.encode(t) for t in texts]


def _cal_kwargs(sess: BenchSession, texts: list[str]) -> dict:
    c = sess.cfg
    return {"tokens": c.calibration_tokens, "repeats": c.calibration_repeats, "prompt_texts": texts,
            "family": sess.family}


def _calibrator(name: str):
    """Adapter: run `calibrate.<name>` at full width on the calibration prompts; its choice becomes the options."""

    def run(sess, texts):
        from . import calibrate

        rec = getattr(calibrate, name)(sess.rt, sess.prepared, _cal_ids(sess, texts), width=sess.block_size,
                                       **_cal_kwargs(sess, texts))
        return {**rec, "selected_options": dict(rec["selected"])}

    return run


# method id -> function(session, calibration prompt texts) -> record with "selected_options"
CALIBRATORS: dict[str, Any] = {"act": _calibrator("calibrate_act"), "dspark_lite": _calibrator("calibrate_dspark"),
                               "boltzmann_v10": _calibrator("calibrate_v10"),
                               "gated_mobs_v11": _calibrator("calibrate_v11")}


def calibrate_all(sess: BenchSession, cal_texts: list[str]) -> None:
    from .data import refuse_benchmark

    refuse_benchmark(cal_texts, sess.family, "calibration")
    for mid, fn in CALIBRATORS.items():
        t0 = time.perf_counter()
        rec = fn(sess, cal_texts)
        rec["seconds"] = time.perf_counter() - t0
        sess.calibration[mid] = rec
        sess.options[mid] = dict(rec.get("selected_options", rec.get("selected", {})))
    if "boltzmann_v10" in sess.calibration:  # V13 reuses V10's choice (T, cutoff, slope; budget fixed to 1)
        v13 = sess.calibration["boltzmann_v10"]["v13"]
        sess.options["minop_v13"] = dict(v13["options"])
        sess.calibration["minop_v13"] = {"reuses": "boltzmann_v10", **v13}
    if sess.cfg.tune:
        tune_widths(sess, cal_texts)


def tune_widths(sess: BenchSession, cal_texts: list[str]) -> None:
    """--tune: each speculative method's width among 1, 2, 4 (<= B), chosen on calibration prompts."""
    from .calibrate import calibrate
    from .methods import get_method, speculative_ids

    ids = _cal_ids(sess, cal_texts)
    widths = sorted({min(w, sess.block_size) for w in (1, 2, 4)})
    for mid in speculative_ids():
        info = get_method(mid)
        opts = sess.options.get(mid, {})
        rows = []
        for w in widths:
            rec = calibrate(sess.rt, ids, sess.cfg.calibration_tokens, [{"width": w}],
                            lambda s, info=info, opts=opts: info.build(sess.rt, sess.prepared, **opts), w,
                            repeats=sess.cfg.calibration_repeats)
            rows.append(rec["table"][0])
        exact = [r for r in rows if r["all_exact"]]
        best = max(exact, key=lambda r: (r["tokens_per_second_median"], -r["setting"]["width"]))
        sess.tuned_widths[mid] = {"selected": best["setting"]["width"], "table": rows}


def decode_all(sess: BenchSession, method: str, width: int, trace: list | None = None):
    """Decode every benchmark prompt once; returns (outputs, stats list, wall seconds summed)."""
    from .runner import run_method

    outs, stats = [], []
    for i, p in enumerate(sess.prompt_ids):
        ids, st = run_method(method, sess.rt, sess.prepared, p, sess.cfg.tokens, width if method != "normal" else None,
                             trace=trace if i == 0 else None, **sess.options.get(method, {}))
        outs.append(ids)
        stats.append(st)
    return outs, stats, sum(s.wall_seconds for s in stats)


def verdicts(sess: BenchSession, outs: list[list[int]]) -> list[str]:
    return [classify(o, r, m, sess.rt.dtype).kind for o, r, m in zip(outs, sess.references, sess.margins)]


def _verdict_fields(kinds: list[str]) -> dict:
    return {"exact": all(k != "diverged" for k in kinds), "verdicts": {k: kinds.count(k) for k in sorted(set(kinds))}}


@dataclass
class PairedRounds:
    """What `paired_rounds` measured: round i's `walls[i]` ran right after `normal_walls[i]`."""

    normal_walls: list[float]
    walls: list[float]
    results: list  # what each timed round's runner returned beside its wall seconds

    def figures(self, tokens: int) -> dict:
        """Speedup (per-round normal/candidate ratios) and tokens/s, each as median and IQR."""
        ratios = [n / m for n, m in zip(self.normal_walls, self.walls) if m > 0]
        sp, sp_iqr = median_iqr(ratios)
        tps, tps_iqr = median_iqr([tokens / w for w in self.walls if w > 0])
        return {"tokens_per_second": float(tps), "tokens_per_second_iqr": float(tps_iqr),
                "normal_tokens_per_second": float(median_iqr([tokens / w for w in self.normal_walls if w > 0])[0]),
                "speedup": float(sp), "speedup_iqr": float(sp_iqr), "speedup_rounds": [float(r) for r in ratios],
                "rounds": len(self.walls)}


def paired_rounds(sess: BenchSession, run, rounds: int, benchmark=None) -> PairedRounds:
    """Time `run()` (returns (wall seconds, result)) against `normal` in `rounds` interleaved rounds, after
    one untimed warm-up of `run` (normal is warm: the session's references ran it).

    With a pytest-benchmark fixture, the rounds go through `benchmark.pedantic` and normal runs in its
    untimed setup right before each round, so each round's ratio is paired.
    """
    pr = PairedRounds([], [], [])

    def run_normal():
        pr.normal_walls.append(decode_all(sess, "normal", 0)[2])

    def run_timed():
        wall, result = run()
        pr.walls.append(wall)
        pr.results.append(result)
        synchronize(sess.rt.device)

    run()
    if benchmark is not None:
        benchmark.pedantic(run_timed, setup=run_normal, rounds=rounds, warmup_rounds=0, iterations=1)
    else:
        for _ in range(rounds):
            run_normal()
            run_timed()
    return pr


def summarize(sess: BenchSession, method: str, width: int, stats_rounds: list[list], normal_walls: list[float],
              method_walls: list[float], kinds: list[str]) -> dict:
    """Plain-number metrics for extra_info (no numpy scalars, no NaN): counts from the first timed round
    (every round decodes the same ids), seconds from all rounds."""
    first = DecodeStats.merge(stats_rounds[0])
    every = DecodeStats.merge([s for rnd in stats_rounds for s in rnd])
    figs = PairedRounds(normal_walls, method_walls, []).figures(first.new_tokens)
    return {
        "method": method, "device": str(sess.rt.device.type), "dtype": str(sess.rt.dtype).replace("torch.", ""),
        "width": int(width), "prompts": len(sess.prompt_ids), "tokens_per_prompt": sess.cfg.tokens,
        "rounds": figs["rounds"], "new_tokens": int(first.new_tokens),
        **{k: figs[k] for k in ("tokens_per_second", "tokens_per_second_iqr", "normal_tokens_per_second",
                                "speedup", "speedup_iqr", "speedup_rounds")},
        "acceptance_rate": float(first.acceptance_rate),
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
        "options": {k: v for k, v in sess.options.get(method, {}).items() if isinstance(v, (int, float, str))},
    }


def measure_pair(sess: BenchSession, method: str, width: int, rounds: int, benchmark=None) -> dict:
    """Time `method` against `normal` in `rounds` paired rounds (see `paired_rounds`); records the case's
    width and trace on the session."""

    def run():
        trace: list = []
        outs, stats, wall = decode_all(sess, method, width, trace=trace)
        return wall, (outs, stats, trace)

    with torch_threads(sess.cfg.threads):
        pr = paired_rounds(sess, run, rounds, benchmark)
    outs, _, trace = pr.results[0]
    info = summarize(sess, method, width, [r[1] for r in pr.results], pr.normal_walls, pr.walls,
                     verdicts(sess, outs))
    sess.record_case(method, width, trace)
    return info


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
    rt = sess.rt
    p = sess.prompt_ids[0] + sess.references[0][: max(0, sess.cfg.tokens // 2)]
    s = rt.session(recording=True)
    s.prefill(p[:-1])

    def timed(block_len: int) -> float:
        xs = []
        for _ in range(calls):
            synchronize(rt.device)
            t0 = time.perf_counter()
            s.verify([p[-1]] * block_len)
            synchronize(rt.device)
            xs.append(time.perf_counter() - t0)
            s.rollback(block_len)
        return statistics.median(xs)

    timed(1)  # warm-up
    t1 = timed(1)
    curve = {str(w): float(timed(w + 1) / t1) for w in widths}
    return {"t_decode_seconds": float(t1), "ratio": curve, "calls_per_point": calls}
