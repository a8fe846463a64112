"""The benchmark's settings (one frozen dataclass): defaults, environment variables and pytest options all
come from the options table, so the CLI, both conftests and the session agree on every knob."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from ..errors import BadInputError
from ..options import BENCH_FIELDS, env_value, option

# A target over REAL_TARGET_PARAMETERS parameters (a real checkpoint: SmolLM2-135M, LFM2.5-350M) costs 60-170 ms
# per greedy token on 2 cores against the mini target's ~8 ms, so the mini's default matrix (4 prompts x 96 tokens,
# two widths, 16 ranking rounds) would take hours. With `--bench-size auto` (the default) every knob below that the
# user did not set (option or environment) takes these values: calibration on 2 prompts x 192 tokens replayed by the
# width model (its verify curve on 16-token decodes), one `auto` width (the cost model's best), 6 ranking rounds;
# the matrix's prompts, tokens and base rounds are then chosen from the costs calibration measured to fit
# `--bench-budget` (bench.budget). `--bench-size full` keeps the table's defaults;
# `--bench-widths 1,2,4,8 --bench-prompts 6 --bench-tokens 64` is the full matrix.
REAL_TARGET_PARAMETERS = 100_000_000
# The baseline of every paired comparison between methods: each speculative round also times it at the same
# width seconds before the method (bench.rounds), activity compares every method's drafts with its drafts
# (bench.activity), and the ranking ranks ratios against it (report.ranking).
BASELINE = "dflash"
# rank_rounds 6: the fewest rounds whose min-max interval of a median is a 95 % one (stats/summary.MIN_LABELLED_N)
REAL_TARGET_DEFAULTS = {"calibration_tokens": 192, "calibration_prompt_limit": 8, "rank_rounds": 6, "width_count": 1,
                        "curve_tokens": 16}
# What bench.budget.plan_matrix chooses under `--bench-size auto` (each unless the user set it; never above the
# value it had: the budget only shrinks the matrix).
BUDGETED = ("prompt_limit", "tokens", "rounds")
# `--bench-budget auto` in minutes. The mini target's: the main command's setup (~2 min), bundle import and report
# leave ~17 of 20 minutes, and its benchmark phase took 21.7 min at the full size on an AVX2-only CPU; on a CPU where
# the full matrix fits (~9 min on the AVX-512 Intel box) the budget changes nothing. A real target's: its
# calibration alone takes 5-10 min on 2 cores.
MINI_BENCH_BUDGET = 15.0
REAL_BENCH_BUDGET = 25.0


def check_widths_fit(widths, block: int, source: str, fix: str = "") -> None:
    """The one check of the verify widths against the drafter: each at most its block size B. The options table
    checked the rest when the knob was read (integers >= 1, `options._widths`); B is known only once a drafter is
    (the CLI reads it from the manifest before pytest starts, a reused run's widths are checked on apply)."""
    over = sorted(w for w in widths if w > block)
    if over:
        raise BadInputError(f"{source}: width {','.join(map(str, over))} {'exceeds' if len(over) == 1 else 'exceed'} "
                            f"this drafter's block size B={block}: {fix or f'give widths in 1..{block}'}")


def budget_minutes(value: float | str, parameters: int | None) -> float:
    """`--bench-budget` in minutes: a number as given; 'auto' by the target's size (MINI_BENCH_BUDGET up to
    REAL_TARGET_PARAMETERS parameters, REAL_BENCH_BUDGET above)."""
    if value != "auto":
        return float(value)
    return REAL_BENCH_BUDGET if parameters and parameters > REAL_TARGET_PARAMETERS else MINI_BENCH_BUDGET


def _default(name: str):
    return option(name).default


@dataclass(frozen=True)
class BenchConfig:
    """The benchmark's settings. Defaults, environment variables and pytest options come from `options.OPTIONS`
    (the defaults are the full matrix; under `--bench-size auto` the budget shrinks it on a slow machine, so the README
    main command ends in < 20 min on 2 cores)."""

    target: str = _default("target")
    device: str = _default("device")
    dtype: str = _default("dtype")
    kernels: str = _default("kernels")  # linear-layer path for target and drafter alike (dflash_core.runtime.kernels)
    tokens: int = _default("tokens")
    prompt_limit: int = _default("prompt_limit")
    rounds: int = _default("rounds")
    calibration_tokens: int = _default("calibration_tokens")
    calibration_prompt_limit: int = _default("calibration_prompt_limit")
    calibration_repeats: int = 1  # decodes per (setting, prompt): the cost-model objective needs one
    curve_tokens: int = 24  # tokens of each real dflash decode per width that times the in-loop verify curve
    calibration_widths: tuple[int, ...] = ()  # widths calibrated (each its own choice); (): the block size B
    threads: int = _default("threads")
    seed: int = _default("seed")
    noise_threshold: float = _default("noise_threshold")
    resolution: float = _default("resolution")  # the ranking's resolution (stats.selection.effective_resolution)
    rank_rounds: int = _default("rank_rounds")  # fixed rounds per case at the ranking width (bench.schedule)
    drafter: str | None = _default("drafter")  # a transformers-format drafter instead of the trained one
    calibration_from: str | None = _default("calibration_from")  # reuse a saved run's widths and options (reuse)
    prompts_file: str | None = _default("prompts_file")  # the user's benchmark prompts (store.prompt_file)
    bench_size: str = _default("bench_size")  # auto: real-target defaults for a large target (`sized_for`)
    bench_budget: float | str = _default("bench_budget")  # minutes the auto-sized benchmark should take, or 'auto'
    width_count: int = 2  # how many widths `--bench-widths auto` chooses (calibration.auto_widths)
    explicit: tuple[str, ...] = ()  # fields the user set (option or environment): never resized
    resized: tuple[str, ...] = ()  # fields `sized_for` replaced (recorded in the report's settings)
    smoke: bool = False
    tune: bool = False
    peer_rows: bool = True  # the reference rows (peers, oracle, verify-cost curve); --no-references skips them

    @classmethod
    def from_env(cls, **explicit: Any) -> "BenchConfig":
        """Every table-backed field from its environment variable (or default); `explicit` values win."""
        kw = {name: env_value(name) for name in BENCH_FIELDS}
        kw.update({k: v for k, v in explicit.items() if v is not None})
        return cls(**kw)

    def sized(self) -> "BenchConfig":
        """--smoke: 1 prompt, 8 tokens, 1 round, 4 ranking rounds (and the smallest calibration)."""
        if not self.smoke:
            return self
        return replace(self, tokens=8, prompt_limit=1, rounds=1, rank_rounds=min(self.rank_rounds, 4),
                       calibration_tokens=8, calibration_prompt_limit=1, curve_tokens=8,
                       calibration_repeats=1, calibration_widths=tuple(self.calibration_widths))

    def sized_for(self, parameters: int | None) -> "BenchConfig":
        """`--bench-budget auto` resolved for this target (`budget_minutes`), and the real-target defaults
        (REAL_TARGET_DEFAULTS) for every knob not set explicitly when the target has more than
        REAL_TARGET_PARAMETERS parameters and the size is `auto` (not under --smoke); `budgeted` then sizes the
        matrix."""
        cfg = replace(self, bench_budget=budget_minutes(self.bench_budget, parameters))
        if self.bench_size != "auto" or self.smoke or not parameters or parameters <= REAL_TARGET_PARAMETERS:
            return cfg
        over = {k: v for k, v in REAL_TARGET_DEFAULTS.items() if k not in self.explicit}
        return replace(cfg, **over, resized=tuple(sorted(over)))

    @property
    def budgeted_size(self) -> bool:
        """Whether the matrix is sized to `bench_budget`: under `--bench-size auto`, not --smoke, and some matrix
        knob (BUDGETED) left to choose."""
        return self.bench_size == "auto" and not self.smoke and any(k not in self.explicit for k in BUDGETED)

    def budgeted(self, chosen: dict) -> "BenchConfig":
        """`chosen` (bench.budget.plan_matrix) for every matrix knob the user did not set; `resized` records the
        ones that changed."""
        over = {k: v for k, v in chosen.items() if k in BUDGETED and k not in self.explicit and getattr(self, k) != v}
        return replace(self, **over, resized=tuple(sorted({*self.resized, *over})))

    def to_dict(self) -> dict:
        return asdict(self)
