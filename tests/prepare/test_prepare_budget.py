"""The prepare budget (`prepare/timebudget.py`): training gets what the run's budget leaves after the steps before
it, the projected fits and a safety share. The projection is proved against an injected timing model whose true
fits cost is known; the cap reaches training and the manifest."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dflash_core.errors import BadInputError
from dflash_core.prepare import timebudget as tb
from dflash_core.testing import tiny_prepare_config


@pytest.mark.parametrize("value, vocab, want", [("auto", 16384, tb.PREPARE_BUDGET), ("auto", 64, None),
                                                ("off", 16384, None), (None, 16384, None), (12.5, 64, 12.5),
                                                (3, 16384, 3.0)])
def test_the_auto_budget_is_thirty_minutes_for_a_real_target_and_none_for_the_mini(value, vocab, want):
    assert tb.resolve_prepare_budget(value, vocab) == want


def test_the_auto_budget_leaves_a_training_budget_of_off_reproducible():
    # --train-budget off promises a drafter the step count alone decides: auto adds no time limit behind its back,
    # while a budget given on purpose still applies
    assert tb.resolve_prepare_budget("auto", 65536, train_budget_off=True) is None
    assert tb.resolve_prepare_budget(20.0, 65536, train_budget_off=True) == 20.0


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), True, "30", "fast", [30]])
def test_a_bad_prepare_budget_is_refused(bad):
    with pytest.raises(BadInputError, match="--prepare-budget must be 'auto', 'off' or a number of minutes > 0"):
        tb.resolve_prepare_budget(bad, 16384)


@settings(max_examples=200, deadline=None)
@given(budget=st.floats(1.0, 600.0), elapsed=st.floats(0.0, 40000.0), fits=st.floats(0.0, 20000.0))
def test_the_training_cap_is_what_the_budget_leaves_and_never_below_the_floor(budget, elapsed, fits):
    cap, rec = tb.training_cap(budget, elapsed, fits)
    total = 60.0 * budget
    assert cap >= tb.MIN_TRAIN_SECONDS
    if rec["projected_to_fit"]:  # the parts add up to the budget exactly
        assert elapsed + cap + fits + tb.SAFETY_SHARE * total == pytest.approx(total)
    else:  # the floor, and the record says the budget will be exceeded
        assert cap == tb.MIN_TRAIN_SECONDS and elapsed + fits + cap + tb.SAFETY_SHARE * total > total - 1e-6


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _fit_ctx(n: int = 600, seed: int = 0):
    """A planning context with the shapes of a real prepare: n trajectories of 64 tokens after prompts of 6-40."""
    r = random.Random(seed)
    lens = [r.randrange(6, 41) for _ in range(n)]
    trajs = [[1] * (p + 64) for p in lens]
    return SimpleNamespace(rt=SimpleNamespace(vocab_size=65536), drafter=SimpleNamespace(cfg=SimpleNamespace(
        block_size=16, taps=(1, 2, 3))), trajectories=trajs, prompt_lens=lens,
        cfg=SimpleNamespace(aux_max_examples=None))


def test_the_fits_projection_recovers_a_known_cost_from_one_probe_group(monkeypatch):
    """Injected timing model: a target forward costs C_T a row, drafting C_H an anchor for the heads' set and C_C
    for the corrections' (their strides and trajectories differ). The projection from one probe group equals the
    whole fits' true cost times FIT_OVERHEAD. Scaling everything by rows alone (the obvious shortcut) misses it."""
    from dflash_core.methods.support import fitting
    from dflash_core.methods.support.examples import planned_anchors

    C_T, C_H, C_C = 2e-3, 5e-3, 1e-3
    ctx, clock = _fit_ctx(), Clock()

    def rows(rt, seqs, taps, with_logits):
        clock.t += C_T * sum(map(len, seqs))

    def sets(ctx_, reqs):
        for req in reqs:
            plan = planned_anchors(ctx_, req)
            clock.t += C_T * sum(len(ctx_.trajectories[i]) for i in plan)  # its own forward
            clock.t += (C_H if req.top_k == fitting.HEAD_TOP_K else C_C) * sum(map(len, plan.values()))

    monkeypatch.setattr(tb, "target_rows_batch", rows)
    monkeypatch.setattr(tb, "draft_example_sets", sets)
    proj = tb.project_fit_seconds(ctx, clock=clock)

    head, corr = fitting.head_plan(ctx), fitting.correction_plan(ctx)
    union = set(head.trajectories) | set(corr.trajectories)
    examples = [sum(map(len, planned_anchors(ctx, fitting.plan_request(k, p)).values()))
                for k, p in ((fitting.HEAD_TOP_K, head), (fitting.CORRECTION_TOP_K, corr))]
    truth = C_T * sum(len(ctx.trajectories[i]) for i in union) + C_H * examples[0] + C_C * examples[1]
    assert examples[0] <= fitting.HEAD_TARGET_EXAMPLES and examples[1] <= fitting.CORRECTION_TARGET_EXAMPLES
    assert 1 < proj.probe_trajectories < len(union) / 10  # one group, not the fits themselves
    assert proj.seconds == pytest.approx(tb.FIT_OVERHEAD * truth, rel=1e-9)
    rows_only = (proj.target_seconds + proj.head_seconds + proj.correction_seconds) * proj.scale_rows
    assert abs(tb.FIT_OVERHEAD * rows_only - proj.seconds) > 0.05 * proj.seconds


def test_the_probe_group_holds_the_median_length_trajectory():
    ctx = _fit_ctx(200, seed=1)
    lengths = [len(t) for t in ctx.trajectories]
    union = list(range(0, 200, 2))
    got = tb.probe_group(lengths, union, ctx.rt.vocab_size)
    median = sorted(lengths[i] for i in union)[len(union) // 2]
    assert set(got) <= set(union) and median in {lengths[i] for i in got}
    assert max(lengths[i] for i in got) - min(lengths[i] for i in got) <= 10  # a group of about one length


def test_the_probe_drafter_has_the_largest_head_training_may_choose_and_leaves_the_rng_alone():
    import torch

    from dflash_core.prepare.train import TrainConfig
    from dflash_core.runtime.drafter import DrafterConfig

    dcfg = DrafterConfig(hidden_size=32, vocab_size=20000, taps=(1,), block_size=4, num_layers=1, num_heads=4,
                         intermediate_size=64)
    torch.manual_seed(5)
    want = torch.rand(3)
    torch.manual_seed(5)
    d = tb.probe_drafter(dcfg, TrainConfig())
    assert torch.equal(torch.rand(3), want)
    assert d.cfg.draft_vocab == TrainConfig().draft_vocab_max
    assert tb.probe_drafter(dcfg, TrainConfig(draft_vocab="off")).cfg.draft_vocab == 0
    assert tb.probe_drafter(dcfg, TrainConfig(draft_vocab=9000)).cfg.draft_vocab == 9000


def test_a_prepare_budget_caps_training_and_is_recorded(tiny_prepared, tmp_path, monkeypatch):
    """A budget on the tiny target: the fits are probed before training, the cap reaches train_drafter, and the
    manifest records the plan; without one (the mini-sized vocabulary's auto) nothing is probed."""
    import dflash_core.prepare.pipeline as P
    from dflash_core.runtime.target import load_target

    caps: list = []
    real = P.train_drafter

    def spy(*a, **k):
        caps.append(k.get("time_cap"))
        return real(*a, **k)

    monkeypatch.setattr(P, "train_drafter", spy)
    rt = load_target(str(tiny_prepared.path), "cpu", "float32")
    cfg = replace(tiny_prepare_config(), budget_minutes=5.0)
    out = P.prepare(str(tiny_prepared.path), home=tmp_path / "a", cfg=cfg, rt=rt, progress=False)
    doc = json.loads((out / "manifest.json").read_text())
    rec = doc["prepare_budget"]
    assert rec["budget_minutes"] == 5.0 and rec["fit_probe"]["seconds"] > 0
    assert caps == [pytest.approx(rec["training_cap_seconds"], abs=0.05)] and caps[0] >= tb.MIN_TRAIN_SECONDS
    assert doc["drafter"]["time_cap_seconds"] == caps[0]
    assert doc["prepare_config"]["budget_minutes"] == 5.0  # set, it is recorded (and compared)

    caps.clear()
    monkeypatch.setattr(P, "plan_training", lambda *a, **k: pytest.fail("probed without a budget"))
    out = P.prepare(str(tiny_prepared.path), home=tmp_path / "b", cfg=tiny_prepare_config(), rt=rt, progress=False)
    doc = json.loads((out / "manifest.json").read_text())
    assert caps == [None] and doc["prepare_budget"] == {"budget_minutes": None}
    assert "budget_minutes" not in doc["prepare_config"]  # auto: the config as recorded before the knob


@pytest.mark.parametrize("bad", [0, -5, "soon", True])
def test_prepare_refuses_a_bad_budget_before_any_work(bad, tmp_path):
    from dflash_core.prepare.pipeline import prepare

    with pytest.raises(BadInputError, match="--prepare-budget"):
        prepare("mini", home=tmp_path / "home", prepare_budget=bad)
    assert not (tmp_path / "home").exists()


@pytest.mark.parametrize("train_budget, probed", [("auto", True), (None, False)])
def test_at_a_real_vocabulary_auto_probes_unless_the_training_budget_is_off(tmp_path, monkeypatch, train_budget,
                                                                            probed):
    import dflash_core.prepare.pipeline as P
    from dflash_core.runtime.target import TargetRuntime
    from dflash_core.testing import TinySpec, build_tiny

    class Trained(Exception):
        pass

    seen: dict = {"planned": 0}

    def plan(*a, **k):
        seen["planned"] += 1
        return 150.0, {"budget_minutes": a[-2]}

    def train(*a, **k):
        seen["cap"] = k.get("time_cap")
        raise Trained

    monkeypatch.setattr(P, "plan_training", plan)
    monkeypatch.setattr(P, "train_drafter", train)
    rt = TargetRuntime.from_model(build_tiny(TinySpec(dtype="float32", pattern="CACA", vocab_size=16384,
                                                      hidden_size=32, intermediate_size=64)))
    cfg = tiny_prepare_config()
    cfg = replace(cfg, train=replace(cfg.train, budget_minutes=train_budget))
    with pytest.raises(Trained):
        P.prepare("tiny", home=tmp_path / "home", cfg=cfg, rt=rt, progress=False)
    assert seen == ({"planned": 1, "cap": 150.0} if probed else {"planned": 0, "cap": None})


class _Clock:
    """An injected clock: chunks advance it by the cost the test's timing model gives them."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _model(clock: _Clock, cost_per_item):
    """`generate` under a known timing model: a chunk of n items costs n * cost_per_item(n) seconds."""
    def generate(idx):
        clock.t += len(idx) * cost_per_item(len(idx))
        return list(idx)
    return generate


@pytest.mark.parametrize("n, allowance", [(1000, 200.0), (1000, 33.0), (5000, 1000.0), (400, 10_000.0)])
def test_sized_generation_ends_inside_its_allowance_where_larger_chunks_cost_no_more(n, allowance):
    """The padded teacher's cost per seed falls with its batch (104 tokens/s at 32 rows, 183 at 128): projecting
    each chunk from the one before errs long, so the run never passes its allowance, and it keeps going while the
    allowance lasts (no chunk of MIN_CHUNK would still fit at the latest rate)."""
    clock = _Clock()
    cost = lambda k: 1.0 if k <= 32 else 0.5  # noqa: E731
    got = tb.sized_generation(_model(clock, cost), n, allowance, first=32, clock=clock)
    assert [i for part in got.parts for i in part] == got.kept == list(range(len(got.kept)))
    assert got.record["seconds"] == pytest.approx(clock.t) and clock.t <= allowance + 32 * 1.0  # the probe always runs
    if len(got.kept) < n:
        assert clock.t <= max(allowance, 32.0)
        assert allowance - clock.t < tb.MIN_CHUNK * 1.0  # nothing worth starting was left
    else:
        assert n * 0.5 <= clock.t <= allowance
    assert got.record["kept"] == len(got.kept) and got.record["given"] == n
    assert [c[0] for c in got.record["chunks"]][0] == 32


def test_load_arriving_mid_run_overruns_the_allowance_by_at_most_a_small_chunk():
    """The run beside a CI start, as a timing model: seconds per seed 3.0 in the 8-seed probe, 0.17 and 0.097 in the
    next chunks (larger batches), then 0.21 once the load arrives. Projecting a whole chunk from the last rate
    overran 288 s by 43 % (the real run: a 844-seed chunk took 176 s where 108 s were left); a chunk of at most half
    of what still fits overruns by a few percent (a chunk up to twice as slow per item as the last never overruns)."""
    clock = _Clock()
    rates = iter([3.0, 0.17, 0.097])

    def generate(idx):
        clock.t += len(idx) * next(rates, 0.21)
        return list(idx)

    got = tb.sized_generation(generate, 100_000, 288.0, first=8, clock=clock)
    assert clock.t <= 288.0 * 1.10, got.record["chunks"]


def test_sized_generation_takes_the_items_in_the_given_order_and_rank_zeros_rate():
    clock = _Clock()
    order = list(range(99, -1, -1))
    seen = []
    got = tb.sized_generation(_model(clock, lambda k: 1.0), 100, 50.0, first=10, order=order, clock=clock,
                              agree=lambda rate: seen.append(rate) or 2.0)  # rank 0 was twice as slow
    assert got.kept == order[:len(got.kept)]
    assert seen[0] == 1.0
    # at rank 0's 2 s an item the 40 s left after the probe buy 20 items, of which a chunk takes half (at least
    # MIN_CHUNK, 16); the 14 s left then buy 7, fewer than MIN_CHUNK: the run stops there
    assert [c[0] for c in got.record["chunks"]] == [10, 16] and tb.MIN_CHUNK == 16


def test_the_probe_rate_is_seen_before_any_other_chunk_and_can_stop_the_run():
    clock = _Clock()
    calls = []

    def generate(idx):
        calls.append(len(idx))
        clock.t += 5.0 * len(idx)
        return idx

    def refuse(rate):
        assert calls == [8] and rate == 5.0
        raise BadInputError("too slow")

    with pytest.raises(BadInputError, match="too slow"):
        tb.sized_generation(generate, 100, 1e6, first=8, clock=clock, on_probe=refuse)
    assert calls == [8]


@pytest.mark.parametrize("budget, rate, holds", [(12.0, 0.5, True), (12.0, 20.0, False), (5.0, 2.0, True),
                                                 (5.0, 5.0, False)])
def test_a_budget_the_teacher_probe_says_cannot_hold_is_refused_with_what_would(budget, rate, holds):
    total = 60 * budget
    need = 10.0 + tb.MIN_SEEDS * rate + tb.MIN_TRAIN_SECONDS + tb.SAFETY_SHARE * total
    assert holds == (need <= total)  # the cases straddle the rule
    if holds:
        tb.check_teacher_probe(budget, 10.0, rate, 5000)
        return
    with pytest.raises(BadInputError, match="cannot hold on this machine") as exc:
        tb.check_teacher_probe(budget, 10.0, rate, 5000)
    given = float(str(exc.value).split("give --prepare-budget ")[1].split()[0])
    tb.check_teacher_probe(given, 10.0, rate, 5000)  # what it names does hold


@pytest.mark.parametrize("minutes", [0.5, 2.0, 3.5])
def test_a_budget_below_any_prepare_is_refused_before_any_work(minutes, tmp_path):
    from dflash_core.prepare.pipeline import prepare

    with pytest.raises(BadInputError, match="cannot hold"):
        prepare("mini", home=tmp_path / "home", prepare_budget=minutes)
    assert not (tmp_path / "home").exists()
    tb.check_budget_floor(3.7)  # the floor: training's 120 s in the 55 % the budget keeps for it


def _budgeted_run(tiny_prepared, home, monkeypatch, allowance: float):
    import dflash_core.prepare.pipeline as P
    from dflash_core.runtime.target import load_target

    monkeypatch.setattr(P, "generation_allowance", lambda minutes: allowance)
    monkeypatch.setattr(P, "PROBE_SEEDS", 16)
    rt = load_target(str(tiny_prepared.path), "cpu", "float32")
    cfg = replace(tiny_prepare_config(), budget_minutes=5.0, random_seeds=40)
    return P.prepare(str(tiny_prepared.path), home=home, cfg=cfg, rt=rt, progress=False)


def test_the_teacher_is_sized_to_the_budget_and_the_manifest_says_how(tiny_prepared, tmp_path, monkeypatch):
    """No allowance left after the probe: the teacher keeps the probe's 16 seeds (a seeded random sample, in the
    seeds' own order), training and the fits run on them, and the manifest records the chunks."""
    out = _budgeted_run(tiny_prepared, tmp_path / "a", monkeypatch, allowance=0.0)
    doc = json.loads((out / "manifest.json").read_text())
    sized = doc["prepare_budget"]["teacher"]
    assert sized["given"] == 40 and sized["kept"] == 16 and [c[0] for c in sized["chunks"]] == [16]
    trajs = json.loads((out / "trajectories.json").read_text())["sequences"]
    assert len(trajs) == doc["seeds"]["train_seed_count"] == 16 - doc["held_out"].get("trajectories_dropped", 0)

    out = _budgeted_run(tiny_prepared, tmp_path / "b", monkeypatch, allowance=1e6)  # ample: every seed
    doc = json.loads((out / "manifest.json").read_text())
    assert doc["prepare_budget"]["teacher"]["kept"] == 40 == doc["seeds"]["train_seed_count"]


def test_a_killed_budgeted_prepare_resumes_with_the_same_seeds(tiny_prepared, tmp_path, monkeypatch):
    import dflash_core.prepare.pipeline as P
    import dflash_core.prepare.teacher as T

    class Killed(Exception):
        pass

    def killed(*a, **k):
        raise Killed

    monkeypatch.setattr(P, "train_drafter", killed)
    with pytest.raises(Killed):
        _budgeted_run(tiny_prepared, tmp_path / "h", monkeypatch, allowance=0.0)
    monkeypatch.undo()
    generated = []
    real = T.generate_shard
    monkeypatch.setattr(T, "generate_shard", lambda *a, **k: generated.append(1) or real(*a, **k))
    out = _budgeted_run(tiny_prepared, tmp_path / "h", monkeypatch, allowance=1e6)  # a different rate: same plan
    doc = json.loads((out / "manifest.json").read_text())
    assert generated == [] and doc["prepare_budget"]["teacher"]["kept"] == 16


def test_a_fit_deadline_stops_the_optimisation_and_says_so():
    """The fits' optimisation (aux_steps steps per head whatever the data's size) was not in the projection: 24
    trajectories projected 12 s of fits that took ~6 minutes. Under a deadline it stops (after at least one step)."""
    import time

    import torch

    from dflash_core.methods.support import fitting as F

    w = torch.zeros(3, requires_grad=True)

    def run():
        return F.train_steps([w], lambda rows: ((w - 1.0) ** 2).sum(), F.batches(torch.arange(8), 50, 4,
                                                                                 torch.Generator().manual_seed(0)))

    assert len(run()) == 50
    with F.fit_deadline(time.perf_counter() - 1.0) as cuts:
        assert len(run()) == 1
    assert cuts == [{"step": 1, "steps": 50}]
    with F.fit_deadline(time.perf_counter() + 3600.0) as cuts:
        assert len(run()) == 50
    assert cuts == []


def test_a_budgeted_prepare_stops_the_fits_at_its_deadline_and_records_it(tiny_prepared, tmp_path, monkeypatch):
    import time

    import dflash_core.prepare.pipeline as P

    monkeypatch.setattr(P, "fits_deadline", lambda minutes, t0: time.perf_counter() - 1.0)  # already spent
    out = _budgeted_run(tiny_prepared, tmp_path / "h", monkeypatch, allowance=1e6)
    doc = json.loads((out / "manifest.json").read_text())
    stopped = doc["prepare_budget"]["fits_stopped_early"]
    assert stopped and all(c["step"] == 1 for cuts in stopped.values() for c in cuts)
    assert doc["prepare_budget"]["fit_floor_seconds"] == pytest.approx(tb.FIT_FLOOR_SHARE * 300.0)
