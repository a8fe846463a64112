"""pytest plugin: turns the saved pytest-benchmark JSON into the canonical report.

Loaded by the root conftest. Every pytest_benchmark_* hook is `optionalhook=True`, so the plugin loads
even with `-p no:benchmark`. `pytest_benchmark_update_json` fires once per output (autosave and
--benchmark-json each get one), so the report is built and written only once per session.
"""

from __future__ import annotations

import os
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


def case_line(name: str, extra_info: dict) -> str | None:
    """One progress line per finished benchmark case (name, paired speedup, tokens per call, exactness)."""
    ex = extra_info
    if "speedup" not in ex or "exact" not in ex:
        return None
    verdict = "exact" if ex["exact"] else "DIVERGED"
    ties = (ex.get("verdicts") or {}).get("tie", 0)
    tau = f" tok/call {ex['tokens_per_target_call']:.2f}" if "tokens_per_target_call" in ex else ""
    return (f"dflash case {name}: speedup {ex['speedup']:.3f}x (IQR {ex.get('speedup_iqr', 0.0):.3f}){tau} "
            f"{verdict}" + (f" ({ties} tie)" if ties else ""))


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


CASE_CLOCK = pytest.StashKey[dict]()


def eta_note(config, item) -> str:
    """' (case k/N, ~M min left)' for the decode cases: their count from the collected items, the time per case
    so far from the first one's start (a real target's matrix runs for tens of minutes)."""
    import time

    clock = config.stash.setdefault(CASE_CLOCK, {"t0": None, "done": 0})
    if getattr(item, "originalname", None) != "test_decode":
        return ""
    total = sum(1 for i in item.session.items if getattr(i, "originalname", None) == "test_decode")
    clock["done"] += 1
    per = (time.perf_counter() - clock["t0"]) / clock["done"] if clock["t0"] is not None else 0.0
    return f" (case {clock['done']}/{total}, ~{per * (total - clock['done']) / 60:.1f} min of cases left)"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """`bench` shows dots for minutes otherwise: say each case's result as soon as it is measured, with an ETA."""
    import time

    clock = item.config.stash.setdefault(CASE_CLOCK, {"t0": None, "done": 0})
    if clock["t0"] is None and getattr(item, "originalname", None) == "test_decode":
        clock["t0"] = time.perf_counter()
    yield
    bm = getattr(item, "funcargs", {}).get("benchmark")
    line = case_line(item.name, getattr(bm, "extra_info", None) or {}) if bm is not None else None
    note = eta_note(item.config, item)
    line = line + note if line else line
    if getattr(item, "originalname", None) == "test_race":
        line = race_line(getattr(item.config.stash.get(SESSION_STASH, None), "race", None))
    tr = item.config.pluginmanager.get_plugin("terminalreporter")
    if line and tr is not None:
        tr.write_line(line)


def report_root(config) -> Path:
    return Path(os.environ.get("DFLASH_REPORTS", Path(str(config.rootpath)) / "reports"))


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
