"""Hostile input to `python -m dflash_core.report` and its gate (groups 5 and 6 and the report/gate
tracebacks): every bad input ends in one `error:` line and exit 2, and the gate fails closed — anything it cannot
judge is an error, never "no regression"."""

from __future__ import annotations

import errno
import json
import math
from pathlib import Path

import pytest

from dflash_core.report.__main__ import main as report_main

from ..support.report_data import bench_row as _bench
from ..support.report_data import saved_run as _saved


def _write(tmp_path: Path, name: str, doc, raw: str | None = None) -> Path:
    p = tmp_path / name
    p.write_text(raw if raw is not None else json.dumps(doc))
    return p


def _one_error(capsys) -> str:
    """The captured stderr must be exactly one `error:` line (no traceback); returns it."""
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    return lines[0]


def _canonical(tmp_path: Path, name: str, bench: list[dict]) -> Path:
    """A report's benchmark.json built by the CLI from one saved run."""
    src = _write(tmp_path, f"{name}-saved.json", _saved(bench))
    out = tmp_path / f"{name}-report"
    assert report_main([str(src), "--out", str(out)]) == 0
    return out / "cpu" / "benchmark.json"


BASE = [_bench("normal", 0), _bench("dflash", 2, speedup=1.5, rounds=[1.45, 1.5, 1.55])]
SLOWER = [_bench("normal", 0), _bench("dflash", 2, speedup=0.46, rounds=[0.45, 0.46, 0.47], tau=1.0)]


def _edit(path: Path, edit) -> Path:
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))  # json.dumps writes NaN literals: what a hand-edited file can hold
    return path


# --- the gate fails closed (group 6) ---------------------------------------------------------------------------

@pytest.mark.parametrize("field", ["speedup", "tokens_per_target_call"])
def test_gate_refuses_nan_on_a_regressed_row(tmp_path, capsys, field):
    base = _canonical(tmp_path, "base", BASE)
    new = _edit(_canonical(tmp_path, "new", SLOWER),
                lambda d: d["methods"]["dflash"]["rows"]["2"].update({field: math.nan}))
    assert report_main(["gate", str(base), str(new)]) == 2
    assert "no regression" not in capsys.readouterr().out


def test_gate_nan_in_the_document_is_refused_by_the_api_too(tmp_path):
    from dflash_core.errors import ReportInputError
    from dflash_core.report.gate import gate

    base = json.loads(_canonical(tmp_path, "base", BASE).read_text())
    new = json.loads(_canonical(tmp_path, "new", SLOWER).read_text())
    new["methods"]["dflash"]["rows"]["2"]["speedup"] = math.nan
    with pytest.raises(ReportInputError, match="finite"):
        gate(base, new)


@pytest.mark.parametrize("flag,value", [("--speedup-drop", "nan"), ("--speedup-drop", "inf"),
                                        ("--speedup-drop", "-0.1"), ("--tau-tolerance", "-1"),
                                        ("--tau-tolerance", "nan")])
def test_gate_thresholds_must_be_finite_fractions(tmp_path, capsys, flag, value):
    base, new = _canonical(tmp_path, "base", BASE), _canonical(tmp_path, "new", BASE)
    with pytest.raises(SystemExit) as exc:
        report_main(["gate", str(base), str(new), flag, value])
    assert exc.value.code == 2
    assert "finite fraction" in capsys.readouterr().err


def test_gate_speedup_drop_nan_no_longer_passes_a_69_percent_regression(tmp_path, capsys):
    base, new = _canonical(tmp_path, "base", BASE), _canonical(tmp_path, "new", SLOWER)
    assert report_main(["gate", str(base), str(new)]) == 1  # the regression itself is caught
    capsys.readouterr()  # its summary counts every verdict, "no regression" among them
    with pytest.raises(SystemExit):
        report_main(["gate", str(base), str(new), "--speedup-drop", "nan"])
    assert "no regression" not in capsys.readouterr().out


def test_gate_identical_figures_with_negative_tolerance_are_not_regressions(tmp_path, capsys):
    base = _canonical(tmp_path, "base", BASE)
    with pytest.raises(SystemExit):
        report_main(["gate", str(base), str(base), "--tau-tolerance", "-1"])
    assert "REGRESSION" not in capsys.readouterr().out


def test_gate_string_all_exact_with_a_failure_is_not_passed(tmp_path, capsys):
    base = _canonical(tmp_path, "base", BASE)
    new = _edit(_canonical(tmp_path, "new", BASE),
                lambda d: d["exactness"].update(all_exact="false", failures=["dflash-w2"]))
    assert report_main(["gate", str(base), str(new)]) == 2
    assert "all_exact" in _one_error(capsys)


def test_gate_failures_listed_fail_even_when_all_exact_claims_true(tmp_path, capsys):
    base = _canonical(tmp_path, "base", BASE)
    new = _edit(_canonical(tmp_path, "new", BASE), lambda d: d["exactness"].update(failures=["dflash-w2"]))
    assert report_main(["gate", str(base), str(new)]) == 1
    assert "REGRESSION exactness" in capsys.readouterr().out


@pytest.mark.parametrize("edit", [lambda d: d.update(methods=[]),
                                  lambda d: d.update(methods={}),
                                  lambda d: d["methods"]["dflash"].update(rows=[]),
                                  lambda d: d["methods"]["dflash"].update(rows={}),
                                  lambda d: d["methods"]["dflash"]["rows"]["2"].update(speedup="1.5"),
                                  lambda d: d.update(exactness=None)],
                         ids=["methods-list", "methods-empty", "rows-list", "rows-empty", "speedup-string",
                              "exactness-null"])
def test_gate_malformed_base_is_an_error_not_a_pass(tmp_path, capsys, edit):
    base = _edit(_canonical(tmp_path, "base", BASE), edit)
    new = _canonical(tmp_path, "new", BASE)
    assert report_main(["gate", str(base), str(new)]) == 2
    _one_error(capsys)


def _deep(n: int = 100_000) -> str:
    return "[" * n + "]" * n


def test_gate_and_report_refuse_deep_json(tmp_path, capsys):
    deep = _write(tmp_path, "deep.json", None, raw=_deep())
    base = _canonical(tmp_path, "base", BASE)
    assert report_main(["gate", str(base), str(deep)]) == 2
    assert "nests deeper" in _one_error(capsys)
    assert report_main([str(deep), "--out", str(tmp_path / "r")]) == 2
    assert "nests deeper" in _one_error(capsys)


def test_gate_missing_file_is_an_error(tmp_path, capsys, monkeypatch):
    (tmp_path / ".benchmarks").mkdir()
    monkeypatch.chdir(tmp_path)
    base = _canonical(tmp_path, "base", BASE)
    for missing in (tmp_path / "missing.json", "/dflash-missing-run.json"):  # "/x": pathlib's glob raised
        assert report_main(["gate", str(base), str(missing)]) == 2
        _one_error(capsys)


# --- the report's input (tracebacks) ---------------------------------------------------------------------------

def _with_row(**extra) -> dict:
    row = _bench("dflash", 2, speedup=1.5)
    row["extra_info"].update(extra)
    return _saved([_bench("normal", 0), row])


def _verify_cost(ratio: dict) -> dict:
    return {"name": "test_verify_cost[cpu]", "fullname": "benchmarks/test_decode.py::test_verify_cost[cpu]",
            "stats": {"median": 0.1, "iqr": 0.0, "rounds": 1},
            "extra_info": {"verify_cost": {"ratio": ratio, "t_decode_seconds": 0.01}}}


@pytest.mark.parametrize("doc,raw", [
    (_with_row(speedup_rounds=[1e308, 1e308, 1.0]), None),
    (None, json.dumps(_with_row()).replace('"speedup": 1.5', '"speedup": ' + "9" * 400)),
    (None, json.dumps(_with_row()).replace('"speedup": 1.5', '"speedup": 1e400')),
    (_saved([_bench("normal", 0), _bench("dflash", 2), _verify_cost({"2x": 1.1})]), None),
    (_saved([_bench("normal", 0), _bench("dflash", 2), _verify_cost({"99999999999": 1.1})]), None),
    (_with_row(width=10 ** 30), None),
    (_with_row(speedup_rounds=[1.0] * 20_001), None),
], ids=["rounds-1e308", "400-digit-int", "1e400", "width-key-2x", "width-key-huge", "width-huge", "too-many-rounds"])
def test_report_refuses_numbers_it_cannot_compute_with(tmp_path, capsys, doc, raw):
    src = _write(tmp_path, "in.json", doc, raw=raw)
    assert report_main([str(src), "--out", str(tmp_path / "r")]) == 2
    _one_error(capsys)
    assert not (tmp_path / "r").exists()


def test_report_out_is_a_file(tmp_path, capsys):
    src = _write(tmp_path, "in.json", _saved(BASE))
    (tmp_path / "out").write_text("a file")
    assert report_main([str(src), "--out", str(tmp_path / "out")]) == 2
    _one_error(capsys)


@pytest.mark.parametrize("code,words", [(errno.EACCES, "permission denied"), (errno.EROFS, "permission denied"),
                                        (errno.ENOSPC, "no space left on device while writing")])
def test_report_unwritable_or_full_out_is_named(tmp_path, capsys, monkeypatch, code, words):
    import dflash_core.store.artifacts as artifacts

    def refuse(path, data):
        raise OSError(code, errno.errorcode[code], str(path))

    monkeypatch.setattr(artifacts, "write_atomic", refuse)
    monkeypatch.setattr("dflash_core.report.__main__.write_atomic", refuse)
    monkeypatch.setattr(artifacts, "_stage", refuse)  # the report's three files are staged as one set
    src = _write(tmp_path, "in.json", _saved(BASE))
    assert report_main([str(src), "--out", str(tmp_path / "r")]) == 2
    line = _one_error(capsys)
    assert words in line and "benchmark.json" in line


def test_report_missing_file_while_benchmarks_exists(tmp_path, capsys, monkeypatch):
    (tmp_path / ".benchmarks" / "cpu").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    for missing in (tmp_path / "nope.json", "/dflash-missing-run.json"):  # "/x": pathlib's glob raised
        assert report_main([str(missing)]) == 2
        _one_error(capsys)


def test_report_input_over_the_size_limit_is_refused(tmp_path, capsys, monkeypatch):
    import dflash_core.safeio as safeio

    monkeypatch.setattr(safeio, "MAX_JSON_BYTES", 1000)
    monkeypatch.setattr(safeio.read_json, "__defaults__", (1000, safeio.MAX_JSON_DEPTH))
    src = _write(tmp_path, "in.json", _saved(BASE))
    assert report_main([str(src)]) == 2
    assert "limit" in _one_error(capsys)


def test_report_input_that_is_a_fifo_does_not_hang(tmp_path, capsys):
    import os

    fifo = tmp_path / "in.json"
    os.mkfifo(fifo)
    assert report_main([str(fifo), "--out", str(tmp_path / "r")]) == 2
    assert "FIFO" in _one_error(capsys)


# --- the bootstrap's memory (group 5) ---------------------------------------------------------------------------

def test_the_selections_memory_does_not_grow_with_rounds():
    """Resampling 400 x 50k rounds of three cases at once is ~480 MB of temporaries; the selection draws each
    bootstrap median from one beta variate (stats/medians.boot_medians), so its peak stays far below that."""
    import tracemalloc

    import numpy as np

    from dflash_core.stats.selection import select_best

    rng = np.random.default_rng(0)
    cases = {m: (shift + 0.01 * rng.standard_normal(50_000)).tolist() for m, shift in
             (("a", 0.0), ("b", 0.05), ("c", 0.1))}
    tracemalloc.start()
    try:
        out = select_best(cases, resamples=400)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert out["winner"] == "c" and out["rounds"]["a"] == 50_000
    assert peak < 100 * 2 ** 20, f"peak {peak / 2 ** 20:.0f} MiB"
