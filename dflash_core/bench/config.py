"""The benchmark's settings (one frozen dataclass): defaults, environment variables and pytest options all
come from the options table, so the CLI, both conftests and the session agree on every knob."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..options import BENCH_FIELDS, env_value, option


def _default(name: str):
    return option(name).default


@dataclass(frozen=True)
class BenchConfig:
    """The benchmark's settings. Defaults, environment variables and pytest options come from `options.OPTIONS`
    (the defaults are sized so the README main command, prepare included, ends in < 20 min on 2 cores)."""

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
    calibration_widths: tuple[int, ...] = ()  # widths calibrated (each its own choice); (): the block size B
    threads: int = _default("threads")
    seed: int = _default("seed")
    noise_threshold: float = _default("noise_threshold")
    resolution: float = _default("resolution")  # the ranking's resolution (bench.selection.effective_resolution)
    rank_rounds: int = _default("rank_rounds")  # fixed rounds per case at the ranking width (bench.schedule)
    drafter: str | None = _default("drafter")  # a transformers-format drafter instead of the trained one
    calibration_from: str | None = _default("calibration_from")  # reuse a saved run's widths and options (reuse)
    smoke: bool = False
    tune: bool = False
    references: bool = True

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
        from dataclasses import replace

        return replace(self, tokens=8, prompt_limit=1, rounds=1, rank_rounds=min(self.rank_rounds, 4),
                       calibration_tokens=8, calibration_prompt_limit=1,
                       calibration_repeats=1, calibration_widths=tuple(self.calibration_widths))

    def to_dict(self) -> dict:
        return asdict(self)
