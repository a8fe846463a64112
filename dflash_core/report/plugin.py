"""pytest plugin: turns the saved pytest-benchmark JSON into the canonical report.

Loaded by the root conftest. Every pytest_benchmark_* hook is `optionalhook=True`, so the plugin loads
even with `-p no:benchmark`. `pytest_benchmark_update_json` fires once per output (autosave and
--benchmark-json each get one), so the report is built and written only once per session.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from ..bench.budget import ACTIVITY_LEGS, REFERENCE_LEG_FACTOR, leg_seconds
from ..errors import REPORT_UNWRITTEN, DFlashError, expected_failure
from ..options import env_value
from ..progress import eta_line
from ..runtime.numerics import numerics_record

SESSION_STASH = pytest.StashKey[object]()
_WRITTEN = pytest.StashKey[bool]()


def _lab_section(config) -> dict | None:
    """The session's lab section (BenchSession.lab_section), or None when no benchmark session ran."""
    sess = config.stash.get(SESSION_STASH, None)
    return None if sess is None else sess.lab_section()


THREAD_ENV_PREFIXES = ("OMP_", "KMP_", "GOMP_", "MKL_", "DNNL_", "ONEDNN_")


def thread_env() -> dict[str, str]:
    """The environment variables that steer torch's CPU threads and kernels (sorted): timings depend on them."""
    return {k: os.environ[k] for k in sorted(os.environ) if k.startswith(THREAD_ENV_PREFIXES)}


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_machine_info(config, machine_info):
    """A stable accelerator block; volatile clock readings dropped so same-machine compares don't warn.

    The block records the OpenMP/MKL environment too: `OMP_WAIT_POLICY=PASSIVE` made a one-row SmolLM2 decode step
    1.4-2.1x slower on a 2-core Xeon (studies/2026-12-07-openmp-wait-policy/), a setting a timing must carry.
    """
    cpu = machine_info.get("cpu")
    if isinstance(cpu, dict):
        for k in [k for k in cpu if k.startswith("hz_actual")]:
            del cpu[k]
    try:
        import torch

        acc = {"torch": torch.__version__, "cuda": torch.version.cuda, "threads": torch.get_num_threads(),
               "thread_env": thread_env()}
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            acc.update(name=p.name, capability=f"{p.major}.{p.minor}", memory_gib=round(p.total_memory / 2**30, 1))
        # TF32 / reduced-precision settings in force, and on CUDA the driver, clocks and conv kernel
        acc["numerics"] = numerics_record(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
        machine_info["accelerator"] = acc
    except ImportError:
        pass


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_json(config, benchmarks, output_json):
    lab = _lab_section(config)
    if lab is None:
        return
    output_json["dflash"] = lab
    if config.stash.get(_WRITTEN, False):
        return
    config.stash[_WRITTEN] = True
    from .build import build_report  # lazy: scipy, only when a report is written
    from .write import write_report

    doc = build_report([json.loads(json.dumps(output_json, default=str))], ["this run"])
    try:
        out = write_report(doc, report_root(config))
    except (DFlashError, OSError) as exc:
        # pytest-benchmark saves the run after this hook: raising here lost the whole benchmark's saved run
        config.stash[_REPORT_FAILED] = True
        sys.stderr.write(f"dflash report not written: {expected_failure(exc)}\n")
        return
    config.stash[REPORT_PATH] = str(out)


REPORT_PATH = pytest.StashKey[str]()
_REPORT_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    """A run whose report could not be written ends with REPORT_UNWRITTEN (`bench` turns it into one error line);
    pytest-benchmark's hook wrapper has saved the run by now."""
    if session.config.stash.get(_REPORT_FAILED, False):
        session.exitstatus = REPORT_UNWRITTEN


def case_line(name: str, extra_info: dict, of: int | None = None) -> str | None:
    """One progress line per finished benchmark case (name, paired speedup, tokens per call, exactness).

    A decode case prints after its first round (its other rounds come later, in round-robin passes), so the line
    says which round it reports (`round 1 of 3`, `of` = --bench-rounds) and shows no IQR for a single round: one
    round has no spread, and `IQR 0.000` on every line read as a measured zero."""
    ex = extra_info
    if "speedup" not in ex or "exact" not in ex:
        return None
    verdict = "exact" if ex["exact"] else "DIVERGED"
    ties = (ex.get("verdicts") or {}).get("tie", 0)
    tau = f" tok/call {ex['tokens_per_target_call']:.2f}" if "tokens_per_target_call" in ex else ""
    n = len(ex["speedup_rounds"]) if isinstance(ex.get("speedup_rounds"), list) else None
    which = f"round {n} of {of}: " if n is not None and of is not None and n < of else ""
    spread = f" (IQR {ex.get('speedup_iqr', 0.0):.3f} over {n} rounds)" if n and n > 1 else ""
    return f"dflash case {name}: {which}speedup {ex['speedup']:.3f}x{spread}{tau} {verdict}" + \
        (f" ({ties} tie)" if ties else "")


def ranking_line(rec: dict | None) -> str | None:
    """One progress line after the ranking rounds: the width, the fixed rounds per case and what they cost."""
    if not rec:
        return None
    cases = rec.get("cases") or {}
    added = sum(c.get("top_up_rounds", 0) for c in cases.values())
    return (f"dflash ranking: {len(cases)} cases at width {rec.get('width')} (chosen on calibration prompts), "
            f"{rec.get('rounds')} rounds against dflash each, fixed before the run: +{added} rounds in "
            f"{rec.get('seconds', 0.0):.0f} s, legs in a seeded random order")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """`bench` shows dots for minutes otherwise: say each case's result as soon as it is measured, and where the
    whole benchmark stands (items done of all, elapsed, time left)."""
    yield
    sess = item.config.stash.get(SESSION_STASH, None)
    rounds = getattr(getattr(sess, "cfg", None), "rounds", None)
    bm = getattr(item, "funcargs", {}).get("benchmark")
    line = case_line(item.name, getattr(bm, "extra_info", None) or {}, rounds) if bm is not None else None
    if getattr(item, "originalname", None) == "test_ranking_rounds":
        line = ranking_line(getattr(sess, "ranking", None))
    tr = item.config.pluginmanager.get_plugin("terminalreporter")
    overall = item.config.stash.get(OVERALL, None)
    if tr is None:
        return
    if line:
        tr.write_line(line)
    if overall is not None and item.nodeid in overall.weights:
        tr.write_line(overall.done(item.nodeid))


class Overall:
    """The benchmark's one overall progress line: items done of all, elapsed, time left.

    Items weigh what they are expected to cost (`item_weights`: seconds from the costs calibration measured, else
    units of a decode case's first round); the time left extrapolates the elapsed time over the weight done, so the
    measured rate corrects the expectation as the run goes."""

    def __init__(self, weights: dict[str, float]):
        self.weights, self.finished, self.t0 = weights, set(), time.perf_counter()

    def done(self, nodeid: str) -> str:
        self.finished.add(nodeid)
        work = sum(self.weights[k] for k in self.finished)
        return "dflash " + eta_line("progress", len(self.finished), len(self.weights), time.perf_counter() - self.t0,
                                    work, sum(self.weights.values()), "items")


OVERALL = pytest.StashKey[Overall]()


def _case(item) -> tuple[str, int] | None:
    params = getattr(getattr(item, "callspec", None), "params", {}) or {}
    case = params.get("case")
    return (str(case[0]), int(case[1])) if isinstance(case, (tuple, list)) and len(case) == 2 else None


def item_weights(items, rounds: int, rank_rounds: int = 0, legs=None, ranking_width: int | None = None,
                 verify_seconds: float = 0.0) -> dict[str, float]:
    """Weights of the benchmark items (those using the `bench` session fixture), by what each one runs.

    With `legs` (bench.budget.leg_seconds: the expected greedy leg and speculative leg per width, from the costs
    calibration measured) the weights are seconds: a decode case's first item is its untimed activity decode (two
    speculative legs) and one round (greedy and two speculative legs; normal: two greedy legs), `test_rounds` the
    other rounds of every case, `test_ranking_rounds` two speculative legs per ranking round of every speculative
    case at the ranking width, a reference row its rounds of a peer and a greedy leg, the verify-cost curve
    `verify_seconds`. Without them (a reused size, --smoke, given knobs): units of a decode case's first round, the
    ranking rounds topping up about half the decode cases (one of two widths)."""
    bench = [i for i in items if "bench" in getattr(i, "fixturenames", ())]
    decode = [i for i in bench if getattr(i, "originalname", "") == "test_decode"]
    cases = {i.nodeid: c for i in decode if (c := _case(i))}
    if legs is None or len(cases) != len(decode):
        heavy = {"test_rounds": max(0, rounds - 1) * len(decode),
                 "test_ranking_rounds": max(0, rank_rounds - rounds) * len(decode) / 2}
        return {i.nodeid: float(heavy.get(getattr(i, "originalname", ""), 1)) for i in bench}
    greedy, spec = legs
    mean_spec = sum(spec.values()) / max(1, len(spec))

    def leg(w: int) -> float:
        return spec.get(w, mean_spec)

    def round_of(method: str, w: int) -> float:
        return 2 * greedy if method == "normal" else greedy + 2 * leg(w)

    ranked = sum(1 for m, w in cases.values() if m != "normal" and w == ranking_width)
    out = {}
    for i in bench:
        name = getattr(i, "originalname", "")
        if name == "test_decode":
            m, w = cases[i.nodeid]
            out[i.nodeid] = round_of(m, w) + (0.0 if m == "normal" else ACTIVITY_LEGS * leg(w))
        elif name == "test_rounds":
            out[i.nodeid] = max(0, rounds - 1) * sum(round_of(m, w) for m, w in cases.values())
        elif name == "test_ranking_rounds":
            out[i.nodeid] = max(0, rank_rounds - rounds) * ranked * 2 * leg(ranking_width or 0)
        elif name == "test_reference":
            out[i.nodeid] = rounds * greedy * (1 + REFERENCE_LEG_FACTOR)
        elif name == "test_verify_cost":
            out[i.nodeid] = verify_seconds
        else:
            out[i.nodeid] = round_of("dflash", ranking_width or 0)
    return {k: max(v, 1e-6) for k, v in out.items()}


def pytest_collection_finish(session):
    """Start the overall progress once the benchmark items are known (calibration already ran at collection)."""
    config = session.config
    sess = config.stash.get(SESSION_STASH, None)  # opened at collection by `--bench-widths auto`: its sized knobs
    try:
        smoke = config.getoption("--smoke")
        rounds = 1 if smoke else int(sess.cfg.rounds if sess else config.getoption("--bench-rounds"))
        rank_rounds = 0 if smoke else int(sess.cfg.rank_rounds if sess else config.getoption("--bench-rank-rounds"))
    except (ValueError, TypeError):  # not a benchmark run: its options are not declared
        return
    costs = getattr(sess, "matrix_costs", None) if sess is not None and not smoke else None
    legs = leg_seconds(costs, prompts=sess.cfg.prompt_limit, tokens=sess.cfg.tokens) if costs is not None else None
    weights = item_weights(session.items, rounds, rank_rounds, legs, getattr(sess, "ranking_width", None),
                           getattr(costs, "t_fixed", 0.0))
    if weights:
        config.stash[OVERALL] = Overall(weights)


def report_root(config) -> Path:
    """DFLASH_REPORTS, else reports/ in the pytest root (the repository)."""
    reports = env_value("reports")
    return Path(reports) if reports else Path(str(config.rootpath)) / "reports"


def noise_warning(rounds: dict[str, list[float]], baseline_first: dict[str, list[bool]] | None = None, *,
                  threshold: float) -> str | None:
    """The stderr warning of the noise flag over a session's ranking rounds (case -> ratios against dflash; each
    round's leg order: True where dflash ran first), or None when the run was quiet (or has no ranking rounds)."""
    from .ranking import noise_of_rounds  # lazy: scipy, only when a report is written

    n = noise_of_rounds(rounds, threshold, baseline_first)
    if not n["noisy"]:
        return None
    return (f"dflash WARNING: noisy machine: the ranking rounds' noise figure is {100 * n['sigma']:.1f} % (threshold "
            f"{100 * n['threshold']:.1f} %, --bench-noise-threshold); the ranking's resolution widens with it, "
            "so only a lead beyond that names a winner")


def session_rounds(sess) -> tuple[dict[str, list[float]], dict[str, list[bool]]]:
    """A session's ranking rounds: each case at the ranking width -> its ratios against dflash, and per round
    whether the dflash leg ran before the method's (as `ranking.baseline_first` reads them from the saved rows)."""
    cases = {k: c for k, c in (getattr(sess, "case_rounds", None) or {}).items()
             if c.method != "normal" and c.width == getattr(sess, "ranking_width", None) and c.compared()}
    return ({k: c.compared() for k, c in cases.items()},
            {k: [o.find("b") < o.find("m") for o in c.legs[:len(c.compared())]] for k, c in cases.items()})


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    sess = config.stash.get(SESSION_STASH, None)
    warning = None if sess is None else noise_warning(*session_rounds(sess), threshold=sess.cfg.noise_threshold)
    if warning:
        sys.stderr.write(warning + "\n")
    path = config.stash.get(REPORT_PATH, None)
    if path:
        terminalreporter.write_line(f"dflash report: {path}/index.html (report.html, benchmark.json)")
