"""Self-contained HTML pages (no network): `report.html` (tables, charts, calibration, provenance) and
`index.html` (headline + an animated mechanism explorer replaying block traces recorded in the run).
Every number shown is read from the canonical benchmark.json document embedded in the page.
"""

from __future__ import annotations

import html
import json
import re

from . import plots
from .headline import answer, headline

CSS = """
body{font-family:system-ui,sans-serif;margin:0;background:#0f1419;color:#e6e6e6}
header{padding:18px 28px;background:#17202a;border-bottom:1px solid #2b3a4a}
h1{margin:0;font-size:22px} h2{font-size:17px;margin:28px 0 8px}
main{padding:8px 28px 40px;max-width:1200px}
table{border-collapse:collapse;width:100%;font-size:13px;margin:6px 0}
th,td{border-bottom:1px solid #2b3a4a;padding:5px 8px;text-align:right}
th:first-child,td:first-child{text-align:left} th{color:#9fb3c8;font-weight:600}
.ok{color:#5fd38d}.bad{color:#ff6b6b}.tie{color:#f5c26b}.muted{color:#8a9aab;font-size:12px}
.kpi{display:flex;gap:14px;flex-wrap:wrap}.kpi div{background:#17202a;border:1px solid #2b3a4a;
border-radius:8px;padding:10px 14px;min-width:150px}.kpi b{display:block;font-size:20px}
.bar{height:12px;background:#3d7eff;display:inline-block;vertical-align:middle}
.bar.win{background:#5fd38d}.bar.lose{background:#ff8c6b}
.chip{display:inline-block;min-width:46px;padding:6px 8px;margin:3px;border-radius:6px;background:#243447;
text-align:center;font-family:monospace;white-space:pre;transition:background .3s}
.chip.acc{background:#1f6f43}.chip.rej{background:#7a2e2e}.chip.corr{background:#6b5a1f}.chip.bonus{background:#1f4f7a}
select,button{background:#243447;color:#e6e6e6;border:1px solid #2b3a4a;border-radius:6px;padding:4px 8px}
a{color:#7fb2ff}
.ctx{font-family:monospace;white-space:pre-wrap;color:#9fb3c8;margin:6px 3px}
.banner{background:#5a3a12;border:1px solid #f5c26b;color:#ffe3b0;padding:10px 14px;margin:12px 0;border-radius:6px}
.cols>input:not(:checked)~table .more{display:none} th[title]{cursor:help;text-decoration:underline dotted #4a5a6a}
.cols td{white-space:nowrap} .kpi div{max-width:620px} .kpi b.long{font-size:15px}
.figs{display:flex;flex-wrap:wrap;gap:18px;align-items:flex-start} figure{margin:0}
figcaption{max-width:560px} svg.plot .axis-label{fill:#9fb3c8} svg.plot .panel-title{fill:#9fb3c8;font-weight:600}
svg.plot g.series:hover path{stroke-width:3} svg.plot g.key text{fill:#c8d3de}
.prompt{font-family:monospace;white-space:pre-wrap;color:#e6e6e6;background:#17202a;border:1px solid #2b3a4a;
border-radius:6px;padding:6px 10px;margin:6px 3px;max-height:9em;overflow:auto}
.headline{font-size:14px;margin:6px 0 4px;line-height:1.4;color:#c8d3de}
.answer{font-size:19px;font-weight:600;margin:14px 0 4px;line-height:1.4}
"""


def _payload(doc: dict) -> str:
    """The document as JSON safe inside <script>: `<`, `>` and `&` as JSON unicode escapes, so no token text (`</script>`,
    `<!--<script>`) can end the element or open a comment that swallows the page's own script."""
    raw = json.dumps(doc, sort_keys=True, allow_nan=False)
    return raw.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _e(x) -> str:
    """Every value from the saved JSON goes through here (or _f) before it reaches the page."""
    return html.escape(str(x), quote=True)


def _f(x, nd=3):
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return f"{x:.{nd}f}"
    return "–" if x is None else _e(x)


def _run_info(doc: dict) -> str:
    """Machine, date and commit of each merged run, for the page header."""
    parts = []
    for r in doc.get("runs") or []:
        mach = r.get("machine") or {}
        commit = str(r.get("commit") or "no commit")[:12] + (" (dirty)" if r.get("dirty") else "")
        parts.append(f"{_e(r.get('datetime') or '?')} · commit {_e(commit)} · {_e(mach.get('node') or '?')} "
                     f"({_e(r.get('cpu') or mach.get('machine') or '?')}, {_e(mach.get('system') or '?')})")
    n = len(parts)
    return (f"<div class=muted id=run-info>{'run' if n == 1 else f'{n} pooled runs'}: " + " | ".join(parts) + "</div>")


def kernels_note(tgt: dict) -> str:
    """The target's linear-layer path, and for `tuned` which layout ran at which row counts (a saved run is hostile:
    anything malformed shows the path alone)."""
    path = str(tgt.get("kernels") or "eager")[:16]
    lay = tgt.get("kernel_layouts")
    rows = lay.get("rows") if isinstance(lay, dict) else None
    choice = lay.get("choice") if isinstance(lay, dict) else None
    if not (isinstance(rows, list) and isinstance(choice, list) and 0 < len(rows) == len(choice) <= 64
            and all(isinstance(r, int) and not isinstance(r, bool) for r in rows)
            and all(isinstance(c, str) for c in choice)):
        return path
    spans, start = [], 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or choice[i] != choice[start]:
            hi = f"-{rows[i] - 1}" if i < len(rows) and rows[i] - 1 > rows[start] else ("+" if i == len(rows) else "")
            spans.append(f"{choice[start][:8]} at {rows[start]}{hi} row{'' if hi == '' and rows[start] == 1 else 's'}")
            start = i
    return f"{path} ({', '.join(spans)})"


def _model_hashes(doc: dict) -> str:
    """Which model was measured, in full: the target's content and weights SHA-256 and every artifact's SHA-256
    (from benchmark.json's target and provenance), so two reports can be checked to show the same model."""
    tgt = doc.get("target") or {}
    files = ((doc.get("provenance") or {}).get("artifacts") or {}).get("files") or {}
    rows = "".join(f"<li><code>{_e(name)}</code> <code>{_e(meta.get('sha256') if isinstance(meta, dict) else meta)}"
                   "</code></li>" for name, meta in sorted(files.items()))
    return (f"<div class=muted id=model-hashes>target content sha256 <code>{_e(tgt.get('content_sha256') or '?')}</code>"
            f" · weights sha256 <code>{_e(tgt.get('weights_sha256') or '?')}</code>"
            f"<details><summary>{len(files)} artifacts (sha256)</summary><ul>{rows}</ul></details></div>")


def _width_label(b: dict) -> str:
    """The width and, in a word, how it was chosen (the full phrase in the tooltip)."""
    sel = b.get("selection")
    tag = {"calibration": ("calibrated", "chosen on calibration prompts (--tune)"),
           "post-hoc": ("post-hoc", "post-hoc: the maximum of the benchmark medians")}.get(sel)
    return f"{_e(b['width'])}" + (f" <span class=muted title=\"{_e(tag[1])}\">{_e(tag[0])}</span>" if tag else "")


def _pct(x) -> str:
    return _f(100 * x, 1) + " %" if isinstance(x, (int, float)) and not isinstance(x, bool) else "–"


def _aa_header(doc: dict) -> str:
    """The run's noise figure for the page header (report.ranking), the ranking's own A/A (dflash against dflash)
    and the position effect of the leg order."""
    n = doc.get("noise") or {}
    if n.get("sigma") is None:
        return "<span id=noise-figure>noise figure: not measured (no ranked case has two rounds)</span>"
    ci = n.get("ci") or [None, None]
    aa = n.get("aa") or {}
    aa_text = (f" · A/A dflash vs dflash {_f(aa.get('median'))}× [{_f(aa.get('lo'))}–{_f(aa.get('hi'))}] "
               f"({_e(aa.get('label'))})" if aa else "")
    pe = doc.get("position_effect") or {}
    pe_text = (f" · position effect (first leg / second leg, rows drafting like dflash: {_e(', '.join(pe['rows']))}"
               f"{'' if pe.get('randomised') else '; fixed order'}) {_f(pe.get('median'))} [{_f(pe.get('lo'))}–"
               f"{_f(pe.get('hi'))}]" + ("" if pe.get("adjustment") is None else
                                         f", removed from every ranked round ({_f(pe['adjustment'])} over all cases)")
               if pe else "")
    return (f"<span id=noise-figure>noise figure {_pct(n['sigma'])} [{_pct(ci[0])}–{_pct(ci[1])}] (pooled robust SD "
            f"of per-round log ratios, {_e(n.get('cases'))} cases; threshold {_pct(n.get('threshold'))})"
            f"{aa_text}{pe_text}</span>")


def _width_choice_note(st: dict) -> str:
    """How `--bench-widths auto` chose the widths (bench.auto_widths), or nothing when they were given."""
    wc = st.get("width_choice")
    if not isinstance(wc, dict) or not isinstance(wc.get("table"), list):
        return ""
    curve = ", ".join(f"w{r.get('width')} {_f(r.get('model_speedup'), 2)}×" for r in wc["table"]
                      if isinstance(r, dict))
    return (f" (auto: {_e(wc.get('rule', ''))}; dflash's cost-model speedup on calibration prompts over the "
            f"measured verify-cost curve: {_e(curve)})")


def _size_note(st: dict) -> str:
    """How the matrix was sized to its budget (bench.budget), or nothing for a size not chosen by one."""
    plan = st.get("size_plan")
    ch = plan.get("chosen") if isinstance(plan, dict) else None
    if not isinstance(ch, dict):
        return ""
    if plan.get("reused_from"):
        return f" Size reused from {_e(plan['reused_from'])} (--calibration-from)."
    tried = plan.get("tried") if isinstance(plan.get("tried"), list) else []
    proj = tried[-1].get("projected_seconds") if tried and isinstance(tried[-1], dict) else None
    budget = plan.get("budget_seconds")
    minutes = [_f(x / 60 if isinstance(x, (int, float)) and not isinstance(x, bool) else None, 1)
               for x in (proj, budget)]
    size = f"{_e(ch.get('prompt_limit'))} prompts × {_e(ch.get('tokens'))} tokens × {_e(ch.get('rounds'))} base rounds"
    if plan.get("fits"):
        return (f" Matrix size: {size}, the largest size whose projection from the calibration's measured costs "
                f"({minutes[0]} min) fits the {minutes[1]} min left of --bench-budget.")
    return (f" Matrix size: {size}, the smallest size; its projection ({minutes[0]} min) is over the {minutes[1]} "
            "min left of --bench-budget.")


def _schedule_note(st: dict) -> str:
    sch = st.get("base_rounds_schedule")
    if not isinstance(sch, dict):
        return ""
    return (f"; each case's first round ran with the case, the other {_e(sch.get('passes'))} in round-robin "
            f"passes over all {_e(sch.get('cases'))} cases (seeded order), so every case sampled the whole session")


def _coverage(label) -> str:
    """An interval's label in a table cell: its coverage alone ("95 %", "75 %"), the whole label as a tooltip, so
    eight columns fit a laptop screen ("min-max of 3 rounds (covers the median with 75.0 %)" did not)."""
    text = str(label or "")
    if not text:
        return ""
    pct = re.findall(r"([0-9]+(?:\.[0-9]+)?) %", text)
    short = "95 %" if text.startswith("95 %") else (f"{float(pct[-1]):g} %" if pct else text[:12])
    return f'<span class=muted title="{_e(text)}">{_e(short)}</span>'


def _vs_cell(b: dict) -> str:
    ci = b.get("vs_baseline_ci")
    if b.get("vs_baseline") is None or not isinstance(ci, list):
        return "–"
    return f"{_f(b['vs_baseline'])}× [{_f(ci[0])}–{_f(ci[1])}] {_coverage(b.get('vs_baseline_label'))}"


def _ranking_note(doc: dict) -> str:
    """What the ranking compares (benchmark.json `ranking`)."""
    rk = doc.get("ranking") or {}
    if rk.get("statistic") == "vs_baseline":
        return (f"Ranked at width {_e(rk.get('width'))} (chosen on calibration prompts before any round) by each "
                f"method's speed against plain {_e(rk.get('baseline'))} at that width, timed in the same rounds, a "
                "number of rounds fixed before the run, the legs of each round in a seeded random order; for "
                f"{_e(rk.get('baseline'))} itself the ratio is dflash against dflash (the ranking's own A/A).")
    return "Ranked by each method's best speedup over greedy (this run has no per-round dflash comparison)."


def _group_rule(doc: dict) -> str:
    """How the groups were formed and what they guarantee (benchmark.json `ranking`)."""
    rk = doc.get("ranking") or {}
    return (f"{rk.get('guarantee') or ''} G1: the methods multiple comparisons with the best (MCB) cannot rule out "
            f"as the fastest, within the resolution r = {_pct(rk.get('resolution_effective'))} (the larger of "
            f"--bench-resolution {_pct(rk.get('resolution'))} and 2.5 x the noise figure / sqrt(rounds)). "
            f"G2: {rk.get('not_claimed') or ''}")


def smoke_banner(doc: dict) -> str:
    """The label of a `--smoke` run on every page (1 prompt, 8 tokens, 1 round: it checks that the pipeline runs, it
    measures nothing worth quoting); '' for a real run."""
    if (doc.get("settings") or {}).get("smoke") is not True:
        return ""
    return ("<div class=banner id=smoke-banner><b>Smoke run.</b> --smoke: one prompt, 8 tokens, one round: this "
            "checks that the pipeline runs end to end; its figures are not measurements.</div>")


def noise_banner(doc: dict) -> str:
    """The banner shown when the run's noise figure is above its threshold, else ''."""
    n = doc.get("noise") or {}
    if not n.get("noisy"):
        return ""
    return (f"<div class=banner id=noise-banner><b>Noisy machine.</b> the ranking rounds' noise figure is "
            f"{_pct(n.get('sigma'))} (threshold {_pct(n.get('threshold'))}): the resolution widened to "
            f"{_pct((doc.get('ranking') or {}).get('resolution_effective'))}, so only a lead beyond it names a winner.</div>")


def headline_html(doc: dict) -> str:
    """The answer in one line (report.headline.answer: the number), then the finding's detail in one sentence and
    what the run lacks, first on both pages."""
    lim = doc.get("limitations") or []
    more = ("<ul class=muted id=limitations>" + "".join(f"<li>{_e(x)}</li>" for x in lim) + "</ul>") if lim else ""
    ans = doc.get("answer") if isinstance(doc.get("answer"), str) else answer(doc)
    return (f"<p class=answer id=answer>{_e(ans)}</p>"
            f"<p class=headline id=headline>{_e(doc.get('headline') or headline(doc))}</p>{more}")


def activity_label(m: dict) -> str:
    """'inactive here' (with why), 'baseline', 'no draft' or '' for an active method (or a run without activity)."""
    a = m.get("activity") or {}
    st = a.get("status")
    if st == "inactive":
        return "inactive here: " + str(a.get("why") or "its draft never differed from dflash's in this run.")
    return {"baseline": "baseline", "no draft": "no draft"}.get(st, "")


def _activity_summary(m: dict, b: dict) -> str:
    """One cell: 'baseline', 'no draft', 'inactive here: why', or the share of rounds whose draft differed from
    dflash's and the net accepted drafts that gained (the detail columns hold positions and gained/lost)."""
    label = activity_label(m)
    if label.startswith("inactive"):  # the registry's sentence on why, as a tooltip: it would widen every row
        return f'<td class=activity><span class="muted inactive" title="{_e(label)}">inactive here</span></td>'
    a = b.get("activity")
    if label or not isinstance(a, dict):
        return f"<td class=activity>{_e(label) or '–'}</td>"
    net = a.get("net", 0)
    return (f"<td class=activity>{_pct(a.get('rounds_differ_share'))} of rounds differ · net "
            f"{'+' if isinstance(net, int) and net > 0 else ''}{_e(net)}</td>")


def _activity_detail(b: dict) -> str:
    """Positions differ % and net accepted drafts (+gained −lost) at the width shown, vs dflash (detail columns)."""
    a = b.get("activity")
    if not isinstance(a, dict):
        return "<td class=more>–</td><td class=more>–</td>"
    net = a.get("net", 0)
    return (f"<td class=more>{_pct(a.get('positions_differ_share'))}</td>"
            f"<td class=more>{'+' if isinstance(net, int) and net > 0 else ''}{_e(net)} <span class=muted>"
            f"(+{_e(a.get('gained'))} −{_e(a.get('lost'))})</span></td>")


# The ranking table's columns: (header of one or two words, tooltip, shown by default). The first eight are the
# table a reader needs to rank the methods; the rest are behind the table's "all columns" toggle.
COLUMNS = (
    ("method", "index and id of the method in the registry", True),
    ("group", "rank group: G1 = the leader and every method this run cannot tell apart from it; G2 = every "
              "method resolved below G1, not ordered further (see the note under the table)", True),
    ("width", "the verify width shown for this method; post-hoc = the maximum of the benchmark medians, "
              "chosen on calibration = picked by --tune on calibration prompts", True),
    ("speedup", "speedup over normal (greedy), paired per round: median and the interval of the median from "
                "order statistics, labelled with its exact coverage (95 % only from 6 rounds); the bar is the "
                "median", True),
    ("vs dflash", "speed against plain dflash at the ranking width, paired per round over the fixed ranking "
                  "rounds: median [interval]; what the selection compares", True),
    ("tok/call", "tokens per target call (τ): committed tokens per target forward, correction/bonus included, the "
                 "prefill call counted (without it: vLLM's acceptance length, in the peer table)", True),
    ("activity", "how often the method's draft differed from plain dflash's at the same context, and the net "
                 "accepted drafts that gained; inactive here = it never differed", True),
    ("exact", "token-exact against greedy on every prompt (ties under the float tie certificate are shown)", True),
    ("tok/s", "tokens per second, median over rounds, not paired (each method's own rounds)", False),
    ("Q1–Q3", "interquartile range of the paired per-round speedups", False),
    ("model", "cost-model speedup: the case's own rounds priced with the loop's own component timings", False),
    ("vs model", "measured / model speedup; flagged outside [0.9, 1.1] when the noise figure is at most its "
                 "threshold (a quiet machine)", False),
    ("accept", "acceptance of verified drafts (accepted / proposed)", False),
    ("of drafted", "acceptance of drafted tokens (accepted / drafted): lower than accept for methods that trim "
                   "before verifying (ACT, DSpark)", False),
    ("rounds", "paired rounds against normal / against dflash (the ranking width's fixed ranking rounds add "
               "comparison-only rounds)", False),
    ("positions", "share of draft positions where the method's draft differed from dflash's", False),
    ("net drafts", "accepted drafts the differences from dflash gained minus those they lost (+gained −lost)",
     False),
    ("guidance", "candidate scores evaluated beyond the drafter's argmax", False),
    ("overhead", "loop overhead: share of wall time outside the target, the drafter and selection", False),
    ("claim", "what the selection claims at its joint confidence: may be the fastest (in G1), or not the fastest "
              "with the lower bound of its gap to the fastest", False),
    ("Δ tok/call", "tokens per target call minus dflash's, from the two separate decodes at the width shown (the "
                   "net drafts column counts at the method's own contexts and can disagree in sign)", False),
)


def _ci_text(ci) -> str:
    return f"[{_f(ci[0])}–{_f(ci[1])}]" if isinstance(ci, list) and len(ci) == 2 else ""


def ranked_statistic(doc: dict, b: dict) -> tuple[float, list | None, str]:
    """The statistic a method is ordered by, with its interval and its name: the median ratio against dflash at the
    ranking width where the run ranked by it, else the speedup over greedy. The table's order, its bars and the
    chart all read this one function, so a bar never shows another statistic than the order it sits in."""
    est = ((doc.get("ranking") or {}).get("rounds") or {}) and b.get("vs_baseline")
    if isinstance(est, (int, float)) and not isinstance(est, bool):
        return float(est), b.get("vs_baseline_ci"), "vs_baseline"
    return float(b["speedup"]), b.get("speedup_ci"), "speedup"


def ranking_order(doc: dict, kv) -> tuple:
    """Sort key of the ranking table and chart: rank group, then the ranking's own statistic (ranked_statistic);
    normal, the baseline of every speedup, last."""
    mid, m = kv
    b = m["best"]
    g = b.get("rank_group")
    return (mid == "normal", g if isinstance(g, int) else 10**6, -ranked_statistic(doc, b)[0], mid)


def _bar(value: float, top: float, base: float = 1.0) -> str:
    """A bar of `value` on a scale to `top`; green at or above `base` (1x: greedy, or dflash for the ratio)."""
    cls = "win" if value >= base else "lose"
    return f'<span class="bar {cls}" style="width:{int(80 * max(0.0, value) / top)}px"></span>'


def _bar_cell(doc: dict, b: dict, statistic: str, top: float) -> str:
    """The bar for a cell of the column that holds the ranking's statistic (ranked_statistic), else nothing."""
    value, _, name = ranked_statistic(doc, b)
    return _bar(value, top) + " " if name == statistic else ""


def _methods_table(doc: dict, table_id: str = "methods-table") -> str:
    """The ranking: eight columns by default (a reader ranks methods with these), the other eleven behind a CSS-only
    toggle (a checkbox; no script), every header one or two words with its full meaning in a tooltip."""
    rows = []
    win = (doc.get("winner") or {}).get("method")
    mx = max([ranked_statistic(doc, m["best"])[0] for mid, m in doc["methods"].items() if mid != "normal"] + [1.0])

    for mid, m in sorted(doc["methods"].items(), key=lambda kv: ranking_order(doc, kv)):
        b = m["best"]
        r = m["rows"][str(b["width"])]
        grp = b.get("rank_group")
        ex = '<span class="ok">exact</span>' if m["exact"] else '<span class="bad">DIVERGED</span>'
        ties = (r.get("verdicts") or {}).get("tie", 0)
        if ties:
            ex += f' <span class="tie">({_e(ties)} tie)</span>'
        idx = m.get("index")
        rounds = (f"{_e(r.get('rounds', '–'))}"
                  f"{'' if r.get('compared_rounds') in (None, r.get('rounds')) else ' / ' + _e(r['compared_rounds'])}")
        rows.append(
            f"<tr{' class=winner' if mid == win else ''} data-method=\"{_e(mid)}\">"
            f"<td>{_e(f'{idx:02d}' if isinstance(idx, int) else idx)} {_e(mid)}</td>"
            f"<td class=group>{'–' if grp is None else 'G' + _e(grp)}</td>"
            f"<td>{_width_label(b)}</td>"
            + (f"<td class=speedup title=\"normal timed against itself in the same rounds: the A/A figure (the "
               f"noise plot), not a speedup\">A/A {_f(b['speedup'])}× <span class=ci>"
               f"{_ci_text(b.get('speedup_ci'))} {_coverage(b.get('speedup_ci_label'))}</span></td>"
               if mid == "normal" else
               f"<td class=speedup>{_bar_cell(doc, b, 'speedup', mx)}{_f(b['speedup'])}× <span class=ci>"
               f"{_ci_text(b.get('speedup_ci'))} {_coverage(b.get('speedup_ci_label'))}</span></td>")
            + f"<td class=vs>{'' if mid == 'normal' else _bar_cell(doc, b, 'vs_baseline', mx)}{_vs_cell(b)}</td>"
            f"<td>{_f(b['tokens_per_target_call'], 2)}</td>"
            f"{_activity_summary(m, b)}<td>{ex}</td>"
            f"<td class=more>{_f(b['tokens_per_second'], 1)}</td>"
            f"<td class=more>{_f(b.get('speedup_q1'), 2)}–{_f(b.get('speedup_q3'), 2)}</td>"
            f"<td class=\"more model\">{_x(b.get('model_speedup'))}</td>{_ratio_cell(b)}"
            f"<td class=more>{_f(100 * b['acceptance_rate'], 1)}%</td>"
            f"<td class=more>{_f(100 * r.get('acceptance_rate_drafted', b['acceptance_rate']), 1)}%</td>"
            f"<td class=\"more rounds\">{rounds}</td>"
            f"{_activity_detail(b)}<td class=more>{_f(r.get('guidance_work', 0), 0)}</td>"
            f"<td class=more>{_f(100 * r.get('overhead_fraction', 0), 1)}%</td>{_claim_cell(b)}{_dtau_cell(b)}</tr>")
    head = "".join(f"<th title=\"{_e(tip)}\"{'' if shown else ' class=more'}>{_e(name)}</th>"
                   for name, tip, shown in COLUMNS)
    toggle = f"{table_id}-all"
    return (f"<div class=cols><input type=checkbox id={toggle}> <label for={toggle} class=muted>show all "
            f"{len(COLUMNS)} columns (rates, rounds, cost model, activity detail)</label>"
            f"<table id={table_id}><tr>{head}</tr>" + "".join(rows) + "</table></div>"
            "<details class=legend><summary class=muted>How to read this table</summary><p class=muted>"
            + "".join(f"<b>{_e(name)}</b>: {_e(tip)}. " for name, tip, _ in COLUMNS) + "</p>"
            f"<p class=muted>{_ranking_note(doc)} "
            f"Rank group: {_e(_group_rule(doc))} A single winner is named only when the selection names one (and the "
            "noise figure is below its threshold). The cost-model speedup is deterministic: "
            "the case's own rounds priced with the loop's own timings (the target's verify cost per width fitted over "
            "every case's in-loop verify forwards, the drafter and selection per block); on a quiet machine (the "
            "noise figure at most its threshold) a measured/model ratio outside [0.9, 1.1] is flagged as "
            "unexplained overhead. Activity: at each round of an untimed "
            "decode, plain dflash drafted at the same context; a round or position differs when the drafts do, and the "
            "accepted-drafts column counts what the differences gained minus what they lost at the method's own "
            "contexts, which can disagree in sign with tau − dflash tau (the two decodes reach different contexts). "
            "A method whose draft never differed "
            "is labelled inactive here: its row measures dflash plus its overhead, not a distinct result. Accept of "
            "drafted counts trimmed drafts too (ACT, DSpark trim before verifying); "
            "tok/s pools each method's own rounds; the speedup divides each round by the normal run "
            "made right before it, so the two columns can rank methods differently. A width marked post-hoc is the "
            "maximum of the benchmark medians (an optimistic choice made on the data it is reported on); "
            "<code>--tune</code> chooses widths on calibration prompts instead.</p></details>")


def _dtau_cell(b: dict) -> str:
    """tau − dflash's tau from the two separate decodes (report.build), signed; – where the run has none."""
    d = b.get("tau_minus_dflash")
    return f"<td class=\"more dtau\">{'–' if d is None else ('+' if d > 0 else '') + _f(d, 2)}</td>"


def _claim_cell(b: dict) -> str:
    """What the selection claims of a method: in G1 (may be the fastest), or not the fastest, with the lower
    bound of its gap to the fastest when it is listed (report.ranking)."""
    claim, gap = b.get("claim"), b.get("gap_lo")
    if claim is None:
        return "<td class=\"more claim\">–</td>"
    if claim == "in G1":
        return "<td class=\"more claim\">may be the fastest</td>"
    return f"<td class=\"more claim\">{_e(claim)}" + (f" (≥ {_pct(gap)} slower)" if gap else "") + "</td>"


def _x(v, nd=3) -> str:
    """A speedup with its ×, or – where the run has none (saved before the cost model)."""
    return "–" if v is None else f"{_f(v, nd)}×"


def _ratio_cell(b: dict) -> str:
    """measured / model, flagged when the report marked it unexplained overhead (build.flag_overhead)."""
    flag = ' <span class="bad flag">unexplained overhead</span>' if b.get("unexplained_overhead") else ""
    return f"<td class=\"more ratio\">{_f(b.get('measured_over_model'), 2)}{flag}</td>"


def _speedup_chart(doc: dict) -> str:
    """Inline SVG: each method's ranking statistic (ranked_statistic: its ratio against dflash at the ranking width
    where the run ranked by it, else its speedup over greedy) with its interval and rank group, in the ranking's
    order, and the 1x line (dflash, or normal): the bars, the order and the groups from one statistic."""
    ms = [kv for kv in sorted(doc["methods"].items(), key=lambda kv: ranking_order(doc, kv)) if kv[0] != "normal"]
    if not ms:
        return ""
    stat = {mid: ranked_statistic(doc, m["best"]) for mid, m in ms}
    name = next(iter(stat.values()))[2]
    ci = {mid: (v[1] if isinstance(v[1], list) and len(v[1]) == 2 else [v[0], v[0]]) for mid, v in stat.items()}
    hi = max([max(stat[mid][0], ci[mid][1]) for mid, _ in ms] + [1.0]) * 1.08
    row, left, width = 18, 270, 520  # left: room for "<id> w<w> G<n> (inactive here)"
    x = lambda v: left + width * v / hi  # noqa: E731
    parts = [f'<line x1="{x(1):.1f}" y1="0" x2="{x(1):.1f}" y2="{row * len(ms)}" stroke="#8a9aab" '
             'stroke-dasharray="3,3"/>']
    rk = doc.get("ranking") or {}
    for i, (mid, m) in enumerate(ms):
        b, y = m["best"], i * row
        v = stat[mid][0]
        w = rk.get("width") if name == "vs_baseline" else b["width"]
        col = "#5fd38d" if v >= 1 else "#ff8c6b"
        lo, up = ci[mid]
        grp = "" if b.get("rank_group") is None else f" G{_e(b['rank_group'])}"
        if activity_label(m).startswith("inactive"):
            grp += " (inactive here)"
        parts.append(f'<text x="{left - 6}" y="{y + 13}" text-anchor="end">{_e(mid)} w{_e(w)}{grp}</text>'
                     f'<rect x="{left}" y="{y + 3}" width="{max(0.0, x(v) - left):.1f}" height="12" '
                     f'fill="{col}"><title>{_e(mid)}: {_f(v)}x, interval {_f(lo)}–{_f(up)}{grp}</title></rect>'
                     f'<line class=ci x1="{x(max(lo, 0)):.1f}" y1="{y + 9}" x2="{x(up):.1f}" y2="{y + 9}" '
                     f'stroke="#e6e6e6"/><text x="{x(up) + 6:.1f}" y="{y + 13}">{_f(v, 2)}×</text>')
    h = row * len(ms) + 4
    what = (f"median ratio against plain {_e(rk.get('baseline') or 'dflash')} at the ranking width {_e(rk.get('width'))} "
            "(paired per round over the ranking rounds: the statistic the order and the groups come from); dashed: "
            "1× (as fast as dflash)" if name == "vs_baseline" else
            "median paired speedup over greedy at the width shown; dashed: 1× (normal)")
    return (f'<svg id=speedup-chart data-statistic="{name}" role=img aria-label="ranking statistic per method" '
            f'width="{left + width + 70}" height="{h}" '
            f'font-size="11" fill="#e6e6e6" xmlns="http://www.w3.org/2000/svg">{"".join(parts)}</svg>'
            f'<p class=muted>bar: {what}; whisker: its order-statistic interval of '
            'the median (95 % from 6 rounds; below that the min-max, with its coverage in the table); G<i>n</i>: rank '
            'group (see the methods table\'s note); inactive here: the draft never differed from dflash\'s</p>')


def acceptance_length(r: dict) -> float | None:
    """Tokens per target call without the prefill call (vLLM's acceptance length): (new tokens - prompts) / (target
    calls - prompts); the prefill commits one token per prompt in one call. None where the row lacks the counts."""
    n, c, p = r.get("new_tokens"), r.get("target_calls"), r.get("prompts")
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (n, c, p)) or c <= p:
        return None
    return (n - p) / (c - p)


def peer_section(doc: dict) -> str:
    """The peer (transformers' DFlash with the lab's drafter) beside the lab's dflash at the peer's own width: width,
    tokens per target call with and without the prefill call, speedup over greedy and tok/s; shown on both pages."""
    peer = (doc.get("references") or {}).get("dflash_transformers")
    if not isinstance(peer, dict):
        return ""
    w = peer.get("width")
    rows_d = ((doc.get("methods") or {}).get("dflash") or {}).get("rows") or {}
    ours = rows_d.get(str(w)) if isinstance(w, int) and not isinstance(w, bool) else None

    def row(name: str, width, r: dict | None) -> str:
        if r is None:
            return (f"<tr><td>{_e(name)}</td><td>{_e(width)}</td><td colspan=4 class=muted>not measured at this width "
                    f"(the lab's dflash ran at {_e(', '.join(sorted(rows_d, key=int)) or 'no width')})</td></tr>")
        return (f"<tr><td>{_e(name)}</td><td>{_e(width if width is not None else '–')}</td>"
                f"<td>{_f(r.get('tokens_per_target_call'), 2)}</td><td>{_f(acceptance_length(r), 2)}</td>"
                f"<td>{_f(r.get('speedup'))}×</td><td>{_f(r.get('tokens_per_second'), 1)}</td></tr>")
    return ("<h2>Peer: transformers' DFlash, same drafter</h2><table id=peer-table><tr><th>row</th><th>width</th>"
            "<th title=\"new tokens / target calls, the prefill call counted\">tok/call</th><th title=\"(new tokens - "
            "prompts) / (target calls - prompts): the prefill call and its token left out, as vLLM reports acceptance "
            "length\">tok/verify</th><th>speedup</th><th>tok/s</th></tr>"
            + row("dflash_transformers (peer)", w, peer) + row("dflash (this lab)", w, ours) + "</table>"
            "<p class=muted>Same width, same drafter weights. tok/call counts the prefill call (the lab's "
            "definition); tok/verify leaves it out (vLLM's acceptance length): docs/methodology.md.</p>")


def impossible_section(doc: dict) -> str:
    """The rounds flagged as beyond what the run can physically reach (report.impossible), each with its limit; they
    are kept in the saved rows and left out of every statistic that names groups."""
    imp = doc.get("impossible") if isinstance(doc.get("impossible"), dict) else {}
    rounds = [r for r in imp.get("rounds") or [] if isinstance(r, dict)]
    head = f"<h2>Impossible rounds ({len(rounds)})</h2>"
    rule = f"<p class=muted>Rule: {_e(imp.get('rule') or '')}.</p>" if imp else ""
    if not rounds:
        return head + "<p class=muted id=impossible-none>no round lies beyond what the run can reach.</p>" + rule
    label = {"speedup_rounds": "speedup over greedy", "vs_baseline_rounds": "ratio against dflash"}
    rows = "".join(
        f"<tr class=impossible><td>{_e(r.get('case'))}</td><td>{_e(label.get(r.get('statistic'), r.get('statistic')))}"
        f"</td><td>{_e(r.get('round', 0) + 1 if isinstance(r.get('round'), int) else '?')}</td>"
        f"<td class=bad>{_f(r.get('value'))}×</td><td>{_e('above the bound' if r.get('side') == 'above' else 'below the floor')}"
        f" {_f(r.get('limit'))}× (allowance ×{_f(imp.get('allowance'), 2)})</td></tr>" for r in rounds)
    return (head + "<table id=impossible-table><tr><th>case</th><th>statistic</th><th>round</th><th>value</th>"
            f"<th>limit</th></tr>{rows}</table><p class=muted>These rounds are kept in benchmark.json (each row's "
            "<code>impossible</code> lists their indices) and left out of the medians, intervals, ranking groups and "
            f"the gate.</p>{rule}")


def _goals_table(doc: dict) -> str:
    status = {True: "<span class=ok>met</span>", False: "<span class=bad>missed</span>",
              None: "<span class=tie>undetermined</span>"}
    rows = "".join(
        f"<tr><td>{_e(g.get('goal'))}</td><td>{_f(g.get('figure'))} <span class=muted>({_e(g.get('basis', ''))}"
        f"{'' if g.get('point') is None or g.get('point') == g.get('figure') else '; point ' + _f(g['point'])})"
        f"</span></td><td>{status.get(g.get('ok'), status[None])}"
        f"{' <span class=muted>' + _e(g['note']) + '</span>' if g.get('note') else ''}</td></tr>"
        for g in doc.get("goals") or [] if isinstance(g, dict))
    return ("<table id=goals-table><tr><th>performance goal (stated in docs/performance.md, with the 350M goals)</th>"
            "<th>this run (on the side that makes the goal hardest)</th><th>status</th></tr>" + rows + "</table>")


def _width_table(doc: dict) -> str:
    widths = sorted({int(w) for m in doc["methods"].values() for w in m["rows"] if int(w) > 0})
    head = "".join(f"<th>w={w}</th>" for w in widths)
    rows = []
    for mid, m in doc["methods"].items():
        if mid == "normal":
            continue
        cells = "".join(
            f"<td>{_f(m['rows'][str(w)]['speedup'], 2)}× (model {_x(m['rows'][str(w)].get('model_speedup'), 2)}) / "
            f"τ {_f(m['rows'][str(w)]['tokens_per_target_call'], 2)}</td>"
            if str(w) in m["rows"] else "<td>–</td>" for w in widths)
        rows.append(f"<tr><td>{_e(mid)}</td>{cells}</tr>")
    ub = doc.get("upper_bound_speedup") or {}
    if ub:
        rows.append("<tr><td class=muted>upper bound: a free drafter accepting every draft (prefill and round "
                    "schedule included)</td>" + "".join(
            f"<td class=muted>{_f(ub.get(str(w)), 2)}×</td>" for w in widths) + "</tr>")
    return f"<table id=width-table><tr><th>method</th>{head}</tr>{''.join(rows)}</table>"


def operating_table(doc: dict) -> str:
    """Each method at its own width (the width model's choice on calibration decodes) with what the model predicted
    there beside what was measured, and the model's dflash prediction at every measured width."""
    op = doc.get("operating_points") if isinstance(doc.get("operating_points"), dict) else {}
    ms = op.get("methods") if isinstance(op.get("methods"), dict) else {}
    if not ms:
        return "<p class=muted>No own widths in this run (given widths, a smoke run, or a run before the width model).</p>"
    rows = "".join(
        f"<tr><td>{_e(mid)}</td><td>{_e(r.get('width'))}</td><td>{_f(r.get('predicted_tokens_per_target_call'), 2)}</td>"
        f"<td>{_x(r.get('model_speedup'), 2)}</td><td>{_f(r.get('measured_tokens_per_target_call'), 2)}</td>"
        f"<td>{_x(r.get('measured_speedup'), 2)}</td></tr>" for mid, r in ms.items() if isinstance(r, dict))
    pred = [p for p in op.get("dflash_prediction") or [] if isinstance(p, dict)]
    tol = op.get("tolerance")
    fit = ("; ".join(f"w{_e(p.get('width'))}: predicted {_f(p.get('predicted'), 2)}, measured {_f(p.get('measured'), 2)} "
                     f"({_pct(p.get('error'))})" for p in pred))
    verdict = "" if op.get("within") is None else (
        f" — {'within' if op['within'] else 'NOT within'} ±{_pct(tol)} at every measured width" if tol else "")
    wm = ((doc.get("settings") or {}).get("width_choice") or {}).get("width_model") or {}
    read = (f"The width model replayed {_e(wm.get('decodes'))} calibration decodes of {_e(wm.get('decode_tokens'))} "
            f"tokens ({_e(wm.get('tokens'))} tokens, {_e(wm.get('dropped_held_out', 0))} dropped by the held-out guard) "
            "without the target; " if isinstance(wm, dict) and wm else "")
    return (f"<p class=muted>{read}each method's own width is its best cost-model speedup there (predicted tokens per "
            "target call and modelled speedup over the in-loop verify curve); measured: this run's benchmark prompts at "
            f"that width. dflash's tokens per target call, predicted vs measured: {fit or '–'}{verdict}.</p>"
            "<table id=operating-table><tr><th>method</th><th>own width</th><th>τ predicted</th><th>model speedup</th>"
            f"<th>τ measured</th><th>speedup measured</th></tr>{rows}</table>")


def task_table(doc: dict) -> str:
    """Speedup and tau per task family of the benchmark prompts, each method at its shown width (Spec-Bench's
    breakdown). No interval: a family has one or two prompts, so a cell is a breakdown of the ranking's rounds,
    not a ranking of its own."""
    cells = {mid: m["best"].get("tasks") or {} for mid, m in doc["methods"].items() if mid != "normal"}
    tasks = list(dict.fromkeys(t for v in cells.values() for t in v))
    if not tasks:
        return "<p class=muted>no per-task figures: the saved run predates them or its prompts carry no tasks</p>"
    any_row = next(v for v in cells.values() if v)
    head = "".join(f"<th>{_e(t)} <span class=muted>({_e(any_row.get(t, {}).get('prompts', '?'))})</span></th>"
                   for t in tasks)
    rows = []
    for mid, per in sorted(cells.items(), key=lambda kv: ranking_order(doc, (kv[0], doc["methods"][kv[0]]))):
        tds = "".join(f"<td>{_f(per[t]['speedup'], 2)}× / τ {_f(per[t]['tokens_per_target_call'], 2)}</td>"
                      if t in per else "<td>–</td>" for t in tasks)
        rows.append(f"<tr><td>{_e(mid)} (w={_e(doc['methods'][mid]['best']['width'])})</td>{tds}</tr>")
    src = (doc.get("prompts") or {}).get("source")
    where = f"Prompts: {_e(src)}{' ' + _e(doc['prompts']['file']) if doc['prompts'].get('file') else ''}. " if src else ""
    return (f"<table id=task-table><tr><th>method</th>{head}</tr>{''.join(rows)}</table><p class=muted>{where}Each cell: "
            "the median over paired rounds of the family's greedy seconds over the method's (its prompts summed), "
            "and tokens per target call (τ); the number of prompts per family in brackets. A family has few prompts, "
            "so read the cells as where a method's speedup comes from, not as a ranking.</p>")


def _position_table(doc: dict) -> str:
    rows = []
    for mid, m in doc["methods"].items():
        if mid == "normal":
            continue
        r = m["rows"][str(m["best"]["width"])]
        pp = r.get("per_position_acceptance") or []
        cells = "".join(f"<td>{_f(100 * p if isinstance(p, (int, float)) else p, 0)}%</td>" for p in pp)
        hist = " ".join(_e(x) for x in r.get("accept_histogram") or [])
        rows.append(f"<tr><td>{_e(mid)} (w={_e(m['best']['width'])})</td>{cells}"
                    f"<td class=muted>[{hist}]</td></tr>")
    return ("<table id=position-table><tr><th>method</th><th colspan=8 style='text-align:left'>acceptance at draft "
            "position 1..w (conditional) · histogram of accepted per target call</th></tr>" + "".join(rows) + "</table>")


def _refs_table(doc: dict) -> str:
    rows = []
    for k, r in sorted(doc.get("references", {}).items()):
        ex = '<span class="ok">exact</span>' if r.get("exact") else '<span class="bad">diverged</span>'
        rows.append(f"<tr><td>{_e(k)}</td><td>{_f(r.get('tokens_per_second'), 1)}</td>"
                    f"<td>{_f(r.get('speedup'))}× [{_f(r.get('speedup_q1'), 2)}–{_f(r.get('speedup_q3'), 2)}]</td>"
                    f"<td>{ex}</td></tr>")
    vc = doc.get("verify_cost") or {}
    curve = " · ".join(f"w={_e(w)}: {_f(v, 2)}" for w, v in (vc.get("ratio") or {}).items())
    td = vc.get("t_decode_seconds")
    return ("<table id=reference-table><tr><th>reference (not a method)</th><th>tok/s</th><th>vs normal, paired: "
            "median [Q1–Q3]</th><th>exactness</th></tr>" + "".join(rows) + "</table>"
            + (f"<p class=muted>verify cost t_verify(w)/t_decode: {curve} (t_decode = "
               f"{_f(1000 * td if isinstance(td, (int, float)) else td, 2)} ms)</p>" if vc else ""))


def _normal_note(doc: dict) -> str:
    gen = (doc.get("references") or {}).get("generate") or {}
    cmp = (f"In this run transformers <code>generate()</code> greedy (reference row <code>generate</code>, same "
           f"target and prompts) ran at {_f(gen.get('speedup'))}× normal's speed (paired)."
           if gen else "This run has no <code>generate</code> reference row to compare it with.")
    return ("<p class=muted id=normal-note><b>normal</b> is the lab's own cached greedy decoding (method 00): one "
            "target forward per token with the hybrid cache, the exact reference every method is checked against "
            "and the denominator of every speedup; its own row times it against itself in the same rounds, so its "
            f"figure there is the A/A (the noise plot), not a speedup. {cmp}</p>")


def _cal_table(rec: dict) -> str:
    table = rec.get("table") or (rec.get("stage2") or {}).get("table") or []
    rows = "".join(
        f"<tr><td>{_e(t.get('key', t.get('setting')))}</td><td>{_f(t.get('model_speedup'), 3)}</td>"
        f"<td>{_f(t.get('tokens_per_target_call', t.get('mean_tokens_per_target_call')), 2)}</td>"
        f"<td>{_f(t.get('tokens_per_second_median', t.get('tokens_per_second')), 1)}</td>"
        f"<td>{'yes' if t.get('all_exact', True) else 'no'}</td></tr>" for t in table if isinstance(t, dict))
    return ("<table class=calibration><tr><th>setting</th><th>cost-model speedup (the objective)</th><th>tok/call "
            f"(tie-break)</th><th>tok/s (not used)</th><th>exact</th></tr>{rows}</table>")


def _calibration(doc: dict) -> str:
    """Per calibrated method and width: the chosen setting and the table it was chosen from, naming the
    objective (costmodel.OBJECTIVE); runs before schema 4 chose by median tok/s and say so."""
    out = []
    for mid, rec in (doc.get("calibration") or {}).items():
        if not isinstance(rec, dict):
            continue
        objective = rec.get("objective") or "median tok/s (a run before the cost-model objective)"
        widths = rec.get("widths") if isinstance(rec.get("widths"), dict) else {"": rec}
        parts = []
        for w, wrec in widths.items():
            if not isinstance(wrec, dict):
                continue
            sel = wrec.get("selected") or wrec.get("selected_options") or wrec.get("options")
            head = f"w={_e(w)}: " if w else ""
            parts.append(f"<h4>{head}selected {_e(json.dumps(sel))}</h4>"
                         + (_cal_table(wrec) if not rec.get("reuses") else ""))
        reuse = f" (reuses {_e(rec['reuses'])}'s choice)" if rec.get("reuses") else ""
        out.append(f"<h3>{_e(mid)}{reuse}</h3><p class=muted>objective: {_e(objective)}</p>" + "".join(parts))
    return "".join(out) or "<p class=muted>no calibrated methods in this run</p>"


def _provenance(doc: dict) -> str:
    pv = doc.get("provenance", {})
    items = {"target": doc.get("target"), "settings": doc.get("settings"), "versions": pv.get("versions"),
             "seeds": pv.get("seeds"), "artifacts": pv.get("artifacts"), "runs": doc.get("runs")}
    return _drafter_accuracy(pv.get("drafter") or {}) + \
        "<pre style='white-space:pre-wrap;font-size:12px'>" + _e(json.dumps(items, indent=1)) + "</pre>"


def _drafter_accuracy(dr: dict) -> str:
    """One line: the drafter's teacher-forced accuracy per draft position, held-out vs training trajectories."""
    held, train = dr.get("heldout_position_accuracy"), dr.get("train_position_accuracy")
    if not isinstance(held, list) or not held:
        return ""

    def row(xs):
        return " ".join(_f(x, 2) for x in xs) if isinstance(xs, list) else "–"
    return (f"<p>Drafter teacher-forced accuracy per draft position (1..{len(held)}): held-out trajectories "
            f"<b>{row(held)}</b> ({_e(dr.get('heldout_sequences', '?'))} trajectories) · training "
            f"{row(train)} · kept step {_e(dr.get('best_step', '?'))}.</p>")


def _group_kpi(doc: dict) -> str:
    """Rank group 1 as the statistics give it: its members, and whether the run resolved a single one."""
    groups = doc.get("rank_groups") or []
    if not groups:
        return "<div>rank group 1<b id=rank-group-1>–</b></div>"
    g1 = groups[0]
    if doc.get("winner"):
        note = "the only method in G1: the single winner"
    elif len(g1) == 1:
        note = "the only method in G1, though its lead over the next may be below the resolution r"
    else:
        note = f"no single winner: G1 = {len(g1)} methods this run cannot tell apart"
    long = " class=long" if len(g1) > 3 else ""
    return (f"<div title=\"{_e(_group_rule(doc))}\">rank group 1<b id=rank-group-1{long}>{_e(', '.join(g1))}</b>"
            f"<span class=muted>{_e(note)}</span></div>")


def _figure(plot: str, caption: str, table: str = "", table_label: str = "the numbers as a table") -> str:
    """A plot, what it shows in one caption, and (optionally) the same numbers as a table behind a toggle."""
    more = f"<details><summary class=muted>{_e(table_label)}</summary>{table}</details>" if table else ""
    return f"<figure>{plot}<figcaption class=muted>{caption}</figcaption>{more}</figure>"


def _verify_caption(doc: dict) -> str:
    """The verify-cost figure's caption: what is measured, what is a model, and why a measured oracle may sit above
    the model bound."""
    measured = plots.measured_verify_widths(doc)
    over = plots.bound_exceeded(doc)
    oracle = [r.get("speedup_ci_label") for k, r in (doc.get("references") or {}).items() if k.startswith("oracle-w")]
    text = ("Left: a verify of w drafts costs t_verify(w)/t_decode greedy steps: the isotonic fit of the decode loop's "
            "own verify forwards as a line to the block size, a point at each width the loop timed"
            + (f" ({', '.join(map(str, measured))})" if measured else "") + ", and hollow points for the isolated "
            "curve (test_verify_cost: every width, measured at one context). Right: the model bound, the speedup a "
            "perfect, free drafter would reach (greedy's loop time over the speculative prefill plus the oracle's "
            "round schedule priced on that fitted curve), against the oracle rows (replayed greedy drafts, measured; "
            "whisker: " + plots.interval_caption(oracle) + "): the gap is what drafting and the loop cost.")
    if over:
        text += (f" At width {', '.join(map(str, over))} the measured oracle lies above the bound: the bound is a "
                 "model priced from medians of this run's loop timings on the fitted curve, not a measured ceiling, "
                 "so the oracle's own rounds can beat it by the run's noise and the fit's error.")
    return _e(text)


def _figures(doc: dict) -> str:
    """The five figures of the report, each drawn from benchmark.json by report/plots.py."""
    n = doc.get("noise") or {}
    rk = doc.get("ranking") or {}
    return (
        "<h2>Speedup against verify width</h2><div class=figs>"
        + _figure(plots.speedup_vs_width(doc),
                  "Median paired speedup over normal (greedy) at every width measured, one line per method; whisker: "
                  + _e(plots.interval_caption([r.get("speedup_ci_label") for mid, m in doc["methods"].items()
                                               if mid != "normal" for r in m["rows"].values()]))
                  + "; dashed: 1× (normal).", _width_table(doc))
        + _figure(plots.acceptance_by_position(doc),
                  "Conditional acceptance at each draft position (accepted at i / proposed at i) at each method's "
                  "shown width: where in the block drafts stop being accepted.", _position_table(doc))
        + _figure(plots.tokens_per_call(doc),
                  "Tokens per target call at every width measured, one line per method: new tokens over target "
                  "forwards, a count (deterministic for one model and setting, so no interval); 1 is greedy.")
        + "</div><h2>Verify cost, bound and oracle</h2><div class=figs>"
        + _figure(plots.verify_cost(doc), _verify_caption(doc))
        + "</div><h2>Noise: A/A rounds</h2><div class=figs>"
        + _figure(plots.noise(doc),
                  "Identical work timed against itself in this run. "
                  + (f"{_e(rk.get('baseline'))} vs {_e(rk.get('baseline'))} at width {_e(rk.get('width'))}: the A/A of "
                     "the ratio the selection compares. " if rk.get("statistic") == "vs_baseline" else "")
                  + ("normal vs normal: normal's own rounds timed against a normal leg (its row's 1.0x is this A/A, "
                     "not a speedup). ")
                  + f"Band: ± the run's noise figure {_pct(n.get('sigma'))} (pooled robust SD of every ranked case's "
                  f"per-round log ratios; above {_pct(n.get('threshold'))} the run is flagged noisy). "
                  + "A speedup difference inside this scatter is not resolved by the run.")
        + "</div>")


def render_report(doc: dict) -> str:
    ok = doc["exactness"]["all_exact"]
    normal = doc["methods"].get("normal", {}).get("best", {})
    st = doc.get("settings", {})
    tgt = doc.get("target", {})
    rk = doc.get("ranking") or {}
    gate = ('<span class="ok">all methods exact</span>' if ok else
            f'<span class="bad">exactness gate FAILED: {_e(", ".join(doc["exactness"]["failures"]))}</span>')
    return f"""<!doctype html><html lang=en><head><meta charset=utf-8><title>DFlash Mini Lab report ({_e(doc['device'])})</title>
<style>{CSS}</style></head><body><header><h1>DFlash Mini Lab — {_e(tgt.get('name', ''))}
on {_e(doc['device'])}</h1>{_run_info(doc)}{_model_hashes(doc)}<div class=muted>{gate} · {_aa_header(doc)} ·
<a href="index.html">mechanism explorer</a> · <a href="benchmark.json">benchmark.json</a></div></header><main>
{smoke_banner(doc)}{headline_html(doc)}{noise_banner(doc)}
<div class=kpi><div>normal tok/s<b>{_f(normal.get('tokens_per_second'), 1)}</b></div>
{_group_kpi(doc)}<div>ranking width<b>{_e(rk.get('width') if rk.get('width') is not None else '–')}</b></div></div>
<p class=muted>{_e(st.get('prompt_limit', '?'))} held-out prompts × {_e(st.get('tokens', '?'))} tokens ×
 {_e(st.get('rounds', '?'))} paired rounds · {_e(st.get('threads', '?'))} threads · dtype {_e(tgt.get('dtype', ''))}
 · kernels {_e(kernels_note(tgt))}
 · widths {_e(', '.join(map(str, st.get('widths') or [])))}{_width_choice_note(st)}.{_size_note(st)}
 Speedup = normal wall / method wall, paired per round inside this run; spread is Q1–Q3 over rounds{_schedule_note(st)}.</p>
{_normal_note(doc)}
<h2>Ranking (width shown per method)</h2>{_speedup_chart(doc)}{_methods_table(doc)}
{peer_section(doc)}{impossible_section(doc)}
<h2>Operating points (each method at its own width)</h2>{operating_table(doc)}
<h2>By task family (width shown per method)</h2>{task_table(doc)}
{_figures(doc)}
<h2>Reference rows (same run)</h2>{_refs_table(doc)}
<h2>Performance goals</h2>{_goals_table(doc)}
<h2>Calibration (calibration prompts only)</h2>{_calibration(doc)}
<h2>Provenance</h2>{_provenance(doc)}
<script id=payload type=application/json>{_payload(doc)}</script></main></body></html>"""


EXPLORER_JS = """
const D=JSON.parse(document.getElementById('payload').textContent);
const sel=document.getElementById('method'),box=document.getElementById('chips'),info=document.getElementById('info');
const ctx=document.getElementById('context');
const traces=D.traces||{};const keys=Object.keys(traces).filter(k=>traces[k].length);
keys.forEach(k=>{const o=document.createElement('option');o.value=o.textContent=k;sel.appendChild(o);});
const win=D.winner?D.winner.method+'-w'+D.winner.width:null; if(win&&keys.includes(win))sel.value=win;
let round=0,phase=0,timer=null;
const T=D.token_text||{},show=t=>(t in T?T[t]:'<'+t+'>');
function draw(){const t=traces[sel.value]||[];if(!t.length){box.textContent='no trace';return;}
 const k=round%t.length,r=t[k];box.innerHTML='';
 // the text committed before this round: every earlier round's accepted drafts and its correction/bonus token
 let before=[];for(let j=0;j<k;j++){before=before.concat(t[j].draft.slice(0,t[j].accepted),[t[j].token]);}
 ctx.textContent=before.length?'\\u2026'+before.map(show).join('').slice(-240):'(start of the generated text)';
 r.draft.forEach((tok,i)=>{const c=document.createElement('span');c.className='chip';c.textContent=JSON.stringify(show(tok)).slice(1,-1);c.title='id '+tok;
  if(phase>=1){c.className+=i<r.accepted?' acc':(i===r.accepted?' rej':'');} box.appendChild(c);});
 if(phase>=2){const c=document.createElement('span');c.className='chip '+(r.bonus?'bonus':'corr');c.textContent=JSON.stringify(show(r.token)).slice(1,-1);c.title='id '+r.token;box.appendChild(c);}
 const m=sel.value.replace(/-w\\d+$/,''),mm=(D.methods[m]||{});
 info.textContent=`round ${k+1}/${t.length} · drafted ${r.draft.length} · accepted ${r.accepted} · `+
  (r.bonus?'bonus':'correction')+` token ${JSON.stringify(show(r.token))} · ${mm.mechanism||''}`;}
function step(){phase=(phase+1)%3;if(phase===0)round++;draw();}
sel.onchange=()=>{round=0;phase=0;draw();};
document.getElementById('play').onclick=()=>{if(timer){clearInterval(timer);timer=null;}else timer=setInterval(step,700);};
draw();timer=setInterval(step,700);
"""


def _prompt_block(doc: dict) -> str:
    """The prompt the traces continue, shown before the generated text (benchmark.json `trace_prompt`)."""
    p = doc.get("trace_prompt")
    if not isinstance(p, str):
        return "<div id=prompt class=\"prompt muted\">(this run did not record its prompt)</div>"
    return f"<div class=muted>prompt</div><div id=prompt class=prompt>{_e(p)}</div>"


def render_index(doc: dict) -> str:
    ok = doc["exactness"]["all_exact"]
    return f"""<!doctype html><html lang=en><head><meta charset=utf-8><title>DFlash Mini Lab ({_e(doc['device'])})</title>
<style>{CSS}</style></head><body><header><h1>DFlash Mini Lab · {_e(doc['device'])}</h1>{_run_info(doc)}
<div class=muted>{'<span class=ok>all methods exact</span>' if ok else '<span class=bad>exactness gate failed</span>'}
 · {_aa_header(doc)} · <a href="report.html">full report</a> · <a href="benchmark.json">benchmark.json</a></div>
</header><main>{smoke_banner(doc)}{headline_html(doc)}{noise_banner(doc)}
<h2>Mechanism explorer</h2><p class=muted>Replays real block traces recorded in this run (first prompt): the prompt,
the text generated before the round, then the draft, the accepted prefix (green), the first rejected draft (red), and
the committed correction (amber) or bonus token (blue) from the same target forward.</p>
<p><select id=method></select> <button id=play>pause / play</button></p>
{_prompt_block(doc)}<div class=muted>generated before this round</div>
<div id=context class=ctx></div><div id=chips></div><p id=info class=muted></p>
<h2>Ranking</h2>{_methods_table(doc)}{peer_section(doc)}
<script id=payload type=application/json>{_payload(doc)}</script><script>{EXPLORER_JS}</script></main></body></html>"""
