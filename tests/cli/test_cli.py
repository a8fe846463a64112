"""The command line: options and DFLASH_* knobs reach the work, and bad input fails before anything is built.

Nothing here builds a model: `prepare`, `load_target` and the child pytest are replaced by recorders, and a
test fails if the CLI reaches one it should not have.
"""

from __future__ import annotations

import pytest

from dflash_core import __main__ as cli
from dflash_core.errors import BadInputError

KNOBS = {"DFLASH_TARGET": "someone/some-model", "DFLASH_DEVICE": "cpu", "DFLASH_DTYPE": "bfloat16",
         "DFLASH_KERNELS": "eager"}
FLAG_OF = {"DFLASH_TARGET": "--target", "DFLASH_DEVICE": "--device", "DFLASH_DTYPE": "--dtype",
           "DFLASH_KERNELS": "--kernels"}


@pytest.fixture
def recorders(monkeypatch):
    """Fake prepare, load_target and subprocess.call that record their calls."""
    import subprocess

    import dflash_core.prepare.pipeline
    import dflash_core.runtime.target

    calls: dict[str, list] = {"prepare": [], "load_target": [], "child": []}

    def fake_prepare(target="mini", **kw):
        calls["prepare"].append({"target": target, **kw})
        return "artifacts"

    def fake_load_target(*args, **kw):
        calls["load_target"].append((args, kw))
        raise BadInputError("stop here: the recorder does not load models")

    def fake_call(args, **kw):
        calls["child"].append((list(args), kw.get("env")))
        return 0

    monkeypatch.setattr(dflash_core.prepare.pipeline, "prepare", fake_prepare)
    monkeypatch.setattr("dflash_core.__main__.load_target", fake_load_target)
    monkeypatch.setattr(subprocess, "call", fake_call)
    return calls


def _child_value(args: list[str], env: dict | None, var: str) -> str | None:
    """What the child pytest will use for a knob: its last explicit option, else the (inherited) environment."""
    import os

    flag = FLAG_OF[var] + "="
    given = [a[len(flag):] for a in args if a.startswith(flag)]
    if given:
        return given[-1]
    return (os.environ if env is None else env).get(var)


def test_bench_env_knobs_reach_prepare_and_the_child_pytest(clean_env, recorders, monkeypatch):
    for var, value in KNOBS.items():
        monkeypatch.setenv(var, value)
    assert cli.main(["bench", "--smoke"]) == 0
    assert [c["target"] for c in recorders["prepare"]] == [KNOBS["DFLASH_TARGET"]]
    (args, env), = recorders["child"]
    for var, value in KNOBS.items():
        assert _child_value(args, env, var) == value, f"{var} did not reach the child pytest: {args}"


def test_bench_explicit_options_win_over_the_environment(clean_env, recorders, monkeypatch):
    monkeypatch.setenv("DFLASH_KERNELS", "eager")
    monkeypatch.setenv("DFLASH_DTYPE", "bfloat16")
    assert cli.main(["bench", "--kernels", "onednn", "--dtype", "float32"]) == 0
    (args, env), = recorders["child"]
    assert _child_value(args, env, "DFLASH_KERNELS") == "onednn"
    assert _child_value(args, env, "DFLASH_DTYPE") == "float32"


def test_bench_home_and_revision(clean_env, recorders, tmp_path):
    other = tmp_path / "other-home"
    assert cli.main(["bench", "--home", str(other), "--revision", "abc123", "--target", "someone/model"]) == 0
    (call,) = recorders["prepare"]
    assert call["home"] == str(other) and call["revision"] == "abc123" and call["target"] == "someone/model"
    (args, env), = recorders["child"]
    assert env["DFLASH_HOME"] == str(other) and env["DFLASH_REVISION"] == "abc123"


def test_bench_refuses_a_missing_device_before_prepare(clean_env, recorders, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("DFLASH_DEVICE", "cuda")
    assert cli.main(["bench"]) == 2
    assert "CUDA is not available" in capsys.readouterr().err
    assert recorders["prepare"] == [] and recorders["child"] == []


def test_run_passes_revision_and_threads(clean_env, recorders):
    import torch

    before = torch.get_num_threads()
    try:
        rc = cli.main(["run", "--target", "someone/model", "--revision", "v1.0", "--threads", "1",
                       "--method", "dflash", "--prompt", "x", "--tokens", "2"])
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert rc == 2  # the recorder stops the run after load_target
    ((args, kw),) = recorders["load_target"]
    assert args[0] == "someone/model" and kw["revision"] == "v1.0"


@pytest.mark.parametrize("argv,env", [(["--threads", "3"], {}), ([], {"DFLASH_THREADS": "3"})])
def test_prepare_honours_threads(clean_env, recorders, monkeypatch, argv, env):
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    assert cli.main(["prepare", *argv]) == 0
    (call,) = recorders["prepare"]
    threads = call["threads"] if "threads" in call else call["cfg"].threads
    assert threads == 3


@pytest.mark.parametrize("argv,env", [(["--train-data", "DATA", "--train-budget", "12.5", "--train-seeds", "5000"], {}),
                                      ([], {"DFLASH_TRAIN_DATA": "DATA", "DFLASH_TRAIN_BUDGET": "12.5",
                                            "DFLASH_TRAIN_SEEDS": "5000"})])
def test_prepare_passes_train_data_budget_and_seeds(clean_env, recorders, monkeypatch, tmp_path, argv, env):
    data = tmp_path / "text.txt"
    data.write_text("A line of training text that is long enough.\n", encoding="utf-8")
    for var, value in env.items():
        monkeypatch.setenv(var, value.replace("DATA", str(data)))
    assert cli.main(["prepare", *[str(data) if x == "DATA" else x for x in argv]]) == 0
    (call,) = recorders["prepare"]
    assert call["train_data"] == str(data) and call["train_budget"] == 12.5 and call["train_seeds"] == 5000


@pytest.mark.parametrize("argv,env,want", [(["--prepare-budget", "25"], {}, 25.0),
                                           ([], {"DFLASH_PREPARE_BUDGET": "off"}, "off"),
                                           (["--prepare-budget", "auto"], {}, "auto")])
def test_prepare_passes_the_prepare_budget(clean_env, recorders, monkeypatch, argv, env, want):
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    assert cli.main(["prepare", *argv]) == 0
    (call,) = recorders["prepare"]
    assert call["prepare_budget"] == want


def test_prepare_train_budget_off_reaches_prepare(clean_env, recorders):
    assert cli.main(["prepare", "--train-budget", "off"]) == 0
    (call,) = recorders["prepare"]
    assert call["train_budget"] == "off"


@pytest.mark.parametrize("argv,env", [(["--teacher-dtype", "bfloat16"], {}),
                                      ([], {"DFLASH_TEACHER_DTYPE": "bfloat16"})])
def test_prepare_passes_the_teacher_dtype(clean_env, recorders, monkeypatch, argv, env):
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    assert cli.main(["prepare", *argv]) == 0
    (call,) = recorders["prepare"]
    assert call["teacher_dtype"] == "bfloat16"


def test_prepare_without_a_teacher_dtype_leaves_the_recorded_config_in_charge(clean_env, recorders):
    assert cli.main(["prepare"]) == 0
    (call,) = recorders["prepare"]
    assert "teacher_dtype" not in call  # the recorded or default config decides


@pytest.mark.parametrize("argv,message", [(["--train-data", "/no/such/file.txt"], "no such file"),
                                          (["--teacher-dtype", "bf16"], "is not one of auto, float32, bfloat16"),
                                          (["--train-budget", "0"], "must be a number of minutes > 0"),
                                          (["--prepare-budget", "-3"], "must be a number of minutes > 0"),
                                          (["--train-seeds", "0"], "must be an integer >= 1"),
                                          (["--train-seeds", "2000000"], "must be an integer <= 1000000"),
                                          (["--train-seeds", "many"], "train")])
def test_prepare_refuses_bad_train_data_before_anything_is_built(clean_env, recorders, capsys, argv, message):
    try:
        rc = cli.main(["prepare", *argv])
    except SystemExit as exc:  # argparse's usage error for a bad option value
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2 and message in err and (err.startswith("error: ") or "usage:" in err)
    assert recorders["prepare"] == [] and recorders["load_target"] == []
    assert list(clean_env.iterdir()) == []


RUN = ["run", "--method", "dflash", "--prompt", "def f(x):", "--tokens", "4"]
BAD_RUNS = {
    "cuda without CUDA": (["--device", "cuda"], "CUDA is not available"),
    "negative budget": (["--tokens", "-4"], "token budget must be an integer >= 0"),
    "cpu index": (["--device", "cpu:7"], "unknown device 'cpu:7'"),
    "width 0": (["--width", "0"], "verify width must be an integer in 1..B"),
    "float16 on CPU": (["--dtype", "float16"], "float16 is not supported on CPU"),
    "onednn off float32": (["--kernels", "onednn", "--dtype", "bfloat16"], "use --kernels eager"),
    "width with normal": (["--method", "normal", "--width", "2"], "--width does not apply to 'normal'"),
    "non-UTF-8 prompt": (["--prompt", "a\udcff"], "--prompt is not valid UTF-8"),
    "blank prompt": (["--prompt", "   "], "empty prompt"),
    "revision of the mini target": (["--revision", "v1"], "--revision 'v1' applies to hub ids only"),
    "unknown target": (["--target", "no/such/thing"], "unknown target"),
}


@pytest.mark.parametrize("extra,message", list(BAD_RUNS.values()), ids=list(BAD_RUNS))
def test_run_fails_fast_on_bad_arguments(clean_env, recorders, monkeypatch, capsys, extra, message):
    """On an empty home: exit 2 with a clear message, and nothing prepared, loaded or written."""
    import time

    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    t0 = time.perf_counter()
    assert cli.main(RUN + extra) == 2
    assert time.perf_counter() - t0 < 30
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err
    assert recorders["prepare"] == [] and recorders["load_target"] == []
    assert list(clean_env.iterdir()) == [], "something was built in the empty home"


@pytest.mark.parametrize("argv,message", [(["--threads", "0"], "--threads='0' must be an integer >= 1"),
                                          (["--kernels", "fast"], "is not one of auto, eager, onednn"),
                                          (["--dtype", "half"], "is not one of auto, float32")])
def test_run_option_out_of_range_is_a_usage_error(clean_env, recorders, capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        cli.main(RUN + argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err
    assert recorders["prepare"] == [] and recorders["load_target"] == []


@pytest.mark.parametrize("var,value", [("DFLASH_THREADS", "0"), ("DFLASH_THREADS", "two"),
                                       ("DFLASH_KERNELS", "fast"), ("DFLASH_DEVICE", "tpu")])
def test_bad_environment_knob_is_exit_2_naming_the_variable(clean_env, recorders, monkeypatch, capsys, var, value):
    monkeypatch.setenv(var, value)
    assert cli.main(RUN) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and (var in err or repr(value) in err)
    assert recorders["prepare"] == [] and recorders["load_target"] == []
