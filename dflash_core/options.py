"""The one table of run options and environment knobs.

The CLI (`python -m dflash_core`), the root conftest (pytest options), benchmarks/conftest.py and
`bench.BenchConfig` all read their names, environment variables, defaults and checks from `OPTIONS`, and a
test checks the README's knob table against it. Precedence everywhere: an explicit option, else the
environment variable, else the default. Importing this module is cheap (no torch): conftest files use it.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import BadInputError
from .savedruns import read_source, resolve_source

DTYPE_CHOICES = ("auto", "float32", "float64", "float16", "bfloat16")
KERNEL_CHOICES = ("auto", "eager", "onednn", "tuned")
TEACHER_DTYPE_CHOICES = ("auto", "float32", "bfloat16")  # prepare's teacher passes (pipeline.resolve_auto_teacher)
HYPOTHESIS_PROFILES = ("dev", "ci", "thorough", "device")
MAX_THREADS = 256
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


def _saved_run(text: str) -> str:
    """A saved run or benchmark.json whose widths and calibrated options a run reuses (`savedruns`): a path, or a
    run id / glob under .benchmarks. Read and checked here (bounded size, shapes, types), so a bad file fails before
    anything is built; returns the file's absolute path."""
    path = resolve_source(str(text).strip())
    read_source(path)
    return str(path.resolve())


def _file_path(text: str) -> str:
    """A path, made absolute (the file itself is read and checked by its reader, `store.prompt_file`, before
    anything is built)."""
    if not str(text).strip():
        raise ValueError("must name a file")
    return os.path.abspath(os.path.expanduser(str(text).strip()))


MAX_MINUTES = 7 * 24 * 60  # a week: 1e308 passed as finite and overflowed to infinity in the time arithmetic


def _minutes(text: str) -> float:
    """A number of minutes in (0, MAX_MINUTES]."""
    value = float(text)
    if not 0 < value <= MAX_MINUTES:  # NaN fails both comparisons
        raise ValueError(f"must be a number of minutes > 0 and <= {MAX_MINUTES} (a week)")
    return value


def _budget(text: str) -> str | float:
    """'auto' (the target's size decides: bench.config.budget_minutes) or a number of minutes > 0."""
    if str(text).strip() == "auto":
        return "auto"
    return _minutes(text)


def _train_budget(text: str) -> str | float:
    """'off' (the step count alone decides) or a number of minutes > 0."""
    if str(text).strip() == "off":
        return "off"
    return _minutes(text)


def _prepare_budget(text: str) -> str | float:
    """'auto' (30 minutes for a real target, none for the mini), 'off' or a number of minutes > 0."""
    if str(text).strip() in ("auto", "off"):
        return str(text).strip()
    return _minutes(text)


FLAG_WORDS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


def _flag(text: str) -> bool:
    """1/true/yes or 0/false/no (any case). Anything else is refused: `DFLASH_REQUIRE_GPU=ture` read as false
    turned a GPU runner's required failures back into skips."""
    word = str(text).strip().lower()
    if word not in FLAG_WORDS:
        raise ValueError("give 1/true/yes or 0/false/no")
    return FLAG_WORDS[word]


# 1,000,000 seeds x 64 tokens is 64 M teacher tokens, far past what any machine this lab targets generates in a
# day; the bound keeps a typo from allocating a seed list of billions.
MAX_TRAIN_SEEDS = 1_000_000
# Every seeded generator the build uses (torch, numpy, random) takes 0..2**32-1; 2**64 overflowed torch's after
# ~30 s of work and left an empty targets/mini-seed-N behind.
MAX_SEED = 2**32 - 1


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
    maximum: int | None = None
    cli: str | None = None
    pytest: str | None = None
    default_text: str | None = None  # how the README states the default (when `default` is None or terse)
    commands: tuple[str, ...] = ()  # the `python -m dflash_core` subcommands that take `cli`
    pytest_scope: str = "bench"  # whose conftest declares `pytest`: "root" (every pytest run) or "bench"
    bench: bool = False  # a `bench.config.BenchConfig` field read from this table

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
            raise BadInputError(f"{source}={raw!r} must be an integer >= {self.minimum}"
                                + (f" and <= {self.maximum}" if self.maximum is not None else ""))
        if self.maximum is not None and value > self.maximum:
            raise BadInputError(f"{source}={raw!r} must be an integer <= {self.maximum} (and >= {self.minimum})")
        return value

    def check(self, value: Any) -> Any:
        """A value given through the Python API (`prepare(threads=...)`), checked by the same rule as the flag, so
        the two cannot drift apart: an integer knob takes an int only (True, 2.5 and "100" are refused), any other
        knob the value as its text would parse."""
        if value is None:
            return None
        source = self.cli or self.name
        if self.type is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise BadInputError(f"{source}={str(value)[:40]!r} must be an integer"
                                + (f" >= {self.minimum}" if self.minimum is not None else "")
                                + (f" and <= {self.maximum}" if self.maximum is not None else ""))
        return self.parse(value if isinstance(value, str) else str(value), source)

    def from_env(self, environ: Mapping[str, str] | None = None) -> Any:
        """The environment's value (checked), or the default when the variable is unset or empty."""
        env = os.environ if environ is None else environ
        raw = env.get(self.env, "") if self.env else ""
        if not str(raw).strip():
            return self.default
        return self.parse(raw, self.env)

    def argparse_type(self) -> Callable[[str], Any]:
        """A converter for argparse: a bad value becomes argparse's usage error (exit 2) naming the flag."""
        def convert(text: str) -> Any:
            try:
                return self.parse(text, self.cli or self.pytest or self.name)
            except BadInputError as exc:
                raise argparse.ArgumentTypeError(str(exc)) from exc

        convert.__name__ = self.name
        return convert


RUNS = ("run", "prepare")  # the subcommands that load a target and may prepare it

OPTIONS: tuple[Option, ...] = (
    # The run: target, device, dtype, kernels (CLI run/prepare/bench and every pytest run).
    Option("target", "DFLASH_TARGET", "mini", "target: 'mini' (embedded default), a local checkpoint directory, "
           "or a hub id (e.g. LiquidAI/LFM2.5-350M-Base)", cli="--target", pytest="--target",
           commands=RUNS + ("bench", "export", "export-drafter"), pytest_scope="root", bench=True),
    Option("revision", "DFLASH_REVISION", None, "hub revision (branch, tag or commit) of a hub-id target",
           cli="--revision", default_text="the hub's default branch", commands=RUNS + ("bench", "export-drafter")),
    Option("device", "DFLASH_DEVICE", "cpu", "device: cpu, cuda or cuda:N (no silent CPU fallback)",
           cli="--device", pytest="--device", commands=("run", "bench", "prepare"), pytest_scope="root", bench=True),
    Option("dtype", "DFLASH_DTYPE", "auto", "target dtype: auto (float32 on CPU, DFLASH_GPU_DTYPE on CUDA), "
           "float32, float64, float16 (CUDA only), bfloat16", choices=DTYPE_CHOICES, cli="--dtype", pytest="--dtype",
           commands=("run", "bench"), pytest_scope="root", bench=True),
    Option("gpu_dtype", "DFLASH_GPU_DTYPE", "float16", "what dtype auto means on CUDA",
           choices=DTYPE_CHOICES[1:]),
    Option("kernels", "DFLASH_KERNELS", "auto", "linear-layer path: auto (tuned for CPU float32 targets with hidden "
           ">= 512, eager otherwise), eager, onednn (prepacked), tuned (per row count the weight layout a probe at "
           "load measured fastest; CPU float32 only)", choices=KERNEL_CHOICES,
           cli="--kernels", pytest="--kernels", commands=("run", "bench"), pytest_scope="root", bench=True),
    Option("drafter", "DFLASH_DRAFTER", None, "a transformers-format DFlash drafter (directory or hub id) used "
           "instead of training one; prepare fits every method's artifacts on it", cli="--drafter",
           pytest="--drafter", default_text="none: prepare trains one", commands=RUNS + ("bench",), bench=True),
    # Several independent mini targets (another training seed each) test whether a ranking holds beyond one model.
    Option("mini_seed", "DFLASH_MINI_SEED", None, "training seed of the embedded mini target: another seed builds "
           "another, independent mini target (its own folder targets/mini-seed-N in the home, its own weights and "
           "artifact key); recorded in the target's metadata and benchmark.json", type=int, minimum=0,
           maximum=MAX_SEED, cli="--mini-seed",
           default_text="none: the standard mini target (training seed 1234, targets/mini)",
           commands=RUNS + ("bench", "export")),
    # The standard mini target is the shipped reference bundle (reference/); this builds it on this machine instead.
    Option("rebuild_mini", "DFLASH_REBUILD_MINI", False, "build the standard mini target on this machine (its own "
           "weights: they depend on the CPU's kernels) instead of importing the shipped reference bundle "
           "(reference/mini.dflash-bundle.tar.gz) into a home that has none; also rebuilds a present one",
           type=_flag, cli="--rebuild-mini", default_text="0: import the reference bundle",
           commands=("prepare", "bench")),
    Option("train_data", "DFLASH_TRAIN_DATA", None, "training text prepare cuts the train seeds from: a UTF-8 text "
           "file, a folder of them, a JSONL file with a text field per line, a datasets save_to_disk folder, or a "
           "datasets hub id from its local cache", cli="--train-data",
           default_text="the prompt family's shipped corpus", commands=("prepare",)),
    Option("train_budget", "DFLASH_TRAIN_BUDGET", None, "minutes of drafter training before prepare stops it (the "
           "best held-out state is kept; the step count still caps it), or 'off': the step count alone decides",
           type=_train_budget, cli="--train-budget",
           default_text="15 at a vocabulary >= 16,384 (a real target), none for the mini target",
           commands=("prepare",)),
    Option("prepare_budget", "DFLASH_PREPARE_BUDGET", None, "minutes the whole prepare may take: drafter training "
           "gets what the teacher, the fits (projected before training) and a safety share of 1/20 leave, never less "
           "than 2 minutes; 'off': no budget (the training budget and the step count alone decide)",
           type=_prepare_budget, cli="--prepare-budget",
           default_text="auto: 30 at a vocabulary >= 16,384 (a real target), none for the mini target or with "
           "--train-budget off", commands=("prepare",)),
    # The teacher data's size: on 2 cores the default is what a 30-minute prepare affords; with more cores or a GPU,
    # more seeds are the lever the drafter needs (studies/2026-12-05-data-scaling/).
    Option("train_seeds", "DFLASH_TRAIN_SEEDS", None, "train seeds prepare cuts from the training text, each "
           "continued by the target for 64 greedy tokens: the drafter's teacher data (teacher time grows in "
           "proportion; a text with fewer usable starts gives what it has, recorded in the manifest)", type=int,
           minimum=1, maximum=MAX_TRAIN_SEEDS, cli="--train-seeds",
           default_text="2,368 (the shipped English corpus offers 4,000)", commands=("prepare",)),
    # bf16 teacher passes: 2.1-2.3x float32's speed at the 350M shape on AMX and AVX512-BF16 CPUs, 1.2x on SmolLM2;
    # their greedy labels leave float32 greedy at near-ties, at no measured cost in acceptance (docs/real-targets.md,
    # "A bf16 teacher"), so 'auto' takes them where they are native.
    Option("teacher_dtype", "DFLASH_TEACHER_DTYPE", None, "the matmul dtype of prepare's teacher passes (the target's "
           "greedy trajectories and teacher-forced text the drafter trains on): auto, float32, or bfloat16 where the "
           "CPU computes bf16 natively (refused where torch would emulate it); the decode under test stays float32",
           choices=TEACHER_DTYPE_CHOICES, cli="--teacher-dtype",
           default_text="auto: bfloat16 at a vocabulary >= 16,384 (a real target) where bf16 is native, else float32",
           commands=("prepare",)),
    Option("home", "DFLASH_HOME", "~/.cache/dflash-mini-lab", "artifact cache: the mini target, the drafter and the "
           "method fits", cli="--home", commands=RUNS + ("bench", "export", "import", "export-drafter")),
    # 256: far above any CPU the lab runs on; torch creates the threads it is asked for (1,000,000 hung the run).
    Option("threads", "DFLASH_THREADS", 2, "torch CPU threads", type=int, minimum=1, maximum=MAX_THREADS,
           cli="--threads", pytest="--bench-threads", commands=RUNS, bench=True),
    # The benchmark matrix (benchmarks/conftest.py, BenchConfig).
    Option("tokens", "DFLASH_TOKENS", 96, "benchmark tokens per prompt", type=int, minimum=0,
           pytest="--bench-tokens", bench=True),
    Option("rounds", "DFLASH_REPEATS", 3, "timed paired rounds per case", type=int, minimum=1,
           pytest="--bench-rounds", bench=True),
    Option("prompt_limit", "DFLASH_PROMPT_LIMIT", 4, "held-out benchmark prompts", type=int, minimum=1,
           pytest="--bench-prompts", bench=True),
    Option("prompts_file", "DFLASH_PROMPTS_FILE", None, "benchmark prompts of your own instead of the prompt "
           "family's: a text file (one prompt per line) or .jsonl ({\"text\": ..., \"task\": ...} per line; the "
           "report breaks tau and speedup down by task), checked as held out from the drafter's training text",
           type=_file_path, cli="--prompts-file", pytest="--bench-prompts-file",
           default_text="the family's shipped benchmark prompts (task-tagged)", commands=("bench",), bench=True),
    Option("calibration_tokens", "DFLASH_CALIBRATION_TOKENS", 512, "the longest greedy decode of each "
           "calibration prompt that the width model replays: each is decoded from its start for --bench-tokens "
           "tokens, at most this many", type=int, minimum=1, pytest="--calibration-tokens", bench=True),
    Option("calibration_prompt_limit", "DFLASH_CALIBRATION_PROMPT_LIMIT", 16, "calibration prompts (the width "
           "model replays one decode of each)", type=int, minimum=1, pytest="--calibration-prompts", bench=True),
    Option("widths", "DFLASH_WIDTHS", "auto", "verify widths to time (each <= the drafter's block size B), or "
           "auto: dflash's best width by the cost model over the measured verify-cost curve on the width model's "
           "replayed calibration decodes, and the best at most half of it (each method is also measured at its own "
           "width); 1,2,4,8 for a full matrix", type=_widths, pytest="--bench-widths"),
    Option("calibration_from", "DFLASH_CALIBRATION_FROM", None, "reuse the verify widths and calibrated options of "
           "a saved run or benchmark.json (a path, or a run id such as 0001 under .benchmarks) instead of choosing "
           "them, so two runs measure the same cases (the gate and pooling refuse runs that chose differently)",
           type=_saved_run, cli="--calibration-from", pytest="--calibration-from",
           default_text="none: choose them on calibration prompts", commands=("bench",), bench=True),
    Option("seed", "DFLASH_BENCH_SEED", 0, "seed of the benchmark's case-order rotation", type=int, minimum=0,
           pytest="--bench-seed", bench=True),
    # 3 %: the pooled robust SD of the ranking's per-round log ratios (stats/summary.robust_noise) stayed below 1.6 % in
    # simulated quiet runs (1 % noise) and above 6.3 % in loaded ones (10 %); real runs: 1.1-1.4 % quiet, 9.5 % loaded.
    Option("noise_threshold", "DFLASH_NOISE_THRESHOLD", 0.03, "noise flag: when the run's noise figure (the pooled "
           "robust SD of the ranking rounds' log ratios against dflash) exceeds this fraction, bench warns and the "
           "pages show a banner (the noise already widens the ranking's resolution; it does not withhold a "
           "winner)", type=_fraction, pytest="--bench-noise-threshold",
           bench=True),
    # 2 %: on the lab's 2-core CPU a case's median against dflash moved by up to 1.0 % between two quiet runs
    # (studies/2026-12-01-leader-group/); pyperf's --min-speed and criterion's noise_threshold are the same idea. The
    # ranking widens it by itself on a noisy run (stats/selection.effective_resolution).
    Option("resolution", "DFLASH_RESOLUTION", 0.02, "ranking resolution r: a single winner is named only when it is "
           "faster than every other method by more than this fraction (with 95 % confidence); a noisy run widens it "
           "to 2.5 x its noise figure / sqrt(rounds)", type=_fraction, pytest="--bench-resolution", bench=True),
    # 16: two simulated quiet runs gave the same G1 in 99-100 % of pairs at 16 rounds, 92-97 % at 12.
    Option("rank_rounds", "DFLASH_RANK_ROUNDS", 16, "ranking rounds: every exact speculative case at the ranking "
           "width gets this many rounds against plain dflash, fixed before the run (no racing)", type=int,
           minimum=2, pytest="--bench-rank-rounds", bench=True),
    Option("bench_size", "DFLASH_BENCH_SIZE", "auto", "benchmark size: auto (the prompts, tokens and base rounds "
           "that fit --bench-budget by the costs calibration measured, never above their values here; a target over "
           "100M parameters also gets the real-target size for every knob not set explicitly: calibration on 2 "
           "prompts x 16 tokens, one auto width, 6 ranking rounds) or full (the defaults of this table)",
           choices=BENCH_SIZES, pytest="--bench-size", bench=True),
    # auto: 15 min for the mini target, so the main command (setup, bundle import, benchmark, report) ends in
    # < 20 min on 2 cores; 25 min for a real target, whose calibration alone takes several minutes.
    Option("bench_budget", "DFLASH_BENCH_BUDGET", "auto", "minutes the benchmark should take under --bench-size auto "
           "(calibration included, prepare not), or auto: 15 for a target of up to 100M parameters, 25 above; the "
           "matrix takes the largest size, never above its knobs' values, whose projection from the calibration's "
           "measured costs fits (bench.budget)", type=_budget, pytest="--bench-budget", bench=True),
    # Environment only.
    Option("reports", "DFLASH_REPORTS", None, "where the report plugin writes <device>/index.html, report.html "
           "and benchmark.json", default_text="reports/ in the repository root"),
    Option("prepared", "DFLASH_PREPARED", None, "set by `bench` for its child pytest: the artifact folder it has just "
           "prepared and verified, so the benchmark session loads the target once instead of preparing again "
           "(its manifest is still checked file by file when the session loads it)", default_text="unset"),
    Option("require_gpu", "DFLASH_REQUIRE_GPU", False, "1: a GPU test that would skip without CUDA fails instead",
           type=_flag, default_text="0"),
    Option("hypothesis_profile", "DFLASH_HYPOTHESIS_PROFILE", "dev", "Hypothesis profile (ci is loaded whenever "
           "CI is set)", choices=HYPOTHESIS_PROFILES),
)

BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}
# BenchConfig fields whose value comes from this table (env, then the pytest option).
BENCH_FIELDS = tuple(o.name for o in OPTIONS if o.bench)


def for_command(command: str) -> tuple[str, ...]:
    """The table options a `python -m dflash_core` subcommand takes, in table order."""
    return tuple(o.name for o in OPTIONS if command in o.commands)


def pytest_options(scope: str) -> tuple[str, ...]:
    """The table options with a pytest flag declared by the root conftest ("root") or the benchmark's ("bench")."""
    return tuple(o.name for o in OPTIONS if o.pytest and o.pytest_scope == scope)


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
    kind = {"action": "store_const", "const": True} if o.type is _flag else {"type": o.argparse_type()}
    parser.add_argument(o.cli, dest=o.name, default=None, **kind,  # a flag option takes no value (`--rebuild-mini`)
                        help=overrides.pop("help", f"{o.help} (default {shown}{env})"), **overrides)


def add_pytest_option(group, name: str) -> None:
    """Declare `name` as a pytest option; its default is the environment's value (read once, here)."""
    o = BY_NAME[name]
    group.addoption(o.pytest, default=o.from_env(), type=o.argparse_type(),
                    help=f"{o.help} (env {o.env}, default {o.default_text or o.default})")


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """Parse every DFLASH_* knob of the table: a bad one is refused before any work, whichever command reads it
    later (`bench` hands them to a child pytest that would otherwise refuse them only after `prepare`)."""
    for o in OPTIONS:
        if o.env:
            o.from_env(environ)


def check_pytest_args(args: list[str]) -> None:
    """The table's pytest options among pass-through arguments (`--bench-widths 99`, `--bench-tokens=abc`),
    parsed with the table's checks before any work."""
    by_flag = {o.pytest: o for o in OPTIONS if o.pytest}
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag in by_flag:
            if not eq:
                if i + 1 >= len(args):
                    raise BadInputError(f"{flag} needs a value")
                value = args[i + 1]
            by_flag[flag].parse(value, flag)


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
