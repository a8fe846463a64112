"""The one options table: parsing and precedence, the README knob table, BenchConfig, conftest hygiene, tox."""

from __future__ import annotations

import configparser
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_core.errors import BadInputError
from dflash_core.options import BENCH_FIELDS, OPTIONS, env_value, option

REPO = Path(__file__).resolve().parents[2]


def _readme_knob_rows() -> dict[str, list[str]]:
    """variable -> [CLI option, pytest option, default, meaning] from docs/cli.md's "Run knobs" table."""
    text = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    section = text.split("## Run knobs", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0].startswith("`DFLASH_"):
            rows[cells[0].strip("`")] = cells[1:]
    return rows


def _cell(text: str) -> str:
    return text.replace("`", "").strip()


def test_readme_knob_table_matches_the_options_table():
    rows = _readme_knob_rows()
    assert set(rows) == {o.env for o in OPTIONS if o.env}, "docs/cli.md knob table and dflash_core.options differ"
    for o in OPTIONS:
        cli, pytest_opt, default, _meaning = rows[o.env]
        assert _cell(cli) == (o.cli or "—"), f"{o.env}: README says CLI option {cli}, the table {o.cli}"
        assert _cell(pytest_opt) == (o.pytest or "—"), f"{o.env}: README says pytest option {pytest_opt}"
        assert _cell(default) == str(o.default_text or o.default), f"{o.env}: README default {default}"


def test_every_dflash_variable_the_code_reads_is_in_the_table():
    """A DFLASH_* name anywhere in the package or the conftests must be a row of the table (or the test list)."""
    known = {o.env for o in OPTIONS}
    found = set()
    for path in [*REPO.joinpath("dflash_core").rglob("*.py"), REPO / "conftest.py", REPO / "benchmarks/conftest.py",
                 REPO / "docker-compose.yml", *REPO.joinpath(".github/workflows").glob("*.yml")]:
        found |= set(re.findall(r"\bDFLASH_[A-Z_]+[A-Z]\b", path.read_text(encoding="utf-8")))
    found -= {"DFLASH_VENV"}  # the ./lab script's own virtual-environment path, not a run knob
    assert found <= known, f"undocumented knobs: {sorted(found - known)}"


def test_environment_then_default(monkeypatch):
    monkeypatch.delenv("DFLASH_TOKENS", raising=False)
    assert env_value("tokens") == option("tokens").default == 96
    monkeypatch.setenv("DFLASH_TOKENS", "")
    assert env_value("tokens") == 96  # empty means unset (docker-compose passes empty knobs)
    monkeypatch.setenv("DFLASH_TOKENS", "12")
    assert env_value("tokens") == 12
    monkeypatch.setenv("DFLASH_WIDTHS", "8, 2,2")
    assert env_value("widths") == "2,8"


@pytest.mark.parametrize("var,value,message", [
    ("DFLASH_TOKENS", "many", "DFLASH_TOKENS='many' is not a valid int"),
    ("DFLASH_TOKENS", "-1", "DFLASH_TOKENS='-1' must be an integer >= 0"),
    ("DFLASH_THREADS", "0", "DFLASH_THREADS='0' must be an integer >= 1"),
    ("DFLASH_WIDTHS", "0,2", "every width must be an integer >= 1"),
    ("DFLASH_KERNELS", "fast", "is not one of auto, eager, onednn"),
    ("DFLASH_DTYPE", "int8", "is not one of auto, float32"),
    ("DFLASH_GPU_DTYPE", "auto", "is not one of float32"),
])
def test_bad_environment_value_names_the_variable(monkeypatch, var, value, message):
    monkeypatch.setenv(var, value)
    name = next(o.name for o in OPTIONS if o.env == var)
    with pytest.raises(BadInputError, match=re.escape(message)):
        env_value(name)


def test_bench_config_reads_every_knob_from_the_environment(monkeypatch, tmp_path):
    import json

    from dflash_core.bench.config import BenchConfig

    from ..support.report_data import bench_row, saved_run

    run = tmp_path / "0001_run.json"
    run.write_text(json.dumps(saved_run([bench_row("normal", 0), bench_row("dflash", 2)])))
    values = {"DFLASH_TARGET": "someone/model", "DFLASH_DEVICE": "cuda:1", "DFLASH_DTYPE": "bfloat16",
              "DFLASH_KERNELS": "eager", "DFLASH_THREADS": "3", "DFLASH_TOKENS": "7", "DFLASH_REPEATS": "5",
              "DFLASH_PROMPT_LIMIT": "2", "DFLASH_CALIBRATION_TOKENS": "9", "DFLASH_CALIBRATION_PROMPT_LIMIT": "1",
              "DFLASH_BENCH_SEED": "4", "DFLASH_NOISE_THRESHOLD": "0.1", "DFLASH_RESOLUTION": "0.02",
              "DFLASH_RANK_ROUNDS": "6",
              "DFLASH_DRAFTER": "/some/drafter", "DFLASH_CALIBRATION_FROM": str(run.resolve()),
              "DFLASH_BENCH_SIZE": "full", "DFLASH_BENCH_BUDGET": "12.5", "DFLASH_PROMPTS_FILE": "/some/prompts.jsonl"}
    for var, value in values.items():
        monkeypatch.setenv(var, value)
    cfg = BenchConfig.from_env(tokens=11)
    got = {option(f).env: str(getattr(cfg, f)) for f in BENCH_FIELDS}
    assert got == {**values, "DFLASH_TOKENS": "11"}  # an explicit value wins over the environment


def test_bench_config_defaults_are_the_tables():
    from dflash_core.bench.config import BenchConfig

    assert {f: getattr(BenchConfig(), f) for f in BENCH_FIELDS} == {f: option(f).default for f in BENCH_FIELDS}


def test_root_conftest_imports_nothing_heavy():
    """The pytest-benchmark CLI imports conftest.py before pytest reads pytest.ini (filterwarnings = error):
    a module imported then can no longer be assertion-rewritten, and the warning became a crash."""
    code = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('conftest', 'conftest.py'); "
            "spec.loader.exec_module(importlib.util.module_from_spec(spec)); "
            "print(sorted(m for m in ('hypothesis', 'torch', 'transformers', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def _tox() -> configparser.ConfigParser:
    cp = configparser.ConfigParser(interpolation=None)
    cp.read(REPO / "tox.ini")
    return cp


def test_tox_envs_are_described_and_pass_the_hub_and_index_variables():
    cp = _tox()
    envs = [s for s in cp.sections() if s.startswith("testenv:")]
    assert {"testenv:tests", "testenv:exactness", "testenv:bench", "testenv:gpu", "testenv:lint"} <= set(envs)
    for env in envs:
        assert cp.get(env, "description", fallback=cp.get("testenv", "description", fallback="")).strip(), env
    passenv = cp.get("testenv", "passenv").split()
    assert {"HF_*", "TORCH_INDEX_URL", "DFLASH_*", "CI"} <= set(passenv)


def test_tox_installs_torch_before_the_package():
    """commands_pre runs after the package install (too late to choose torch's wheel); deps come first."""
    cp = _tox()
    base = cp["testenv"]
    assert "commands_pre" not in base
    assert [d.strip() for d in base["deps"].split("\n") if d.strip()] == ["torch==2.13.0"]
    assert "tox_pip.py" in base["install_command"]
    from ..support.helpers import load_file

    pip_command = load_file("scripts/tox_pip.py").pip_command
    # a machine whose pip finds torch locally adds nothing; which index otherwise: tests/cli/test_lab_setup.py
    assert pip_command(["torch==2.13.0"], {}, driver=False, local=True)[-3:] == ["pip", "install", "torch==2.13.0"]
    url = "https://download.pytorch.org/whl/cpu"
    assert pip_command(["x"], {"TORCH_INDEX_URL": url})[-3:] == ["--extra-index-url", url, "x"]


def test_tox_lint_checks_the_same_paths_as_lint_sh():
    lint_sh = (REPO / "scripts/lint.sh").read_text(encoding="utf-8")
    (ruff_line,) = [ln.strip() for ln in lint_sh.splitlines() if ln.strip().startswith("ruff check")]
    assert _tox().get("testenv:lint", "commands").strip() == ruff_line


def test_hypothesis_profile_is_loaded_by_the_root_conftest(pytestconfig):
    """The profiles moved from import time into pytest_configure: the session must still run under one
    (--hypothesis-profile, else ci when CI is set, else DFLASH_HYPOTHESIS_PROFILE)."""
    import os

    from hypothesis import settings

    expected = (pytestconfig.getoption("hypothesis_profile", None)
                or ("ci" if os.environ.get("CI") else env_value("hypothesis_profile")))
    assert settings.default.max_examples == {"dev": 10, "ci": 40, "thorough": 400}[expected]
    assert settings.default.deadline is None


@pytest.mark.parametrize("raw", ["1.5", "-0.1", "five"])
def test_noise_threshold_must_be_a_fraction(raw):
    with pytest.raises(BadInputError, match="DFLASH_NOISE_THRESHOLD"):
        option("noise_threshold").from_env({"DFLASH_NOISE_THRESHOLD": raw})
    assert option("noise_threshold").from_env({"DFLASH_NOISE_THRESHOLD": "0.1"}) == 0.1


def test_every_dflash_knob_is_read_through_the_options_table():
    """No module reads a DFLASH_* variable itself (os.environ[...], .get, getenv): only options.py does, so a
    knob's default, checks and README row live in one place. Writes (a child process's env) are allowed."""
    import re

    read = re.compile(r"""(?:environ(?:\.get)?\s*[\(\[]|getenv\()\s*["'](DFLASH_\w+)["']\s*(\]\s*(?!=[^=]))?""")
    roots = [REPO / "dflash_core", REPO / "benchmarks", REPO / "scripts", REPO / "studies", REPO / "conftest.py",
             REPO / "tests"]
    files = [p for r in roots for p in ([r] if r.is_file() else r.rglob("*.py"))]
    offenders = []
    for p in files:
        if p.name == "options.py" and p.parent.name == "dflash_core":
            continue
        for m in read.finditer(p.read_text(encoding="utf-8")):
            line = p.read_text(encoding="utf-8")[m.start():].split("\n", 1)[0]
            if re.match(r"""environ\[\s*["']DFLASH_\w+["']\s*\]\s*=[^=]""", line):
                continue  # a write
            offenders.append(f"{p.relative_to(REPO)}: {line.strip()}")
    assert not offenders, "read DFLASH_* through dflash_core.options.env_value: " + "; ".join(offenders)


def test_name_lists_come_from_the_table():
    """The CLI's per-command options, the forwarded ones and both conftests' pytest options are the table's."""
    from dflash_core import __main__ as cli
    from dflash_core.options import for_command, pytest_options

    assert set(cli.RUN_OPTIONS) == {"target", "revision", "home", "threads", "device", "dtype", "kernels", "drafter",
                                    "mini_seed"}
    assert set(for_command("import")) == {"home"} and set(cli.BENCH_FORWARDED) == {
        "target", "device", "dtype", "kernels", "drafter", "calibration_from", "prompts_file"}
    assert set(pytest_options("root")) == {"target", "device", "dtype", "kernels"}
    assert {o.name for o in OPTIONS if o.pytest} == set(pytest_options("root")) | set(pytest_options("bench"))
