"""Report building from saved pytest-benchmark JSON: schema, merging, and refusing malformed input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_core.errors import ReportInputError
from dflash_core.report.__main__ import main as report_main
from dflash_core.report.build import SCHEMA_VERSION, build_report, load_saved
from dflash_core.report.html import render_index, render_report

from ..support.report_data import HOSTILE, hostile_saved, loop_costs
from ..support.report_data import bench_row as _bench
from ..support.report_data import saved_run as _saved


def _write(tmp_path, name, doc, raw=None):
    p = tmp_path / name
    p.write_text(raw if raw is not None else json.dumps(doc))
    return p


def test_build_report_schema_and_winner():
    doc = build_report([_saved([_bench("normal", 0), _bench("dflash", 1, speedup=1.4),
                                _bench("dflash", 2, speedup=1.8)])], ["run1"])
    assert doc["schema_version"] == SCHEMA_VERSION and doc["device"] == "cpu"
    # one speculative method has nothing to be compared with: it leads G1, and no winner is named
    assert doc["leader"]["method"] == "dflash" and doc["leader"]["width"] == 2 and doc["winner"] is None
    assert doc["rank_groups"] == [["dflash"]] and doc["headline"].startswith("On mini (model ")
    assert doc["methods"]["dflash"]["label"] == "DFlash"
    assert doc["exactness"]["all_exact"] is True
    assert doc["runs"][0]["source"] == "run1" and doc["runs"][0]["commit"] == "abc"


def test_failed_exactness_is_reported_not_hidden():
    doc = build_report([_saved([_bench("normal", 0), _bench("dflash", 2, exact=False)])], ["r"])
    assert doc["exactness"]["all_exact"] is False
    assert doc["exactness"]["failures"] == ["dflash-w2"]
    assert "exactness gate FAILED" in render_report(doc)


def test_merging_two_runs_names_both():
    a = _saved([_bench("normal", 0), _bench("dflash", 1), _bench("dflash", 4)])
    b = _saved([_bench("dflash", 1), _bench("dflash", 4, speedup=2.0)])
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
    assert doc["leader"]["method"] == "dflash"
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


def test_goals_are_computed_into_benchmark_json_and_rendered_from_it():
    saved = _saved([_bench("normal", 0), _bench("dflash", 4, speedup=2.6)])
    saved["benchmarks"][0]["extra_info"]["loop_costs"] = loop_costs(step=0.008)
    saved["benchmarks"][1]["extra_info"]["loop_costs"] = loop_costs(4, verify=0.01)  # the loop's t_verify(4): 1.25
    doc = build_report([saved], ["r"])
    g = {x["id"]: x for x in doc["goals"]}
    assert g["verify_cost"]["ok"] and g["verify_cost"]["basis"].startswith("point estimate")
    # one round of 2.6x cannot give a 95 % lower limit: the speedup goal is undetermined, never met on a point
    assert g["speedup"]["ok"] is None and g["speedup"]["figure"] is None and g["speedup"]["point"] == 2.6
    assert "undetermined" in g["speedup"]["note"] and g["bound"]["ok"] is None
    doc["goals"][0]["goal"] = "goal text taken from the document"
    page = render_report(doc)
    assert 'id=goals-table' in page and "goal text taken from the document" in page
    assert "issue 8" not in page


# --- pooling ------------------------------------------------------------------------------
# --- pooling ------------------------------------------------------------------------------------------

def _generate_row(speedup):
    return {"name": "test_reference[generate-cpu]", "fullname": "x", "stats": {},
            "extra_info": {"reference": "generate", "device": "cpu", "tokens_per_second": 93.0, "speedup": speedup,
                           "speedup_iqr": 0.0, "speedup_rounds": [speedup], "exact": True, "verdicts": {"exact": 1}}}


def test_runs_of_one_model_pool_their_rounds():
    import jsonschema

    a = _saved([_bench("normal", 0), _bench("dflash", 2, speedup=1.05, rounds=[1.0, 1.1]), _generate_row(0.9)])
    b = _saved([_bench("normal", 0), _bench("dflash", 2, speedup=1.25, rounds=[1.2, 1.3]), _generate_row(0.8)])
    doc = build_report([a, b], ["a.json", "b.json"])
    schema = json.loads((Path(__file__).parents[2] / "dflash_core/report/benchmark.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(json.loads(json.dumps(doc)))
    assert doc["references"]["generate"]["speedup_rounds"] == [0.9, 0.8]
    row = doc["methods"]["dflash"]["rows"]["2"]
    assert sorted(row["speedup_rounds"]) == [1.0, 1.1, 1.2, 1.3] and row["rounds"] == 4
    assert abs(row["speedup"] - 1.15) < 1e-12  # the median of all four paired rounds, not the last file's 1.25
    assert doc["runs"][0]["model_sha256"] == doc["runs"][1]["model_sha256"]


def test_runs_of_different_models_are_refused_naming_both_hashes():
    from dflash_core.report.build import identity_hash, model_identity

    a = _saved([_bench("normal", 0), _bench("dflash", 2)])
    b = _saved([_bench("normal", 0), _bench("dflash", 2)], weights="e" * 64)
    ha, hb = identity_hash(model_identity(a)), identity_hash(model_identity(b))
    with pytest.raises(ReportInputError, match=f"different models.*{ha[:16]}.*{hb[:16]}"):
        build_report([a, b], ["a.json", "b.json"])


# --- the gate ------------------------------------------------------------------------------
# --- the gate ------------------------------------------------------------------------------------------

def _gate_files(tmp_path, new_bench):
    base = _write(tmp_path, "base.json", _saved([_bench("normal", 0), _bench("dflash", 2, speedup=1.5,
                                                                               rounds=[1.49, 1.5, 1.51])]))
    new = _write(tmp_path, "new.json", _saved([_bench("normal", 0), new_bench]))
    return [str(base), str(new)]


def test_gate_passes_identical_runs_and_noise(tmp_path, capsys):
    same = _bench("dflash", 2, speedup=1.5, rounds=[1.49, 1.5, 1.51])  # quiet: noise figure ~1 %
    # identical 3-round runs: nothing regressed, but 3 rounds cannot clear a case (exit 3, inconclusive)
    assert report_main(["gate", *_gate_files(tmp_path, same)]) == 3
    assert "gate: inconclusive (regression 0, no regression 0, inconclusive 1" in capsys.readouterr().out
    # 20% slower median, but the rounds scatter by ~40 %: the change's joint interval holds no change, so noise,
    # not a regression, and not "no regression" either
    assert report_main(["gate", *_gate_files(tmp_path, _bench("dflash", 2, speedup=1.2, rounds=[0.9, 1.2, 1.9]))]) == 3
    out = capsys.readouterr().out
    assert "REGRESSION" not in out and "gate: inconclusive" in out


@pytest.mark.parametrize("new,what", [
    (_bench("dflash", 2, speedup=1.5, rounds=[1.45, 1.5, 1.55], tau=1.5), "tokens per target call"),
    (_bench("dflash", 2, speedup=1.5, rounds=[1.45, 1.5, 1.55], exact=False), "diverged"),
    (_bench("dflash", 2, speedup=1.1, rounds=[1.05, 1.1, 1.15]), "paired speedup"),
])
def test_gate_fails_on_a_real_regression(tmp_path, capsys, new, what):
    assert report_main(["gate", *_gate_files(tmp_path, new)]) == 1
    assert what in capsys.readouterr().out


def test_gate_fails_on_a_case_missing_from_new(tmp_path, capsys):
    rounds = [1.45, 1.5, 1.55]
    base = _write(tmp_path, "b.json", _saved([_bench("normal", 0), _bench("dflash", 2, speedup=1.5, rounds=rounds),
                                              _bench("mobs", 2, speedup=1.5, rounds=rounds)]))
    new = _write(tmp_path, "n.json", _saved([_bench("normal", 0), _bench("dflash", 2, speedup=1.5, rounds=rounds)]))
    assert report_main(["gate", str(base), str(new)]) == 1
    assert "REGRESSION mobs-w2: measured in BASE, missing from NEW" in capsys.readouterr().out


def test_gate_reads_a_canonical_benchmark_json(tmp_path):
    files = _gate_files(tmp_path, _bench("dflash", 2, speedup=1.5, rounds=[1.45, 1.5, 1.55], tau=1.0))
    assert report_main([files[0], "--out", str(tmp_path / "r")]) == 0
    assert report_main(["gate", str(tmp_path / "r" / "cpu" / "benchmark.json"), files[1]]) == 1


# --- run ids, as pytest-benchmark compare takes them ----------------------------------------
# --- run ids, as pytest-benchmark compare takes them ----------------------------------------------------

def test_cli_takes_run_ids_from_the_default_storage_layout(tmp_path, monkeypatch):
    store = tmp_path / ".benchmarks" / "Linux-CPython-3.11-64bit"
    store.mkdir(parents=True)
    (store / "0001_abc_20260101_000000.json").write_text(json.dumps(_saved([_bench("normal", 0),
                                                                             _bench("dflash", 2, speedup=1.5)])))
    monkeypatch.chdir(tmp_path)
    assert report_main(["0001", "--out", "reports"]) == 0
    assert json.loads((tmp_path / "reports" / "cpu" / "benchmark.json").read_text())["leader"]["method"] == "dflash"
    assert report_main(["0009"]) == 2


def test_ambiguous_run_id_is_refused(tmp_path, monkeypatch, capsys):
    for machine in ("cpu", "Linux-CPython-3.11-64bit"):
        d = tmp_path / ".benchmarks" / machine
        d.mkdir(parents=True)
        (d / "0001_abc.json").write_text(json.dumps(_saved([_bench("normal", 0)])))
    monkeypatch.chdir(tmp_path)
    assert report_main(["0001"]) == 2
    assert "ambiguous" in capsys.readouterr().err


# --- hostile and malformed input --------------------------------------------------------------
# --- hostile and malformed input ---------------------------------------------------------------------

@pytest.mark.parametrize("device", ["../../elsewhere", "/tmp/abs", "cpu/../../x", "cuda:0/.."])
def test_device_names_cannot_move_the_report_out_of_its_folder(tmp_path, capsys, device):
    saved = _saved([_bench("normal", 0, device=device), _bench("dflash", 2, device=device)])
    out = tmp_path / "a" / "b" / "reports"
    assert report_main([str(_write(tmp_path, "x.json", saved)), "--out", str(out)]) == 2
    assert "not a device name" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["x.json"]


def test_write_report_refuses_an_unknown_device_in_a_document(tmp_path):
    from dflash_core.report.write import write_report

    doc = build_report([_saved([_bench("normal", 0)])], ["r"])
    doc["device"] = "../elsewhere"
    with pytest.raises(ReportInputError, match="not a device name"):
        write_report(doc, tmp_path / "reports")
    assert not list(tmp_path.rglob("*.html"))


def test_failed_rebuild_leaves_the_previous_report_whole(tmp_path, monkeypatch):
    import dflash_core.report.write as write

    old = _write(tmp_path, "old.json", _saved([_bench("normal", 0), _bench("dflash", 2, speedup=1.5)]))
    assert report_main([str(old), "--out", str(tmp_path / "r")]) == 0
    before = {p.name: p.read_bytes() for p in (tmp_path / "r" / "cpu").iterdir()}

    def broken(doc):
        raise RuntimeError("renderer crashed")

    monkeypatch.setattr(write, "render_index", broken)
    new = _write(tmp_path, "new.json", _saved([_bench("normal", 0), _bench("dflash", 2, speedup=2.5)]))
    with pytest.raises(RuntimeError, match="renderer crashed"):
        report_main([str(new), "--out", str(tmp_path / "r")])
    assert {p.name: p.read_bytes() for p in (tmp_path / "r" / "cpu").iterdir()} == before


def _foreign(names):
    return {"machine_info": {"node": "n"}, "datetime": "2026-01-01", "version": "5.2.3",
            "benchmarks": [{"name": n, "fullname": f"t.py::{n}", "stats": {"median": 1.0, "iqr": 0.1, "rounds": 3},
                            "extra_info": {}} for n in names]}


@pytest.mark.parametrize("raw,what", [
    (b'{"benchmarks": [], "machine_info": {}, "datetime": "\xff\xfe"}', "not UTF-8"),
    (json.dumps(_foreign(["test_decode_json", "test_decode[x]"])).encode(), "no 'dflash' section"),
    (json.dumps(_foreign(["test_sort", "test_parse"])).encode(), "no 'dflash' section"),
    (json.dumps(_saved([])).encode(), "no lab rows"),
    (json.dumps(_saved([{**_bench("dflash", 2), "extra_info": {**_bench("dflash", 2)["extra_info"],
                                                                 "speedup": "fast"}}])).encode(),
     "extra_info.speedup must be a number"),
    (json.dumps(_saved([{**_bench("dflash", 2), "extra_info": {"method": "dflash"}}])).encode(), "lacks 'width'"),
    (json.dumps(_saved([{**_bench("dflash", 2), "extra_info": {**_bench("dflash", 2)["extra_info"],
                                                                 "verdicts": {"exact": "1"}}}])).encode(),
     "extra_info.verdicts"),
    (json.dumps({**_saved([]), "benchmarks": [3]}).encode(), "must be an object"),
])
def test_bad_report_input_is_a_clear_error_exit_2(tmp_path, capsys, raw, what):
    p = tmp_path / "in.json"
    p.write_bytes(raw)
    assert report_main([str(p), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and what in err
    assert not (tmp_path / "r").exists()


# --- the pages: escaping and what they say ------------------------------------
# --- the pages: escaping and what they say ---------------------------------------------------------------

class _Tags:
    """Every element and attribute the browser's parser would create."""

    def __init__(self, page: str):
        from html.parser import HTMLParser

        self.tags, self.attrs = [], []
        outer = self

        class P(HTMLParser):
            def handle_starttag(self, tag, attrs):
                outer.tags.append(tag)
                outer.attrs.extend(k for k, _ in attrs)

            def handle_comment(self, data):
                outer.tags.append("!--")

        P().feed(page)


def test_pages_escape_every_saved_value():
    doc = build_report([hostile_saved()], ["r"])
    row = doc["methods"]["dflash"]["rows"]["2"]  # values validation would refuse, to test the renderer alone
    row.update(guidance_work=HOSTILE, accept_histogram=[HOSTILE], verdicts={"tie": HOSTILE})
    doc["device"] = HOSTILE
    doc["goals"][0]["goal"] = HOSTILE
    for page in (render_report(doc), render_index(doc)):
        t = _Tags(page)
        assert "img" not in t.tags and "!--" not in t.tags
        assert t.tags.count("script") == page.count("<script") and page.count("<script") <= 2
        assert not [a for a in t.attrs if a.startswith("on")]
        payload = page.split("<script id=payload type=application/json>", 1)[1].split("</script>", 1)[0]
        assert "<" not in payload and json.loads(payload)["token_text"]["5"] == "<!--<script>"


def test_report_page_says_what_it_draws_and_where_it_came_from():
    a = _saved([_bench("normal", 0), _bench("dflash", 1, speedup=1.2, rounds=[1.0, 1.2, 1.4]),
                _bench("dflash", 2, speedup=1.5, rounds=[1.3, 1.5, 1.9]), _generate_row(0.93)])
    doc = build_report([a], ["r"])
    best = doc["methods"]["dflash"]["best"]
    assert best["width"] == 2 and best["selection"] == "post-hoc"
    assert (best["speedup_q1"], best["speedup_q3"]) == (1.4, 1.7)  # inclusive quartiles of the rounds
    assert doc["settings"]["widths"] == [1, 2]  # normal's width 0 is not a verify width
    page = render_report(doc)
    header = page.split("</header>", 1)[0]
    assert "2026-11-29T00:00:00" in header and "commit abc" in header and ">n<" not in header and " n (" in header
    assert f"target content sha256 <code>{'e' * 64}</code>" in header  # the full hashes, not a prefix
    assert f"weights sha256 <code>{'f' * 64}</code>" in header
    assert f"<code>drafter.pt</code> <code>{'d' * 64}</code>" in header
    assert "post-hoc" in page and "Q1–Q3" in page and "not paired" in page
    assert "cached greedy" in page and "generate()" in page and "0.930× normal" in page
    chart = page.split("<svg", 1)[1].split("</svg>", 1)[0]
    lo, hi = best["speedup_ci"]
    assert lo < 1.5 < hi and f"interval {lo:.3f}–{hi:.3f} G1" in chart  # the whisker is the interval, the label G
    assert best["speedup_ci_label"].startswith("min-max of 3 rounds (covers the median with 75.0 %)")


@pytest.mark.parametrize("tuned", [1, {"selected": 1, "table": [], "objective": "cost model"}])
def test_width_chosen_on_calibration_is_not_post_hoc(tuned):
    """As a bare width and as the record `--tune` writes (bench.calibration: {"selected": w, ...}). Break: read only
    the bare width and the bench's own record shows the benchmark maximum, labelled post-hoc."""
    a = _saved([_bench("normal", 0), _bench("dflash", 1, speedup=1.2), _bench("dflash", 2, speedup=1.5)])
    a["dflash"]["tuned_widths"] = {"dflash": tuned}
    doc = build_report([a], ["r"])
    assert doc["methods"]["dflash"]["best"]["width"] == 1
    assert doc["methods"]["dflash"]["best"]["selection"] == "calibration"
    assert "chosen on calibration" in render_report(doc)


def _activity(status, rounds=10, differ=0, gained=0, lost=0, why=""):
    return {"rounds": rounds, "rounds_differ": differ, "positions": 4 * rounds, "positions_differ": differ,
            "gained": gained, "lost": lost, "net": gained - lost, "accepted": 20 + gained - lost,
            "shadow_accepted": 20, "rounds_differ_share": differ / rounds,
            "positions_differ_share": differ / (4 * rounds),
            "status": status, "why": why}


def _activity_run():
    """dflash (the baseline), mobs (its draft differs: net -1), V14 (never differs) and act (9 rounds)."""
    rows = [_bench("normal", 0), _bench("dflash", 2, speedup=1.5), _bench("mobs", 2, speedup=1.3),
            _bench("simple_parareal_v14", 2, speedup=1.45), _bench("act", 2, speedup=1.2, rounds=[1.2] * 9)]
    rows[1]["extra_info"]["activity"] = _activity("baseline")
    rows[2]["extra_info"]["activity"] = _activity("active", differ=3, gained=1, lost=2)
    rows[3]["extra_info"]["activity"] = _activity("inactive", why="never fires.")
    rows[4]["extra_info"].update(activity=_activity("active", differ=5, lost=4), drafted=40,
                                 acceptance_rate_drafted=0.25)
    saved = _saved(rows)
    lab = saved["dflash"]
    for i, mid in ((12, "mobs"), (14, "simple_parareal_v14"), (8, "act")):
        lab["methods"][mid] = {"index": i, "label": mid, "mechanism": "m", "complexity": "c", "stages": [],
                               "why_inactive": f"{mid} sentence."}
    return saved


def test_activity_status_per_method_and_in_the_schema():
    import jsonschema

    doc = build_report([_activity_run()], ["run"])
    ms = doc["methods"]
    assert ms["normal"]["activity"]["status"] == "no draft" and ms["dflash"]["activity"]["status"] == "baseline"
    assert ms["mobs"]["activity"] == {"status": "active", "why": "", "rounds_differ": 3, "rounds": 10}
    v14 = ms["simple_parareal_v14"]["activity"]
    assert v14["status"] == "inactive" and v14["why"] == "simple_parareal_v14 sentence."  # the registry's sentence
    assert ms["mobs"]["best"]["activity"]["net"] == -1
    assert ms["act"]["best"]["acceptance_rate_drafted"] == 0.25 and ms["act"]["best"]["rounds"] == 9
    schema = json.loads((Path(__file__).resolve().parents[2] / "dflash_core/report/benchmark.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(doc)


def test_inactive_methods_are_labelled_in_the_table_and_the_chart():
    page = render_report(build_report([_activity_run()], ["run"]))
    table = page.split("id=methods-table", 1)[1].split("</table>", 1)[0]
    v14_row = next(r for r in table.split("<tr") if "simple_parareal_v14" in r)
    assert "inactive here: simple_parareal_v14 sentence." in v14_row
    mobs_row = next(r for r in table.split("<tr") if "mobs</td>" in r and "parareal" not in r)
    assert "inactive" not in mobs_row and "30.0 %" in mobs_row and "-1" in mobs_row
    act_row = next(r for r in table.split("<tr") if " act</td>" in r)
    assert "25.0%" in act_row and "50.0%" in act_row and "<td class=\"more rounds\">9</td>" in act_row
    assert "<td class=\"more dtau\">0.00</td>" in act_row  # tau - dflash tau at the same width (a hidden column)
    chart = page.split('id=speedup-chart', 1)[1].split("</svg>", 1)[0]
    import re

    assert re.search(r"simple_parareal_v14 w2 G[0-9]+ \(inactive here\)", chart) and "mobs w2 G" in chart
    assert chart.count("(inactive here)") == 2  # V14's label and its tooltip, no other method's


def test_rounds_cell_shows_rounds_against_normal_and_against_dflash():
    """At the ranking width the ranking rounds add comparison-only rounds: the table shows both counts."""
    saved = _activity_run()
    act = next(b for b in saved["benchmarks"] if b["extra_info"]["method"] == "act")
    act["extra_info"].update(rounds=3, speedup_rounds=[1.2] * 3, compared_rounds=9, vs_baseline_rounds=[1.0] * 9)
    page = render_report(build_report([saved], ["run"]))
    table = page.split("id=methods-table", 1)[1].split("</table>", 1)[0]
    act_row = next(r for r in table.split("<tr") if " act</td>" in r)
    assert "<td class=\"more rounds\">3 / 9</td>" in act_row
    mobs_row = next(r for r in table.split("<tr") if "mobs</td>" in r and "parareal" not in r)
    assert " / " not in mobs_row.split("class=\"more rounds\">", 1)[1].split("</td>", 1)[0]  # no comparison-only rounds


def test_ranking_line_says_what_the_ranking_rounds_did():
    from dflash_core.report.plugin import ranking_line

    rec = {"width": 15, "rounds": 16, "seconds": 190.0, "cases": {"a-w15": {"rounds": 16, "top_up_rounds": 13},
                                                                  "b-w15": {"rounds": 16, "top_up_rounds": 13}}}
    line = ranking_line(rec)
    assert line.startswith("dflash ranking: 2 cases at width 15 (chosen on calibration prompts), 16 rounds against")
    assert "+26 rounds in 190 s" in line and ranking_line(None) is None


@pytest.mark.parametrize("field, value", [
    ("activity", {"rounds": 1, "status": "active"}),  # counts missing
    ("activity", {**_activity("active"), "status": "sometimes"}),
    ("drafted", -1),
])
def test_malformed_activity_fields_are_refused(tmp_path, field, value):
    saved = _activity_run()
    saved["benchmarks"][2]["extra_info"][field] = value
    with pytest.raises(ReportInputError, match=f"extra_info.{field} must be"):
        load_saved(_write(tmp_path, "bad.json", saved))


def test_dflash_vs_transformers_dflash_goal_compares_tok_s_at_dflashs_own_width():
    from dflash_core.report.goals import goals

    doc = {"methods": {"normal": {"rows": {}}, "dflash": {"rows": {"2": {"tokens_per_second": 50.0},
                                                                   "8": {"tokens_per_second": 130.0}}}},
           "references": {"dflash_transformers": {"tokens_per_second": 100.0}}, "leader": {}}
    g = {x["id"]: x for x in goals(doc)}["vs_dflash_transformers"]
    assert g["figure"] == 1.3 and g["ok"] and "w8" in g["goal"]
    doc["methods"]["dflash"]["rows"]["8"]["tokens_per_second"] = 109.0
    assert not {x["id"]: x for x in goals(doc)}["vs_dflash_transformers"]["ok"]  # the goal is 1.1x
    # dflash's own width (the width model's choice), where measured, is the lab's side of the comparison
    doc["settings"] = {"method_widths": {"dflash": {"selected": 2}}}
    g = {x["id"]: x for x in goals(doc)}["vs_dflash_transformers"]
    assert g["figure"] == 0.5 and "w2" in g["goal"]
    doc["settings"] = {"method_widths": {"dflash": {"selected": 5}}}  # not measured: the widest
    assert "w8" in {x["id"]: x for x in goals(doc)}["vs_dflash_transformers"]["goal"]
    del doc["references"]["dflash_transformers"]
    assert "vs_dflash_transformers" not in {x["id"] for x in goals(doc)}


# --- what a researcher sees: eight columns, figures with data, the prompt, no unbacked "best" -------------------

DEFAULT_HEADERS = ["method", "group", "width", "speedup", "vs dflash", "tok/call", "activity", "exact"]


def _rich(tmp_path=None):
    from ..support.report_data import rich_saved

    doc = build_report([rich_saved()], ["rich"])
    if tmp_path is None:
        return doc
    from dflash_core.report.write import write_report

    return doc, write_report(doc, tmp_path / "reports")


class _Table:
    """The ranking table as the parser sees it: header cells (text, title, class) and the cells of each row."""

    def __init__(self, page: str, table_id: str = "methods-table"):
        from html.parser import HTMLParser

        self.head, self.rows, outer = [], [], self
        part = page.split(f"<table id={table_id}>", 1)[1].split("</table>", 1)[0]

        class P(HTMLParser):
            cell = None

            def handle_starttag(self, tag, attrs):
                if tag == "tr":
                    outer.rows.append([])
                elif tag in ("th", "td"):
                    self.cell = {"tag": tag, "text": "", **dict(attrs)}

            def handle_data(self, data):
                if self.cell is not None:
                    self.cell["text"] += data

            def handle_endtag(self, tag):
                if tag in ("th", "td") and self.cell is not None:
                    outer.rows[-1].append(self.cell)
                    self.cell = None

        P().feed(part)
        self.head = self.rows.pop(0)


def test_ranking_table_shows_eight_short_columns_by_default():
    doc = _rich()
    for page in (render_report(doc), render_index(doc)):
        t = _Table(page)
        shown = [c for c in t.head if "more" not in (c.get("class") or "")]
        assert [c["text"] for c in shown] == DEFAULT_HEADERS
        assert len(t.head) == 21  # the other thirteen are still there, behind the toggle
        for c in t.head:
            assert len(c["text"].split()) <= 2 and len(c.get("title") or "") > 20, c  # short header, full tooltip
        assert len(t.rows) == len(doc["methods"])
        for row in t.rows:  # every row has exactly the header's cells, the hidden ones marked like theirs
            assert [("more" in (c.get("class") or "")) for c in row] == [("more" in (c.get("class") or ""))
                                                                        for c in t.head]
        # the toggle is a checkbox before the table, and the stylesheet hides the marked cells until it is checked
        assert '<input type=checkbox id=methods-table-all>' in page.split("<table id=methods-table>", 1)[0]
        assert ".cols>input:not(:checked)~table .more{display:none}" in page


def test_pages_name_no_best_and_open_with_the_headline(monkeypatch):
    """A resolved single winner on a quiet run, and no winner on a loaded one: no "best" label either way; the
    top of both pages is the headline (report/headline.py), above the noise banner when there is one."""
    import math
    import re

    import numpy as np

    from dflash_core.report import html as pages

    from .test_report_ranking import LOADED, QUIET, TRUTH, _ratios, draw_run, run_of

    truth = dict(TRUTH)
    truth["jump_mobs"] = truth["mobs"] + math.log1p(0.10)
    rng = np.random.default_rng(2)
    quiet = build_report([run_of(_ratios(draw_run(rng, truth, QUIET, 16)))], ["q"])
    loud = build_report([run_of(_ratios(draw_run(rng, truth, LOADED, 16)))], ["l"])
    assert quiet["winner"]["method"] == "jump_mobs" and loud["noise"]["noisy"] and loud["winner"] is None
    monkeypatch.setattr(pages, "headline_html", lambda d: "<p id=headline>HEADLINE</p>")
    for doc in (quiet, loud):
        for page in (pages.render_report(doc), pages.render_index(doc)):
            text = re.sub(r"<[^>]+>", " ", page.split("<script", 1)[0])
            assert not re.search(r"\bbest\s*:", text, re.I), re.findall(r".{60}\bbest\s*:.{60}", text, re.I)
            assert not re.search(r"best method\s*<b", page), "a KPI naming a best method"
            main = page.split("<main>", 1)[1].lstrip()
            assert main.startswith("<p id=headline>HEADLINE</p>")
            assert ("id=noise-banner" in main) == (doc is loud)


def test_explorer_shows_the_prompt_before_the_generated_text():
    doc = _rich()
    doc["trace_prompt"] = "def f(x):  # <b>not markup</b>"
    page = render_index(doc)
    assert page.index("id=prompt") < page.index("id=context")
    assert "def f(x):  # &lt;b&gt;not markup&lt;/b&gt;" in page.split("id=prompt", 1)[1].split("</div>", 1)[0]
    doc["trace_prompt"] = None  # a run saved before the prompt was recorded says so
    assert "did not record its prompt" in render_index(doc)


def _svg_series(page: str) -> dict:
    """Per plot id and series: the data-y of every point, as the markup holds them (no browser)."""
    from html.parser import HTMLParser

    out: dict = {}
    cur = {"plot": None, "series": None}

    class P(HTMLParser):
        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            if tag == "svg" and "plot" in (a.get("class") or ""):
                cur["plot"] = a["id"]
                out[a["id"]] = {}
            elif tag == "g" and a.get("class") == "series":
                cur["series"] = a["data-series"]
                out[cur["plot"]][cur["series"]] = []
            elif tag == "circle" and a.get("class") == "pt":
                out[cur["plot"]][cur["series"]].append(float(a["data-y"]))

    P().feed(page)
    return out


def test_every_plot_draws_every_value_of_benchmark_json():
    from ..support.browser import expected_series

    doc = _rich()
    got = _svg_series(render_report(doc))
    want = expected_series(doc)
    assert set(got) == set(want) == {"plot-speedup-width", "plot-acceptance-position", "plot-verify-cost",
                                     "plot-noise", "plot-tokens-per-call"}
    for pid, series in want.items():
        assert set(got[pid]) == set(series), pid
        for name, ys in series.items():
            assert got[pid][name] == pytest.approx(ys, abs=1e-4), (pid, name)


def test_a_figure_without_data_says_so_instead_of_empty_axes():
    page = render_report(build_report([_saved([_bench("normal", 0), _bench("dflash", 2, speedup=1.5)])], ["r"]))
    for pid in ("plot-verify-cost", "plot-noise"):
        assert f'id="{pid}" data-plot-empty="1"' in page and f'<svg id="{pid}"' not in page


def test_pages_in_chromium_draw_every_plot_and_eight_columns(chromium, tmp_path):
    """The browser's own geometry: every point of every series has a box inside its plot, at benchmark.json's
    value, and the ranking table shows its eight columns until the toggle is checked."""
    from ..support.browser import assert_plots_drawn

    doc, out = _rich(tmp_path)
    report = chromium.probe(out / "report.html")
    assert_plots_drawn(report, doc)
    for page, probe in (("report.html", report), ("index.html", chromium.probe(out / "index.html"))):
        assert probe["tables"]["methods-table"]["visible"] == DEFAULT_HEADERS, page
        assert probe["tables"]["methods-table"]["all"] == 21


def test_screenshot_script_cuts_every_figure_out_of_the_report():
    """scripts/screenshots.py shoots each figure alone: it must find all four in a report with data, sized to the
    figure, and skip (not shoot empty axes of) a figure the run has no data for."""
    from ..support.helpers import load_file

    shots = load_file("scripts/screenshots.py")
    PLOT_IDS, figure_page = shots.PLOT_IDS, shots.figure_page
    page = render_report(_rich())
    for pid in PLOT_IDS:
        fig = figure_page(page, pid)
        assert fig is not None, pid
        html_, w, h = fig
        assert f'<svg id="{pid}"' in html_ and "<details>" not in html_ and w > 500 and h > 300
    sparse = render_report(build_report([_saved([_bench("normal", 0), _bench("dflash", 2, speedup=1.5)])], ["r"]))
    assert figure_page(sparse, "plot-noise") is None and figure_page(sparse, "plot-speedup-width") is not None


def test_an_interval_cell_shows_its_coverage_and_keeps_the_label_as_a_tooltip():
    """Eight columns must fit a laptop screen: the cell shows "75 %" or "95 %", the full label is the tooltip."""
    import re

    from dflash_core.report.html import _coverage

    assert _coverage("min-max of 3 rounds (covers the median with 75.0 %)") == (
        '<span class=muted title="min-max of 3 rounds (covers the median with 75.0 %)">75 %</span>')
    assert ">95 %</span>" in _coverage("95 % CI (order statistics 4 and 13 of 16, exact coverage 97.9 %)")
    assert _coverage(None) == "" and _coverage("") == ""
    page = render_report(_rich())
    table = page.split("<table id=methods-table>", 1)[1].split("</table>", 1)[0]
    assert "covers the median with" not in re.sub(r'title="[^"]*"', "", table)  # only inside tooltips


def _caption(page: str, plot_id: str) -> str:
    import html as html_

    fig = page.split(f'id="{plot_id}"', 1)[1].split("<figcaption class=muted>", 1)[1].split("</figcaption>", 1)[0]
    return html_.unescape(fig)


def test_each_caption_names_the_statistic_it_draws():
    """Every caption says exactly what its interval is: the speedup whiskers and the oracle whiskers are the rows'
    order-statistic intervals (their own labels, never "bootstrap"); the tokens-per-call figure says it has none; the
    verify-cost curve is drawn only where the loop measured it and a measured oracle above the model bound is
    explained; normal against itself is the A/A figure, not a speedup; the ranking sorts by the ranking statistic.
    Breaks: a "95 % bootstrap" caption, the curve drawn at every width, normal's row shown as a speedup."""
    from dflash_core.report import plots
    from dflash_core.stats.summary import median_interval

    doc = _rich()
    page = render_report(doc)
    assert "bootstrap CI" not in page and "bootstrap interval" not in page and "bootstrap confidence" not in page
    labels = {r["speedup_ci_label"] for mid, m in doc["methods"].items() if mid != "normal" for r in m["rows"].values()}
    assert labels == {median_interval([1.0] * 6)["label"]}  # 6 rounds each: one label, named in full
    cap = _caption(page, "plot-speedup-width")
    assert f"whisker: the order-statistic interval of the median: {labels.pop()}" in cap
    assert "whisker: 95 % CI" in page.split('id="plot-speedup-width"', 1)[1].split("</svg>", 1)[0]
    oracle = {r["speedup_ci_label"] for k, r in doc["references"].items() if k.startswith("oracle-w")}
    assert oracle == {median_interval([1.0] * 5)["label"]} and oracle.pop() in _caption(page, "plot-verify-cost")
    assert "no interval" in _caption(page, "plot-tokens-per-call")
    tau = page.split('id="plot-tokens-per-call"', 1)[1].split("</svg>", 1)[0]
    assert tau.count('class=pt ') == sum(len(m["rows"]) for mid, m in doc["methods"].items() if mid != "normal")
    # the fitted verify curve at measured widths only; a measured oracle above the bound is explained
    for r in doc["methods"]["dflash"]["rows"].values():
        r.pop("loop_costs")
    doc["methods"]["dflash"]["rows"]["3"]["loop_costs"] = {"verify": {"k": [2, 3, 4], "calls": [4, 9, 0],
                                                                      "median": [0.01, 0.01, 0.0]}}
    doc["upper_bound_speedup"] = {**doc["upper_bound_speedup"], "3": 1.5}
    page = render_report(doc)
    assert plots.measured_verify_widths(doc) == [2, 3] and plots.bound_exceeded(doc) == [3]
    vc = page.split('<svg id="plot-verify-cost"', 1)[1].split("</svg>", 1)[0]
    left = vc.split('data-series="verify cost"', 1)[1].split("</g>", 1)[0]
    assert left.count('class=pt ') == 2
    cap = _caption(page, "plot-verify-cost")
    assert "a point at each width the loop timed (2, 3)" in cap and "hollow points for the isolated curve" in cap
    assert "At width 3 the measured oracle lies above" in cap
    # normal against itself: the A/A figure
    table = _Table(page)
    normal = next(r for r in table.rows if r and r[0]["text"].endswith("normal"))
    assert normal[3]["text"].startswith("A/A ") and "A/A" in _caption(page, "plot-noise")
    assert 'data-series="normal vs normal"' in page.split('id="plot-noise"', 1)[1].split("</svg>", 1)[0]
    # the ranking table's order: rank group, then the ranking statistic (vs dflash), normal last
    from dflash_core.report.html import ranking_order

    order = [mid for mid, _ in sorted(doc["methods"].items(), key=lambda kv: ranking_order(doc, kv))]
    assert [r[0]["text"].split(" ", 1)[1] for r in table.rows if r] == order and order[-1] == "normal"
    keys = [(m["best"]["rank_group"], -m["best"]["vs_baseline"]) for mid, m in doc["methods"].items()
            if mid != "normal"]
    assert [(doc["methods"][mid]["best"]["rank_group"], -doc["methods"][mid]["best"]["vs_baseline"])
            for mid in order[:-1]] == sorted(keys)


def test_table_bars_order_and_chart_come_from_one_statistic():
    """The ranking table is ordered by the ranking's statistic (the ratio against dflash at the ranking width), so
    its bars and the chart's bars show that statistic too, never a 3-round speedup: within a rank group the bars
    shrink down the table, and the chart draws each method's vs_baseline median."""
    import re

    from ..support.report_data import rich_saved

    doc = build_report([rich_saved()], ["r"])
    page = render_report(doc)
    table = page.split("id=methods-table", 1)[1].split("</table>", 1)[0]
    rows = [r for r in table.split("<tr")[2:] if 'data-method="normal"' not in r]
    widths, groups = [], []
    for r in rows:
        mid = re.search(r'data-method="([a-z0-9_]+)"', r).group(1)
        vs_cell = r.split("<td class=vs>", 1)[1].split("</td>", 1)[0]
        speed_cell = r.split("<td class=speedup>", 1)[1].split("</td>", 1)[0]
        assert "class=\"bar" in vs_cell and "class=\"bar" not in speed_cell, mid
        widths.append(int(re.search(r"width:([0-9]+)px", vs_cell).group(1)))
        groups.append(doc["methods"][mid]["best"]["rank_group"])
    for g in set(groups):
        ws = [w for w, gg in zip(widths, groups) if gg == g]
        assert ws == sorted(ws, reverse=True), (g, ws)
    chart = page.split("id=speedup-chart", 1)[1].split("</svg>", 1)[0]
    assert 'data-statistic="vs_baseline"' in chart
    drawn = [float(x) for x in re.findall(r"<title>[a-z0-9_]+: ([0-9.]+)x, interval", chart)]
    order = [re.search(r'data-method="([a-z0-9_]+)"', r).group(1) for r in rows]
    assert drawn == [round(doc["methods"][m]["best"]["vs_baseline"], 3) for m in order]


# Okabe & Ito (2008), "Color Universal Design": the eight colours (black, invisible on the dark page, as a light
# grey), and a lighter blue of the same hue
OKABE_ITO = {"#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#3D8FD1", "#D55E00", "#CC79A7", "#BBBBBB"}


def test_no_two_methods_look_alike_and_the_palette_is_colour_blind_safe():
    """Fifteen methods, eight Okabe-Ito colours: the second eight draw dashed lines with hollow markers, so every
    method's (colour, dash, marker) is its own, in every per-method plot and its legend."""
    import re

    from dflash_core.report.plots import PALETTE

    doc = _rich()
    page = render_report(doc)
    for pid in ("plot-speedup-width", "plot-tokens-per-call", "plot-acceptance-position"):
        svg = page.split(f'<svg id="{pid}"', 1)[1].split("</svg>", 1)[0]
        looks = {}
        for g in svg.split("<g class=series")[1:]:
            name = re.search(r'data-series="([^"]+)"', g).group(1)
            colour = re.search(r'stroke="(#[0-9A-Fa-f]{6})"', g).group(1)
            dash = re.search(r'stroke-dasharray="([0-9,]+)"', g.split("<circle", 1)[0])
            hollow = 'fill="#0f1419" stroke=' in g.split("<circle", 1)[1]
            looks[name] = (colour, dash.group(1) if dash else "", hollow)
        assert len(looks) == len(doc["methods"]) - 1 and len(set(looks.values())) == len(looks), (pid, looks)
        assert {c for c, _, _ in looks.values()} <= set(PALETTE) <= OKABE_ITO
        keys = re.findall(r'<g class=key data-key="([^"]+)">', svg)
        assert keys[:len(looks)] == list(looks)  # the legend shows each series as it is drawn


def test_the_verify_cost_plot_draws_the_measured_points_and_the_fitted_curve_to_the_block_size():
    """The loop's fitted curve as a line over every width it holds (to the block size), its value as a point only at
    the widths the loop timed, and the isolated curve's measured points at every width it was measured."""
    import re

    doc = _rich()
    fitted = doc["verify_cost"]["ratio"]
    iso = doc["verify_cost"]["isolated"]["ratio"]
    assert len(iso) == 16 and len(fitted) >= 15
    svg = render_report(doc).split('<svg id="plot-verify-cost"', 1)[1].split("</svg>", 1)[0]
    curve = re.search(r'<g class=curve data-curve="fitted curve \(loop\), to the block size" data-points="([0-9]+)"',
                      svg)
    assert curve and int(curve.group(1)) == len(fitted)
    points = svg.split('data-series="isolated (measured)"', 1)[1].split("</g>", 1)[0]
    assert [float(y) for y in re.findall(r'class=pt data-x="[0-9]+" data-y="([0-9.]+)"', points)] == \
        pytest.approx([iso[w] for w in sorted(iso, key=int)], abs=1e-4)


def test_the_width_plot_shows_every_width_the_width_choice_evaluated_and_each_methods_own():
    """The matrix times a few widths; the width choice priced every width on calibration prompts: the plot draws that
    model curve over all of them (its x axis holds every width), and rings each method's own width where the run
    records one (settings.method_widths)."""
    import re

    doc = _rich()
    doc["settings"]["width_choice"] = {"rule": "r", "table": [{"width": w, "model_speedup": 1 + 0.1 * w}
                                                              for w in range(1, 17)]}
    doc["settings"]["method_widths"] = {"dflash": {"selected": 7}, "mobs": {"selected": 15}}
    svg = render_report(doc).split('<svg id="plot-speedup-width"', 1)[1].split("</svg>", 1)[0]
    assert 'data-curve="dflash, cost model on calibration prompts" data-points="16"' in svg
    ticks = re.findall(r'text-anchor="middle">([0-9]+)</text>', svg)
    assert [int(t) for t in ticks] == list(range(1, 17))
    assert re.findall(r'<circle class=own-width data-method="([a-z_]+)" data-x="([0-9]+)"', svg) == [
        ("dflash", "7"), ("mobs", "15")]


def test_the_peer_row_stands_beside_the_labs_dflash_at_its_width_on_both_pages():
    """transformers' DFlash row shows its measured width and tokens per target call, with and without the prefill
    call (vLLM's acceptance length), beside the lab's dflash at that same width, on report.html and index.html."""
    from dflash_core.report.html import render_index

    from ..support.report_data import rich_saved

    s = rich_saved()
    s["benchmarks"].append({"name": "test_reference[dflash_transformers-cpu]", "fullname": "x", "stats": {},
                            "extra_info": {"reference": "dflash_transformers", "device": "cpu",
                                           "tokens_per_second": 150.0, "speedup": 1.4, "speedup_iqr": 0.1,
                                           "speedup_rounds": [1.3, 1.4, 1.5], "exact": True, "verdicts": {"exact": 1},
                                           "target_calls": 40, "new_tokens": 192, "prompts": 4,
                                           "tokens_per_target_call": 4.8, "width": 15}})
    doc = build_report([s], ["r"])
    ours = doc["methods"]["dflash"]["rows"]["15"]
    for page in (render_report(doc), render_index(doc)):
        table = page.split("id=peer-table>", 1)[1].split("</table>", 1)[0]
        peer, lab = table.split("<tr>")[2:4]
        assert "dflash_transformers (peer)</td><td>15</td><td>4.80</td><td>5.22</td>" in peer  # 188 / 36
        assert f"dflash (this lab)</td><td>15</td><td>{ours['tokens_per_target_call']:.2f}</td>" in lab


def test_a_pooled_report_is_written_beside_the_single_runs_not_over_it(tmp_path):
    """`report 0001 --out R` writes R/cpu/; `report 0001 0002 --out R` writes R/cpu/pooled-0001-0002/ and leaves the
    single run's report as it was."""
    a = _saved([_bench("normal", 0), _bench("dflash", 2, speedup=1.05, rounds=[1.0, 1.1])])
    b = _saved([_bench("normal", 0), _bench("dflash", 2, speedup=1.25, rounds=[1.2, 1.3])])
    fa, fb = tmp_path / "0001_abc_20261207.json", tmp_path / "0002_abc_20261207.json"
    fa.write_text(json.dumps(a))
    fb.write_text(json.dumps(b))
    out = tmp_path / "reports"
    assert report_main([str(fa), "--out", str(out)]) == 0
    single = (out / "cpu" / "benchmark.json").read_bytes()
    assert report_main([str(fa), str(fb), "--out", str(out)]) == 0
    assert (out / "cpu" / "benchmark.json").read_bytes() == single
    pooled = json.loads((out / "cpu" / "pooled-0001-0002" / "benchmark.json").read_text())
    assert len(pooled["runs"]) == 2 and (out / "cpu" / "pooled-0001-0002" / "index.html").is_file()
