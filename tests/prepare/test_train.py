"""Teacher data and drafter training: batched teacher generation equals one-at-a-time greedy (float64),
the held-out split shares no trajectory with training, and early stopping returns the best held-out state."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dflash_core.errors import BadInputError
from dflash_core.prepare.train import (
    LARGE_VOCAB,
    MINI_PATIENCE,
    MINI_STEPS,
    REAL_VOCAB_BUDGET,
    REAL_VOCAB_PATIENCE,
    REAL_VOCAB_STEPS,
    SELECT_RULES,
    TrainConfig,
    accepted_runs,
    eval_accuracy,
    heldout_eval,
    length_buckets,
    resolve_schedule,
    split_trajectories,
    train_drafter,
    trajectories,
)
from dflash_core.runtime.decode import greedy
from dflash_core.runtime.drafter import DrafterConfig
from dflash_core.runtime.target import TargetRuntime, batch_greedy, batch_taps, trajectory_taps
from dflash_core.testing import TinySpec, build_tiny


@pytest.fixture(scope="module")
def rt64():
    return TargetRuntime.from_model(build_tiny(TinySpec(pattern="CCACAC", dtype="float64")))


# Several prompts share a length (so they share a batch) and some stand alone; ids avoid 0 (pad).
seed_sets = st.lists(st.lists(st.integers(1, 95), min_size=1, max_size=9), min_size=1, max_size=10)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompts=seed_sets, new_tokens=st.integers(0, 12), batch=st.integers(1, 4))
def test_batched_teacher_equals_one_at_a_time_greedy(rt64, prompts, new_tokens, batch):
    got = trajectories(rt64, prompts, new_tokens, batch=batch)
    want = [p + greedy(rt64, p, new_tokens)[0] for p in prompts]
    assert got == want


def test_batched_teacher_never_stops_at_eos(rt64):
    """Teacher continuations have exactly `new_tokens` ids, as `greedy` without stop_at_eos does."""
    eos = rt64.eos_token_id
    cont = batch_greedy(rt64, [[eos, eos], [3, 4]], 6)
    assert [len(c) for c in cont] == [6, 6]


def test_batched_taps_match_one_forward_per_sequence(rt64):
    seqs = [[5, 6, 7, 8, 9], [9, 8, 7, 6, 5], [1, 2, 3, 4, 5]]
    got = batch_taps(rt64, seqs, (0, 3))
    for s, h in zip(seqs, got):
        torch.testing.assert_close(h, trajectory_taps(rt64, s, (0, 3)), rtol=0, atol=1e-12)


def test_batch_helpers_refuse_mixed_lengths(rt64):
    with pytest.raises(BadInputError, match="bucket the prompts by length"):
        batch_greedy(rt64, [[1, 2], [1, 2, 3]], 2)
    with pytest.raises(BadInputError, match="one length"):
        batch_taps(rt64, [[1, 2], [1]], (0,))


def test_length_buckets_cover_every_index_once_without_padding():
    seqs = [[0] * n for n in (3, 1, 3, 2, 3, 3, 1)]
    buckets = length_buckets(seqs, 2)
    assert sorted(i for b in buckets for i in b) == list(range(len(seqs)))
    assert all(len(b) <= 2 and len({len(seqs[i]) for i in b}) == 1 for b in buckets)


@pytest.mark.parametrize("n", [2, 3, 10, 224, 2000])
def test_split_holds_out_whole_trajectories_disjointly(n):
    train, held = split_trajectories(n, seed=7, fraction=0.1)
    assert set(train).isdisjoint(held)
    assert sorted(train + held) == list(range(n))
    assert 1 <= len(held) <= max(1, round(n * 0.1)) and train
    assert split_trajectories(n, seed=7, fraction=0.1) == (train, held)  # seeded


def test_split_with_one_trajectory_or_no_fraction_holds_nothing_out():
    assert split_trajectories(1, 7, 0.1) == ([0], [])
    assert split_trajectories(5, 7, 0.0) == ([0, 1, 2, 3, 4], [])


def _tiny_training(tcfg: TrainConfig):
    model = build_tiny(TinySpec(pattern="CACA", dtype="float32", vocab_size=64, hidden_size=32,
                                intermediate_size=64))
    rt = TargetRuntime.from_model(model)
    r = random.Random(0)
    starts_steps = [(r.randrange(1, 64), r.randrange(1, 4)) for _ in range(20)]
    seqs = [[(a + d * i) % 63 + 1 for i in range(14)] for a, d in starts_steps]  # arithmetic runs
    dcfg = DrafterConfig(hidden_size=32, vocab_size=64, taps=(1,), block_size=4, num_layers=1, num_heads=4,
                         intermediate_size=64)
    drafter, metrics = train_drafter(rt, seqs, dcfg, tcfg)
    return rt, seqs, drafter, metrics


def test_early_stopping_returns_the_best_heldout_state():
    # a large learning rate on 15 short trajectories: held-out accuracy peaks and then falls, so training stops
    tcfg = TrainConfig(steps=120, batch_sequences=4, anchors_per_sequence=4, lr=0.05, warmup=1, val_fraction=0.25,
                       eval_every=2, patience=5, seed=3, matmul_dtype="float32")
    rt, seqs, drafter, m = _tiny_training(tcfg)
    curve = m["heldout_curve"]
    best = max(c["heldout_mean_accuracy"] for c in curve)
    assert m["steps_run"] < tcfg.steps  # it stopped early ...
    assert curve[-1]["heldout_mean_accuracy"] < best  # ... after the state had got worse than the best
    assert m["best_step"] < m["steps_run"]
    train_ids, val_ids = split_trajectories(len(seqs), tcfg.seed, tcfg.val_fraction)
    assert m["heldout_sequences"] == len(val_ids) and m["train_sequences"] == len(train_ids)
    embed, head = rt.model.get_input_embeddings(), rt.model.get_output_embeddings()
    feats = [trajectory_taps(rt, s, (1,)) for s in seqs]
    acc, _ = eval_accuracy(drafter, embed, head, seqs, feats, val_ids, tcfg.anchors_per_sequence, tcfg.seed + 3,
                           tcfg.batch_sequences)
    assert acc == m["heldout_position_accuracy"]  # the returned drafter is the best one, not the last one
    assert sum(acc) / len(acc) == best
    assert len(m["train_position_accuracy"]) == drafter.cfg.block_size


def test_accepted_runs_count_the_leading_correct_drafts_only():
    hits = torch.tensor([[1, 1, 0, 1], [0, 1, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.float32)
    assert accepted_runs(hits).tolist() == [2, 0, 4, 0]  # a hit after the first miss is never accepted


@pytest.mark.parametrize("select", ["loss", "accepted"])
def test_the_select_rule_picks_the_kept_state(select):
    # the early-stopping recipe without the stop: held-out figures rise and fall, so the rules disagree
    tcfg = TrainConfig(steps=60, batch_sequences=4, anchors_per_sequence=4, lr=0.05, warmup=1, val_fraction=0.25,
                       eval_every=2, patience=1000, seed=6, matmul_dtype="float32", select=select)
    rt, seqs, drafter, m = _tiny_training(tcfg)
    curve = m["heldout_curve"]
    key = {"loss": lambda c: -c["heldout_loss"], "accepted": lambda c: c["heldout_accepted"]}[select]
    want = max(curve, key=key)  # the first best look, as the loop keeps it
    by_accuracy = max(curve, key=lambda c: c["heldout_mean_accuracy"])
    assert want["step"] != by_accuracy["step"]  # the rule decides here, else the test could not fail
    assert m["best_step"] == want["step"]
    assert m["heldout_loss"] == want["heldout_loss"] and m["heldout_accepted"] == want["heldout_accepted"]
    assert m["train_config"]["select"] == select
    embed, head = rt.model.get_input_embeddings(), rt.model.get_output_embeddings()
    feats = [trajectory_taps(rt, s, (1,)) for s in seqs]
    _, val_ids = split_trajectories(len(seqs), tcfg.seed, tcfg.val_fraction)
    ev = heldout_eval(drafter, embed, head, seqs, feats, val_ids, tcfg.anchors_per_sequence, tcfg.seed + 3,
                      tcfg.batch_sequences)
    assert ev.accepted == want["heldout_accepted"]  # the returned drafter is that state
    assert ev.accuracy[0] <= ev.accepted <= sum(ev.accuracy)  # a run needs position 1, and counts each hit once


@pytest.mark.parametrize("bad", ["mean", "", None, 1, "Loss"])
def test_a_bad_select_rule_is_refused_before_training(bad):
    tcfg = TrainConfig(steps=2, select=bad)
    with pytest.raises(BadInputError, match="select must be one of auto, " + ", ".join(SELECT_RULES)):
        _tiny_training(tcfg)


def test_a_training_budget_stops_training_and_keeps_the_best_state():
    # 0.001 min = 60 ms: spent within the first steps, whatever the machine
    tcfg = TrainConfig(steps=500, batch_sequences=4, anchors_per_sequence=4, warmup=1, val_fraction=0.25,
                       eval_every=100, budget_minutes=0.001, matmul_dtype="float32")
    rt, seqs, drafter, m = _tiny_training(tcfg)
    assert m["steps_run"] < tcfg.steps and "budget" in m["stopped"]
    assert m["heldout_curve"] and m["heldout_curve"][-1]["step"] == m["steps_run"]  # evaluated when it stopped
    assert m["best_step"] <= m["steps_run"] and m["heldout_position_accuracy"] is not None


@pytest.mark.parametrize("budget, cap, binds", [(None, 0.06, "prepare"), (0.001, 600.0, "training"),
                                                (10.0, 0.06, "prepare")])
def test_the_prepare_budgets_time_cap_stops_training_where_it_binds_first(budget, cap, binds):
    # 60 ms: spent within the first steps, whatever the machine; the stop names the limit that bound
    tcfg = TrainConfig(steps=500, batch_sequences=4, anchors_per_sequence=4, warmup=1, val_fraction=0.25,
                       eval_every=100, budget_minutes=budget, matmul_dtype="float32")
    model = build_tiny(TinySpec(pattern="CACA", dtype="float32", vocab_size=64, hidden_size=32, intermediate_size=64))
    rt = TargetRuntime.from_model(model)
    seqs = [[(a + i) % 63 + 1 for i in range(14)] for a in range(20)]
    dcfg = DrafterConfig(hidden_size=32, vocab_size=64, taps=(1,), block_size=4, num_layers=1, num_heads=4,
                         intermediate_size=64)
    _, m = train_drafter(rt, seqs, dcfg, tcfg, time_cap=cap)
    assert m["steps_run"] < tcfg.steps and m["time_cap_seconds"] == cap
    assert ("prepare budget" in m["stopped"]) == (binds == "prepare")
    assert ("training budget" in m["stopped"]) == (binds == "training")


def test_the_auto_schedule_is_the_minis_below_a_real_vocabulary_and_longer_and_budgeted_at_one():
    mini = resolve_schedule(TrainConfig(), LARGE_VOCAB - 1)
    assert (mini.steps, mini.patience, mini.budget_minutes) == (MINI_STEPS, MINI_PATIENCE, None) == (600, 4, None)
    real = resolve_schedule(TrainConfig(), LARGE_VOCAB)
    assert (real.steps, real.patience, real.budget_minutes) == (REAL_VOCAB_STEPS, REAL_VOCAB_PATIENCE,
                                                                 REAL_VOCAB_BUDGET)
    assert real.steps > mini.steps and real.patience > mini.patience
    assert (mini.select, real.select) == ("accuracy", "loss")  # the mini keeps the rule its bundle was built by
    given = resolve_schedule(TrainConfig(steps=7, patience=2, budget_minutes=None, select="accepted"), LARGE_VOCAB)
    assert (given.steps, given.patience, given.budget_minutes, given.select) == (7, 2, None, "accepted")


@pytest.mark.parametrize("field,value", [("steps", 0), ("steps", "many"), ("steps", True), ("steps", 2.5),
                                         ("patience", -1), ("budget_minutes", 0), ("budget_minutes", float("nan")),
                                         ("budget_minutes", float("inf")), ("budget_minutes", "soon"),
                                         ("select", "mean"), ("select", None)])
def test_the_schedule_refuses_bad_values(field, value):
    with pytest.raises(BadInputError, match=field):
        resolve_schedule(TrainConfig(**{field: value}), 100)


def test_training_records_the_resolved_schedule():
    # auto patience and budget at the tiny target's vocabulary of 64: the mini's values, not the strings
    rt, seqs, drafter, m = _tiny_training(TrainConfig(steps=3, batch_sequences=4, anchors_per_sequence=4, warmup=1,
                                                      val_fraction=0.25, matmul_dtype="float32"))
    rec = m["train_config"]
    assert (rec["steps"], rec["patience"], rec["budget_minutes"]) == (3, MINI_PATIENCE, None)
    assert m["steps_run"] == 3


def test_continuation_anchors_start_at_the_last_prompt_token():
    from dflash_core.prepare.train import anchor_range

    assert anchor_range(40, 10, 4, "continuation") == (9, 35)
    assert anchor_range(40, 10, 4, "all") == (1, 35)
    assert anchor_range(12, 10, 4, "continuation") == (1, 7)  # no continuation anchor fits: every anchor


def test_soft_targets_mix_the_label_with_the_targets_top_k_where_recorded():
    from dflash_core.prepare.teacher import TeacherData
    from dflash_core.prepare.train import soft_targets

    seq = list(range(1, 13))  # prompt of 4 tokens, 8 generated: teacher rows 3..10 predict tokens 4..11
    top_ids = torch.tensor([[t + 2, 99, 98] for t in range(3, 11)])  # row t predicts seq[t + 1] = t + 2
    top_logits = torch.tensor([[2.0, 1.0, 0.0]] * 8)
    data = TeacherData([seq], [4], None, [top_logits], [top_ids])
    anc = torch.tensor([[1, 5]])  # anchor 1 has rows 1..3: only row 3 is a teacher row; anchor 5: all are
    labels = torch.tensor(seq).unfold(0, 3, 1)[anc[0] + 1].unsqueeze(0)
    ids, probs = soft_targets(data, [0], anc, labels, 3, 3, 0.5)
    assert ids.shape == probs.shape == (1, 2, 3, 4)
    torch.testing.assert_close(probs.sum(-1), torch.ones(1, 2, 3))
    soft = 0.5 * torch.softmax(torch.tensor([2.0, 1.0, 0.0]), -1)
    torch.testing.assert_close(probs[0, 0, :2], torch.tensor([[1.0, 0, 0, 0]] * 2))  # prompt rows: the label
    torch.testing.assert_close(probs[0, 0, 2], torch.cat([torch.tensor([0.5]), soft]))
    assert torch.equal(ids[0, 1, :, 1], torch.tensor([7, 8, 9])) and torch.equal(ids[0, 1, :, 0], labels[0, 1])



def test_teacher_forced_text_beside_the_trajectories_keeps_their_top_k():
    # forced text records no top-k logits; extending the trajectories with it once dropped every trajectory's, so a
    # prepare with distillation at a real vocabulary (forced text on) trained on hard labels without saying so
    from dflash_core.prepare.teacher import TeacherData
    from dflash_core.prepare.train import soft_targets

    seq = list(range(1, 13))
    top_ids = torch.tensor([[t + 2, 99, 98] for t in range(3, 11)])
    gen = TeacherData([seq], [4], None, [torch.tensor([[2.0, 1.0, 0.0]] * 8)], [top_ids])
    forced = TeacherData([list(range(20, 32))], [1], preds=[torch.arange(20, 32)])
    for data, g, f in ((gen.extend(forced), 0, 1), (forced.extend(gen), 1, 0)):
        assert data.top_ids is not None and data.top_ids[f].shape == (0, 3)
        assert data.top_logits[f].dtype == torch.float32
        anc = torch.tensor([[5]])
        ids, probs = soft_targets(data, [g, f], anc.expand(2, 1), torch.zeros(2, 1, 3, dtype=torch.long), 3, 3, 0.5)
        assert torch.equal(ids[0, 0, :, 1], torch.tensor([7, 8, 9])) and bool((probs[0, 0, :, 0] == 0.5).all())
        torch.testing.assert_close(probs[1, 0], torch.tensor([[1.0, 0, 0, 0]] * 3))  # forced: the label alone


def test_teacher_data_of_other_tap_layers_is_not_joined():
    # the fusion reads a row's taps as one layout; rows tapped at other layers beside them would train it on
    # features no decode feeds it (drafter_arch's --taps study once built its forced text at prepare's layers)
    from dflash_core.prepare.teacher import TeacherData

    gen = TeacherData([list(range(1, 9))], [4], [torch.zeros(7, 6)], tap_layers=(1, 2))
    other = TeacherData([list(range(20, 28))], [1], [torch.zeros(7, 6)], tap_layers=(1, 3),
                        preds=[torch.arange(20, 28)])
    with pytest.raises(ValueError, match="tapped at layers"):
        gen.extend(other)
    same = TeacherData([list(range(20, 28))], [1], [torch.zeros(7, 6)], tap_layers=(1, 2), preds=[torch.arange(20, 28)])
    assert len(gen.extend(same).taps) == 2 and gen.extend(same).tap_layers == (1, 2)


def test_training_hands_freed_memory_back_at_each_evaluation(monkeypatch):
    # runtime/allocator.py: without it glibc keeps the steps' freed buffers (gigabytes over a 350M training)
    import dflash_core.prepare.train as train_mod

    calls = []
    monkeypatch.setattr(train_mod, "trim_free_memory", lambda: calls.append(1) or True)
    tcfg = TrainConfig(steps=6, batch_sequences=4, anchors_per_sequence=4, warmup=1, val_fraction=0.25,
                       eval_every=2, patience=100, matmul_dtype="float32")
    _, _, _, m = _tiny_training(tcfg)
    assert len(calls) == len(m["heldout_curve"]) == 3
