"""pytest plugin: turns the saved pytest-benchmark JSON into the canonical report.

Loaded by the root conftest. Every pytest_benchmark_* hook is `optionalhook=True`, so the plugin loads
even with `-p no:benchmark`. `pytest_benchmark_update_json` fires once per output (autosave and
--benchmark-json each get one), so the report is built and written only once per session.
"""

from __future__ import annotations

from pathlib import Path

import pytest

SESSION_STASH = pytest.StashKey[object]()
_WRITTEN = pytest.StashKey[bool]()


def _lab_section(config) -> dict | None:
    """The session's lab section (BenchSession.lab_section), or None when no benchmark session ran."""
    sess = config.stash.get(SESSION_STASH, None)
    return None if sess is None else sess.lab_section()


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_machine_info(config, machine_info):
    """A stable accelerator block; volatile clock readings dropped so same-machine compares don't warn."""
    cpu = machine_info.get("cpu")
    if isinstance(cpu, dict):
        for k in [k for k in cpu if k.startswith("hz_actual")]:
            del cpu[k]
    try:
        import torch

        acc = {"torch": torch.__version__, "cuda": torch.version.cuda, "threads": torch.get_num_threads()}
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            acc.update(name=p.name, capability=f"{p.major}.{p.minor}", memory_gib=round(p.total_memory / 2**30, 1))
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
    import json

    from .build import build_report
    from .write import write_report

    doc = build_report([json.loads(json.dumps(output_json, default=str))], ["this run"])
    out = write_report(doc, report_root(config))
    config.stash[REPORT_PATH] = str(out)


REPORT_PATH = pytest.StashKey[str]()


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


def race_line(rec: dict | None) -> str | None:
    """One progress line after racing: how many cases it raced, the rounds it added, and what stays unresolved."""
    if not rec:
        return None
    cases = rec.get("cases") or {}
    raced = [k for k, c in cases.items() if c.get("extra_rounds")]
    extra = sum(c.get("extra_rounds", 0) for c in cases.values())
    left = rec.get("unresolved") or []
    top = rec.get("top_up") or {}
    topped = (f"every case topped up to {top['rounds']} rounds against dflash in {top.get('seconds', 0.0):.0f} s; "
              if top.get("rounds") else "")
    return (f"dflash race: {topped}{len(raced)} of {len(cases)} cases raced (leader {rec.get('leader')}); +{extra} "
            f"paired rounds in {rec.get('spent_seconds', 0.0):.0f} s (cap {rec.get('cap_rounds')} rounds per case); "
            + (f"still unresolved: {', '.join(left)}" if left else "the leader is resolved"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """`bench` shows dots for minutes otherwise: say each case's result as soon as it is measured, and where the
    whole benchmark stands (items done of all, elapsed, time left)."""
    yield
    sess = item.config.stash.get(SESSION_STASH, None)
    rounds = getattr(getattr(sess, "cfg", None), "rounds", None)
    bm = getattr(item, "funcargs", {}).get("benchmark")
    line = case_line(item.name, getattr(bm, "extra_info", None) or {}, rounds) if bm is not None else None
    if getattr(item, "originalname", None) == "test_race":
        line = race_line(getattr(sess, "race", None))
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

    Items weigh what they cost, in units of a decode case's first round: `test_rounds` runs (rounds - 1) rounds of
    every decode case, racing at most about half the base matrix's time; every other item weighs one. The time left
    extrapolates the elapsed time over the weight done, so it settles as the run goes."""

    def __init__(self, weights: dict[str, float]):
        import time

        self.weights, self.finished, self.t0 = weights, set(), time.perf_counter()

    def done(self, nodeid: str) -> str:
        import time

        from ..progress import eta_line

        self.finished.add(nodeid)
        work = sum(self.weights[k] for k in self.finished)
        return "dflash " + eta_line("progress", len(self.finished), len(self.weights), time.perf_counter() - self.t0,
                                    work, sum(self.weights.values()), "items")


OVERALL = pytest.StashKey[Overall]()


def item_weights(items, rounds: int) -> dict[str, float]:
    """Weights of the benchmark items (those using the `bench` session fixture), by what each one runs."""
    bench = [i for i in items if "bench" in getattr(i, "fixturenames", ())]
    decode = sum(getattr(i, "originalname", "") == "test_decode" for i in bench)
    heavy = {"test_rounds": max(0, rounds - 1) * decode, "test_race": rounds * decode / 2}
    return {i.nodeid: float(heavy.get(getattr(i, "originalname", ""), 1)) for i in bench}


def pytest_collection_finish(session):
    """Start the overall progress once the benchmark items are known (calibration already ran at collection)."""
    config = session.config
    try:
        rounds = 1 if config.getoption("--smoke") else int(config.getoption("--bench-rounds"))
    except (ValueError, TypeError):  # not a benchmark run: its options are not declared
        return
    weights = item_weights(session.items, rounds)
    if weights:
        config.stash[OVERALL] = Overall(weights)


def report_root(config) -> Path:
    """DFLASH_REPORTS, else reports/ in the pytest root (the repository)."""
    from ..options import env_value

    reports = env_value("reports")
    return Path(reports) if reports else Path(str(config.rootpath)) / "reports"


def noise_warning(lab: dict) -> str | None:
    """The stderr warning of the A/A noise gate, or None when the session was quiet (or measured no A/A rounds)."""
    from ..bench.stats import aa_noise

    noise = lab.get("noise") or {}
    n = aa_noise([*noise.get("start", []), *noise.get("end", [])], noise.get("threshold", 0.05))
    if not n["noisy"]:
        return None
    return (f"dflash WARNING: noisy machine: normal timed against normal differed by up to {100 * n['spread']:.1f} % "
            f"(threshold {100 * n['threshold']:.1f} %, --bench-noise-threshold); speedup differences below that "
            "are not resolved by this run")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    import sys

    sess = config.stash.get(SESSION_STASH, None)
    warning = None if sess is None else noise_warning({"noise": {**sess.aa_rounds,
                                                                  "threshold": sess.cfg.noise_threshold}})
    if warning:
        sys.stderr.write(warning + "\n")
    path = config.stash.get(REPORT_PATH, None)
    if path:
        terminalreporter.write_line(f"dflash report: {path}/index.html (report.html, benchmark.json)")
