"""The width model (bench.replay): a decode replayed on the target's greedy trajectory is the decode with the target,
round for round, and its tokens per target call is what an injected acceptance model says it must be."""

from __future__ import annotations

import random

import pytest

from dflash_core.bench.replay import ReplayRuntime, segments, trajectories
from dflash_core.methods import get_method, speculative_ids
from dflash_core.runtime.decode import Proposal, greedy, speculative

PROMPTS = [[1, 5, 9, 2, 7], [3, 3, 8, 1, 4, 6, 2], [2, 11, 4]]
TOKENS = 40


def _rounds(trace):
    return [(len(r["draft"]), r["accepted"], r["token"]) for r in trace]


@pytest.fixture(scope="module")
def trajs(tiny_prepared):
    rt, prepared = tiny_prepared.rt, tiny_prepared.prepared
    return trajectories(rt, PROMPTS, TOKENS, tuple(prepared.drafter.cfg.taps))


CASES = [(m, True) for m in speculative_ids()] + [("dflash", False), ("parareal_v12", False)]


@pytest.mark.parametrize(("method", "cached"), CASES, ids=[f"{m}-{'cached' if c else 'own'}-drafts" for m, c in CASES])
def test_a_replayed_decode_is_the_decode_with_the_target_round_for_round(tiny_prepared, trajs, method, cached):
    """Every method, on decodes of 12 tokens cut from the trajectories (segments: their prompts hold earlier
    continuation), at widths 3 and B: the replay's rounds (drafts verified, accepted, committed token) and ids
    are the target's, with the drafts read from the batched cache or drafted by the proposer itself. Float64
    target, so the one-forward taps equal the cached block forwards' to ~1e-15."""
    rt, prepared = tiny_prepared.rt, tiny_prepared.prepared
    segs = segments(trajs, 12)
    replay = ReplayRuntime(rt, segs, cached_drafts=cached)
    info = get_method(method)
    B = prepared.drafter.cfg.block_size
    for w in sorted({3, B}):
        for s in segs[1::4]:
            real, fake = [], []
            a, _ = speculative(rt, info.build(rt, prepared), list(s.prompt), 12, w, trace=real)
            b, st = speculative(replay, info.build(replay, prepared), list(s.prompt), 12, w, trace=fake)
            assert a == b == list(s.tokens)
            assert _rounds(fake) == _rounds(real), (method, w)
            assert st.target_calls == len(real) + 1


class RunLengthProposer:
    """An injected acceptance model: at the anchor after `n` committed tokens it drafts the greedy continuation for
    exactly `runs[n]` positions, then a wrong id, so the accepted count of every round is known in advance."""

    taps = ()
    max_width = None

    def __init__(self, prompt, reference, runs, vocab):
        self.prompt, self.ref, self.runs, self.vocab = list(prompt), list(reference), runs, vocab

    def begin(self, prompt, hidden):
        pass

    def propose(self, prefix, k):
        n = len(prefix) - len(self.prompt)
        good = self.ref[n:n + min(k, self.runs[n])]
        return Proposal(ids=good + [(self.ref[n + len(good)] + 1) % self.vocab] * (k - len(good)))

    def observe(self, hidden):
        pass


def _truth(runs, tokens, width):
    """Target calls of a decode under the run-length model, counted by hand: the prefill emits a token, each round
    verifies k = min(width, tokens left - 1) drafts and commits min(run, k) + 1."""
    out, calls = 1, 1
    while out < tokens:
        k = min(width, tokens - out - 1)
        out += min(runs[out], k) + 1  # the proposer drafts after `out` committed tokens
        calls += 1
    return calls


def test_the_width_model_gives_the_tokens_per_call_an_injected_acceptance_model_implies(tiny_prepared):
    """Seeded run lengths 0..B at every anchor: the replayed decode's target calls equal the hand count (`_truth`)
    and the real decode's at every width 1..B, so its tokens per target call is exact where the drafts are."""
    rt = tiny_prepared.rt
    B = tiny_prepared.prepared.drafter.cfg.block_size
    rng = random.Random(7)
    prompt = PROMPTS[1]
    ref = greedy(rt, prompt, TOKENS)[0]
    runs = [rng.choice([0, 0, 1, 2, 3, B, B]) for _ in range(TOKENS + 1)]
    (traj,) = trajectories(rt, [prompt], [ref], ())
    replay = ReplayRuntime(rt, [traj])
    for w in range(1, B + 1):
        _, real = speculative(rt, RunLengthProposer(prompt, ref + [0] * B, runs, rt.vocab_size), prompt, TOKENS, w)
        _, fake = speculative(replay, RunLengthProposer(prompt, ref + [0] * B, runs, rt.vocab_size), prompt, TOKENS, w)
        assert fake.target_calls == real.target_calls == _truth(runs, TOKENS, w), w
        assert fake.tokens_per_target_call == pytest.approx(TOKENS / _truth(runs, TOKENS, w))


def test_segments_are_decodes_of_the_benchmark_length_whose_prompt_holds_what_came_before(trajs):
    segs = segments(trajs, 12)
    assert len(segs) == len(PROMPTS) * (TOKENS // 12)
    t, s = trajs[1], segs[TOKENS // 12 + 1]  # the second trajectory's second decode
    assert s.prompt == t.prompt + t.tokens[:12] and s.tokens == t.tokens[12:24] and s.source == 1
    assert s.taps.shape[0] == len(s.prompt) + 12 - 1
    assert (s.taps == t.taps[:s.taps.shape[0]]).all()


def test_a_replay_refuses_a_block_that_leaves_the_trajectory_and_a_prompt_it_does_not_hold(tiny_prepared, trajs):
    replay = ReplayRuntime(tiny_prepared.rt, trajs)
    with pytest.raises(ValueError, match="no trajectory"):
        replay.check_prompt([4, 4, 4], 5)
    sess = replay.session()
    sess.prefill(list(trajs[0].prompt))
    with pytest.raises(ValueError, match="next committed token"):
        sess.verify([trajs[0].tokens[0] + 1])


def _fake_session(tiny_prepared, verify):
    from types import SimpleNamespace

    from dflash_core.bench.costmodel import ComponentCosts, ProposerCosts

    B = tiny_prepared.prepared.drafter.cfg.block_size
    costs = ComponentCosts(t_decode=1.0, t_verify=tuple(verify(k) for k in range(B + 1)))
    return SimpleNamespace(prepared=tiny_prepared.prepared, calibration_costs=costs, block_size=B,
                           drafter_costs=ProposerCosts(t_draft=0.05), options_for=lambda m, w: {})


def test_the_width_model_chooses_wide_where_a_verify_is_free_and_narrow_where_each_row_costs_a_step(
        tiny_prepared, trajs):
    """Injected target costs: a verify that costs one decode step whatever its width (a GPU, the mini on CPU)
    chooses a width at least as wide as one whose every row costs a step (a real target on 2 cores), which can only
    lose by drafting more than one token, so it chooses width 1."""
    from dflash_core.bench.calibration import width_rows
    from dflash_core.bench.costmodel import choose

    segs = segments(trajs, 12)
    replay = ReplayRuntime(tiny_prepared.rt, segs)
    ctx = {"rt": replay, "ids": [list(s.prompt) for s in segs], "refs": [list(s.tokens) for s in segs], "tokens": 12}
    B = tiny_prepared.prepared.drafter.cfg.block_size
    widths = list(range(1, B + 1))
    chosen = {}
    for name, verify in (("flat", lambda k: 1.0), ("steep", lambda k: 1.0 + k)):
        rows = width_rows(_fake_session(tiny_prepared, verify), "dflash", widths, ctx)
        chosen[name] = rows[choose(rows)]["setting"]["width"]
        taus = [r["tokens_per_target_call"] for r in rows]
        assert all(b >= a - 1e-9 for a, b in zip(taus, taus[1:])), taus  # dflash: a wider block never accepts less
    assert chosen["steep"] == 1 and chosen["flat"] >= chosen["steep"], chosen
