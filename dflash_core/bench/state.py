"""One benchmark session's state: the target, its verified artifacts, the prompts and greedy references, and what
calibration chose; `lab_section` is the plain data the saved run keeps of it. `session.open_session` fills it."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from ..methods import METHODS
from ..store.artifacts import target_identity, versions
from .config import BenchConfig
from .costmodel import OBJECTIVE, RATIO_BAND


def prompts_sha256(prompts: list[str]) -> str:
    """The benchmarked prompts' fingerprint: pooling and the gate refuse two runs whose prompts differ."""
    return hashlib.sha256(json.dumps(list(prompts), ensure_ascii=False).encode("utf-8")).hexdigest()


@dataclass
class BenchSession:
    cfg: BenchConfig
    rt: Any
    prepared: Any
    family: str
    prompts: list[str]
    prompt_ids: list[list[int]]
    greedy_outputs: list[list[int]]  # each benchmark prompt's greedy continuation: what exactness compares with
    margins: list[list[float]]
    calibration: dict = field(default_factory=dict)  # method -> calibration record (with "selected")
    options: dict = field(default_factory=dict)  # method -> proposer options chosen by calibration
    tuned_widths: dict = field(default_factory=dict)
    traces: dict = field(default_factory=dict)  # "<method>-w<width>" -> first prompt's verify rounds
    cases: dict = field(default_factory=dict)  # method -> widths measured (normal: [0])
    case_rounds: dict = field(default_factory=dict)  # "<method>-w<width>" -> CaseRounds (what the schedule extends)
    matrix_started: float | None = None  # perf_counter at the first measured case
    ranking_width: int | None = None  # chosen on calibration prompts before any case (calibration.ranking_width)
    ranking: dict | None = None  # schedule.run_ranking's record, once it ran
    bench_widths: list[int] = field(default_factory=list)  # the widths auto_widths chose (--bench-widths auto)
    width_choice: dict | None = None  # auto_widths' record: its cost-model table per width and the rule
    passes: dict | None = None  # run_passes' record: the base rounds after the first, round-robin over the cases
    width_options: dict = field(default_factory=dict)  # method -> {width: options calibrated at that width}
    choice_source: str = "auto"  # where the widths and options came from: auto, given, smoke or reused (chosen)
    calibration_costs: Any = None  # costmodel.ComponentCosts timed in the loop on calibration prompts
    drafter_costs: Any = None  # costmodel.ProposerCosts: the drafter's seconds on the same real decodes
    method_widths: dict = field(default_factory=dict)  # method -> {"selected": its own width, "table": per width}
    size_plan: dict | None = None  # the matrix size chosen to fit the budget (size_matrix)
    matrix_costs: Any = None  # bench.budget.MatrixCosts that size_matrix priced it on (the progress line's weights)
    prompt_tasks: list[str] = field(default_factory=list)  # each benchmark prompt's task family (same order)
    prompt_source: dict = field(default_factory=dict)  # shipped or a --prompts-file, and what its check covered

    def options_for(self, method: str, width: int) -> dict:
        """The options calibrated at `width`; at an uncalibrated width those of the nearest calibrated one
        (the lower on a tie); a method calibrated at no width: `options` (its default: none)."""
        per = self.width_options.get(method) or {}
        if not per:
            return dict(self.options.get(method, {}))
        w = min(per, key=lambda c: (abs(c - width), c))
        return dict(per[w])

    @property
    def block_size(self) -> int:
        return int(self.prepared.drafter.cfg.block_size)

    def record_case(self, method: str, width: int, trace: list) -> None:
        """A measured case: its width joins the method's widths and its first 16 rounds become its trace."""
        ws = self.cases.setdefault(method, [])
        if width not in ws:
            ws.append(width)
            ws.sort()
        self.traces[f"{method}-w{width}"] = trace[:16]

    def calibration_widths(self) -> list[int]:
        """The widths calibrated: the benchmarked ones (given, else chosen by `auto_widths`) that fit the block size
        (the bench fixture refuses the others), else B alone."""
        given = self.cfg.calibration_widths or tuple(self.bench_widths)
        ws = sorted({int(w) for w in given if 1 <= int(w) <= self.block_size})
        return ws or [self.block_size]

    def own_width(self, method: str) -> int | None:
        """The method's own width (`calibration.method_widths`), None before it was chosen."""
        return (self.method_widths.get(method) or {}).get("selected")

    def own_width_cases(self) -> list[tuple[str, int]]:
        """The cases a method's own width adds to the matrix: (method, its own width) where that width is not one of
        the benchmarked widths every method runs at."""
        shared = set(self.calibration_widths())
        return [(m, int(self.own_width(m))) for m in self.method_widths if self.own_width(m) is not None
                and self.own_width(m) not in shared]

    def case_widths(self) -> list[int]:
        """Every width a speculative case will run at: the benchmarked widths and the own widths they add."""
        return sorted({*self.calibration_widths(), *(w for _, w in self.own_width_cases())})

    def widths(self) -> list[int]:
        """Every width a case was measured at (0 for normal), ascending."""
        return sorted({w for ws in self.cases.values() for w in ws})

    def token_text(self) -> dict[str, str]:
        """id -> its text, for the ids in the recorded traces (the explorer shows text, not bare ids)."""
        if getattr(self.rt, "tokenizer", None) is None:
            return {}
        ids = {int(t) for tr in self.traces.values() for r in tr for t in [*r["draft"], r["token"]]}
        return {str(i): self.rt.decode([i]) for i in sorted(ids)}

    def chosen(self) -> dict:
        """The widths and calibrated options this run chose (or reused), as `--calibration-from` reads them back:
        a later run that reuses them measures the same cases, which the gate and pooling require (report.match)."""
        return {"widths": self.calibration_widths(), "source": self.choice_source, "ranking_width": self.ranking_width,
                "method_widths": {m: int(r["selected"]) for m, r in self.method_widths.items()},
                "options": {mid: {str(w): dict(o) for w, o in per.items()} for mid, per in self.width_options.items()}}

    def cost_model_section(self) -> dict:
        """The cost model's constants and the target costs it used (costmodel), as plain data."""
        return {"objective": OBJECTIVE, "quiet_noise": self.cfg.noise_threshold, "ratio_band": list(RATIO_BAND),
                "source": "loop", "calibration_costs": self.calibration_costs.to_dict()
                if self.calibration_costs is not None else None}

    def lab_section(self) -> dict:
        """The `dflash` section of the saved benchmark JSON: settings, target, provenance, calibration,
        traces and the method registry, as plain data (the report builder reads nothing else of the session)."""
        man = self.prepared.manifest
        return {
            "settings": {**self.cfg.to_dict(), "widths": self.widths(), "block_size": self.block_size,
                         "base_rounds_schedule": self.passes, "width_choice": self.width_choice,
                         "ranking_width": self.ranking_width, "chosen": self.chosen(), "size_plan": self.size_plan,
                         "method_widths": self.method_widths},
            "target": {**target_identity(self.rt), "dtype": str(self.rt.dtype).replace("torch.", ""),
                       "kernels": self.rt.kernels, "source": self.rt.source,
                       "kernel_layouts": (getattr(self.rt, "info", None) or {}).get("kernel_layouts"),
                       "drafter_kernel_layouts": (getattr(self.rt, "info", None) or {}).get("drafter_kernel_layouts"),
                       "mini_seed": (getattr(self.rt, "info", None) or {}).get("mini_seed"),
                       # what the target was trained on, where its checkpoint says (the mini's metadata): the
                       # report's answer names the target for what it is (report.headline.target_description)
                       "family": (getattr(self.rt, "info", None) or {}).get("family"),
                       "corpus_files": (getattr(self.rt, "info", None) or {}).get("mini_corpus_files")},
            "provenance": {"versions": versions(), "seeds": man.get("seeds"),
                           "artifacts": {"directory": str(self.prepared.directory), "files": man.get("files"),
                                         "created_utc": man.get("created_utc")},
                           "drafter": {k: man.get("drafter", {}).get(k) for k in (
                               "config", "parameters", "final_loss", "heldout_position_accuracy",
                               "train_position_accuracy", "heldout_sequences", "best_step")},
                           "fits": man.get("fits")},
            "calibration": self.calibration,
            "tuned_widths": self.tuned_widths,
            "traces": self.traces,
            # the prompt the traces continue (the first benchmark prompt): the explorer shows it before the text
            "trace_prompt": self.prompts[0] if self.prompts else None,
            "prompts": {**self.prompt_source, "tasks": list(self.prompt_tasks), "sha256": prompts_sha256(self.prompts)},
            "noise": {"threshold": self.cfg.noise_threshold, "figure": "robust"},
            "ranking_rounds": self.ranking,
            "cost_model": self.cost_model_section(),
            "token_text": self.token_text(),
            "methods": {mid: {"index": m.index, "label": m.label, "mechanism": m.mechanism,
                              "complexity": m.complexity, "stages": list(m.stages), "why_inactive": m.why_inactive}
                        for mid, m in METHODS.items()},
        }
