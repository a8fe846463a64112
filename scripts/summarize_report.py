"""Markdown tables from a canonical reports/<device>/benchmark.json (for notes and docs).

Usage: python scripts/summarize_report.py reports/cpu/benchmark.json

When to run: after a benchmark run, to paste its figures into a study folder's README (studies/README.md).
"""

from __future__ import annotations

import json
import sys


def f(x, nd=2):
    return "–" if x is None else f"{x:.{nd}f}"


def main(path: str) -> None:
    with open(path, encoding="utf-8") as fh:
        d = json.load(fh)
    st, tg = d["settings"], d["target"]
    print(f"target {tg.get('name')} ({tg.get('dtype')}), {st.get('prompt_limit')} prompts x {st.get('tokens')} tokens, "
          f"{st.get('rounds')} paired rounds, {st.get('threads')} threads, widths {st.get('widths')}; "
          f"all exact: {d['exactness']['all_exact']}\n")
    noise = d.get("noise") or {}
    print(f"noise figure {f(noise.get('sigma'), 3)} (threshold {noise.get('threshold')}, "
          f"noisy: {noise.get('noisy')}); "
          f"leader {(d.get('leader') or {}).get('method')}, winner {(d.get('winner') or {}).get('method')}\n")
    print("| # | method | width (choice) | paired speedup, median [interval] | group | cost-model | measured/model | "
          "tok/target call | accept verified / drafted | rounds vs normal / vs dflash | "
          "activity: rounds / positions differ, net |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for mid, m in sorted(d["methods"].items(), key=lambda kv: kv[1].get("index") or 0):
        b = m["best"]
        r = m["rows"][str(b["width"])]
        ci = b.get("speedup_ci") or [None, None]
        a = r.get("activity") or {}
        act = (a.get("status", "–") if a.get("status") in (None, "baseline") else
               f"{a['status']}: {f(100 * a['rounds_differ_share'], 0)}% / {f(100 * a['positions_differ_share'], 0)}%, "
               f"{a['net']:+d}")
        grp = "–" if b.get("rank_group") is None else f"G{b['rank_group']}"
        drafted = r.get("acceptance_rate_drafted", b["acceptance_rate"])
        print(f"| {m.get('index', 0):02d} | {mid} | {b['width']} ({b.get('selection', '?')}) | "
              f"{f(b['speedup'])}× [{f(ci[0])}–{f(ci[1])}] | {grp} | "
              f"{f(b.get('model_speedup'))}× | {f(b.get('measured_over_model'))}"
              f"{' (!)' if b.get('unexplained_overhead') else ''} | {f(b['tokens_per_target_call'])} | "
              f"{f(100 * b['acceptance_rate'], 1)}% / {f(100 * drafted, 1)}% | "
              f"{r.get('rounds')} / {r.get('compared_rounds', r.get('rounds'))} | {act} |")
    widths = sorted({int(w) for m in d["methods"].values() for w in m["rows"] if int(w) > 0})
    print("\n| method | " + " | ".join(f"w={w}: speedup / τ / accept" for w in widths) + " |")
    print("|---|" + "---|" * len(widths))
    for mid, m in d["methods"].items():
        if mid == "normal":
            continue
        cells = []
        for w in widths:
            r = m["rows"].get(str(w))
            cells.append("–" if r is None else f"{f(r['speedup'])}× / {f(r['tokens_per_target_call'])} / "
                         f"{f(100 * r['acceptance_rate'], 0)}%")
        print(f"| {mid} | " + " | ".join(cells) + " |")
    print("\nper-position acceptance (conditional) at each method's widest width:")
    for mid, m in d["methods"].items():
        if mid == "normal":
            continue
        w = max(m["rows"], key=int)
        print(f"- {mid} w={w}: " + ", ".join(f(p) for p in m["rows"][w]["per_position_acceptance"]))
    print("\n| reference (not a method) | tok/s | vs normal | exact |")
    print("|---|---|---|---|")
    for k, r in sorted(d["references"].items()):
        print(f"| {k} | {f(r['tokens_per_second'], 1)} | {f(r['speedup'])}× [{f(r.get('speedup_q1'))}–"
              f"{f(r.get('speedup_q3'))}] | {r['exact']} |")
    vc = d.get("verify_cost") or {}
    if vc:
        print(f"\nverify cost t_verify(w)/t_decode (t_decode {f(1000 * vc['t_decode_seconds'])} ms): "
              + ", ".join(f"w={w}: {f(v)}" for w, v in vc["ratio"].items()))
        print("upper bound (w+1)·t_dec/t_ver(w): " + ", ".join(f"w={w}: {f(v)}×"
                                                             for w, v in d["upper_bound_speedup"].items()))
    for g in d.get("goals", []):
        print(f"- goal {g['goal']}: {f(g['figure'])} ({'met' if g['ok'] else 'missed'})")
    print("\ncalibration (calibration prompts only):")
    for mid, rec in d.get("calibration", {}).items():
        sel = rec.get("selected_options", rec.get("selected", rec.get("options")))
        print(f"- {mid}: selected {json.dumps(sel)}; {f(rec.get('seconds'), 1)} s")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "reports/cpu/benchmark.json")
