"""The `tuned` linear path: each call of a linear layer runs in the weight layout measured fastest at its row count.

Why: ATen's float32 CPU matmul reaches different BLAS code paths for `x @ Wᵀ` (nn.Linear's [out, in] weight,
`nt`) and `x @ Wt` (a contiguous [in, out] copy, `nn`), and oneDNN's prepacked weight (`onednn`) is a third.
Which is fastest depends on the row count and on the CPU: on an Intel Xeon (Ice Lake, 2 cores) SmolLM2's linears
cost about the same at one row in `nt` and `nn`, but at 9-17 rows `nt` costs 1.6-1.8x `nn`; oneDNN was slower
than both there, while on an AMD EPYC with AVX512-BF16 it was the fastest at one row (docs/performance.md). Decode
runs one row, a verify w + 1 rows, so no single layout serves both and no CPU flag predicts the winner. So the
path measures: `probe` times one pass over the model's own linear weights per candidate at each row count of
PROBE_ROWS and `choose` keeps a table (row count -> layout); `TunedLinear` looks its call's row count up there.
No library makes this choice per call (torch's and oneDNN's heuristics pick a kernel per layout, not the layout).

The choice is a speed decision with no confidence claim: medians of PROBE_REPS alternating passes, and a candidate
other than the loaded layout must beat it by MARGIN. A wrong choice costs time, never exactness: every layout
computes the same product up to float32 rounding, the drift exactness already certifies between a verify's block
kernel and decode's one-row kernel (runtime/exactness.py). The table is recorded in the target's `info` and so
in every report; only the layouts it uses keep their copy of the weights (the probe's own copies).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

CANDIDATES = ("nt", "nn", "onednn")
# Row counts probed: decode (1), the verifies of widths 1, 2, 4, 8 and 16 (w + 1 rows) and a prefill-sized block.
# A call between two probed counts takes the lower one's layout; beyond the last, the last's.
PROBE_ROWS = (1, 2, 3, 5, 9, 17, 64)
PROBE_REPS = 5  # ~10 s for SmolLM2's linears on 2 cores, ~25 s for the 350M's
MARGIN = 0.05  # another layout must be 5 % faster than the loaded one (nt) to be chosen at a row count


@dataclass(frozen=True)
class LayoutTable:
    """Which layout runs a linear call of each probed row count, and the medians (ms per pass) behind it."""

    rows: tuple[int, ...]
    choice: tuple[str, ...]
    ms: dict[str, tuple[float, ...]]

    def layout(self, n_rows: int) -> str:
        pick = self.choice[0]
        for r, c in zip(self.rows, self.choice):
            if n_rows < r:
                break
            pick = c
        return pick

    def used(self) -> set[str]:
        return set(self.choice)

    def to_dict(self) -> dict:
        return {"rows": list(self.rows), "choice": list(self.choice),
                "ms_per_pass": {k: [round(v, 3) for v in vs] for k, vs in self.ms.items()},
                "rule": f"median of {PROBE_REPS} alternating passes; another layout than nt needs {MARGIN:.0%} less"}


def choose(ms: dict[str, Sequence[float]], rows: Sequence[int], margin: float = MARGIN) -> LayoutTable:
    """The table from measured medians: per row count the fastest candidate, `nt` unless another beats it by
    `margin`. `ms[c][i]` is candidate c's median at rows[i]; `nt` must be among them."""
    if "nt" not in ms:
        raise ValueError("the loaded layout nt must be measured")
    choice = []
    for i in range(len(rows)):
        best = min(ms, key=lambda c: (ms[c][i], c != "nt"))
        choice.append(best if ms[best][i] < (1.0 - margin) * ms["nt"][i] else "nt")
    return LayoutTable(tuple(int(r) for r in rows), tuple(choice), {c: tuple(float(v) for v in vs)
                                                                     for c, vs in ms.items()})


def measure_medians(run: Callable[[str, int], float], candidates: Sequence[str], rows: Sequence[int],
                    reps: int = PROBE_REPS) -> dict[str, tuple[float, ...]]:
    """Medians (ms) of `run(candidate, n_rows)` (seconds of one pass), the candidates alternating in a rotated
    order every repetition so that a drift in the machine's speed falls on all of them alike; one unrecorded
    warm-up pass each first. `run` is injectable: tests give it a timing model whose truth is known."""
    cands = list(candidates)
    for c in cands:
        run(c, rows[0])
    out = {c: [] for c in cands}
    for n in rows:
        got = {c: [] for c in cands}
        for rep in range(reps):
            k = rep % len(cands)
            for c in cands[k:] + cands[:k]:
                got[c].append(run(c, n) * 1000.0)
        for c in cands:
            out[c].append(statistics.median(got[c]))
    return {c: tuple(v) for c, v in out.items()}


class TunedLinear(nn.Module):
    """nn.Linear's product in the layout `table` gives the call's row count. `weight` stays the loaded
    Parameter (tied heads, row gathers and the artifact identity read it as before)."""

    def __init__(self, lin: nn.Linear, table: LayoutTable, copies: dict):
        super().__init__()
        self.weight, self.bias = lin.weight, lin.bias
        self.in_features, self.out_features = lin.in_features, lin.out_features
        self.table = table
        used = table.used()
        key = id(lin.weight)  # a tied weight gets one copy of each layout
        self.weight_t = None
        if "nn" in used:
            if ("nn", key) not in copies:
                copies[("nn", key)] = lin.weight.detach().t().contiguous()
            self.weight_t = copies[("nn", key)]
        self.packed: dict = {}  # a plain dict: the prepacked module stays out of the model's modules and state
        if "onednn" in used:
            from torch.utils.mkldnn import MkldnnLinear

            if ("onednn", key) not in copies:
                copies[("onednn", key)] = MkldnnLinear(lin, torch.float32)
            self.packed["onednn"] = copies[("onednn", key)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        layout = self.table.layout(x.numel() // max(1, x.shape[-1]))
        if layout == "nn":
            y = torch.matmul(x, self.weight_t)
            return y if self.bias is None else y + self.bias
        if layout == "onednn":
            return self.packed["onednn"](x)
        return F.linear(x, self.weight, self.bias)


def distinct_linears(model: nn.Module) -> list[nn.Linear]:
    """The model's nn.Linear modules, one per weight (a tied head counts once), in module order."""
    seen, out = set(), []
    for m in model.modules():
        if type(m) is nn.Linear and id(m.weight) not in seen:
            seen.add(id(m.weight))
            out.append(m)
    return out


def sweep_runner(linears: Sequence[nn.Linear], candidates: Sequence[str],
                 copies: dict | None = None) -> Callable[[str, int], float]:
    """`run(candidate, n_rows)`: seconds of one pass of random rows through every linear in that layout (the
    weights stream from memory as in a forward). The layouts' copies are made once, in `copies` (keyed as
    `TunedLinear` reads them), so the path keeps the chosen ones instead of copying the weights again."""
    copies = {} if copies is None else copies
    for lin in linears:
        key = id(lin.weight)
        if "nn" in candidates and ("nn", key) not in copies:
            copies[("nn", key)] = lin.weight.detach().t().contiguous()
        if "onednn" in candidates and ("onednn", key) not in copies:
            from torch.utils.mkldnn import MkldnnLinear

            copies[("onednn", key)] = MkldnnLinear(lin, torch.float32)
    g = torch.Generator().manual_seed(0)
    widths = sorted({lin.in_features for lin in linears})
    xs: dict[tuple[int, int], torch.Tensor] = {}

    def run(candidate: str, n: int) -> float:
        for w in widths:
            if (n, w) not in xs:
                xs[(n, w)] = torch.randn(n, w, generator=g)
        with torch.inference_mode():
            t0 = time.perf_counter()
            for lin in linears:
                x = xs[(n, lin.in_features)]
                if candidate == "nn":
                    torch.matmul(x, copies[("nn", id(lin.weight))])
                elif candidate == "onednn":
                    copies[("onednn", id(lin.weight))](x)
                else:
                    F.linear(x, lin.weight)
            return time.perf_counter() - t0

    return run


def probe(model: nn.Module, rows: Sequence[int] = PROBE_ROWS, reps: int = PROBE_REPS,
          run: Callable[[str, int], float] | None = None, copies: dict | None = None) -> LayoutTable:
    """Measure the candidates on `model`'s own weights (or through an injected `run`) and choose; the weights'
    copies in the candidate layouts are left in `copies` for `apply_tuned`."""
    cands = [c for c in CANDIDATES if c != "onednn" or torch.backends.mkldnn.is_available()]
    if run is None:
        run = sweep_runner(distinct_linears(model), cands, copies)
    return choose(measure_medians(run, cands, rows, reps), rows)


def apply_tuned(model: nn.Module, table: LayoutTable, copies: dict | None = None) -> nn.Module:
    """Swap every nn.Linear of `model` (in place) for a TunedLinear on `table`; returns the model. `copies`: the
    probe's copies of the weights (reused where the table chooses their layout, the rest freed with the dict)."""
    copies = {} if copies is None else copies
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, TunedLinear(child, table, copies))
    return model
