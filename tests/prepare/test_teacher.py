"""The teacher pass: taps and top-k logits captured while generating equal a separate forward over the finished
trajectories (float64), sharding over ranks gives the unsharded data exactly, and saved data round-trip."""

from __future__ import annotations

import pytest
import torch

from dflash_core.errors import BadInputError
from dflash_core.prepare.teacher import (
    TeacherData,
    generate_shard,
    load_rows,
    merge_shards,
    padded_batches,
    save_rows,
    teacher_data,
)
from dflash_core.runtime.target import TargetRuntime, batch_taps, batch_teacher
from dflash_core.testing import TinySpec, build_tiny, build_tiny_llama

from ..support.helpers import assert_near, assert_topk_near

TAPS = (0, 2, 3)
PROMPTS = [[5, 6, 7], [9, 8, 7], [3, 4], [11, 12, 13, 14], [7, 7], [20, 21, 22]]


@pytest.fixture(scope="module")
def rt64():
    return TargetRuntime.from_model(build_tiny(TinySpec(pattern="CCACAC", dtype="float64")))


@pytest.mark.numerics
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


def _tiny_llama64():
    return TargetRuntime.from_model(build_tiny_llama("float64"))


@pytest.mark.numerics
@pytest.mark.parametrize("arch", ["lfm2", "llama"])
def test_a_padded_batch_computes_what_each_trajectory_computes_alone(rt64, arch):
    """Mixed prompt lengths left-padded in one batch: every trajectory, tap row and top-k equals the length-bucketed
    teacher's and one forward over that trajectory alone (float64), so the padding reaches no real row: not the
    attention (masked), not RoPE (own positions), not LFM2's short convolutions (pad rows zeroed)."""
    rt = rt64 if arch == "lfm2" else _tiny_llama64()
    prompts = PROMPTS + [[40, 41, 42, 43, 44, 45, 46, 47, 48], [9]]
    taps = TAPS if arch == "lfm2" else (0, 2)
    want = teacher_data(rt, prompts, 6, taps, top_k=4, batch=2)
    got = teacher_data(rt, prompts, 6, taps, top_k=4, batch=len(prompts), padded=True)
    assert got.sequences == want.sequences
    for seq, a, b, va, vb, ia, ib in zip(got.sequences, got.taps, want.taps, got.top_logits, want.top_logits,
                                         got.top_ids, want.top_ids):
        assert a.shape == b.shape == (len(seq) - 1, b.shape[1])
        torch.testing.assert_close(a, batch_taps(rt, [seq], taps)[0][: len(seq) - 1], rtol=0, atol=1e-10)
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
        torch.testing.assert_close(va, vb, rtol=0, atol=1e-6)
        assert torch.equal(ia, ib)


@pytest.mark.numerics
@pytest.mark.parametrize("arch", ["lfm2", "llama"])
@pytest.mark.parametrize("padded", [False, True])
def test_a_padded_teacher_allocates_its_cache_once_and_computes_what_a_growing_cache_does(arch, padded,
                                                                                         monkeypatch):
    """Padded batches decode into a cache of exactly the rows they feed (a growing one copied every layer's K/V
    at each step): their ids equal a growing cache's, their taps and top-k agree within float32 rounding (float32,
    as prepare runs); length buckets keep the growing cache (the static one's explicit mask changes their float
    sums). Not bit for bit: the two caches feed different shapes and masks to the attention matmuls, so on an
    AVX2 kernel path (ATEN_CPU_CAPABILITY=avx2, or an AMD EPYC) their sums differ in the last bits."""
    from transformers import DynamicCache, StaticCache

    from dflash_core.runtime import target

    rt = TargetRuntime.from_model(build_tiny(TinySpec(pattern="CCACAC", dtype="float32"))) if arch == "lfm2" \
        else TargetRuntime.from_model(_tiny_llama64().model.float())
    prompts = [[5, 6, 7], [9, 8, 7], [4, 3, 2]] if not padded else [[5, 6, 7], [9], [11, 12, 13, 14, 15]]
    made, real = [], target.teacher_cache
    monkeypatch.setattr(target, "teacher_cache", lambda rt_, rows: made.append(real(rt_, rows)) or made[-1])
    got = batch_teacher(rt, prompts, 6, (0, 2), 4, padded=padded)
    if not padded:
        assert made == []
        return
    assert len(made) == 1 and isinstance(made[0], StaticCache)
    assert made[0].get_max_length() == max(map(len, prompts)) + 6 - 1  # an overflow fails: exactly the rows fed
    monkeypatch.setattr(target, "teacher_cache", lambda rt_, rows: DynamicCache(config=rt_.model.config))
    want = batch_teacher(rt, prompts, 6, (0, 2), 4, padded=padded)
    assert got[0] == want[0]  # token ids: exact
    # 1e-4: a few hundred float32 ulps at the taps' O(1) scale (the AVX2 path differs by ~2e-6), while a row that
    # saw a pad, a wrong position or a stale cache slot moves by 1e-2 or more
    for a, b in zip(got[1], want[1]):
        assert_near(a, b, 1e-4, "float32 static vs growing cache, taps")
    assert_topk_near(got[2][1], got[2][0], want[2][1], want[2][0], 1e-4, "float32 static vs growing cache, top-k")


def test_a_padded_batch_is_refused_for_a_model_type_not_known_to_pad_exactly(rt64, monkeypatch):
    monkeypatch.setattr(rt64.model.config, "model_type", "gpt2")
    with pytest.raises(BadInputError, match="bucket the prompts by length"):
        batch_teacher(rt64, [[1, 2], [1, 2, 3]], 2, padded=True)


@pytest.mark.parametrize("lengths", [[3, 1, 3, 2, 30, 3, 3, 1, 12], [5] * 9, list(range(1, 40)) + [200]])
def test_padded_batches_cover_every_prompt_once_within_size_and_waste(lengths):
    new_tokens, size, waste = 8, 4, 0.1
    groups = padded_batches(lengths, new_tokens, size, waste)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for g in groups:
        top = max(lengths[i] for i in g)
        assert len(g) <= size
        assert sum(top - lengths[i] for i in g) <= waste * len(g) * (top + new_tokens) or len(g) == 1
    assert padded_batches([5] * 9, new_tokens, size, waste) == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]


@pytest.mark.numerics
@pytest.mark.parametrize("padded", [False, True])
def test_sharded_generation_merges_to_the_unsharded_data(rt64, padded):
    whole = merge_shards([generate_shard(rt64, PROMPTS, 5, TAPS, 3, batch=2, padded=padded)], PROMPTS, TAPS)
    parts = [generate_shard(rt64, PROMPTS, 5, TAPS, 3, rank=r, world=3, batch=2, padded=padded) for r in range(3)]
    assert all(parts) and set().union(*parts) == set(range(len(PROMPTS)))
    merged = merge_shards(parts, PROMPTS, TAPS)
    assert merged.sequences == whole.sequences  # token ids: exact
    # a shard batches other prompts together than the whole run (other matmul shapes): float64, so 1e-10 is
    # ~1e6 ulps at the O(1) scale of taps and logits, and still far below any real difference
    for a, b in zip(merged.taps, whole.taps):
        assert_near(a, b, 1e-10, "float64 sharded vs whole, taps")
    for va, ia, vb, ib in zip(merged.top_logits, merged.top_ids, whole.top_logits, whole.top_ids):
        assert_topk_near(ia, va, ib, vb, 1e-6, "float64 sharded vs whole, top-k (kept in float32)")
    with pytest.raises(Exception, match="shard is missing"):
        merge_shards(parts[:2], PROMPTS, TAPS)


def test_saved_teacher_data_round_trips_and_is_keyed(rt64, tmp_path):
    shard = generate_shard(rt64, PROMPTS, 4, TAPS, 2, batch=4, prompt_preds=True)
    save_rows(tmp_path / "t.safetensors", shard, "key-a")
    back = load_rows(tmp_path / "t.safetensors", "key-a")
    assert sorted(back) == sorted(shard)
    for i in shard:
        assert back[i][0] == shard[i][0] and all(torch.equal(x, y) for x, y in zip(back[i][1:], shard[i][1:]))
        assert back[i][4].numel() == len(PROMPTS[i]) - 1  # the prompt rows' predictions come back too
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


def test_saved_length_bucketed_data_is_not_reused_for_a_padded_teacher(rt64, tmp_path, monkeypatch):
    # padded batches compute other float sums than length buckets: a resumed prepare must not mix them
    teacher_data(rt64, PROMPTS, 4, TAPS, 2, work=tmp_path)
    from dflash_core.prepare import teacher

    class Generated(Exception):
        pass

    def generate(*a, **k):
        raise Generated

    monkeypatch.setattr(teacher, "generate_shard", generate)
    with pytest.raises(Generated):
        teacher_data(rt64, PROMPTS, 4, TAPS, 2, work=tmp_path, padded=True)


@pytest.mark.parametrize("arch", ["lfm2", "llama"])
@pytest.mark.parametrize("padded", [False, True])
def test_the_prompt_rows_predictions_are_the_targets_argmax_from_the_first_forward(rt64, arch, padded):
    """`prompt_preds`: the argmax at every prompt row but the last, as one forward over the prompt alone gives it
    (float64), from the teacher's first forward (pad rows dropped), and what `train.prompt_predictions` computes for
    data that did not record them; a key of its own, so data without them is not reused for it."""
    from dflash_core.prepare.teacher import _key
    from dflash_core.prepare.train import prompt_predictions

    rt = rt64 if arch == "lfm2" else _tiny_llama64()
    prompts = PROMPTS + [[40, 41, 42, 43, 44, 45, 46, 47, 48], [9]]
    if padded and arch == "lfm2":
        prompts = prompts[:-1]  # LFM2 pads exactly too; keep one run without a 1-token prompt
    data = teacher_data(rt, prompts, 3, (0,), batch=len(prompts) if padded else 2, padded=padded, prompt_preds=True)
    again = prompt_predictions(rt, TeacherData(data.sequences, data.prompt_lens))
    for p, got, other in zip(prompts, data.prompt_preds, again):
        with torch.no_grad():
            want = rt.model(input_ids=torch.tensor([p])).logits[0, :-1].argmax(-1)
        assert torch.equal(got, want) and torch.equal(other, want)
    assert teacher_data(rt, prompts, 3, (0,), batch=2).prompt_preds is None  # not asked for: none recorded
    assert _key(prompts, 3, (0,), 0) != _key(prompts, 3, (0,), 0, prompt_preds=True)
