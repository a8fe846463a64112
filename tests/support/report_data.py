"""Saved pytest-benchmark runs built in memory for the report tests (plain data, no model)."""

from __future__ import annotations

import itertools


def bench_row(method, width, device="cpu", speedup=1.0, exact=True, rounds=None, tau=None):
    rounds = rounds or [speedup]
    extra = {"method": method, "device": device, "width": width, "tokens_per_second": 100.0 * speedup,
             "tokens_per_second_iqr": 1.0, "normal_tokens_per_second": 100.0, "speedup": speedup,
             "speedup_iqr": 0.05, "speedup_rounds": rounds, "acceptance_rate": 0.5, "rounds": len(rounds),
             "tokens_per_target_call": 1.0 + width / 2 if tau is None else tau, "accept_histogram": [1] * (width + 1),
             "per_position_acceptance": [0.5] * width, "guidance_work": 0, "overhead_fraction": 0.01,
             "target_calls": width + 1, "draft_calls": width,
             "exact": exact, "verdicts": {"exact": 1} if exact else {"diverged": 1}}
    return {"name": f"test_decode[{method}-{device}-w{width}]",
            "fullname": f"benchmarks/test_decode.py::test_decode[{method}-{device}-w{width}]",
            "stats": {"median": 0.1, "iqr": 0.01, "rounds": 3}, "extra_info": extra}


_RUNS = itertools.count()


def saved_run(benchmarks, weights="w" * 64):
    """A schema 7 saved run of `benchmarks` (its noise and ranking-rounds records as BenchSession writes them).
    Each call is another run: its datetime's microseconds count the calls, as two sessions never share a datetime
    (the report pools a run given twice once: report.build.distinct_runs)."""
    return {"machine_info": {"node": "n", "machine": "x86_64", "cpu": {"brand_raw": "cpu"}},
            "commit_info": {"id": "abc", "dirty": False}, "datetime": f"2026-11-29T00:00:00.{next(_RUNS):06d}",
            "version": "5.3.1",
            "benchmarks": benchmarks,
            "dflash": {"methods": {"normal": {"index": 0, "label": "Normal", "mechanism": "m", "complexity": "c",
                                              "stages": []},
                                   "dflash": {"index": 1, "label": "DFlash", "mechanism": "argmax",
                                              "complexity": "c", "stages": ["a", "b", "c", "d"]}},
                       "traces": {"dflash-w2": [{"draft": [5, 6], "accepted": 1, "token": 9, "bonus": False}]},
                       "settings": {"tokens": 8, "widths": [0, 1, 2]},
                       "target": {"name": "mini", "config_sha256": "c" * 64, "weights_sample_sha256": weights,
                                  "content_sha256": "e" * 64, "weights_sha256": "f" * 64,
                                  "dtype": "float32"},
                       "provenance": {"artifacts": {"files": {"drafter.pt": {"sha256": "d" * 64, "bytes": 1}}}},
                       "noise": {"threshold": 0.03, "figure": "robust"}, "ranking_rounds": None}}


def loop_costs(width: int = 0, step: float = 0.008, verify: float = 0.01, prompts: int = 4, tokens: int = 48) -> dict:
    """A case's `loop_costs` (bench.costmodel.loop_block): greedy's (width 0) or a speculative case's whose every
    verify checks `width` drafts in `verify` seconds, all accepted."""
    prefill = prompts * 0.02
    if not width:
        t = prefill + prompts * (tokens - 1) * step
        return {"prompts": prompts, "tokens": prompts * tokens, "prefill": prefill, "step": step, "wall": t,
                "target": t, "draft": 0.0, "select": 0.0}
    calls = prompts * -(-(tokens - 1) // (width + 1))
    t = prefill + calls * verify
    return {"prompts": prompts, "tokens": prompts * tokens, "prefill": prefill, "target": t, "draft": 0.0,
            "select": 0.0, "wall": t, "verify": {"k": [width], "calls": [calls], "median": [verify]},
            "schedule": {"k": [width], "calls": [calls]}}


HOSTILE = "<img src=x onerror=\"document.body.setAttribute('data-'+'pwned','1')\"><script>alert(1)</script>"


def hostile_saved() -> dict:
    """A saved run with markup in every free-text field a page shows (also used by the browser test)."""
    d = saved_run([bench_row("normal", 0), bench_row("dflash", 2, speedup=1.5)])
    d["machine_info"].update(node=HOSTILE, system=HOSTILE)
    d["commit_info"]["id"] = HOSTILE
    d["datetime"] = "<img src=x onerror=alert(3)>"  # the schema bounds a datetime to 64 characters
    lab = d["dflash"]
    lab["settings"].update(tokens=HOSTILE, prompt_limit=HOSTILE, rounds=HOSTILE, threads=HOSTILE)
    lab["target"].update(name=HOSTILE, dtype=HOSTILE, content_sha256=HOSTILE)
    lab["provenance"]["artifacts"]["files"][HOSTILE] = {"sha256": HOSTILE, "bytes": 1}
    lab["methods"]["dflash"].update(label=HOSTILE, mechanism=HOSTILE)
    lab["calibration"] = {"act": {"selected": HOSTILE, "table": [{"key": HOSTILE, "tokens_per_second": 1.0}]}}
    lab["traces"] = {"dflash-w2": [{"draft": [5, 6], "accepted": 1, "token": 9, "bonus": False},
                                   {"draft": [6, 5], "accepted": 2, "token": 6, "bonus": True}]}
    lab["token_text"] = {"5": "<!--<script>", "6": HOSTILE, "9": "</script><img src=y onerror=alert(2)>"}
    lab["trace_prompt"] = HOSTILE
    return d


def known_rounds(center: float, noise: float, n: int = 24, seed: int = 0) -> list[float]:
    """`n` paired speedup rounds with a known true value `center` and known noise (sd `noise`, seeded)."""
    import numpy as np

    return [float(x) for x in center + noise * np.random.default_rng(seed).standard_normal(n)]


def rich_saved() -> dict:
    """A saved run with every registry method at three widths, the oracle rows, the loop's verify timings (dflash's)
    and the isolated verify-cost curve, normal's rounds against itself, per-round ratios against dflash and the
    traced prompt: every figure of the pages has data."""
    from dflash_core.methods import METHOD_LIST

    widths = (3, 7, 15)
    rows = [bench_row("normal", 0, rounds=known_rounds(1.0, 0.03, n=6, seed=1))]
    rows[0]["extra_info"]["loop_costs"] = loop_costs()
    for i, m in enumerate(METHOD_LIST[1:]):
        for w in widths:
            sp = 1.5 + 0.08 * w ** 0.5 * (1 + 0.05 * (i % 5)) - 0.01 * i
            r = bench_row(m.id, w, speedup=sp, rounds=known_rounds(sp, 0.05, n=6, seed=i * 31 + w))
            r["extra_info"]["per_position_acceptance"] = [max(0.05, 0.95 - 0.04 * k - 0.01 * i) for k in range(w)]
            r["extra_info"]["vs_baseline_rounds"] = known_rounds(1 + 0.01 * (7 - i), 0.01, n=6, seed=i + w)
            if m.id == "dflash":
                r["extra_info"]["loop_costs"] = loop_costs(w, verify=0.008 * (1 + 0.03 * w))
            rows.append(r)
    for w in widths:
        sp = 1.0 + 0.4 * w ** 0.8
        rows.append({"name": f"test_reference[oracle-w{w}-cpu]", "fullname": "x", "stats": {},
                     "extra_info": {"reference": f"oracle-w{w}", "device": "cpu", "tokens_per_second": 300.0,
                                    "speedup": sp, "speedup_iqr": 0.1, "speedup_rounds": known_rounds(sp, 0.1, 5, w),
                                    "exact": True, "verdicts": {"exact": 1}}})
    rows.append({"name": "test_verify_cost", "fullname": "x", "stats": {},
                 "extra_info": {"verify_cost": {"ratio": {str(w): 1 + 0.03 * w for w in range(1, 17)},
                                                "t_decode_seconds": 0.01}, "device": "cpu"}})
    s = saved_run(rows)
    s["dflash"]["methods"] = {m.id: {"index": m.index, "label": m.label, "mechanism": m.mechanism,
                                     "complexity": m.complexity, "stages": list(m.stages)} for m in METHOD_LIST}
    s["dflash"]["traces"] = {"dflash-w3": [{"draft": [5, 6, 9], "accepted": 2, "token": 9, "bonus": False}]}
    s["dflash"]["token_text"] = {"5": " return", "6": " hidden", "9": "_states"}
    s["dflash"]["trace_prompt"] = "def forward(self, hidden_states):"
    s["dflash"]["settings"]["ranking_width"] = 15
    return s
