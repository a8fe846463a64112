"""The command line: method choices in help, --version, transformers' noise hidden unless -v, dtype names as the
CLI spells them, `run`'s speedup against the greedy it runs anyway, and the histogram extra in [dev]."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_core import __main__ as cli

from ..support.envs import child_env

REPO = Path(__file__).resolve().parents[2]


def _env(**extra) -> dict:
    return child_env(**extra)


def test_version_and_the_parser_import_no_torch():
    code = ("import sys; from dflash_core.__main__ import build_parser; build_parser(); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "False", out.stderr
    v = subprocess.run([sys.executable, "-m", "dflash_core", "--version"], env=_env(), capture_output=True,
                       text=True, timeout=300)
    from dflash_core import __version__

    assert v.returncode == 0 and v.stdout.strip() == f"dflash-mini-lab {__version__}"


def test_run_help_lists_the_method_choices(capsys):
    from dflash_core.methods import method_ids

    with pytest.raises(SystemExit) as exc:
        cli.main(["run", "--help"])
    assert exc.value.code == 0
    assert ", ".join(method_ids()) in " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", "--method", "fastest", "--prompt", "x", "--tokens", "1"])
    assert exc.value.code == 2 and "invalid choice: 'fastest'" in capsys.readouterr().err


def test_known_fallback_warnings_are_filtered_and_nothing_else():
    import logging

    from dflash_core.quiet import KERNEL_LOGGER, hide_known_fallbacks

    hide_known_fallbacks()
    hide_known_fallbacks()  # once is enough: no second filter
    lg = logging.getLogger(KERNEL_LOGGER)
    assert len(lg.filters) == 1
    known = lg.makeRecord(KERNEL_LOGGER, logging.WARNING, "f", 1, "`causal_conv1d_fn` is falling back to its "
                          "reference PyTorch implementation because `causal_conv1d` is not installed.", None, None)
    other = lg.makeRecord(KERNEL_LOGGER, logging.WARNING, "f", 1, "Failed to load kernel rms_norm", None, None)
    assert not lg.filters[0].filter(known) and lg.filters[0].filter(other)


@pytest.fixture(scope="module")
def tiny_lab(tmp_path_factory):
    from dflash_core.testing import build_tiny_lab

    return build_tiny_lab(tmp_path_factory.mktemp("cli-lab"))


def _run(tiny_lab, *extra):
    argv = [sys.executable, "-m", "dflash_core", "run", "--target", str(tiny_lab["ckpt"]), "--home",
            str(tiny_lab["home"]), "--method", "dflash", "--prompt", "def f(x):", "--tokens", "8", *extra]
    return subprocess.run(argv, env=_env(), capture_output=True, text=True, timeout=600)


def test_run_json_spells_the_dtype_as_the_cli_and_reports_its_speedup(tiny_lab):
    proc = _run(tiny_lab, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert doc["dtype"] == "float32" and doc["exactness"]["verdict"] == "exact"
    sp = doc["speedup_vs_greedy"]
    assert sp["speedup"] == pytest.approx(sp["greedy_seconds"] / sp["method_seconds"]) and sp["speedup"] > 0
    assert sp["kind"] == "one-shot, unpaired"
    # transformers' weight-loading bar and its causal_conv1d fallback warnings are hidden without -v
    assert "Loading weights" not in proc.stderr and "causal_conv1d" not in proc.stderr, proc.stderr[-2000:]


def test_run_prints_its_speedup_and_shows_transformers_noise_with_v(tiny_lab):
    proc = _run(tiny_lab, "-v")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "one-shot speedup vs greedy (unpaired, unwarmed): " in proc.stderr and "not a measurement" in proc.stderr
    assert "[run] width " in proc.stderr  # which width it used, and why
    assert "Loading weights" in proc.stderr and "causal_conv1d" in proc.stderr


def test_dev_extra_installs_pytest_benchmarks_histogram_dependencies():
    """`--benchmark-histogram` / `pytest-benchmark compare --histogram` need pytest-benchmark's histogram extra."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    dev = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    assert any(d.replace(" ", "").startswith("pytest-benchmark[histogram]") for d in dev), dev


def test_lab_help_and_bare_lab_print_usage_and_exit_0():
    """`./lab --help` and a bare `./lab` print the usage (no venv is built, no test runs); an unknown command exits
    2 with one `error:` line. Break: the old `cmd=${1:-test}` -> a bare ./lab runs the suite."""
    import subprocess
    from pathlib import Path

    lab = Path(__file__).resolve().parents[2] / "lab"
    env = {"PATH": "/usr/bin:/bin", "DFLASH_VENV": "/nonexistent/venv"}  # setup would fail: it must not run
    for argv in ([], ["--help"], ["-h"]):
        proc = subprocess.run(["bash", str(lab), *argv], capture_output=True, text=True, timeout=30, env=env)
        assert proc.returncode == 0 and proc.stdout.startswith("usage: ./lab {bench|test|demo|setup}"), argv
        assert "--version" in proc.stdout and "dflash-lab" in proc.stdout
    bad = subprocess.run(["bash", str(lab), "nope"], capture_output=True, text=True, timeout=30, env=env)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith("error: unknown command 'nope'")


def test_every_entry_point_has_version_and_a_console_script(capsys):
    """`--version` on the lab's CLI and on the report's (also after gate/compare); pyproject declares both console
    scripts, each naming a callable that exists."""
    import importlib
    from pathlib import Path

    import pytest
    import tomllib

    from dflash_core.__main__ import main as lab_main
    from dflash_core.report.__main__ import main as report_main

    with pytest.raises(SystemExit) as exc:
        lab_main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.startswith("dflash-mini-lab ")
    assert report_main(["--version"]) == 0 and capsys.readouterr().out.startswith("dflash-mini-lab ")
    for sub in ("gate", "compare"):
        with pytest.raises(SystemExit) as exc:
            report_main([sub, "--version"])
        assert exc.value.code == 0 and "report schema" in capsys.readouterr().out
    scripts = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(scripts) == {"dflash-lab", "dflash-lab-report"}
    for target in scripts.values():
        module, func = target.split(":")
        assert callable(getattr(importlib.import_module(module), func)), target


def test_run_defaults_to_the_width_the_last_benchmark_chose_else_says_which():
    """`run` without --width: the method's own width where the last benchmark of this model recorded one, else that
    benchmark's ranking width, else the block size B, each with the reason it prints."""
    rep = {"settings": {"method_widths": {"mobs": {"selected": 4}}}, "ranking": {"width": 6}}
    assert cli.default_width("mobs", rep, 16) == (4, "the width the last benchmark of this model chose for mobs")
    assert cli.default_width("dflash", rep, 16) == (6, "the ranking width the last benchmark of this model chose")
    w, why = cli.default_width("dflash", None, 16)
    assert w == 16 and why.startswith("the drafter's block size B (no benchmark of this model found in ")
    assert cli.default_width("dflash", {"ranking": {"width": 99}}, 16)[0] == 16  # out of range: not used


@pytest.mark.parametrize("argv,want", [(["report", "0001", "--out", "r"], ["0001", "--out", "r"]),
                                       (["gate", "a", "b"], ["gate", "a", "b"]),
                                       (["compare", "a", "b"], ["compare", "a", "b"]), (["run"], None)])
def test_report_compare_and_gate_are_subcommands_of_the_one_cli(argv, want, monkeypatch, capsys):
    """`python -m dflash_core report|compare|gate ...` (and `dflash-lab`) hand their arguments to the report's CLI."""
    assert cli.report_argv(argv) == want
    if want is None:
        return
    import dflash_core.report.__main__ as rmain

    seen = []
    monkeypatch.setattr(rmain, "main", lambda args: seen.append(args) or 7)
    assert cli.main(argv) == 7 and seen == [want]
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert all(f"    {name}" in out for name in ("report", "compare", "gate"))
