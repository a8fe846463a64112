"""The report's finding as one sentence: what the run can tell, with its guarantee, its noise and the model it
was measured on (docs/design.md §10: every figure names its model). Both pages show it first."""

from __future__ import annotations

import math


def _pct(x) -> str:
    return f"{100 * x:.1f} %" if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else "?"


def model_label(doc: dict) -> str:
    """'<target name> (model <first 12 hex of the model hash>)': the hash of the target's and artifacts' SHA-256s
    that runs are pooled on (`runs[].model_sha256`)."""
    runs = doc.get("runs") or [{}]
    h = str(runs[0].get("model_sha256") or "")[:12] or "unknown"
    return f"{(doc.get('target') or {}).get('name') or 'an unnamed target'} (model {h})"


def _names(ids) -> str:
    return "{" + ", ".join(ids) + "}"


def _signed(x) -> str:
    return f"{100 * x:+.1f} %" if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else "?"


def _noise_clause(noise: dict, lead: dict | None, named: bool) -> str:
    """Whether the machine's noise could change the verdict: the noise figure, its upper limit, and what the verdict
    would be with the noise at that limit (`ranking.lead.noise_could_change`)."""
    sigma = noise.get("sigma")
    if sigma is None:
        return "the machine's noise was not measured"
    ci = noise.get("ci") or [None, None]
    fig = f"the machine's noise ({_pct(sigma)}, up to {_pct(ci[1])}"
    fig += f", above the {_pct(noise.get('threshold'))} of a quiet machine)" if noise.get("noisy") else ")"
    if not lead:
        return fig + " cannot be judged against a lead"
    could = bool(lead.get("noise_could_change"))
    if named:
        return fig + (" could undo it" if could else " could not change it")
    return fig + (" could turn it into a named winner" if could else " keeps it below a named winner")


def headline(doc: dict) -> str:
    """One sentence: on <target> (model <hash>), who leads at the ranking width, by how much over the next with the
    joint interval, at what confidence, whether it is named the fastest (its lead beyond the noise-widened
    resolution r) or which methods may still be the fastest, and whether the machine's noise could change that."""
    rk = doc.get("ranking") or {}
    noise = doc.get("noise") or {}
    on = f"On {model_label(doc)}"
    if not doc.get("exactness", {}).get("all_exact", True):
        return (f"{on}, the exactness gate FAILED ({', '.join(doc['exactness']['failures'])}): this run ranks "
                "nothing until every method reproduces greedy.")
    g1 = list(rk.get("g1") or [])
    if not g1:
        return f"{on}, this run measured no speculative method: it ranks nothing."
    conf = f"{100 * float(rk.get('confidence') or 0.95):.0f} %"
    r = _pct(rk.get("resolution_effective"))
    where = f"at width {rk['width']}" if rk.get("width") else "by their best speedups over greedy"
    lead = rk.get("lead") if isinstance(rk.get("lead"), dict) else None
    total = len(rk.get("rounds") or {}) or len(g1)
    if total < 2 or lead is None:
        return (f"{on}, {g1[0]} is the only exact speculative method ranked {where} (nothing to compare it with; "
                f"{_noise_clause(noise, None, False)}).")
    leader = rk.get("winner") or g1[0]
    ahead = (f"{leader} leads {where} by {_signed(lead.get('estimate'))} over the next ({lead.get('over')}; joint "
             f"{conf} interval {_signed(lead.get('lo'))} to {_signed(lead.get('hi'))})")
    if rk.get("winner"):
        verdict = (f"named the fastest exact method with {conf} confidence because that lead exceeds the "
                   f"noise-widened resolution {r}")
    elif len(g1) == 1:
        verdict = (f"the only method that may be the fastest with {conf} confidence, though its lead may be below "
                   f"the noise-widened resolution {r}")
    elif len(g1) == total:
        verdict = f"but with {conf} confidence any of the {total} methods may be the fastest (resolution {r})"
    else:
        verdict = f"but with {conf} confidence the fastest is one of {_names(g1)} (resolution {r})"
    sep = ", " if verdict.startswith("but") else ": "
    return f"{on}, {ahead}{sep}{verdict}; {_noise_clause(noise, lead, bool(rk.get('winner')))}."


# --- the answer: one line with the number, first on index.html and last in the terminal --------------------------

def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _size(n: int) -> str:
    """12_345_678 -> '12.3 M', 354_000_000 -> '354 M', 1_200_000_000 -> '1.2 B'."""
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            v = n / div
            return f"{v:.1f} {unit}" if v < 100 else f"{v:.0f} {unit}"
    return str(n)


def target_description(doc: dict) -> str:
    """The target named for what it is, from the run's own target record (runtime.target's identity and the
    checkpoint's metadata): 'mini, a 12.3 M-parameter LFM2 (6 layers) with a 2,048-token vocabulary, trained on code
    (400 source files)'. Facts a run did not record are left out, never guessed."""
    t = doc.get("target") if isinstance(doc.get("target"), dict) else {}
    name = str(t.get("name") or "an unnamed target")[:80]
    facts = []
    kind = str(t.get("model_type") or "")[:24].upper() or "model"
    n = _size(t["parameters"]) if _int(t.get("parameters")) and t["parameters"] > 0 else ""
    article = "an" if n.startswith(("8", "11 ", "11.", "18 ", "18.")) else "a"  # "an 11.9 M-parameter", "an 8 M-"
    size = f"{article} {n}-parameter {kind}" if n else ""
    if size and _int(t.get("num_layers")):
        size += f" ({t['num_layers']} layers)"
    if _int(t.get("vocab_size")):
        size = (size or f"a {kind}") + f" with a {t['vocab_size']:,}-token vocabulary"
    if size:
        facts.append(size)
    if isinstance(t.get("family"), str) and t["family"]:
        files = f" ({t['corpus_files']} source files)" if _int(t.get("corpus_files")) else ""
        facts.append(f"trained on {t['family'][:32]}{files}")
    return name + (", " + ", ".join(facts) if facts else "")


def answer_row(doc: dict) -> tuple[str | None, int | None, dict]:
    """(leader, the width it is quoted at, that row): each method's own width where the run records one
    (`settings.method_widths`), else the ranking width, else the leader's shown width."""
    leader = (doc.get("winner") or {}).get("method") or (doc.get("leader") or {}).get("method")
    m = (doc.get("methods") or {}).get(leader) if leader else None
    if not isinstance(m, dict):
        return None, None, {}
    own = ((doc.get("settings") or {}).get("method_widths") or {}).get(leader)
    rk = doc.get("ranking") or {}
    for w in ((own or {}).get("selected") if isinstance(own, dict) else None, rk.get("width"),
              (m.get("best") or {}).get("width")):
        if _int(w) and str(w) in (m.get("rows") or {}):
            return leader, w, m["rows"][str(w)]
    return leader, None, {}


def _interval(row: dict) -> str:
    ci = row.get("speedup_ci")
    if not (isinstance(ci, list) and len(ci) == 2 and all(_num(x) for x in ci)):
        return ""
    label = str(row.get("speedup_ci_label") or "")
    cover = "95 %" if label.startswith("95 %") else (f"{100 * row['speedup_ci_coverage']:.0f} %"
                                                    if _num(row.get("speedup_ci_coverage")) else "")
    return f" [{ci[0]:.2f}-{ci[1]:.2f}{', ' + cover if cover else ''}]"


def answer(doc: dict) -> str:
    """One line that answers the run: the leader's speedup over greedy with its interval, the width it ran at, the
    target named for what it is, and what the noise allows (the smallest lead the run can resolve)."""
    smoke = "SMOKE RUN, not a measurement: " if (doc.get("settings") or {}).get("smoke") is True else ""
    on = f"on {target_description(doc)}"
    if not (doc.get("exactness") or {}).get("all_exact", True):
        return f"{smoke}the exactness gate FAILED {on}: no speedup is quoted until every method reproduces greedy."
    leader, width, row = answer_row(doc)
    if leader is None or not _num(row.get("speedup")):
        return f"{smoke}no speculative method was ranked {on}."
    own = (((doc.get("settings") or {}).get("method_widths") or {}).get(leader) or {})
    own = isinstance(own, dict) and own.get("selected") == width
    where = (f"at its own width {width}" if own else f"at width {width}") if width is not None else ""
    noise = doc.get("noise") or {}
    r = (doc.get("ranking") or {}).get("resolution_effective")
    allows = (f"noise {_pct(noise['sigma'])} per round: leads under {_pct(r)} are not resolved"
              if _num(noise.get("sigma")) and _num(r) else "noise not measured: no lead is resolved")
    named = "the fastest" if (doc.get("winner") or {}).get("method") == leader else "leads"
    return (f"{smoke}{leader} {named}: {row['speedup']:.2f}x greedy{_interval(row)} {where} {on}; "
            f"{allows}.").replace("  ", " ")
