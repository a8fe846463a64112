"""`--calibration-from RUN`: a run reuses another run's widths and calibrated options; the file is hostile input
(bounded size, shapes, types, known methods, valid options) and a bad one fails with one `error:` line, exit 2."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from dflash_core import __main__ as cli
from dflash_core import savedruns
from dflash_core.bench import reuse
from dflash_core.errors import BadInputError
from dflash_core.report.build import build_report

from ..support.report_data import bench_row, saved_run

CHOSEN = {"widths": [4, 11], "source": "auto",
          "options": {"dspark_lite": {"4": {"floor": 0.35}, "11": {"floor": 0.0}},
                      "act": {"4": {"tau": 0.5}, "11": {"tau": 0.25}}}}


def _saved(chosen=CHOSEN, rows=None):
    doc = saved_run(rows or [bench_row("normal", 0), bench_row("dflash", 4), bench_row("dflash", 11)])
    if chosen is not None:
        doc["dflash"]["settings"]["chosen"] = chosen
    return doc


def _file(tmp_path, doc, name="0001_run.json"):
    p = tmp_path / name
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return p


def test_reads_the_chosen_record_of_a_saved_run_and_of_its_benchmark_json(tmp_path):
    got = reuse.load_reused(str(_file(tmp_path, _saved())))
    assert got.widths == (4, 11)
    assert got.options == {"dspark_lite": {4: {"floor": 0.35}, 11: {"floor": 0.0}},
                           "act": {4: {"tau": 0.5}, 11: {"tau": 0.25}}}
    canonical = build_report([_saved()], ["r"])
    again = reuse.load_reused(str(_file(tmp_path, canonical, "benchmark.json")))
    assert again.widths == got.widths and again.options == got.options


def test_a_run_without_the_record_gives_its_cases_widths_and_options(tmp_path):
    rows = [bench_row("normal", 0), bench_row("dflash", 2), bench_row("dspark_lite", 2), bench_row("dspark_lite", 6)]
    rows[2]["extra_info"]["options"] = {"floor": 0.2}
    rows[3]["extra_info"]["options"] = {"floor": 0.05}
    got = reuse.load_reused(str(_file(tmp_path, _saved(None, rows))))
    assert got.widths == (2, 6) and got.options == {"dspark_lite": {2: {"floor": 0.2}, 6: {"floor": 0.05}}}


def test_a_run_id_resolves_under_the_storage_folder(tmp_path, monkeypatch):
    store = tmp_path / ".benchmarks" / "cpu"
    store.mkdir(parents=True)
    _file(store, _saved(), "0001_abc.json")
    monkeypatch.chdir(tmp_path)
    assert reuse.load_reused("0001").widths == (4, 11)
    with pytest.raises(BadInputError, match="no saved run matches '0002'"):
        reuse.load_reused("0002")


def _with(**chosen):
    return _saved({**CHOSEN, **chosen})


def _sized(chosen):
    doc = _saved()
    doc["dflash"]["settings"]["size_plan"] = {"chosen": chosen}
    return doc


def test_a_real_targets_budgeted_size_is_reused_whole(tmp_path):
    """Two runs of a real target compare only at the same prompts and tokens (report.build.WORKLOAD), so a run
    that reuses another's choices reuses its budgeted size instead of planning its own on this run's timings."""
    size = {"prompt_limit": 2, "tokens": 16, "rounds": 1}
    assert reuse.load_reused(str(_file(tmp_path, _sized(size)))).size == size
    assert reuse.load_reused(str(_file(tmp_path, _saved(), "0002_run.json"))).size is None


@pytest.mark.parametrize("content, message", [
    (b"\xff\xfe{}", "is not UTF-8"),
    (b'{"benchmarks": [], "dflash": {"settings": {"chosen": {"widths": [NaN]}}}}', "non-finite number NaN"),
    (b"[1, 2]", "is not a JSON object"),
    (b"[" * 100000 + b"]" * 100000, "nests deeper"),
    (b'{"benchmarks": [], "dflash": {"settings": {"chosen": {"widths": [' + b"9" * 5000 + b']}}}}', "not valid JSON"),
    (b'{"benchmarks": 3}', "neither a saved lab run"),
    (json.dumps(_with(widths=[4, True])).encode(), "not a verify width"),
    (json.dumps(_with(widths=[0, 4])).encode(), "not a verify width"),
    (json.dumps(_with(widths=list(range(1, 100)))).encode(), "list of 1..64 verify widths"),
    (json.dumps(_with(widths="4,11")).encode(), "list of 1..64 verify widths"),
    (json.dumps(_with(options={"act": {"5": {"tau": 0.5}}})).encode(), "not one of the run's widths [4, 11]"),
    (json.dumps(_with(options={"act": {"4": {"tau": {"x": 1}}}})).encode(), "must be a finite number"),
    (json.dumps(_with(options={"act": {"4": {"tau; rm": 1}}})).encode(), "names the option"),
    (json.dumps(_with(options={"../x": {}})).encode(), "not a method id"),
    (json.dumps(_with(options={"act": {"4": {"tau": "x" * 500}}})).encode(), "must be a finite number"),
    (json.dumps(_with(options={"nope": {"4": {}}})).encode(), "unknown method 'nope'"),
    (json.dumps(_with(options={"dspark_lite": {"4": {"floor": -3.0}}})).encode(), "dspark_lite at width 4"),
    (json.dumps(_with(options={"dspark_lite": {"4": {"speed": 1}}})).encode(), "has no option"),
    (json.dumps(_with(options={"dflash": {"4": {"tau": 1}}})).encode(), "dflash is not calibrated"),
    (json.dumps(_with(ranking_width=7)).encode(), "ranking_width.*not one of its widths"),
    (json.dumps(_with(ranking_width="11")).encode(), "ranking_width.*not one of its widths"),
    (json.dumps(_sized({"prompt_limit": 1, "tokens": 8})).encode(), "size_plan must hold chosen"),
    (json.dumps(_sized({"prompt_limit": 1, "tokens": True, "rounds": 1})).encode(), "size_plan must hold chosen"),
    (json.dumps(_sized({"prompt_limit": 0, "tokens": 8, "rounds": 1})).encode(), "size_plan must hold chosen"),
    (json.dumps(_sized({"prompt_limit": 1, "tokens": 10**9, "rounds": 1})).encode(), "size_plan must hold chosen"),
    (json.dumps(_sized([1, 8, 1])).encode(), "size_plan must hold chosen"),
])
def test_hostile_files_are_refused_naming_the_problem(tmp_path, content, message):
    p = tmp_path / "run.json"
    p.write_bytes(content)
    with pytest.raises(BadInputError, match=message.replace("[", r"\[").replace("]", r"\]")):
        reuse.load_reused(str(p))


def test_size_is_bounded_before_the_file_is_read(tmp_path, monkeypatch):
    p = _file(tmp_path, _saved())
    monkeypatch.setattr(savedruns, "MAX_BYTES", 100)
    monkeypatch.setattr(type(p), "read_bytes", lambda self: pytest.fail("read a file over the size bound"))
    with pytest.raises(BadInputError, match="more than the 100-byte limit"):
        savedruns.read_source(p)


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_a_run_id_resolving_to_a_fifo_or_a_device_is_refused_before_it_is_opened(tmp_path, monkeypatch, kind):
    """A glob or run id found in the storage folder may name a FIFO (open blocked forever) or a link to /dev/zero
    (read until memory ran out): refused by its file type, before any read."""
    import os

    store = tmp_path / ".benchmarks" / "Linux-CPython"
    store.mkdir(parents=True)
    p = store / "0001_run.json"
    if kind == "fifo":
        os.mkfifo(p)
    else:
        p.symlink_to("/dev/zero")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BadInputError, match="FIFO, not a regular file" if kind == "fifo" else "a device"):
        reuse.load_reused("0001")


def _session(widths=(), block=16):
    cfg = SimpleNamespace(calibration_widths=tuple(widths))
    return SimpleNamespace(cfg=cfg, block_size=block, bench_widths=[], width_choice=None, width_options={},
                           options={}, calibration={}, ranking_width=None)


def test_apply_gives_the_session_the_runs_widths_and_options():
    got = savedruns.Reused("RUN", (4, 11), {"act": {4: {"tau": 0.5}, 11: {"tau": 0.25}},
                                         "dspark_lite": {4: {"floor": 0.35}}})  # chosen at one width only
    sess = _session()
    reuse.apply_reused(sess, got)
    assert sess.bench_widths == [4, 11] and sess.width_options == {"act": {4: {"tau": 0.5}, 11: {"tau": 0.25}}}
    assert sess.options["act"] == {"tau": 0.25} and sess.calibration["act"]["reused_from"] == "RUN"
    assert "dspark_lite" not in sess.width_options  # calibrated by this run, at its widths
    with pytest.raises(BadInputError, match="--bench-widths 2,4 and --calibration-from RUN .widths 4,11. disagree"):
        reuse.apply_reused(_session((2, 4)), got)
    reuse.apply_reused(_session((11, 4)), got)  # the same widths, given in another order
    with pytest.raises(BadInputError, match="width 11 exceeds this drafter's block size B=8"):
        reuse.apply_reused(_session(block=8), got)


def test_a_reused_run_ranks_at_the_width_the_run_ranked_at(tmp_path):
    """The ranking width is part of what a run chose: two runs ranked at different widths compare other cases."""
    got = reuse.load_reused(str(_file(tmp_path, _with(ranking_width=11))))
    assert got.ranking_width == 11
    sess = _session()
    reuse.apply_reused(sess, got)
    assert sess.ranking_width == 11
    older = reuse.load_reused(str(_file(tmp_path, _saved(), "0002_run.json")))  # saved before it was recorded
    sess = _session()
    reuse.apply_reused(sess, older)
    assert older.ranking_width is None and sess.ranking_width is None  # chosen again on calibration prompts


def test_bench_refuses_a_bad_file_with_one_error_line_before_prepare(tmp_path, monkeypatch, capsys):
    import dflash_core.prepare.pipeline

    monkeypatch.setattr(dflash_core.prepare.pipeline, "prepare", lambda *a, **k: pytest.fail("prepared first"))
    bad = _file(tmp_path, json.dumps(_with(options={"nope": {"4": {}}})))
    assert cli.main(["bench", "--calibration-from", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "unknown method 'nope'" in err
    monkeypatch.setenv("DFLASH_CALIBRATION_FROM", str(tmp_path / "missing.json"))
    assert cli.main(["bench"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: DFLASH_CALIBRATION_FROM=") and err.count("\n") == 1
