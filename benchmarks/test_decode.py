"""The benchmark matrix: every method x device x verify width, the ranking rounds, plus same-run reference rows.

Each case decodes every benchmark prompt per round, paired with a fresh `normal` run and plain dflash in the
same round, checks exactness against greedy, and stores plain-number metrics in extra_info for the report
plugin. A case's item times its first round; `test_rounds` then gives every case its other base rounds in
round-robin passes, and `test_ranking_rounds` the ranking width's cases their fixed number of rounds against
dflash (both are collected right after the decode cases).
"""

from __future__ import annotations


def test_decode(benchmark, bench, case):
    from dflash_core.bench.cases import measure_pair

    method, width = case
    benchmark.group = f"{bench.rt.device.type}-w{width}"
    info = measure_pair(bench, method, width, 1, benchmark)  # its other base rounds: test_rounds, round-robin
    benchmark.extra_info.update(info)
    assert info["exact"], f"{method} at width {width} diverged from greedy: {info['verdicts']}"


def test_rounds(bench):
    """The base rounds after each case's first (`--bench-rounds` in all), in round-robin passes over every exact
    case in a seeded order per pass (dflash_core.bench.schedule.run_passes), so every case samples the machine's drift
    over the whole session instead of one stretch of it. Adds rounds to the cases; no row of its own."""
    from dflash_core.bench.schedule import run_passes

    before = {k: len(c.walls) for k, c in bench.case_rounds.items()}
    rec = run_passes(bench, bench.cfg.rounds - 1, bench.cfg.seed)
    assert rec["passes"] == bench.cfg.rounds - 1
    grown = {k: len(c.walls) - before[k] for k, c in bench.case_rounds.items() if k in before}
    assert sum(grown.values()) == rec["passes"] * rec["cases"], grown


def test_ranking_rounds(bench):
    """The ranking rounds, after every decode case (collected right after them): every exact speculative case at
    the ranking width gets `--bench-rank-rounds` ratios against plain dflash in all (dflash_core.bench.schedule.
    run_ranking), a number fixed before the run, written into its own pytest-benchmark record. Not a benchmark
    itself: it adds rounds to the cases and leaves no row of its own."""
    from dflash_core.bench.schedule import run_ranking

    rec = run_ranking(bench)
    assert all(c["rounds"] >= bench.cfg.rank_rounds for c in rec["cases"].values()), rec


def test_reference(benchmark, bench, reference):
    from dflash_core.bench.peers import measure_reference

    if not bench.cfg.peer_rows:
        import pytest

        pytest.skip("--no-references")
    if reference == "dflash_transformers":
        from dflash_core.prepare.drafter_format import not_representable

        why = not_representable(bench.prepared.drafter.cfg)
        if why:  # no such row exists for this drafter: transformers would time another drafter under its name
            import pytest

            pytest.skip(f"no dflash_transformers row: {why}")
    benchmark.group = f"{bench.rt.device.type}-reference"
    info = measure_reference(bench, reference, bench.cfg.rounds, benchmark)
    benchmark.extra_info.update(info)
    assert info["exact"], f"reference {reference} diverged from greedy: {info['verdicts']}"


def test_verify_cost(benchmark, bench):
    """t_verify(w) / t_decode for w = 1..B at the first prompt's context."""
    from dflash_core.bench.peers import verify_cost_curve

    benchmark.group = f"{bench.rt.device.type}-verify-cost"
    widths = list(range(1, bench.block_size + 1))
    holder = {}
    benchmark.pedantic(lambda: holder.setdefault("c", verify_cost_curve(bench, widths)), rounds=1, iterations=1)
    benchmark.extra_info.update({"verify_cost": holder["c"], "device": bench.rt.device.type})
    assert all(v > 0 for v in holder["c"]["ratio"].values())
