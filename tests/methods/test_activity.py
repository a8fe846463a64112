"""Mechanism activity (docs/design.md §9): the Shadowed wrapper, its counts and the trimmed-acceptance meta."""

from __future__ import annotations

import pytest

from dflash_core.bench.activity import Shadowed, accepted_against, count_rounds, summary
from dflash_core.methods import METHODS, get_method, speculative_ids
from dflash_core.methods.dflash import DFlashProposer
from dflash_core.runtime.decode import greedy, speculative

PROMPTS = ([5], [7, 8, 9, 10], list(range(3, 30)))
TOKENS, WIDTH = 24, 4


def test_counts_match_a_hand_computed_example():
    """Output [5..10]; three rounds: a token changed at position 2 (loses 2), a better last draft (gains 1) and
    a trimmed draft (one position only the shadow drafted; loses 1)."""
    out = [5, 6, 7, 8, 9, 10]
    rounds = [{"pos": 0, "draft": [5, 6, 99, 8], "shadow": [5, 6, 7, 8]},
              {"pos": 4, "draft": [9, 10], "shadow": [9, 11]},
              {"pos": 2, "draft": [7], "shadow": [7, 8]},
              {"pos": 1, "draft": [6, 7], "shadow": [6, 7]}]
    c = count_rounds(rounds, out)
    assert c == {"rounds": 4, "rounds_differ": 3, "positions": 4 + 2 + 2 + 2, "positions_differ": 3, "gained": 1,
                 "lost": 3, "accepted": 2 + 2 + 1 + 2, "shadow_accepted": 4 + 1 + 2 + 2}
    s = summary("mobs", c, "why")
    assert s["net"] == -2 and s["status"] == "active" and s["why"] == ""
    assert s["rounds_differ_share"] == 3 / 4 and s["positions_differ_share"] == 3 / 10
    assert accepted_against([9, 10, 11], out, 4) == 2  # never past the output's end


def test_status_labels():
    none = count_rounds([{"pos": 0, "draft": [1, 2], "shadow": [1, 2]}], [1, 2, 3])
    assert summary("simple_parareal_v14", none, "never fires.")["status"] == "inactive"
    assert summary("simple_parareal_v14", none, "never fires.")["why"] == "never fires."
    assert summary("dflash", none, "x")["status"] == "baseline"


def test_registry_declares_why_inactive_for_every_speculative_method():
    assert all(METHODS[m].why_inactive for m in speculative_ids())
    assert "switch threshold" in METHODS["simple_parareal_v14"].why_inactive


class ChangesPosition2(DFlashProposer):
    """dflash's argmax with position 2 (when drafted) replaced by the next token id: a known, countable change."""

    def select(self, logits, hidden, prefix, k):
        ids = logits[:k].argmax(dim=-1).tolist()
        if len(ids) > 2:
            ids[2] = (ids[2] + 1) % logits.shape[-1]
        return ids, 0, {}


def _shadowed(rt, prep, method):
    return Shadowed(method, get_method("dflash").build(rt, prep))


@pytest.mark.exactness
def test_dflash_against_itself_never_differs(tiny_prepared):
    rt, prep = tiny_prepared.rt, tiny_prepared.prepared
    for prompt in PROMPTS:
        prop = _shadowed(rt, prep, get_method("dflash").build(rt, prep))
        ids, st = speculative(rt, prop, prompt, TOKENS, WIDTH, method="dflash")
        c = count_rounds(prop.rounds, ids)
        assert c["rounds"] == st.draft_calls > 0
        assert c["rounds_differ"] == c["positions_differ"] == c["gained"] == c["lost"] == 0
        assert c["accepted"] == c["shadow_accepted"] == st.accepted  # the counterfactual is the verifier's count


@pytest.mark.exactness
def test_a_changed_position_is_counted_exactly_and_output_is_unchanged(tiny_prepared):
    rt, prep = tiny_prepared.rt, tiny_prepared.prepared
    for prompt in PROMPTS:
        plain_ids, plain = speculative(rt, ChangesPosition2(rt, prep), prompt, TOKENS, WIDTH, method="x")
        prop = _shadowed(rt, prep, ChangesPosition2(rt, prep))
        ids, st = speculative(rt, prop, prompt, TOKENS, WIDTH, method="x")
        assert ids == plain_ids == greedy(rt, prompt, TOKENS)[0], "the wrapper must not change the method's output"
        assert (st.target_calls, st.accepted, st.proposed) == (plain.target_calls, plain.accepted, plain.proposed)
        c = count_rounds(prop.rounds, ids)
        long_rounds = sum(1 for r in prop.rounds if len(r["draft"]) > 2)
        assert long_rounds > 0 and c["rounds_differ"] == c["positions_differ"] == long_rounds
        assert c["accepted"] == st.accepted  # the method's drafts, scored against the output, match the verifier
        # by hand: a round that differs only at position 2 keeps min(a_dflash, 2) of dflash's accepted drafts,
        # unless the changed token happens to be greedy's (then it gains what dflash lost there)
        lost = sum(max(0, accepted_against(r["shadow"], ids, r["pos"]) - 2) for r in prop.rounds if len(r["draft"]) > 2)
        assert c["lost"] == lost and c["gained"] == c["accepted"] - (c["shadow_accepted"] - lost)


@pytest.mark.exactness
def test_act_reports_drafted_beside_verified(tiny_prepared):
    from dflash_core.methods.runner import run_method

    rt, prep = tiny_prepared.rt, tiny_prepared.prepared
    _, st = run_method("act", rt, prep, PROMPTS[2], TOKENS, WIDTH, tau=1e9)  # trims every block to one draft
    assert st.meta["drafted"] == st.proposed + st.meta["act_trimmed"] > st.proposed
    _, st = run_method("dspark_lite", rt, prep, PROMPTS[2], TOKENS, WIDTH, floor=0.999)
    assert st.meta["drafted"] == st.proposed + st.meta["dspark_trimmed_tokens"]


@pytest.mark.parametrize("method", speculative_ids())
def test_every_method_gets_an_activity_summary_and_keeps_its_output(tiny_prepared, method):
    """Every registered method decodes under the shadow (its output unchanged, the counts consistent with the
    verifier) and gets a labelled summary; a method added to the registry is covered without editing this file."""
    rt, prep = tiny_prepared.rt, tiny_prepared.prepared
    info = get_method(method)
    prompt = PROMPTS[2]
    plain_ids, plain = speculative(rt, info.build(rt, prep), prompt, TOKENS, WIDTH, method=method)
    prop = _shadowed(rt, prep, info.build(rt, prep))
    ids, st = speculative(rt, prop, prompt, TOKENS, WIDTH, method=method)
    assert ids == plain_ids and (st.target_calls, st.accepted) == (plain.target_calls, plain.accepted)
    c = count_rounds(prop.rounds, ids)
    assert c["rounds"] == st.draft_calls and c["accepted"] == st.accepted
    s = summary(method, c, info.why_inactive)
    assert s["status"] in ("baseline", "active", "inactive") and s["net"] == c["gained"] - c["lost"]
    assert (s["status"] == "inactive") == (method != "dflash" and c["positions_differ"] == 0)
