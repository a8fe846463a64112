"""Benchmark size: `--bench-size auto` sizes every target's matrix to `--bench-budget` from the costs calibration
measured (bench.budget), never above the configured values; over 100M parameters it also gives every knob the user
did not set the real-target defaults. Explicit knobs, `--bench-size full` and --smoke are left alone."""

from __future__ import annotations

import pytest

from dflash_core.bench.budget import (
    FULL_BLOCKS,
    LADDER,
    REFERENCE_LEG_FACTOR,
    SLOWEST_METHOD_FACTOR,
    MatrixCosts,
    plan_matrix,
    projected_seconds,
    tokens_floor,
)
from dflash_core.bench.config import (
    BUDGETED,
    MINI_BENCH_BUDGET,
    REAL_BENCH_BUDGET,
    REAL_TARGET_DEFAULTS,
    REAL_TARGET_PARAMETERS,
    BenchConfig,
)


def test_a_large_target_gets_the_real_target_defaults():
    cfg = BenchConfig().sized_for(134_515_008)
    assert {k: getattr(cfg, k) for k in REAL_TARGET_DEFAULTS} == REAL_TARGET_DEFAULTS
    assert cfg.resized == tuple(sorted(REAL_TARGET_DEFAULTS)) and cfg.rounds == BenchConfig().rounds


@pytest.mark.parametrize("cfg,params", [(BenchConfig(), REAL_TARGET_PARAMETERS), (BenchConfig(), 11_900_000),
                                        (BenchConfig(bench_size="full"), 354_000_000),
                                        (BenchConfig(smoke=True), 354_000_000), (BenchConfig(), None)])
def test_small_targets_full_size_and_smoke_keep_the_table_defaults(cfg, params):
    got = cfg.sized_for(params)
    assert {**got.to_dict(), "bench_budget": None} == {**cfg.to_dict(), "bench_budget": None} and not got.resized


@pytest.mark.parametrize("given,params,minutes", [
    ("auto", 11_900_000, MINI_BENCH_BUDGET), ("auto", None, MINI_BENCH_BUDGET),
    ("auto", 134_515_008, REAL_BENCH_BUDGET),
    (7.5, 354_000_000, 7.5), (40.0, 11_900_000, 40.0)])
def test_the_budget_auto_is_the_mini_or_the_real_targets_and_a_number_is_kept(given, params, minutes):
    """auto: 15 min up to 100M parameters (the main command's < 20 min), 25 above. Break: one constant for both."""
    assert BenchConfig().bench_budget == "auto"
    assert BenchConfig(bench_budget=given).sized_for(params).bench_budget == minutes


def test_every_target_is_budgeted_under_auto_unless_full_smoke_or_every_knob_given():
    """The mini target too (an AVX2-only CPU took 21.7 min at the full size); nothing to choose when the user gave
    all three knobs, so no calibration work is spent projecting them."""
    assert BenchConfig().budgeted_size and BenchConfig(explicit=("tokens",)).budgeted_size
    assert not BenchConfig(bench_size="full").budgeted_size and not BenchConfig(smoke=True).budgeted_size
    assert not BenchConfig(explicit=BUDGETED).budgeted_size


def test_the_budget_only_shrinks_the_matrix():
    """Caps are the configured values: a huge budget keeps the mini's full matrix (the ladder's top is the table's
    defaults, so a fast machine measures what it always did), a small configured matrix never grows, and
    `resized` names only the knobs that changed. Break: drop the caps and a 1-prompt test config grows to 4."""
    full = BenchConfig()
    assert LADDER[0] == (full.prompt_limit, full.tokens, full.rounds)
    caps = {k: getattr(full, k) for k in BUDGETED}
    plan = plan_matrix(COSTS, 1e9, fixed={}, caps=caps, **SHAPE)
    assert plan["chosen"] == caps and full.budgeted(plan["chosen"]) == full
    small = {"prompt_limit": 1, "tokens": 12, "rounds": 2}
    plan = plan_matrix(COSTS, 1e9, fixed={}, caps=small, **SHAPE)
    assert plan["chosen"] == small
    tight = plan_matrix(COSTS, 1.0, fixed={}, caps=caps, **SHAPE)
    assert all(x[k] <= caps[k] for x in tight["tried"] for k in caps)
    assert full.budgeted(tight["chosen"]).resized == tuple(sorted(k for k in caps if tight["chosen"][k] != caps[k]))


def test_explicit_knobs_are_never_resized():
    given = BenchConfig(calibration_tokens=48, tokens=20, explicit=("calibration_tokens", "tokens"))
    cfg = given.sized_for(354_000_000)
    assert cfg.calibration_tokens == 48 and cfg.rank_rounds == REAL_TARGET_DEFAULTS["rank_rounds"]
    assert "calibration_tokens" not in cfg.resized
    cfg = cfg.budgeted({"prompt_limit": 1, "tokens": 8, "rounds": 1})
    assert cfg.tokens == 20 and cfg.prompt_limit == 1 and cfg.rounds == 1 and "tokens" not in cfg.resized


COSTS = MatrixCosts(t_greedy=0.17, t_spec={3: 0.26, 7: 0.2})  # the random-init 350M's (docs/real-targets.md)
SHAPE = {"rank_rounds": 6, "methods": 14, "widths": [3], "ranking_width": 3, "references": 5}


def test_the_projection_counts_every_leg_of_the_matrix():
    """One method, one width, no references, 2 of 3 prompts (10 tokens of prompt, 5 s of prefill a leg): the greedy
    references (1 greedy leg), normal (2 a round), the case's activity decode and rounds (greedy, dflash, method),
    the ranking rounds up to rank_rounds (dflash, method), then the verify-cost curve. Break: drop the ranking
    rounds' legs, the activity decode or the curve, and the hand count differs (the 350M run's matrix took 703 s
    against 646 s projected without the last two)."""
    c = MatrixCosts(t_greedy=1.0, t_spec={2: 3.0}, t_row=0.5, prompt_lens=(4, 6, 100), t_fixed=7.0)
    got = projected_seconds(c, prompts=2, tokens=5, rounds=2, rank_rounds=6, methods=1, widths=[2], ranking_width=2,
                            references=0)
    greedy_legs, spec_legs = 1 + 2 * 2 + 2, 2 + 2 * 2 + 4 * 2  # the activity decode: two legs
    assert got == pytest.approx(greedy_legs * (10 + 5) + spec_legs * (10 * 3.0 * SLOWEST_METHOD_FACTOR + 5) + 7)


def test_the_ladder_shrinks_the_projection_at_every_step():
    """Largest first means every later size projects less: otherwise 'the first that fits' is not the largest."""
    s = [projected_seconds(COSTS, prompts=p, tokens=t, rounds=r, **SHAPE) for p, t, r in LADDER]
    assert all(a > b for a, b in zip(s, s[1:])), s


COSTS1 = MatrixCosts(t_greedy=0.17, t_spec={1: 0.2})
SHAPE1 = {**SHAPE, "widths": [1], "ranking_width": 1}  # width 1: the decode-length floor (8) is the ladder's least


@pytest.mark.parametrize("k", range(len(LADDER)))
def test_the_plan_takes_the_largest_size_that_fits(k):
    """A budget just over size k's projection chooses size k; one just under it the next smaller size."""
    p, t, r = LADDER[k]
    need = projected_seconds(COSTS1, prompts=p, tokens=t, rounds=r, **SHAPE1)
    plan = plan_matrix(COSTS1, need * 1.0001, fixed={}, **SHAPE1)
    assert plan["fits"] and plan["chosen"] == {"prompt_limit": p, "tokens": t, "rounds": r}
    assert all(x["projected_seconds"] > need * 1.0001 for x in plan["tried"][:-1])
    under = plan_matrix(COSTS1, need * 0.9999, fixed={}, **SHAPE1)
    if k + 1 < len(LADDER):
        assert under["fits"] and under["chosen"] == dict(zip(("prompt_limit", "tokens", "rounds"), LADDER[k + 1]))
    else:  # nothing fits: the smallest size, marked over budget
        assert not under["fits"] and under["chosen"] == {"prompt_limit": p, "tokens": t, "rounds": r}


def test_the_budget_shrinks_prompts_and_rounds_but_never_the_decode_below_full_blocks_of_the_widest_case():
    """A budget too small for anything: every size tried decodes at least FULL_BLOCKS full blocks of the widest case
    (an own-width case included), so the chosen width is measured at a length where it can pay; a decode length the
    user gave is kept as given."""
    floor = tokens_floor([3, 7])
    assert floor == FULL_BLOCKS * 8
    plan = plan_matrix(COSTS, 1.0, fixed={}, **SHAPE, extra_widths=(7,))
    assert not plan["fits"] and {x["tokens"] for x in plan["tried"]} >= {floor} and \
        min(x["tokens"] for x in plan["tried"]) == floor and plan["chosen"]["tokens"] == floor
    assert plan_matrix(COSTS, 1.0, fixed={"tokens": 12}, **SHAPE, extra_widths=(7,))["chosen"]["tokens"] == 12
    more = projected_seconds(COSTS, prompts=2, tokens=32, rounds=2, **SHAPE, extra_widths=(7,))
    assert more > projected_seconds(COSTS, prompts=2, tokens=32, rounds=2, **SHAPE)  # an own-width case is a case


def test_the_plan_keeps_the_users_knobs_and_never_exceeds_the_ranking_rounds():
    plan = plan_matrix(COSTS, 60.0, fixed={"tokens": 40}, **SHAPE)
    assert plan["chosen"]["tokens"] == 40 and all(x["tokens"] == 40 for x in plan["tried"])
    assert all(x["rounds"] <= SHAPE["rank_rounds"] for x in plan["tried"])
    small = plan_matrix(COSTS, 1e9, fixed={}, **{**SHAPE, "rank_rounds": 2})
    assert small["chosen"]["rounds"] == 2


def test_the_plan_is_an_upper_bound_on_a_simulated_matrix():
    """An injected timing model where the truth is known: every method's token costs between 0.77x and 1.3x
    dflash's (the three-model table's spread, evenly), reference rows at their factor, each leg's wall jittered
    +-5 %. The projection must not be exceeded, so a plan that fits the budget ends inside it. Break:
    SLOWEST_METHOD_FACTOR = 1.0 and the simulated matrix overruns."""
    import random

    rng = random.Random(7)
    widths, wr, M, P, T, R, K = [3], 3, 14, 2, 16, 1, 6
    n = P * T
    factors = [0.77 + (1.3 - 0.77) * i / (M - 1) for i in range(M)]  # evenly spread: mean 1.035 x dflash
    greedy, spec = n * COSTS.t_greedy, n * COSTS.t_spec[wr]

    def j() -> float:
        return rng.uniform(0.95, 1.05)

    def pair(f: float) -> float:  # a dflash leg and a method leg
        return spec * j() + spec * f * j()

    for trial in range(50):
        wall = greedy * j() + R * 2 * greedy * j()
        for f in factors:  # each case: its activity decode, its rounds, its ranking rounds
            wall += pair(f) + R * (greedy * j() + pair(f)) + (K - R) * pair(f)
        wall += 5 * R * greedy * (1 + REFERENCE_LEG_FACTOR * j())
        proj = projected_seconds(COSTS, prompts=P, tokens=T, rounds=R, rank_rounds=K, methods=M, widths=widths,
                                 ranking_width=wr, references=5)
        assert wall <= proj, (trial, wall, proj)


def test_explicit_knobs_come_from_the_command_line_and_the_environment(monkeypatch):
    import importlib.util
    from pathlib import Path
    from types import SimpleNamespace

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "conftest.py"
    spec = importlib.util.spec_from_file_location("bench_conftest_under_test", path)
    bench_conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_conftest)
    monkeypatch.setenv("DFLASH_PROMPT_LIMIT", "3")
    monkeypatch.delenv("DFLASH_TOKENS", raising=False)
    config = SimpleNamespace(invocation_params=SimpleNamespace(args=("benchmarks", "--bench-rounds=5",
                                                                     "--bench-tokens", "16")))
    got = bench_conftest.explicit_knobs(config)
    assert {"rounds", "tokens", "prompt_limit"} <= set(got) and "race_max" not in got


@pytest.mark.parametrize("fits", [True, False])
def test_the_report_says_how_a_real_target_was_sized(fits):
    from dflash_core.report.build import build_report
    from dflash_core.report.html import render_report

    from ..support.report_data import bench_row, saved_run

    doc = saved_run([bench_row("normal", 0), bench_row("dflash", 2)])
    plan = plan_matrix(COSTS, 1500.0 if fits else 1.0, fixed={}, **SHAPE)
    doc["dflash"]["settings"]["size_plan"] = plan
    page = render_report(build_report([doc], ["r"]))
    ch = plan["chosen"]
    size = f"{ch['prompt_limit']} prompts × {ch['tokens']} tokens × {ch['rounds']} base rounds"
    assert f"Matrix size: {size}, the {'largest' if fits else 'smallest'} size" in page
    assert ("fits the 25.0 min left" if fits else "over the 0.0 min left") in page
