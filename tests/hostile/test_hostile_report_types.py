"""Wrong types in a saved run or a benchmark.json (issue 70, round three): a string or an int where an object or a
list belongs crashed `report`, `gate` and `compare` deep in the pages, the cost model or the setup match, and the
gate's exit 1 then read as "regression found". The inputs are now checked once at load (report.build.validate_saved
for a saved run, report.schema.check_benchmark for a benchmark.json); whatever reachable value is replaced by one
of another JSON type, each command succeeds or ends in exactly one `error:` line and exit 2, never a traceback and
never exit 1."""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dflash_core.report.__main__ import main as report_main

from ..support.report_data import rich_saved
from .test_hostile_fuzz import _run_cli as run_cli

WRONG = {"str": "x", "int": 7, "list": [1], "dict": {"a": 1}, "null": None}
FOCUS = {"loop_costs", "calibration", "provenance", "width_choice", "method_widths", "block_size", "runs", "rows",
         "settings", "machine_info", "verify_cost", "references", "ranking", "exactness", "best"}


def _kind(v) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "int"  # a number: an int where a float stood is not a wrong type
    return {str: "str", list: "list", dict: "dict", type(None): "null"}[type(v)]


def base_run() -> dict:
    """rich_saved (every method, loop timings, references, the verify-cost curve) with the run sections a real
    bench writes: calibration tables, the cost model, the width choice, each method's own width, ranking rounds."""
    s = rich_saved()
    lab = s["dflash"]
    table = [{"key": "tau=0.25", "model_speedup": 1.2, "tokens_per_target_call": 2.0, "tokens_per_second": 90.0}]
    lab["calibration"] = {"act": {"objective": "cost-model speedup", "widths": {"7": {
        "selected": {"tau": 0.25}, "table": table, "stage2": {"table": table}}}}}
    lab["cost_model"] = {"objective": "cost-model speedup", "ratio_band": [0.9, 1.1], "quiet_noise": 0.03,
                         "source": "calibration"}
    lab["settings"].update(block_size=16, width_choice={
        "rule": "r", "selected": [3, 7, 15], "table": [{"width": 3, "model_speedup": 1.4}],
        "verify_over_decode": {"1": 1.03}, "width_model": {"decodes": 4, "decode_tokens": 24, "tokens": 96}},
        method_widths={"dflash": {"selected": 7}, "mobs": {"selected": 15}})
    lab["ranking_rounds"] = {"width": 15, "rounds": 6, "cases": {"dflash-w15": {"rounds": 6, "top_up_rounds": 0}}}
    return s


def value_paths(doc, prefix=()):
    """Every value's location, one item of a list standing for all (the run's cases each stand for themselves)."""
    if prefix:
        yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from value_paths(v, (*prefix, k))
    elif isinstance(doc, list) and doc:
        for i in range(len(doc)) if prefix == ("benchmarks",) else (0,):
            yield from value_paths(doc[i], (*prefix, i))


def replaced(doc, path, value):
    doc = copy.deepcopy(doc)
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = value
    return doc


def _ends_well(args: list[str], ok: tuple[int, ...]) -> None:
    """Exit in `ok` with no `error:` line and no traceback, or exit 2 with exactly one `error:` line."""
    rc, err = run_cli(args)
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert "Traceback" not in err, (args, err)
    if rc == 2:
        assert len(errors) == 1 and len([ln for ln in err.splitlines() if ln.strip()
                                         and not ln.startswith("note: ")]) == 1, (args, err)
    else:
        assert rc in ok and not errors, (args, rc, err)


class Inputs(dict):
    """The base run, its report's benchmark.json, both on disk, and the paths a mutation may hit; a short repr
    (Hypothesis prints its arguments)."""

    def __repr__(self) -> str:
        return f"Inputs({self['dir']})"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Inputs:
    d = tmp_path_factory.mktemp("types")
    saved = base_run()
    (d / "run.json").write_text(json.dumps(saved))
    assert report_main([str(d / "run.json"), "--out", str(d / "r")]) == 0
    canonical = json.loads((d / "r" / "cpu" / "benchmark.json").read_text())
    return Inputs(dir=d, saved=(saved, list(value_paths(saved))), canonical=(canonical, list(value_paths(canonical))))


def test_the_base_inputs_are_accepted_by_every_command(inputs, capsys):
    """The property's starting points pass: a refusal below comes from the mutation, not the base."""
    d = inputs["dir"]
    canon = d / "r" / "cpu" / "benchmark.json"
    for base, new in ((d / "run.json", d / "run.json"), (canon, canon), (d / "run.json", canon)):
        assert report_main(["gate", str(base), str(new)]) in (0, 3)
        assert report_main(["compare", str(base), str(new), "--out", str(d / "c")]) == 0
    assert "error" not in capsys.readouterr().err


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(which=st.sampled_from(["saved", "canonical"]), focus=st.booleans(), where=st.integers(0, 2 ** 20),
       wrong=st.integers(0, 3))
def test_a_wrong_typed_value_anywhere_is_one_error_line_or_harmless(inputs, which, focus, where, wrong):
    base, paths = inputs[which]
    # half the draws go to the sections whose wrong types crashed a command (issue 70's probe and a scan of every
    # value of a real run): the loop timings, calibration tables, provenance, settings, runs, the cases' rows
    hot = [p for p in paths if FOCUS & set(map(str, p))] if focus else paths
    path = hot[where % len(hot)]
    here = base
    for step in path:
        here = here[step]
    kinds = [k for k in WRONG if k != _kind(here)]
    bad = replaced(base, path, copy.deepcopy(WRONG[kinds[wrong % len(kinds)]]))
    good = inputs["dir"] / ("run.json" if which == "saved" else "r/cpu/benchmark.json")
    with tempfile.TemporaryDirectory() as t:
        hostile = Path(t) / "hostile.json"
        hostile.write_text(json.dumps(bad))
        if which == "saved":
            _ends_well([str(hostile), "--out", f"{t}/r"], ok=(0,))
        # exit 1 would say "regression found" about a file that only changed a type: never
        _ends_well(["gate", str(good), str(hostile)], ok=(0, 3))
        _ends_well(["gate", str(hostile), str(good)], ok=(0, 3))
        _ends_well(["compare", str(good), str(hostile), "--out", f"{t}/c"], ok=(0,))


# --- export-drafter's model card -----------------------------------------------------------------------------------

MARKUP = "<img src=x onerror=alert(1)>`](javascript:alert(2))\n# pwned"


@pytest.mark.parametrize("field", ["device", "datetime", "commit", "prompt_limit", "tokens"])
def test_only_plain_names_and_counts_of_a_report_enter_the_model_card(field):
    """The card is markdown the hub renders: a report's device, datetime, commit and counts enter it only spelled as
    such (cpu/cuda/cuda:N/mps, an ISO datetime, a hex commit id, digits); any other text is left out as "?"."""
    from dflash_core.prepare.model_card import _tau, measured_tau

    doc = {"device": "cuda:1", "settings": {"prompt_limit": 4, "tokens": 48},
           "runs": [{"datetime": "2026-12-07T22:56:17.865394+00:00", "commit": "0123456789abcdef"}],
           "methods": {"dflash": {"rows": {"2": {"tokens_per_target_call": 2.25}, "x": {}}}}}
    text = "\n".join(_tau(measured_tau(doc)))
    assert "4 held-out benchmark prompts x 48 tokens" in text and "cuda:1, 2026-12-07T22:56:17.865394+00:00" in text
    assert "`0123456789ab`" in text and "| 2 | 2.25 |" in text
    target = doc["runs"][0] if field in ("datetime", "commit") else doc["settings"] if field in (
        "prompt_limit", "tokens") else doc
    target[field] = MARKUP
    text = "\n".join(_tau(measured_tau(doc)))
    assert "<img" not in text and "javascript" not in text and "pwned" not in text


def test_a_malformed_report_of_this_drafter_is_refused_by_the_reports_loader(inputs, tmp_path, capsys):
    """find_report validates each report of this drafter with the check it is given (the report's loader); a report
    of another drafter is only skipped, a malformed one of this drafter is one error line naming it."""
    from dflash_core.errors import guarded
    from dflash_core.prepare.model_card import find_report
    from dflash_core.report.schema import check_benchmark

    doc, _ = inputs["canonical"]
    doc = copy.deepcopy(doc)
    doc["provenance"]["artifacts"]["files"]["drafter.safetensors"] = {"sha256": "a" * 64, "bytes": 1}
    doc["target"]["content_sha256"] = "b" * 64
    (tmp_path / "cpu").mkdir()
    path = tmp_path / "cpu" / "benchmark.json"
    path.write_text(json.dumps(doc))
    assert find_report([tmp_path], "a" * 64, "b" * 64, check=check_benchmark) == doc
    doc["methods"]["dflash"]["rows"] = "2.25"
    path.write_text(json.dumps(doc))
    assert find_report([tmp_path], "c" * 64, "b" * 64, check=check_benchmark) is None  # not this drafter's
    capsys.readouterr()
    assert guarded(find_report, [tmp_path], "a" * 64, "b" * 64, check=check_benchmark) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("error: ") and str(path) in err[0] and "methods.dflash.rows" in err[0]


def test_a_report_the_lab_writes_is_one_the_gate_reads(tmp_path, capsys):
    """The gate validates benchmark.json against the schema: a report of a run whose `dflash.methods` lacks a method
    (label null) or whose runs name no commit must still be read (a schema stricter than what report writes)."""
    from ..support.report_data import bench_row, saved_run

    run = saved_run([bench_row("normal", 0), bench_row("dflash", 2, speedup=1.5), bench_row("mobs", 2, speedup=1.6)])
    run["commit_info"] = None
    (tmp_path / "run.json").write_text(json.dumps(run))
    assert report_main([str(tmp_path / "run.json"), "--out", str(tmp_path / "r")]) == 0
    doc = tmp_path / "r" / "cpu" / "benchmark.json"
    assert json.loads(doc.read_text())["methods"]["mobs"]["label"] is None
    assert report_main(["gate", str(doc), str(doc)]) in (0, 3)
    assert "error" not in capsys.readouterr().err
