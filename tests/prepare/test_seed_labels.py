"""Labels and score from the target (design contract 12): anchors inside the seed text relabelled with the
target's own argmax (TrainConfig.seed_labels), the validity rule of teacher-forced text applied to them, and the
held-out accuracy at the anchors a decode drafts from reported beside the old figure."""

from __future__ import annotations

import random

import pytest
import torch

from dflash_core.errors import BadInputError
from dflash_core.prepare.teacher import TeacherData
from dflash_core.prepare.train import (
    LARGE_VOCAB,
    TrainConfig,
    _preds,
    anchor_range,
    heldout_eval,
    resolve_seed_labels,
    train_config_dict,
    train_drafter,
)
from dflash_core.runtime.drafter import DrafterConfig
from dflash_core.runtime.target import TargetRuntime
from dflash_core.testing import TinySpec, build_tiny


def test_seed_anchors_take_the_targets_predictions_as_labels_and_generated_ones_keep_their_tokens():
    seqs = [[1, 2, 3, 4, 10, 11, 12], [5, 6, 7, 13, 14, 15, 16]]
    data = TeacherData(seqs, [4, 3], prompt_preds=[torch.tensor([2, 9, 4]), torch.tensor([8, 7])])
    tok = torch.tensor(seqs)
    assert _preds(data, [0, 1], tok) is None  # 'text': the tokens are the labels
    got = _preds(data, [0, 1], tok, relabel=True)
    assert got.tolist() == [[1, 2, 9, 4, 10, 11, 12], [5, 8, 7, 13, 14, 15, 16]]
    # forced text keeps its own predictions; a trajectory without recorded predictions keeps its tokens
    forced = TeacherData(seqs, [4, 1], preds=[None, torch.tensor([5, 5, 5, 5, 5, 5, 5])],
                         prompt_preds=[None, None])
    assert _preds(forced, [0, 1], tok, relabel=True).tolist() == [seqs[0], [5] * 7]


def test_a_relabelled_block_trains_only_while_the_seed_follows_the_targets_predictions():
    """Blocks of 3 in [1, 2, 3, 4 | 10 11 12 13], the target predicting 2, 9, 4 after 1, 2, 3: at anchor 0 the labels
    are 2 (= the seed's), 9 (the target's, after the seed's 2 it would also have emitted) and 4, which follows the
    seed's 3 where the target would have emitted 9: dropped (`valid_labels`, the forced text's rule, which
    `block_loss` applies). From the last seed token on every label holds."""
    from dflash_core.prepare.train import valid_labels

    seqs = [[1, 2, 3, 4, 10, 11, 12, 13]]
    data = TeacherData(seqs, [4], prompt_preds=[torch.tensor([2, 9, 4])])
    tok = torch.tensor(seqs)
    preds = _preds(data, [0], tok, relabel=True)
    assert preds[0, 1:4].tolist() == [2, 9, 4]
    ok = valid_labels(tok, preds, torch.tensor([[0, 1, 3]]), 3)
    assert ok.tolist() == [[[True, True, False], [True, False, False], [True, True, True]]]


def test_seed_anchors_end_before_the_last_prompt_token():
    assert anchor_range(40, 10, 4, "seed") == (1, 8)
    assert anchor_range(40, 10, 4, "continuation") == (9, 35)


def test_seed_labels_auto_is_the_targets_at_a_real_vocabulary_and_the_minis_recorded_config_is_unchanged():
    assert resolve_seed_labels("auto", LARGE_VOCAB) == "target" and resolve_seed_labels("auto", 2048) == "text"
    assert "seed_labels" not in train_config_dict(TrainConfig())
    assert "seed_labels" not in train_config_dict(TrainConfig(seed_labels="text"))
    assert train_config_dict(TrainConfig(seed_labels="target"))["seed_labels"] == "target"
    for bad in ("human", 1, None):
        with pytest.raises(BadInputError, match="seed_labels"):
            resolve_seed_labels(bad, 2048)


def _train(seed_labels: str):
    model = build_tiny(TinySpec(pattern="CACA", dtype="float32", vocab_size=64, hidden_size=32,
                                intermediate_size=64))
    rt = TargetRuntime.from_model(model)
    r = random.Random(0)
    seqs = [[r.randrange(1, 64) for _ in range(18)] for _ in range(16)]
    data = TeacherData(seqs, [8] * len(seqs))
    dcfg = DrafterConfig(hidden_size=32, vocab_size=64, taps=(1,), block_size=4, num_layers=1, num_heads=4,
                         intermediate_size=64)
    tcfg = TrainConfig(steps=4, batch_sequences=4, anchors_per_sequence=4, warmup=1, val_fraction=0.25,
                       matmul_dtype="float32", seed_labels=seed_labels)
    drafter, m = train_drafter(rt, seqs, dcfg, tcfg, teacher=data)
    return rt, data, drafter, m, tcfg


def test_training_reports_decode_anchor_accuracy_beside_the_old_figure_and_relabels_the_seed():
    rt, data, drafter, m, tcfg = _train("target")
    assert m["train_config"]["seed_labels"] == "target" and data.prompt_preds is None  # computed on a copy
    assert len(m["heldout_decode_position_accuracy"]) == 4 and m["heldout_anchors"] == "all"
    embed, head = rt.model.get_input_embeddings(), rt.model.get_output_embeddings()
    from dflash_core.prepare.train import prompt_predictions, split_trajectories, trajectories_taps

    data.taps = trajectories_taps(rt, data.sequences, (1,))
    data.prompt_preds = prompt_predictions(rt, data)
    _, val = split_trajectories(len(data), tcfg.seed, tcfg.val_fraction)
    ev = lambda rule, relabel: heldout_eval(drafter, embed, head, data, None, val, 4, tcfg.seed + 3, 4,  # noqa: E731
                                            rule=rule, relabel=relabel, compute_dtype=torch.float32)
    assert ev("continuation", False).accuracy == m["heldout_decode_position_accuracy"]
    assert ev("all", True).accuracy == m["heldout_position_accuracy"]  # today's figure, on the target's labels
    # random seeds: the target's argmax rarely equals the seed's next token, so the two labellings score apart
    assert ev("seed", True).loss != ev("seed", False).loss
