"""The fits' examples: an evenly spread, deterministic subset of the teacher trajectories, just large enough
for the example target, read with one target forward each (bit for bit the two forwards it replaced), and a
hold-out whose trajectories never feed the fit."""

from __future__ import annotations

import random
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dflash_core.methods import FitContext
from dflash_core.methods.support.examples import draft_examples, target_rows
from dflash_core.methods.support.fitting import (
    CORRECTION_TARGET_EXAMPLES,
    HEAD_STRIDE,
    HEAD_TARGET_EXAMPLES,
    MIN_FIT_TRAJECTORIES,
    cached_examples,
    plan_examples,
    spread_indices,
    start_head_fit,
)
from dflash_core.runtime.target import trajectory_taps

from ..conftest import TINY_PREP


def _anchors(ctx, idx, stride: int) -> int:
    B = ctx.drafter.cfg.block_size
    return sum(len(range(max(ctx.prompt_lens[i], 1), len(ctx.trajectories[i]) - B, stride)) for i in idx)


def _shape_only_ctx(n: int, gen_tokens: int, block: int, seed: int = 0) -> SimpleNamespace:
    """What the planner reads (trajectory lengths, prompt lengths, block size), prepare-sized, without a model."""
    rng = random.Random(seed)
    plens = [rng.randint(4, 40) for _ in range(n)]
    trajs = [[0] * (p + gen_tokens) for p in plens]
    return SimpleNamespace(trajectories=trajs, prompt_lens=plens,
                           drafter=SimpleNamespace(cfg=SimpleNamespace(block_size=block)))


@given(total=st.integers(1, 5000), n=st.integers(1, 5000))
def test_spread_indices_take_one_per_equal_bin(total, n):
    got = spread_indices(total, n)
    k = min(n, total)
    assert len(got) == k and got == sorted(set(got)) and got == spread_indices(total, n)
    for i, t in enumerate(got):  # bin i is [i*total/k, (i+1)*total/k): exactly one pick in each
        assert i * total <= t * k < (i + 1) * total


@pytest.mark.parametrize("target,max_stride", [(CORRECTION_TARGET_EXAMPLES, 1), (HEAD_TARGET_EXAMPLES, HEAD_STRIDE)])
def test_plan_reaches_the_target_with_just_enough_spread_trajectories(target, max_stride):
    """At prepare's scale (2160 trajectories of 64 tokens, B = 8): the target is reached, one trajectory
    fewer would not reach it, the picks are spread over all trajectories, and target forwards drop >= 5x."""
    ctx = _shape_only_ctx(2160, 64, 8)
    plan = plan_examples(ctx, target, max_stride)
    N, n = len(ctx.trajectories), len(plan.trajectories)
    assert plan.stride == max_stride and plan.target == target
    assert plan.trajectories == spread_indices(N, n) == plan_examples(ctx, target, max_stride).trajectories
    assert _anchors(ctx, plan.trajectories, plan.stride) >= target
    assert _anchors(ctx, spread_indices(N, n - 1), plan.stride) < target
    assert n * 5 <= N
    assert plan.trajectories[0] < N / n and plan.trajectories[-1] >= N - N / n  # both ends are covered


def test_plan_reads_every_trajectory_when_anchors_are_few():
    """Fewer anchors than the target even at stride 1: every trajectory, every anchor."""
    ctx = _shape_only_ctx(30, 12, 4)
    plan = plan_examples(ctx, 10_000, HEAD_STRIDE)
    assert plan.trajectories == list(range(30)) and plan.stride == 1


def test_plan_keeps_enough_trajectories_for_a_hold_out_in_small_runs():
    """A small target does not shrink the fit to one or two trajectories: the stride grows instead."""
    ctx = _shape_only_ctx(40, 24, 4)
    plan = plan_examples(ctx, 64, 1)
    assert len(plan.trajectories) >= MIN_FIT_TRAJECTORIES and plan.stride > 1
    assert _anchors(ctx, plan.trajectories, plan.stride) >= 64


# --- on the tiny target ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_ctx(tiny_prepared) -> FitContext:
    """60 short random trajectories on the tiny prepared target (8 anchors each at B = 4)."""
    rng = random.Random(3)
    rt = tiny_prepared.rt
    trajs = [[rng.randrange(3, rt.vocab_size) for _ in range(15)] for _ in range(60)]
    cfg = replace(TINY_PREP, aux_max_examples=100)
    return FitContext(rt, tiny_prepared.prepared.drafter, trajs, [3] * len(trajs), cfg, "code")


@pytest.mark.parametrize("draft_vocab", [0, 40])
def test_examples_hold_what_decode_drafts_at_each_anchor(tiny_ctx, monkeypatch, draft_vocab):
    """The drafter and the head run once per chunk of a trajectory's blocks: every example still holds the logits,
    top-k and hidden rows that `DraftState.draft` gives at its anchor (chunks of 3 so a trajectory spans several)."""
    import dflash_core.methods.support.examples as examples
    from dflash_core.methods.support.common import topk_tensors
    from dflash_core.runtime.drafter import DraftState, init_drafter

    drafter = tiny_ctx.drafter
    if draft_vocab:
        drafter = init_drafter(replace(drafter.cfg, draft_vocab=draft_vocab), 5)
        drafter.set_draft_map(torch.randperm(drafter.cfg.vocab_size, generator=torch.Generator().manual_seed(1))
                              [:draft_vocab])
    ctx = replace(tiny_ctx, drafter=drafter)
    monkeypatch.setattr(examples, "HEAD_CHUNK", 3)
    passes, run_block = [], type(drafter).run_block
    monkeypatch.setattr(type(drafter), "run_block", lambda self, *a, **k: passes.append(1) or run_block(self, *a, **k))
    ex = draft_examples(ctx, top_k=6, keep_full_logits=True, trajectories=[0, 1, 2], max_examples=20)
    assert len(ex.anchors) == 20 and ex.trajectories == [0, 1, 2]
    assert len(passes) == 3 + 3 + 2  # one drafter pass per chunk of anchors: 8 + 8 + 4 anchors in chunks of 3
    rt = ctx.rt
    embed, head = rt.model.get_input_embeddings(), rt.model.get_output_embeddings()
    for n, (ti, a) in enumerate(ex.anchors):
        st = DraftState(drafter)
        st.extend(target_rows(rt, ctx.trajectories[ti], drafter.cfg.taps, False)[0][:a])
        lg, hid = st.draft(ctx.trajectories[ti][a], embed, head)
        torch.testing.assert_close(ex.logits[n], lg.float(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ex.hidden[n], hid.float())
        ids, vals = topk_tensors(ex.logits[n], 6)
        assert torch.equal(ex.topk_ids[n], ids) and torch.equal(ex.topk_vals[n], vals)
        assert ex.prev[n] == ctx.trajectories[ti][a]


@pytest.mark.parametrize("order", ["ascending", "shuffled"])
def test_examples_take_the_same_top_k_over_the_draft_vocabulary_as_over_the_scatter(tiny_ctx, monkeypatch, order):
    """Without full logits the top-k comes from the K draft columns, mapped through an ascending d2t, and is
    the scatter's top-k id for id; a map in another order (a loaded one) takes the scatter."""
    import dflash_core.methods.support.examples as examples
    from dflash_core.runtime.drafter import init_drafter

    drafter = init_drafter(replace(tiny_ctx.drafter.cfg, draft_vocab=40), 5)
    ids = torch.randperm(drafter.cfg.vocab_size, generator=torch.Generator().manual_seed(1))[:40]
    drafter.set_draft_map(ids.sort().values if order == "ascending" else ids)
    ctx = replace(tiny_ctx, drafter=drafter)
    monkeypatch.setattr(examples, "HEAD_CHUNK", 3)
    full = draft_examples(ctx, top_k=6, keep_full_logits=True, trajectories=[0, 1, 2], max_examples=20)
    scattered, scatter = [], type(drafter).full_logits
    monkeypatch.setattr(type(drafter), "full_logits",
                        lambda self, h, head: scattered.append(1) or scatter(self, h, head))
    fast = draft_examples(ctx, top_k=6, trajectories=[0, 1, 2], max_examples=20)
    assert fast.logits is None and bool(scattered) == (order == "shuffled")
    assert torch.equal(fast.topk_ids, full.topk_ids) and torch.equal(fast.topk_vals, full.topk_vals)
    assert torch.equal(fast.hidden, full.hidden) and torch.equal(fast.target_logits, full.target_logits)


def test_the_draft_space_top_k_breaks_ties_by_target_id_as_the_scatter_does():
    """Draft columns that tie exactly (duplicated head rows) at the k-th place: the K-space top-k keeps and
    orders the tied ids by target id, as `topk_tensors` over the scattered [.., V] logits does."""
    from dflash_core.methods.support.common import topk_tensors
    from dflash_core.methods.support.examples import chunk_topk
    from dflash_core.runtime.drafter import DrafterConfig, init_drafter

    V, H, K = 50, 16, 20
    drafter = init_drafter(DrafterConfig(hidden_size=H, vocab_size=V, taps=(0,), draft_vocab=K), 3)
    drafter.set_draft_map(torch.arange(0, 2 * K, 2))  # even ids, ascending
    head = torch.nn.Linear(H, V, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, H, generator=torch.Generator().manual_seed(2)))
        head.weight[2 * K:] = 50.0  # out-of-vocabulary ids would win if they ever entered the top-k
        head.weight[torch.arange(0, 2 * K, 4)] = head.weight[torch.arange(2, 2 * K, 4)]  # ids 4m and 4m+2 tie
    hidden = torch.randn(4, 3, H, generator=torch.Generator().manual_seed(4))
    ranked = drafter.draft_space_logits(hidden, head).sort(dim=-1, descending=True).values
    for k in (1, 2, 3, 5, K):
        ids, vals, lgs = chunk_topk(drafter, hidden, head, k, False)
        want_ids, want_vals = topk_tensors(drafter.logits(hidden, head).float(), k)
        assert lgs is None and torch.equal(ids, want_ids) and torch.equal(vals, want_vals)
        # every value comes twice, so an odd k cuts a tied pair at the k-th place in every row
        assert k % 2 == 0 or bool((ranked[..., k - 1] == ranked[..., k]).all())


def test_one_forward_gives_the_taps_and_logits_of_two_bit_for_bit(tiny_prepared):
    from dflash_core.runtime.target import load_target

    rt32 = load_target(str(tiny_prepared.path), "cpu", "float32")  # prepare's dtype
    taps = tiny_prepared.prepared.drafter.cfg.taps
    for rt in (rt32, tiny_prepared.rt):
        for seq in ([5, 9, 14, 3, 22, 7, 8], [1] + list(range(10, 60))):
            hid, lg = target_rows(rt, seq, taps, with_logits=True)
            with torch.no_grad():
                want = rt.model(input_ids=torch.tensor([seq]), use_cache=False).logits[0].float().cpu()
            assert torch.equal(hid, trajectory_taps(rt, seq, taps)) and torch.equal(lg, want)


def test_examples_come_only_from_the_planned_trajectories(tiny_ctx):
    plan = plan_examples(tiny_ctx, 100, 1)
    ex = cached_examples(tiny_ctx, top_k=8, plan=plan)
    assert len(ex.anchors) == 100 and ex.prev.shape[0] == 100  # the target, capped exactly
    assert ex.trajectories == plan.trajectories and {t for t, _ in ex.anchors} == set(plan.trajectories)
    assert len(plan.trajectories) * 4 <= len(tiny_ctx.trajectories)
    assert cached_examples(tiny_ctx, top_k=8, plan=plan) is ex  # computed once per prepare run


def test_a_subset_reads_the_same_rows_as_the_full_run(tiny_ctx):
    """Choosing trajectories changes which examples exist, never their values."""
    sub = [4, 17, 50]
    part = draft_examples(tiny_ctx, top_k=8, trajectories=sub)
    full = draft_examples(tiny_ctx, top_k=8)
    rows = [i for i, (t, _) in enumerate(full.anchors) if t in sub]
    assert part.anchors == [full.anchors[i] for i in rows]
    assert part.topk_ids.tolist() == full.topk_ids[rows].tolist() and part.labels.tolist() == full.labels[rows].tolist()
    assert torch.equal(part.topk_vals, full.topk_vals[rows])
    assert torch.equal(part.target_logits, full.target_logits[rows])


def test_held_out_trajectories_never_feed_the_head_fit(tiny_ctx):
    ex, _, held, train_idx, meta = start_head_fit(tiny_ctx, 2, lambda: torch.nn.Linear(1, 1))
    train_t = {ex.anchors[i][0] for i in train_idx.tolist()}
    held_t = {ex.anchors[i][0] for i in torch.nonzero(held).flatten().tolist()}
    assert held_t and train_t and train_t.isdisjoint(held_t)
    assert train_t == set(meta["train_trajectories"]) and held_t == set(meta["holdout_trajectories"])
    assert train_t | held_t == set(ex.trajectories)
    assert meta["example_trajectories"] == len(ex.trajectories) and meta["example_anchors"] == meta["examples"]


def test_every_fit_records_the_trajectories_and_anchors_it_read(tiny_prepared):
    for name, meta in tiny_prepared.prepared.manifest["fits"].items():
        n_traj, n_anch = meta["example_trajectories"], meta["example_anchors"]
        assert type(n_traj) is int and type(n_anch) is int and type(meta["anchor_stride"]) is int, name
        assert n_traj == len(meta["train_trajectories"]) + len(meta["holdout_trajectories"]), name
        assert n_anch == meta.get("examples", meta.get("train_examples", 0) + meta.get("holdout_examples", 0)), name


# --- one pass for both example sets ---------------------------------------------------------------------

def _tiny64(arch: str):
    from dflash_core.runtime.target import TargetRuntime
    from dflash_core.testing import TinySpec, build_tiny, build_tiny_llama

    if arch == "lfm2":
        return TargetRuntime.from_model(build_tiny(TinySpec(pattern="CCACAC", dtype="float64")))
    return TargetRuntime.from_model(build_tiny_llama("float64"))


@pytest.mark.parametrize("arch", ["lfm2", "llama"])
def test_a_right_padded_forward_gives_each_trajectory_what_its_own_forward_gives(arch):
    """Trajectories of several lengths in one forward, padded after their ends: every tap row and logit equals the
    trajectory's own forward (float64), LFM2's short convolutions and RoPE included (a row reads no later row)."""
    from dflash_core.methods.support.examples import target_rows_batch

    rt = _tiny64(arch)
    seqs = [[5, 6, 7], list(range(10, 24)), [9], [3, 4, 5, 6, 7, 8, 9, 1, 2], list(range(30, 44))]
    taps = (0, 2, 3) if arch == "lfm2" else (0, 2)
    for with_logits in (True, False):
        got = target_rows_batch(rt, seqs, taps, with_logits)
        assert len(got) == len(seqs)
        for seq, (hid, lg) in zip(seqs, got):
            want_hid, want_lg = target_rows(rt, seq, taps, with_logits)
            assert hid.shape == want_hid.shape and hid.shape[0] == len(seq)
            torch.testing.assert_close(hid, want_hid, rtol=0, atol=1e-10)
            if with_logits:
                assert lg.shape == (len(seq), rt.vocab_size)
                torch.testing.assert_close(lg, want_lg, rtol=0, atol=1e-10)
            else:
                assert lg is None and want_lg is None


@given(lengths=st.lists(st.integers(1, 200), min_size=0, max_size=60), vocab=st.integers(1, 5000),
       cap=st.integers(1, 200_000))
def test_forward_groups_take_each_trajectory_once_within_the_logits_cap(lengths, vocab, cap):
    from dflash_core.methods.support.examples import forward_groups

    groups = forward_groups(lengths, vocab, cap)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    flat = [i for g in groups for i in g]
    assert [lengths[i] for i in flat] == sorted(lengths)  # ascending length: little padding in a group
    for g in groups:
        assert len(g) == 1 or len(g) * max(lengths[i] for i in g) * vocab <= cap


def test_two_example_sets_read_each_trajectory_with_one_target_forward(tiny_ctx, monkeypatch):
    """The heads' and the corrections' sets in one pass: a trajectory both read is forwarded once, trajectories
    share forwards, and each set holds what it holds when built alone, in trajectory then anchor order."""
    import dflash_core.methods.support.examples as examples
    from dflash_core.methods.support.examples import ExampleRequest, draft_example_sets

    heads = ExampleRequest(top_k=6, stride=4, max_examples=5, trajectories=(1, 4, 7, 9))
    corr = ExampleRequest(top_k=3, stride=1, trajectories=(7, 2, 4))
    alone = [draft_examples(tiny_ctx, top_k=6, stride=4, max_examples=5, trajectories=[1, 4, 7, 9]),
             draft_examples(tiny_ctx, top_k=3, stride=1, trajectories=[2, 4, 7])]
    fed, batch = [], examples.target_rows_batch
    monkeypatch.setattr(examples, "target_rows_batch",
                        lambda rt, seqs, *a: fed.append(len(seqs)) or batch(rt, seqs, *a))
    both = draft_example_sets(tiny_ctx, [heads, corr])
    assert sum(fed) == 4 and len(fed) < 4  # the union {1, 2, 4, 7} (9 is past the cap): once each, shared forwards
    assert both[0].trajectories == [1, 4, 7] and len(both[0].anchors) == 5  # 2 + 2 + 1: the cap in trajectory order
    for got, want in zip(both, alone):
        assert got.anchors == want.anchors and got.anchors == sorted(got.anchors)
        assert torch.equal(got.topk_ids, want.topk_ids) and torch.equal(got.labels, want.labels)
        torch.testing.assert_close(got.target_logits, want.target_logits)
        torch.testing.assert_close(got.hidden, want.hidden)
    fed.clear()
    monkeypatch.setattr(examples, "GROUP_LOGITS", 1)  # one trajectory a forward: the same examples
    single = draft_example_sets(tiny_ctx, [heads, corr])
    assert fed == [1] * 4
    for got, want in zip(single, both):
        assert got.anchors == want.anchors and torch.equal(got.topk_ids, want.topk_ids)
        torch.testing.assert_close(got.target_logits, want.target_logits)
