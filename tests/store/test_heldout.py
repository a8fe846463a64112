"""Held-out by construction (docs/design.md §6): the one n-gram guard and every consumer that calls it.

The rule is pinned by edge cases (8 units shared: refused; 7: allowed; case, spacing and line breaks do
not hide a near-duplicate). Then a benchmark prompt is planted into each kind of training text in turn
(train seeds, the mini target's corpus, a teacher trajectory reaching drafter training and every fitter,
calibration prompts) and must be refused, or, for generated trajectories, dropped and counted.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from dflash_core.errors import BadInputError
from dflash_core.store.data import check_sequences, load_all_families, load_prompts, shipped_held_out
from dflash_core.store.heldout import N_UNITS, check_clean, filter_clean, held_out, leaks, units

BENCH = load_prompts("code").benchmark  # code prompts: the mini target's family


# --- the rule ------------------------------------------------------------------------------------------

def test_units_ignore_case_spacing_and_line_breaks():
    assert units("DEF  __init__( self,config ):") == units("def __init__(self, config):") == \
        ["def", "__init__", "(", "self", ",", "config", ")", ":"]
    assert units("class Ｏrca(nn.Module):")[1] == "orca"  # NFKC: a full-width letter is the plain one


def test_near_duplicate_is_caught():
    held = held_out(["class OrcaGroupedAttention(nn.Module):"])
    assert leaks("class orcagroupedattention (\n    nn.Module\n)  :\n    pass", held)
    assert leaks("x = 1\nCLASS OrcaGroupedAttention(nn.Module): # copied", held)


def test_eight_shared_units_are_refused_seven_are_not():
    assert N_UNITS == 8
    prompt = "    def __init__(self, orca_config, layer_idx):"  # 10 units
    held = held_out([prompt])
    seven = "def __init__(self, orca_config, something_else):"  # shares its first 7 units only
    eight = "def __init__(self, orca_config, layer_idx = 3"  # shares its first 8 units
    assert units(seven)[:7] == units(prompt)[:7] and not leaks(seven, held)
    assert leaks(eight, held) == [tuple(units(prompt)[:8])]


def test_a_short_prompt_is_one_ngram_and_units_are_whole_identifiers():
    held = held_out(["def rotate_ibis_half(x):"])  # 6 units: the whole prompt is the n-gram
    assert leaks("y = 2\ndef rotate_ibis_half( x ):\n    return x", held)
    assert not leaks("def rotate_ibis_half(x)", held)  # 5 of its 6 units
    assert not leaks("def rotate_ibis_halves(x):", held)  # another identifier, not a prefix match


def test_check_clean_names_consumer_ngram_prompt_and_fix():
    held = held_out([BENCH[0]])
    with pytest.raises(BadInputError) as err:
        check_clean(["import torch", "  " + BENCH[0].upper()], held, "the planted consumer", fix="do the fix")
    msg = str(err.value)
    assert "the planted consumer" in msg and "text 1" in msg and repr(BENCH[0]) in msg and "do the fix" in msg
    assert " ".join(units(BENCH[0])[:N_UNITS]) in msg
    assert filter_clean(["import torch", BENCH[0], "x = 1"], held) == ([0, 2], [1])


# --- the shipped prompt sets -----------------------------------------------------------------------------

def test_prompt_sets_refuse_a_near_duplicate_across_splits(monkeypatch):
    from dflash_core.store import data

    fams = data._families()
    code = dict(fams["code"])
    code["train"] = [*code["train"], "  " + code["benchmark"][2].strip().upper()]
    monkeypatch.setattr(data, "_families", lambda: {**fams, "code": code})
    with pytest.raises(BadInputError, match="train prompts"):
        load_prompts("code")
    cal = dict(fams["code"])
    cal["calibration"] = [*cal["calibration"], cal["benchmark"][0] + "  # tweaked"]
    monkeypatch.setattr(data, "_families", lambda: {**fams, "code": cal})
    with pytest.raises(BadInputError, match="calibration prompts"):
        load_prompts("code")


def test_shipped_prompts_are_held_out_from_the_mini_corpus_and_the_train_seeds():
    """The shipped benchmark and calibration prompts share no n-gram with the mini target's training corpus
    (the 400 transformers source files, read only: ~2 s) nor with any family's train seeds."""
    from dflash_core.prepare.minitarget import MiniTargetConfig, check_corpus, corpus_texts

    held = shipped_held_out()
    assert len(held.grams) >= 20
    check_corpus(corpus_texts(MiniTargetConfig()))
    for ps in load_all_families():
        check_clean(ps.train, held, f"{ps.family} train seeds")


def test_the_old_code_benchmark_prompts_are_in_the_corpus():
    """Why the code prompts were replaced: the guard finds the old ones in the target's corpus."""
    from dflash_core.prepare.minitarget import MiniTargetConfig, corpus_texts

    old = held_out(["def rotate_half(x):", "        if attention_mask is not None:"])
    assert sum(bool(leaks(t, old)) for t in corpus_texts(MiniTargetConfig(corpus_files=20))) >= 5


# --- planted leaks: the corpus ---------------------------------------------------------------------------

def _small_corpus():
    from dflash_core.prepare.minitarget import MiniTargetConfig, corpus_texts

    return corpus_texts(MiniTargetConfig(corpus_files=3))


def test_corpus_check_refuses_a_planted_prompt():
    from dflash_core.prepare.minitarget import check_corpus

    texts = _small_corpus()
    check_corpus(texts)  # the real files are clean
    planted = [*texts[:2], texts[2] + "\n\n" + "\n".join("    " + u for u in BENCH[3].split())]
    with pytest.raises(BadInputError, match=r"mini target's corpus: b\.py shares"):
        check_corpus(planted, ["a.py", "c.py", "b.py"])


def test_mini_target_build_refuses_a_leaking_corpus_before_training(monkeypatch, tmp_path):
    from dflash_core.prepare import minitarget as mt

    texts = _small_corpus()
    monkeypatch.setattr(mt, "corpus_texts", lambda cfg: [*texts[:-1], texts[-1] + "\n" + BENCH[1] + "\n"])
    monkeypatch.setattr(mt, "train_tokenizer", lambda *a, **k: pytest.fail("trained on a leaking corpus"))
    with pytest.raises(BadInputError, match="mini target's corpus"):
        mt.build_mini_target(tmp_path / "mini", mt.MiniTargetConfig(corpus_files=3, vocab_size=320), progress=False)
    assert not (tmp_path / "mini" / "config.json").exists()


# --- planted leaks: train seeds ----------------------------------------------------------------------------

class _ByteRuntime:
    """A stand-in target with a byte tokenizer (text exists), enough for the seed and guard checks."""

    tokenizer = object()
    vocab_size = 260
    name = "byte-stub"

    def __init__(self, info=None):
        self.info = info or {}

    def encode(self, text):
        return [1, *text.encode()]

    def decode(self, ids):
        return bytes(i for i in ids if 1 < i < 256).decode(errors="replace")


def test_train_seeds_refuse_a_planted_benchmark_prompt(monkeypatch):
    from dflash_core.prepare import pipeline
    from dflash_core.prepare.pipeline import PrepareConfig, train_seed_ids

    ps = load_prompts("code")
    only_family = PrepareConfig(corpus_seeds=0)  # the family's own seeds, no training text cut
    assert len(train_seed_ids(_ByteRuntime(), only_family, "code")) == len(ps.train)  # the shipped seeds pass
    planted = replace(ps, train=(*ps.train, BENCH[2].replace("    ", "\t")))  # a whitespace variant
    monkeypatch.setattr(pipeline, "load_prompts", lambda family: planted)  # where the pipeline looks it up
    with pytest.raises(BadInputError, match="'code' train seeds"):
        train_seed_ids(_ByteRuntime(), only_family, "code")


def test_a_corpus_line_is_refused_as_corpus_and_as_cut_seed(monkeypatch):
    from dflash_core.prepare import pipeline as mt  # the corpus functions, where the pipeline looks them up
    from dflash_core.prepare.pipeline import PrepareConfig, train_seed_ids

    rt = _ByteRuntime({"mini_corpus_files": 3})
    corpus = ["x = torch.zeros(3, 4)\nimport math as m\n" + BENCH[0] + "\n"]
    monkeypatch.setattr(mt, "corpus_texts", lambda cfg: corpus)
    cfg = PrepareConfig(corpus_seeds=10)  # more than the corpus has lines: every line is cut
    with pytest.raises(BadInputError, match="mini target's corpus"):
        train_seed_ids(rt, cfg, "code")
    monkeypatch.setattr(mt, "check_corpus", lambda texts, names=None: None)  # the corpus check bypassed
    with pytest.raises(BadInputError, match="cut from the corpus"):
        train_seed_ids(rt, cfg, "code")
    corpus[0] = "x = torch.zeros(3, 4)\nimport math as m\n"
    assert len(train_seed_ids(rt, cfg, "code")) == len(load_prompts("code").train) + 2


# --- planted leaks: teacher trajectories, drafter training, every fitter ---------------------------------

@pytest.fixture(scope="module")
def tok_lab(tmp_path_factory):
    """A tiny LFM2 with a real byte-level BPE tokenizer (so trajectories have text), saved and loaded."""
    from dflash_core.prepare import minitarget as mt
    from dflash_core.runtime.target import load_target
    from dflash_core.testing import TinySpec, build_tiny

    root = tmp_path_factory.mktemp("heldout-lab")
    tcfg = mt.MiniTargetConfig(vocab_size=320, corpus_files=3, threads=1)
    tok = mt.train_tokenizer(mt.corpus_texts(tcfg), tcfg)
    build_tiny(TinySpec(dtype="float32", pattern="CCACAC", vocab_size=len(tok))).save_pretrained(root / "ckpt")
    tok.save_pretrained(root / "ckpt")
    return root, load_target(str(root / "ckpt"), "cpu", "float32")


def _planted(rt, tail_from):
    return rt.encode("import torch\n" + BENCH[4] + "\n    return x") + list(tail_from[-6:])


def test_prepare_drops_and_counts_a_leaking_trajectory(tok_lab, monkeypatch):
    from dflash_core.prepare import pipeline as teacher  # teacher_data where the pipeline looks it up
    from dflash_core.prepare.pipeline import TRAJ_FILE, prepare
    from dflash_core.testing import tiny_prepare_config

    root, rt = tok_lab
    real = teacher.teacher_data
    planted = {}

    def teacher_with_a_leak(rt_, seeds, n, *args, **kwargs):
        data = real(rt_, seeds, n, *args, **kwargs)
        data.sequences[1] = planted["seq"] = _planted(rt_, data.sequences[1])
        return data

    monkeypatch.setattr(teacher, "teacher_data", teacher_with_a_leak)
    small = tiny_prepare_config()  # every fitter still runs, only shorter: this test is about the data
    small = replace(small, traj_tokens=12, aux_steps=2, aux_max_examples=32, train=replace(small.train, steps=3))
    out = prepare(str(root / "ckpt"), home=root / "home", cfg=small, rt=rt, progress=False)
    man = json.loads((out / "manifest.json").read_text())
    rec = man["held_out"]
    assert rec["trajectories_checked"] and rec["trajectories_dropped"] == 1 and rec["dropped_indexes"] == [1]
    assert man["teacher"]["sequences"] == rec["trajectories_generated"] - 1 == man["seeds"]["train_seed_count"]
    kept = json.loads((out / TRAJ_FILE).read_text())["sequences"]
    assert planted["seq"] not in kept and len(kept) == man["teacher"]["sequences"]


def test_drafter_training_refuses_a_force_fed_leaking_trajectory(tok_lab):
    from dflash_core.prepare.train import TrainConfig, train_drafter
    from dflash_core.runtime.drafter import DrafterConfig, default_taps

    _, rt = tok_lab
    clean = [rt.encode("import torch\nx = torch.ones(3)\n") + [5] * 8]
    dcfg = DrafterConfig(hidden_size=rt.hidden_size, vocab_size=rt.vocab_size, taps=default_taps(rt.num_layers, 2),
                         block_size=4, num_layers=1, num_heads=4, intermediate_size=2 * rt.hidden_size)
    train_drafter(rt, clean * 2, dcfg, TrainConfig(steps=1, batch_sequences=2, anchors_per_sequence=2))
    with pytest.raises(BadInputError, match="drafter training: trajectory 1 shares"):
        train_drafter(rt, [clean[0], _planted(rt, clean[0])], dcfg, TrainConfig(steps=1))


def _all_fitters():
    from dflash_core.methods import fitters

    return fitters()


@pytest.mark.parametrize("fitter", _all_fitters(), ids=lambda f: f.name)
def test_every_fitter_refuses_a_force_fed_leaking_trajectory(tok_lab, fitter):
    """Through `Fitter.__call__`, the way prepare runs them: the guard runs before the fit touches anything
    (drafter=None would fail otherwise), so no fitter can skip it."""
    from dflash_core.methods import FitContext
    from dflash_core.prepare.pipeline import PrepareConfig

    _, rt = tok_lab
    seq = rt.encode("import torch\n") + [5] * 10
    ctx = FitContext(rt=rt, drafter=None, trajectories=[seq, _planted(rt, seq)], prompt_lens=[3, 3],
                     cfg=PrepareConfig(), family="code", progress=False)
    with pytest.raises(BadInputError, match=f"fitter {fitter.name!r}: trajectory 1 shares"):
        fitter(ctx)


def test_tokenizer_less_targets_are_skipped_with_a_reason(tiny_prepared):
    """Tiny targets have no tokenizer: their seeds are random ids, no text; prepare records why it skipped."""
    rec = tiny_prepared.prepared.manifest["held_out"]
    assert rec["trajectories_checked"] is False and "no tokenizer" in rec["why_unchecked"]
    assert check_sequences(tiny_prepared.rt, [[5, 6, 7]], "x") is False


# --- planted leaks: calibration ---------------------------------------------------------------------------

def test_calibration_refuses_a_benchmark_variant_as_text_or_ids(tok_lab):
    from dflash_core.bench.calibrate import _refuse_benchmark_prompts
    from dflash_core.store.data import refuse_benchmark

    _, rt = tok_lab
    cal = list(load_prompts("code").calibration)
    refuse_benchmark(cal, "code", "calibration")
    _refuse_benchmark_prompts(rt, None, [rt.encode(t) for t in cal], cal, "code", "calibration")
    variant = BENCH[5].strip() + "  # same line"
    with pytest.raises(BadInputError, match="benchmark"):
        refuse_benchmark([*cal, variant], "code", "calibration")
    with pytest.raises(BadInputError, match=r"prompt ids.*benchmark"):
        _refuse_benchmark_prompts(rt, None, [rt.encode(variant)], None, "code", "calibration")


def test_the_guard_holds_out_every_family():
    """A wrong prompt family must not open a hole: the english benchmark is held out from code seeds too."""
    english = load_prompts("english").benchmark[1]
    assert leaks("x = 1  # " + english.lower(), shipped_held_out())
