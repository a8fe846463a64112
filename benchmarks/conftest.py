"""Benchmark options, the session fixture, and seeded rotation of the case order.

Every option, its environment twin and its default come from `dflash_core.options.OPTIONS` (the README knob
table lists them); the option wins when both are set.
"""

from __future__ import annotations

import random

import pytest

SESSION_KEY = "dflash_bench_session"


def pytest_addoption(parser):
    from dflash_core.errors import DFlashError
    from dflash_core.options import add_pytest_option, pytest_options

    g = parser.getgroup("dflash-bench", "DFlash Mini Lab benchmark")
    g.addoption("--smoke", action="store_true", help="1 prompt, 8 tokens, 1 round")
    g.addoption("--tune", action="store_true", help="choose each method's width among 1, 2, 4 on calibration prompts")
    try:
        for name in pytest_options("bench"):
            add_pytest_option(g, name)
    except DFlashError as exc:
        raise pytest.UsageError(str(exc)) from exc
    g.addoption("--no-references", action="store_true", help="skip the peer/bound reference rows")


def pytest_configure(config):
    """Hides transformers' known kernel fallback warnings unless -v (dflash_core.quiet). A --calibration-from run
    that is unreadable, names unknown methods or bad options, or disagrees with --bench-widths is a usage error
    before anything is built, not an error in the first case's fixture; so is a bad --bench-prompts-file."""
    if config.getoption("verbose") <= 0:
        from dflash_core.quiet import hide_known_fallbacks

        hide_known_fallbacks()
    from dflash_core.errors import DFlashError

    prompts = config.getoption("--bench-prompts-file", None)
    if prompts:
        from dflash_core.store.prompt_file import read_prompt_file

        try:
            read_prompt_file(prompts)
        except DFlashError as exc:
            raise pytest.UsageError(str(exc)) from exc
    source = config.getoption("--calibration-from", None)
    if not source:
        return
    from dflash_core.bench.reuse import check_given_widths, load_reused

    try:
        check_given_widths(load_reused(source), given_widths(config))
    except DFlashError as exc:
        raise pytest.UsageError(f"--calibration-from: {exc}") from exc


def bench_config(config):
    from dflash_core.bench.config import BenchConfig
    from dflash_core.options import BENCH_FIELDS, option

    # Each pytest option's default already is its environment value (options.add_pytest_option).
    kw = {name: config.getoption(option(name).pytest) for name in BENCH_FIELDS}
    return BenchConfig(smoke=config.getoption("--smoke"), tune=config.getoption("--tune"),
                       peer_rows=not config.getoption("--no-references"),
                       calibration_widths=tuple(given_widths(config)), explicit=explicit_knobs(config), **kw).sized()


def explicit_knobs(config) -> tuple[str, ...]:
    """The BenchConfig fields the user set: on the command line (`--opt v` or `--opt=v`) or in the environment.
    `--bench-size auto` resizes only the others for a large target (BenchConfig.sized_for)."""
    import os

    from dflash_core.options import BENCH_FIELDS, option

    args = [str(a) for a in config.invocation_params.args]
    out = []
    for name in BENCH_FIELDS:
        o = option(name)
        given = o.pytest and any(a == o.pytest or a.startswith(o.pytest + "=") for a in args)
        if given or (o.env and os.environ.get(o.env, "").strip()):
            out.append(name)
    return tuple(out)


def given_widths(config) -> list[int]:
    """The verify widths given on the command line ([] for `auto`; already checked: integers >= 1)."""
    text = str(config.getoption("--bench-widths"))
    return [] if text == "auto" else [int(x) for x in text.split(",")]


def pytest_sessionstart(session):
    """`--bench-widths auto`: the cases are parametrized by the widths the benchmark session chooses, so the
    session opens here, before collection (load, prepare, calibrate: the work the `bench` fixture would do first
    anyway), and collection only reads it. Given widths open it in the fixture, at the first case."""
    from dflash_core.bench.session import open_session
    from dflash_core.errors import DFlashError
    from dflash_core.report.plugin import SESSION_STASH

    config = session.config
    if given_widths(config):
        return
    try:
        sess = open_session(bench_config(config))
    except DFlashError as exc:
        raise pytest.UsageError(str(exc)) from exc
    config.stash[_early_key] = sess
    config.stash[SESSION_STASH] = sess  # the progress weights read its sized knobs (a real target's differ)


def bench_widths(config) -> list[int]:
    """The verify widths: as given, or for `auto` the choice of the session opened at session start."""
    given = given_widths(config)
    if given:
        return given
    sess = config.stash[_early_key]
    return list(sess.bench_widths) or [sess.block_size]


def own_width_cases(config) -> list[tuple[str, int]]:
    """The (method, own width) cases beyond the benchmarked widths (`BenchSession.own_width_cases`): known at
    collection only under `auto`, whose session opens at session start; given widths choose own widths among them."""
    if given_widths(config):
        return []
    return list(config.stash[_early_key].own_width_cases())


_early_key = pytest.StashKey()


def pytest_generate_tests(metafunc):
    """Stable ids: test_decode[<method>-<device>-w<width>], test_reference[<kind>-<device>]."""
    device = metafunc.config.getoption("--device").split(":")[0]
    if "case" in metafunc.fixturenames and metafunc.function.__name__ == "test_decode":
        from dflash_core.methods import method_ids, speculative_ids

        cases = [("normal", 0)] + [(m, w) for m in speculative_ids() for w in bench_widths(metafunc.config)]
        cases += own_width_cases(metafunc.config)
        assert method_ids()[0] == "normal"
        metafunc.parametrize("case", cases, ids=[f"{m}-{device}-w{w}" for m, w in cases])
    if "reference" in metafunc.fixturenames:
        from dflash_core.bench.peers import REFERENCES

        widths = sorted({*bench_widths(metafunc.config), *(w for _, w in own_width_cases(metafunc.config))})
        refs = list(REFERENCES) + [f"oracle-w{w}" for w in widths]
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
    """The shared BenchSession (target, artifacts, prompts, greedy outputs, calibration). The run's noise figure
    comes from its own ranking rounds (dflash_core.stats.summary.robust_noise), not from extra A/A rounds."""
    from dflash_core.bench.session import open_session
    from dflash_core.errors import DFlashError
    from dflash_core.report.plugin import SESSION_STASH

    sess = request.config.stash.get(_early_key, None)
    if sess is None:
        try:
            sess = open_session(bench_config(request.config))
        except DFlashError as exc:  # once for the session: a UsageError here was raised again by every case
            pytest.exit(f"error: {exc}", returncode=pytest.ExitCode.USAGE_ERROR)
    request.config.stash[SESSION_STASH] = sess
    return sess
