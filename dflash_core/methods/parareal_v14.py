"""14 simple_parareal_v14: a three-coefficient Parareal gap estimator with one switch per block.

G_i = draft top1 - top2 logit (top-2 on the drafter's device, as V13), F_hat = a + b*G + c*i/(B-1),
gap1 = G + damping*(F_hat - G); slots with gap1 < switch_threshold are candidates and at most
`max_corrections` (default 1) of them, smallest gap1 first, switch to top-2. The coefficients are fitted
by `prepare` (closed-form ridge of the target's top1 - top2 gap F on the train trajectories).
Guidance work: 6 estimator ops per drafted slot (6 * B per block). Numeric meta (summed over blocks):
`v14_estimator_ops`, `v14_switched_positions`, `v14_abs_residual_sum` (per-block mean |F_hat - G|; divide
by draft calls for the mean), `v14_top2_values_transferred`.

Departures from the seed (docs/design.md, "The seed study and where the lab departs from it"): train/holdout split by
trajectory (flaw 7); the loader checks the algorithm string; the metrics add the one-switch-per-block
budget (flaw 6). With the default damping 1.0 the update is the estimator itself (gap1 = F_hat), as in
the seed; and since G >= 0, its coarse sign accuracy is 1 - teacher_prefers_top2_rate by construction.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import torch

from ..errors import ArtifactError
from .base import Fitter, MethodInfo
from .support.block import Top2Proposer
from .support.common import MethodOptions, check_number, opt
from .support.fitting import correction_examples, examples_meta, ridge, split_by_trajectory, split_meta

V14_FILE = "v14_simple_parareal.json"
V14_ALGORITHM = "DFlash14-Simple-PARAREAL"
V14_DEFAULTS = {"damping": 1.0, "switch_threshold": 0.0, "max_corrections": 1}
V14_RIDGE = 1e-3


def v14_design(G: torch.Tensor, B: int) -> torch.Tensor:
    """[N, n] coarse gaps (slot i = column i) -> [N*n, 3] rows [1, G, i/(B-1)]."""
    n = G.shape[-1]
    pos = (torch.arange(n, dtype=torch.float64) / max(B - 1, 1)).expand_as(G)
    return torch.stack([torch.ones_like(G), G, pos], dim=-1).reshape(-1, 3)


def v14_switches(gap1: list[float], threshold: float, max_corrections: int) -> list[int]:
    """Slots to switch to top-2: gap1 < threshold, smallest gap1 first (lower slot on ties), at most max."""
    elig = sorted((i for i, g in enumerate(gap1) if g < threshold), key=lambda i: gap1[i])
    return elig[:max(0, int(max_corrections))]


def v14_metrics(G: torch.Tensor, F: torch.Tensor, coef: torch.Tensor, cfg: dict, B: int) -> dict:
    """Per-slot metrics (as the seed) plus block metrics under the one-switch-per-block budget."""
    if G.numel() == 0:
        return {"rows": 0}
    X = v14_design(G, B)
    Fh = (X @ coef).view_as(G)
    gap1 = G + cfg["damping"] * (Fh - G)
    truth_top2 = F < 0
    pred_switch = gap1 < cfg["switch_threshold"]
    tp = float((pred_switch & truth_top2).sum())
    blk_tp = blk_n = 0
    for g_row, t_row in zip(gap1.tolist(), truth_top2.tolist()):
        for i in v14_switches(g_row, cfg["switch_threshold"], cfg["max_corrections"]):
            blk_n += 1
            blk_tp += int(t_row[i])
    return {"rows": int(G.numel()), "fine_gap_mse": float((Fh - F).pow(2).mean()),
            "fine_gap_mae": float((Fh - F).abs().mean()),
            "corrected_sign_accuracy": float(((gap1 >= 0) == (F >= 0)).double().mean()),
            "coarse_sign_accuracy": float(((G >= 0) == (F >= 0)).double().mean()),
            "teacher_prefers_top2_rate": float(truth_top2.double().mean()),
            "predicted_switch_rate": float(pred_switch.double().mean()),
            "switch_precision": tp / max(float(pred_switch.sum()), 1.0),
            "switch_recall": tp / max(float(truth_top2.sum()), 1.0),
            "budgeted_switches_per_block": blk_n / G.shape[0], "budgeted_switch_precision": blk_tp / max(blk_n, 1),
            "mean_coarse_gap": float(G.mean()), "mean_fine_gap": float(F.mean()),
            "mean_estimated_fine_gap": float(Fh.mean())}


def fit_v14(ctx) -> dict:
    t0 = time.perf_counter()
    ex = correction_examples(ctx)
    B = ctx.drafter.cfg.block_size
    G_all = (ex.topk_vals[..., 0] - ex.topk_vals[..., 1]).double()  # [N, B], top-2 by the tie rule
    F_all = (ex.target_logits[..., 0] - ex.target_logits[..., 1]).double()
    train, hold, train_ids, hold_ids = split_by_trajectory(ex.anchors, ctx.cfg.seed + 14)
    coef = ridge(v14_design(G_all[train], B), F_all[train].reshape(-1), V14_RIDGE)
    cfg = dict(V14_DEFAULTS)
    fit_mse = float((v14_design(G_all[train], B) @ coef - F_all[train].reshape(-1)).pow(2).mean())
    tm = v14_metrics(G_all[train], F_all[train], coef, cfg, B)
    hm = v14_metrics(G_all[hold], F_all[hold], coef, cfg, B)
    names = ("intercept", "coarse_gap_weight", "position_weight")
    provenance = {"prompts": f"train seeds of family {ctx.family!r} (prepare's teacher trajectories)",
                  **split_meta(train_ids, hold_ids), "train_examples": int(train.sum()),
                  "holdout_examples": int(hold.sum()), "training_rows": int(train.sum()) * B,
                  **examples_meta(ex)}
    doc = {"format_version": 1, "algorithm": V14_ALGORITHM, "coefficients": dict(zip(names, coef.tolist())),
           "config": cfg, "ridge": V14_RIDGE,
           "metadata": {"mechanism": "three-coefficient fine-gap estimator, one damped update, one switch",
                        "parareal_mapping": {"coarse_G": "draft top1 - top2 logit", "fine_F_training_only":
                                             "target logit(top1) - target logit(top2)",
                                             "fine_estimator": "a + b*G + c*i/(B-1)",
                                             "inference_update": "gap1 = G + damping*(F_hat - G)",
                                             "routing": "at most max_corrections slots with gap1 < threshold"},
                        "block_size": B, "fit_mse": fit_mse, "train_metrics": tm, "holdout_metrics": hm,
                        **provenance}}
    meta = {"file": V14_FILE, "coefficients": dict(zip(names, coef.tolist())), "config": cfg, "fit_mse": fit_mse,
            "holdout_metrics": hm, "seconds": time.perf_counter() - t0, **provenance}
    return {"files": {V14_FILE: json.dumps(doc, sort_keys=True, indent=2).encode()}, "meta": meta}


V14_FITTER = Fitter("simple_parareal_v14", (V14_FILE,), fit_v14)


def load_v14(doc: dict) -> tuple[tuple[float, float, float], dict]:
    if doc.get("algorithm") != V14_ALGORITHM:
        raise ArtifactError(f"{V14_FILE} is not a {V14_ALGORITHM} estimator: run `python -m dflash_core prepare "
                            "--refresh`")
    c = doc["coefficients"]
    return (float(c["intercept"]), float(c["coarse_gap_weight"]), float(c["position_weight"])), \
        {**V14_DEFAULTS, **doc.get("config", {})}


@dataclass(frozen=True)
class SimpleParaRealOptions(MethodOptions):
    """None: the fitted artifact's value."""

    damping: float | None = opt(None)
    switch_threshold: float | None = opt(None)
    max_corrections: int | None = opt(None, lo=0, integer=True)


class SimpleParaRealProposer(Top2Proposer):
    """Top-2 on the drafter's device (only B x 2 ids/values leave it), then O(B) scalar work."""

    def __init__(self, rt, prepared, options: SimpleParaRealOptions):
        super().__init__(rt, prepared, options)
        self.coef, cfg = prepared.cached(V14_FILE, lambda: load_v14(prepared.load_json(V14_FILE)))
        pick = lambda name: cfg[name] if getattr(options, name) is None else getattr(options, name)  # noqa: E731
        self.damping = check_number("damping", pick("damping"))
        self.threshold = check_number("switch_threshold", pick("switch_threshold"))
        self.max_corrections = check_number("max_corrections", pick("max_corrections"), lo=0, integer=True)

    def choose(self, ids, vals, prefix=None):
        return v14_choose(ids, vals, self.coef, damping=self.damping, threshold=self.threshold,
                          max_corrections=self.max_corrections)


def v14_choose(ids, vals, coef, *, damping: float, threshold: float, max_corrections: int):
    """V14 on host top-2 lists: (chosen ids, guidance work, meta)."""
    a, b, c = coef
    B = len(ids)
    G = [float(v[0]) - float(v[1]) for v in vals]
    Fh = [a + b * g + c * (i / (B - 1) if B > 1 else 0.0) for i, g in enumerate(G)]
    gap1 = [g + damping * (f - g) for g, f in zip(G, Fh)]
    chosen = [int(r[0]) for r in ids]
    sw = v14_switches(gap1, threshold, max_corrections)
    for i in sw:
        chosen[i] = int(ids[i][1])
    return chosen, 6 * B, {"v14_estimator_ops": 6 * B, "v14_switched_positions": len(sw),
                           "v14_abs_residual_sum": sum(abs(f - g) for f, g in zip(Fh, G)) / B,
                           "v14_top2_values_transferred": 2 * B}




INFO = MethodInfo(
    index=14, id="simple_parareal_v14", label="V14 Simple PARAREAL",
    mechanism="three-coefficient gap estimator, one switch", complexity="O(B) scalar correction after top-2",
    proposer=SimpleParaRealProposer, options=SimpleParaRealOptions, fitters=(V14_FITTER,),
    stages=("draft block; top-2 on the drafter's device", "F_hat = a + b G + c i/(B-1)",
            "gap1 = G + damping (F_hat - G)", "switch <= 1 slot to top-2; verify"),
    why_inactive="its fitted gap estimate never drops below the switch threshold.")
