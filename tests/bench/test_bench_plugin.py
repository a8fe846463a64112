"""The benchmark matrix and the report plugin, tested the way pytest-benchmark tests itself.

A tiny hybrid LFM2 with a real byte-level tokenizer is saved and prepared; then `pytest benchmarks` runs in a
fresh subprocess (pytester's `runpytest_subprocess`) against a copy of the lab's conftest, pytest.ini and
benchmarks/, and the saved pytest-benchmark JSON, the canonical report and its pages are checked.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[2]
SCHEMA = REPO / "dflash_core" / "report" / "benchmark.schema.json"
WIDTHS = (1, 2)


@pytest.fixture(scope="module")
def tiny_lab(tmp_path_factory):
    """A tiny tokenized target checkpoint, prepared (every fitter, in miniature) into its own DFLASH_HOME."""
    from dflash_core.testing import build_tiny_lab

    lab = build_tiny_lab(tmp_path_factory.mktemp("bench-lab"))
    assert lab["tokenizer"]
    return lab


def _copy_lab(dest: Path) -> None:
    for name in ("conftest.py", "pytest.ini"):
        shutil.copy(REPO / name, dest / name)
    shutil.copytree(REPO / "benchmarks", dest / "benchmarks", ignore=shutil.ignore_patterns("__pycache__"))


def _env(monkeypatch, lab, reports: Path) -> None:
    monkeypatch.setenv("DFLASH_HOME", str(lab["home"]))
    monkeypatch.setenv("DFLASH_REPORTS", str(reports))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))


@pytest.fixture(scope="module")
def smoke_run(tiny_lab, tmp_path_factory):
    """One real `pytest benchmarks --smoke` run (a subprocess, as runpytest_subprocess does), shared by the
    checks below so the matrix runs once."""
    import sys

    d = tmp_path_factory.mktemp("smoke-run")
    _copy_lab(d)
    env = {**os.environ, "DFLASH_HOME": str(tiny_lab["home"]), "DFLASH_REPORTS": str(d / "reports"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "benchmarks", "-p", "no:cacheprovider", "--smoke",
         "--target", str(tiny_lab["ckpt"]), "--bench-widths", ",".join(map(str, WIDTHS)),
         "--benchmark-autosave", f"--benchmark-storage=file://{d / '.benchmarks'}", "--benchmark-json=out.json"],
        cwd=d, env=env, capture_output=True, text=True, timeout=1200)
    return {"dir": d, "proc": proc, "out": d / "out.json", "reports": d / "reports" / "cpu"}


def test_smoke_run_passes_and_names_the_report(smoke_run):
    proc = smoke_run["proc"]
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "dflash report:" in proc.stdout and str(smoke_run["reports"]) in proc.stdout


def test_each_case_prints_its_result_as_it_finishes(smoke_run):
    """Not only dots for minutes: one line per case with its speedup, tokens per call and verdict."""
    out = smoke_run["proc"].stdout
    lines = [ln for ln in out.splitlines() if ln.startswith("dflash case ")]
    names = {b["name"] for b in json.loads(smoke_run["out"].read_text())["benchmarks"]}
    pat = re.compile(r"^dflash case (test_\w+\[[^\]]+\]): speedup [0-9.]+x( tok/call [0-9.]+)? (exact|DIVERGED)")
    assert {m.group(1) for ln in lines if (m := pat.match(ln))} == names - {"test_verify_cost"}
    assert any("test_decode[dflash-cpu-w2]: " in ln and " tok/call " in ln and " exact" in ln for ln in lines)
    assert not any("IQR" in ln for ln in lines)  # one round each (--smoke): no spread was measured, none is shown
    progress = [ln for ln in out.splitlines() if ln.startswith("dflash progress: ")]
    total = len(names) + 2  # every benchmark item: the cases, test_rounds and test_ranking_rounds
    assert len(progress) == total and progress[-1].startswith(f"dflash progress: {total}/{total} items, ")
    clock = r"([0-9]+s|[0-9]+m[0-9]{2}s|[0-9]+h[0-9]{2}m)"  # progress.clock: 42s, 3m05s, 1h02m (a loaded machine)
    assert re.match(rf"^dflash progress: 1/[0-9]+ items, {clock} elapsed, ~{clock} left$", progress[0]), progress[0]
    from dflash_core.methods import calibrated

    searched = len([m for m in calibrated() if m.calibration.reuses is None])  # V13 reuses V10's choice
    assert f"calibration ({searched} methods x 2 widths): {2 * searched}/{2 * searched}, " in out  # logs its progress


def test_stable_benchmark_ids(smoke_run):
    from dflash_core.bench.peers import REFERENCES
    from dflash_core.methods import speculative_ids

    names = {b["name"] for b in json.loads(smoke_run["out"].read_text())["benchmarks"]}
    decode = {"test_decode[normal-cpu-w0]"} | {f"test_decode[{m}-cpu-w{w}]" for m in speculative_ids() for w in WIDTHS}
    refs = {f"test_reference[{r}-cpu]" for r in (*REFERENCES, *(f"oracle-w{w}" for w in WIDTHS))}
    assert len(speculative_ids()) == 15  # the seed's 14 and the lab's own suffix_dflash
    assert names == decode | refs | {"test_verify_cost"}


def test_saved_json_holds_plain_numbers(smoke_run, tiny_lab):
    raw = smoke_run["out"].read_text()
    assert "UNSERIALIZABLE" not in raw and "NaN" not in raw
    doc = json.loads(raw)
    for b in doc["benchmarks"]:
        if b["name"].startswith("test_decode"):
            ex = b["extra_info"]
            assert ex["exact"] is True, b["name"]
            assert ex["new_tokens"] == 8 and ex["prompts"] == 1
            assert sum(ex["accept_histogram"]) == ex["target_calls"]
            assert 0.0 <= ex["acceptance_rate"] <= 1.0
    assert doc["dflash"]["target"]["name"] == str(tiny_lab["ckpt"])
    assert doc["dflash"]["provenance"]["artifacts"]["files"], "artifact hashes must be recorded"
    saved = list((smoke_run["dir"] / ".benchmarks").rglob("0001_*.json"))
    assert len(saved) == 1, "--benchmark-autosave must store the run for pytest-benchmark compare"


def test_report_validates_against_schema(smoke_run):
    import jsonschema

    doc = json.loads((smoke_run["reports"] / "benchmark.json").read_text())
    jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text())).validate(doc)
    assert doc["exactness"] == {"all_exact": True, "failures": []}
    from dflash_core.methods import METHOD_LIST

    assert set(doc["methods"]) >= {"normal", "dflash", "simple_parareal_v14"}
    assert len(doc["methods"]) == len(METHOD_LIST)
    assert {"generate", "prompt_lookup", "assisted", "oracle-w1", "oracle-w2"} <= set(doc["references"])
    assert doc["provenance"]["versions"]["transformers"] == "5.24.0"
    assert not list(smoke_run["reports"].glob("*.part")), "writes must be atomic"
    # the noise figure comes from the ranking rounds (--smoke: 4 per case), its threshold is the option's
    assert doc["noise"]["sigma"] is not None and doc["noise"]["threshold"] == 0.03 and doc["noise"]["aa"]["rounds"] == 4
    assert all(m["best"]["speedup_ci"][0] <= m["best"]["speedup"] <= m["best"]["speedup_ci"][1]
               for m in doc["methods"].values())
    assert doc["headline"].startswith("On ") and doc["ranking"]["rule"] == "mcb"
    # a loaded machine's noise can flag a smoke round as impossible (report.impossible); nothing else is a limitation
    assert all("beyond what the run can physically reach" in x for x in doc["limitations"]), doc["limitations"]


def test_every_case_carries_its_activity_and_ranking_record(smoke_run):
    """Mechanism activity (docs/design.md §9) and the fixed ranking rounds reach benchmark.json through the saved
    run (§7); the ranking width was chosen on calibration prompts and every round's leg order is saved."""
    from dflash_core.methods import METHODS, speculative_ids

    saved = json.loads(smoke_run["out"].read_text())
    doc = json.loads((smoke_run["reports"] / "benchmark.json").read_text())
    lead = doc["ranking_rounds"]["width"]
    assert lead in WIDTHS and doc["ranking"]["width"] == lead == doc["settings"]["ranking_width"]
    assert doc["ranking"]["width_chosen"] == "calibration" and doc["ranking"]["statistic"] == "vs_baseline"
    assert "race" not in doc and "dflash" in doc["position_effect"]["rows"] and doc["position_effect"]["randomised"]
    for b in saved["benchmarks"]:
        if b["name"].startswith("test_decode[") and "[normal-" not in b["name"]:
            ex = b["extra_info"]
            assert {"activity", "drafted", "acceptance_rate_drafted", "vs_baseline_rounds"} <= set(ex), b["name"]
            # every timed round is in pytest-benchmark's stats; only the rounds with a normal leg are speedups
            assert len(ex["vs_baseline_rounds"]) == ex["compared_rounds"] == b["stats"]["rounds"]
            assert ex["rounds"] == len(ex["speedup_rounds"]) == 1  # --smoke: 1 base round
            assert ("ranking" in ex) == (ex["width"] == lead), b["name"]  # only the ranking width's cases
            assert len(ex["leg_orders"]) == ex["compared_rounds"] and ex["leg_orders"][0] == "nbm"
            if "ranking" in ex:  # --smoke: 1 base round, then 3 ranking rounds to the fixed 4
                assert ex["ranking"] == {"rounds": 4, "top_up_rounds": 3} == {
                    "rounds": ex["compared_rounds"], "top_up_rounds": 3}
                assert set(ex["leg_orders"][1:]) <= {"bm", "mb"}
            else:
                assert ex["compared_rounds"] == ex["rounds"]
    assert doc["ranking_rounds"]["rounds"] == 4 and set(doc["ranking_rounds"]["cases"]) == {
        f"{m}-w{lead}" for m in speculative_ids()}
    assert doc["methods"]["normal"]["activity"]["status"] == "no draft"
    for mid in speculative_ids():
        m = doc["methods"][mid]
        assert m["activity"]["status"] in (("baseline",) if mid == "dflash" else ("active", "inactive")), mid
        if m["activity"]["status"] == "inactive":
            assert m["activity"]["why"] == METHODS[mid].why_inactive
        for row in m["rows"].values():
            a = row["activity"]
            assert a["rounds"] > 0 and a["rounds_differ"] <= a["rounds"] and a["net"] == a["gained"] - a["lost"]
            assert row["drafted"] >= row["proposed"] and a["accepted"] == row["accepted"]
            assert (a["rounds_differ"] == 0) == (a["status"] in ("baseline", "inactive"))
    assert all(a["rounds_differ"] == 0 for a in (r["activity"] for r in doc["methods"]["dflash"]["rows"].values()))


def test_every_case_carries_the_cost_model_and_each_width_its_calibration(smoke_run):
    """Model speedup (schema 7: priced by the report on every case's own loop timings), measured/model and the
    overhead flag on every row and every shown width; each calibrated method chose once per benchmarked width, by
    the cost-model objective the page names."""
    from dflash_core.bench.costmodel import OBJECTIVE

    doc = json.loads((smoke_run["reports"] / "benchmark.json").read_text())
    assert doc["schema_version"] == 8
    for mid, m in doc["methods"].items():
        for w, r in m["rows"].items():
            assert r["model_speedup"] > 0 and r["measured_over_model"] == r["speedup"] / r["model_speedup"], (mid, w)
            assert isinstance(r["unexplained_overhead"], bool)
            assert r["loop_costs"]["wall"] > 0 and (mid == "normal") == ("step" in r["loop_costs"])
        assert m["best"]["model_speedup"] == m["rows"][str(m["best"]["width"])]["model_speedup"]
    assert doc["methods"]["normal"]["rows"]["0"]["model_speedup"] == 1.0
    assert doc["cost_model"]["objective"] == OBJECTIVE and doc["cost_model"]["fit"]["t_decode"] > 0
    assert doc["cost_model"]["source"] == "loop" and doc["verify_cost"]["source"].startswith("loop")
    fit = doc["cost_model"]["fit"]["t_verify"]
    assert len(fit) == doc["settings"]["block_size"] + 1 and all(a <= b for a, b in zip(fit, fit[1:]))
    for mid in ("act", "dspark_lite", "boltzmann_v10", "gated_mobs_v11", "minop_v13"):
        rec = doc["calibration"][mid]
        assert rec["objective"] == OBJECTIVE and set(rec["widths"]) == {str(w) for w in WIDTHS}, mid
    assert all(r["protocol"]["width"] == int(w) for w, r in doc["calibration"]["act"]["widths"].items())
    page = (smoke_run["reports"] / "report.html").read_text()
    assert f"objective: {OBJECTIVE}" in page and 'title="cost-model speedup: ' in page


def test_report_cli_rebuilds_the_saved_run(smoke_run, tmp_path):
    from dflash_core.report.__main__ import main as report_main

    saved = next((smoke_run["dir"] / ".benchmarks").rglob("0001_*.json"))
    assert report_main([str(saved), "--out", str(tmp_path)]) == 0
    a = json.loads((tmp_path / "cpu" / "benchmark.json").read_text())
    b = json.loads((smoke_run["reports"] / "benchmark.json").read_text())
    assert a["methods"].keys() == b["methods"].keys()
    assert a["winner"] == b["winner"] and a["rank_groups"] == b["rank_groups"]


def test_failed_exactness_gate_writes_report_and_fails(pytester, tiny_lab, monkeypatch):
    """The kv_only rollback (the negative control) breaks the conv state: the gate must fail the run, and the
    report must still be written and say so."""
    _copy_lab(pytester.path)
    pytester.makepyfile(broken_rollback="""
        import dflash_core.bench.session as bench

        _open = bench.open_session

        def open_session(cfg):
            sess = _open(cfg)  # references and calibration use the exact rollback
            sess.rt = sess.rt.with_options(rollback="kv_only")
            return sess

        bench.open_session = open_session
    """)
    reports = pytester.path / "reports"
    _env(monkeypatch, tiny_lab, reports)
    res = pytester.runpytest_subprocess(
        "benchmarks", "-p", "broken_rollback", "-p", "no:cacheprovider", "-k", "test_decode and (dflash-cpu or normal)",
        "--target", str(tiny_lab["ckpt"]), "--bench-widths", "1,2", "--bench-tokens", "32", "--bench-prompts", "2",
        "--bench-rounds", "1", "--calibration-tokens", "8", "--calibration-prompts", "1",
        "--benchmark-json=out.json")
    assert res.ret == pytest.ExitCode.TESTS_FAILED, res.stdout.str()[-3000:]
    res.stdout.fnmatch_lines(["*dflash at width * diverged from greedy*"])
    doc = json.loads((reports / "cpu" / "benchmark.json").read_text())
    assert doc["exactness"]["all_exact"] is False
    assert any(f.startswith("dflash-w") for f in doc["exactness"]["failures"])
    assert "exactness gate FAILED" in (reports / "cpu" / "report.html").read_text()


def test_pages_render_in_headless_chromium(smoke_run, chromium, tmp_path):
    """Open both pages in a real browser; the explorer's script must have filled its menu and chips."""
    index = chromium.dom(smoke_run["reports"] / "index.html")
    assert index.count("<option") >= 14, "explorer menu not filled by its script"
    assert 'class="chip' in index, "explorer drew no trace chips"
    assert "round " in index and "accepted" in index
    report = chromium.dom(smoke_run["reports"] / "report.html")
    for table in ("methods-table", "width-table", "position-table", "reference-table", "goals-table"):
        assert f'id="{table}"' in report, table
    assert 'id="speedup-chart"' in report and report.count("<rect") >= 15
    shot = chromium.screenshot(smoke_run["reports"] / "index.html", tmp_path / "index.png", "1200,900")
    assert shot.is_file() and shot.stat().st_size > 10_000, "the page rendered blank"


def test_every_plot_of_a_real_run_is_drawn_with_its_data(smoke_run, chromium):
    """The four figures of report.html, from a real benchmark run, as the browser renders them: every series has
    one point with a box inside its plot per value benchmark.json holds, at that value; the ranking table of both
    pages shows eight columns; the explorer shows the prompt of its traces."""
    from ..support.browser import assert_plots_drawn

    doc = json.loads((smoke_run["reports"] / "benchmark.json").read_text())
    assert_plots_drawn(chromium.probe(smoke_run["reports"] / "report.html"), doc)
    for page in ("report.html", "index.html"):
        cols = chromium.probe(smoke_run["reports"] / page)["tables"]["methods-table"]
        assert len(cols["visible"]) == 8 and cols["all"] > 8, (page, cols)
    assert isinstance(doc["trace_prompt"], str) and doc["trace_prompt"]
    index = chromium.dom(smoke_run["reports"] / "index.html")
    import html

    assert html.escape(doc["trace_prompt"], quote=False) in index.split('id="prompt"', 1)[1].split("</div>", 1)[0]


def _readme_flow() -> list[str]:
    """The command lines of the README's compare/report/gate block, exactly as written there."""
    text = (REPO / "README.md").read_text()
    block = text.split("## Compare runs, rebuild reports, gate regressions", 1)[1].split("```bash", 1)[1]
    return [ln.strip() for ln in block.split("```", 1)[0].splitlines() if ln.strip()]


def test_readme_compare_flow_runs_as_written_from_the_repo_root(tiny_lab, tmp_path):
    """The design card's flow from a copy of the repository root, each the README's own line: two runs by `./lab
    bench`'s own path (`python -m dflash_core bench`, the engine `./lab bench` execs once .venv exists; the second
    reusing the first's widths and calibration with other prompts), pytest-benchmark compare (which imports the root
    conftest.py), the pooled report, the comparison page and the gate. The bench lines get the tiny target and a
    small selection appended; `. .venv/bin/activate` is this test's own interpreter. Between two runs of the same
    code the gate finds no regression."""
    import shlex
    import sys

    root = tmp_path / "repo"
    (root / "tests").mkdir(parents=True)  # pytest.ini's testpaths, as in the repository root
    _copy_lab(root)
    env = {k: v for k, v in os.environ.items() if k not in ("DFLASH_REPORTS", "PYTEST_ADDOPTS")}
    env.update(DFLASH_HOME=str(tiny_lab["home"]),
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    lab_bench = [sys.executable, "-m", "dflash_core", "bench", "--smoke", "--target", str(tiny_lab["ckpt"])]
    sizing = ["--bench-widths", "1", "-k", "(normal or dflash-cpu or generate or verify_cost) and not suffix"]
    tools = {"python": [sys.executable], "pytest-benchmark": [str(Path(sys.executable).parent / "pytest-benchmark")]}
    flow = _readme_flow()
    assert [ln.split()[0] for ln in flow] == ["./lab", "./lab", ".", "pytest-benchmark", "python", "python",
                                              "python"], flow
    assert flow[2] == ". .venv/bin/activate", flow
    outs = []
    for line in flow:
        argv = shlex.split(line)
        if argv[0] == ".":
            continue
        if argv[0] == "./lab":
            assert argv[1] == "bench", line
            extra = argv[2:][1:] if argv[2:3] == ["--"] else argv[2:]
            # the bench writes reports/ next to the package unless told: here, in the copied root as `./lab` would
            cmd, run_env = lab_bench + ["--", *extra, *sizing], {**env, "DFLASH_REPORTS": str(root / "reports")}
        else:
            cmd, run_env = tools[argv[0]] + argv[1:], env
        proc = subprocess.run(cmd, cwd=root, env=run_env, capture_output=True, text=True, timeout=900)
        outs.append(proc)
        if "gate" not in argv:
            assert proc.returncode == 0, f"{line}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    saved = sorted((root / ".benchmarks").rglob("*.json"))
    assert [p.name[:4] for p in saved] == ["0001", "0002"], "autosave must store both runs where compare looks"
    first, second = (json.loads(p.read_text())["dflash"]["settings"]["chosen"] for p in saved)
    assert second["source"].startswith("reused from ") and second["source"].endswith(saved[0].name)
    assert second["widths"] == first["widths"] == [1] and second["options"] == first["options"]
    assert {"act", "dspark_lite", "boltzmann_v10"} <= set(first["options"])  # calibrated by run 1, reused by run 2
    compare = outs[2].stdout
    assert "0001_" in compare and "0002_" in compare and "test_decode[dflash-cpu-w1]" in compare
    assert "test_reference[generate-cpu]" in compare and "test_verify_cost" in compare
    # the pooled report lands beside the single run's (report.write.pooled_name), never over it
    doc = json.loads((root / "reports" / "cpu" / "pooled-0001-0002" / "benchmark.json").read_text())
    assert len(doc["runs"]) == 2 and doc["methods"]["dflash"]["rows"]["1"]["rounds"] == 2  # pooled rounds
    page = json.loads((root / "reports" / "compare" / "compare.json").read_text())
    assert (root / "reports" / "compare" / "compare.html").is_file()
    assert {r["case"] for r in page["rows"]} == {"normal-w0", "dflash-w1"} and page["verdict"] == "inconclusive"
    gate = outs[5]
    # one round each (--smoke): the speedup is not judged, the deterministic checks pass between runs of one code
    assert gate.returncode == 3, gate.stdout + gate.stderr
    assert "REGRESSION" not in gate.stdout and "gate: inconclusive" in gate.stdout
    assert "NOT JUDGED (1 case(s): dflash-w1): speedup not judged: 1 vs 1 rounds" in gate.stdout
    assert gate.stdout.count("noise figure") == 2, gate.stdout  # both runs say what they can support


def test_hostile_saved_run_runs_no_script_in_chromium(chromium, tmp_path):
    """Markup in every free-text field of a saved run (and `<!--<script>` as token text): the pages show it as
    text, no handler runs, and the explorer still fills its menu, its chips and the preceding context."""
    from dflash_core.report.__main__ import main as report_main

    from ..support.report_data import hostile_saved

    saved = tmp_path / "0001_hostile.json"
    saved.write_text(json.dumps(hostile_saved()))
    assert report_main([str(saved), "--out", str(tmp_path / "reports")]) == 0
    for page in ("index.html", "report.html"):
        dom = chromium.dom(tmp_path / "reports" / "cpu" / page)
        assert 'data-pwned="1"' not in dom and "<img" not in dom, f"injected markup ran in {page}"
        assert "&lt;img src=x onerror=" in dom, f"{page} no longer shows the hostile text as text"
    # the explorer ran: menu filled, chips drawn, and (after round 1 at 2.1 s) the text committed before the round
    assert dom.count("<option") == 0  # report.html has no explorer
    index = chromium.dom(tmp_path / "reports" / "cpu" / "index.html")
    assert index.count("<option") == 1 and 'class="chip' in index
    context = index.split('id="context"', 1)[1].split("</div>", 1)[0]
    assert "&lt;!--&lt;script&gt;&lt;/script&gt;&lt;img src=y" in context, context


def test_cli_bench_runs_the_matrix_in_a_child_pytest(tiny_lab, tmp_path):
    """`python -m dflash_core bench` (the README main command's engine) from any working directory."""
    import sys

    env = {**os.environ, "DFLASH_HOME": str(tiny_lab["home"]), "DFLASH_REPORTS": str(tmp_path / "reports"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "dflash_core", "bench", "--smoke", "--target", str(tiny_lab["ckpt"]),
                           "--", "--bench-widths", "1", "-k", "(normal or dflash-cpu) and not suffix",
                           "--no-references"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"report: {tmp_path / 'reports' / 'cpu' / 'index.html'}" in proc.stderr
    doc = json.loads((tmp_path / "reports" / "cpu" / "benchmark.json").read_text())
    # the terminal's last line is the answer, after pytest-benchmark's tables (stdout)
    assert proc.stdout.rstrip().splitlines()[-2:] == [f"dflash headline: {doc['headline']}",
                                                      f"dflash answer: {doc['answer']}"], proc.stdout[-2000:]
    assert " greedy [" in doc["answer"] and "SMOKE RUN" in doc["answer"]  # the number, its interval, the label
    assert "-- benchmark" in proc.stdout.split("dflash headline: ")[0]
    assert set(doc["methods"]) == {"normal", "dflash"} and doc["exactness"]["all_exact"]
    saved = list((tmp_path / ".benchmarks").glob("*/0001_*.json"))  # pytest-benchmark's <machine>/ folder, as compare
    assert len(saved) == 1, "the run must be autosaved where `pytest-benchmark compare 0001` finds it"


def test_kernel_paths_resolve_by_measured_rule():
    import torch

    from dflash_core.errors import BadInputError
    from dflash_core.runtime.kernels import resolve_kernels

    cpu = torch.device("cpu")
    assert resolve_kernels("auto", cpu, torch.float32, 1024) == "tuned"  # the 350M: its probe holds oneDNN too
    assert resolve_kernels("auto", cpu, torch.float32, 576) == "tuned"  # SmolLM2
    assert resolve_kernels("auto", cpu, torch.float32, 384) == "eager"  # the mini target: measured slower
    assert resolve_kernels("auto", cpu, torch.bfloat16, 1024) == "eager"
    with pytest.raises(BadInputError, match="unknown kernel path"):
        resolve_kernels("fast", cpu, torch.float32, 1024)


def test_auto_widths_and_round_robin_rounds_reach_the_report(pytester, tiny_lab, monkeypatch):
    """`--bench-widths auto` (the default) opens the session at session start (collection only reads its widths),
    measures the cases at the widths `auto_widths` chose and records the choice; `test_rounds` gives every case its
    other base rounds in passes, so each measured case ends with `--bench-rounds` rounds."""
    _copy_lab(pytester.path)
    reports = pytester.path / "reports"
    _env(monkeypatch, tiny_lab, reports)
    res = pytester.runpytest_subprocess(
        "benchmarks", "-p", "no:cacheprovider", "-k",
        "test_decode and (dflash-cpu or normal) and not suffix or test_rounds",
        "--target", str(tiny_lab["ckpt"]), "--bench-tokens", "8", "--bench-prompts", "1", "--bench-rounds", "3",
        "--calibration-tokens", "8", "--calibration-prompts", "1", "--no-references", "--benchmark-json=out.json")
    assert res.ret == pytest.ExitCode.OK, res.stdout.str()[-3000:]
    doc = json.loads((reports / "cpu" / "benchmark.json").read_text())
    choice = doc["settings"]["width_choice"]
    assert choice["selected"] and doc["settings"]["widths"] == choice["selected"]
    assert [r["width"] for r in choice["table"]] == list(range(1, doc["settings"]["block_size"] + 1))
    sched = doc["settings"]["base_rounds_schedule"]
    assert sched["schedule"] == "round-robin" and sched["passes"] == 2 and sched["cases"] == 1 + len(choice["selected"])
    out = res.stdout.str()
    steps = 2 * sched["cases"]
    assert f"base rounds (round-robin passes): {steps}/{steps}, " in out  # the passes log their progress
    B = doc["settings"]["block_size"]
    assert f"widths: dflash at {B} width(s) on calibration decodes: {B}/{B}, " in out  # auto widths: every width
    assert re.search(r"dflash case test_decode\[dflash-cpu-w[0-9]+\]: round 1 of 3: speedup [0-9.]+x tok/call", out)
    saved = json.loads((pytester.path / "out.json").read_text())["benchmarks"]
    decode = [b for b in saved if b["name"].startswith("test_decode")]
    assert decode and all(b["extra_info"]["rounds"] == 3 and b["stats"]["rounds"] == 3 for b in decode)


def test_a_real_target_is_sized_to_its_budget_end_to_end(pytester, tiny_lab, monkeypatch):
    """The tiny target counted as a real one (threshold 0): `--bench-widths auto` opens the session at collection,
    calibrates at the real-target size, then sizes the matrix to `--bench-budget` from the measured costs; a budget
    nothing fits gets the smallest size, says so, and records the plan. Break: skip `budgeted` in the session and
    the run keeps 4 prompts x 96 tokens."""
    from dflash_core.bench.budget import LADDER, tokens_floor

    _copy_lab(pytester.path)
    pytester.makepyfile(real_sized="""
        import dflash_core.bench.config as config

        config.REAL_TARGET_PARAMETERS = 0
    """)
    reports = pytester.path / "reports"
    _env(monkeypatch, tiny_lab, reports)
    res = pytester.runpytest_subprocess(
        "benchmarks", "-p", "real_sized", "-p", "no:cacheprovider", "-k", "test_decode and normal",
        "--target", str(tiny_lab["ckpt"]), "--bench-budget", "0.001", "--log-cli-level=INFO",
        "--benchmark-json=out.json")
    assert res.ret == pytest.ExitCode.OK, res.stdout.str()[-3000:]
    res.stdout.fnmatch_lines(["*benchmark matrix sized to*(the smallest size: over budget)*"])
    s = json.loads((reports / "cpu" / "benchmark.json").read_text())["settings"]
    p, t, r = LADDER[-1]
    # the decode never shrinks below full blocks of the widest case (a method's own width included)
    floor = tokens_floor([*s["chosen"]["widths"], *s["chosen"]["method_widths"].values()])
    assert (s["prompt_limit"], s["tokens"], s["rounds"], s["rank_rounds"]) == (p, max(t, floor), r, 6)
    sizes = {(a, max(b, floor), min(c, 6)) for a, b, c in LADDER}
    assert s["size_plan"]["fits"] is False and len(s["size_plan"]["tried"]) == len(sizes)
    assert len(s["chosen"]["widths"]) == 1 and set(s["resized"]) >= {"prompt_limit", "tokens", "rounds"}
