"""Portable prepared bundles (docs/design.md §10): export -> import reproduces the home byte for byte, and every kind of
bad bundle (corrupt, truncated, escaping, mismatched) is refused with the home left exactly as it was."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from dflash_core.errors import BundleError
from dflash_core.prepare.bundle import BUNDLE_MANIFEST, export_bundle, import_bundle
from dflash_core.testing import tiny_prepare_config

from ..support.homes import make_mini_like_home

TINY_PREP = tiny_prepare_config()


def snapshot(home: Path) -> dict[str, str]:
    """Every file under a home (hidden ones too) with its SHA-256: 'byte-identical' made checkable."""
    return {p.relative_to(home).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(home.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def mini_like_home(tiny_prepared, tmp_path_factory) -> Path:
    return make_mini_like_home(tiny_prepared, tmp_path_factory.mktemp("bundle-src"))


@pytest.fixture(scope="module")
def bundle(mini_like_home, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bundle") / "mini.tar.gz"
    export_bundle(out, "mini", mini_like_home)
    return out


def test_export_import_mini_round_trip(bundle, mini_like_home, tmp_path):
    from dflash_core.prepare.prepared import load_prepared
    from dflash_core.runtime.target import load_target

    home = tmp_path / "other"
    got = import_bundle(bundle, home)
    assert got["target_dir"] == str(home / "targets" / "mini")
    src, dst = snapshot(mini_like_home), snapshot(home)
    packed = {k: v for k, v in src.items() if k.startswith(("targets/", "artifacts/"))}
    assert {k: v for k, v in dst.items() if k.startswith(("targets/", "artifacts/"))} == packed
    assert not [k for k in dst if k.startswith(".import-")]
    rt = load_target("mini", "cpu", "float32", home=home)
    prepared = load_prepared(rt, home=home)
    assert prepared.manifest["target"]["content_sha256"] == rt.info["identity"]["content_sha256"]
    assert prepared.directory == home / got["artifact_dir"].split(str(home) + "/")[1]


def test_export_import_local_target(tiny_prepared, tmp_path):
    """A checkpoint that is not mini travels as its artifacts only; the other machine brings the weights."""
    from dflash_core.prepare.prepared import load_prepared

    out = tmp_path / "local.tar.gz"
    doc = export_bundle(out, str(tiny_prepared.path), tiny_prepared.home)
    assert doc["target_dir"] is None
    assert all(name.startswith("artifacts/") for name in doc["files"])
    got = import_bundle(out, tmp_path / "other")
    prepared = load_prepared(tiny_prepared.rt, home=tmp_path / "other")
    assert str(prepared.directory) == got["artifact_dir"]
    assert snapshot(prepared.directory) == snapshot(tiny_prepared.prepared.directory)
    # what `bench` does next on the other machine: prepare finds the imported artifacts valid, rebuilds nothing
    from dflash_core.prepare.pipeline import prepare
    from dflash_core.runtime.target import load_target

    before = snapshot(tmp_path / "other")
    rt32 = load_target(str(tiny_prepared.path), "cpu", "float32")
    assert prepare(str(tiny_prepared.path), home=tmp_path / "other", cfg=TINY_PREP, rt=rt32, progress=False
                   ) == prepared.directory
    assert snapshot(tmp_path / "other") == before


def _rewrite(src: Path, dst: Path, edit) -> None:
    """Copy a bundle member by member; `edit(name, data)` returns new bytes, or None to drop the member."""
    with tarfile.open(src, "r:gz") as tin, tarfile.open(dst, "w:gz") as tout:
        for m in tin.getmembers():
            data = edit(m.name, tin.extractfile(m).read())
            if data is None:
                continue
            info = tarfile.TarInfo(m.name)
            info.size = len(data)
            tout.addfile(info, io.BytesIO(data))


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:]


def _add(dst: Path, src: Path, info: tarfile.TarInfo, data: bytes = b"") -> None:
    _rewrite(src, dst, lambda n, d: d)
    with tarfile.open(dst, "r:gz") as tin:
        members = [(m, tin.extractfile(m).read()) for m in tin.getmembers()]
    with tarfile.open(dst, "w:gz") as tout:
        for m, d in members:
            tout.addfile(m, io.BytesIO(d))
        info.size = len(data) if info.isfile() else 0
        tout.addfile(info, io.BytesIO(data) if info.isfile() else None)


def _bad_member_byte(src, dst):
    _rewrite(src, dst, lambda n, d: _flip(d, len(d) // 2) if n.endswith("model.safetensors") else d)


def _bad_member_cut(src, dst):
    _rewrite(src, dst, lambda n, d: d[: len(d) - 7] if n.endswith(("drafter.safetensors", "model.safetensors"))
             else d)


def _bad_member_missing(src, dst):
    _rewrite(src, dst, lambda n, d: None if n.endswith("model.safetensors") else d)


def _bad_file_byte(src, dst):
    raw = src.read_bytes()
    dst.write_bytes(_flip(raw, len(raw) // 2))


def _bad_file_cut(src, dst):
    raw = src.read_bytes()
    dst.write_bytes(raw[: len(raw) // 2])


def _bad_escape(src, dst):
    _add(dst, src, tarfile.TarInfo("../escaped.txt"), b"outside the home")


def _bad_absolute(src, dst):
    _add(dst, src, tarfile.TarInfo(str(dst.parent / "absolute.txt")), b"absolute")


def _bad_symlink(src, dst):
    info = tarfile.TarInfo("targets/mini/link")
    info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
    _add(dst, src, info)


def _bad_identity(src, dst):
    """bundle.json names another target than the artifact manifest inside (a mismatched bundle)."""
    def edit(name, data):
        if name != BUNDLE_MANIFEST:
            return data
        doc = json.loads(data)
        doc["target"]["weights_sha256"] = "0" * 64
        return json.dumps(doc).encode()
    _rewrite(src, dst, edit)


def _bad_manifest(src, dst):
    """The artifact manifest inside claims other hashes, and bundle.json is updated to agree with the new manifest:
    the files no longer match the manifest that travels with them."""
    store = {}

    def edit(name, data):
        if name.startswith("artifacts/") and name.endswith("/manifest.json"):
            doc = json.loads(data)
            first = sorted(doc["files"])[0]
            doc["files"][first]["sha256"] = "f" * 64
            data = json.dumps(doc).encode()
            store[name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        return data
    _rewrite(src, dst, edit)
    tmp = dst.with_suffix(".2")

    def fix_bundle_json(name, data):
        if name != BUNDLE_MANIFEST:
            return data
        doc = json.loads(data)
        doc["files"].update(store)
        return json.dumps(doc).encode()
    _rewrite(dst, tmp, fix_bundle_json)
    tmp.replace(dst)


BAD = {"flipped byte in a file": (_bad_member_byte, "SHA-256"),
       "truncated file": (_bad_member_cut, "truncated"),
       "missing file": (_bad_member_missing, "does not match"),
       "flipped byte in the bundle": (_bad_file_byte, ""),
       "truncated bundle": (_bad_file_cut, "truncated or corrupt"),
       "path escaping the home": (_bad_escape, "unsafe"),
       "absolute path": (_bad_absolute, "unsafe"),
       "symlink": (_bad_symlink, "unsafe link"),
       "bundle.json names another target": (_bad_identity, "another target"),
       "manifest does not match its files": (_bad_manifest, "SHA-256")}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_bundle_is_refused_and_home_unchanged(case, bundle, tmp_path):
    make, words = BAD[case]
    home = tmp_path / "home"
    import_bundle(bundle, home)  # a home that already holds a prepared target: it must survive as it is
    (home / "notes.txt").write_text("the user's own file\n")
    before = snapshot(home)
    bad = tmp_path / "bad.tar.gz"
    make(bundle, bad)
    with pytest.raises(BundleError) as err:
        import_bundle(bad, home)
    assert words in str(err.value)
    assert "export" in str(err.value) or "unchanged" in str(err.value)
    assert snapshot(home) == before
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "absolute.txt").exists()


def test_import_of_missing_file_names_the_fix(tmp_path):
    with pytest.raises(BundleError, match="export --out"):
        import_bundle(tmp_path / "nope.tar.gz", tmp_path / "home")


def test_cli_export_import(mini_like_home, tmp_path, capsys):
    from dflash_core import __main__ as cli

    out = tmp_path / "b.tar.gz"
    assert cli.main(["export", "--out", str(out), "--target", "mini", "--home", str(mini_like_home)]) == 0
    assert json.loads(capsys.readouterr().out)["files"] > 2
    assert cli.main(["import", str(out), "--home", str(tmp_path / "h")]) == 0
    assert json.loads(capsys.readouterr().out)["target_dir"] == str(tmp_path / "h" / "targets" / "mini")
    _bad_file_cut(out, tmp_path / "cut.tar.gz")
    assert cli.main(["import", str(tmp_path / "cut.tar.gz"), "--home", str(tmp_path / "h")]) == 2
    assert "error: bundle" in capsys.readouterr().err
