"""The teacher pass: taps and top-k logits captured while generating equal a separate forward over the finished
trajectories (float64), sharding over ranks gives the unsharded data exactly, and saved data round-trip."""

from __future__ import annotations

import pytest
import torch

from dflash_core.prepare.teacher import TeacherData, generate_shard, load_rows, merge_shards, save_rows, teacher_data
from dflash_core.runtime.target import TargetRuntime, batch_taps
from dflash_core.testing import TinySpec, build_tiny

TAPS = (0, 2, 3)
PROMPTS = [[5, 6, 7], [9, 8, 7], [3, 4], [11, 12, 13, 14], [7, 7], [20, 21, 22]]


@pytest.fixture(scope="module")
def rt64():
    return TargetRuntime.from_model(build_tiny(TinySpec(pattern="CCACAC", dtype="float64")))


def test_captured_taps_and_top_k_equal_one_forward_over_the_trajectory(rt64):
    data = teacher_data(rt64, PROMPTS, 7, TAPS, top_k=5, batch=2)
    for seq, plen, taps, vals, ids in zip(data.sequences, data.prompt_lens, data.taps, data.top_logits,
                                          data.top_ids):
        assert len(seq) == plen + 7 and taps.shape[0] == len(seq) - 1  # the last token is never fed
        want = batch_taps(rt64, [seq], TAPS)[0][: len(seq) - 1]
        torch.testing.assert_close(taps, want, rtol=0, atol=1e-10)
        with torch.no_grad():
            logits = rt64.model(input_ids=torch.tensor([seq])).logits[0, plen - 1: len(seq) - 1].float()
        v, i = torch.topk(logits, 5, dim=-1)
        torch.testing.assert_close(vals, v, rtol=0, atol=1e-5)
        assert torch.equal(ids[:, 0], torch.tensor(seq[plen:]))  # each generated token is its row's argmax
        assert torch.equal(ids, i)


def test_sharded_generation_merges_to_the_unsharded_data(rt64):
    whole = merge_shards([generate_shard(rt64, PROMPTS, 5, TAPS, 3, batch=2)], PROMPTS, TAPS)
    parts = [generate_shard(rt64, PROMPTS, 5, TAPS, 3, rank=r, world=3, batch=2) for r in range(3)]
    assert all(parts) and set().union(*parts) == set(range(len(PROMPTS)))
    merged = merge_shards(parts, PROMPTS, TAPS)
    assert merged.sequences == whole.sequences
    for a, b in zip(merged.taps + merged.top_logits + merged.top_ids, whole.taps + whole.top_logits + whole.top_ids):
        assert torch.equal(a, b)
    with pytest.raises(Exception, match="shard is missing"):
        merge_shards(parts[:2], PROMPTS, TAPS)


def test_saved_teacher_data_round_trips_and_is_keyed(rt64, tmp_path):
    shard = generate_shard(rt64, PROMPTS, 4, TAPS, 2, batch=4)
    save_rows(tmp_path / "t.safetensors", shard, "key-a")
    back = load_rows(tmp_path / "t.safetensors", "key-a")
    assert sorted(back) == sorted(shard)
    for i in shard:
        assert back[i][0] == shard[i][0] and all(torch.equal(x, y) for x, y in zip(back[i][1:], shard[i][1:]))
    assert load_rows(tmp_path / "t.safetensors", "key-b") is None  # written for other inputs: not reused
    (tmp_path / "bad.safetensors").write_bytes(b"not safetensors")
    assert load_rows(tmp_path / "bad.safetensors", "key-a") is None


def test_work_directory_reuses_saved_teacher_data(rt64, tmp_path, monkeypatch):
    first = teacher_data(rt64, PROMPTS, 4, TAPS, 2, work=tmp_path)
    from dflash_core.prepare import teacher

    monkeypatch.setattr(teacher, "generate_shard", lambda *a, **k: pytest.fail("the saved data must be reused"))
    again = teacher_data(rt64, PROMPTS, 4, TAPS, 2, work=tmp_path)
    assert isinstance(again, TeacherData) and again.sequences == first.sequences
    assert all(torch.equal(a, b) for a, b in zip(again.taps, first.taps))
