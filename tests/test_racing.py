"""Racing (issue 14 item 2): extra paired rounds only while a case is in the leader's rank group, driven by an
injected timing model (each case's true speedup plus seeded noise of a known size) and a fake clock."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from dflash_core.bench.racing import BUDGET, CAP, SEPARATED, contenders, race
from dflash_core.bench.stats import bootstrap_ci, overlaps


class TimingModel:
    """Paired speedups of known mean and noise: round r of case k is mean[k] + a seeded N(0, sd) draw, or, with
    `cycle`, mean[k] + cycle[r % len(cycle)] (noise of a known, repeating shape)."""

    def __init__(self, means: dict[str, float], sd: float, seed: int = 0, cycle: tuple[float, ...] = ()):
        self.means, self.sd, self.rng, self.cycle = means, sd, random.Random(seed), cycle
        self.calls: dict[str, int] = {k: 0 for k in means}
        self.drawn: dict[str, int] = {k: 0 for k in means}

    def draw(self, k: str) -> float:
        self.drawn[k] += 1
        if self.cycle:
            return self.means[k] + self.cycle[(self.drawn[k] - 1) % len(self.cycle)]
        return self.means[k] + self.rng.gauss(0.0, self.sd)

    def base(self, n: int) -> dict[str, list[float]]:
        return {k: [self.draw(k) for _ in range(n)] for k in self.means}

    def step(self, k: str) -> float:
        self.calls[k] += 1
        return self.draw(k)


class FakeClock:
    def __init__(self, tick: float = 0.0):
        self.t, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.t += self.tick
        return self.t


def test_a_clearly_separated_field_gets_no_extra_round():
    model = TimingModel({"a": 2.0, "b": 1.0, "c": 0.5}, sd=0.01)
    rounds = model.base(3)

    def never(k):
        raise AssertionError(f"{k} is separated from the leader and must not be raced")

    rec = race(rounds, never, base_rounds=3, max_factor=3, clock=FakeClock())
    assert rec["leader"] == "a" and rec["unresolved"] == [] and rec["passes"] == 0
    assert {k: (c["extra_rounds"], c["stop"]) for k, c in rec["cases"].items()} == {k: (0, SEPARATED) for k in "abc"}


def test_overlapping_contenders_race_until_they_separate_and_no_further():
    """a and b differ by 0.1 with noise 0.1: three rounds cannot tell them apart, more rounds can. c is far
    below and never raced. With a cap far away, the race must end because the intervals separated (a test of the
    stop rule: without it they would run to the cap)."""
    model = TimingModel({"a": 1.5, "b": 1.4, "c": 0.8}, sd=0.1, seed=3)
    rounds = model.base(3)
    assert overlaps(bootstrap_ci(rounds["a"]), bootstrap_ci(rounds["b"])), "the seed must start them overlapping"
    rec = race(rounds, model.step, base_rounds=3, max_factor=40, clock=FakeClock())
    a, b, c = (rec["cases"][k] for k in "abc")
    assert a["stop"] == b["stop"] == SEPARATED and rec["unresolved"] == []
    assert a["extra_rounds"] > 0 and b["extra_rounds"] > 0 and c["extra_rounds"] == 0 and model.calls["c"] == 0
    assert a["rounds"] < rec["cap_rounds"] and b["rounds"] < rec["cap_rounds"]
    assert not overlaps(bootstrap_ci(rounds["a"]), bootstrap_ci(rounds["b"]))
    assert a["rounds"] == len(rounds["a"]) == 3 + model.calls["a"]
    # one pass earlier they still overlapped: the race stopped at the first pass that separated them
    assert overlaps(bootstrap_ci(rounds["a"][:-1]), bootstrap_ci(rounds["b"][:-1]))


def test_the_cap_is_respected_when_cases_never_separate():
    model = TimingModel({"a": 1.5, "b": 1.5, "c": 0.5}, sd=0.0, cycle=(-0.1, 0.1, 0.0))  # a and b: same rounds
    rounds = model.base(3)
    rec = race(rounds, model.step, base_rounds=3, max_factor=3, clock=FakeClock())
    assert rec["cap_rounds"] == 9
    for k in "ab":
        assert rec["cases"][k] == {"rounds": 9, "extra_rounds": 6, "stop": CAP}
    assert rec["cases"]["c"] == {"rounds": 3, "extra_rounds": 0, "stop": SEPARATED}
    assert set(rec["unresolved"]) == {"a", "b"}


def test_max_factor_one_races_nothing():
    model = TimingModel({"a": 1.5, "b": 1.5}, sd=0.0, cycle=(-0.1, 0.1, 0.0))
    rec = race(model.base(3), model.step, base_rounds=3, max_factor=1, clock=FakeClock())
    assert sum(model.calls.values()) == 0 and {c["stop"] for c in rec["cases"].values()} == {CAP}


def test_the_time_budget_stops_the_race():
    """Each clock read advances 1 s; a 4 s budget leaves room for a few rounds, never the cap's 12."""
    model = TimingModel({"a": 1.5, "b": 1.5, "c": 1.5}, sd=0.0, cycle=(-0.1, 0.1, 0.0))
    rounds = model.base(3)
    clock = FakeClock(tick=1.0)
    rec = race(rounds, model.step, base_rounds=3, max_factor=5, budget_seconds=4.0, clock=clock)
    spent_rounds = sum(model.calls.values())
    assert 0 < spent_rounds <= 4 and rec["spent_seconds"] >= 4.0
    assert {rec["cases"][k]["stop"] for k in rec["unresolved"]} == {BUDGET}


def test_contenders_include_the_leader_only_when_someone_overlaps_it():
    assert contenders({"a": [2.0, 2.1], "b": [1.0, 1.1]}) == ("a", [])
    lead, near = contenders({"a": [1.5, 1.7], "b": [1.4, 1.6], "z": []})
    assert lead == "a" and near == ["a", "b"]


def test_contenders_are_the_leaders_rank_group_with_the_runs_resolution():
    """The race follows the report's groups: b is 0.7 % below a with disjoint intervals (a contender only
    under a resolution above 0.7 %); c overlaps b but not a, 1.4 % below a (a contender only under a resolution
    above 1.4 %: the group is the leader's, not a chain through b); d is clear of everything."""
    rounds = {"a": [1.500, 1.502], "b": [1.490, 1.492], "c": [1.47, 1.491], "d": [1.0, 1.01]}
    assert contenders({k: rounds[k] for k in "abd"}) == ("a", [])
    assert contenders({k: rounds[k] for k in "abd"}, 0.03) == ("a", ["a", "b"])
    assert contenders(rounds, 0.0) == ("a", [])  # c overlaps b, but b is resolved from a and a from c
    assert contenders(rounds, 0.01) == ("a", ["a", "b"])  # b joins a by the resolution; c overlapping b does not
    assert contenders(rounds, 0.02) == ("a", ["a", "b", "c"])


def test_bad_race_settings_are_refused():
    with pytest.raises(ValueError, match="max_factor"):
        race({"a": [1.0]}, lambda k: 1.0, base_rounds=1, max_factor=0)


def test_extra_rounds_reach_the_saved_pytest_benchmark_record():
    """The sink appends the round to the case's pytest-benchmark stats (whose figures are cached on first read)
    and replaces its extra_info figures: the saved JSON the report is built from holds every round."""
    from pytest_benchmark.stats import Stats

    from dflash_core.bench.cases import _benchmark_sink

    stats = Stats()
    for x in (1.0, 2.0, 3.0):
        stats.update(x)
    assert stats.median == 2.0 and stats.rounds == 3  # now cached
    bm = SimpleNamespace(stats=SimpleNamespace(stats=stats), extra_info={"rounds": 3})
    sink = _benchmark_sink(bm)
    sink(10.0, {"rounds": 4, "speedup_rounds": [1, 1, 1, 1]})
    assert bm.stats.stats.rounds == 4 and bm.stats.stats.median == 2.5 and bm.stats.stats.data[-1] == 10.0
    assert bm.extra_info == {"rounds": 4, "speedup_rounds": [1, 1, 1, 1]}
    sink(None, {"race": {"rounds": 4}})  # the race record alone adds no round
    assert bm.stats.stats.rounds == 4 and bm.extra_info["race"] == {"rounds": 4}


def test_run_race_races_exact_speculative_cases_and_records_each(monkeypatch):
    """run_race over a session's measured cases: normal, a diverged case and a case at another width than the
    leading one are never raced; every case at the leading width is first topped up to RANK_MIN_FACTOR x the
    base rounds, then raced, both with comparison-only rounds (dflash leg and method, no normal leg: the
    speedup over greedy keeps its 3 rounds); every raced case gets its `race` record through its sink; the
    budget is the base matrix's own time (from the fake clock) times the budget fraction."""
    import dflash_core.bench.schedule as bench
    from dflash_core.bench.cases import CaseRounds

    def case(method, walls, kinds=("exact",), width=2):
        sunk = []
        c = CaseRounds(method, width, [1.0] * len(walls), list(walls), [], list(kinds), {},
                             lambda s, info, sunk=sunk: sunk.append((s, dict(info))), [0.5] * len(walls))
        return c, sunk

    cases = {"normal-w0": case("normal", [1.0, 1.0, 1.0], width=0), "a-w2": case("a", [0.5, 0.52, 0.49]),
             "b-w2": case("b", [0.51, 0.5, 0.53]), "bad-w2": case("bad", [0.1, 0.1, 0.1], ("diverged",)),
             "a-w1": case("a", [0.8, 0.8, 0.8], width=1)}
    model = TimingModel({"a-w2": 1.0, "b-w2": 1.0}, sd=0.0, cycle=(0.0, -0.04, 0.04))
    calls = []

    def fake_compare(sess, key):
        c = sess.case_rounds[key]
        calls.append(key)
        c.baseline_walls.append(0.5)
        c.walls.append(0.5 / model.step(key))
        return c.compared()[-1]

    monkeypatch.setattr(bench, "compare_round", fake_compare)
    monkeypatch.setattr(bench, "race_round", lambda *a: pytest.fail("racing must not time a normal leg"))
    sess = SimpleNamespace(case_rounds={k: c for k, (c, _) in cases.items()}, matrix_started=-5.0, race=None,
                           cfg=SimpleNamespace(rounds=3, race_max=5, seed=0, resolution=0.03))
    rec = bench.run_race(sess, clock=FakeClock(tick=0.1))
    assert set(rec["cases"]) == {"a-w2", "b-w2"} and sess.race is rec
    assert rec["width"] == 2 and rec["statistic"] == "vs_baseline"
    assert rec["top_up"]["rounds"] == bench.RANK_MIN_FACTOR * 3 == 12 and rec["top_up"]["passes"] == 9
    assert sorted(calls[:18]) == ["a-w2"] * 9 + ["b-w2"] * 9  # the top-up, round-robin, before any race round
    assert rec["resolution"] == 0.03  # the session's resolution reached the race (the report's own rule)
    # the clock's first read (0.1) minus the matrix start (-5), times the budget fraction
    assert rec["budget_seconds"] == pytest.approx(5.1 * bench.RACE_BUDGET_FRACTION)
    assert {k: (c["extra_rounds"], c["stop"]) for k, c in rec["cases"].items()} == {"a-w2": (3, CAP), "b-w2": (3, CAP)}
    assert cases["normal-w0"][1] == [] and cases["bad-w2"][1] == [] and cases["a-w1"][1] == []
    for k in ("a-w2", "b-w2"):
        last = cases[k][1][-1]
        assert last[0] is None and last[1]["race"] == {**rec["cases"][k], "top_up_rounds": 9}
        c = sess.case_rounds[k]
        vs = c.compared()  # the model's ratios against dflash: 1 + (0, -0.04, 0.04) cycling
        assert len(vs) == 15 and sorted({round(x, 6) for x in vs[3:]}) == [0.96, 1.0, 1.04]
        assert len(c.speedups()) == 3 and len(c.normal_walls) == 3


def test_top_up_gives_every_case_the_minimum_in_seeded_round_robin_passes():
    """top_up: cases below the minimum get one comparison round per pass until each has it; a case already at
    the minimum gets none; the order of each pass depends on the seed (and only on it)."""
    import dflash_core.bench.schedule as bench
    from dflash_core.bench.cases import CaseRounds

    def run(seed):
        cases = {k: CaseRounds(k, 2, [1.0] * n, [0.5] * n, [], ["exact"], {}, None, [0.5] * n)
                 for k, n in (("a", 3), ("b", 4), ("c", 6), ("d", 3))}
        sess = SimpleNamespace(case_rounds=cases)
        calls = []

        def step(s, k):
            calls.append(k)
            s.case_rounds[k].baseline_walls.append(0.5)
            s.case_rounds[k].walls.append(0.5)

        rec = bench.top_up(sess, ["a", "b", "c", "d"], 6, seed, step=step)
        return sess, rec, calls

    sess, rec, calls = run(1)
    assert rec["added"] == {"a": 3, "b": 2, "c": 0, "d": 3} and rec["passes"] == 3
    assert all(len(c.compared()) == 6 for c in sess.case_rounds.values())
    assert sorted(calls[:3]) == ["a", "b", "d"]  # the first pass: every short case once
    orders = {tuple(run(seed)[2]) for seed in range(6)}
    assert run(1)[2] == calls and len(orders) > 1


def test_race_line_says_what_racing_did():
    from dflash_core.report.plugin import race_line

    rec = race({"a": [1.5, 1.6, 1.4], "b": [1.5, 1.6, 1.4], "c": [0.5, 0.5, 0.5]},
               TimingModel({"a": 1.5, "b": 1.5, "c": 0.5}, sd=0.0, cycle=(-0.1, 0.1, 0.0)).step, 3, 2,
               clock=FakeClock())
    line = race_line(rec)
    assert line.startswith("dflash race: 2 of 3 cases raced (leader ") and "+6 paired rounds" in line
    assert "still unresolved: " in line and race_line(None) is None


def test_base_rounds_run_in_seeded_round_robin_passes():
    """run_passes: every exact case (normal included, a diverged one never) gets exactly one round per pass, each
    pass is a permutation of the cases, and the order depends on the seed and only on it."""
    import dflash_core.bench.schedule as bench
    from dflash_core.bench.cases import CaseRounds

    def session():
        cases = {k: CaseRounds(k.split("-")[0], 2, [], [], [], kinds, {})
                 for k, kinds in (("normal-w0", ["exact"]), ("a-w2", ["exact"]), ("b-w2", ["exact", "exact"]),
                                  ("c-w4", ["exact"]), ("bad-w2", ["diverged"]))}
        return SimpleNamespace(case_rounds=cases, passes=None)

    def run(seed):
        calls = []
        sess = session()
        rec = bench.run_passes(sess, 3, seed, step=lambda s, k: calls.append(k))
        return sess, rec, calls

    sess, rec, calls = run(0)
    exact = {"normal-w0", "a-w2", "b-w2", "c-w4"}
    assert rec["passes"] == 3 and rec["cases"] == 4 and sess.passes is rec
    assert len(calls) == 12 and "bad-w2" not in calls
    for p in range(3):
        assert set(calls[4 * p:4 * p + 4]) == exact  # one round of every case per pass
    assert run(0)[2] == calls  # deterministic for a seed
    assert any(run(s)[2] != calls for s in (1, 2, 3))  # and the seed decides the order
    assert bench.run_passes(session(), 0, 0, step=lambda s, k: calls.append(k))["passes"] == 0
