"""The shipped reference bundle (reference/): current, verified before use, imported by prepare into a home
without a mini target, and skipped by --rebuild-mini. Regenerate it with `python scripts/make_reference_bundle.py`."""

from __future__ import annotations

import gzip
import io
import json
import logging
import shutil
import tarfile
from pathlib import Path

import pytest

from dflash_core import __main__ as cli
from dflash_core.prepare import pipeline as prep
from dflash_core.prepare import reference as ref
from dflash_core.prepare.reference_check import staleness

pytestmark = pytest.mark.skipif(ref.reference_bundle() is None, reason="no reference/ folder (an installed wheel)")


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    return ref.import_reference(tmp_path_factory.mktemp("ref-home") / "home")


def test_the_shipped_reference_bundle_is_current(imported):
    stale = staleness(imported)
    assert not stale, f"reference bundle is stale ({'; '.join(stale)}): run `{ref.REGENERATE}` and commit it"


def test_the_reference_stores_bf16_weights_and_loads_them_as_float32(imported):
    from safetensors import safe_open

    from dflash_core.runtime.target import load_target

    with safe_open(Path(imported["target_dir"]) / "model.safetensors", "pt") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
    assert dtypes == {"BF16"}
    home = Path(imported["home"])
    rt = load_target("mini", "cpu", "float32", home=home)
    assert {p.dtype for p in rt.model.parameters()} == {__import__("torch").float32}
    assert Path(imported["artifact_dir"]).name == prep.prepared_dir(rt.info["identity"], home).name


def test_the_documented_model_hash_is_the_one_every_report_of_the_reference_names(imported):
    """Headlines and reports name `runs[].model_sha256` (the target's SHA-256s, its dtype and every artifact's
    SHA-256: what runs are pooled on); docs/mini-target.md must state the one the shipped bundle gives, so a reader
    can match any machine's report to it. Break: regenerate the bundle and leave the doc's hash."""
    from dflash_core.report.build import identity_hash, model_identity
    from dflash_core.runtime.target import load_target
    from dflash_core.store.artifacts import target_identity

    rt = load_target("mini", "cpu", "float32", home=Path(imported["home"]))
    man = json.loads((Path(imported["artifact_dir"]) / "manifest.json").read_text())
    doc = {"dflash": {"target": {**target_identity(rt), "dtype": "float32"},
                      "provenance": {"artifacts": {"files": man["files"]}}}}
    h = identity_hash(model_identity(doc))
    text = (Path(__file__).resolve().parents[2] / "docs" / "mini-target.md").read_text()
    assert f"`{h}`" in text, f"docs/mini-target.md does not state the reference's model hash {h}"


def test_prepare_imports_the_reference_into_an_empty_home_and_trains_nothing(tmp_path, monkeypatch, caplog):
    def refuse(*a, **k):
        raise AssertionError("prepare trained something although the reference bundle holds it")

    monkeypatch.delenv("DFLASH_REBUILD_MINI", raising=False)
    monkeypatch.delenv("DFLASH_MINI_SEED", raising=False)
    monkeypatch.setattr(prep, "build_mini_target", refuse)
    monkeypatch.setattr(prep, "train_drafter", refuse)
    monkeypatch.setattr(prep, "teacher_data", refuse)
    with caplog.at_level(logging.INFO, logger="dflash_core"):
        out = prep.prepare("mini", home=tmp_path / "home", progress=False)
    assert "importing the shipped reference" in caplog.text
    assert (tmp_path / "home" / "targets" / "mini" / "model.safetensors").is_file() and out.is_dir()


def _flip_member(src: Path, dst: Path, name: str) -> None:
    """Flip one byte inside one member's data (the gzip and tar framing stay valid, so only its hash can tell)."""
    raw = bytearray(gzip.decompress(src.read_bytes()))
    with tarfile.open(fileobj=io.BytesIO(bytes(raw))) as tar:
        m = tar.getmember(name)
    raw[m.offset_data + m.size // 2] ^= 0x01
    dst.write_bytes(gzip.compress(bytes(raw), compresslevel=1))


def test_a_flipped_byte_in_the_reference_is_refused_with_its_name(tmp_path, monkeypatch, capsys):
    bad = tmp_path / "mini.dflash-bundle.tar.gz"
    _flip_member(ref.REFERENCE_BUNDLE, bad, "targets/mini/model.safetensors")
    monkeypatch.setattr(ref, "REFERENCE_BUNDLE", bad)
    monkeypatch.delenv("DFLASH_REBUILD_MINI", raising=False)
    monkeypatch.delenv("DFLASH_MINI_SEED", raising=False)
    home = tmp_path / "home"
    assert cli.main(["prepare", "--home", str(home), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:")
    assert "targets/mini/model.safetensors fails its SHA-256 check" in err[0] and "--rebuild-mini" in err[0]
    assert not (home / "targets").exists() and not (home / "artifacts").exists()


def _fake_build(built):
    def build(d, *cfg, progress=True):
        built.append(Path(d))
        d = Path(d)
        shutil.rmtree(d, ignore_errors=True)  # a build replaces the folder (build_mini_target moves files in)
        d.mkdir(parents=True)
        (d / "config.json").write_text("{}")
        from dflash_core.store.artifacts import write_target_manifest

        write_target_manifest(d)
    return build


def test_rebuild_mini_replaces_the_reference_once_and_keeps_the_local_build(tmp_path, monkeypatch):
    home = tmp_path / "home"
    ref.import_reference(home)
    built: list[Path] = []
    monkeypatch.setattr(prep, "build_mini_target", _fake_build(built))
    monkeypatch.delenv("DFLASH_MINI_SEED", raising=False)
    monkeypatch.delenv("DFLASH_REBUILD_MINI", raising=False)
    prep.ensure_target("mini", home, refresh=False, progress=False)
    assert built == []  # the reference is present and verified: nothing to build
    monkeypatch.setenv("DFLASH_REBUILD_MINI", "1")
    prep.ensure_target("mini", home, refresh=False, progress=False)
    assert built == [home / "targets" / "mini"]  # the imported reference is replaced by a local build
    prep.ensure_target("mini", home, refresh=False, progress=False)
    assert len(built) == 1  # the local build is kept: the flag is idempotent
    assert not ref.is_reference_build(home / "targets" / "mini")


def test_rebuild_mini_is_a_flag_of_prepare_and_bench():
    a = cli.build_parser().parse_args(["prepare", "--rebuild-mini"])
    assert a.rebuild_mini is True
    assert cli.build_parser().parse_args(["bench", "--rebuild-mini"]).rebuild_mini is True
    assert cli.build_parser().parse_args(["prepare"]).rebuild_mini is None


def test_a_damaged_home_target_is_replaced_by_the_reference(tmp_path, monkeypatch):
    home = tmp_path / "home"
    ref.import_reference(home)
    w = home / "targets" / "mini" / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[len(data) // 2] ^= 0x01
    w.write_bytes(bytes(data))
    monkeypatch.setattr(prep, "build_mini_target", _fake_build([]))
    monkeypatch.delenv("DFLASH_REBUILD_MINI", raising=False)
    monkeypatch.delenv("DFLASH_MINI_SEED", raising=False)
    prep.ensure_target("mini", home, refresh=False, progress=False)
    assert ref.is_reference_build(home / "targets" / "mini")
    doc = json.loads((home / "targets" / "mini" / "target_manifest.json").read_text())
    assert doc["files"]["model.safetensors"]["bytes"] == w.stat().st_size
    from dflash_core.store.artifacts import verify_target_files

    verify_target_files(home / "targets" / "mini", "")  # the flipped byte is gone
