"""The benchmark's working parts, kept out of the pytest files so they stay small and testable.

A `BenchSession` is built once per pytest session: it loads the target, verifies (or prepares) the
artifacts, encodes the held-out benchmark prompts, computes the greedy references, and runs every
calibration on the calibration prompts only. `measure_pair` times one method against `normal` in
interleaved rounds so the speedup is paired inside the run.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from .decode import greedy, speculative
from .device import synchronize
from .exactness import classify
from .options import BENCH_FIELDS, env_value, option


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


def _median_iqr(xs: list[float]) -> tuple[float, float]:
    if not xs:
        return 0.0, 0.0
    if len(xs) == 1:
        return xs[0], 0.0
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return statistics.median(xs), q[2] - q[0]


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
    traces: dict = field(default_factory=dict)

    @property
    def block_size(self) -> int:
        return int(self.prepared.drafter.cfg.block_size)


def open_session(cfg: BenchConfig) -> BenchSession:
    """Load, prepare, encode, reference and calibrate. Calibration never sees benchmark prompts."""
    import torch

    from .data import check_disjoint, load_prompts
    from .prepare import family_for, load_prepared, prepare
    from .target import load_target

    cfg = cfg.sized()
    torch.set_num_threads(cfg.threads)
    prepare(cfg.target, progress=False)  # artifacts are built on CPU float32 whatever the benchmark device
    rt = load_target(cfg.target, cfg.device, cfg.dtype, kernels=cfg.kernels)
    prepared = load_prepared(rt)
    from .prepare import PrepareConfig

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


def summarize(sess: BenchSession, method: str, width: int, stats_rounds: list[list], normal_walls: list[float],
              method_walls: list[float], kinds: list[str]) -> dict:
    """Plain-number metrics for extra_info (no numpy scalars, no NaN)."""
    flat = [s for rnd in stats_rounds for s in rnd]
    toks = sum(s.new_tokens for s in stats_rounds[0])
    tps = [toks / w for w in method_walls if w > 0]
    ntps = [toks / w for w in normal_walls if w > 0]
    ratios = [n / m for n, m in zip(normal_walls, method_walls) if m > 0]
    sp, sp_iqr = _median_iqr(ratios)
    t_med, t_iqr = _median_iqr(tps)
    n_med, _ = _median_iqr(ntps)
    first = stats_rounds[0]
    hist = [0] * (max(len(s.accept_counts) for s in first))
    for s in first:
        for i, c in enumerate(s.accept_counts):
            hist[i] += c
    pp = [0] * max((len(s.position_proposed) for s in first), default=0)
    pa = [0] * len(pp)
    for s in first:
        for i, (p, a) in enumerate(zip(s.position_proposed, s.position_accepted)):
            pp[i] += p
            pa[i] += a
    proposed = sum(s.proposed for s in first)
    accepted = sum(s.accepted for s in first)
    calls = sum(s.target_calls for s in first)
    wall = sum(s.wall_seconds for s in flat)
    info = {
        "method": method, "device": str(sess.rt.device.type), "dtype": str(sess.rt.dtype).replace("torch.", ""),
        "width": int(width), "prompts": len(sess.prompt_ids), "tokens_per_prompt": sess.cfg.tokens,
        "rounds": len(method_walls), "new_tokens": int(toks),
        "tokens_per_second": float(t_med), "tokens_per_second_iqr": float(t_iqr),
        "normal_tokens_per_second": float(n_med),
        "speedup": float(sp), "speedup_iqr": float(sp_iqr), "speedup_rounds": [float(r) for r in ratios],
        "acceptance_rate": float(accepted / proposed) if proposed else 0.0,
        "tokens_per_target_call": float(toks / calls) if calls else 0.0,
        "target_calls": int(calls), "draft_calls": int(sum(s.draft_calls for s in first)),
        "proposed": int(proposed), "accepted": int(accepted),
        "accept_histogram": [int(x) for x in hist],
        "per_position_acceptance": [float(a / p) if p else 0.0 for a, p in zip(pa, pp)],
        "guidance_work": int(sum(s.guidance_work for s in first)),
        "target_seconds": float(sum(s.target_seconds for s in flat)),
        "draft_seconds": float(sum(s.draft_seconds for s in flat)),
        "select_seconds": float(sum(s.select_seconds for s in flat)),
        "overhead_fraction": float(sum(s.overhead_seconds for s in flat) / wall) if wall else 0.0,
        "exact": all(k != "diverged" for k in kinds), "verdicts": {k: kinds.count(k) for k in sorted(set(kinds))},
        "options": {k: v for k, v in sess.options.get(method, {}).items() if isinstance(v, (int, float, str))},
    }
    return info


def measure_pair(sess: BenchSession, method: str, width: int, rounds: int, benchmark=None) -> dict:
    """Time `method` against `normal` in `rounds` interleaved rounds (one warm-up first).

    With a pytest-benchmark fixture, the method's rounds go through `benchmark.pedantic` and normal runs
    in its untimed setup right before each round, so each round's ratio is paired.
    """
    normal_walls: list[float] = []
    method_walls: list[float] = []
    stats_rounds: list[list] = []
    outs_holder: dict = {}

    def run_normal():
        _, _, w = decode_all(sess, "normal", 0)
        normal_walls.append(w)

    def run_method_round():
        trace: list = []
        outs, stats, w = decode_all(sess, method, width, trace=trace)
        method_walls.append(w)
        stats_rounds.append(stats)
        outs_holder.setdefault("outs", outs)
        outs_holder.setdefault("trace", trace)
        synchronize(sess.rt.device)

    run_method_round()  # warm-up of the method's path, not recorded (normal runs in every case, so it is warm)
    normal_walls.clear()
    method_walls.clear()
    stats_rounds.clear()
    outs_holder.clear()
    if benchmark is not None:
        benchmark.pedantic(run_method_round, setup=run_normal, rounds=rounds, warmup_rounds=0, iterations=1)
    else:
        for _ in range(rounds):
            run_normal()
            run_method_round()
    kinds = verdicts(sess, outs_holder["outs"])
    info = summarize(sess, method, width, stats_rounds, normal_walls, method_walls, kinds)
    sess.traces[f"{method}-w{width}"] = outs_holder["trace"][:16]
    return info


# --- reference rows (not methods): peers and bounds measured in the same run -----------------------

REFERENCES = ("generate", "prompt_lookup", "assisted")


def early_exit_assistant(rt, layers: int | None = None):
    """An assistant for transformers' assisted decoding: the target's first `layers` layers + its norm/head.

    Assisted decoding needs a second model with the target's vocabulary, and no smaller LFM2 exists for
    the mini target (or for a random-weight 350M). A truncated copy of the target is the one assistant
    every target has without training (self-speculative early exit); it is a peer row, not a method.
    """
    import copy

    import torch

    n = layers if layers is not None else max(1, rt.num_layers // 2)
    m = copy.deepcopy(rt.model)
    m.model.layers = torch.nn.ModuleList(list(m.model.layers)[:n])
    m.config.num_hidden_layers = n
    m.config.layer_types = list(m.config.layer_types)[:n]
    return m.eval()


def _generate_all(sess: BenchSession, **gen_kwargs) -> tuple[list[list[int]], float]:
    import torch

    rt = sess.rt
    outs, wall = [], 0.0
    pad = rt.config.pad_token_id if rt.config.pad_token_id is not None else 0
    for p in sess.prompt_ids:
        inp = torch.tensor([p], device=rt.device)
        synchronize(rt.device)
        t0 = time.perf_counter()
        with torch.inference_mode():
            g = rt.model.generate(inp, max_new_tokens=sess.cfg.tokens, min_new_tokens=sess.cfg.tokens,
                                  do_sample=False, pad_token_id=pad, **gen_kwargs)
        synchronize(rt.device)
        wall += time.perf_counter() - t0
        outs.append(g[0, len(p):].tolist())
    return outs, wall


def reference_runner(sess: BenchSession, kind: str):
    """A callable returning (outputs, wall seconds) for one pass over the benchmark prompts."""
    if kind == "generate":
        return lambda: _generate_all(sess)
    if kind == "prompt_lookup":
        return lambda: _generate_all(sess, prompt_lookup_num_tokens=4)
    if kind == "assisted":
        assistant = early_exit_assistant(sess.rt)
        return lambda: _generate_all(sess, assistant_model=assistant)
    if kind.startswith("oracle-w"):
        from .proposers import OracleProposer

        w = int(kind[len("oracle-w"):])

        def run():
            outs, wall = [], 0.0
            for p, ref in zip(sess.prompt_ids, sess.references):
                ids, st = speculative(sess.rt, OracleProposer(p, ref, sess.rt.vocab_size), p, sess.cfg.tokens, w,
                                      method="oracle")
                outs.append(ids)
                wall += st.wall_seconds
            return outs, wall
        return run
    raise ValueError(f"unknown reference {kind!r}")


def measure_reference(sess: BenchSession, kind: str, rounds: int, benchmark=None) -> dict:
    run = reference_runner(sess, kind)
    normal_walls, ref_walls, outs_holder = [], [], {}

    def run_normal():
        normal_walls.append(decode_all(sess, "normal", 0)[2])

    def run_ref():
        outs, w = run()
        ref_walls.append(w)
        outs_holder.setdefault("outs", outs)

    run_normal()
    run_ref()
    normal_walls.clear()
    ref_walls.clear()
    outs_holder.clear()
    if benchmark is not None:
        benchmark.pedantic(run_ref, setup=run_normal, rounds=rounds, warmup_rounds=0, iterations=1)
    else:
        for _ in range(rounds):
            run_normal()
            run_ref()
    toks = sess.cfg.tokens * len(sess.prompt_ids)
    ratios = [n / r for n, r in zip(normal_walls, ref_walls) if r > 0]
    sp, sp_iqr = _median_iqr(ratios)
    tps, tps_iqr = _median_iqr([toks / w for w in ref_walls if w > 0])
    kinds = verdicts(sess, outs_holder["outs"])
    return {"reference": kind, "device": sess.rt.device.type, "tokens_per_second": float(tps),
            "tokens_per_second_iqr": float(tps_iqr), "speedup": float(sp), "speedup_iqr": float(sp_iqr),
            "speedup_rounds": [float(r) for r in ratios], "rounds": len(ref_walls),
            "exact": all(k != "diverged" for k in kinds), "verdicts": {k: kinds.count(k) for k in set(kinds)}}


def verify_cost_curve(sess: BenchSession, widths: list[int], calls: int = 12) -> dict:
    """t_verify(w) / t_decode at the first prompt's context: what a block verify costs in decode steps.

    Steady state, as inside the loop: one recording session, warmed by a verify, then each timed verify of
    `block_len` rows is rolled back whole so the context stays put (the first forward after a prefill is
    slower and would inflate both numbers).
    """
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
