"""compare.html: the comparison document (report.compare) as one self-contained page, every value escaped."""

from __future__ import annotations

import html

from .html import smoke_banner

CSS = """
body{font-family:system-ui,sans-serif;margin:0;background:#0f1419;color:#e6e6e6}
header{padding:18px 28px;background:#17202a;border-bottom:1px solid #2b3a4a} h1{margin:0;font-size:22px}
main{padding:8px 28px 40px;max-width:1200px}
table{border-collapse:collapse;width:100%;font-size:13px;margin:6px 0}
th,td{border-bottom:1px solid #2b3a4a;padding:5px 8px;text-align:right;vertical-align:top}
th:first-child,td:first-child,td.why{text-align:left} th{color:#9fb3c8;font-weight:600}
.ok{color:#5fd38d}.regression{color:#ff6b6b}.inconclusive,.not-judged{color:#f5c26b}
.muted{color:#8a9aab;font-size:12px}
.banner{background:#5a3a12;border:1px solid #f5c26b;color:#ffe3b0;padding:10px 14px;margin:12px 0;border-radius:6px}
"""
VERDICT_TEXT = {"no regression": "no regression", "regression": "REGRESSION found",
                "inconclusive": "inconclusive: no regression found, but some cases cannot rule one out"}


def _e(x) -> str:
    return html.escape(str(x), quote=True)


def _num(x, nd: int = 3) -> str:
    return f"{x:.{nd}f}" if isinstance(x, (int, float)) and not isinstance(x, bool) else "–"


def _interval(xs, nd: int = 3) -> str:
    if isinstance(xs, list) and len(xs) == 2:
        return f" <span class=muted>[{_num(xs[0], nd)}–{_num(xs[1], nd)}]</span>"
    return ""


def _speedup(side) -> str:
    if not isinstance(side, dict):
        return "missing"
    n = f"<span class=muted>n={_e(side.get('rounds'))}</span>"
    label = side.get("speedup_ci_label")
    iv = _interval(side.get("speedup_ci"))
    if iv and label:
        iv = f'<span title="{_e(label)}">{iv}</span>'
    return f"{_num(side.get('speedup'))}×{iv} {n}"


def _row(r: dict) -> str:
    ch = r.get("change") or {}
    ratio = ch.get("ratio")
    change = (f"{_num(100 * (ratio - 1), 1)} %" if isinstance(ratio, (int, float)) else "–")
    ci = ch.get("ratio_ci")
    if isinstance(ci, list) and len(ci) == 2:
        change += f" <span class=muted>[{_num(100 * (ci[0] - 1), 1)}–{_num(100 * (ci[1] - 1), 1)} %]</span>"
    if ch.get("statistic_text"):
        rounds = ch.get("rounds") or ["?", "?"]
        change += f"<br><span class=muted>{_e(ch['statistic_text'])}, {_e(rounds[0])} vs {_e(rounds[-1])} rounds</span>"
    b, n = r.get("base") or {}, r.get("new") or {}
    tau = f"{_num(b.get('tokens_per_target_call'), 2)} → {_num(n.get('tokens_per_target_call'), 2)}"
    verdict = str(r.get("verdict"))
    return (f"<tr><td>{_e(r.get('method'))}</td><td>{_e(r.get('width'))}</td><td>{_speedup(r.get('base'))}</td>"
            f"<td>{_speedup(r.get('new'))}</td><td>{change}</td><td>{tau}</td>"
            f"<td class={_e(verdict.replace(' ', '-'))}>{_e(verdict)}</td>"
            f"<td class=why>{_e('; '.join(r.get('reasons') or []))}</td></tr>")


def _counts(doc: dict) -> str:
    """How many cases got each verdict (report.gate.counts)."""
    c = doc.get("counts") if isinstance(doc.get("counts"), dict) else {}
    return ", ".join(f"{k}: {v}" for k, v in c.items()) or "no case counts"


def _smoke(doc: dict) -> str:
    """The smoke label when either run was a --smoke run (compare.py copies the flag)."""
    return smoke_banner({"settings": {"smoke": doc.get("smoke") is True}})


def render_compare(doc: dict) -> str:
    runs = doc.get("runs") or {}
    lines = "".join(f"<li>{_e((runs.get(k) or {}).get('line'))}</li>" for k in ("base", "new"))
    cfg = doc.get("config") or {}
    verdict = str(doc.get("verdict"))
    failures = doc.get("exactness_failures") or []
    exact = (f"<p class=regression>NEW diverged from greedy: {_e(', '.join(failures))}</p>" if failures else "")
    rows = "".join(_row(r) for r in doc.get("rows") or [] if isinstance(r, dict))
    return f"""<!doctype html><html lang=en><head><meta charset=utf-8><title>DFlash Mini Lab: compare</title>
<style>{CSS}</style></head><body><header><h1>{_e(doc.get('base'))} → {_e(doc.get('new'))}:
<span class={_e(verdict.replace(' ', '-'))} id=verdict>{_e(VERDICT_TEXT.get(verdict, verdict))}</span></h1>
<p class=muted id=verdict-counts>{_e(_counts(doc))} · gate exit code {_e(doc.get('exit_code'))} (0 no regression,
1 regression, 3 inconclusive; 2 bad input)</p>{_smoke(doc)}
</header><main><ul>{lines}</ul>{exact}
<p class=muted>Per case of BASE: the median paired speedup over greedy of each run with its order-statistic
interval of the median (hover for its exact coverage: below 6 rounds it is the min-max, not a 95 % interval) and its
rounds. The change is the one the gate judges, with the ranking's statistic where the case was ranked (its per-round
ratio against plain dflash at the ranking width, all its ranking rounds, the leg-order effect removed) and its
speedup over greedy otherwise: NEW/BASE − 1 of the case's median with a {_num(100 * cfg.get('confidence', 0.95), 0)} %
interval that holds jointly over every case compared (a bootstrap of each run's median from its own pooled
residuals, the same one the ranking uses). Tokens per target call are deterministic for one setting (both runs chose
the same settings, or the page would not exist). Verdicts are the gate's (<code>python -m dflash_core.report
gate</code>): a speed change is judged only with at least {_e(cfg.get('min_rounds'))} rounds in each run, and is a
regression only when its whole joint interval lies below 0 % and its median dropped by more than
{_num(100 * cfg.get('speedup_drop', 0), 0)} %, "no regression" only when the interval's lower end rules out a drop of
that size, and "inconclusive" when it cannot; two runs of one model are called a regression in at most
{_num(100 * (1 - cfg.get('confidence', 0.95)), 0)} % of pairs.</p>
<table id=compare-table><tr><th>method</th><th>width</th><th>BASE speedup</th><th>NEW speedup</th>
<th>change</th><th>tok/call</th><th>verdict</th><th>why</th></tr>{rows}</table></main></body></html>
"""
