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


def report_root(config) -> Path:
    return Path(os.environ.get("DFLASH_REPORTS", Path(str(config.rootpath)) / "reports"))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    path = config.stash.get(REPORT_PATH, None)
    if path:
        terminalreporter.write_line(f"dflash report: {path}/index.html (report.html, benchmark.json)")
