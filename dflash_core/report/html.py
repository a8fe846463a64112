"""Self-contained HTML pages (no network): `report.html` (tables, charts, calibration, provenance) and
`index.html` (headline + an animated mechanism explorer replaying block traces recorded in the run).
Every number shown is read from the canonical benchmark.json document embedded in the page.
"""

from __future__ import annotations

import html
import json

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
"""


def _payload(doc: dict) -> str:
    return json.dumps(doc, sort_keys=True, allow_nan=False).replace("</", "<\\/")


def _f(x, nd=3):
    return "–" if x is None else f"{x:.{nd}f}"


def _methods_table(doc: dict) -> str:
    rows = []
    win = (doc.get("winner") or {}).get("method")
    mx = max([m["best"]["speedup"] for m in doc["methods"].values()] + [1.0])
    for mid, m in sorted(doc["methods"].items(), key=lambda kv: -kv[1]["best"]["speedup"]):
        b = m["best"]
        r = m["rows"][str(b["width"])]
        cls = "win" if b["speedup"] >= 1 else "lose"
        bar = f'<span class="bar {cls}" style="width:{int(160 * b["speedup"] / mx)}px"></span>'
        ex = '<span class="ok">exact</span>' if m["exact"] else '<span class="bad">DIVERGED</span>'
        ties = r.get("verdicts", {}).get("tie", 0)
        if ties:
            ex += f' <span class="tie">({ties} tie)</span>'
        rows.append(
            f"<tr{' class=winner' if mid == win else ''}><td>{m.get('index', 0):02d} {html.escape(mid)}</td>"
            f"<td>{b['width']}</td><td>{_f(b['tokens_per_second'], 1)}</td>"
            f"<td>{bar} {_f(b['speedup'])}× ± {_f(b['speedup_iqr'])}</td><td>{_f(b['tokens_per_target_call'], 2)}</td>"
            f"<td>{_f(100 * b['acceptance_rate'], 1)}%</td><td>{r.get('guidance_work', 0)}</td>"
            f"<td>{_f(100 * r.get('overhead_fraction', 0), 1)}%</td><td>{ex}</td></tr>")
    return ("<table id=methods-table><tr><th>method</th><th>best w</th><th>tok/s</th><th>speedup vs normal "
            "(median ± IQR, paired)</th><th>tok/call</th><th>accept</th><th>guidance</th><th>loop overhead</th>"
            "<th>exactness</th></tr>" + "".join(rows) + "</table>")


def _speedup_chart(doc: dict) -> str:
    """Inline SVG: best-width speedup per method with its IQR whisker, and the 1x line (normal)."""
    ms = sorted(doc["methods"].items(), key=lambda kv: -kv[1]["best"]["speedup"])
    if not ms:
        return ""
    hi = max([m["best"]["speedup"] + m["best"]["speedup_iqr"] / 2 for _, m in ms] + [1.0]) * 1.08
    row, left, width = 18, 150, 520
    x = lambda v: left + width * v / hi  # noqa: E731
    parts = [f'<line x1="{x(1):.1f}" y1="0" x2="{x(1):.1f}" y2="{row * len(ms)}" stroke="#8a9aab" '
             'stroke-dasharray="3,3"/>']
    for i, (mid, m) in enumerate(ms):
        b, y = m["best"], i * row
        col = "#5fd38d" if b["speedup"] >= 1 else "#ff8c6b"
        lo, up = b["speedup"] - b["speedup_iqr"] / 2, b["speedup"] + b["speedup_iqr"] / 2
        parts.append(f'<text x="{left - 6}" y="{y + 13}" text-anchor="end">{html.escape(mid)} w{b["width"]}</text>'
                     f'<rect x="{left}" y="{y + 3}" width="{max(0.0, x(b["speedup"]) - left):.1f}" height="12" '
                     f'fill="{col}"><title>{mid}: {b["speedup"]:.3f}x ± {b["speedup_iqr"]:.3f}</title></rect>'
                     f'<line x1="{x(max(lo, 0)):.1f}" y1="{y + 9}" x2="{x(up):.1f}" y2="{y + 9}" stroke="#e6e6e6"/>'
                     f'<text x="{x(up) + 6:.1f}" y="{y + 13}">{b["speedup"]:.2f}×</text>')
    h = row * len(ms) + 4
    return (f'<svg id=speedup-chart role=img aria-label="speedup per method" width="{left + width + 70}" height="{h}" '
            f'font-size="11" fill="#e6e6e6" xmlns="http://www.w3.org/2000/svg">{"".join(parts)}</svg>'
            '<p class=muted>bar: median paired speedup at the best width; whisker: IQR over rounds; dashed: 1× (normal)</p>')


def goals(doc: dict) -> list[dict]:
    """Issue 8's run-level goals, each with this run's figure (the 350M-only goals live in docs/performance.md)."""
    win = doc.get("winner") or {}
    spec = {k: m for k, m in doc["methods"].items() if k != "normal"}
    refs = doc.get("references") or {}
    ub = (doc.get("upper_bound_speedup") or {}).get(str(win.get("width")))
    ratio4 = ((doc.get("verify_cost") or {}).get("ratio") or {}).get("4")
    overhead = max((r.get("overhead_fraction", 0.0) for m in spec.values() for r in m["rows"].values()), default=None)
    peers = {k: refs[k]["tokens_per_second"] for k in ("prompt_lookup", "assisted") if k in refs}
    out = [
        {"goal": "best method >= 2.5x over normal", "figure": win.get("speedup"), "spread": win.get("speedup_iqr"),
         "ok": win.get("speedup") is not None and win["speedup"] >= 2.5},
        {"goal": ">= 80% of the bound (w+1)·t_dec/t_ver(w) at the best width",
         "figure": win["speedup"] / ub if ub and win.get("speedup") else None, "spread": None,
         "ok": bool(ub and win.get("speedup") and win["speedup"] / ub >= 0.8)},
        {"goal": "t_verify(4)/t_decode <= 1.3", "figure": ratio4, "spread": None, "ok": ratio4 is not None and ratio4 <= 1.3},
        {"goal": "loop overhead <= 0.05 of wall (fraction), every method and width", "figure": overhead, "spread": None,
         "ok": overhead is not None and overhead <= 0.05},
    ]
    for k, tps in peers.items():
        fig = win["tokens_per_second"] / tps if win.get("tokens_per_second") and tps else None
        out.append({"goal": f"best method >= 1.5x {k.replace('_', '-')} (tok/s)", "figure": fig, "spread": None,
                    "ok": fig is not None and fig >= 1.5})
    return out


def _goals_table(doc: dict) -> str:
    rows = "".join(
        f"<tr><td>{html.escape(g['goal'])}</td><td>{_f(g['figure'])}"
        f"{'' if g['spread'] is None else ' ± ' + _f(g['spread'])}</td>"
        f"<td>{'<span class=ok>met</span>' if g['ok'] else '<span class=bad>missed</span>'}</td></tr>" for g in goals(doc))
    return ("<table id=goals-table><tr><th>goal (issue 8; 350M goals in docs/performance.md)</th><th>this run</th>"
            "<th>status</th></tr>" + rows + "</table>")


def _width_table(doc: dict) -> str:
    widths = sorted({int(w) for m in doc["methods"].values() for w in m["rows"] if int(w) > 0})
    head = "".join(f"<th>w={w}</th>" for w in widths)
    rows = []
    for mid, m in doc["methods"].items():
        if mid == "normal":
            continue
        cells = "".join(
            f"<td>{_f(m['rows'][str(w)]['speedup'], 2)}× / τ {_f(m['rows'][str(w)]['tokens_per_target_call'], 2)}</td>"
            if str(w) in m["rows"] else "<td>–</td>" for w in widths)
        rows.append(f"<tr><td>{html.escape(mid)}</td>{cells}</tr>")
    ub = doc.get("upper_bound_speedup") or {}
    if ub:
        rows.append("<tr><td class=muted>upper bound (w+1)·t_dec/t_ver(w)</td>" + "".join(
            f"<td class=muted>{_f(ub.get(str(w)), 2)}×</td>" for w in widths) + "</tr>")
    return f"<table id=width-table><tr><th>method</th>{head}</tr>{''.join(rows)}</table>"


def _position_table(doc: dict) -> str:
    rows = []
    for mid, m in doc["methods"].items():
        if mid == "normal":
            continue
        r = m["rows"][str(m["best"]["width"])]
        pp = r.get("per_position_acceptance", [])
        cells = "".join(f"<td>{_f(100 * p, 0)}%</td>" for p in pp)
        hist = " ".join(str(x) for x in r.get("accept_histogram", []))
        rows.append(f"<tr><td>{html.escape(mid)} (w={m['best']['width']})</td>{cells}"
                    f"<td class=muted>[{hist}]</td></tr>")
    return ("<table id=position-table><tr><th>method</th><th colspan=8 style='text-align:left'>acceptance at draft "
            "position 1..w (conditional) · histogram of accepted per target call</th></tr>" + "".join(rows) + "</table>")


def _refs_table(doc: dict) -> str:
    rows = []
    for k, r in sorted(doc.get("references", {}).items()):
        ex = '<span class="ok">exact</span>' if r.get("exact") else '<span class="bad">diverged</span>'
        rows.append(f"<tr><td>{html.escape(k)}</td><td>{_f(r['tokens_per_second'], 1)}</td>"
                    f"<td>{_f(r['speedup'])}× ± {_f(r['speedup_iqr'])}</td><td>{ex}</td></tr>")
    vc = doc.get("verify_cost") or {}
    curve = " · ".join(f"w={w}: {_f(v, 2)}" for w, v in (vc.get("ratio") or {}).items())
    return ("<table id=reference-table><tr><th>reference (not a method)</th><th>tok/s</th><th>vs normal</th>"
            "<th>exactness</th></tr>" + "".join(rows) + "</table>"
            + (f"<p class=muted>verify cost t_verify(w)/t_decode: {curve} (t_decode = "
               f"{_f(1000 * vc.get('t_decode_seconds', 0), 2)} ms)</p>" if vc else ""))


def _calibration(doc: dict) -> str:
    out = []
    for mid, rec in (doc.get("calibration") or {}).items():
        table = rec.get("table") or (rec.get("stage2") or {}).get("table") or []
        sel = rec.get("selected") or rec.get("selected_options")
        rows = "".join(
            f"<tr><td>{html.escape(str(t.get('key', t.get('setting'))))}</td>"
            f"<td>{_f(t.get('tokens_per_second_median', t.get('tokens_per_second')), 1)}</td>"
            f"<td>{_f(t.get('tokens_per_second_iqr'), 1)}</td><td>{_f(t.get('mean_tokens_per_target_call'), 2)}</td>"
            f"<td>{'yes' if t.get('all_exact', True) else 'no'}</td></tr>" for t in table if isinstance(t, dict))
        out.append(f"<h3>{html.escape(mid)}: selected {html.escape(json.dumps(sel))}</h3>"
                   f"<table><tr><th>setting</th><th>tok/s median</th><th>IQR</th><th>tok/call</th><th>exact</th></tr>"
                   f"{rows}</table>")
    return "".join(out) or "<p class=muted>no calibrated methods in this run</p>"


def _provenance(doc: dict) -> str:
    pv = doc.get("provenance", {})
    items = {"target": doc.get("target"), "settings": doc.get("settings"), "versions": pv.get("versions"),
             "seeds": pv.get("seeds"), "artifacts": pv.get("artifacts"), "runs": doc.get("runs")}
    return "<pre style='white-space:pre-wrap;font-size:12px'>" + html.escape(json.dumps(items, indent=1)) + "</pre>"


def render_report(doc: dict) -> str:
    ok = doc["exactness"]["all_exact"]
    win = doc.get("winner") or {}
    normal = doc["methods"].get("normal", {}).get("best", {})
    st = doc.get("settings", {})
    gate = ('<span class="ok">all methods exact</span>' if ok else
            f'<span class="bad">exactness gate FAILED: {html.escape(", ".join(doc["exactness"]["failures"]))}</span>')
    return f"""<!doctype html><html lang=en><head><meta charset=utf-8><title>DFlash Mini Lab report ({doc['device']})</title>
<style>{CSS}</style></head><body><header><h1>DFlash Mini Lab — {html.escape(str(doc.get('target', {}).get('name', '')))}
on {html.escape(doc['device'])}</h1><div class=muted>{gate} · <a href="index.html">mechanism explorer</a> ·
<a href="benchmark.json">benchmark.json</a></div></header><main>
<div class=kpi><div>normal tok/s<b>{_f(normal.get('tokens_per_second'), 1)}</b></div>
<div>best method<b>{html.escape(str(win.get('method', '–')))}</b></div>
<div>best speedup<b>{_f(win.get('speedup'))}×</b></div><div>at width<b>{win.get('width', '–')}</b></div>
<div>tokens/target call<b>{_f(win.get('tokens_per_target_call'), 2)}</b></div></div>
<p class=muted>{st.get('prompt_limit', '?')} held-out prompts × {st.get('tokens', '?')} tokens × {st.get('rounds', '?')}
 paired rounds · {st.get('threads', '?')} threads · dtype {html.escape(str(doc.get('target', {}).get('dtype', '')))}.
 Speedup = normal wall / method wall, paired per round inside this run; spread is the IQR over rounds.</p>
<h2>Speedup versus normal decoding (best width per method)</h2>{_speedup_chart(doc)}{_methods_table(doc)}
<h2>Every width</h2>{_width_table(doc)}
<h2>Acceptance per draft position</h2>{_position_table(doc)}
<h2>Reference rows (same run)</h2>{_refs_table(doc)}
<h2>Performance goals</h2>{_goals_table(doc)}
<h2>Calibration (calibration prompts only)</h2>{_calibration(doc)}
<h2>Provenance</h2>{_provenance(doc)}
<script id=payload type=application/json>{_payload(doc)}</script></main></body></html>"""


EXPLORER_JS = """
const D=JSON.parse(document.getElementById('payload').textContent);
const sel=document.getElementById('method'),box=document.getElementById('chips'),info=document.getElementById('info');
const traces=D.traces||{};const keys=Object.keys(traces).filter(k=>traces[k].length);
keys.forEach(k=>{const o=document.createElement('option');o.value=o.textContent=k;sel.appendChild(o);});
const win=D.winner?D.winner.method+'-w'+D.winner.width:null; if(win&&keys.includes(win))sel.value=win;
let round=0,phase=0,timer=null;
function draw(){const t=traces[sel.value]||[];if(!t.length){box.textContent='no trace';return;}
 const r=t[round%t.length];box.innerHTML='';
 const T=D.token_text||{},show=t=>(t in T?JSON.stringify(T[t]).slice(1,-1):String(t));
 r.draft.forEach((tok,i)=>{const c=document.createElement('span');c.className='chip';c.textContent=show(tok);c.title='id '+tok;
  if(phase>=1){c.className+=i<r.accepted?' acc':(i===r.accepted?' rej':'');} box.appendChild(c);});
 if(phase>=2){const c=document.createElement('span');c.className='chip '+(r.bonus?'bonus':'corr');c.textContent=show(r.token);c.title='id '+r.token;box.appendChild(c);}
 const m=sel.value.replace(/-w\\d+$/,''),mm=(D.methods[m]||{});
 info.textContent=`round ${round%t.length+1}/${t.length} · drafted ${r.draft.length} · accepted ${r.accepted} · `+
  (r.bonus?'bonus':'correction')+` token ${show(r.token)} · ${mm.mechanism||''}`;}
function step(){phase=(phase+1)%3;if(phase===0)round++;draw();}
sel.onchange=()=>{round=0;phase=0;draw();};
document.getElementById('play').onclick=()=>{if(timer){clearInterval(timer);timer=null;}else timer=setInterval(step,700);};
draw();timer=setInterval(step,700);
"""


def render_index(doc: dict) -> str:
    ok = doc["exactness"]["all_exact"]
    win = doc.get("winner") or {}
    return f"""<!doctype html><html lang=en><head><meta charset=utf-8><title>DFlash Mini Lab ({doc['device']})</title>
<style>{CSS}</style></head><body><header><h1>DFlash Mini Lab · {html.escape(doc['device'])}</h1>
<div class=muted>{'<span class=ok>all methods exact</span>' if ok else '<span class=bad>exactness gate failed</span>'}
 · best: {html.escape(str(win.get('method', '–')))} {_f(win.get('speedup'))}× at w={win.get('width', '–')}
 · <a href="report.html">full report</a> · <a href="benchmark.json">benchmark.json</a></div></header><main>
<h2>Mechanism explorer</h2><p class=muted>Replays real block traces recorded in this run (first prompt): the draft,
the accepted prefix (green), the first rejected draft (red), and the committed correction (amber) or bonus token
(blue) from the same target forward.</p>
<p><select id=method></select> <button id=play>pause / play</button></p>
<div id=chips></div><p id=info class=muted></p>
<h2>Ranking</h2>{_methods_table(doc)}
<script id=payload type=application/json>{_payload(doc)}</script><script>{EXPLORER_JS}</script></main></body></html>"""
