"""Benchmark options, the session fixture, and seeded rotation of the case order.

Every option has an environment twin (see dflash_core.bench.ENV_KNOBS); the option wins when both are set.
"""

from __future__ import annotations

import os
import random

import pytest

SESSION_KEY = "dflash_bench_session"


def pytest_addoption(parser):
    g = parser.getgroup("dflash-bench", "DFlash Mini Lab benchmark")
    g.addoption("--smoke", action="store_true", help="1 prompt, 8 tokens, 1 round")
    g.addoption("--tune", action="store_true", help="choose each method's width among 1, 2, 4 on calibration prompts")
    g.addoption("--bench-tokens", type=int, default=None, help="tokens per prompt (env DFLASH_TOKENS)")
    g.addoption("--bench-prompts", type=int, default=None, help="benchmark prompt limit (env DFLASH_PROMPT_LIMIT)")
    g.addoption("--bench-rounds", type=int, default=None, help="timed rounds per case (env DFLASH_REPEATS)")
    g.addoption("--bench-threads", type=int, default=None, help="torch CPU threads (env DFLASH_THREADS)")
    g.addoption("--calibration-tokens", type=int, default=None, help="env DFLASH_CALIBRATION_TOKENS")
    g.addoption("--calibration-prompts", type=int, default=None, help="env DFLASH_CALIBRATION_PROMPT_LIMIT")
    g.addoption("--bench-widths", default=os.environ.get("DFLASH_WIDTHS", "2,4,8"),
                help="verify widths to time (each <= the drafter's block size B); 1,2,4,8 for the full matrix")
    g.addoption("--bench-seed", type=int, default=int(os.environ.get("DFLASH_BENCH_SEED", "0")),
                help="seed of the case-order rotation")
    g.addoption("--no-references", action="store_true", help="skip the peer/bound reference rows")


def bench_config(config):
    from dflash_core.bench import BenchConfig, env_overrides

    kw = env_overrides()
    for opt, fld in (("--bench-tokens", "tokens"), ("--bench-prompts", "prompt_limit"), ("--bench-rounds", "rounds"),
                     ("--bench-threads", "threads"), ("--calibration-tokens", "calibration_tokens"),
                     ("--calibration-prompts", "calibration_prompt_limit")):
        v = config.getoption(opt)
        if v is not None:
            kw[fld] = v
    return BenchConfig(target=config.getoption("--target"), device=config.getoption("--device"),
                       dtype=config.getoption("--dtype"), kernels=config.getoption("--kernels"),
                       smoke=config.getoption("--smoke"),
                       tune=config.getoption("--tune"), seed=config.getoption("--bench-seed"),
                       references=not config.getoption("--no-references"), **kw).sized()


def bench_widths(config) -> list[int]:
    try:
        ws = sorted({int(x) for x in str(config.getoption("--bench-widths")).split(",") if x.strip()})
    except ValueError as exc:
        raise pytest.UsageError(f"--bench-widths must be comma-separated integers: {exc}") from exc
    if not ws or ws[0] < 1:
        raise pytest.UsageError("--bench-widths: every width must be >= 1")
    return ws


def pytest_generate_tests(metafunc):
    """Stable ids: test_decode[<method>-<device>-w<width>], test_reference[<kind>-<device>]."""
    device = metafunc.config.getoption("--device").split(":")[0]
    if "case" in metafunc.fixturenames and metafunc.function.__name__ == "test_decode":
        from dflash_core.methods import method_ids, speculative_ids

        cases = [("normal", 0)] + [(m, w) for m in speculative_ids() for w in bench_widths(metafunc.config)]
        assert method_ids()[0] == "normal"
        metafunc.parametrize("case", cases, ids=[f"{m}-{device}-w{w}" for m, w in cases])
    if "reference" in metafunc.fixturenames:
        from dflash_core.bench import REFERENCES

        refs = list(REFERENCES) + [f"oracle-w{w}" for w in bench_widths(metafunc.config)]
        metafunc.parametrize("reference", refs, ids=[f"{r}-{device}" for r in refs])


def pytest_collection_modifyitems(session, config, items):
    """Seeded rotation of the decode cases, so order effects do not favour a fixed method."""
    decode = [i for i in items if i.originalname == "test_decode"]
    if not decode:
        return
    rng = random.Random(config.getoption("--bench-seed"))
    shift = rng.randrange(len(decode))
    rotated = decode[shift:] + decode[:shift]
    rng.shuffle(rotated)
    it = iter(rotated)
    items[:] = [next(it) if i.originalname == "test_decode" else i for i in items]


@pytest.fixture(scope="session")
def bench(request):
    """The shared BenchSession (target, artifacts, prompts, references, calibration)."""
    from dflash_core.bench import open_session

    sess = open_session(bench_config(request.config))
    widths = [w for w in bench_widths(request.config) if w > sess.block_size]
    if widths:
        raise pytest.UsageError(f"--bench-widths {widths} exceed the drafter's block size B={sess.block_size}")
    request.config.stash[_key()] = sess
    return sess


def _key():
    from dflash_core.report.plugin import SESSION_STASH

    return SESSION_STASH
