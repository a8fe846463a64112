"""The measurement path on the tiny prepared target: paired rounds for cases and references, the lab section
the session builds for benchmark.json, and open_session leaving the torch thread count as it found it."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

PROMPTS = ([1, 5, 9, 13], [3, 4, 40, 41, 42])
TOKENS = 6


@pytest.fixture()
def session(tiny_prepared):
    import torch

    from dflash_core.bench.config import BenchConfig
    from dflash_core.bench.state import BenchSession
    from dflash_core.runtime.decode import greedy

    refs, margins = [], []
    for p in PROMPTS:
        r, st = greedy(tiny_prepared.rt, p, TOKENS, record_margins=True)
        refs.append(r)
        margins.append(st.margins)
    cfg = BenchConfig(target=str(tiny_prepared.path), tokens=TOKENS, prompt_limit=len(PROMPTS), rounds=2,
                      threads=torch.get_num_threads())
    return BenchSession(cfg, tiny_prepared.rt, tiny_prepared.prepared, "code", ["a", "b"], [list(p) for p in PROMPTS],
                        refs, margins)


def test_measure_pair_counts_the_first_round_and_pairs_every_round(session, tiny_prepared):
    from dflash_core.bench.cases import measure_pair
    from dflash_core.methods.runner import run_method

    info = measure_pair(session, "dflash", 2, rounds=2)
    direct = [run_method("dflash", tiny_prepared.rt, tiny_prepared.prepared, p, TOKENS, 2)[1] for p in PROMPTS]
    assert info["exact"] is True and info["verdicts"] == {"exact": len(PROMPTS)}
    assert info["rounds"] == 2 and len(info["speedup_rounds"]) == 2
    assert info["new_tokens"] == TOKENS * len(PROMPTS)
    assert info["target_calls"] == sum(s.target_calls for s in direct)
    assert info["accepted"] == sum(s.accepted for s in direct) and info["proposed"] == sum(s.proposed for s in direct)
    assert info["accept_histogram"] == [sum(c) for c in zip(*(s.accept_counts for s in direct))]
    assert info["tokens_per_target_call"] == info["new_tokens"] / info["target_calls"]
    assert 0.0 <= info["overhead_fraction"] <= 1.0
    assert session.cases == {"dflash": [2]} and len(session.traces["dflash-w2"]) <= 16
    act = info["activity"]  # dflash against its own shadow: the baseline, never different
    assert act["status"] == "baseline" and act["rounds"] == sum(s.draft_calls for s in direct) > 0
    assert act["rounds_differ"] == act["positions_differ"] == act["net"] == 0
    assert act["accepted"] == act["shadow_accepted"] == info["accepted"]
    assert info["drafted"] == info["proposed"] and info["acceptance_rate_drafted"] == info["acceptance_rate"]


def test_a_trimming_case_reports_drafted_acceptance_and_its_activity(session):
    from dflash_core.bench.cases import measure_pair

    session.options["act"] = {"tau": 1e9}  # every block trimmed to one draft
    info = measure_pair(session, "act", 2, rounds=1)
    assert info["drafted"] > info["proposed"] and info["acceptance_rate_drafted"] == info["accepted"] / info["drafted"]
    act = info["activity"]
    # every round dflash drafts 2 where ACT keeps 1 (k = 1 rounds near the budget's end drafted 1 for both)
    assert act["status"] == "active" and act["positions_differ"] == act["rounds_differ"] > 0
    assert act["gained"] == 0 and act["net"] == -act["lost"] and act["accepted"] == info["accepted"]


def test_a_base_round_extends_the_case_and_its_record(session):
    """base_round: normal, dflash and the method in a seeded order; the first rounds (pedantic's) ran in the fixed
    order normal, dflash, method, and each round's order is saved beside its ratios."""
    from dflash_core.bench.cases import measure_pair
    from dflash_core.bench.schedule import base_round, leg_order

    info = measure_pair(session, "dflash", 2, rounds=2)
    assert info["leg_orders"] == ["nbm", "nbm"]
    got = []
    case = session.case_rounds["dflash-w2"]
    case.sink = lambda seconds, new: got.append((seconds, dict(new)))
    ratio = base_round(session, "dflash-w2")
    seconds, new = got[-1]
    assert new["rounds"] == 3 and len(new["speedup_rounds"]) == 3
    assert new["speedup_rounds"][:2] == info["speedup_rounds"]
    assert new["speedup_rounds"][2] == ratio and seconds > 0
    assert new["leg_orders"] == ["nbm", "nbm", leg_order(session.cfg.seed, "dflash-w2", 2, "nbm")]
    assert new["activity"] == info["activity"] and new["accepted"] == info["accepted"]  # counts: the first round


def test_a_compare_round_adds_a_ratio_against_dflash_and_no_speedup_round(session):
    """compare_round (the ranking's extra rounds): the dflash leg and the method, no normal leg; the speedup over
    greedy keeps its normal-paired rounds, the ratio against dflash gains one, and a round with a normal leg
    after it is refused (it would pair normal with the wrong method wall)."""
    from dflash_core.bench.cases import measure_pair
    from dflash_core.bench.schedule import base_round, compare_round

    info = measure_pair(session, "dflash", 2, rounds=2)
    got = []
    case = session.case_rounds["dflash-w2"]
    case.sink = lambda seconds, new: got.append((seconds, dict(new)))
    ratio = compare_round(session, "dflash-w2")
    seconds, new = got[-1]
    assert new["rounds"] == 2 and new["speedup_rounds"] == info["speedup_rounds"]
    assert new["compared_rounds"] == 3 and new["vs_baseline_rounds"][:2] == info["vs_baseline_rounds"]
    assert new["vs_baseline_rounds"][2] == ratio and seconds > 0
    assert len(case.normal_walls) == 2 and len(case.walls) == len(case.baseline_walls) == 3
    with pytest.raises(RuntimeError, match="misalign"):
        base_round(session, "dflash-w2")
    measure_pair(session, "normal", 0, rounds=1)
    with pytest.raises(ValueError, match="speculative"):
        compare_round(session, "normal-w0")


def test_cases_record_widths_as_data_for_the_lab_section(session):
    from dflash_core.bench.cases import measure_pair
    from dflash_core.methods import METHODS

    measure_pair(session, "normal", 0, rounds=1)
    measure_pair(session, "dflash", 2, rounds=1)
    measure_pair(session, "dflash", 1, rounds=1)
    assert session.cases == {"normal": [0], "dflash": [1, 2]}
    lab = json.loads(json.dumps(session.lab_section(), allow_nan=False))
    assert set(lab) == {"settings", "target", "provenance", "calibration", "tuned_widths", "traces", "token_text",
                        "trace_prompt", "prompts", "methods", "noise", "ranking_rounds", "cost_model"}
    assert lab["trace_prompt"] == session.prompts[0]  # the prompt the traces continue (the explorer shows it)
    assert lab["cost_model"]["source"] == "loop" and lab["noise"] == {"threshold": 0.03, "figure": "robust"}
    assert lab["settings"]["widths"] == [0, 1, 2] and lab["settings"]["block_size"] == session.block_size
    assert lab["settings"]["tokens"] == TOKENS and lab["target"]["dtype"] == "float64"
    assert set(lab["traces"]) == {"normal-w0", "dflash-w1", "dflash-w2"} and lab["traces"]["normal-w0"] == []
    first = lab["traces"]["dflash-w2"]
    assert first and all(len(r["draft"]) <= 2 and 0 <= r["accepted"] <= len(r["draft"]) for r in first)
    assert lab["token_text"] == {}, "the tiny target has no tokenizer"
    assert len(lab["methods"]) == len(METHODS) and lab["methods"]["dflash"]["index"] == 1


def test_cases_save_their_loop_timings_for_the_cost_model(session):
    """Every case's extra_info carries the timings of its own decode loop (costmodel.loop_block): greedy's step and
    prefill; for a speculative case its verify seconds per k and its round schedule, whose verify calls are the
    case's target calls less the prefills. The report fits the verify curve on them and prices each row."""
    from dflash_core.bench.cases import measure_pair
    from dflash_core.bench.costmodel import fit_verify_curve, row_model

    normal = measure_pair(session, "normal", 0, rounds=2)["loop_costs"]
    info = measure_pair(session, "dflash", 2, rounds=2)
    block = info["loop_costs"]
    assert normal["step"] > 0 and normal["prefill"] > 0 and normal["prompts"] == len(PROMPTS)
    assert sum(block["schedule"]["calls"]) == info["target_calls"] - len(PROMPTS)
    assert max(block["schedule"]["k"]) <= 2 and sum(block["verify"]["calls"]) == 2 * sum(block["schedule"]["calls"])
    assert 0 < block["prefill"] < block["target"] < block["wall"]
    curve = fit_verify_curve(blocks=[block], block_size=session.block_size)
    assert len(curve) == session.block_size + 1 and all(a <= b for a, b in zip(curve, curve[1:]))
    model = row_model(block, normal, curve)
    assert model["model_speedup"] > 0 and set(model["components"]) == {"verify", "overhead", "greedy_overhead"}


def test_token_text_covers_every_traced_id():
    from dflash_core.bench.state import BenchSession

    rt = SimpleNamespace(tokenizer=object(), decode=lambda ids: f"<{ids[0]}>")
    sess = BenchSession(None, rt, None, "code", [], [], [], [])
    sess.traces = {"m-w2": [{"draft": [7, 3], "accepted": 1, "token": 9, "bonus": False}],
                   "m-w1": [{"draft": [], "accepted": 0, "token": 3, "bonus": True}]}
    assert sess.token_text() == {"3": "<3>", "7": "<7>", "9": "<9>"}


def test_measure_reference_pairs_the_oracle_with_normal(session):
    from dflash_core.bench.peers import measure_reference, reference_runner

    outs, wall = reference_runner(session.rt, session.prompt_ids, session.greedy_outputs, TOKENS, "oracle-w2")()
    assert outs == session.greedy_outputs and wall > 0
    info = measure_reference(session, "oracle-w2", rounds=2)
    assert set(info) == {"reference", "device", "tokens_per_second", "tokens_per_second_iqr", "speedup",
                         "speedup_iqr", "speedup_rounds", "rounds", "exact", "verdicts"}
    assert info["exact"] is True and info["rounds"] == 2 and len(info["speedup_rounds"]) == 2
    with pytest.raises(ValueError, match="unknown reference"):
        measure_reference(session, "beam", rounds=1)


def test_open_session_restores_the_thread_count(monkeypatch):
    import torch

    from dflash_core.bench.config import BenchConfig
    from dflash_core.bench.session import open_session

    class Stop(Exception):
        pass

    seen = []

    def fake_prepare(*args, **kwargs):
        seen.append(torch.get_num_threads())
        raise Stop

    monkeypatch.setattr("dflash_core.bench.session.prepare", fake_prepare)
    before = torch.get_num_threads()
    want = 1 if before != 1 else 2
    try:
        with pytest.raises(Stop):
            open_session(BenchConfig(threads=want))
        assert seen == [want], "the session's own work runs at cfg.threads"
        assert torch.get_num_threads() == before, "open_session leaked its thread count"
    finally:
        torch.set_num_threads(before)


def test_each_width_gets_its_own_calibration_and_its_cases_use_it(session, tiny_prepared, monkeypatch):
    import dataclasses

    from dflash_core.bench import calibration as bench
    from dflash_core.bench.cases import measure_pair
    from dflash_core.bench.costmodel import OBJECTIVE, choose
    from dflash_core.methods import get_method
    from dflash_core.methods.runner import run_method
    from dflash_core.store.data import load_prompts

    texts = list(load_prompts("code").calibration[:2])
    monkeypatch.setattr(bench, "_cal_ids", lambda sess, t: [[5, 6, 7], [11, 12, 13, 14]][: len(t)])
    monkeypatch.setattr(bench, "calibrated", lambda: [get_method("act")])
    session.cfg = dataclasses.replace(session.cfg, calibration_widths=(2, 1, 99), calibration_tokens=TOKENS)
    bench.calibrate_all(session, texts)
    rec = session.calibration["act"]
    assert rec["objective"] == OBJECTIVE and set(rec["widths"]) == {"1", "2"}, "99 > B is not calibrated"
    for w in (1, 2):
        r = rec["widths"][str(w)]
        assert r["protocol"]["width"] == w and r["protocol"]["objective"] == OBJECTIVE
        assert r["selected"] == r["table"][choose(r["table"])]["setting"]
        assert session.width_options["act"][w] == r["selected"]
    assert session.options["act"] == rec["widths"]["2"]["selected"] == rec["selected"]
    # the cases decode with their own width's options (nearest calibrated width beyond them)
    session.width_options["act"] = {1: {"tau": 0.0}, 2: {"tau": 8.0}}
    assert session.options_for("act", 4) == {"tau": 8.0} and session.options_for("act", 1) == {"tau": 0.0}
    for w, tau in ((1, 0.0), (2, 8.0)):
        info = measure_pair(session, "act", w, rounds=1)
        direct = [run_method("act", tiny_prepared.rt, tiny_prepared.prepared, p, TOKENS, w, tau=tau)[1]
                  for p in PROMPTS]
        assert info["options"] == {"tau": tau}
        assert info["proposed"] == sum(s.proposed for s in direct)


def test_tune_chooses_widths_by_the_cost_model(session, monkeypatch):
    import dataclasses

    from dflash_core import methods
    from dflash_core.bench import calibration as bench
    from dflash_core.bench.costmodel import ComponentCosts, choose

    monkeypatch.setattr(bench, "_cal_ids", lambda sess, t: [[5, 6, 7], [11, 12, 13, 14]])
    monkeypatch.setattr(methods, "speculative_ids", lambda: ["dflash"])
    monkeypatch.setattr("dflash_core.bench.session.speculative_ids", lambda: ["dflash"])
    session.cfg = dataclasses.replace(session.cfg, calibration_tokens=TOKENS)
    # an injected target cost table (the session's own would be timed by calibrate_all)
    session.calibration_costs = ComponentCosts(t_decode=1.0, t_verify=tuple(1.0 + 10.0 * w for w in range(
        session.block_size + 1)))
    bench.tune_widths(session, ["x", "y"])
    tw = session.tuned_widths["dflash"]
    assert [r["setting"]["width"] for r in tw["table"]] == sorted({min(w, session.block_size) for w in (1, 2, 4)})
    assert tw["selected"] == tw["table"][choose(tw["table"])]["setting"]["width"]
    assert all("model_speedup" in r for r in tw["table"])


@pytest.mark.parametrize("cheapest,count", [(3, 2), ("B", 2), (3, 1)])
def test_auto_widths_follow_the_measured_verify_cost_curve(session, monkeypatch, cheapest, count):
    """--bench-widths auto: dflash priced at every width 1..B over the session's verify-cost curve. A curve whose
    verify is far cheaper at one width makes that width the best (whatever dflash accepts there), and the second
    width is the best of those at most half of it (none under width_count 1, a real target's auto size); the
    record keeps the table and the curve."""
    import dataclasses

    from dflash_core.bench import calibration as bench
    from dflash_core.bench.costmodel import ComponentCosts

    B = session.block_size
    best = B if cheapest == "B" else min(3, B)
    monkeypatch.setattr(bench, "_cal_ids", lambda sess, t: [[5, 6, 7], [11, 12, 13, 14]])
    session.cfg = dataclasses.replace(session.cfg, calibration_tokens=TOKENS, width_count=count)
    verify = [50.0] * (B + 1)
    verify[best] = 1.0
    session.calibration_costs = ComponentCosts(t_decode=1.0, t_verify=tuple(verify))
    widths = bench.auto_widths(session, ["x", "y"])
    assert widths[-1] == best
    assert len(widths) == (2 if best >= 2 and count == 2 else 1) and all(1 <= w <= best // 2 for w in widths[:-1])
    rec = session.width_choice
    assert rec["selected"] == widths and [r["width"] for r in rec["table"]] == list(range(1, B + 1))
    assert rec["verify_over_decode"][str(best)] == 1.0
    top = max(r["model_speedup"] for r in rec["table"])
    assert next(r for r in rec["table"] if r["width"] == best)["model_speedup"] >= top * 0.99
    session.cfg = dataclasses.replace(session.cfg, calibration_widths=())
    session.bench_widths = widths
    assert session.calibration_widths() == widths  # the chosen widths are the ones calibrated


@pytest.mark.parametrize("table_covers", [True, False])
def test_a_real_target_sizes_its_matrix_from_what_calibration_measured(session, monkeypatch, table_covers):
    """size_matrix prices the matrix on the loop's decode step and dflash's cost-model speedup at the benchmarked
    width (from the width table, else timed on calibration prompts), a prefill row and the verify-cost curve on the
    verify curve, and the session takes the chosen size for every knob the user did not set. Break: price
    speculative legs at t_decode and the plan differs."""
    import dataclasses

    from dflash_core.bench.budget import MatrixCosts, plan_matrix
    from dflash_core.bench.costmodel import ComponentCosts
    from dflash_core.bench.peers import REFERENCES, VERIFY_CURVE_CALLS
    from dflash_core.bench.session import size_matrix
    from dflash_core.methods import speculative_ids

    session.cfg = dataclasses.replace(session.cfg, rank_rounds=6, resized=("rank_rounds",), calibration_widths=())
    session.bench_widths, session.ranking_width = [2], 2
    session.calibration_costs = ComponentCosts(t_decode=0.1, t_verify=(0.1,) * (session.block_size + 1))
    timed = []
    if table_covers:
        session.width_choice = {"table": [{"width": 2, "model_speedup": 0.5, "tokens_per_target_call": 1.0}]}
    else:
        session.width_choice = None
        monkeypatch.setattr("dflash_core.bench.session.dflash_table", lambda sess, ws, ctx: timed.extend(ws) or [
            {"setting": {"width": w}, "model_speedup": 0.5} for w in ws])
    plan = size_matrix(session, {}, 300.0, [5, 7])
    assert timed == ([] if table_covers else [2])
    B = session.block_size
    costs = MatrixCosts(0.1, {2: 0.2}, t_row=0.1 / (B + 1), prompt_lens=(5, 7), t_fixed=VERIFY_CURVE_CALLS * 0.1 * B)
    caps = {k: getattr(session.cfg, k) for k in ("prompt_limit", "tokens", "rounds")}  # the budget only shrinks
    want = plan_matrix(costs, 300.0, fixed={}, caps=caps, rank_rounds=6, methods=len(speculative_ids()), widths=[2],
                       ranking_width=2, references=len(REFERENCES) + 1)
    assert {k: plan[k] for k in want} == want and plan["t_spec"] == {"2": 0.2}
    cfg = session.cfg.budgeted(plan["chosen"])
    assert {k: getattr(cfg, k) for k in plan["chosen"]} == plan["chosen"]


class _Loaded(Exception):
    pass


@pytest.mark.parametrize("handed", [True, False])
def test_a_session_bench_prepared_for_loads_the_target_once(tiny_prepared, monkeypatch, handed):
    """`bench` prepares, then hands its child the artifact folder (DFLASH_PREPARED): the session then loads the
    target once and never prepares again; without the hand-over (a direct pytest run) it prepares first."""
    from dflash_core.bench import session as S
    from dflash_core.bench.config import BenchConfig
    from dflash_core.prepare import pipeline

    loads, prepares = [], []
    real_load = pipeline.load_target

    def counted(*a, **k):
        loads.append(a[0])
        return real_load(*a, **k)

    def stop(*a, **k):
        raise _Loaded

    monkeypatch.setenv("DFLASH_HOME", str(tiny_prepared.home))
    monkeypatch.setattr(S, "load_target", counted)
    monkeypatch.setattr(pipeline, "load_target", counted)  # what prepare() loads to verify the artifacts
    real_prepare = S.prepare
    monkeypatch.setattr(S, "prepare", lambda *a, **k: prepares.append(a) or real_prepare(*a, **k))
    monkeypatch.setattr(S, "family_for", stop)  # the first step after the artifacts are loaded
    if handed:
        monkeypatch.setenv("DFLASH_PREPARED", str(tiny_prepared.prepared.directory))
    else:
        monkeypatch.delenv("DFLASH_PREPARED", raising=False)
    with pytest.raises(_Loaded):
        S.open_session(BenchConfig(target=str(tiny_prepared.path), threads=1))
    assert len(loads) == (1 if handed else 2) and len(prepares) == (0 if handed else 1)


def test_a_hand_over_naming_other_artifacts_is_refused(tiny_prepared, monkeypatch, tmp_path):
    from dflash_core.bench import session as S
    from dflash_core.bench.config import BenchConfig
    from dflash_core.errors import ArtifactError

    monkeypatch.setenv("DFLASH_HOME", str(tiny_prepared.home))
    monkeypatch.setenv("DFLASH_PREPARED", str(tmp_path))
    monkeypatch.setattr(S, "prepare", lambda *a, **k: pytest.fail("prepared again"))
    with pytest.raises(ArtifactError, match="unset DFLASH_PREPARED"):
        S.open_session(BenchConfig(target=str(tiny_prepared.path), threads=1))


def test_the_width_model_replays_one_benchmark_length_decode_from_each_calibration_prompt(session, monkeypatch):
    """Decodes from each prompt's start, as the benchmark decodes: none cut from deep inside a long continuation,
    where the drafter (trained on short trajectories) accepts less than any benchmark decode sees."""
    import dataclasses

    from dflash_core.bench import calibration as bench
    from dflash_core.bench.costmodel import ComponentCosts
    from dflash_core.runtime.decode import greedy

    prompts = [[5, 6, 7], [11, 12, 13, 14], [3, 9]]
    monkeypatch.setattr(bench, "_cal_ids", lambda sess, t: prompts[: len(t)])
    session.cfg = dataclasses.replace(session.cfg, calibration_tokens=40, tokens=TOKENS)
    session.calibration_costs = ComponentCosts(t_decode=1.0, t_verify=(1.0,) * (session.block_size + 1))
    ctx = bench.calibration_context(session, ["a", "b", "c"])
    assert ctx["ids"] == prompts and ctx["tokens"] == TOKENS  # one decode per prompt, each from its start
    assert ctx["refs"] == [greedy(session.rt, p, TOKENS)[0] for p in prompts]
    assert ctx["model"]["decodes"] == 3 and ctx["model"]["tokens"] == 3 * TOKENS
