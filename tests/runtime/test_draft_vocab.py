"""Draft vocabulary (FR-Spec / EAGLE-3 draft-to-target map) and teacher-forced text: the map is
checked as hostile input, drafting over K ids equals the full head restricted to them, training labels outside
the map count as misses, teacher-forced labels stop where the text leaves the target's predictions, and the
forced text is held out like every consumer of training text."""

from __future__ import annotations

import pytest
import torch

from dflash_core.prepare import traindata as td
from dflash_core.prepare.teacher import TeacherData
from dflash_core.prepare.train import (
    block_loss,
    coverage_of,
    draft_vocabulary,
    label_counts,
    resolve_draft_vocab,
)
from dflash_core.runtime.drafter import OOV_LOGIT, DrafterConfig, DraftState, check_draft_map, init_drafter
from dflash_core.store.data import load_prompts

H, V, K = 32, 64, 16


def _drafter(k=K, seed=0):
    d = init_drafter(DrafterConfig(hidden_size=H, vocab_size=V, taps=(0,), block_size=4, num_heads=2,
                                   intermediate_size=48, draft_vocab=k), seed)
    if k:
        d.set_draft_map(torch.arange(V)[torch.randperm(V, generator=torch.Generator().manual_seed(1))[:k]].sort()[0])
    return d.double().eval()


@pytest.mark.parametrize("d2t,match", [
    (torch.arange(K - 1), "shape"), (torch.arange(K).float(), "integer"), (torch.arange(K) + V, "outside"),
    (torch.zeros(K, dtype=torch.long), "repeats"), (None, "no draft-to-target map")])
def test_a_hostile_draft_map_is_refused(d2t, match):
    cfg = DrafterConfig(hidden_size=H, vocab_size=V, taps=(0,), draft_vocab=K)
    with pytest.raises(ValueError, match=match):
        check_draft_map(cfg, d2t, "test")


@pytest.mark.parametrize("k", [-1, V + 1, True, "8", 10 ** 12])
def test_a_hostile_draft_vocab_size_is_refused_before_allocating(k):
    with pytest.raises(ValueError, match="draft_vocab"):
        init_drafter(DrafterConfig(hidden_size=H, vocab_size=V, taps=(0,), draft_vocab=k), 0)


def test_drafting_over_the_draft_vocabulary_is_the_full_head_restricted_to_it():
    d = _drafter()
    full = _drafter(k=0)
    full.load_state_dict({k: v for k, v in d.state_dict().items() if k != "d2t"})
    embed, head = torch.nn.Embedding(V, H).double(), torch.nn.Linear(H, V, bias=False).double()
    taps = torch.randn(5, H, dtype=torch.float64)
    outs = []
    for m in (d, full):
        st = DraftState(m)
        st.extend(taps)
        outs.append(st.draft(3, embed, head))
    (lg, hid), (lg_full, hid_full) = outs
    assert torch.equal(hid, hid_full)
    inside = torch.zeros(V, dtype=torch.bool)
    inside[d.d2t] = True
    assert torch.allclose(lg[:, inside], lg_full[:, inside]) and bool((lg[:, ~inside] == OOV_LOGIT).all())
    assert set(lg.argmax(-1).tolist()) <= set(d.d2t.tolist())
    assert torch.isfinite(torch.softmax(lg, -1) * torch.log_softmax(lg, -1)).all()  # entropy stays finite


def test_the_map_round_trips_through_the_state_dict_and_a_bad_one_is_refused():
    d = _drafter()
    sd = d.state_dict()
    e = init_drafter(d.cfg, 5).double()
    e.load_state_dict(sd)
    assert torch.equal(e.d2t, d.d2t)
    bad = dict(sd)
    bad["d2t"] = torch.zeros(K, dtype=torch.long)
    with pytest.raises(ValueError, match="repeats"):
        e.load_state_dict(bad)


def test_the_draft_vocabulary_is_the_most_frequent_ids_by_coverage():
    counts = torch.zeros(1024, dtype=torch.long)
    counts[:300] = 100
    counts[300:] = 1
    d2t = draft_vocabulary(counts, "auto", 0.9)
    assert d2t.numel() == 512 and set(range(300)) <= set(d2t.tolist())  # rounded up to 256s
    assert coverage_of(counts, d2t) >= 0.9
    assert draft_vocabulary(counts, 7, 0.9).tolist() == list(range(7))
    assert draft_vocabulary(counts, "auto", 0.9, floor=768).numel() == 768
    assert resolve_draft_vocab("auto", 2048) == "off" and resolve_draft_vocab("auto", 49152) == "auto"


def test_the_auto_draft_vocabulary_stops_at_its_cap_and_a_given_k_is_kept():
    counts = torch.ones(4096, dtype=torch.long)  # flat outputs: 99 % coverage needs nearly every id
    counts[:10] = 50
    full = draft_vocabulary(counts, "auto", 0.99)
    assert full.numel() == 4096
    capped = draft_vocabulary(counts, "auto", 0.99, floor=256, cap=1024)
    assert capped.numel() == 1024 and set(range(10)) <= set(capped.tolist())  # the most frequent stay in
    assert capped.tolist() == sorted(capped.tolist())
    assert coverage_of(counts, capped) < 0.99  # the cap bound: coverage is what it costs, and the record says so
    assert draft_vocabulary(counts, 2048, 0.99, floor=256, cap=1024).numel() == 2048  # an explicit K is not capped


@pytest.mark.parametrize("coverage, floor, cap, match", [
    (0.0, 0, 0, "draft_coverage"), (1.5, 0, 0, "draft_coverage"), ("0.9", 0, 0, "draft_coverage"),
    (True, 0, 0, "draft_coverage"), (0.9, -1, 0, "draft_vocab_min"), (0.9, 1.5, 0, "draft_vocab_min"),
    (0.9, 0, -8, "draft_vocab_max"), (0.9, 0, True, "draft_vocab_max"), (0.9, 4096, 1024, "above draft_vocab_max"),
])
def test_bad_draft_vocabulary_knobs_are_refused(coverage, floor, cap, match):
    from dflash_core.errors import BadInputError

    with pytest.raises(BadInputError, match=match):
        draft_vocabulary(torch.ones(64, dtype=torch.long), "auto", coverage, floor, cap)


def test_prepare_refuses_bad_draft_vocabulary_knobs_before_any_work(tmp_path):
    from dataclasses import replace

    from dflash_core.errors import BadInputError
    from dflash_core.prepare.pipeline import PrepareConfig, prepare
    from dflash_core.prepare.train import TrainConfig

    cfg = PrepareConfig(train=replace(TrainConfig(), draft_vocab_min=32768, draft_vocab_max=16384))
    with pytest.raises(BadInputError, match="above draft_vocab_max"):
        prepare("mini", home=tmp_path / "home", cfg=cfg, progress=False)
    assert not (tmp_path / "home").exists()  # refused before the home was touched


def test_labels_outside_the_draft_vocabulary_count_as_misses_and_train_nothing():
    torch.manual_seed(0)
    d = _drafter()
    embed, head = torch.nn.Embedding(V, H).double(), torch.nn.Linear(H, V, bias=False).double()
    outside = [t for t in range(V) if t not in set(d.d2t.tolist())]
    tok = torch.tensor([[5] * 6 + outside[:6]])
    ft = torch.randn(1, 12, H, dtype=torch.float64)
    anc = torch.tensor([[6]])
    loss, acc = block_loss(d, embed, head, tok, ft, anc, 4.0)
    assert float(loss.detach()) == 0.0 and acc.tolist() == [0.0] * 4


def test_teacher_forced_labels_stop_where_the_text_leaves_the_target_predictions():
    torch.manual_seed(0)
    d = _drafter(k=0)
    embed, head = torch.nn.Embedding(V, H).double(), torch.nn.Linear(H, V, bias=False).double()
    tok = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    preds = tok.clone()
    preds[0, 4] = 9  # the target predicted 9 where the text has 5: labels after position 4 are not greedy
    ft = torch.randn(1, 8, H, dtype=torch.float64)
    anc = torch.tensor([[2]])
    # labels preds[3..6]: valid are 3 (always) and 4 (text 3 == pred 3); 5 needs text 4 == pred 4 = 9: not greedy
    got = block_loss(d, embed, head, tok, ft, anc, 1e9, preds=preds)[0].detach()
    only = torch.tensor([[[True, True, False, False]]])
    want = block_loss(d, embed, head, tok, ft, anc, 1e9, preds=preds, keep=only)[0].detach()
    every = block_loss(d, embed, head, tok, ft, anc, 1e9, preds=tok)[0].detach()  # generated: all four rows
    assert torch.allclose(got, want) and not torch.allclose(got, every)
    data = TeacherData([tok[0].tolist()], [1], preds=[preds[0]])
    assert label_counts(data, [0], V)[9] == 1 and data.own_tokens(0).tolist() == preds[0, 1:].tolist()


def test_forced_text_skips_seed_lines_and_lines_that_leak_a_held_out_prompt(tmp_path):
    bench = load_prompts("english").benchmark[0]
    text = (f"{bench} and then the sentence goes on.\nA line a seed was cut from, long enough.\n"
            "A clean line of prose that nobody seeded.\n")
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    lines, rec = td.forced_lines(td.load_train_text(str(tmp_path / "t.txt"), "english"),
                                 ["A line a seed was cut from, long enough."])
    assert lines == ["A clean line of prose that nobody seeded."]
    assert rec["lines_dropped_heldout"] == 1 and rec["lines_with_a_seed"] == 1


def test_the_transformers_export_records_the_map_and_a_hostile_one_is_refused():
    from types import SimpleNamespace

    from dflash_core.errors import BadInputError
    from dflash_core.prepare.drafter_format import check_hf_config, drafter_config_from_hf, hf_config

    d = _drafter()
    doc = hf_config(d.cfg, SimpleNamespace(), None, d.d2t).to_dict()
    doc["model_type"] = "muse_glimmer_assistant"
    check_hf_config(doc, "test")
    assert drafter_config_from_hf(doc, V).draft_vocab == K and doc["dflash_draft_to_target"] == d.d2t.tolist()
    for bad in ({"dflash_draft_to_target": doc["dflash_draft_to_target"][:-1]},
                {"dflash_draft_to_target": ["1"] * K}, {"dflash_draft_vocab_size": None}):
        with pytest.raises(BadInputError, match="dflash_draft"):
            check_hf_config({**doc, **bad}, "test")


def test_forced_chunks_cut_the_text_without_a_false_length_warning():
    """The forced text is tokenized whole and cut into chunks, so no chunk reaches the model at more than its
    length: transformers' "will result in indexing errors" warning would be false (it printed on every real
    prepare, 25,371 > 8,192)."""
    import logging

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.utils import logging as hf_logging

    tk = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "b": 2}, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, model_max_length=20)
    seen: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: seen.append(record.getMessage())
    hf_logger, before = hf_logging.get_logger(), hf_logging.get_verbosity()
    hf_logging.set_verbosity_warning()
    hf_logger.addHandler(handler)
    try:
        chunks = td.forced_chunks(tok, ["a b " * 10] * 4, 1000, 16)
    finally:
        hf_logger.removeHandler(handler)
        hf_logging.set_verbosity(before)
    assert [len(c) for c in chunks] == [16] * 5 and set(sum(chunks, [])) == {1, 2}
    assert not [m for m in seen if "longer than the specified maximum" in m], seen


def test_a_draft_vocabulary_drafts_through_a_onednn_prepacked_head():
    """Under `--kernels onednn` the target's head is a
    prepacked MkldnnLinear whose weight has no row gather; drafting over the K draft ids crashed the bench at
    its first dflash draft. The logits must equal those through the plain head."""
    from torch.utils.mkldnn import MkldnnLinear

    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch build has no oneDNN: the prepacked head cannot exist")
    d = _drafter().float()
    head = torch.nn.Linear(H, V, bias=False)
    packed = MkldnnLinear(head, torch.float32)
    hidden = torch.randn(3, 5, H)
    with torch.no_grad():
        want, got = d.logits(hidden, head), d.logits(hidden, packed)
    assert got.shape == (3, 5, V) and torch.allclose(got, want, atol=1e-5)
    assert (got[..., d.d2t] > OOV_LOGIT).all()
