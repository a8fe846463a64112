"""Benchmark prompts by task family: the shipped families' tags, a user's --prompts-file (read as hostile input,
then held out from the drafter's training text), and the per-task figures a case records and the report shows."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from dflash_core.errors import BadInputError
from dflash_core.store.prompt_file import MAX_PROMPTS, read_prompt_file


def test_the_english_family_covers_the_task_families_in_every_prefix():
    """Spec-Bench's kinds for an English target; interleaved, so the first 7 prompts hold one of each."""
    from dflash_core.store.data import load_prompts

    ps = load_prompts("english")
    assert len(ps.benchmark_tasks) == len(ps.benchmark)
    kinds = {"completion", "chat", "summarisation", "qa", "math", "translation", "code"}
    assert set(ps.benchmark_tasks) == kinds and set(ps.benchmark_tasks[:7]) == kinds
    assert set(load_prompts("code").benchmark_tasks) == {"code"}  # untagged prompts: the family's name


def test_a_text_file_is_one_prompt_per_line(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("Tell me a story about a fox.\n\n  \nWhat is 2 + 2?\n", encoding="utf-8")
    pf = read_prompt_file(f)
    assert pf.prompts == ("Tell me a story about a fox.", "What is 2 + 2?") and pf.tasks == ("user", "user")
    assert pf.path == str(f.resolve())


def test_only_newlines_split_a_prompt_file(tmp_path):
    """U+2028, U+2029, form feeds and lone carriage returns are characters inside a line (JSON strings may hold
    them raw); only \\n and \\r\\n end one."""
    f = tmp_path / "p.txt"
    f.write_text("one\u2028still one\x0cand\rone\r\ntwo\u2029two\n", encoding="utf-8")
    assert read_prompt_file(f).prompts == ("one\u2028still one\x0cand\rone", "two\u2029two")
    j = tmp_path / "p.jsonl"
    j.write_bytes(b'{"text": "a\xe2\x80\xa8b\\fc"}\r\n{"text": "d"}\n')  # a raw U+2028 is valid JSON
    assert read_prompt_file(j).prompts == ("a\u2028b\x0cc", "d")


def test_a_jsonl_file_carries_tasks_and_line_breaks(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"text": "Q: one?\nA:", "task": "qa"}) + "\n" + json.dumps({"text": "x = 1"}) + "\n")
    pf = read_prompt_file(f)
    assert pf.prompts == ("Q: one?\nA:", "x = 1") and pf.tasks == ("qa", "user")


@pytest.mark.parametrize("name,content,needle", [
    ("p.txt", b"", "holds no prompt"),
    ("p.txt", b"\xff\xfe bad", "not UTF-8"),
    ("p.txt", b"same\nsame\n", "repeats the prompt of line 1"),
    ("p.txt", b"x" * 9000, "1..8192 characters"),
    ("p.txt", b"".join(b"prompt %d\n" % i for i in range(MAX_PROMPTS + 1)), f"more than {MAX_PROMPTS}"),
    ("p.jsonl", b"{not json}\n", "not one JSON object"),
    ("p.jsonl", b'["a"]\n', "an object with a string"),
    ("p.jsonl", b'{"text": "a", "extra": 1}\n', "no other field"),
    ("p.jsonl", b'{"text": 5}\n', "an object with a string"),
    ("p.jsonl", b'{"text": "a", "task": "Chat Bot"}\n', "must match"),
    ("p.jsonl", b'{"text": "a", "task": 3}\n', "must match"),
    ("p.jsonl", b"[" * 100000 + b"\n", "not one JSON object"),
    ("p.jsonl", b'{"text": "a\\ud800b"}\n', "lone surrogate"),
    ("p.jsonl", b'{"text": "a", "n": ' + b"9" * 5000 + b"}\n", "not one JSON object"),
])
def test_a_bad_prompt_file_is_one_error_naming_the_fix(tmp_path, name, content, needle):
    f = tmp_path / name
    f.write_bytes(content)
    with pytest.raises(BadInputError, match=needle):
        read_prompt_file(f)


def test_a_prompt_file_that_is_not_a_regular_file_is_refused_before_opening(tmp_path):
    with pytest.raises(BadInputError, match="a directory"):
        read_prompt_file(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(BadInputError, match="FIFO"):
        read_prompt_file(fifo)
    with pytest.raises(BadInputError, match="cannot be read"):
        read_prompt_file(tmp_path / "missing.txt")
    big = tmp_path / "big.txt"
    big.write_bytes(b"a\n" * (1 << 20))
    with pytest.raises(BadInputError, match="byte limit"):
        read_prompt_file(big)


def test_the_cli_refuses_a_bad_prompt_file_before_prepare(tmp_path, capsys):
    from dflash_core.__main__ import main

    f = tmp_path / "p.jsonl"
    f.write_text('{"text": "a", "task": "Bad Task"}\n')
    assert main(["bench", "--home", str(tmp_path / "home"), "--prompts-file", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "must match" in err


# --- held out from the drafter's training text -------------------------------------------------------------

WORDS = "the a fox river sea runs quickly into north black over hills".split()


def _fake(tmp_path, sequences, train_sha=None):
    """A runtime whose ids decode to words and a prepared drafter with trajectories and a shipped training text."""
    from dflash_core.prepare.pipeline import TRAJ_FILE
    from dflash_core.prepare.traindata import shipped_text

    rt = SimpleNamespace(tokenizer=object(), decode=lambda ids: " ".join(WORDS[i] for i in ids))
    (tmp_path / TRAJ_FILE).write_text(json.dumps({"sequences": sequences}))
    sha = train_sha or shipped_text("english").sha256
    prepared = SimpleNamespace(manifest={"files": {TRAJ_FILE: {}}, "train_data": {"source": "shipped:english",
                                                                                 "sha256": sha}},
                               load_json=lambda name: json.loads((tmp_path / name).read_text()))
    return rt, prepared


def _pf(tmp_path, *prompts):
    f = tmp_path / "p.txt"
    f.write_text("\n".join(prompts) + "\n")
    return read_prompt_file(f)


def test_user_prompts_that_are_clean_pass_and_say_what_was_checked(tmp_path):
    from dflash_core.bench.userprompts import check_user_prompts
    from dflash_core.store.data import load_prompts

    rt, prepared = _fake(tmp_path, [[0, 2, 5, 6, 7, 1, 9, 10, 4]])
    got = check_user_prompts(rt, prepared, load_prompts("english"), _pf(tmp_path, "Which hills does the fox see?"))
    assert got["trajectories"] == 1 and got["training_text"]["source"] == "shipped:english"


def test_a_user_prompt_inside_a_teacher_trajectory_is_refused(tmp_path):
    from dflash_core.bench.userprompts import check_user_prompts
    from dflash_core.store.data import load_prompts

    seq = [0, 2, 5, 6, 7, 1, 9, 4, 10, 11]  # "the fox runs quickly into a black sea over hills"
    rt, prepared = _fake(tmp_path, [[3, 3], seq])
    with pytest.raises(BadInputError, match="trajectory 1 shares"):
        check_user_prompts(rt, prepared, load_prompts("english"),
                           _pf(tmp_path, "The fox runs quickly into a black sea, they said"))


def test_a_user_prompt_from_the_training_text_or_calibration_is_refused(tmp_path):
    from dflash_core.bench.userprompts import check_user_prompts
    from dflash_core.store.data import load_prompts, read_shipped

    line = next(ln for ln in read_shipped("english_seeds.txt").splitlines() if len(ln.split()) >= 10)
    rt, prepared = _fake(tmp_path, [[0, 1]])
    ps = load_prompts("english")
    with pytest.raises(BadInputError, match="training text shipped:english"):
        check_user_prompts(rt, prepared, ps, _pf(tmp_path, line))
    with pytest.raises(BadInputError, match="calibration"):
        check_user_prompts(rt, prepared, ps, _pf(tmp_path, ps.calibration[0]))


def test_a_training_text_that_changed_since_prepare_is_refused(tmp_path):
    from dflash_core.bench.userprompts import check_user_prompts
    from dflash_core.store.data import load_prompts

    rt, prepared = _fake(tmp_path, [[0, 1]], train_sha="0" * 64)
    with pytest.raises(BadInputError, match="has changed since"):
        check_user_prompts(rt, prepared, load_prompts("english"), _pf(tmp_path, "Which hills?"))


# --- per-task figures -----------------------------------------------------------------------------------------

def _stats(wall, tokens, calls, proposed=0, accepted=0):
    from dflash_core.runtime.decode import DecodeStats

    return DecodeStats(method="dflash", width=4, new_tokens=tokens, target_calls=calls, proposed=proposed,
                       accepted=accepted, wall_seconds=wall)


def test_task_figures_pair_each_family_round_by_round():
    """An injected timing model: prompt 0 and 2 are task a, prompt 1 task b; greedy takes 1 s per prompt, the method
    0.5 s on a's prompts and 2 s on b's, so a's speedup is 2 and b's 0.5 in every round; tau from round 1."""
    from dflash_core.bench.cases import task_figures

    rounds = [[_stats(0.5, 8, 2, 8, 6), _stats(2.0, 8, 8), _stats(0.5, 8, 4, 8, 4)] for _ in range(3)]
    normal = [[1.0, 1.0, 1.0]] * 3
    got = task_figures(["a", "b", "a"], rounds, normal)
    assert list(got) == ["a", "b"]
    assert got["a"]["prompts"] == 2 and got["a"]["speedup_rounds"] == [2.0] * 3 and got["a"]["speedup"] == 2.0
    assert got["a"]["tokens_per_target_call"] == 16 / 6 and got["a"]["acceptance_rate"] == 10 / 16
    assert got["b"]["speedup"] == 0.5 and got["b"]["tokens_per_target_call"] == 1.0
    assert task_figures([], rounds, normal) == {} and task_figures(["a"], rounds, normal) == {}


def test_a_case_records_its_task_figures(tiny_prepared):
    import torch

    from dflash_core.bench.cases import measure_pair
    from dflash_core.bench.config import BenchConfig
    from dflash_core.bench.state import BenchSession
    from dflash_core.methods.runner import run_method
    from dflash_core.runtime.decode import greedy

    prompts = ([1, 5, 9, 13], [3, 4, 40, 41, 42])
    refs = [greedy(tiny_prepared.rt, p, 6, record_margins=True) for p in prompts]
    cfg = BenchConfig(target=str(tiny_prepared.path), tokens=6, prompt_limit=2, rounds=2,
                      threads=torch.get_num_threads())
    sess = BenchSession(cfg, tiny_prepared.rt, tiny_prepared.prepared, "code", ["a", "b"], [list(p) for p in prompts],
                        [r for r, _ in refs], [s.margins for _, s in refs], prompt_tasks=["qa", "math"])
    info = measure_pair(sess, "dflash", 2, rounds=2)
    direct = [run_method("dflash", tiny_prepared.rt, tiny_prepared.prepared, p, 6, 2)[1] for p in prompts]
    assert list(info["tasks"]) == ["qa", "math"]
    for task, st in zip(("qa", "math"), direct):
        t = info["tasks"][task]
        assert t["prompts"] == 1 and t["tokens_per_target_call"] == st.tokens_per_target_call
        assert len(t["speedup_rounds"]) == 2 and all(r > 0 for r in t["speedup_rounds"])
    assert len(sess.case_rounds["dflash-w2"].normal_prompt_walls) == 2


def test_the_report_validates_pools_and_shows_task_figures():
    from dflash_core.errors import ReportInputError
    from dflash_core.report.build import build_report, validate_saved
    from dflash_core.report.html import render_report

    from ..support.report_data import bench_row, saved_run

    def tasks(sp):
        return {"qa": {"prompts": 1, "tokens_per_target_call": 2.5, "acceptance_rate": 0.4, "speedup": sp,
                       "speedup_rounds": [sp, sp]}}

    runs = []
    for sp in (1.5, 2.5):
        run = saved_run([bench_row("normal", 0), bench_row("dflash", 2)])
        for b in run["benchmarks"]:
            if b["extra_info"]["method"] == "dflash":
                b["extra_info"]["tasks"] = tasks(sp)
        run["dflash"]["prompts"] = {"source": "file", "file": "/data/mine.jsonl", "prompts": 1, "tasks": ["qa"]}
        validate_saved(run, "run")
        runs.append(run)
    doc = build_report(runs, ["a", "b"])
    assert doc["prompts"] == {"source": "file", "file": "/data/mine.jsonl", "prompts": 1, "tasks": ["qa"]}
    got = doc["methods"]["dflash"]["best"]["tasks"]["qa"]
    assert got["speedup_rounds"] == [1.5, 1.5, 2.5, 2.5] and got["speedup"] == 2.0
    html = render_report(doc)
    assert "id=task-table" in html and "2.00× / τ 2.50" in html and "Prompts: file /data/mine.jsonl" in html
    bad = saved_run([bench_row("normal", 0), bench_row("dflash", 2)])
    bad["benchmarks"][1]["extra_info"]["tasks"] = {"Q A": tasks(1.0)["qa"]}
    with pytest.raises(ReportInputError, match="tasks"):
        validate_saved(bad, "run")


def test_runs_of_different_prompts_are_neither_pooled_nor_gated():
    """The benchmarked prompts' fingerprint (bench.state.prompts_sha256): two runs of other prompts are refused by
    pooling and by the gate, naming why; a run saved before the fingerprint says nothing and still pools."""
    from dflash_core.bench.state import prompts_sha256
    from dflash_core.errors import ReportInputError
    from dflash_core.report.build import build_report
    from dflash_core.report.gate import judge

    from ..support.report_data import bench_row, saved_run

    def run(prompts):
        r = saved_run([bench_row("normal", 0), bench_row("dflash", 2)])
        if prompts is not None:
            r["dflash"]["prompts"] = {"source": "shipped:code", "tasks": ["code"] * len(prompts),
                                      "sha256": prompts_sha256(prompts)}
        return r

    a, b = run(["def f(x):"]), run(["class G:"])
    assert prompts_sha256(["def f(x):"]) != prompts_sha256(["class G:"])
    with pytest.raises(ReportInputError, match="benchmarked different prompts"):
        build_report([a, b], ["a", "b"])
    assert build_report([a, run(["def f(x):"])], ["a", "c"])["prompts"]["sha256"] == prompts_sha256(["def f(x):"])
    build_report([a, run(None)], ["a", "old"])  # no fingerprint: nothing to compare
    with pytest.raises(ReportInputError, match="benchmarked different prompts"):
        judge(build_report([a], ["a"]), build_report([b], ["b"]))
