"""Runs of different models side by side, never pooled (docs/design.md §10): each model's own ranking, the
statements that hold on all of them, and Kendall's tau between their orders.

Why: another CPU kind trains another mini target, and a ranking measured on one model did not hold on another (an
Intel build put jump_mobs last where the AMD build put it first). A finding is a finding only on every model it
was measured on; this page says which those are, or that there are none.
"""

from __future__ import annotations

import html
import json
from itertools import combinations

from scipy import stats as sps

from .build import build_report, identity_hash, model_identity


def group_by_model(docs: list[dict], sources: list[str]) -> list[tuple[str, list[dict], list[str]]]:
    """(model hash, its runs, their sources) per model, in the order each model first appears."""
    groups: dict[str, tuple[list[dict], list[str]]] = {}
    for d, s in zip(docs, sources):
        g = groups.setdefault(identity_hash(model_identity(d)), ([], []))
        g[0].append(d)
        g[1].append(s)
    return [(h, ds, ss) for h, (ds, ss) in groups.items()]


def _summary(h: str, doc: dict) -> dict:
    rk, n = doc.get("ranking") or {}, doc.get("noise") or {}
    est = {mid: m["best"].get("vs_baseline") for mid, m in doc["methods"].items()
           if mid != "normal" and m["best"].get("vs_baseline") is not None}
    tgt = doc.get("target") or {}
    return {"model_sha256": h, "target": tgt.get("name"), "content_sha256": tgt.get("content_sha256"),
            "width": rk.get("width"), "g1": list(rk.get("g1") or []), "winner": rk.get("winner"),
            "below": {k: v["claim"] for k, v in (rk.get("below") or {}).items()},
            "resolution": rk.get("resolution_effective"), "noise": n.get("sigma"), "noisy": bool(n.get("noisy")),
            "all_exact": doc["exactness"]["all_exact"], "estimates": est, "headline": doc.get("headline"),
            "runs": len(doc.get("runs") or [])}


def statements(models: list[dict]) -> list[str]:
    """What holds on every model: exactness, membership of G1, "not the fastest", "slower than the fastest by
    more than r", the same single winner. Each model's claims hold with 95 % jointly; across k models, all of
    them hold together with at least 1 - k x 5 % (Bonferroni), which the page states."""
    if not models:
        return []
    out = []
    if all(m["all_exact"] for m in models):
        out.append("every method reproduced greedy exactly on every model")
    common = sorted(set.intersection(*(set(m["estimates"]) | set(m["g1"]) for m in models)))
    in_all = [k for k in common if all(k in m["g1"] for m in models)]
    if in_all:
        out.append(f"in G1 (may be the fastest) on every model: {', '.join(in_all)}")
    slower = [k for k in common if all(m["below"].get(k) == "slower than the fastest by more than r" for m in models)]
    if slower:
        out.append(f"slower than the fastest by more than r on every model: {', '.join(slower)}")
    never = [k for k in common if all(k in m["below"] for m in models) and k not in slower]
    if never:
        out.append(f"not the fastest on any model: {', '.join(never)}")
    wins = {m["winner"] for m in models}
    if len(wins) == 1 and None not in wins:
        out.append(f"the single winner on every model: {wins.pop()}")
    return out


def kendall(models: list[dict]) -> list[dict]:
    """Kendall's tau (scipy.stats.kendalltau, tau-b) between every two models' orders of the ratio against dflash,
    over the methods both ranked: 1 the same order, 0 unrelated, -1 reversed; with its p-value."""
    out = []
    for a, b in combinations(range(len(models)), 2):
        ea, eb = models[a]["estimates"], models[b]["estimates"]
        common = sorted(set(ea) & set(eb))
        if len(common) < 3:
            out.append({"a": a, "b": b, "methods": len(common), "tau": None, "p_value": None})
            continue
        res = sps.kendalltau([ea[k] for k in common], [eb[k] for k in common])
        out.append({"a": a, "b": b, "methods": len(common), "tau": float(res.statistic),
                    "p_value": float(res.pvalue)})
    return out


def compare_models(docs: list[dict], sources: list[str]) -> tuple[list[dict], dict]:
    """(one canonical document per model, the comparison): each model's runs pooled alone, then side by side."""
    reports, models = [], []
    for h, ds, ss in group_by_model(docs, sources):
        doc = build_report(ds, ss)
        reports.append(doc)
        models.append(_summary(h, doc))
    held = statements(models)
    cmp = {"schema": "dflash-mini-lab/models", "models": models, "statements": held, "kendall": kendall(models),
           "joint_confidence": max(0.0, 1.0 - 0.05 * len(models)),
           "summary": (f"{len(models)} models; holds on all of them: " + "; ".join(held)) if held else
           f"{len(models)} models; no ranking statement holds on all of them"}
    return reports, cmp


def _e(x) -> str:
    return html.escape(str(x), quote=True)


def _num(x, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def _model_row(m: dict) -> str:
    noise = "–" if m["noise"] is None else f"{100 * m['noise']:.1f} %" + (" (noisy)" if m["noisy"] else "")
    return (f"<tr><td><code>{_e(m['model_sha256'][:12])}</code></td><td>{_e(m['target'])}</td>"
            f"<td><code>{_e(str(m['content_sha256'] or '')[:12])}</code></td><td>{_e(m['width'])}</td>"
            f"<td>{_e(', '.join(m['g1']))}</td><td>{_e(m['winner'] or '–')}</td><td>{noise}</td>"
            f"<td>{_e(m['runs'])}</td></tr>")


def _tau_row(cmp: dict, k: dict) -> str:
    a, b = (cmp["models"][i]["model_sha256"][:12] for i in (k["a"], k["b"]))
    return (f"<tr><td><code>{_e(a)}</code> vs <code>{_e(b)}</code></td><td>{_e(k['methods'])}</td>"
            f"<td>{_num(k['tau'], '.2f')}</td><td>{_num(k['p_value'], '.3f')}</td></tr>")


def render_models(cmp: dict) -> str:
    """A self-contained page: each model's ranking, what holds on all, Kendall's tau between every two."""
    rows = "".join(_model_row(m) for m in cmp["models"])
    held = "".join(f"<li>{_e(s)}</li>" for s in cmp["statements"]) or "<li>none</li>"
    taus = "".join(_tau_row(cmp, k) for k in cmp["kendall"])
    payload = json.dumps(cmp, sort_keys=True).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return ("<!doctype html><html lang=en><head><meta charset=utf-8><title>DFlash Mini Lab: models side by side"
            "</title><style>body{font-family:system-ui,sans-serif;margin:24px;background:#0f1419;color:#e6e6e6}"
            "table{border-collapse:collapse}th,td{border-bottom:1px solid #2b3a4a;padding:5px 8px;text-align:left}"
            "</style></head><body><h1>Models side by side (never pooled)</h1>"
            f"<p id=summary>{_e(cmp['summary'])}</p><table id=models-table><tr><th>model</th><th>target</th>"
            "<th>artifact key</th><th>ranking width</th><th>G1</th><th>winner</th><th>noise</th><th>runs</th></tr>"
            f"{rows}</table><h2>Holds on every model</h2><ul id=statements>{held}</ul><p>Each model's claims hold "
            f"jointly with 95 % confidence; all of them together with at least {100 * cmp['joint_confidence']:.0f} "
            "% (Bonferroni over the models).</p><h2>Kendall's tau between the models' orders</h2><table id=kendall>"
            "<tr><th>models</th><th>methods</th><th>tau</th><th>p-value</th></tr>"
            f"{taus}</table><script id=payload type=application/json>{payload}</script></body></html>")
