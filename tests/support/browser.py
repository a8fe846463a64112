"""Headless Chromium for the page tests: one session fixture, the DOM after the page's scripts ran, and a probe
that asks the rendered page what it drew (points with a box inside their plot, the visible table columns).

Why a probe and not the HTML text: a plot can be in the markup and still draw nothing (a NaN coordinate, a point
outside the viewBox, a stylesheet that hides it); the browser's own geometry (getBBox, getClientRects) says what
a reader sees. The probe runs in a copy of the page with one script appended, and writes its findings as JSON
into the DOM that `--dump-dom` prints.
"""

from __future__ import annotations

import html
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run")

PROBE_JS = """
addEventListener('load',()=>{
 const out={plots:{},empty:[],tables:{}};
 document.querySelectorAll('svg.plot').forEach(svg=>{
  const vb=svg.viewBox.baseVal,series={};
  svg.querySelectorAll('g.series').forEach(g=>{
   const pts=[...g.querySelectorAll('circle.pt')];
   const drawn=pts.filter(c=>{const b=c.getBBox(),x=c.cx.baseVal.value,y=c.cy.baseVal.value;
     return b.width>0&&b.height>0&&x>=0&&x<=vb.width&&y>=0&&y<=vb.height;});
   series[g.dataset.series]={points:pts.length,drawn:drawn.length,ys:pts.map(c=>+c.dataset.y),
     whiskers:g.querySelectorAll('line.whisker').length,lines:g.querySelectorAll('path.line').length};
  });
  const r=svg.getBoundingClientRect();
  out.plots[svg.id]={series:series,width:r.width,height:r.height};
 });
 document.querySelectorAll('[data-plot-empty]').forEach(e=>out.empty.push(e.id));
 document.querySelectorAll('table[id]').forEach(t=>{
  const cells=[...t.rows[0].cells];
  out.tables[t.id]={all:cells.length,visible:cells.filter(c=>c.getClientRects().length>0&&
    getComputedStyle(c).display!=='none').map(c=>c.textContent)};
 });
 const pre=document.createElement('pre');pre.id='probe-out';pre.textContent=JSON.stringify(out);
 document.body.appendChild(pre);
});
"""


class Browser:
    def __init__(self, exe: str, profile: Path):
        self.exe, self.profile = exe, profile

    def _run(self, *args: str, timeout: int = 180) -> subprocess.CompletedProcess:
        return subprocess.run([self.exe, *FLAGS, f"--user-data-dir={self.profile}", *args], capture_output=True,
                              text=True, timeout=timeout)

    def dom(self, page: Path, budget_ms: int = 3000) -> str:
        """The DOM after the page's scripts ran for `budget_ms` of virtual time."""
        out = self._run(f"--virtual-time-budget={budget_ms}", "--dump-dom", Path(page).resolve().as_uri())
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout

    def probe(self, page: Path) -> dict:
        """What the rendered page drew: per plot and series the points (and those with a box inside the plot),
        the whiskers, the y values; the plots that say they have no data; per table the visible header cells."""
        page = Path(page)
        copy = page.with_name(f".probe-{page.name}")
        copy.write_text(page.read_text(encoding="utf-8").replace("</body>", f"<script>{PROBE_JS}</script></body>"),
                        encoding="utf-8")
        try:
            dom = self.dom(copy)
        finally:
            copy.unlink()
        raw = dom.split('<pre id="probe-out">', 1)[1].split("</pre>", 1)[0]
        return json.loads(html.unescape(raw))

    def screenshot(self, page: Path, out: Path, size: str = "1280,900") -> Path:
        self._run("--hide-scrollbars", f"--window-size={size}", f"--screenshot={out}", Path(page).resolve().as_uri())
        return out


def find_chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.fixture(scope="session")
def chromium(tmp_path_factory) -> Browser:
    """The one headless browser of the test session (skipped where none is installed, a failure under CI)."""
    exe = find_chromium()
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail(".ci/run installs Debian's chromium; none was found on PATH")
        pytest.skip("no headless Chromium on this machine (Debian: apt-get install chromium)")
    return Browser(exe, tmp_path_factory.mktemp("chromium-profile"))


def expected_series(doc: dict) -> dict[str, dict[str, list[float]]]:
    """Per plot id, per series: the y values benchmark.json holds for it, in x order. Written from the document's
    field meanings (docs/report-schema.md), independently of dflash_core/report/plots.py."""
    ms = doc["methods"]
    spec = [mid for mid in ms if mid != "normal"]
    verify = [(r.get("loop_costs") or {}).get("verify") or {} for m in ms.values() for r in m["rows"].values()]
    measured = {int(k) for v in verify for k, calls in zip(v.get("k") or [], v.get("calls") or []) if calls}
    normal_aa = list((((ms.get("normal") or {}).get("rows") or {}).get("0") or {}).get("speedup_rounds") or [])
    out = {
        "plot-speedup-width": {mid: [r["speedup"] for _, r in sorted(ms[mid]["rows"].items(),
                                                                     key=lambda kv: int(kv[0]))] for mid in spec},
        "plot-acceptance-position": {
            mid: list(ms[mid]["rows"][str(ms[mid]["best"]["width"])].get("per_position_acceptance") or [])
            for mid in spec},
        "plot-tokens-per-call": {mid: [r["tokens_per_target_call"] for _, r in sorted(ms[mid]["rows"].items(),
                                                                                    key=lambda kv: int(kv[0]))]
                                 for mid in spec},
        "plot-verify-cost": {
            # the fitted curve only at the widths the loop timed (rows' loop_costs.verify[k].calls > 0)
            "verify cost": [v for w, v in sorted((doc.get("verify_cost") or {}).get("ratio", {}).items(),
                                                 key=lambda kv: int(kv[0])) if not measured or int(w) in measured],
            # the isolated curve (test_verify_cost: every width to the block size, measured at one context)
            "isolated (measured)": [v for _, v in sorted((((doc.get("verify_cost") or {}).get("isolated") or {})
                                                          .get("ratio") or {}).items(), key=lambda kv: int(kv[0]))],
            "bound": [v for _, v in sorted((doc.get("upper_bound_speedup") or {}).items(), key=lambda kv: int(kv[0]))],
            "oracle": [r["speedup"] for _, r in sorted(((int(k[len("oracle-w"):]), r) for k, r in
                                                         (doc.get("references") or {}).items()
                                                         if k.startswith("oracle-w")), key=lambda kv: kv[0])]},
        "plot-noise": {"normal vs normal": normal_aa if len(normal_aa) >= 2 else []},
    }
    rk = doc.get("ranking") or {}
    if rk.get("statistic") == "vs_baseline":
        b = rk["baseline"]
        out["plot-noise"][f"{b} vs {b}"] = list(ms[b]["rows"][str(rk["width"])]["vs_baseline_rounds"])
    return {pid: {k: v for k, v in s.items() if v} for pid, s in out.items()}


def assert_plots_drawn(probe: dict, doc: dict) -> None:
    """Every plot is drawn, every series has one visible point per value benchmark.json holds, at that value."""
    want = expected_series(doc)
    assert not probe["empty"], f"plots drawn without data: {probe['empty']}"
    for pid, series in want.items():
        assert series, f"benchmark.json has no data for {pid}: the fixture should exercise every plot"
        got = probe["plots"].get(pid)
        assert got is not None, f"{pid} is not on the page"
        assert got["width"] > 100 and got["height"] > 100, (pid, got["width"], got["height"])
        assert set(got["series"]) == set(series), (pid, sorted(got["series"]), sorted(series))
        for name, ys in series.items():
            s = got["series"][name]
            assert s["points"] == s["drawn"] == len(ys), (pid, name, s, len(ys))
            assert s["ys"] == pytest.approx(ys, abs=1e-4), (pid, name)
    for name, s in probe["plots"]["plot-speedup-width"]["series"].items():
        assert s["whiskers"] == s["points"], f"{name}: a speedup without its 95 % CI whisker"
