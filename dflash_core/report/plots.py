"""Inline SVG figures for the report pages, drawn in Python from the canonical benchmark.json document.

Why hand-written SVG: the pages must open offline and self-contained, and a figure here is a few dozen marks,
so a plotting library (and its script, fonts or CDN) would weigh more than the page. Every data mark is a
`<circle class=pt>` (a whisker a `<line class=whisker>`) inside `<g class=series data-series=...>` and carries the
values it shows in `data-x`/`data-y` and a tooltip (`<title>`), so a test (and a reader with the DOM) can count
and check each series against benchmark.json (tests/support/browser.py does, in headless Chromium). Nothing here
computes a figure the document does not hold: the functions only place the document's numbers on axes.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence

# Okabe & Ito's colour-blind-safe palette (black swapped for a light grey on the dark page). Eight colours for up to
# fifteen methods: the first eight draw solid lines with filled markers, the next eight the same colours with dashed
# lines and hollow markers, so no two methods look alike (registry order, as the methods table).
PALETTE = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#3D8FD1", "#D55E00", "#CC79A7", "#BBBBBB")
BG = "#0f1419"  # the page's background: a hollow marker's fill
W, H = 560, 300  # one plot's size in px
PAD = {"left": 56, "right": 14, "top": 26, "bottom": 44}


def _e(x) -> str:
    return html.escape(str(x), quote=True)


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _g(x, nd: int = 3) -> str:
    """A value for a data-* attribute or a tooltip: the document's number, rounded for reading only."""
    return f"{x:.{nd}f}" if _num(x) else "–"


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About `n` round tick values covering [lo, hi] (steps of 1, 2 or 5 x 10^k): the axis, not data."""
    if not (_num(lo) and _num(hi)) or hi <= lo:
        return [lo] if _num(lo) else []
    raw = (hi - lo) / max(1, n)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(s * mag for s in (1, 2, 5, 10) if s * mag >= raw)
    start = math.ceil(lo / step - 1e-9) * step
    return [round(start + i * step, 10) for i in range(int((hi - start) / step + 1e-9) + 1)]


def _scale(d0: float, d1: float, p0: float, p1: float) -> Callable[[float], float]:
    if d1 == d0:
        return lambda v: (p0 + p1) / 2
    return lambda v: p0 + (p1 - p0) * (v - d0) / (d1 - d0)


def _range(values: Sequence[float], include: Sequence[float] = (), pad: float = 0.06) -> tuple[float, float]:
    xs = [v for v in (*values, *include) if _num(v)]
    if not xs:
        return 0.0, 1.0
    lo, hi = min(xs), max(xs)
    span = hi - lo or max(abs(hi), 1.0) * 0.1
    return lo - pad * span, hi + pad * span


class Frame:
    """One panel: data ranges mapped onto a box of the SVG, with its axes drawn."""

    def __init__(self, xr: tuple[float, float], yr: tuple[float, float], x0: float = 0, width: float = W,
                 xticks: Sequence[float] | None = None, fmt_x: str = "{:g}", fmt_y: str = "{:g}",
                 xlabel: str = "", ylabel: str = "", title: str = "", yticks: Sequence[float] | None = None):
        self.left, self.right = x0 + PAD["left"], x0 + width - PAD["right"]
        self.top, self.bottom = PAD["top"], H - PAD["bottom"]
        self.x = _scale(xr[0], xr[1], self.left, self.right)
        self.y = _scale(yr[0], yr[1], self.bottom, self.top)
        self.xr, self.yr = xr, yr
        self.xticks = list(xticks) if xticks is not None else nice_ticks(*xr)
        self.yticks = list(yticks) if yticks is not None else nice_ticks(*yr)
        self.fmt_x, self.fmt_y = fmt_x, fmt_y
        self.xlabel, self.ylabel, self.title = xlabel, ylabel, title

    def axes(self) -> str:
        out = [f'<rect class=frame x="{self.left:.1f}" y="{self.top:.1f}" width="{self.right - self.left:.1f}" '
               f'height="{self.bottom - self.top:.1f}" fill="none" stroke="#2b3a4a"/>']
        for t in self.yticks:
            y = self.y(t)
            out.append(f'<line x1="{self.left:.1f}" y1="{y:.1f}" x2="{self.right:.1f}" y2="{y:.1f}" '
                       f'stroke="#1f2b38"/><text x="{self.left - 6:.1f}" y="{y + 4:.1f}" text-anchor="end">'
                       f"{_e(self.fmt_y.format(t))}</text>")
        for t in self.xticks:
            if self.xr[0] - 1e-9 <= t <= self.xr[1] + 1e-9:
                x = self.x(t)
                out.append(f'<text x="{x:.1f}" y="{self.bottom + 16:.1f}" text-anchor="middle">'
                           f"{_e(self.fmt_x.format(t))}</text>")
        mid = (self.left + self.right) / 2
        out.append(f'<text x="{mid:.1f}" y="{H - 8}" text-anchor="middle" class=axis-label>{_e(self.xlabel)}</text>')
        ym = (self.top + self.bottom) / 2
        out.append(f'<text transform="translate({self.left - 42:.1f},{ym:.1f}) rotate(-90)" text-anchor="middle" '
                   f"class=axis-label>{_e(self.ylabel)}</text>")
        if self.title:
            out.append(f'<text x="{self.left:.1f}" y="16" class=panel-title>{_e(self.title)}</text>')
        return "".join(out)

    def hline(self, v: float, label: str = "", dash: str = "4,3", colour: str = "#8a9aab") -> str:
        y = self.y(v)
        text = (f'<text x="{self.right - 4:.1f}" y="{y - 4:.1f}" text-anchor="end" fill="{colour}">{_e(label)}</text>'
                if label else "")
        return (f'<line class=ref x1="{self.left:.1f}" y1="{y:.1f}" x2="{self.right:.1f}" y2="{y:.1f}" '
                f'stroke="{colour}" stroke-dasharray="{dash}"/>{text}')


def style(i: int) -> tuple[str, str, bool]:
    """(colour, dash, hollow) of the i-th method: PALETTE's colour, and past its length a dashed line with hollow
    markers, so fifteen methods get fifteen different looks."""
    return PALETTE[i % len(PALETTE)], ("5,3" if (i // len(PALETTE)) % 2 else ""), bool((i // len(PALETTE)) % 2)


def curve(fr: Frame, name: str, points: Sequence[tuple], colour: str, dash: str = "4,3") -> str:
    """A line without data markers (a model or a fit drawn between measured points): `<g class=curve>`, not a series,
    so what is counted as measured stays the circles."""
    pts = sorted((p[0], p[1]) for p in points if _num(p[0]) and _num(p[1]))
    if len(pts) < 2:
        return ""
    d = " ".join(f"{'M' if i == 0 else 'L'}{fr.x(x):.1f},{fr.y(y):.1f}" for i, (x, y) in enumerate(pts))
    return (f'<g class=curve data-curve="{_e(name)}" data-points="{len(pts)}"><path class=line d="{d}" fill="none" '
            f'stroke="{colour}" stroke-width="1.4" stroke-dasharray="{dash}"><title>{_e(name)}</title></path></g>')


def series(fr: Frame, name: str, points: Sequence[tuple], colour: str, line: bool = True,
           label: Callable[[tuple], str] | None = None, dash: str = "", hollow: bool = False) -> str:
    """One series: its line (when asked), a circle per point and a whisker per point with an interval.
    `points`: (x, y) or (x, y, (lo, hi)); points without a finite y are left out (and not counted)."""
    pts = [p for p in points if _num(p[0]) and _num(p[1])]
    if not pts:
        return ""
    out = [f'<g class=series data-series="{_e(name)}" stroke="{colour}" fill="{colour}">']
    if line and len(pts) > 1:
        d = " ".join(f"{'M' if i == 0 else 'L'}{fr.x(p[0]):.1f},{fr.y(p[1]):.1f}" for i, p in enumerate(pts))
        out.append(f'<path class=line d="{d}" fill="none" stroke-width="1.6"'
                   + (f' stroke-dasharray="{dash}"' if dash else "") + "/>")
    for p in pts:
        x, y = fr.x(p[0]), fr.y(p[1])
        ci = p[2] if len(p) > 2 else None
        if ci is not None and len(ci) == 2 and _num(ci[0]) and _num(ci[1]):
            lo, hi = fr.y(ci[0]), fr.y(ci[1])
            out.append(f'<line class=whisker data-lo="{_g(ci[0])}" data-hi="{_g(ci[1])}" x1="{x:.1f}" y1="{lo:.1f}" '
                       f'x2="{x:.1f}" y2="{hi:.1f}" stroke-width="1.2"/>'
                       f'<line x1="{x - 3:.1f}" y1="{lo:.1f}" x2="{x + 3:.1f}" y2="{lo:.1f}"/>'
                       f'<line x1="{x - 3:.1f}" y1="{hi:.1f}" x2="{x + 3:.1f}" y2="{hi:.1f}"/>')
        tip = label(p) if label else f"{name}: {_g(p[0], 0)}, {_g(p[1])}"
        mark = f'fill="{BG}" stroke="{colour}" stroke-width="1.4"' if hollow else f'stroke="{BG}" stroke-width="0.8"'
        out.append(f'<circle class=pt data-x="{_g(p[0], 0)}" data-y="{_g(p[1], 4)}" cx="{x:.1f}" cy="{y:.1f}" '
                   f'r="3.2" {mark}><title>{_e(tip)}</title></circle>')
    out.append("</g>")
    return "".join(out)


def legend(entries: Sequence[tuple], x: float, width: float) -> tuple[str, int]:
    """Keys in rows under the panels, each as its series looks (colour, dash, filled or hollow marker): (svg, height
    used). An entry is (name, colour) or (name, colour, dash, hollow)."""
    # a cell as wide as the longest name at ~6.5 px a character (11 px system-ui), so no key runs into the next
    out, col, row, cw = [], 0, 0, max(90, 34 + 6.5 * max((len(e[0]) for e in entries), default=0))
    per_row = max(1, int(width // cw))
    for name, colour, *look in entries:
        dash, hollow = (look + ["", False])[:2]
        cx, cy = x + col * cw, H + 6 + row * 16
        fill = f'fill="{BG}" stroke="{colour}" stroke-width="1.4"' if hollow else f'fill="{colour}"'
        out.append(f'<g class=key data-key="{_e(name)}"><line x1="{cx:.1f}" y1="{cy + 5:.1f}" x2="{cx + 20:.1f}" '
                   f'y2="{cy + 5:.1f}" stroke="{colour}" stroke-width="1.6"' + (f' stroke-dasharray="{dash}"' if dash
                                                                                  else "")
                   + f'/><circle cx="{cx + 10:.1f}" cy="{cy + 5:.1f}" r="3.2" {fill}/><text x="{cx + 24:.1f}" '
                   f'y="{cy + 9:.1f}">{_e(name)}</text></g>')
        col += 1
        if col == per_row:
            col, row = 0, row + 1
    rows = row + (1 if col else 0)
    return "".join(out), rows * 16 + (8 if rows else 0)


def svg(plot_id: str, label: str, body: str, width: float = W, extra_height: int = 0) -> str:
    return (f'<svg id="{_e(plot_id)}" class=plot role=img aria-label="{_e(label)}" width="{width:.0f}" '
            f'height="{H + extra_height}" viewBox="0 0 {width:.0f} {H + extra_height}" font-size="11" fill="#e6e6e6" '
            f'xmlns="http://www.w3.org/2000/svg">{body}</svg>')


def _empty(plot_id: str, label: str, why: str) -> str:
    """A plot the run has no data for says so in words (and has no series), rather than drawing empty axes."""
    return f'<p class="muted no-data" id="{_e(plot_id)}" data-plot-empty="1">{_e(label)}: {_e(why)}</p>'


def _styles(doc: dict) -> dict[str, tuple[str, str, bool]]:
    """Each speculative method's (colour, dash, hollow), in registry order (style)."""
    spec = [mid for mid in doc.get("methods") or {} if mid != "normal"]
    return {mid: style(i) for i, mid in enumerate(spec)}


def _colours(doc: dict) -> dict[str, str]:
    return {mid: st[0] for mid, st in _styles(doc).items()}


def _method_series(fr: Frame, doc: dict, data: dict, label) -> tuple[str, list]:
    """Every method's series in its own look, and the legend's entries."""
    looks = _styles(doc)
    body = [series(fr, mid, ps, looks[mid][0], dash=looks[mid][1], hollow=looks[mid][2], label=label(mid, ps))
            for mid, ps in data.items()]
    return "".join(body), [(mid, *looks[mid]) for mid in data]


def interval_caption(labels: Sequence) -> str:
    """What a whisker is, said exactly: the order-statistic interval of the median (stats.summary.median_interval)
    with its label when every point shares it (e.g. "min-max of 3 rounds (covers the median with 75.0 %)"), else the
    rule and "each point's coverage in its tooltip". Never "bootstrap": these intervals are order statistics."""
    got = sorted({str(x) for x in labels if isinstance(x, str) and x})
    if len(got) == 1:
        return f"the order-statistic interval of the median: {got[0]}"
    return ("the order-statistic interval of the median (95 % from 6 rounds, below that the min-max; each point's "
            "coverage in its tooltip)")


def measured_verify_widths(doc: dict) -> list[int]:
    """The widths k whose verify forwards the decode loop timed (rows' loop_costs.verify[k].calls > 0): the fitted
    curve is drawn only there, not as if measured beyond."""
    out = set()
    for m in (doc.get("methods") or {}).values():
        for r in (m.get("rows") or {}).values():
            v = (r.get("loop_costs") or {}).get("verify") if isinstance(r.get("loop_costs"), dict) else None
            if not isinstance(v, dict) or not isinstance(v.get("k"), list) or not isinstance(v.get("calls"), list):
                continue  # the loop's verify record is {"k": [...], "calls": [...], "median": [...]}
            for k, calls in zip(v["k"], v["calls"]):
                if isinstance(k, int) and not isinstance(k, bool) and _num(calls) and calls > 0:
                    out.add(k)
    return sorted(out)


def bound_exceeded(doc: dict) -> list[int]:
    """The widths where a measured oracle row's median lies above the plotted bound."""
    bound = {int(w): v for w, v in (doc.get("upper_bound_speedup") or {}).items() if _num(v)}
    out = []
    for k, r in (doc.get("references") or {}).items():
        if k.startswith("oracle-w") and k[len("oracle-w"):].isdigit() and isinstance(r, dict):
            w = int(k[len("oracle-w"):])
            if w in bound and _num(r.get("speedup")) and r["speedup"] > bound[w]:
                out.append(w)
    return sorted(out)


# --- the figures -------------------------------------------------------------------------------------------

def speedup_vs_width(doc: dict) -> str:
    """Median paired speedup over greedy against the verify width, one line per method; whisker: the row's
    order-statistic interval of the median (its label in each tooltip)."""
    pid, label = "plot-speedup-width", "speedup over greedy against verify width, per method"
    colours = _colours(doc)
    data = {mid: sorted((int(w), r.get("speedup"), r.get("speedup_ci"), r.get("speedup_ci_label"))
                        for w, r in m["rows"].items())
            for mid, m in doc["methods"].items() if mid in colours}
    pts = [p for ps in data.values() for p in ps]
    if not pts:
        return _empty(pid, label, "no speculative method was measured")
    widths = sorted({p[0] for p in pts})
    ys = [v for p in pts for v in (p[1], *(p[2] or ()))]
    labels = {p[3] for p in pts}
    short = labels.pop().split(" (")[0] if len(labels) == 1 and None not in labels else "median interval"
    model = width_model(doc)
    every = sorted({*widths, *model})
    lo_w, hi_w = every[0], every[-1]
    xr = (lo_w - 0.5, hi_w + 0.5) if lo_w == hi_w else (lo_w - 0.04 * (hi_w - lo_w) - 0.3,
                                                          hi_w + 0.04 * (hi_w - lo_w) + 0.3)
    fr = Frame(xr, _range([*ys, *model.values()], include=(1.0,)), xticks=every, fmt_y="{:g}×",
               xlabel="verify width w", ylabel="speedup over greedy",
               title=f"speedup vs verify width (whisker: {short})")
    body = [fr.axes(), fr.hline(1.0, "1× normal"),
            curve(fr, "dflash, cost model on calibration prompts", list(model.items()), "#8a9aab", dash="2,3")]
    drawn, keys_in = _method_series(fr, doc, {mid: [p[:3] for p in ps] for mid, ps in data.items()},
                                    lambda mid, ps: lambda p: f"{mid} w{p[0]}: {_g(p[1])}× ("
                                    f"{dict((q[0], q[3]) for q in data[mid]).get(p[0]) or 'interval'} "
                                    f"{_g((p[2] or [None])[0])}–{_g((p[2] or [None, None])[1])})")
    body.append(drawn)
    body.append(_own_widths(fr, doc, data))
    keys, kh = legend(keys_in + ([("dflash cost model (calibration)", "#8a9aab", "2,3", True)] if model else []),
                      PAD["left"], W - PAD["left"])
    return svg(pid, label, "".join(body) + keys, extra_height=kh)


def width_model(doc: dict) -> dict[int, float]:
    """dflash's cost-model speedup on calibration prompts at every width the width choice evaluated (settings.
    width_choice.table): the widths the benchmark did not time, drawn as a model curve beside the measured points."""
    wc = (doc.get("settings") or {}).get("width_choice")
    table = wc.get("table") if isinstance(wc, dict) else None
    out = {}
    for r in table if isinstance(table, list) else []:
        if isinstance(r, dict) and isinstance(r.get("width"), int) and _num(r.get("model_speedup")):
            out[int(r["width"])] = float(r["model_speedup"])
    return dict(sorted(out.items()))


def _own_widths(fr: Frame, doc: dict, data: dict) -> str:
    """A ring around each method's own operating width where the run records one (`settings.method_widths`)."""
    own = (doc.get("settings") or {}).get("method_widths")
    if not isinstance(own, dict):
        return ""
    out = []
    for mid, ps in data.items():
        sel = own.get(mid).get("selected") if isinstance(own.get(mid), dict) else None
        hit = next((p for p in ps if p[0] == sel and _num(p[1])), None)
        if hit is not None:
            out.append(f'<circle class=own-width data-method="{_e(mid)}" data-x="{sel}" cx="{fr.x(sel):.1f}" '
                       f'cy="{fr.y(hit[1]):.1f}" r="7" fill="none" stroke="#e6e6e6" stroke-width="1.2">'
                       f"<title>{_e(mid)}: its own width {sel}</title></circle>")
    return "".join(out)


def tokens_per_call(doc: dict) -> str:
    """Tokens per target call against the verify width, one line per method (normal: 1). Deterministic for a fixed
    setting, so no whisker: the figure the gate's tokens-per-call check reads."""
    pid, label = "plot-tokens-per-call", "tokens per target call against verify width, per method"
    colours = _colours(doc)
    data = {mid: sorted((int(w), r.get("tokens_per_target_call")) for w, r in m["rows"].items()
                        if _num(r.get("tokens_per_target_call")))
            for mid, m in doc["methods"].items() if mid in colours}
    data = {k: v for k, v in data.items() if v}
    pts = [p for ps in data.values() for p in ps]
    if not pts:
        return _empty(pid, label, "no speculative method was measured")
    widths = sorted({p[0] for p in pts})
    xr = (widths[0] - 0.5, widths[-1] + 0.5)
    fr = Frame(xr, _range([p[1] for p in pts], include=(1.0,)), xticks=widths if len(widths) <= 16 else None,
               fmt_y="{:g}", xlabel="verify width w", ylabel="tokens per target call",
               title="tokens per target call (deterministic: no interval)")
    body = [fr.axes(), fr.hline(1.0, "1 = greedy")]
    drawn, keys_in = _method_series(fr, doc, data, lambda mid, ps: lambda p: f"{mid} w{p[0]}: {_g(p[1])} tokens "
                                    "per target call")
    body.append(drawn)
    keys, kh = legend(keys_in, PAD["left"], W - PAD["left"])
    return svg(pid, label, "".join(body) + keys, extra_height=kh)


def acceptance_by_position(doc: dict) -> str:
    """Conditional acceptance at each draft position (accepted at i / proposed at i) at each method's shown width."""
    pid, label = "plot-acceptance-position", "conditional acceptance per draft position, per method"
    colours = _colours(doc)
    data = {}
    for mid, m in doc["methods"].items():
        if mid not in colours:
            continue
        row = m["rows"].get(str(m["best"]["width"])) or {}
        pp = row.get("per_position_acceptance") or []
        data[mid] = [(i + 1, p) for i, p in enumerate(pp)]
    n = max((len(ps) for ps in data.values()), default=0)
    if not n:
        return _empty(pid, label, "no draft positions were measured")
    xr = (0.5, n + 0.5)
    # a little room below 0 % and above 100 %, so points there sit clear of the frame
    fr = Frame(xr, (-0.03, 1.03), xticks=list(range(1, n + 1)) if n <= 16 else None, fmt_y="{:.0%}",
               yticks=[0.0, 0.2, 0.4, 0.6, 0.8, 1.0],
               xlabel="draft position i", ylabel="accepted at i / proposed at i",
               title="acceptance per draft position (each method at its shown width)")
    body = [fr.axes()]
    shown = {mid: doc["methods"][mid]["best"]["width"] for mid in data}
    drawn, keys_in = _method_series(fr, doc, data, lambda mid, ps: lambda p: f"{mid} (w{shown[mid]}) position {p[0]}: "
                                    f"{_g(100 * p[1], 1)} %")
    body.append(drawn)
    keys, kh = legend(keys_in, PAD["left"], W - PAD["left"])
    return svg(pid, label, "".join(body) + keys, extra_height=kh)


def verify_cost(doc: dict) -> str:
    """Left: the verify-cost curve t_verify(w)/t_decode. Right: the bound (w+1)·t_decode/t_verify(w) a perfect free
    drafter would reach, against the oracle rows (replayed greedy drafts, measured: whisker = 95 % CI)."""
    pid, label = "plot-verify-cost", "verify-cost curve, the speedup bound and the oracle rows"
    fitted = {int(w): v for w, v in ((doc.get("verify_cost") or {}).get("ratio") or {}).items() if _num(v)}
    measured = measured_verify_widths(doc)
    # points at the widths the loop timed; the fitted curve drawn on to the block size as a line
    ratio = {w: v for w, v in fitted.items() if w in measured} if measured else dict(fitted)
    iso = (doc.get("verify_cost") or {}).get("isolated")
    isolated = {int(w): v for w, v in ((iso or {}).get("ratio") or {}).items() if _num(v)} if isinstance(iso, dict) \
        else {}
    bound = {int(w): v for w, v in (doc.get("upper_bound_speedup") or {}).items() if _num(v)}
    oracle = {int(k.split("-w", 1)[1]): r for k, r in (doc.get("references") or {}).items()
              if k.startswith("oracle-w") and k.split("-w", 1)[1].isdigit() and isinstance(r, dict)}
    if not (ratio or bound or oracle or isolated):
        return _empty(pid, label, "this run measured no verify-cost curve and no oracle rows")
    ws = sorted({*fitted, *isolated, *bound, *oracle})
    xr = (ws[0] - 0.5, ws[-1] + 0.5)
    ticks = ws if len(ws) <= 16 else None
    half = W
    left = Frame(xr, _range([*fitted.values(), *isolated.values()], include=(1.0,)), x0=0, width=half, xticks=ticks,
                 fmt_y="{:g}", xlabel="drafts verified w", ylabel="t_verify(w) / t_decode",
                 title="verify cost (1 = one greedy step)")
    oy = [v for r in oracle.values() for v in (r.get("speedup"), *(r.get("speedup_ci") or ()))]
    right = Frame(xr, _range([*bound.values(), *oy], include=(1.0,)), x0=half, width=half, xticks=ticks,
                  fmt_y="{:g}×", xlabel="verify width w", ylabel="speedup over greedy",
                  title="model bound vs oracle drafts (measured)")
    body = [left.axes(), left.hline(1.0), right.axes(), right.hline(1.0, "1× normal")]
    body.append(curve(left, "fitted curve (loop), to the block size", sorted(fitted.items()), "#56B4E9"))
    body.append(series(left, "verify cost", sorted(ratio.items()), "#56B4E9", line=False,
                       label=lambda p: f"t_verify({p[0]})/t_decode = {_g(p[1])} (loop-timed width, on the fit)"))
    body.append(series(left, "isolated (measured)", sorted(isolated.items()), "#E69F00", line=False, hollow=True,
                       label=lambda p: f"isolated t_verify({p[0]})/t_decode = {_g(p[1])} (measured at one context)"))
    body.append(series(right, "bound", sorted(bound.items()), "#F0E442", dash="5,3",
                       label=lambda p: f"bound at w{p[0]}: {_g(p[1])}×"))
    body.append(series(right, "oracle", [(w, r.get("speedup"), r.get("speedup_ci")) for w, r in sorted(oracle.items())],
                       "#009E73", label=lambda p: f"oracle w{p[0]}: {_g(p[1])}× measured ("
                       f"{(oracle.get(p[0]) or {}).get('speedup_ci_label') or 'interval'} "
                       f"{_g((p[2] or [None])[0])}–{_g((p[2] or [None, None])[1])})"))
    keys, kh = legend([("loop fit: timed widths (points), curve to B", "#56B4E9"),
                       ("isolated curve (measured)", "#E69F00", "", True), ("bound", "#F0E442", "5,3"),
                       ("oracle (measured)", "#009E73")], PAD["left"], 2 * W - PAD["left"])
    return svg(pid, label, "".join(body) + keys, width=2 * W, extra_height=kh)


def noise(doc: dict) -> str:
    """The A/A figure: every dflash-vs-dflash round at the ranking width (the ratio the selection compares, timed
    against itself) and normal's rounds against itself, in the order timed, with a band of ± the run's noise
    figure (the pooled robust SD of per-round log ratios that the noise flag reads)."""
    pid, label = "plot-noise", "A/A rounds: identical work timed against itself"
    n = doc.get("noise") or {}
    # normal timed against itself in the same rounds: its row's "speedup" is this A/A, not a speedup
    nrow = (((doc.get("methods") or {}).get("normal") or {}).get("rows") or {}).get("0") or {}
    aa = [x for x in nrow.get("speedup_rounds") or [] if _num(x)]
    aa = aa if len(aa) >= 2 else []  # one round shows no spread
    rk = doc.get("ranking") or {}
    base = rk.get("baseline")
    w = rk.get("width")
    brow = ((doc.get("methods") or {}).get(base or "") or {}).get("rows", {}).get(str(w)) or {}
    bb = [x for x in brow.get("vs_baseline_rounds") or [] if _num(x)] if rk.get("statistic") == "vs_baseline" else []
    if not aa and not bb:
        return _empty(pid, label, "this run timed no A/A rounds")
    sigma, th = n.get("sigma"), n.get("threshold")
    lo_b, hi_b = (math.exp(-sigma), math.exp(sigma)) if _num(sigma) else (1.0, 1.0)
    nmax = max(len(aa), len(bb))
    fr = Frame((0.5, nmax + 0.5), _range([*aa, *bb], include=(lo_b, hi_b)), fmt_y="{:.2f}",
               xticks=list(range(1, nmax + 1)) if nmax <= 20 else None, xlabel="round (in the order timed)",
               ylabel="ratio of walls (1 = identical)", title="A/A: the same work timed against itself")
    body = [fr.axes()]
    if _num(sigma):
        y0, y1 = fr.y(hi_b), fr.y(lo_b)
        gate = f", gate threshold {_g(100 * th, 1)} % (--bench-noise-threshold)" if _num(th) else ""
        body.append(f'<rect class=band x="{fr.left:.1f}" y="{y0:.1f}" width="{fr.right - fr.left:.1f}" '
                    f'height="{y1 - y0:.1f}" fill="#3d7eff" fill-opacity="0.12"><title>± the noise figure '
                    f'{_g(100 * sigma, 1)} %{gate}</title></rect>')
    body.append(fr.hline(1.0, "1 (identical)"))
    if aa:
        body.append(series(fr, "normal vs normal", list(enumerate(aa, 1)), "#f5c26b", line=False,
                           label=lambda p: f"normal vs normal, round {p[0]}: {_g(p[1], 4)}"))
    if bb:
        body.append(series(fr, f"{base} vs {base}", list(enumerate(bb, 1)), "#7fb2ff", line=False,
                           label=lambda p: f"{base} vs {base} at w{w}, round {p[0]}: {_g(p[1], 4)}"))
    entries = ([("normal vs normal", "#f5c26b")] if aa else []) + \
        ([(f"{base} vs {base} (w{w})", "#7fb2ff")] if bb else [])
    keys, kh = legend(entries, PAD["left"], W - PAD["left"])
    return svg(pid, label, "".join(body) + keys, extra_height=kh)
