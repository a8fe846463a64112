"""12 parareal_v12: Parareal-style coarse/fine residual correction of the drafter's top-K scores
(14 simple_parareal_v14, its three-coefficient cousin, is in parareal_v14.py).

Parareal mapping. The coarse propagator G is the drafter's top-K logits of a slot; the fine propagator F
is the target's logits of the same K ids (available in preparation only, from teacher trajectories).
A cheap model of F - G, fitted offline, corrects G at inference; no target call beyond the verifier.

q <- center(G); R times: q <- center(q + damping * clip(beta . z(features(q, G))));
  the slot takes the candidate with the largest q (first maximum, i.e. the top-k tie order). Eight
  features per (slot, candidate): current score, coarse score, rank j/(K-1), position i/(B-1), coarse
  top1-top2 margin, candidate . e_last / sqrt(H), candidate . e_mean / sqrt(H), current x position,
  with the target's input embeddings (e_last: the last committed token, e_mean: the mean over the
  prefix). Standardised features, intercept + 8 coefficients by closed-form ridge.
  Guidance work: B_n * K * R correction rows (B_n = slots that can be verified, see below).
Numeric meta (summed over blocks by the loop): `v12_correction_rows`, `v12_changed_slots` (slots whose
choice differs from the drafter's argmax), `v12_update_rms_sum` (sum over rounds of RMS(damping * residual)).

Departures from the seed (docs/design.md, "The seed study and where the lab departs from it"):
* train/holdout split BY TRAJECTORY (a seeded permutation of trajectory indices), never by example order
  (flaw 7); the file records which trajectories were used for what;
* V12's top_k comes from the artifact; asking for another K is refused (flaw 5);
* top-k ties follow `methods.common.topk`'s rule (value, then lower id) in fitting and at inference.
V12's slots are independent, so it corrects only the slots that can be verified this round; this gives
the same ids as correcting the full block and trimming afterwards, with less work.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass

import torch

from ..errors import ArtifactError, BadInputError
from .base import Fitter, MethodInfo
from .support.block import BlockProposer
from .support.common import MethodOptions, check_number, opt, topk
from .support.fitting import correction_examples, examples_meta, ridge, split_by_trajectory, split_meta

V12_FILE = "v12_parareal.json"
V12_ALGORITHM = "DFlash12-PARAREAL"
V12_FEATURES = ("current_score", "coarse_score", "candidate_rank", "block_position", "coarse_margin",
                "candidate_last_similarity", "candidate_mean_similarity", "current_x_position")
V12_DEFAULTS = {"top_k": 8, "correction_rounds": 2, "damping": 0.75, "ridge": 1e-3, "residual_clip": 6.0,
                "interpolation": [0.0, 0.5, 0.75]}


def standardised_ridge(X: torch.Tensor, y: torch.Tensor, lam: float):
    """V12's solver: z = (x - mean) / std (population std; std < 1e-6 -> 1), then ridge on [1, z].
    Returns (coef [1 + d] intercept first, mean [d], scale [d])."""
    X = X.double()
    mean = X.mean(0)
    scale = X.std(0, unbiased=False)
    scale = torch.where(scale < 1e-6, torch.ones_like(scale), scale)
    Z = torch.cat([torch.ones(X.shape[0], 1, dtype=torch.float64), (X - mean) / scale], dim=1)
    return ridge(Z, y, lam), mean, scale


def center(x: torch.Tensor) -> torch.Tensor:
    return x - x.mean(dim=-1, keepdim=True)


def prefix_embeddings(E: torch.Tensor, seq: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(e_last [T, H], e_mean [T, H]) float64: embedding of token t and mean embedding of seq[:t+1]."""
    rows = E[torch.tensor(seq, device=E.device)].double().cpu()
    csum = rows.cumsum(0)
    n = torch.arange(1, len(seq) + 1, dtype=torch.float64).unsqueeze(1)
    return rows, csum / n


def similarities(E: torch.Tensor, ids: torch.Tensor, e_last: torch.Tensor, e_mean: torch.Tensor):
    """Candidate . e_last / sqrt(H) and candidate . e_mean / sqrt(H), float64 [..., K]."""
    cand = E[ids.to(E.device)].double().cpu()  # [..., K, H]
    s = 1.0 / math.sqrt(E.shape[-1])
    return (cand @ e_last.unsqueeze(-1)).squeeze(-1) * s, (cand @ e_mean.unsqueeze(-1)).squeeze(-1) * s


def v12_features(current, coarse, sim_last, sim_mean, block_size: int) -> torch.Tensor:
    """[..., n, K] inputs (float64; slot i is row i) -> [..., n, K, 8] features in V12_FEATURES order."""
    n, K = current.shape[-2], current.shape[-1]
    rank = (torch.arange(K, dtype=torch.float64) / max(K - 1, 1)).expand_as(current)
    pos = (torch.arange(n, dtype=torch.float64) / max(block_size - 1, 1)).unsqueeze(-1).expand_as(current)
    margin = (coarse[..., 0] - coarse[..., 1]).unsqueeze(-1).expand_as(current) if K > 1 else torch.zeros_like(current)
    return torch.stack([current, coarse, rank, pos, margin, sim_last, sim_mean, current * pos], dim=-1)


# --- V12 ------------------------------------------------------------------------------------------

@dataclass
class V12Model:
    coef: torch.Tensor  # [9] float64, intercept first
    mean: torch.Tensor  # [8]
    scale: torch.Tensor  # [8]
    config: dict

    def residual(self, x: torch.Tensor, clip: bool = True) -> torch.Tensor:
        z = (x - self.mean) / self.scale
        out = self.coef[0] + z @ self.coef[1:]
        c = float(self.config["residual_clip"])
        return out.clamp(-c, c) if clip else out

    def correct(self, G: torch.Tensor, sim_last, sim_mean, block_size: int, rounds: int, damping: float):
        """R damped rounds from q = center(G); returns every iterate [q0..qR] and the update RMS per round."""
        cG = center(G)
        q = cG
        qs, rms = [q], []
        for _ in range(rounds):
            step = damping * self.residual(v12_features(q, cG, sim_last, sim_mean, block_size))
            rms.append(float(step.pow(2).mean().sqrt()))
            q = center(q + step)
            qs.append(q)
        return qs, rms

    @classmethod
    def from_doc(cls, doc: dict) -> "V12Model":
        if doc.get("algorithm") != V12_ALGORITHM or tuple(doc.get("feature_names", ())) != V12_FEATURES:
            raise ArtifactError(f"{V12_FILE} is not a {V12_ALGORITHM} model with features {V12_FEATURES}: "
                                "run `python -m dflash_core prepare --refresh`")
        if len(doc["coefficients"]) != 9 or len(doc["feature_mean"]) != 8 or len(doc["feature_scale"]) != 8:
            raise ArtifactError(f"{V12_FILE} has the wrong number of coefficients: rerun prepare with --refresh")
        t = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
        return cls(t(doc["coefficients"]), t(doc["feature_mean"]), t(doc["feature_scale"]),
                   {**V12_DEFAULTS, **doc["config"]})


def _v12_design(ex, E, seqs, mask, cfg: dict, B: int):
    """Training rows: for each example and interpolation tau, current = (1-tau)cG + tau cF, y = cF - current."""
    idx = mask.nonzero().flatten().tolist()
    G = ex.topk_vals[idx].double()
    F = ex.target_logits[idx].double()
    sl, sm = _example_sims(ex, E, seqs, idx)
    cG, cF = center(G), center(F)
    Xs, ys = [], []
    for tau in cfg["interpolation"]:
        tau = min(max(float(tau), 0.0), 0.999999)
        cur = (1 - tau) * cG + tau * cF
        Xs.append(v12_features(cur, cG, sl, sm, B).reshape(-1, 8))
        ys.append((cF - cur).reshape(-1))
    return torch.cat(Xs), torch.cat(ys), (G, F, sl, sm)


def _example_sims(ex, E, seqs, idx, chunk: int = 256):
    """Similarity features of the examples `idx` ([n, B, K] each), computed in chunks (E[ids] is large)."""
    cache: dict[int, tuple] = {}
    outs_l, outs_m = [], []
    for lo in range(0, len(idx), chunk):
        part = idx[lo:lo + chunk]
        last, mean = [], []
        for i in part:
            t, a = ex.anchors[i]
            if t not in cache:
                cache[t] = prefix_embeddings(E, seqs[t])
            last.append(cache[t][0][a])
            mean.append(cache[t][1][a])
        el, em = torch.stack(last)[:, None, :], torch.stack(mean)[:, None, :]  # [n, 1, H]
        sl, sm = similarities(E, ex.topk_ids[part], el, em)
        outs_l.append(sl)
        outs_m.append(sm)
    if not outs_l:
        empty = torch.zeros(0, *ex.topk_ids.shape[1:], dtype=torch.float64)
        return empty, empty.clone()
    return torch.cat(outs_l), torch.cat(outs_m)


def _convergence(model: V12Model, G, F, sl, sm, labels, ids, B: int) -> dict:
    if G.shape[0] == 0:
        return {"examples": 0}
    cfg = model.config
    qs, rms = model.correct(G, sl, sm, B, int(cfg["correction_rounds"]), float(cfg["damping"]))
    cF = center(F)
    fine_top1 = cF.argmax(-1)
    mse = [float((q - cF).pow(2).mean()) for q in qs]
    agree = [float((q.argmax(-1) == fine_top1).double().mean()) for q in qs]
    label_agree = [float((ids.gather(-1, q.argmax(-1, keepdim=True)).squeeze(-1) == labels).double().mean())
                   for q in qs]
    return {"examples": int(G.shape[0]), "teacher_mse_by_round": mse,
            "contraction_ratio_by_round": [mse[r + 1] / mse[r] if mse[r] > 0 else 0.0 for r in range(len(mse) - 1)],
            "fine_top1_agreement_by_round": agree, "label_agreement_by_round": label_agree,
            "update_rms_by_round": rms}


def fit_v12(ctx) -> dict:
    t0 = time.perf_counter()
    ex = correction_examples(ctx)
    B = ctx.drafter.cfg.block_size
    E = ctx.rt.model.get_input_embeddings().weight.detach()
    cfg = dict(V12_DEFAULTS, top_k=int(ex.topk_ids.shape[-1]))
    train, hold, train_ids, hold_ids = split_by_trajectory(ex.anchors, ctx.cfg.seed + 12)
    X, y, tr = _v12_design(ex, E, ctx.trajectories, train, cfg, B)
    coef, mean, scale = standardised_ridge(X, y, cfg["ridge"])
    model = V12Model(coef, mean, scale, cfg)
    fit_mse = float((model.residual(X, clip=False) - y).pow(2).mean())
    hidx = hold.nonzero().flatten().tolist()
    ho = (ex.topk_vals[hidx].double(), ex.target_logits[hidx].double(), *_example_sims(ex, E, ctx.trajectories, hidx))
    tidx = train.nonzero().flatten().tolist()
    conv_train = _convergence(model, *tr, ex.labels[tidx], ex.topk_ids[tidx], B)
    conv_hold = _convergence(model, *ho, ex.labels[hidx], ex.topk_ids[hidx], B)
    provenance = {"prompts": f"train seeds of family {ctx.family!r} (prepare's teacher trajectories)",
                  **split_meta(train_ids, hold_ids), "train_examples": len(tidx),
                  "holdout_examples": len(hidx), "training_rows": int(X.shape[0]),
                  **examples_meta(ex)}
    doc = {"format_version": 1, "algorithm": V12_ALGORITHM, "feature_names": list(V12_FEATURES),
           "coefficients": coef.tolist(), "feature_mean": mean.tolist(), "feature_scale": scale.tolist(),
           "config": cfg,
           "metadata": {"mechanism": "parallel affine fine-minus-coarse residual correction",
                        "parareal_mapping": {"coarse_G": "drafter top-K logits", "fine_F_training_only":
                                             "target logits of the same ids", "learned_residual":
                                             "ridge on 8 standardised features",
                                             "inference_update": "q <- center(q + damping * clip(residual))"},
                        "block_size": B, "train_residual_mse": fit_mse, "train_convergence": conv_train,
                        "holdout_convergence": conv_hold, **provenance}}
    meta = {"file": V12_FILE, "coefficients": dict(zip(["intercept", *V12_FEATURES], coef.tolist())),
            "train_residual_mse": fit_mse, "holdout_teacher_mse_by_round": conv_hold.get("teacher_mse_by_round"),
            "holdout_fine_top1_agreement_by_round": conv_hold.get("fine_top1_agreement_by_round"),
            "config": cfg, "seconds": time.perf_counter() - t0, **provenance}
    return {"files": {V12_FILE: json.dumps(doc, sort_keys=True, indent=2).encode()}, "meta": meta}


V12_FITTER = Fitter("parareal_v12", (V12_FILE,), fit_v12)


class PrefixEmbedding:
    """Running e_last / e_mean of the committed prefix (float64 on the host), extended incrementally."""

    def __init__(self, E: torch.Tensor):
        self.E = E
        self.reset()

    def reset(self):
        self.n = 0
        self.sum = torch.zeros(self.E.shape[-1], dtype=torch.float64)

    def update(self, prefix: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        if len(prefix) < self.n:
            self.reset()
        if len(prefix) > self.n:
            new = torch.tensor(prefix[self.n:], device=self.E.device)
            self.sum = self.sum + self.E[new].double().cpu().sum(0)
            self.n = len(prefix)
        return self.E[prefix[-1]].double().cpu(), self.sum / self.n


@dataclass(frozen=True)
class ParaRealOptions(MethodOptions):
    """None: the fitted artifact's value. top_k may only repeat the fitted K."""

    correction_rounds: int | None = opt(None, lo=0, integer=True)
    damping: float | None = opt(None)
    top_k: int | None = opt(None, lo=1, integer=True)


class ParaRealProposer(BlockProposer):
    def __init__(self, rt, prepared, options: ParaRealOptions):
        super().__init__(rt, prepared, options)
        self.model = prepared.cached(V12_FILE, lambda: V12Model.from_doc(prepared.load_json(V12_FILE)))
        cfg = self.model.config
        if options.top_k is not None and options.top_k != int(cfg["top_k"]):
            raise BadInputError(f"parareal_v12 was fitted with top_k={cfg['top_k']}; top_k={options.top_k} would "
                                "apply its rank feature and statistics out of distribution (refit instead)")
        self.K = int(cfg["top_k"])
        self.rounds = check_number("correction_rounds", cfg["correction_rounds"] if options.correction_rounds is None
                                   else options.correction_rounds, lo=0, integer=True)
        self.damping = check_number("damping", cfg["damping"] if options.damping is None else options.damping)
        self.emb = PrefixEmbedding(self.embed.weight.detach())

    def begin(self, prompt, hidden):
        super().begin(prompt, hidden)
        self.emb.reset()

    def select(self, logits, hidden, prefix, k):
        n = min(k, self.block_size)
        ids, vals = topk(logits[:n], self.K)
        e_last, e_mean = self.emb.update(prefix)
        ids_t = torch.tensor(ids)
        sl, sm = similarities(self.embed.weight.detach(), ids_t, e_last, e_mean)
        qs, rms = self.model.correct(torch.tensor(vals, dtype=torch.float64), sl, sm, self.block_size, self.rounds,
                                     self.damping)
        q = qs[-1].tolist()
        chosen = [row[max(range(len(r)), key=lambda j, r=r: (r[j], -j))] for row, r in zip(ids, q)]
        top1 = sum(int(c != row[0]) for c, row in zip(chosen, ids))
        work = n * self.K * self.rounds
        return chosen, work, {"v12_correction_rows": work, "v12_changed_slots": top1,
                              "v12_update_rms_sum": float(sum(rms))}


INFO = MethodInfo(
    index=12, id="parareal_v12", label="V12 PARAREAL", mechanism="affine fine-minus-coarse residual correction",
    complexity="O(R B K) ridge rows + O(B K H) embedding similarities", proposer=ParaRealProposer,
    options=ParaRealOptions, fitters=(V12_FITTER,),
    stages=("draft block; top-K per slot (coarse G)", "features: scores, rank, position, embedding similarity",
            "R damped ridge residual updates", "argmax of corrected scores; verify"),
    why_inactive="its fitted residual correction never reordered a slot's top candidate.")
