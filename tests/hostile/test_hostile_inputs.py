"""Hostile run inputs (groups 7-11): validate before work, bounded resources, finite drafter weights,
weight files that are regular files, auto_map refused, files written with the umask's mode, and every command's
failures ending in one `error:` line with exit 2.

Nothing here builds more than a tiny model: a test that would allocate or hang on today's code is stopped by a
recorder (`pytest.fail` in place of the allocation) or an alarm, so it fails instead of eating the machine."""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
from pathlib import Path

import pytest

from dflash_core import __main__ as cli
from dflash_core.errors import ArtifactError, BadInputError, DFlashError
from dflash_core.testing import TinySpec, build_tiny, tiny_config

from ..support.helpers import alarm
from ..support.safetensors_files import with_header


def _one_error(capsys) -> str:
    """Exactly one `error:` line and no traceback on stderr (log lines may come with it); returns the line."""
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("error:") or "Traceback" in ln]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]




@pytest.fixture
def recorders(monkeypatch, tmp_path):
    """prepare, load_target, the child pytest and model allocation replaced by recorders."""
    import subprocess

    import dflash_core.prepare.pipeline
    import dflash_core.runtime.target

    calls: dict[str, list] = {"prepare": [], "load_target": [], "child": []}
    artifacts = tmp_path / "artifacts-dir"
    artifacts.mkdir()
    (artifacts / "manifest.json").write_text(json.dumps({"drafter": {"config": {"block_size": 16}}}))

    def fake_prepare(target="mini", **kw):
        calls["prepare"].append({"target": target, **kw})
        return str(artifacts)

    def fake_load_target(*args, **kw):
        calls["load_target"].append((args, kw))
        raise BadInputError("stop here: the recorder does not load models")

    def fake_call(args, **kw):
        calls["child"].append(list(args))
        return calls.get("child_rc", 0)

    monkeypatch.setattr(dflash_core.prepare.pipeline, "prepare", fake_prepare)
    monkeypatch.setattr("dflash_core.__main__.load_target", fake_load_target)
    monkeypatch.setattr(subprocess, "call", fake_call)
    return calls


# --- group 7: bench validates before work ---------------------------------------------------------------------

@pytest.mark.parametrize("var,value", [("DFLASH_TOKENS", "abc"), ("DFLASH_REPEATS", "0"), ("DFLASH_WIDTHS", "a,b"),
                                       ("DFLASH_NOISE_THRESHOLD", "nan")])
def test_bench_refuses_a_bad_knob_before_prepare(clean_env, recorders, monkeypatch, capsys, var, value):
    monkeypatch.setenv(var, value)
    assert cli.main(["bench", "--smoke"]) == 2
    assert var in _one_error(capsys)
    assert recorders["prepare"] == [] and recorders["child"] == []


@pytest.mark.parametrize("args", [["--bench-tokens", "abc"], ["--bench-widths=0"], ["--bench-rounds", "0"]])
def test_bench_refuses_a_bad_pass_through_option_before_prepare(clean_env, recorders, capsys, args):
    assert cli.main(["bench", "--smoke", "--", *args]) == 2
    assert args[0].split("=")[0] in _one_error(capsys)
    assert recorders["prepare"] == [] and recorders["child"] == []


@pytest.mark.parametrize("how", ["env", "option"])
def test_bench_width_above_the_block_size_is_one_error_before_the_benchmark(clean_env, recorders, monkeypatch,
                                                                           capsys, how):
    args = ["bench", "--smoke"]
    if how == "env":
        monkeypatch.setenv("DFLASH_WIDTHS", "99")
    else:
        args += ["--", "--bench-widths", "2,99"]
    assert cli.main(args) == 2
    line = _one_error(capsys)
    assert "block size B=16" in line and "99" in line
    assert recorders["child"] == []


def test_bench_names_a_report_only_when_one_was_written(clean_env, recorders, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("DFLASH_REPORTS", str(tmp_path / "reports"))
    recorders["child_rc"] = 4  # pytest's usage error
    assert cli.main(["bench", "--smoke"]) == 2
    err = capsys.readouterr().err
    assert "no report was written" in err and "report: " not in err
    assert err.count("error: ") == 1


# --- group 8: resource bounds before any allocation -------------------------------------------------------------

RUN = ["run", "--method", "dflash", "--prompt", "def f(x):", "--tokens", "4"]


def test_threads_have_an_upper_bound(clean_env, recorders, monkeypatch, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main([*RUN, "--threads", "1000000"])
    assert exc.value.code == 2 and "must be an integer <= 256" in capsys.readouterr().err
    monkeypatch.setenv("DFLASH_THREADS", "1000000")
    assert cli.main(RUN) == 2
    assert "DFLASH_THREADS" in _one_error(capsys)
    assert recorders["prepare"] == [] and recorders["load_target"] == []


def test_prepare_threads_have_an_upper_bound(tmp_path):
    from dflash_core.prepare.pipeline import prepare

    with pytest.raises(BadInputError, match=r"--threads=.* must be an integer <= 256"):
        prepare("mini", home=tmp_path / "home", threads=10 ** 6)
    assert not (tmp_path / "home").exists()


@pytest.fixture(scope="module")
def drafter_dir(tmp_path_factory) -> Path:
    """A real transformers-format DFlash drafter for the tiny target (hidden 48, 4 layers), built in a second."""
    import torch

    from dflash_core.prepare.drafter_format import export_drafter
    from dflash_core.runtime.drafter import DFlashDrafter, DrafterConfig

    torch.manual_seed(0)
    d = DFlashDrafter(DrafterConfig(hidden_size=48, vocab_size=96, taps=(1, 2), block_size=4, num_layers=1,
                                    num_heads=4, intermediate_size=96))
    out = tmp_path_factory.mktemp("drafter") / "drafter"
    export_drafter(d, tiny_config(TinySpec()), out)
    return out


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory) -> Path:
    ckpt = tmp_path_factory.mktemp("ckpt") / "ckpt"
    build_tiny(TinySpec(dtype="float32")).save_pretrained(ckpt)
    return ckpt


def _drafter_with(drafter_dir: Path, tmp_path: Path, **changes) -> Path:
    d = tmp_path / "bad-drafter"
    shutil.copytree(drafter_dir, d)
    doc = json.loads((d / "config.json").read_text())
    for k, v in changes.items():
        if v is KeyError:
            doc.pop(k)
        else:
            doc[k] = v
    (d / "config.json").write_text(json.dumps(doc))
    return d


BAD_DRAFTER_CONFIGS = {
    "100k layers": {"num_hidden_layers": 100_000},
    "intermediate 1e9 (float)": {"intermediate_size": 1e9},
    "intermediate 10**9": {"intermediate_size": 10 ** 9},
    "hidden 10**6": {"hidden_size": 10 ** 6},
    "no hidden_size": {"hidden_size": KeyError},
    "zero heads": {"num_attention_heads": 0},
    "taps of text": {"target_layer_ids": ["a"]},
    "hidden of text": {"hidden_size": "384x"},
    "block 10**6": {"block_size": 10 ** 6},
    "bool layers": {"num_hidden_layers": True},
    "kv heads not dividing": {"num_key_value_heads": 3},
    "vocab of text": {"dflash_target_vocab_size": "many"},
}


@pytest.mark.parametrize("changes", list(BAD_DRAFTER_CONFIGS.values()), ids=list(BAD_DRAFTER_CONFIGS))
def test_a_bad_drafter_config_is_refused_before_anything_is_built(clean_env, recorders, drafter_dir, tmp_path,
                                                                  capsys, monkeypatch, changes):
    import dflash_core.runtime.drafter as drafter_mod

    monkeypatch.setattr(drafter_mod.DFlashDrafter, "__init__", lambda *a, **k: pytest.fail("allocated a drafter"))
    bad = _drafter_with(drafter_dir, tmp_path, **changes)
    for cmd in (RUN, ["prepare"]):
        assert cli.main([*cmd, "--drafter", str(bad)]) == 2
        assert "--drafter" in _one_error(capsys)
    assert recorders["prepare"] == [] and recorders["load_target"] == []


def test_a_bad_drafter_config_is_refused_by_the_loader_too(drafter_dir, tmp_path, monkeypatch):
    """The library path (prepare(..., drafter=...)) refuses it before DFlashDrafter allocates."""
    import dflash_core.runtime.drafter as drafter_mod
    from dflash_core.prepare.drafter_format import load_hf_drafter
    from dflash_core.runtime.target import TargetRuntime

    rt = TargetRuntime.from_model(build_tiny(TinySpec(dtype="float32")))
    monkeypatch.setattr(drafter_mod.DFlashDrafter, "__init__", lambda *a, **k: pytest.fail("allocated a drafter"))
    for changes in BAD_DRAFTER_CONFIGS.values():
        bad = _drafter_with(drafter_dir, tmp_path, **changes)
        with pytest.raises(DFlashError):
            load_hf_drafter(bad, rt)
        shutil.rmtree(bad)


@pytest.mark.parametrize("changes", [{"num_hidden_layers": 100_000}, {"hidden_size": 10 ** 7},
                                     {"vocab_size": 10 ** 9}, {"num_hidden_layers": "6"}, {"auto_map": {"x": "y"}}])
def test_a_target_config_out_of_bounds_is_refused_before_from_pretrained(tiny_ckpt, tmp_path, monkeypatch, changes):
    from transformers import AutoModelForCausalLM

    from dflash_core.errors import TargetNotFoundError
    from dflash_core.runtime.target import load_target

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **k: pytest.fail("from_pretrained reached with an unchecked config"))
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_ckpt, ckpt)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg.update(changes)
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(TargetNotFoundError, match="auto_map|not an integer|parameters"):
        load_target(str(ckpt), "cpu", "float32")


# --- group 9: drafter weights must be finite --------------------------------------------------------------------

@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_non_finite_drafter_weights_are_refused_before_prepare_works(drafter_dir, tiny_ckpt, tmp_path, monkeypatch,
                                                                     value):
    from safetensors.torch import load_file, save_file

    from dflash_core.prepare.pipeline import prepare
    from dflash_core.testing import tiny_prepare_config

    d = tmp_path / "nan-drafter"
    shutil.copytree(drafter_dir, d)
    sd = load_file(str(d / "model.safetensors"))
    key = sorted(sd)[0]
    sd[key] = sd[key].clone()
    sd[key].view(-1)[0] = value
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    monkeypatch.setattr("dflash_core.prepare.pipeline.teacher_data",
                        lambda *a, **k: pytest.fail("work began on a NaN drafter"))
    with pytest.raises(BadInputError, match="NaN or infinite"):
        prepare(str(tiny_ckpt), home=tmp_path / "home", cfg=tiny_prepare_config(), progress=False, drafter=str(d))
    assert not list((tmp_path / "home").rglob("*.json"))


BAD_WEIGHT_HEADERS = {
    "fc claims 48 x 3.5e7 (6.7 GB)": ("encoder.fc.weight", [48, 35_000_000], None, "encoder.fc.weight"),
    "fc one column short": ("encoder.fc.weight", [48, 95], None, "[48, 95]"),
    "a norm of integers": ("norm.weight", None, "I64", "I64"),
}


@pytest.mark.parametrize("name,shape,dtype,word", list(BAD_WEIGHT_HEADERS.values()), ids=list(BAD_WEIGHT_HEADERS))
def test_drafter_weight_shapes_are_compared_with_the_config_before_any_tensor_is_read(
        drafter_dir, tmp_path, monkeypatch, name, shape, dtype, word):
    """The safetensors header's shapes and dtypes are checked against what config.json implies before a tensor is
    loaded: a header claiming 6.7 GB for one weight allocated all of it before the shapes were compared."""
    import safetensors.torch

    import dflash_core.runtime.drafter as drafter_mod
    from dflash_core.prepare.drafter_format import load_hf_drafter
    from dflash_core.runtime.target import TargetRuntime

    rt = TargetRuntime.from_model(build_tiny(TinySpec(dtype="float32")))
    bad = tmp_path / "bad-weights"
    shutil.copytree(drafter_dir, bad)
    with_header(drafter_dir / "model.safetensors", bad / "model.safetensors", name, shape, dtype)
    monkeypatch.setattr(safetensors.torch, "load_file", lambda *a, **k: pytest.fail("read the weights"))
    monkeypatch.setattr(drafter_mod.DFlashDrafter, "load_state_dict", lambda *a, **k: pytest.fail("built a drafter"))
    with pytest.raises(BadInputError, match="--drafter") as exc:
        load_hf_drafter(bad, rt)
    assert word in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("cmd", [RUN, ["prepare"]], ids=["run", "prepare"])
def test_a_drafter_header_that_disagrees_with_its_config_is_refused_before_the_target_loads(
        clean_env, recorders, drafter_dir, tmp_path, capsys, monkeypatch, cmd):
    import safetensors.torch

    bad = tmp_path / "bad-weights"
    shutil.copytree(drafter_dir, bad)
    with_header(drafter_dir / "model.safetensors", bad / "model.safetensors", "encoder.fc.weight", [48, 35_000_000])
    monkeypatch.setattr(safetensors.torch, "load_file", lambda *a, **k: pytest.fail("read the weights"))
    assert cli.main([*cmd, "--drafter", str(bad)]) == 2
    assert "encoder.fc.weight has shape [48, 35000000]" in _one_error(capsys)
    assert recorders["prepare"] == [] and recorders["load_target"] == []


def test_a_drafter_whose_header_matches_its_config_still_loads(drafter_dir):
    from dflash_core.prepare.drafter_format import load_hf_drafter
    from dflash_core.runtime.target import TargetRuntime

    rt = TargetRuntime.from_model(build_tiny(TinySpec(dtype="float32")))
    d = load_hf_drafter(drafter_dir, rt)
    assert d.fc.weight.shape == (48, 96) and d.fc.weight.dtype.is_floating_point


# --- group 10: weight files that would hang -----------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_drafter_weight_file_that_never_ends_is_refused(clean_env, recorders, drafter_dir, tmp_path, capsys,
                                                          kind):
    d = tmp_path / "hang"
    shutil.copytree(drafter_dir, d)
    (d / "model.safetensors").unlink()
    if kind == "fifo":
        os.mkfifo(d / "model.safetensors")
    else:
        (d / "model.safetensors").symlink_to("/dev/zero")
    with alarm(60):
        assert cli.main([*RUN, "--drafter", str(d)]) == 2
    assert "not a regular file" in _one_error(capsys)


@pytest.mark.parametrize("name", ["model.safetensors", "tokenizer.json", "config.json"])
def test_a_target_file_that_never_ends_is_refused(tiny_ckpt, tmp_path, name):
    from dflash_core.errors import TargetNotFoundError
    from dflash_core.runtime.target import load_target

    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_ckpt, ckpt)
    (ckpt / name).unlink(missing_ok=True)
    os.mkfifo(ckpt / name)
    with alarm(60), pytest.raises(TargetNotFoundError, match="FIFO|no config.json"):
        load_target(str(ckpt), "cpu", "float32")


# --- group 11: auto_map in the mini target, file modes, paths that are files --------------------------------------

def test_auto_map_in_the_mini_target_is_refused_not_rebuilt(tiny_ckpt, tmp_path, monkeypatch, capsys):
    import dflash_core.prepare.pipeline as pipeline
    from dflash_core.store.artifacts import write_target_manifest

    home = tmp_path / "home"
    mini = home / "targets" / "mini"
    shutil.copytree(tiny_ckpt, mini)
    cfg = json.loads((mini / "config.json").read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}
    (mini / "config.json").write_text(json.dumps(cfg))
    write_target_manifest(mini)  # consistent: the manifest agrees with the edited config
    monkeypatch.setattr(pipeline, "_prepare", lambda *a, **k: pytest.fail("prepare started"))
    for var in [v for v in os.environ if v.startswith("DFLASH_")]:
        monkeypatch.delenv(var)
    assert cli.main([*RUN, "--home", str(home)]) == 2
    assert "auto_map" in _one_error(capsys)


def _umask_mode(mode: int) -> int:
    from dflash_core.safeio import current_umask

    return mode & ~current_umask()


def test_export_drafter_writes_weights_with_the_umask_mode(drafter_dir):
    for p in drafter_dir.iterdir():
        assert os.stat(p).st_mode & 0o777 == _umask_mode(0o666), p.name


def test_the_mini_target_weights_get_the_umask_mode(tmp_path):
    from dflash_core.prepare import minitarget as mt

    cfg = mt.MiniTargetConfig(vocab_size=320, hidden_size=32, num_layers=2, attention_layers=(1,), num_heads=2,
                              num_kv_heads=1, intermediate_size=64, max_position_embeddings=128, seq_len=32,
                              batch_size=4, max_steps=1, corpus_files=3, threads=1)
    out = tmp_path / "targets" / "mini"
    mt.build_mini_target(out, cfg, progress=False)
    for p in out.iterdir():
        assert os.stat(p).st_mode & 0o777 == _umask_mode(0o666), p.name


@pytest.mark.parametrize("cmd", [RUN, ["prepare"], ["export", "--out", "x.tar.gz"], ["export-drafter", "--out", "d"]])
def test_a_home_that_is_a_file_is_one_error(clean_env, recorders, monkeypatch, tmp_path, capsys, cmd):
    f = tmp_path / "home-file"
    f.write_text("not a folder")
    monkeypatch.setenv("DFLASH_HOME", str(f))
    monkeypatch.chdir(tmp_path)
    assert cli.main(cmd) == 2
    assert "is a file" in _one_error(capsys)
    assert f.read_text() == "not a folder"
    assert recorders["prepare"] == [] and recorders["load_target"] == []


@pytest.mark.parametrize("code,words", [(errno.EACCES, "permission denied"), (errno.ENOSPC, "no space left"),
                                        (errno.EIO, "Input/output error")])
def test_os_errors_anywhere_in_a_command_are_one_error_line(clean_env, monkeypatch, capsys, code, words):

    def refuse(*a, **k):
        raise OSError(code, os.strerror(code), "/somewhere/artifacts/manifest.json")

    monkeypatch.setattr("dflash_core.__main__.load_target", refuse)
    (clean_env / "config.json").write_text("{}")  # a local target directory: run reaches load_target
    assert cli.main([*RUN, "--target", str(clean_env)]) == 2
    line = _one_error(capsys)
    assert words in line and "/somewhere/artifacts/manifest.json" in line


def test_a_deeply_nested_manifest_is_an_artifact_error(tmp_path):
    from dflash_core.store.artifacts import read_manifest

    (tmp_path / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ArtifactError, match="nests deeper"):
        read_manifest(tmp_path, None)


def test_export_drafter_to_a_full_or_read_only_place(drafter_dir, tmp_path, monkeypatch):
    import torch

    from dflash_core.prepare import drafter_format
    from dflash_core.runtime.drafter import DFlashDrafter, DrafterConfig

    d = DFlashDrafter(DrafterConfig(hidden_size=48, vocab_size=96, taps=(1, 2), block_size=4, num_layers=1,
                                    num_heads=4, intermediate_size=96)).to(torch.float32)
    for code, words in ((errno.ENOSPC, "no space left on device while writing"), (errno.EROFS, "permission denied")):
        def full(self, path, *a, code=code, **k):
            raise OSError(code, os.strerror(code), str(path))

        monkeypatch.setattr("transformers.PreTrainedModel.save_pretrained", full)
        out = tmp_path / f"out-{code}"
        with pytest.raises(BadInputError, match=words) as exc:
            drafter_format.export_drafter(d, tiny_config(TinySpec()), out)
        assert str(out) in str(exc.value)
        assert not out.exists() and not list(tmp_path.glob(f".out-{code}*"))


def test_export_drafter_names_a_full_disk_that_safetensors_reports(tmp_path, monkeypatch):
    """safetensors raises its own SafetensorError ("... (os error 28)") when a write fails: a traceback before."""
    import torch
    from safetensors import SafetensorError

    from dflash_core.prepare import drafter_format
    from dflash_core.runtime.drafter import DFlashDrafter, DrafterConfig

    d = DFlashDrafter(DrafterConfig(hidden_size=48, vocab_size=96, taps=(1, 2), block_size=4, num_layers=1,
                                    num_heads=4, intermediate_size=96)).to(torch.float32)

    def full(self, path, *a, **k):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr("transformers.PreTrainedModel.save_pretrained", full)
    with pytest.raises(BadInputError, match="no space left on device while writing"):
        drafter_format.export_drafter(d, tiny_config(TinySpec()), tmp_path / "out")


# --- round three (issue 70): the report folder, the budget's bound ------------------------------------------------

@pytest.mark.parametrize("where", ["under-a-file", "read-only"])
def test_an_unwritable_report_folder_is_refused_before_the_benchmark(clean_env, recorders, monkeypatch, capsys,
                                                                     tmp_path, where):
    """DFLASH_REPORTS under a file or read-only: the benchmark ran every case, then the report raised."""
    if where == "under-a-file":
        (tmp_path / "f").write_text("a file")
        monkeypatch.setenv("DFLASH_REPORTS", str(tmp_path / "f" / "reports"))
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes a read-only folder")
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        monkeypatch.setenv("DFLASH_REPORTS", str(ro / "reports"))
    assert cli.main(["bench", "--smoke"]) == 2
    assert "the report folder" in _one_error(capsys)
    assert recorders["prepare"] == [] and recorders["child"] == []


def test_a_report_that_cannot_be_written_after_the_run_is_one_error_and_keeps_the_saved_run(clean_env, recorders,
                                                                                          monkeypatch, capsys,
                                                                                          tmp_path):
    from types import SimpleNamespace

    from dflash_core.errors import REPORT_UNWRITTEN
    from dflash_core.report import plugin

    monkeypatch.setenv("DFLASH_REPORTS", str(tmp_path / "reports"))
    # the plugin: a write that fails (a full disk) is caught, so pytest-benchmark still saves the run after it
    config = SimpleNamespace(stash={plugin.SESSION_STASH: SimpleNamespace(lab_section=lambda: {"x": 1})})
    monkeypatch.setattr("dflash_core.report.build.build_report", lambda docs, names: {"device": "cpu"})

    def full(doc, root):
        raise OSError(28, "No space left on device", str(tmp_path / "reports" / "cpu" / "report.html"))

    monkeypatch.setattr("dflash_core.report.write.write_report", full)
    plugin.pytest_benchmark_update_json(config, [], {"benchmarks": []})
    assert "report.html" in capsys.readouterr().err
    session = SimpleNamespace(config=config, exitstatus=0)
    plugin.pytest_sessionfinish(session, 0)
    assert session.exitstatus == REPORT_UNWRITTEN
    # bench: that exit status is one error line naming the kept saved run
    recorders["child_rc"] = REPORT_UNWRITTEN
    assert cli.main(["bench", "--smoke"]) == 2
    line = _one_error(capsys)
    assert "saved run is kept" in line and "report could not be written" in line


@pytest.mark.parametrize("value", ["1e308", "inf", "nan", "20000"])
def test_a_budget_is_a_finite_bounded_number_of_minutes(clean_env, recorders, monkeypatch, capsys, value):
    monkeypatch.setenv("DFLASH_BENCH_BUDGET", value)
    assert cli.main(["bench", "--smoke"]) == 2
    assert "DFLASH_BENCH_BUDGET" in _one_error(capsys)
    assert recorders["child"] == []


@pytest.mark.parametrize("planted", ["artifacts", "work", "artifacts/KEY"])
def test_a_link_planted_in_the_home_is_refused_before_prepare_writes(tiny_prepared, tmp_path, planted):
    """A link at <home>/artifacts (or work/, or the artifact folder itself) made prepare write a whole artifact
    folder outside the home; it is refused with one error naming it, and nothing lands where it points."""
    from dflash_core.prepare.pipeline import prepare
    from dflash_core.prepare.prepared import prepared_dir
    from dflash_core.runtime.target import load_target
    from dflash_core.store.artifacts import target_identity
    from dflash_core.testing import tiny_prepare_config

    rt = load_target(str(tiny_prepared.path), "cpu", "float32")
    home, outside = tmp_path / "home", tmp_path / "outside"
    outside.mkdir()
    link = home / planted.replace("KEY", prepared_dir(target_identity(rt), home).name)
    link.parent.mkdir(parents=True)
    link.symlink_to(outside, target_is_directory=True)
    with pytest.raises(BadInputError, match="is a link, so prepare would write outside the home"):
        prepare(str(tiny_prepared.path), home=home, cfg=tiny_prepare_config(), rt=rt, progress=False)
    assert list(outside.iterdir()) == []
