"""The cost-model speedup (dflash_core.bench.costmodel): exact arithmetic on hand-built rounds, the unexplained-overhead
flag from injected timings, and calibration choosing by the model (ties: tokens per target call), per width."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dflash_core.bench import costmodel as cm
from dflash_core.bench.costmodel import ComponentCosts, model_seconds, model_speedup

from ..support.report_data import bench_row, known_rounds, saved_run

COSTS = ComponentCosts(t_decode=1.0, t_verify=(1.0, 1.25, 1.5), t_draft=0.25, t_observe=0.125, t_select=0.125,
                       t_prefill=2.0, t_begin=0.5)


def test_model_speedup_prices_each_round_exactly():
    # prompt 1: full acceptance of 2, none of 2, then the last round (one token left) drafts nothing
    p1 = [(2, 2), (2, 0), (0, 0)]
    # prompt 2: a trace dict as the decode loop records it (1 of 2 accepted)
    p2 = [{"draft": [7, 8], "accepted": 1, "token": 3, "bonus": False}]
    normal, method = model_seconds([p1, p2], COSTS)
    # normal: prefill + one greedy step per committed token (a + 1 per round)
    assert normal == (2.0 + (3 + 1 + 1) * 1.0) + (2.0 + 2 * 1.0) == 11.0
    # method: prefill + begin, then verify(k) + observe (+ draft + select when k > 0) per round
    per_block = 1.5 + 0.125 + 0.25 + 0.125
    assert method == (2.5 + per_block + per_block + (1.0 + 0.125)) + (2.5 + per_block) == 12.125
    assert model_speedup([p1, p2], COSTS) == 11.0 / 12.125
    assert model_speedup([], COSTS) == 1.0, "nothing decoded: normal against itself"
    with pytest.raises(ValueError, match="t_verify covers 0..2"):
        model_seconds([[(3, 0)]], COSTS)


def test_prefill_cancels_from_choices_but_not_from_the_ratio():
    free = ComponentCosts(t_decode=1.0, t_verify=(1.0, 1.0, 1.0))
    rounds = [[(2, 2), (2, 2)]]
    assert model_speedup(rounds, free) == 3.0
    with_prefill = ComponentCosts(t_decode=1.0, t_verify=(1.0, 1.0, 1.0), t_prefill=4.0)
    assert model_speedup(rounds, with_prefill) == (4.0 + 6.0) / (4.0 + 2.0)


@pytest.mark.parametrize("ratio,noise,flagged", [
    (0.85, 0.01, True), (1.15, 0.029, True), (0.95, 0.01, False), (0.9, 0.0, False), (1.1, 0.0, False),
    (0.85, 0.031, False), (0.5, 0.05, False), (0.5, None, False), (None, 0.0, False)])
def test_unexplained_overhead_only_on_a_quiet_machine_outside_the_band(ratio, noise, flagged):
    """Quiet: the run's robust noise figure at most the 3 % threshold (a quiet run reads 1-1.5 %, so the flag can
    fire; the A/A maximum it replaces read 4-13 % on quiet runs against a 2 % bar)."""
    assert cm.unexplained_overhead(ratio, noise) is flagged


def test_choose_follows_the_model_then_tokens_per_call_never_tok_s():
    rows = [{"model_speedup": 1.2, "tokens_per_target_call": 2.0, "tokens_per_second_median": 900.0},
            {"model_speedup": 1.5, "tokens_per_target_call": 2.5, "tokens_per_second_median": 100.0},
            {"model_speedup": 1.496, "tokens_per_target_call": 3.0, "tokens_per_second_median": 50.0},
            {"model_speedup": 1.9, "tokens_per_target_call": 4.0, "all_exact": False}]
    assert cm.choose(rows) == 2, "within 3 % of the best is a tie, and the tie goes to more tokens per call"
    rows[2]["model_speedup"] = 1.5 * (1 - cm.TIE_TOLERANCE) - 1e-9
    assert cm.choose(rows) == 1, "just outside the band is not a tie"
    assert cm.choose(rows, tolerance=0.0) == 1
    same = [{"model_speedup": 1.0, "tokens_per_target_call": 2.0}] * 3
    assert cm.choose(same) == 0, "a full tie goes to grid order"
    with pytest.raises(RuntimeError, match="no exact setting"):
        cm.choose([{"model_speedup": 2.0, "tokens_per_target_call": 1.0, "all_exact": False}])


# --- the report: no loop timings, no cost model ------------------------------------------------------------------

def test_runs_without_a_cost_model_are_never_flagged():
    """No loop timings, no model: a model speedup a saved row carries is not the report's and is not read.
    Break: carry the row's saved model_speedup -> best.model_speedup is 2.0 and the row is flagged."""
    from dflash_core.report.build import build_report

    row = bench_row("dflash", 2, speedup=1.5)
    row["extra_info"].update(model_speedup=2.0, measured_over_model=0.75)
    doc = build_report([saved_run([bench_row("normal", 0), row])], ["r"])
    best = doc["methods"]["dflash"]["best"]
    assert best["model_speedup"] is None and best["unexplained_overhead"] is False


# --- the loop's own costs: a monotone verify curve, rows priced on it, the component that differs ----------------

def test_the_verify_curve_is_a_monotone_fit_of_the_loops_own_rounds():
    """Per-round in-loop seconds, noisy and not monotone at k = 4 (a slow burst), none at k = 2: the fit never
    decreases, pools k = 3 and 4 where they disagree, and interpolates k = 2. Break: the raw per-k medians (no
    isotonic fit) -> t_verify(4) < t_verify(3)."""
    samples = {0: [1.0, 1.02, 0.98], 1: [1.2, 1.18, 1.22], 3: [1.6, 1.62, 1.58], 4: [1.45, 1.5, 1.4, 1.48],
               6: [1.9, 2.0]}
    curve = cm.fit_verify_curve(samples, block_size=7)
    assert len(curve) == 8 and all(a <= b for a, b in zip(curve, curve[1:]))
    assert curve[3] == curve[4] == pytest.approx((1.6 * 3 + 1.48 * 4) / 7, rel=0.02)  # pooled where they disagree
    assert curve[2] == pytest.approx((curve[1] + curve[3]) / 2) and curve[7] == curve[6]
    assert cm.fit_verify_curve({}) is None


def _loop_run(overhead: float = 0.0, noise: float = 0.004) -> dict:
    """A saved run whose walls are exactly the loop's components (greedy: prefill + 47 steps per prompt; dflash
    and mobs: prefill + verify rounds + drafter), except `overhead` (a fraction of mobs' wall) the components do not
    explain; measured speedups = greedy wall / method wall."""
    from dflash_core.report.build import build_report

    prompts, tokens = 4, 48
    step, verify = 0.006, [0.006 + 0.0005 * k for k in range(16)]
    normal_block = {"prompts": prompts, "tokens": prompts * tokens, "prefill": prompts * 0.02, "step": step,
                    "wall": prompts * (0.02 + 47 * step), "target": prompts * (0.02 + 47 * step), "draft": 0.0,
                    "select": 0.0}
    rows = [bench_row("normal", 0, rounds=[1.0] * 3)]
    rows[0]["extra_info"]["loop_costs"] = normal_block
    for mid, ks, extra in (("dflash", {7: 5, 5: 1}, 0.0), ("mobs", {7: 4, 3: 1}, overhead)):
        verify_s = prompts * sum(c * verify[k] for k, c in ks.items())
        draft = prompts * sum(ks.values()) * 0.0015
        target = prompts * 0.022 + verify_s
        wall = (target + draft) / (1 - extra)
        block = {"prompts": prompts, "tokens": prompts * tokens, "prefill": prompts * 0.022, "target": target,
                 "draft": draft, "select": 0.0, "wall": wall,
                 "verify": {"k": sorted(ks), "calls": [prompts * 3 * ks[k] for k in sorted(ks)],
                            "median": [verify[k] for k in sorted(ks)]},
                 "schedule": {"k": sorted(ks), "calls": [prompts * ks[k] for k in sorted(ks)]}}
        sp = normal_block["wall"] / wall
        row = bench_row(mid, 7, speedup=sp, rounds=[sp] * 3)
        row["extra_info"].update(loop_costs=block, vs_baseline_rounds=known_rounds(1.0, noise, n=16, seed=len(mid)))
        rows.append(row)
    saved = saved_run(rows)
    saved["dflash"]["settings"].update(block_size=15, ranking_width=7)
    saved["dflash"]["noise"] = {"threshold": 0.03, "figure": "robust"}
    return build_report([saved], ["loop"])


def test_rows_are_priced_on_the_loop_and_a_gap_names_its_component():
    """A row whose wall is its components reads measured/model 1.00 and is not flagged; one whose loop adds 20 %
    the components do not explain reads ~0.80 and is flagged on a quiet run, naming loop overhead; on a noisy run
    nothing is flagged. Break: the quiet condition dropped (flag whatever the noise) -> the noisy run flags mobs."""
    from dflash_core.report.html import render_report

    doc = _loop_run(overhead=0.2)
    d, m = (doc["methods"][k]["rows"]["7"] for k in ("dflash", "mobs"))
    assert d["measured_over_model"] == pytest.approx(1.0, abs=1e-9) and not d["unexplained_overhead"]
    assert m["measured_over_model"] == pytest.approx(0.8, abs=1e-9) and m["unexplained_overhead"]
    assert m["model_component"].startswith("loop overhead") and doc["methods"]["mobs"]["best"]["unexplained_overhead"]
    assert doc["cost_model"]["fit"]["t_verify"][7] == pytest.approx(0.0095) and doc["verify_cost"]["source"].startswith(
        "loop")
    loud = _loop_run(overhead=0.2, noise=0.08)
    assert loud["noise"]["noisy"] and not loud["methods"]["mobs"]["rows"]["7"]["unexplained_overhead"]
    assert "unexplained overhead</span>" in render_report(doc) and "unexplained overhead</span>" not in render_report(
        loud)


def test_the_upper_bound_includes_the_prefill_and_the_short_last_round():
    """48 tokens at width 15: the prefill emits 1, rounds of 15 drafts commit 16, 16, then the last has 14 drafts
    left (15). The bound prices that schedule and the prefill, below (w + 1) t_decode / t_verify(w).
    Break: the old bound (w + 1) t_decode / t_verify(w) -> it is above the priced schedule."""
    assert cm.oracle_schedule(48, 15) == {"k": [14, 15], "calls": [1, 2]}
    assert cm.oracle_schedule(1, 4) == {"k": [], "calls": []}
    normal = {"prompts": 1, "prefill": 0.02, "step": 0.006}
    curve = [0.006 + 0.0005 * k for k in range(16)]
    b = cm.upper_bound(normal, 0.022, curve, 48, 1, 15)
    assert b == pytest.approx((0.02 + 47 * 0.006) / (0.022 + 2 * curve[15] + curve[14]))
    assert b < 16 * 0.006 / curve[15]
    doc = _loop_run()
    assert set(doc["upper_bound_speedup"]) == {"7"} and doc["upper_bound_speedup"]["7"] > 1


# --- calibration: the chosen setting follows the cost model on injected costs --------------------------------

class ScriptedProposer:
    """Drafts the greedy reference for its first `good` positions and a wrong token after them, `k` at most."""

    taps: tuple = ()
    max_width = None

    def __init__(self, prompt, ref, good: int, k: int, vocab: int):
        self.prompt, self.ref, self.good, self.k, self.vocab = list(prompt), list(ref), good, k, vocab

    def begin(self, prompt, hidden):
        pass

    def propose(self, prefix, k):
        from dflash_core.runtime.decode import Proposal

        at = len(prefix) - len(self.prompt)
        nxt = self.ref[at:at + min(k, self.k)]
        return Proposal(ids=[t if i < self.good else (t + 1) % self.vocab for i, t in enumerate(nxt)])

    def observe(self, hidden):
        pass


def _calibrate(tiny_prepared, t_verify):
    from dflash_core.bench.calibrate import calibrate
    from dflash_core.runtime.decode import greedy

    rt = tiny_prepared.rt
    prompt, tokens = [5, 6, 7], 6
    ref = greedy(rt, prompt, tokens)[0]
    vocab = rt.vocab_size
    settings = [{"good": 0, "k": 3}, {"good": 1, "k": 1}, {"good": 3, "k": 3}]
    costs = ComponentCosts(t_decode=1.0, t_verify=t_verify)
    return calibrate(rt, [prompt], tokens, settings, lambda s: ScriptedProposer(prompt, ref, s["good"], s["k"], vocab),
                     3, costs=costs, refs=[ref], timed=False)


def test_calibration_chooses_by_the_cost_model_and_breaks_ties_by_tokens_per_call(tiny_prepared):
    # 6 tokens: the prefill emits 1, the rounds 5 (never more than are left: k <= tokens left - 1).
    # k=3 all wrong: rounds of 3, 3, 2, 1, 0 drafts, one token each; k=1 all right: two rounds of 2 tokens and a
    # last one of 0 drafts; k=3 all right: one round of 4 tokens and a last one of 0 drafts.
    out = _calibrate(tiny_prepared, (1.0, 2.0, 3.0, 4.02))
    ms = [r["model_speedup"] for r in out["table"]]
    assert ms == [pytest.approx(5.0 / (4.02 + 4.02 + 3.0 + 2.0 + 1.0), rel=1e-12), 1.0,
                  pytest.approx(5.0 / 5.02, rel=1e-12)]
    assert [r["tokens_per_target_call"] for r in out["table"]] == [1.0, 1.5, 2.0]
    assert all(r["all_exact"] for r in out["table"])
    # the full block is within 1 % of the short one: a tie, won by more tokens per target call
    assert out["selected"] == {"good": 3, "k": 3}
    assert out["protocol"]["objective"].startswith("cost-model speedup")
    # a verify of 3 costing more makes the short block the clear choice: the decodes are the same, only costs moved
    assert _calibrate(tiny_prepared, (1.0, 2.0, 3.0, 4.5))["selected"] == {"good": 1, "k": 1}


def test_measured_over_model_of_zero_model_is_zero():
    assert cm.measured_over_model(1.2, 0.0) == 0.0 and cm.measured_over_model(1.2, 1.5) == 1.2 / 1.5



@settings(max_examples=300, deadline=None)
@given(n=st.integers(2, 16), seed=st.integers(0, 2**32 - 1), noise=st.floats(0.0, 0.0149))
def test_two_runs_with_independent_timing_noise_choose_the_same_width(n, seed, noise):
    """The guarantee of the tie band: where the row with the most tokens per target call (counted by the replay, no
    noise) has a true model speedup within TIE_TOLERANCE - 2 x noise of the true best, two runs whose timed
    speedups each carry independent multiplicative noise up to `noise` both choose it."""
    import random

    r = random.Random(seed)
    tpc = sorted(r.uniform(1.0, 8.0) for _ in range(n))
    best = r.uniform(1.0, 3.0)
    true = [best * (1 - r.uniform(0.0, 0.3)) for _ in range(n)]
    true[r.randrange(n)] = best
    margin = cm.TIE_TOLERANCE - 2 * noise
    true[-1] = best * (1 - r.uniform(0.0, max(0.0, margin - 1e-9)))  # the widest row: inside the guaranteed band

    def run():
        return cm.choose([{"model_speedup": t * (1 + r.uniform(-noise, noise)),
                           "tokens_per_target_call": k} for t, k in zip(true, tpc)])

    assert run() == run() == n - 1
