"""A run is pooled once however many times it is given (issue 70): copies of one saved run, or files of one run
identity (pytest-benchmark's datetime, machine_info and commit_info), are one run, not independent evidence. 200
copies of one run used to name a single winner "with 95 % confidence", and two already shrank G1."""

from __future__ import annotations

import json
import shutil

import pytest

from dflash_core.report.__main__ import main as report_main

from ..support.report_data import bench_row, known_rounds, saved_run


def _run() -> dict:
    """Two methods close enough that one run cannot tell them apart, and 50 copies of it could."""
    rows = [bench_row("normal", 0, rounds=known_rounds(1.0, 0.03, n=6, seed=1))]
    for i, (m, sp) in enumerate((("dflash", 1.5), ("mobs", 1.56))):
        r = bench_row(m, 2, speedup=sp, rounds=known_rounds(sp, 0.08, n=6, seed=10 + i))
        r["extra_info"]["vs_baseline_rounds"] = known_rounds(1.0 if m == "dflash" else 1.04, 0.06, n=6, seed=20 + i)
        rows.append(r)
    return saved_run(rows)


def _report(tmp_path, files, capsys) -> tuple[dict, str]:
    out = tmp_path / "out"
    shutil.rmtree(out, ignore_errors=True)
    assert report_main([*map(str, files), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    (doc_path,) = out.rglob("benchmark.json")
    return json.loads(doc_path.read_text()), err


def _without(doc: dict, *keys: str) -> dict:
    return {k: v for k, v in doc.items() if k not in keys}


@pytest.mark.parametrize("copies", [2, 50])
def test_copies_of_one_run_give_the_report_of_that_run(tmp_path, capsys, copies):
    first = tmp_path / "0001_run.json"
    first.write_text(json.dumps(_run()))
    files = [first] + [tmp_path / f"copy{i}.json" for i in range(1, copies)]
    for f in files[1:]:
        shutil.copyfile(first, f)
    one, _ = _report(tmp_path, [first], capsys)
    pooled, err = _report(tmp_path, files, capsys)
    # the same winner statement, the same groups and intervals: nothing but the note differs
    assert pooled["answer"] == one["answer"] and pooled["headline"] == one["headline"]
    assert pooled["ranking"] == one["ranking"] and pooled["winner"] == one["winner"]
    for mid, m in one["methods"].items():
        assert pooled["methods"][mid]["best"]["speedup_ci"] == m["best"]["speedup_ci"], mid
    assert _without(pooled, "limitations") == _without(one, "limitations")
    assert [r["source"] for r in pooled["runs"]] == [str(first)]
    note = [x for x in pooled["limitations"] if "pooled once" in x]
    assert len(note) == 1 and f"given {copies} times" in note[0]
    assert f"given {copies} times" in err and "error" not in err


def test_a_file_of_the_same_run_identity_is_the_same_run(tmp_path, capsys):
    """Not byte-identical (other indentation) but the same run: pooled once."""
    run = _run()
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(run))
    b.write_text(json.dumps(run, indent=1))
    one, _ = _report(tmp_path, [a], capsys)
    pooled, _ = _report(tmp_path, [a, b], capsys)
    assert _without(pooled, "limitations") == _without(one, "limitations")


def test_two_files_claiming_one_run_with_different_figures_are_refused(tmp_path, capsys):
    run = _run()
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(run))
    run["benchmarks"][1]["extra_info"]["speedup_rounds"][0] += 0.5
    b.write_text(json.dumps(run))
    assert report_main([str(a), str(b), "--out", str(tmp_path / "out")]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("error: ") and "claim the same run" in err[0]


def test_the_gate_pools_copies_once_too(tmp_path, capsys):
    """gate BASE NEW with NEW a glob matching copies of one run: judged as that run alone."""
    store = tmp_path / "store" / "Linux-CPython-3.11-64bit"
    store.mkdir(parents=True)
    first = store / "0001_run.json"
    first.write_text(json.dumps(_run()))
    for i in range(2, 7):
        shutil.copyfile(first, store / f"000{i}_run.json")
    base = tmp_path / "base.json"
    base.write_text(json.dumps(_run()))
    rc_one = report_main(["gate", str(base), str(first)])
    out_one = capsys.readouterr().out
    rc_all = report_main(["gate", str(base), "*_run", "--storage", str(tmp_path / "store")])
    cap = capsys.readouterr()
    assert rc_all == rc_one
    assert cap.out.splitlines()[2:] == out_one.splitlines()[2:]  # the verdicts; lines 0-1 name the runs' support
    assert cap.out.splitlines()[1].split(":", 2)[2] == out_one.splitlines()[1].split(":", 2)[2]
    assert "given 6 times" in cap.err and "pooled once" in cap.err
