"""Report building from saved pytest-benchmark JSON: schema, merging, and refusing malformed input."""

from __future__ import annotations

import json

import pytest

from dflash_core.report.__main__ import main as report_main
from dflash_core.report.build import SCHEMA_VERSION, ReportInputError, build_report, load_saved
from dflash_core.report.html import render_index, render_report


def _bench(method, width, device="cpu", speedup=1.0, exact=True):
    extra = {"method": method, "device": device, "width": width, "tokens_per_second": 100.0 * speedup,
             "tokens_per_second_iqr": 1.0, "normal_tokens_per_second": 100.0, "speedup": speedup,
             "speedup_iqr": 0.05, "speedup_rounds": [speedup], "acceptance_rate": 0.5,
             "tokens_per_target_call": 1.0 + width / 2, "accept_histogram": [1] * (width + 1),
             "per_position_acceptance": [0.5] * width, "guidance_work": 0, "overhead_fraction": 0.01,
             "exact": exact, "verdicts": {"exact": 1} if exact else {"diverged": 1}}
    return {"name": f"test_decode[{method}-{device}-w{width}]",
            "fullname": f"benchmarks/test_decode.py::test_decode[{method}-{device}-w{width}]",
            "stats": {"median": 0.1, "iqr": 0.01, "rounds": 3}, "extra_info": extra}


def _saved(benchmarks):
    return {"machine_info": {"node": "n", "machine": "x86_64", "cpu": {"brand_raw": "cpu"}},
            "commit_info": {"id": "abc", "dirty": False}, "datetime": "2026-11-29T00:00:00", "version": "5.3.1",
            "benchmarks": benchmarks,
            "dflash": {"methods": {"normal": {"index": 0, "label": "Normal", "mechanism": "m", "complexity": "c",
                                              "stages": []},
                                   "dflash": {"index": 1, "label": "DFlash", "mechanism": "argmax",
                                              "complexity": "c", "stages": ["a", "b", "c", "d"]}},
                       "traces": {"dflash-w2": [{"draft": [5, 6], "accepted": 1, "token": 9, "bonus": False}]},
                       "settings": {"tokens": 8}, "target": {"name": "mini"}}}


def _write(tmp_path, name, doc, raw=None):
    p = tmp_path / name
    p.write_text(raw if raw is not None else json.dumps(doc))
    return p


def test_build_report_schema_and_winner():
    doc = build_report([_saved([_bench("normal", 0), _bench("dflash", 1, speedup=1.4),
                                _bench("dflash", 2, speedup=1.8)])], ["run1"])
    assert doc["schema_version"] == SCHEMA_VERSION and doc["device"] == "cpu"
    assert doc["winner"]["method"] == "dflash" and doc["winner"]["width"] == 2
    assert doc["methods"]["dflash"]["label"] == "DFlash"
    assert doc["exactness"]["all_exact"] is True
    assert doc["runs"][0]["source"] == "run1" and doc["runs"][0]["commit"] == "abc"


def test_failed_exactness_is_reported_not_hidden():
    doc = build_report([_saved([_bench("normal", 0), _bench("dflash", 2, exact=False)])], ["r"])
    assert doc["exactness"]["all_exact"] is False
    assert doc["exactness"]["failures"] == ["dflash-w2"]
    assert "exactness gate FAILED" in render_report(doc)


def test_merging_two_runs_names_both():
    a = _saved([_bench("normal", 0), _bench("dflash", 1)])
    b = _saved([_bench("dflash", 4, speedup=2.0)])
    doc = build_report([a, b], ["a.json", "b.json"])
    assert [r["source"] for r in doc["runs"]] == ["a.json", "b.json"]
    assert set(doc["methods"]["dflash"]["rows"]) == {"1", "4"}


def test_mixed_devices_are_refused():
    with pytest.raises(ReportInputError, match="mix devices"):
        build_report([_saved([_bench("normal", 0, "cpu"), _bench("dflash", 1, "cuda")])], ["r"])


def test_nan_is_refused(tmp_path):
    raw = json.dumps(_saved([_bench("normal", 0)])).replace('"speedup": 1.0', '"speedup": NaN')
    with pytest.raises(ReportInputError, match="non-finite"):
        load_saved(_write(tmp_path, "nan.json", None, raw))


def test_malformed_json_is_refused(tmp_path):
    with pytest.raises(ReportInputError, match="not valid JSON"):
        load_saved(_write(tmp_path, "bad.json", None, "{not json"))


def test_missing_fields_are_refused(tmp_path):
    with pytest.raises(ReportInputError, match="missing 'benchmarks'"):
        load_saved(_write(tmp_path, "x.json", {"machine_info": {}, "datetime": "d"}))


def test_unserializable_values_are_refused(tmp_path):
    d = _saved([_bench("normal", 0)])
    d["benchmarks"][0]["extra_info"]["speedup"] = "UNSERIALIZABLE[np.float32(1.0)]"
    with pytest.raises(ReportInputError, match="could not serialise"):
        load_saved(_write(tmp_path, "u.json", d))


def test_cli_rebuilds_report_atomically(tmp_path, capsys):
    p = _write(tmp_path, "0001_run.json", _saved([_bench("normal", 0), _bench("dflash", 2, speedup=1.5)]))
    rc = report_main([str(p), "--out", str(tmp_path / "reports")])
    assert rc == 0
    out = tmp_path / "reports" / "cpu"
    doc = json.loads((out / "benchmark.json").read_text())
    assert doc["winner"]["method"] == "dflash"
    html = (out / "index.html").read_text()
    assert 'id=payload' in html and "</script>" in html and "Mechanism explorer" in html
    assert not list(out.glob("*.part"))


def test_cli_error_exits_nonzero(tmp_path, capsys):
    rc = report_main([str(_write(tmp_path, "bad.json", None, "[]"))])
    assert rc == 2
    assert "top level must be an object" in capsys.readouterr().err


def test_payload_escapes_script_close():
    doc = build_report([_saved([_bench("normal", 0)])], ["r"])
    doc["target"]["name"] = "</script><b>x"
    page = render_index(doc)
    assert page.count("</script>") == 2  # the payload and the explorer script only


def test_goals_are_computed_from_the_run():
    from dflash_core.report.html import goals

    saved = _saved([_bench("normal", 0), _bench("dflash", 4, speedup=2.6)])
    saved["benchmarks"].append({"name": "test_verify_cost", "fullname": "x", "stats": {},
                                "extra_info": {"verify_cost": {"ratio": {"4": 1.25}, "t_decode_seconds": 0.01},
                                               "device": "cpu"}})
    doc = build_report([saved], ["r"])
    g = {x["goal"]: x for x in goals(doc)}
    assert g["best method >= 2.5x over normal"]["ok"] and g["t_verify(4)/t_decode <= 1.3"]["ok"]
    bound = g[">= 80% of the bound (w+1)·t_dec/t_ver(w) at the best width"]
    assert abs(bound["figure"] - 2.6 / (5 / 1.25)) < 1e-9 and not bound["ok"]
    assert 'id=goals-table' in render_report(doc)
