"""Artifacts and targets on disk: content-keyed, verified, locked, written with normal modes, and every
corruption is an ArtifactError that names the file and the fix (issues 18.6-18.8, 19.3, 19.4, 19.7-19.9)."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import stat
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from dflash_core.errors import ArtifactError, DFlashError, TargetNotFoundError
from dflash_core.prepare import minitarget as mt
from dflash_core.prepare.pipeline import DRAFTER_FILE, family_for, load_prepared, prepare
from dflash_core.runtime.target import load_target
from dflash_core.store.artifacts import (
    MANIFEST,
    META_FILE,
    TARGET_MANIFEST,
    artifact_dir,
    file_entry,
    home_lock,
    target_identity,
    write_atomic,
)
from dflash_core.testing import TinySpec, build_tiny, tiny_prepare_config

# Train seeds from the (3-file) corpus too, so the mini-only path of prepare runs, in miniature.
CFG = replace(tiny_prepare_config(), corpus_seeds=8)
TINY_MINI = mt.MiniTargetConfig(vocab_size=320, hidden_size=32, num_layers=2, attention_layers=(1,), num_heads=2,
                                num_kv_heads=1, intermediate_size=64, max_position_embeddings=128, seq_len=32,
                                batch_size=4, max_steps=2, corpus_files=3, threads=1)


def _mini_like_checkpoint(ckpt: Path) -> Path:
    """A tiny LFM2 with a byte-level tokenizer and the mini target's metadata file (prompt family 'code')."""
    tok = mt.train_tokenizer(mt.corpus_texts(TINY_MINI), TINY_MINI)
    build_tiny(TinySpec(dtype="float32", pattern="CCACAC", vocab_size=len(tok))).save_pretrained(ckpt)
    tok.save_pretrained(ckpt)
    (ckpt / META_FILE).write_text(json.dumps({"prompt_family": "code", "config": {"corpus_files": 3}}))
    return ckpt


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(f"{record.name}: {record.getMessage()}")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A mini-like checkpoint prepared once (every fitter, in miniature), with the log lines prepare emitted."""
    root = tmp_path_factory.mktemp("integrity")
    ckpt = _mini_like_checkpoint(root / "ckpt")
    rec = _Records()
    lg = logging.getLogger("dflash_core")
    old = lg.level
    lg.addHandler(rec)
    lg.setLevel(logging.INFO)
    try:
        out = prepare(str(ckpt), home=root / "home", cfg=CFG, progress=False)
    finally:
        lg.removeHandler(rec)
        lg.setLevel(old)
    return {"ckpt": ckpt, "home": root / "home", "out": out, "log": rec.lines}


def _home_copy(lab, tmp_path) -> tuple[Path, Path]:
    home = tmp_path / "home"
    shutil.copytree(lab["home"], home)
    return home, home / "artifacts" / lab["out"].name


def _rt(lab):
    return load_target(str(lab["ckpt"]), "cpu", "float32")


# --- 18.6: modes -----------------------------------------------------------------------------------

@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640)])
def test_write_atomic_gives_the_umask_mode(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        write_atomic(tmp_path / "report.html", b"<html></html>")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "report.html").stat().st_mode) == mode
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]  # no temp file left behind


def test_prepared_artifacts_get_the_umask_mode(lab):
    umask = os.umask(0o022)
    os.umask(umask)  # restored: this only reads the process's umask
    for name in (DRAFTER_FILE, MANIFEST):
        assert stat.S_IMODE((lab["out"] / name).stat().st_mode) == 0o666 & ~umask


# --- 18.7: content-keyed artifacts, family from the checkpoint ---------------------------------------

def test_copied_target_finds_the_same_artifacts_and_keeps_its_family(lab, tmp_path):
    home, out = _home_copy(lab, tmp_path)
    before = (out / MANIFEST).read_text()
    moved = tmp_path / "elsewhere" / "renamed-model"
    shutil.copytree(lab["ckpt"], moved)
    rt = load_target(str(moved), "cpu", "float32")
    assert rt.info["family"] == "code" and family_for(rt, CFG) == "code"
    assert artifact_dir(target_identity(rt), home) == out
    assert "ckpt" not in out.name and "renamed" not in out.name
    assert prepare(str(moved), home=home, cfg=CFG, progress=False) == out  # verified, not rebuilt
    assert (out / MANIFEST).read_text() == before
    assert json.loads(before)["seeds"]["family"] == "code"
    assert load_prepared(rt, home=home).directory == out


def test_identity_hashes_every_weight(lab):
    import torch

    rt = _rt(lab)
    a = target_identity(rt.with_options())
    with torch.no_grad():
        rt.model.model.layers[0].feed_forward.w1.weight.view(-1)[1] += 1e-3  # not on a stride-997 sample
    rt.info = {}  # recompute from the (changed) model
    b = target_identity(rt)
    assert a["weights_sha256"] != b["weights_sha256"] and a["content_sha256"] != b["content_sha256"]


# --- 18.8: logging --------------------------------------------------------------------------------

def test_prepare_logs_timestamped_progress_through_logging(lab):
    text = "\n".join(lab["log"])
    assert "dflash_core.prepare.pipeline: teacher trajectories" in text
    assert f"dflash_core.prepare.train: train drafter: {CFG.train.steps}/{CFG.train.steps}" in text
    from dflash_core.progress import FORMAT

    assert "%(asctime)s" in FORMAT


def test_cli_without_logging_setup_gets_timestamped_lines_on_stderr():
    import subprocess
    import sys

    code = ("import logging; from dflash_core.progress import ensure_console_logging; ensure_console_logging(); "
            "logging.getLogger('dflash_core.prepare.pipeline').info('teacher trajectories: 3 seeds')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.stdout == ""
    line = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d INFO dflash_core\.prepare\.pipeline: teacher trajectories: 3 seeds\n"
    assert re.fullmatch(line, proc.stderr), proc.stderr


def test_malformed_tokenizer_json_is_named(lab, tmp_path):
    bad = shutil.copytree(lab["ckpt"], tmp_path / "bad")
    (bad / "tokenizer.json").write_text('{"version": "1.0", "truncation"')
    with pytest.raises(TargetNotFoundError, match=r"tokenizer\.json is not valid JSON"):
        load_target(str(bad), "cpu", "float32")


# --- 19.3: remote code ----------------------------------------------------------------------------

def test_remote_code_is_never_run_nor_offered(tmp_path, capfd):
    d = tmp_path / "evil"
    d.mkdir()
    marker = tmp_path / "code-ran"
    (d / "config.json").write_text(json.dumps({
        "model_type": "evil_lm", "architectures": ["EvilForCausalLM"],
        "auto_map": {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilForCausalLM"}}))
    (d / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    with pytest.raises(TargetNotFoundError, match="never runs a checkpoint's code"):
        load_target(str(d), "cpu", "float32")
    out, _ = capfd.readouterr()
    assert out == "" and not marker.exists()


# --- 19.4: the built target's own manifest ----------------------------------------------------------

@pytest.fixture(scope="module")
def mini_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("mini-home")
    mt.build_mini_target(home / "targets" / "mini", TINY_MINI, progress=False)
    return home


def _damaged(mini_home, tmp_path, name, damage) -> Path:
    home = tmp_path / "home"
    shutil.copytree(mini_home, home)
    damage(home / "targets" / "mini" / name)
    return home


def _flip(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x01
    p.write_bytes(bytes(data))


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def test_built_mini_target_has_a_manifest_of_its_files(mini_home):
    doc = json.loads((mini_home / "targets" / "mini" / TARGET_MANIFEST).read_text())
    assert {"model.safetensors", "config.json", "tokenizer.json", META_FILE} <= set(doc["files"])
    rt = load_target("mini", "cpu", "float32", home=mini_home)
    assert rt.info["family"] == "code"


@pytest.mark.parametrize("name, damage", [("model.safetensors", _flip), ("model.safetensors", _truncate),
                                          ("tokenizer.json", _truncate), ("config.json", _flip)])
def test_damaged_mini_target_is_refused_naming_the_file(mini_home, tmp_path, name, damage):
    home = _damaged(mini_home, tmp_path, name, damage)
    with pytest.raises(ArtifactError, match=rf"{name.replace('.', '[.]')}.*prepare --target mini --refresh"):
        load_target("mini", "cpu", "float32", home=home)


def test_prepare_rebuilds_a_damaged_mini_target(mini_home, tmp_path, monkeypatch, caplog):
    from dflash_core.prepare import pipeline as prep

    home = _damaged(mini_home, tmp_path, "model.safetensors", _flip)
    built = []
    monkeypatch.setenv("DFLASH_REBUILD_MINI", "1")  # a local build; without it the shipped reference is imported
    monkeypatch.setattr(prep, "build_mini_target", lambda d, *cfg, progress=True: built.append(Path(d)))
    with caplog.at_level(logging.INFO, logger="dflash_core"):
        prep.ensure_target("mini", home, refresh=False, progress=False)
    assert built == [home / "targets" / "mini"]
    assert "model.safetensors" in caplog.text and "rebuilding" in caplog.text


def test_truncated_weights_without_a_manifest_are_a_clear_error(tmp_path):
    d = tmp_path / "ckpt"
    build_tiny(TinySpec(dtype="float32")).save_pretrained(d)
    _truncate(d / "model.safetensors")
    with pytest.raises(TargetNotFoundError, match=r"model\.safetensors .*unreadable"):
        load_target(str(d), "cpu", "float32")


# --- 19.7: wrong-shape manifests and refused pickles ---------------------------------------------------

@pytest.mark.parametrize("doc", [[], "files", {"format_version": 1, "files": ["drafter.pt"]},
                                 {"format_version": 1, "files": {"drafter.pt": "abc"}}])
def test_wrong_shape_manifest_is_an_artifact_error_and_prepare_repairs_it(lab, tmp_path, doc, monkeypatch):
    from dflash_core.prepare import pipeline as teacher  # teacher_data where the pipeline looks it up

    home, out = _home_copy(lab, tmp_path)
    (out / MANIFEST).write_text(json.dumps(doc))
    rt = _rt(lab)
    with pytest.raises(ArtifactError, match=r"manifest\.json.*corrupt|manifest\.json.*format_version"):
        load_prepared(rt, home=home)

    class Rebuilt(Exception):
        pass

    def stop(*a, **k):
        raise Rebuilt

    monkeypatch.setattr(teacher, "teacher_data", stop)  # prepare starts the rebuild: enough to show it repairs
    with pytest.raises(Rebuilt):
        prepare(str(lab["ckpt"]), home=home, cfg=CFG, rt=rt, progress=False)


class Payload:  # what a pickle could smuggle in: loading must never get as far as unpickling it
    pass


def _install(out: Path, name: str, data: bytes) -> None:
    """Replace artifact `name` and re-list it in the manifest, so only the file's content is wrong."""
    (out / name).write_bytes(data)
    doc = json.loads((out / MANIFEST).read_text())
    doc["files"][name] = file_entry(out / name)
    (out / MANIFEST).write_text(json.dumps(doc))


def test_a_pickle_in_place_of_an_artifact_is_refused_unread(lab, tmp_path, monkeypatch):
    """A torch.save pickle listed with a consistent manifest: an ArtifactError with the fix; no unpickler runs."""
    import io
    import pickle

    import torch

    home, out = _home_copy(lab, tmp_path)
    buf = io.BytesIO()
    torch.save({"config": {}, "state_dict": Payload()}, buf)
    _install(out, DRAFTER_FILE, buf.getvalue())

    def forbidden(*a, **k):
        raise AssertionError("an artifact was unpickled")

    monkeypatch.setattr(pickle, "Unpickler", forbidden)
    monkeypatch.setattr(torch, "load", forbidden)
    with pytest.raises(ArtifactError, match=r"drafter\.safetensors.*safetensors.*--refresh") as exc:
        load_prepared(_rt(lab), home=home)
    assert "weights_only=False" not in str(exc.value)


@pytest.mark.parametrize("damage", ["header", "skeleton", "tensor"])
def test_a_corrupt_safetensors_artifact_is_an_artifact_error(lab, tmp_path, damage):
    """Damage the manifest's hash cannot see (re-listed): a bad header, a skeleton naming a missing tensor, or a
    tensor of the wrong shape; each is refused with the file and the fix, never a crash deeper in."""
    import struct

    from safetensors.torch import save

    from dflash_core.store.artifacts import TREE_KEY, load_tensor_file

    home, out = _home_copy(lab, tmp_path)
    good = (out / DRAFTER_FILE).read_bytes()
    if damage == "header":
        assert struct.unpack("<Q", good[:8])[0] > 16  # the header is longer than what is overwritten
        data = good[:8] + b"{" * 16 + good[24:]  # the JSON header no longer parses
    else:
        blob = load_tensor_file(out / DRAFTER_FILE)
        sd = dict(blob["state_dict"])
        tree = {"config": blob["config"], "state_dict": {k: {"$tensor": f"state_dict/{k}"} for k in sd}}
        if damage == "skeleton":
            sd.pop("fc.weight")  # the skeleton still names it
        else:
            sd["fc.weight"] = sd["fc.weight"][:, :-1].contiguous()
        data = save({f"state_dict/{k}": v for k, v in sd.items()}, metadata={TREE_KEY: json.dumps(tree)})
    _install(out, DRAFTER_FILE, data)
    with pytest.raises(ArtifactError, match=r"drafter\.safetensors.*--refresh"):
        load_prepared(_rt(lab), home=home)


def test_a_home_loads_without_unpickling_anything(lab, tmp_path, monkeypatch):
    """Every artifact of a prepared home (drafter + every fitter's file) loads with torch.load and the pickle
    machinery made to raise: the home holds safetensors and JSON only."""
    import pickle

    import torch

    from dflash_core.methods import METHODS

    home, out = _home_copy(lab, tmp_path)
    rt = _rt(lab)

    def forbidden(*a, **k):
        raise AssertionError("something was unpickled")

    monkeypatch.setattr(torch, "load", forbidden)
    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(pickle, "loads", forbidden)
    monkeypatch.setattr(pickle, "Unpickler", forbidden)
    prepared = load_prepared(rt, home=home)
    suffixes = {Path(n).suffix for n in prepared.manifest["files"]}
    assert suffixes <= {".safetensors", ".json"}, suffixes
    built = 0
    for m in METHODS.values():
        if m.build is None:
            continue
        m.build(rt, prepared)  # each proposer loads the files its method needs
        built += 1
    assert built == len(METHODS) - 1
    assert prepared.files  # the fitted heads were actually read


# --- 19.8: the lock -------------------------------------------------------------------------------

def test_reader_waits_for_the_writer_instead_of_reporting_corruption(lab, tmp_path):
    home, out = _home_copy(lab, tmp_path)
    rt = _rt(lab)
    good = (out / DRAFTER_FILE).read_bytes()
    result: dict = {}

    def reader():
        try:
            result["dir"] = load_prepared(rt, home=home).directory
        except DFlashError as exc:
            result["error"] = exc

    with home_lock(home):  # a writer mid-rewrite: the drafter is half written
        (out / DRAFTER_FILE).write_bytes(good[: len(good) // 3])
        t = threading.Thread(target=reader)
        t.start()
        time.sleep(1.0)
        assert t.is_alive() and not result  # waiting, not reporting corruption
        (out / DRAFTER_FILE).write_bytes(good)
    t.join(60)
    assert result == {"dir": out}


# --- 19.9: threads and the recorded config -----------------------------------------------------------

def test_prepare_honours_threads_and_restores_the_callers(lab, tmp_path, monkeypatch):
    import torch

    from dflash_core.prepare import pipeline as teacher  # teacher_data where the pipeline looks it up

    home, _ = _home_copy(lab, tmp_path)
    seen = []

    class Stop(Exception):
        pass

    def spy(*a, **k):
        seen.append(torch.get_num_threads())
        raise Stop

    monkeypatch.setattr(teacher, "teacher_data", spy)
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.raises(Stop):
            prepare(str(lab["ckpt"]), home=home, cfg=CFG, refresh=True, progress=False, threads=3)
        assert seen == [3]
        assert torch.get_num_threads() == 1
        prepare(str(lab["ckpt"]), home=home, cfg=replace(CFG, threads=2), progress=False)  # verified path too
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(prev)


def test_artifacts_of_another_prepare_config_are_not_verified(lab, tmp_path, monkeypatch, caplog):
    from dflash_core.prepare import pipeline as teacher  # teacher_data where the pipeline looks it up

    home, _ = _home_copy(lab, tmp_path)

    class Rebuilt(Exception):
        pass

    def stop(*a, **k):
        raise Rebuilt

    # a rebuild for another aux_steps generates the teacher data again (its resume folder is keyed by the config)
    monkeypatch.setattr(teacher, "teacher_data", stop)
    other = replace(CFG, aux_steps=CFG.aux_steps + 1)
    with caplog.at_level(logging.INFO, logger="dflash_core"), pytest.raises(Rebuilt):
        prepare(str(lab["ckpt"]), home=home, cfg=other, progress=False)
    assert "another prepare config" in caplog.text and "aux_steps" in caplog.text


