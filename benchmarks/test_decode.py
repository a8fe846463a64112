"""The benchmark matrix: every method x device x verify width, racing, plus same-run reference rows.

Each case decodes every benchmark prompt per round, paired with a fresh `normal` run right before it,
checks exactness against greedy, and stores plain-number metrics in extra_info for the report plugin.
"""

from __future__ import annotations


def test_decode(benchmark, bench, case):
    from dflash_core.bench import measure_pair

    method, width = case
    benchmark.group = f"{bench.rt.device.type}-w{width}"
    info = measure_pair(bench, method, width, bench.cfg.rounds, benchmark)
    benchmark.extra_info.update(info)
    assert info["exact"], f"{method} at width {width} diverged from greedy: {info['verdicts']}"


def test_race(bench):
    """Racing, after every decode case (it is collected right after them): the cases whose 95 % interval overlaps
    the leader's get extra paired rounds (dflash_core.racing), written into their own pytest-benchmark records.
    Not a benchmark itself: it adds rounds to the cases and leaves no row of its own."""
    from dflash_core.bench import run_race

    rec = run_race(bench)
    assert all(c["rounds"] <= rec["cap_rounds"] for c in rec["cases"].values()), rec


def test_reference(benchmark, bench, reference):
    from dflash_core.bench import measure_reference

    if not bench.cfg.references:
        import pytest

        pytest.skip("--no-references")
    benchmark.group = f"{bench.rt.device.type}-reference"
    info = measure_reference(bench, reference, bench.cfg.rounds, benchmark)
    benchmark.extra_info.update(info)
    assert info["exact"], f"reference {reference} diverged from greedy: {info['verdicts']}"


def test_verify_cost(benchmark, bench):
    """t_verify(w) / t_decode for w = 1..B at the first prompt's context."""
    from dflash_core.bench import verify_cost_curve

    benchmark.group = f"{bench.rt.device.type}-verify-cost"
    widths = list(range(1, bench.block_size + 1))
    holder = {}
    benchmark.pedantic(lambda: holder.setdefault("c", verify_cost_curve(bench, widths)), rounds=1, iterations=1)
    benchmark.extra_info.update({"verify_cost": holder["c"], "device": bench.rt.device.type})
    assert all(v > 0 for v in holder["c"]["ratio"].values())
