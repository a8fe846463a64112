"""Screenshots of the report pages for the docs (docs/img/), taken in headless Chromium from a report folder.

    python scripts/screenshots.py reports/cpu [--compare reports/compare] [--out docs/img]

Writes index-top.png (the first screen of index.html), report-top.png (the first screen of report.html) and one
PNG per figure of report.html (plot-*.png); with --compare, compare-top.png (the first screen of the folder's
compare.html, written by `python -m dflash_core.report compare`). A figure is shot alone: its <figure> and the
page's stylesheet in a page of their own, sized to the figure, so no cropping tool is needed. Needs Debian's
`chromium` (or chromium-browser / google-chrome) on PATH; nothing is fetched from the network.

When to run: after a change to the report pages, to refresh docs/img/ from a fresh `./lab bench` report.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars"]
PLOT_IDS = ("plot-speedup-width", "plot-acceptance-position", "plot-tokens-per-call", "plot-verify-cost", "plot-noise")


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if exe is None:
        sys.exit("error: no chromium on PATH (Debian: apt-get install chromium)")
    return exe


def shoot(exe: str, page: Path, out: Path, width: int, height: int, profile: Path, budget_ms: int = 2500) -> Path:
    """One PNG of `page`'s first `width` x `height` pixels after `budget_ms` of virtual time (scripts ran)."""
    subprocess.run([exe, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
                    f"--virtual-time-budget={budget_ms}", f"--screenshot={out}", page.resolve().as_uri()],
                   check=True, capture_output=True, timeout=180)
    return out


def figure_page(report_html: str, plot_id: str) -> tuple[str, int, int] | None:
    """A page holding only the figure of `plot_id` (caption kept, the table toggle dropped) and its pixel size."""
    style = report_html.split("<style>", 1)[1].split("</style>", 1)[0]
    for part in report_html.split("<figure>")[1:]:
        fig = part.split("</figure>", 1)[0]
        if f'id="{plot_id}"' not in fig:
            continue
        fig = re.sub(r"<details>.*?</details>", "", fig, flags=re.S)
        svg = re.search(r'<svg id="' + re.escape(plot_id) + r'"[^>]* width="([0-9.]+)" height="([0-9.]+)"', fig)
        if svg is None:
            return None  # the run has no data for this figure: nothing to show
        w, h = int(float(svg.group(1))), int(float(svg.group(2)))
        page = (f"<!doctype html><html><head><meta charset=utf-8><style>{style} main{{padding:12px}}</style></head>"
                f"<body><main><figure>{fig}</figure></main></body></html>")
        return page, w + 40, h + 110
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reports", type=Path, help="a report folder (reports/cpu) holding index.html and report.html")
    ap.add_argument("--compare", type=Path, help="a folder holding compare.html (report compare --out DIR)")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "docs" / "img")
    a = ap.parse_args(argv)
    if a.compare is not None and not (a.compare / "compare.html").is_file():
        sys.exit(f"error: {a.compare} holds no compare.html (pass the --out folder of report compare)")
    folder = a.reports if (a.reports / "report.html").is_file() else a.reports / "cpu"
    if not (folder / "report.html").is_file() or not (folder / "index.html").is_file():
        sys.exit(f"error: {a.reports} holds no report.html and index.html (pass reports/<device>)")
    exe = chromium()
    a.out.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory() as tmp:
        profile = Path(tmp) / "profile"
        written.append(shoot(exe, folder / "index.html", a.out / "index-top.png", 1280, 1000, profile))
        written.append(shoot(exe, folder / "report.html", a.out / "report-top.png", 1280, 1000, profile))
        if a.compare is not None:
            written.append(shoot(exe, a.compare / "compare.html", a.out / "compare-top.png", 1280, 900, profile))
        report = (folder / "report.html").read_text(encoding="utf-8")
        for pid in PLOT_IDS:
            fig = figure_page(report, pid)
            if fig is None:
                print(f"{pid}: no data in this report, not shot", file=sys.stderr)
                continue
            page, w, h = fig
            src = Path(tmp) / f"{pid}.html"
            src.write_text(page, encoding="utf-8")
            written.append(shoot(exe, src, a.out / f"{pid}.png", w, h, profile))
    for p in written:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
