"""The benchmark matrix sized to a time budget from the costs measured on calibration prompts.

Why: the mini target's full matrix takes ~9 min on a 2-core AVX-512 box and 21.7 min on an AVX2-only one, and a
real checkpoint's greedy token costs 20-30x the mini target's on 2 cores, and how much of a speculative
token it saves depends on its drafter (tau 1.0 on a random-init 350M, where every method is slower than greedy),
so no fixed size fits a budget: the fixed real-target size projected 1.8 h on the random-init 350M and ~26 min
on SmolLM2-135M (docs/real-targets.md). Calibration runs first on calibration prompts anyway and measures what the
matrix will cost: the target's decode step in the loop (`t_decode`) and dflash's cost-model speedup at every width.
`plan_matrix` projects the matrix at each size of `LADDER`, largest first, and takes the first that fits what is
left of the budget. The statistics do not shrink with it: the ranking keeps its fixed rounds (>= 6, the fewest
whose min-max interval of a median is a 95 % one), so a smaller matrix means fewer and shorter prompts, not weaker
claims about the prompts measured.
"""

from __future__ import annotations

from dataclasses import dataclass

# Sizes tried largest first: (benchmark prompts, tokens per prompt, base rounds per case). The first is the
# options table's defaults (the mini target's full matrix), so a machine where it fits measures what it always did;
# the next steps shrink it by about a sixth each, so a machine just short of it loses little.
LADDER: tuple[tuple[int, int, int], ...] = (
    (4, 96, 3), (4, 80, 3), (4, 64, 3), (3, 64, 3), (2, 64, 3), (2, 48, 3), (2, 48, 2), (2, 32, 2), (2, 24, 2),
    (2, 16, 1), (1, 24, 1), (1, 16, 1), (1, 12, 1), (1, 8, 1))
# A decode long enough for its widest width: at least FULL_BLOCKS rounds that verify a full block (w drafts + the
# committed token each). Why: a decode of 24 tokens ends before a 16-wide block can show what it buys, so a matrix
# shrunk below that would measure the chosen width at a length where it cannot pay; the budget shrinks prompts and
# rounds first and the decode length never below this floor (unless the user set --bench-tokens).
FULL_BLOCKS = 4


def tokens_floor(widths) -> int:
    """The shortest decode the matrix may shrink to for these case widths (FULL_BLOCKS)."""
    return FULL_BLOCKS * (max(widths, default=0) + 1)
# The slowest method's speculative token against dflash's: the slowest rows of the three-model table sat at 0.79
# of dflash (jump_mobs, fused_jump; studies/2026-12-01-three-mini-targets/), so pricing every method's leg at
# dflash's cost x 1.3 keeps the projection an upper bound for them too.
SLOWEST_METHOD_FACTOR = 1.3
# A reference row's leg (transformers' generate, prompt lookup, assisted decoding with an early-exit assistant, the
# oracle) against a greedy leg: assisted decoding with a truncated target runs the assistant and the target.
REFERENCE_LEG_FACTOR = 2.0
# A speculative case's untimed warm-up, its activity decode (cases.activity_decode: the method beside a dflash
# shadow drafting at the same context), priced as two speculative legs: on the random-init 350M every case's first
# item took ~6 s more than its three timed legs (~2 legs' worth).
ACTIVITY_LEGS = 2


@dataclass(frozen=True)
class MatrixCosts:
    """What the matrix's work costs (seconds), as calibration measured it."""

    t_greedy: float  # the target's decode step inside the loop (costmodel.ComponentCosts.t_decode)
    t_spec: dict[int, float]  # width -> dflash's seconds per committed token (t_decode / its cost-model speedup)
    t_row: float = 0.0  # one prompt row of a prefill: a verify forward of B + 1 rows / (B + 1)
    prompt_lens: tuple[int, ...] = ()  # the benchmark prompts' lengths, in order (each leg prefills its prompts)
    t_fixed: float = 0.0  # work of a fixed size: the verify-cost curve (test_verify_cost)


def leg_seconds(costs: MatrixCosts, *, prompts: int, tokens: int, spec_factor: float = 1.0
                ) -> tuple[float, dict[int, float]]:
    """(greedy leg, {width: speculative leg}): the seconds of one leg at this size, from the measured costs and
    dflash's cost-model speedup, the speculative decode priced at `spec_factor` x dflash's (1: the expectation the
    progress line weighs items by; SLOWEST_METHOD_FACTOR: the budget's upper bound). Each leg prefills its prompts."""
    n = prompts * tokens
    prefill = costs.t_row * sum(costs.prompt_lens[:prompts])
    return n * costs.t_greedy + prefill, {w: n * t * spec_factor + prefill for w, t in costs.t_spec.items()}


def projected_seconds(costs: MatrixCosts, *, prompts: int, tokens: int, rounds: int, rank_rounds: int,
                      methods: int, widths: list[int], ranking_width: int, references: int,
                      extra_widths: tuple[int, ...] = ()) -> float:
    """Seconds the matrix (greedy references, cases, base rounds, ranking rounds, reference rows, the verify-cost
    curve) should take.

    Each case round runs greedy, dflash and the method on every prompt (`cases.measure_pair`), after an untimed
    activity decode (`ACTIVITY_LEGS`); each ranking round
    dflash and the method (`schedule.run_ranking`), topping the ranking width's cases up to `rank_rounds`; the
    normal case runs two greedy legs a round; a reference row runs its peer and greedy (`peers.measure_reference`).
    Every leg prefills its prompts (at 1 prompt x 16 tokens on the 350M, ~15 % of a leg). `extra_widths`: one
    entry per case beyond methods x widths (a method at its own width), each run like the others.
    """
    greedy, spec = leg_seconds(costs, prompts=prompts, tokens=tokens, spec_factor=SLOWEST_METHOD_FACTOR)
    total = greedy + rounds * 2 * greedy  # the greedy references, then the normal case
    case = {w: rounds * (greedy + 2 * spec[w]) + ACTIVITY_LEGS * spec[w] for w in spec}
    total += sum(methods * case[w] for w in widths) + sum(case[w] for w in extra_widths)
    total += methods * max(0, rank_rounds - rounds) * 2 * spec[ranking_width]
    total += references * rounds * greedy * (1 + REFERENCE_LEG_FACTOR)
    return total + costs.t_fixed


def plan_matrix(costs: MatrixCosts, budget_s: float, *, fixed: dict, rank_rounds: int, methods: int,
                widths: list[int], ranking_width: int, references: int, caps: dict | None = None,
                extra_widths: tuple[int, ...] = ()) -> dict:
    """The largest size of `LADDER` whose projection fits `budget_s`, with the knobs in `fixed` (the user's:
    prompt_limit, tokens, rounds) kept as given and the others never above `caps` (the configured values: the
    budget only shrinks a matrix, so a small configured one stays as it is); when none fits, the smallest, marked
    `fits: False`. Returns the chosen knobs and the projection of every size tried (recorded in the report's
    settings). The decode length never shrinks below `tokens_floor` of the case widths (nor above its cap)."""
    tried = []
    seen = set()
    caps = caps or {}
    floor = tokens_floor([*widths, *extra_widths])

    def pick(name: str, step: int) -> int:
        return fixed[name] if name in fixed else min(step, caps.get(name, step))

    for p, t, r in LADDER:
        size = {"prompt_limit": pick("prompt_limit", p), "tokens": pick("tokens", max(t, floor)),
                "rounds": pick("rounds", min(r, rank_rounds))}
        key = tuple(size.values())
        if key in seen:
            continue
        seen.add(key)
        s = projected_seconds(costs, prompts=size["prompt_limit"], tokens=size["tokens"], rounds=size["rounds"],
                              rank_rounds=rank_rounds, methods=methods, widths=widths, ranking_width=ranking_width,
                              references=references, extra_widths=tuple(extra_widths))
        tried.append({**size, "projected_seconds": round(s, 1)})
        if s <= budget_s:
            return {"chosen": size, "fits": True, "budget_seconds": round(budget_s, 1), "tried": tried}
    return {"chosen": {k: tried[-1][k] for k in ("prompt_limit", "tokens", "rounds")}, "fits": False,
            "budget_seconds": round(budget_s, 1), "tried": tried}
