"""No silent phase: the generic loops (round-robin passes, fits) log progress with the time left, live case lines
say which round they report, and the benchmark prints one overall line (items done, elapsed, time left)."""

from __future__ import annotations

import logging

import pytest

from dflash_core.progress import clock, eta_line
from dflash_core.report.plugin import Overall, case_line, item_weights


def test_eta_line_extrapolates_the_time_per_unit_of_work():
    assert eta_line("x", 1, 4, 30.0, 1, 4) == "x: 1/4, 30s elapsed, ~1m30s left"
    assert eta_line("x", 2, 3, 10.0, 1.0, 11.0, "items") == "x: 2/3 items, 10s elapsed, ~1m40s left"
    assert eta_line("x", 0, 3, 1.0, 0, 3).endswith("1s elapsed")  # nothing done yet: no guess
    assert [clock(s) for s in (0.4, 59, 61, 3725)] == ["0s", "59s", "1m01s", "1h02m"]


def _info(rounds, iqr=0.0):
    return {"speedup": 1.5, "speedup_iqr": iqr, "speedup_rounds": [1.5] * rounds, "exact": True,
            "tokens_per_target_call": 2.25, "verdicts": {"exact": 4}}


def test_a_case_line_says_which_round_it_reports_and_shows_no_spread_for_one():
    first = case_line("test_decode[act-cpu-w4]", _info(1), of=3)
    assert first == "dflash case test_decode[act-cpu-w4]: round 1 of 3: speedup 1.500x tok/call 2.25 exact"
    last = case_line("test_reference[generate-cpu]", _info(3, 0.02), of=3)
    assert last == ("dflash case test_reference[generate-cpu]: speedup 1.500x (IQR 0.020 over 3 rounds) tok/call "
                    "2.25 exact")
    assert "IQR" not in case_line("test_decode[act-cpu-w4]", _info(1), of=1)  # --smoke: one round is all


class _Item:
    def __init__(self, name, fixtures=("bench",)):
        self.originalname, self.nodeid, self.fixturenames = name, f"b.py::{name}", fixtures


def test_overall_progress_weighs_the_passes_and_the_ranking_rounds(monkeypatch):
    import time

    items = [_Item("test_decode"), _Item("test_decode"), _Item("test_rounds"), _Item("test_ranking_rounds"),
             _Item("test_unit", fixtures=())]
    items[1].nodeid += "[2]"
    w = item_weights(items, rounds=3, rank_rounds=6)  # 3 more rounds for half of the 2 decode cases
    assert w == {"b.py::test_decode": 1.0, "b.py::test_decode[2]": 1.0, "b.py::test_rounds": 4.0,
                 "b.py::test_ranking_rounds": 3.0}
    now = [100.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    overall = Overall(w)
    now[0] = 120.0
    assert overall.done("b.py::test_decode") == "dflash progress: 1/4 items, 20s elapsed, ~2m40s left"
    now[0] = 140.0
    overall.done("b.py::test_decode[2]")
    now[0] = 220.0
    assert overall.done("b.py::test_rounds") == "dflash progress: 3/4 items, 2m00s elapsed, ~1m00s left"


class _Case(_Item):
    def __init__(self, name, case=None, ref=None):
        super().__init__(name)
        if case is not None:
            self.nodeid += f"[{case[0]}-w{case[1]}]"
            self.callspec = type("CS", (), {"params": {"case": case}})()
        if ref is not None:
            self.nodeid += f"[{ref}]"


def _matrix(methods=("dflash", "act", "mobs")):
    cases = [(m, w) for m in methods for w in (3, 6)] + [("normal", 0)]
    return ([_Case("test_decode", c) for c in cases] + [_Case("test_rounds"), _Case("test_ranking_rounds")]
            + [_Case("test_reference", ref=r) for r in ("generate", "oracle")] + [_Case("test_verify_cost")])


def test_measured_costs_weigh_each_item_by_its_legs():
    """A speculative case's first item: greedy + two speculative legs + the two-leg activity decode; normal: two
    greedy legs; the rounds and the ranking rounds by their legs; a reference row: its peer and greedy legs."""
    from dflash_core.bench.budget import REFERENCE_LEG_FACTOR

    g, spec = 2.0, {3: 1.0, 6: 0.5}
    w = item_weights(_matrix(), rounds=3, rank_rounds=16, legs=(g, spec), ranking_width=6, verify_seconds=4.0)
    assert w["b.py::test_decode[normal-w0]"] == 2 * g and w["b.py::test_decode[act-w3]"] == g + 4 * 1.0
    assert w["b.py::test_rounds"] == 2 * (2 * g + 3 * ((g + 2 * 1.0) + (g + 2 * 0.5)))
    assert w["b.py::test_ranking_rounds"] == 13 * 3 * 2 * 0.5
    assert w["b.py::test_reference[oracle]"] == 3 * g * (1 + REFERENCE_LEG_FACTOR)
    assert w["b.py::test_verify_cost"] == 4.0


def test_the_first_time_left_is_near_the_truth_on_an_injected_timing_model(monkeypatch):
    """Known truth: each item takes its leg model's seconds times one machine factor (1.6: the calibration prompts'
    speedup understated the benchmark's), +-10 % per item. After the first item, measured-cost weights put the time
    left within 25 % of the truth; unit weights (every item one first round) miss by more than 40 %, as the
    AVX2 box's run did (~23 min shown, 13.4 min taken). Break: weigh the ranking rounds as base rounds."""
    import random
    import time

    rng = random.Random(3)
    items = _matrix(("dflash",) + tuple(f"m{i}" for i in range(13)))  # the run's shape: 14 methods x 2 widths
    g, spec = 1.4, {3: 1.1, 6: 0.9}
    true = item_weights(items, rounds=3, rank_rounds=16, legs=(g, spec), ranking_width=6, verify_seconds=3.0)
    took = {k: v / 1.6 * rng.uniform(0.9, 1.1) for k, v in true.items()}
    truth_left = sum(took.values()) - took[items[0].nodeid]
    now = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    for weights, ok in ((true, True), (item_weights(items, rounds=3, rank_rounds=16), False)):
        now[0] = 0.0
        overall = Overall(weights)
        now[0] = took[items[0].nodeid]
        line = overall.done(items[0].nodeid)
        left = line.rsplit(", ~", 1)[1].removesuffix(" left")
        mins, secs = (left.split("m") + ["0s"])[:2] if "m" in left else ("0", left)
        shown = 60 * int(mins) + int(secs.rstrip("s") or 0)
        assert (abs(shown - truth_left) / truth_left < 0.25) is ok, (line, truth_left)


def test_round_robin_passes_log_their_progress(caplog):
    from dflash_core.bench.schedule import seeded_passes

    caplog.set_level(logging.INFO, logger="dflash_core")
    seen = []
    passes = seeded_passes(lambda done: ["a", "b"] if done < 2 else [], 0, seen.append, desc="base rounds", total=4)
    assert passes == 2 and sorted(seen) == ["a", "a", "b", "b"]
    lines = [r.getMessage() for r in caplog.records if r.name == "dflash_core.bench.schedule"]
    assert lines and lines[-1].startswith("base rounds: 4/4, ") and " elapsed" in lines[-1] and "(pass 2, " in lines[-1]
    caplog.clear()
    seeded_passes(lambda done: ["a"] if done < 1 else [], 0, seen.append)
    assert not caplog.records  # no desc: a silent helper, as before


def test_fit_steps_log_their_progress(caplog):
    import torch

    from dflash_core.methods.support.fitting import batches, train_steps

    caplog.set_level(logging.INFO, logger="dflash_core")
    w = torch.zeros(2, requires_grad=True)
    rows = batches(torch.arange(8), 5, 4, torch.Generator().manual_seed(0))
    assert len(rows) == 5
    losses = train_steps([w], lambda b: (w.sum() - b.float().mean()) ** 2, rows)
    assert len(losses) == 5
    assert any(r.getMessage().startswith("fit: optimisation steps: 5/5, ") for r in caplog.records)


def test_batches_draw_the_same_rows_as_before():
    """The sized batches must consume the generator exactly as the generator function did (fits unchanged)."""
    import torch

    from dflash_core.methods.support.fitting import batches

    idx = torch.arange(10, 20)
    g = torch.Generator().manual_seed(3)
    want = [idx[torch.randint(len(idx), (4,), generator=g)] for _ in range(3)]
    got = list(batches(idx, 3, 4, torch.Generator().manual_seed(3)))
    assert all(torch.equal(a, b) for a, b in zip(got, want)) and len(got) == 3


@pytest.mark.parametrize("rounds,of,label", [(1, 3, "round 1 of 3: "), (3, 3, ""), (2, None, "")])
def test_round_label_only_when_rounds_are_still_to_come(rounds, of, label):
    line = case_line("c", _info(rounds), of=of)
    assert line.startswith(f"dflash case c: {label}speedup ")
