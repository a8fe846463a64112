"""The one table of run options and environment knobs.

The CLI (`python -m dflash_core`), the root conftest (pytest options), benchmarks/conftest.py and
`bench.BenchConfig` all read their names, environment variables, defaults and checks from `OPTIONS`, and a
test checks the README's knob table against it. Precedence everywhere: an explicit option, else the
environment variable, else the default. Importing this module is cheap (no torch): conftest files use it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import BadInputError

DTYPE_CHOICES = ("auto", "float32", "float64", "float16", "bfloat16")
KERNEL_CHOICES = ("auto", "eager", "onednn")
HYPOTHESIS_PROFILES = ("dev", "ci", "thorough")
BENCH_SIZES = ("auto", "full")


def _widths(text: str) -> str:
    """`auto` (chosen from the measured verify-cost curve once the drafter is loaded: bench.auto_widths) or
    comma-separated verify widths, each >= 1 (the upper bound B is checked once the drafter is loaded)."""
    if str(text).strip().lower() == "auto":
        return "auto"
    try:
        ws = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError as exc:
        raise ValueError(f"must be comma-separated integers: {exc}") from exc
    if not ws or min(ws) < 1:
        raise ValueError("every width must be an integer >= 1")
    return ",".join(str(w) for w in sorted(set(ws)))


def _fraction(text: str) -> float:
    """A fraction in [0, 1) (0.05 = 5 %)."""
    value = float(text)
    if not 0.0 <= value < 1.0:
        raise ValueError("must be a fraction >= 0 and < 1 (0.05 means 5 %)")
    return value


def _minutes(text: str) -> float:
    """A number of minutes > 0."""
    value = float(text)
    if not value > 0 or value != value or value == float("inf"):
        raise ValueError("must be a number of minutes > 0")
    return value


def _flag(text: str) -> bool:
    return str(text).strip().lower() in ("1", "true", "yes")


@dataclass(frozen=True)
class Option:
    """One knob. `cli` is the `python -m dflash_core` flag, `pytest` the pytest option (None: not there)."""

    name: str  # attribute / BenchConfig field name
    env: str | None
    default: Any
    help: str
    type: Callable[[str], Any] = str
    choices: tuple[str, ...] | None = None
    minimum: int | None = None
    cli: str | None = None
    pytest: str | None = None
    default_text: str | None = None  # how the README states the default (when `default` is None or terse)

    def parse(self, raw: Any, source: str) -> Any:
        """Convert and check one value; `source` names where it came from (a flag or a variable) for the error."""
        if raw is None:
            return None
        try:
            value = self.type(raw) if isinstance(raw, str) else raw
        except (TypeError, ValueError) as exc:
            kind = getattr(self.type, "__name__", "value").lstrip("_")
            raise BadInputError(f"{source}={raw!r} is not a valid {kind} ({exc})") from exc
        if self.choices is not None and value not in self.choices:
            raise BadInputError(f"{source}={raw!r} is not one of {', '.join(self.choices)}")
        if self.minimum is not None and value < self.minimum:
            raise BadInputError(f"{source}={raw!r} must be an integer >= {self.minimum}")
        return value

    def from_env(self, environ: Mapping[str, str] | None = None) -> Any:
        """The environment's value (checked), or the default when the variable is unset or empty."""
        env = os.environ if environ is None else environ
        raw = env.get(self.env, "") if self.env else ""
        if not str(raw).strip():
            return self.default
        return self.parse(raw, self.env)

    def argparse_type(self) -> Callable[[str], Any]:
        """A converter for argparse: a bad value becomes argparse's usage error (exit 2) naming the flag."""
        import argparse

        def convert(text: str) -> Any:
            try:
                return self.parse(text, self.cli or self.pytest or self.name)
            except BadInputError as exc:
                raise argparse.ArgumentTypeError(str(exc)) from exc

        convert.__name__ = self.name
        return convert


OPTIONS: tuple[Option, ...] = (
    # The run: target, device, dtype, kernels (CLI run/prepare/bench and every pytest run).
    Option("target", "DFLASH_TARGET", "mini", "target: 'mini' (embedded default), a local checkpoint directory, "
           "or a hub id (e.g. LiquidAI/LFM2.5-350M-Base)", cli="--target", pytest="--target"),
    Option("revision", "DFLASH_REVISION", None, "hub revision (branch, tag or commit) of a hub-id target",
           cli="--revision", default_text="the hub's default branch"),
    Option("device", "DFLASH_DEVICE", "cpu", "device: cpu, cuda or cuda:N (no silent CPU fallback)",
           cli="--device", pytest="--device"),
    Option("dtype", "DFLASH_DTYPE", "auto", "target dtype: auto (float32 on CPU, DFLASH_GPU_DTYPE on CUDA), "
           "float32, float64, float16 (CUDA only), bfloat16", choices=DTYPE_CHOICES, cli="--dtype", pytest="--dtype"),
    Option("gpu_dtype", "DFLASH_GPU_DTYPE", "float16", "what dtype auto means on CUDA",
           choices=DTYPE_CHOICES[1:]),
    Option("kernels", "DFLASH_KERNELS", "auto", "linear-layer path: auto (oneDNN-prepacked for CPU float32 targets "
           "with hidden >= 1024, eager otherwise), eager, onednn (CPU float32 only)", choices=KERNEL_CHOICES,
           cli="--kernels", pytest="--kernels"),
    Option("drafter", "DFLASH_DRAFTER", None, "a transformers-format DFlash drafter (directory or hub id) used "
           "instead of training one; prepare fits every method's artifacts on it", cli="--drafter",
           pytest="--drafter", default_text="none: prepare trains one"),
    Option("train_data", "DFLASH_TRAIN_DATA", None, "training text prepare cuts the train seeds from: a UTF-8 text "
           "file, a folder of them, a JSONL file with a text field per line, a datasets save_to_disk folder, or a "
           "datasets hub id from its local cache", cli="--train-data",
           default_text="the prompt family's shipped corpus"),
    Option("train_budget", "DFLASH_TRAIN_BUDGET", None, "minutes of drafter training before prepare stops it (the "
           "best held-out state is kept; the step count still caps it)", type=_minutes, cli="--train-budget",
           default_text="none: the step count decides"),
    Option("home", "DFLASH_HOME", None, "artifact cache: the mini target, the drafter and the method fits",
           cli="--home", default_text="~/.cache/dflash-mini-lab"),
    Option("threads", "DFLASH_THREADS", 2, "torch CPU threads", type=int, minimum=1, cli="--threads",
           pytest="--bench-threads"),
    # The benchmark matrix (benchmarks/conftest.py, BenchConfig).
    Option("tokens", "DFLASH_TOKENS", 48, "benchmark tokens per prompt", type=int, minimum=0,
           pytest="--bench-tokens"),
    Option("rounds", "DFLASH_REPEATS", 3, "timed paired rounds per case", type=int, minimum=1,
           pytest="--bench-rounds"),
    Option("prompt_limit", "DFLASH_PROMPT_LIMIT", 4, "held-out benchmark prompts", type=int, minimum=1,
           pytest="--bench-prompts"),
    Option("calibration_tokens", "DFLASH_CALIBRATION_TOKENS", 24, "tokens per calibration prompt", type=int,
           minimum=1, pytest="--calibration-tokens"),
    Option("calibration_prompt_limit", "DFLASH_CALIBRATION_PROMPT_LIMIT", 3, "calibration prompts", type=int,
           minimum=1, pytest="--calibration-prompts"),
    Option("widths", "DFLASH_WIDTHS", "auto", "verify widths to time (each <= the drafter's block size B), or "
           "auto: dflash's best width by the cost model over the measured verify-cost curve on calibration prompts, "
           "and the best at most half of it; 1,2,4,8 for a full matrix", type=_widths, pytest="--bench-widths"),
    Option("seed", "DFLASH_BENCH_SEED", 0, "seed of the benchmark's case-order rotation", type=int, minimum=0,
           pytest="--bench-seed"),
    Option("noise_threshold", "DFLASH_NOISE_THRESHOLD", 0.05, "A/A noise gate: when normal-vs-normal paired rounds "
           "differ from 1 by more than this fraction, bench warns and the report shows a noise banner",
           type=_fraction, pytest="--bench-noise-threshold"),
    # 2 %: on the lab's 2-core CPU a case's median against dflash moved by up to 1.0 % between two quiet runs at
    # 12-15 rounds (docs/performance.md §12), and the leader's group is raced to 24, so a smaller gap to the leader
    # is not reproducible; pyperf's --min-speed and criterion's noise_threshold are the same idea. 3 % (session 7)
    # sat on the true gap between the leaders and bmobs (~3 %), so that method's group was a coin flip.
    Option("resolution", "DFLASH_RESOLUTION", 0.02, "rank groups: methods whose median is less than this fraction "
           "below the leader's share its group even when their intervals separate them (differences the lab does "
           "not claim to reproduce; 0: intervals alone)", type=_fraction, pytest="--bench-resolution"),
    Option("race_max", "DFLASH_RACE_MAX", 8, "racing cap: at the ranking width, methods in the leader's rank group "
           "get extra rounds against dflash, up to this many times --bench-rounds in total and at most half the base "
           "matrix's own time (1: no racing)", type=int, minimum=1, pytest="--bench-race-max"),
    Option("bench_size", "DFLASH_BENCH_SIZE", "auto", "benchmark size: auto (a target over 100M parameters gets "
           "the real-target defaults, bench.config.REAL_TARGET_DEFAULTS, for every knob not set explicitly: 2 prompts "
           "x 32 tokens, 2 calibration prompts x 16 tokens, race cap 4) or full (the defaults of this table)",
           choices=BENCH_SIZES, pytest="--bench-size"),
    # Environment only.
    Option("reports", "DFLASH_REPORTS", None, "where the report plugin writes <device>/index.html, report.html "
           "and benchmark.json", default_text="reports/ in the repository root"),
    Option("require_gpu", "DFLASH_REQUIRE_GPU", False, "1: a GPU test that would skip without CUDA fails instead",
           type=_flag, default_text="0"),
    Option("hypothesis_profile", "DFLASH_HYPOTHESIS_PROFILE", "dev", "Hypothesis profile (ci is loaded whenever "
           "CI is set)", choices=HYPOTHESIS_PROFILES),
)

BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}
# BenchConfig fields whose value comes from this table (env, then the pytest option).
BENCH_FIELDS = ("target", "device", "dtype", "kernels", "threads", "tokens", "rounds", "prompt_limit",
                "calibration_tokens", "calibration_prompt_limit", "seed", "noise_threshold", "resolution", "race_max",
                "drafter", "bench_size")


def option(name: str) -> Option:
    return BY_NAME[name]


def env_value(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The value of one knob from the environment, or its default."""
    return BY_NAME[name].from_env(environ)


def add_cli_option(parser, name: str, **overrides: Any) -> None:
    """Declare `name` on an argparse parser with default None, so `resolve` can tell explicit from unset."""
    o = BY_NAME[name]
    shown = o.default_text or o.default
    env = f"; env {o.env}" if o.env else ""
    parser.add_argument(o.cli, dest=o.name, default=None, type=o.argparse_type(),
                        help=overrides.pop("help", f"{o.help} (default {shown}{env})"), **overrides)


def add_pytest_option(group, name: str) -> None:
    """Declare `name` as a pytest option; its default is the environment's value (read once, here)."""
    o = BY_NAME[name]
    group.addoption(o.pytest, default=o.from_env(), type=o.argparse_type(),
                    help=f"{o.help} (env {o.env}, default {o.default_text or o.default})")


def resolve(ns, names: tuple[str, ...] | list[str]) -> list[str]:
    """Fill each unset (None) attribute of an argparse namespace from the environment or the default.

    Returns the names the user set explicitly on the command line (what `bench` forwards to pytest).
    """
    explicit = []
    for name in names:
        if getattr(ns, name, None) is not None:
            explicit.append(name)
        else:
            setattr(ns, name, BY_NAME[name].from_env())
    return explicit
