"""15 suffix_dflash (the lab's own): the incremental suffix index against a rescan of the whole history, and the
method's two paths (match: the drafter does not run; no match: dflash's block) on the tiny model."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dflash_core.errors import BadInputError
from dflash_core.methods import METHODS, get_method
from dflash_core.methods.support.suffix import SuffixIndex


def rescan(tokens: list[int], shortest: int, longest: int) -> tuple[int, int] | None:
    """The rule by brute force: the longest suffix (shortest..longest) that occurred earlier, its latest occurrence."""
    L = len(tokens)
    for n in range(min(longest, L), shortest - 1, -1):
        suffix = tokens[L - n:]
        for start in range(L - n - 1, -1, -1):  # occurrences that end before the suffix's last token
            if tokens[start:start + n] == suffix:
                return n, start + n
    return None


@settings(max_examples=300)
@given(st.lists(st.integers(0, 3), max_size=40), st.integers(1, 4), st.integers(0, 4), st.data())
def test_the_index_finds_what_a_rescan_finds_at_every_length(tokens, shortest, extra, data):
    """Grown piece by piece (as a decode commits tokens), the index answers every prefix like a full rescan."""
    idx = SuffixIndex(shortest, shortest + extra)
    seen: list[int] = []
    while len(seen) < len(tokens):
        step = data.draw(st.integers(1, 5), label="tokens committed this round")
        seen = tokens[: len(seen) + step]
        idx.sync(seen)
        assert idx.match() == rescan(seen, shortest, shortest + extra), seen


def test_the_match_is_the_longest_then_the_most_recent():
    idx = SuffixIndex(1, 4)
    idx.extend([7, 1, 2, 9, 3, 1, 2, 8, 7, 1, 2])
    assert idx.match() == (3, 3)  # "7 1 2" (length 3, followed by 9) beats the later "1 2" (followed by 8)
    idx = SuffixIndex(1, 4)
    idx.extend([1, 2, 9, 1, 2, 8, 1, 2])
    assert idx.match() == (2, 5)  # two earlier "1 2": the most recent one (3-4), followed by 8


def test_the_continuation_repeats_the_period_past_the_end():
    idx = SuffixIndex(2, 4)
    idx.extend([4, 5, 6, 4, 5])
    n, pos = idx.match()
    assert (n, pos) == (2, 2) and idx.continuation(pos, 7) == [6, 4, 5, 6, 4, 5, 6]  # period 3
    assert idx.continuation(pos, 1) == [6]


def test_a_prefix_that_does_not_extend_the_history_is_indexed_anew():
    idx = SuffixIndex(1, 2)
    idx.sync([1, 2, 3, 1])
    assert idx.match() == (1, 1)
    idx.sync([7, 8, 7])  # another decode's prefix: not trusted as an extension
    assert idx.tokens == [7, 8, 7] and idx.match() == (1, 1)


def test_the_index_refuses_an_empty_range():
    with pytest.raises(ValueError):
        SuffixIndex(3, 2)


def test_it_is_registered_as_the_labs_own():
    assert METHODS["suffix_dflash"].origin == "lab" and METHODS["suffix_dflash"].index == 15
    assert {m.origin for m in METHODS.values() if m.index < 15} == {"seed"}
    with pytest.raises(BadInputError, match="min_match"):
        get_method("suffix_dflash").parse_options({"min_match": 0})


def _begin(rt, proposer, prompt: list[int]) -> None:
    """Start `proposer` on `prompt` as the decode loop does: the prefill's taps for every prompt row."""
    step = rt.session(recording=True).prefill(prompt, taps=tuple(proposer.taps))
    proposer.begin(prompt, step.hidden)


def test_a_match_proposes_the_continuation_without_the_drafter_and_no_match_gives_dflash(tiny_prepared):
    rt, prep = tiny_prepared.rt, tiny_prepared.prepared
    from dflash_core.runtime.decode import greedy, speculative

    prompt = [3, 4, 5, 6, 7, 3, 4, 5, 6, 7, 3, 4, 5]
    hybrid = get_method("suffix_dflash").build(rt, prep, min_match=3)
    dflash = get_method("dflash").build(rt, prep)
    _begin(rt, hybrid, prompt)
    _begin(rt, dflash, prompt)
    prop = hybrid.propose(list(prompt), 4)
    assert prop.ids == [6, 7, 3, 4] and prop.meta == {"suffix_rounds": 1, "suffix_match_len": 8}  # capped at LONGEST
    assert prop.draft_seconds == 0.0  # the drafter did not run
    fresh = [9, 10, 11, 12]  # nothing recurs: the block is dflash's at the same context
    _begin(rt, hybrid, fresh)
    _begin(rt, dflash, fresh)
    prop, ref = hybrid.propose(list(fresh), 4), dflash.propose(list(fresh), 4)
    ids = [[int(t) for t in (x.tolist() if hasattr(x, "tolist") else x)] for x in (prop.ids, ref.ids)]
    assert ids[0] == ids[1] and prop.meta["suffix_rounds"] == 0  # dflash's block may stay on the device (a tensor)
    # the whole decode: exact, with rounds on both paths (one-token matches recur within 32 tokens)
    want, _ = greedy(rt, prompt, 32)
    got, stats = speculative(rt, get_method("suffix_dflash").build(rt, prep, min_match=1), list(prompt), 32, 4)
    assert got == want and 1 <= stats.meta["suffix_rounds"] < stats.draft_calls, (want, stats.meta)
