"""--train-data: every source kind loads, hostile input is refused with one clear error, seeds are cut
deterministically, seeds that leak a held-out prompt are dropped and counted, and the shipped corpora are the
default for every target."""

from __future__ import annotations

import json
import os

import pytest

from dflash_core.errors import BadInputError
from dflash_core.prepare import traindata as td
from dflash_core.store.data import load_prompts, shipped_held_out
from dflash_core.store.heldout import filter_clean

PROSE = ("The committee met on Tuesday to review the budget for the coming year. It approved the plan after a long "
         "debate about the costs of the new bridge. Several members asked for a second vote.\n"
         "Short.\nA line of moderate length that makes a seed on its own.\n")


class _ByteRuntime:
    tokenizer = object()
    vocab_size = 260
    name = "byte-stub"
    info: dict = {}

    def encode(self, text):
        return [1, *text.encode()]


def test_a_text_file_is_cut_into_line_and_sentence_starts(tmp_path):
    (tmp_path / "a.txt").write_text(PROSE, encoding="utf-8")
    tt = td.load_train_text(str(tmp_path / "a.txt"), "english")
    assert tt.kind == "file" and len(tt.sha256) == 64
    frags = td.fragments(PROSE)
    assert "A line of moderate length that makes a seed on its own." in frags
    assert "The committee met on Tuesday to review the budget for the coming year." in frags
    assert all(td.SEED_MIN <= len(f.strip()) <= td.SEED_MAX for f in frags) and "Short." not in frags
    seeds, info = td.cut_seeds(tt, 3, seed=7)
    assert seeds == td.cut_seeds(tt, 3, seed=7)[0] and len(seeds) == 3 == info["seeds_cut"]


def test_folder_jsonl_and_datasets_sources(tmp_path):
    d = tmp_path / "docs"
    (d / "sub").mkdir(parents=True)
    (d / "b.txt").write_text("Another line that is long enough to be a seed.\n", encoding="utf-8")
    (d / "sub" / "a.md").write_text(PROSE, encoding="utf-8")
    (d / "c.jsonl").write_text(json.dumps({"text": PROSE}) + "\n\n" + json.dumps({"text": "x" * 3}) + "\n")
    tt = td.load_train_text(str(d), "english")
    assert tt.kind == "folder" and tt.names == ["b.txt", "c.jsonl line 1", "c.jsonl line 2", "sub/a.md"]
    j = td.load_train_text(str(d / "c.jsonl"), "english")
    assert j.kind == "jsonl" and j.texts == [PROSE, "xxx"]
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list([{"text": PROSE}, {"text": "More text in a second row of the set."}]).save_to_disk(
        str(tmp_path / "ds"))
    ds = td.load_train_text(str(tmp_path / "ds"), "english")
    assert ds.kind == "datasets-disk" and ds.texts[0] == PROSE and len(ds.texts) == 2


def test_a_hub_dataset_id_is_read_from_the_local_cache_only(tmp_path, monkeypatch):
    pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    with pytest.raises(BadInputError, match="local datasets cache"):
        td.load_train_text("nobody/no-such-dataset-here", "english")
    assert os.environ["HF_DATASETS_OFFLINE"] == "1"


@pytest.mark.parametrize("case", ["not-utf8", "nul", "missing", "empty", "jsonl-not-json", "jsonl-no-text",
                                  "jsonl-long-line", "too-big", "fifo", "empty-folder"])
def test_hostile_train_data_is_refused_with_one_clear_error(tmp_path, monkeypatch, case):
    p = tmp_path / "data.txt"
    if case == "not-utf8":
        p.write_bytes(b"caf\xe9 au lait is a drink\n")
        match = "not UTF-8"
    elif case == "nul":
        p.write_bytes(b"text\x00more text\n")
        match = "NUL bytes"
    elif case == "missing":
        p = tmp_path / "nope.txt"
        match = "no such file"
    elif case == "empty":
        p.write_text("   \n")
        match = "holds no text"
    elif case == "jsonl-not-json":
        p = tmp_path / "d.jsonl"
        p.write_text('{"text": "fine"}\n{oops\n')
        match = "line 2 is not JSON"
    elif case == "jsonl-no-text":
        p = tmp_path / "d.jsonl"
        p.write_text('{"body": "no text field"}\n')
        match = "no string 'text' field"
    elif case == "jsonl-long-line":
        p = tmp_path / "d.jsonl"
        monkeypatch.setattr(td, "MAX_LINE_BYTES", 64)
        p.write_text(json.dumps({"text": "y" * 100}) + "\n")
        match = "line 1 is longer"
    elif case == "too-big":
        monkeypatch.setattr(td, "MAX_FILE_BYTES", 10)
        p.write_text("more than ten bytes of text\n")
        match = "more than the"
    elif case == "fifo":
        p = tmp_path / "pipe"
        os.mkfifo(p)
        match = "not a regular file"
    else:
        p = tmp_path / "empty-dir"
        p.mkdir()
        match = "holds no files"
    with pytest.raises(BadInputError, match=match):
        td.load_train_text(str(p), "english")


def test_seeds_that_leak_a_held_out_prompt_are_dropped_and_counted(tmp_path):
    bench = load_prompts("english").benchmark[0]
    text = f"{bench} and then the sentence goes on for a while.\nA clean line of prose that is long enough.\n"
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    seeds, info = td.cut_seeds(td.load_train_text(str(tmp_path / "t.txt"), "english"), 10, seed=0)
    assert info["fragments_dropped_heldout"] == 1 and seeds == ["A clean line of prose that is long enough."]


def test_the_shipped_english_corpus_is_clean_and_large_enough():
    tt = td.shipped_text("english")
    frags = [f for t in tt.texts for f in td.fragments(t)]
    keep, drop = filter_clean(frags, shipped_held_out())
    assert not drop and len(keep) >= 2400  # a real target gets the mini's 2,400 seeds
    assert td.shipped_text("code").kind == "shipped"


def test_every_target_gets_the_shipped_corpus_and_its_provenance():
    from dflash_core.prepare.pipeline import PrepareConfig, train_seed_ids

    record: dict = {}
    ids = train_seed_ids(_ByteRuntime(), PrepareConfig(), "english", record)
    assert len(ids) == len(load_prompts("english").train) + PrepareConfig().corpus_seeds
    assert record["source"] == "shipped:english" and record["seeds_cut"] == PrepareConfig().corpus_seeds
    assert record["fragments_dropped_heldout"] == 0 and len(record["sha256"]) == 64
