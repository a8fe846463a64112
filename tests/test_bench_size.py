"""Benchmark size for real targets: over 100M parameters, `--bench-size auto` gives every knob the user did not
set the real-target defaults; explicit knobs, `--bench-size full`, --smoke and small targets are left alone."""

from __future__ import annotations

import pytest

from dflash_core.bench.config import REAL_TARGET_DEFAULTS, REAL_TARGET_PARAMETERS, BenchConfig


def test_a_large_target_gets_the_real_target_defaults():
    cfg = BenchConfig().sized_for(134_515_008)
    assert {k: getattr(cfg, k) for k in REAL_TARGET_DEFAULTS} == REAL_TARGET_DEFAULTS
    assert cfg.resized == tuple(sorted(REAL_TARGET_DEFAULTS)) and cfg.rounds == BenchConfig().rounds


@pytest.mark.parametrize("cfg,params", [(BenchConfig(), REAL_TARGET_PARAMETERS), (BenchConfig(), 11_900_000),
                                        (BenchConfig(bench_size="full"), 354_000_000),
                                        (BenchConfig(smoke=True), 354_000_000), (BenchConfig(), None)])
def test_small_targets_full_size_and_smoke_keep_the_table_defaults(cfg, params):
    assert cfg.sized_for(params) == cfg


def test_explicit_knobs_are_never_resized():
    cfg = BenchConfig(tokens=48, explicit=("tokens",)).sized_for(354_000_000)
    assert cfg.tokens == 48 and cfg.prompt_limit == REAL_TARGET_DEFAULTS["prompt_limit"]
    assert "tokens" not in cfg.resized


def test_explicit_knobs_come_from_the_command_line_and_the_environment(monkeypatch):
    import importlib.util
    from pathlib import Path
    from types import SimpleNamespace

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "conftest.py"
    spec = importlib.util.spec_from_file_location("bench_conftest_under_test", path)
    bench_conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_conftest)
    monkeypatch.setenv("DFLASH_PROMPT_LIMIT", "3")
    monkeypatch.delenv("DFLASH_TOKENS", raising=False)
    config = SimpleNamespace(invocation_params=SimpleNamespace(args=("benchmarks", "--bench-rounds=5",
                                                                     "--bench-tokens", "16")))
    got = bench_conftest.explicit_knobs(config)
    assert {"rounds", "tokens", "prompt_limit"} <= set(got) and "race_max" not in got
