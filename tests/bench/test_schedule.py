"""The schedule (dflash_core.bench.schedule): base rounds in seeded round-robin passes, the ranking rounds fixed
before the run, the legs of every round in a seeded random order, and the whole procedure (schedule, then the
report's ranking) driven by an injected timing model: its false single winners at a 1.4 % true gap on a quiet
machine stay under 5 %."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

import dflash_core.bench.schedule as sch
from dflash_core.bench.cases import CaseRounds
from dflash_core.stats.selection import rank

from ..support.timing import QUIET, TRUTH


class Machine:
    """Leg walls of known truth: method i's decode takes exp(-theta_i) of dflash's, times per-leg noise (so a
    round's ratio has SD `sigma`), a machine state shared by the legs of a round that switches between a slow and a
    fast state every few rounds (cancels in a ratio), and a position effect: a round's second speculative leg runs
    `second` x as long as its first (a fixed order would bill it to the method). `new_round` marks a round's start
    (the tests hook it to `schedule.leg_order`, called once per round)."""

    def __init__(self, truth: dict[str, float], sigma: float, seed: int, second: float = 0.97):
        self.truth, self.rng, self.second = truth, np.random.default_rng(seed), second
        self.leg_sd = sigma / math.sqrt(2)
        self.rounds, self.speculative_legs = 0, 0

    def new_round(self) -> None:
        self.rounds += 1
        self.speculative_legs = 0

    def decode_all(self, sess, method, width, trace=None, rounds=None):
        state = 1.25 if (self.rounds // 5) % 2 else 1.0
        theta = 0.0 if method in ("normal", "dflash") else self.truth[method]
        noise = math.exp(-theta + self.leg_sd * self.rng.standard_normal())
        wall = (2.4 if method == "normal" else 1.0) * state * noise
        if method != "normal":
            wall *= self.second if self.speculative_legs else 1.0
            self.speculative_legs += 1
        return [], [], wall


def _session(machine: Machine, methods, width=15, base=3, rank_rounds=16, seed=0) -> SimpleNamespace:
    """A session whose cases at `width` have `base` base rounds (normal, dflash, method in that order, as the
    pedantic first round and schema 6 ran them), ready for the ranking rounds."""
    cases = {}
    for m in methods:
        c = CaseRounds(m, width, [], [], [], ["exact"], {}, None, [], [])
        for _ in range(base):
            machine.new_round()
            c.normal_walls.append(machine.decode_all(None, "normal", 0)[2])
            c.baseline_walls.append(machine.decode_all(None, "dflash", width)[2])
            c.walls.append(machine.decode_all(None, m, width)[2])
            c.legs.append("nbm")
        cases[f"{m}-w{width}"] = c
    cfg = SimpleNamespace(rank_rounds=rank_rounds, seed=seed, threads=1)
    return SimpleNamespace(case_rounds=cases, cfg=cfg, ranking_width=width, ranking=None,
                           rt=SimpleNamespace(device=None))


@pytest.fixture
def quiet_decodes(monkeypatch):
    """schedule's decode legs and figures replaced by the injected machine (set per test as `.machine`)."""
    holder = SimpleNamespace(machine=None)
    order = sch.leg_order

    def leg_order(*a):
        holder.machine.new_round()
        return order(*a)

    monkeypatch.setattr(sch, "leg_order", leg_order)
    monkeypatch.setattr(sch, "decode_all", lambda *a, **k: holder.machine.decode_all(*a, **k))
    monkeypatch.setattr(sch, "summarize", lambda *a, **k: {})
    monkeypatch.setattr(sch, "synchronize", lambda device: None)
    return holder


def _whole_procedure(machine, seed) -> dict:
    sess = _session(machine, list(TRUTH), seed=seed)
    sch.run_ranking(sess)
    return _rank_session(sess)


def _rank_session(sess) -> dict:
    """The report's ranking of a session's cases (report.ranking passes the same rounds and leg orders)."""
    cases = sess.case_rounds.values()
    first = {c.method: [o.find("b") < o.find("m") for o in c.legs] for c in cases}
    return rank({c.method: c.compared() for c in cases}, 0.02, threshold=0.03, resamples=600, baseline_first=first)


def test_no_false_single_winner_at_a_14_percent_gap(quiet_decodes):
    """The whole procedure (3 base rounds, the fixed ranking rounds in seeded random leg order, the report's
    selection) on 120 quiet runs of the lab's truths, whose top two are 1.4 % apart (inside r = 2 %): a single
    winner in <= 5 % of them (simulated: ~0 %). Breaks: r = 0 (a winner on any simultaneously resolved lead) and
    the leader's-group rule of schema 6 (overlapping percentile-bootstrap intervals) each fail it."""
    winners = 0
    for run in range(120):
        quiet_decodes.machine = Machine(TRUTH, QUIET, seed=1000 + run)
        winners += _whole_procedure(quiet_decodes.machine, seed=run)["winner"] is not None
    assert winners / 120 <= 0.05


def test_ranking_rounds_are_fixed_before_the_run_and_in_random_leg_order(quiet_decodes):
    """run_ranking tops every case at the ranking width up to rank_rounds, whatever the ratios say (two calls give
    the same counts for any data), in a seeded random leg order per round; other widths, normal and a diverged case
    get none; each case's record reaches its sink."""
    quiet_decodes.machine = Machine(TRUTH, QUIET, seed=7)
    sess = _session(quiet_decodes.machine, ["mobs", "dflash", "v12"], rank_rounds=10)
    other = _session(quiet_decodes.machine, ["mobs"], width=7).case_rounds
    sess.case_rounds.update(other)
    bad = CaseRounds("act", 15, [1.0] * 3, [1.0] * 3, [], ["diverged"], {}, None, [1.0] * 3, ["nbm"] * 3)
    sess.case_rounds["act-w15"] = bad
    sunk = []
    sess.case_rounds["mobs-w15"].sink = lambda s, info: sunk.append((s, dict(info)))
    rec = sch.run_ranking(sess)
    assert set(rec["cases"]) == {"mobs-w15", "dflash-w15", "v12-w15"} and rec["width"] == 15
    assert all(c == {"rounds": 10, "top_up_rounds": 7} for c in rec["cases"].values()) and rec["passes"] == 7
    assert len(sess.case_rounds["mobs-w7"].compared()) == 3 and len(bad.compared()) == 3
    legs = sess.case_rounds["mobs-w15"].legs
    assert legs[:3] == ["nbm"] * 3 and set(legs[3:]) == {"bm", "mb"}  # both orders occur over 7 rounds
    assert sunk[-1][0] is None and sunk[-1][1]["ranking"] == {"rounds": 10, "top_up_rounds": 7}
    assert sess.ranking is rec and len(sess.case_rounds["mobs-w15"].speedups()) == 3
    # the order is the seed's: the same seed, case and round index give the same order
    monkeypatch_order = sch.leg_order  # the fixture's wrapper around the real function
    assert monkeypatch_order(0, "mobs-w15", 5, "bm") == legs[5]
    assert len({monkeypatch_order(s, "k", 3, "nbm") for s in range(30)}) == 6


def test_randomised_leg_order_cancels_a_position_effect(quiet_decodes):
    """A second leg 5 % faster: with the legs in seeded random order, dflash against dflash is centred on 1 (its
    geometric mean) where the fixed order (dflash first, as schema 6 ran) reads 1.05, a 5 % effect billed to the
    method; and the ranking removes the effect from every round, so it neither biases nor reads as noise.
    Break: a fixed order "bm" for every ranking round -> the mean moves to ~1.05 and the effect is not estimable."""
    quiet_decodes.machine = Machine({"mobs": 0.09}, QUIET, seed=9, second=1 / 1.05)
    sess = _session(quiet_decodes.machine, ["dflash", "mobs"], base=1, rank_rounds=100)
    sch.run_ranking(sess)
    c = sess.case_rounds["dflash-w15"]
    assert abs(math.exp(float(np.mean(np.log(c.compared())))) - 1.0) < 0.01
    fixed = [x for x, o in zip(c.compared(), c.legs) if o == "bm"]
    assert abs(float(np.median(fixed)) - 1.05) < 0.01
    out = _rank_session(sess)
    assert abs(math.exp(out["position_delta"]) - 1.05) < 0.01 and out["noise"]["sigma"] < 1.5 * QUIET
    assert abs(out["ratio"]["dflash"] - 1.0) < 0.01 and abs(out["ratio"]["mobs"] - math.exp(0.09)) < 0.01


def test_base_rounds_run_in_seeded_round_robin_passes():
    """run_passes: every exact case (normal included, a diverged one never) gets one round per pass, each pass is a
    permutation of the cases, and the order depends on the seed and only on it."""
    def session():
        cases = {k: CaseRounds(k.split("-")[0], 2, [], [], [], kinds, {})
                 for k, kinds in (("normal-w0", ["exact"]), ("a-w2", ["exact"]), ("b-w2", ["exact", "exact"]),
                                  ("c-w4", ["exact"]), ("bad-w2", ["diverged"]))}
        return SimpleNamespace(case_rounds=cases, passes=None)

    def run(seed):
        calls = []
        sess = session()
        rec = sch.run_passes(sess, 3, seed, step=lambda s, k: calls.append(k))
        return sess, rec, calls

    sess, rec, calls = run(0)
    exact = {"normal-w0", "a-w2", "b-w2", "c-w4"}
    assert rec["passes"] == 3 and rec["cases"] == 4 and sess.passes is rec
    assert len(calls) == 12 and "bad-w2" not in calls
    for p in range(3):
        assert set(calls[4 * p:4 * p + 4]) == exact
    assert run(0)[2] == calls and any(run(s)[2] != calls for s in (1, 2, 3))
    assert sch.run_passes(session(), 0, 0, step=lambda s, k: calls.append(k))["passes"] == 0


def test_top_up_gives_every_case_the_minimum_in_seeded_round_robin_passes():
    def run(seed):
        cases = {k: CaseRounds(k, 2, [1.0] * n, [0.5] * n, [], ["exact"], {}, None, [0.5] * n)
                 for k, n in (("a", 3), ("b", 4), ("c", 6), ("d", 3))}
        sess = SimpleNamespace(case_rounds=cases)
        calls = []

        def step(s, k):
            calls.append(k)
            s.case_rounds[k].baseline_walls.append(0.5)
            s.case_rounds[k].walls.append(0.5)

        rec = sch.top_up(sess, ["a", "b", "c", "d"], 6, seed, step=step)
        return sess, rec, calls

    sess, rec, calls = run(1)
    assert rec["added"] == {"a": 3, "b": 2, "c": 0, "d": 3} and rec["passes"] == 3
    assert all(len(c.compared()) == 6 for c in sess.case_rounds.values())
    assert sorted(calls[:3]) == ["a", "b", "d"]
    assert run(1)[2] == calls and len({tuple(run(seed)[2]) for seed in range(6)}) > 1


def test_extra_rounds_reach_the_saved_pytest_benchmark_record():
    """The sink appends the round to the case's pytest-benchmark stats (whose figures are cached on first read)
    and replaces its extra_info figures: the saved JSON the report is built from holds every round."""
    from pytest_benchmark.stats import Stats

    from dflash_core.bench.cases import _benchmark_sink

    stats = Stats()
    for x in (1.0, 2.0, 3.0):
        stats.update(x)
    assert stats.median == 2.0 and stats.rounds == 3
    bm = SimpleNamespace(stats=SimpleNamespace(stats=stats), extra_info={"rounds": 3})
    sink = _benchmark_sink(bm)
    sink(10.0, {"rounds": 4, "speedup_rounds": [1, 1, 1, 1]})
    assert bm.stats.stats.rounds == 4 and bm.stats.stats.median == 2.5 and bm.stats.stats.data[-1] == 10.0
    assert bm.extra_info == {"rounds": 4, "speedup_rounds": [1, 1, 1, 1]}
    sink(None, {"ranking": {"rounds": 4, "top_up_rounds": 1}})
    assert bm.stats.stats.rounds == 4 and bm.extra_info["ranking"]["rounds"] == 4
