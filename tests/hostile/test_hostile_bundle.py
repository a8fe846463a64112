"""Hostile bundles (groups 1-4 and the import/export tracebacks): bundle.json is untrusted until checked,
import is crash-safe, export packs only manifest-listed regular files, and nothing outside the home ever changes.

The security tests snapshot the folder around the home before and after: a bundle that once deleted the user's
folder next to the home must now leave every byte outside (and inside) the home as it was."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from dflash_core import __main__ as cli
from dflash_core.errors import BundleError
from dflash_core.prepare import bundle as bundle_mod
from dflash_core.prepare.bundle import BUNDLE_MANIFEST, export_bundle, import_bundle
from dflash_core.store.artifacts import home_lock

from ..support.bundles import edit_bundle, member_info, members, with_target_file, write_tar, zeros_bundle
from ..support.homes import make_mini_like_home, tree

REPO = Path(__file__).resolve().parents[2]


def home_state(home: Path) -> dict[str, str]:
    """The home as a user sees it: everything but the lock file."""
    return {k: v for k, v in tree(home).items() if k != ".prepare.lock"}


def _one_error(capsys) -> str:
    """Exactly one `error:` line and no traceback on stderr (log lines may come with it); returns the line."""
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("error:") or "Traceback" in ln]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.fixture(scope="module")
def mini_like_home(tiny_prepared, tmp_path_factory) -> Path:
    return make_mini_like_home(tiny_prepared, tmp_path_factory.mktemp("hb-src"))


@pytest.fixture(scope="module")
def mini_bundle(mini_like_home, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hb-mini") / "mini.tar.gz"
    export_bundle(out, "mini", mini_like_home)
    return out


@pytest.fixture(scope="module")
def local_bundle(tiny_prepared, tmp_path_factory) -> Path:
    """An artifacts-only bundle (a local target: its weights do not travel)."""
    out = tmp_path_factory.mktemp("hb-local") / "local.tar.gz"
    export_bundle(out, str(tiny_prepared.path), tiny_prepared.home)
    return out


# --- group 1: target_dir must not leave the home (the deleted-folder bug) ----------------------------------------

@pytest.mark.parametrize("target_dir", ["../bundle", "../../targets", "/tmp", "targets/mini/../../../bundle",
                                        "targets", "artifacts", ".", "", "targets/mini/", "targets//mini"])
def test_target_dir_outside_the_home_is_refused_and_nothing_changes(local_bundle, tmp_path, capsys, target_dir):
    outer = tmp_path / "X"
    parent = outer / "P"
    home = parent / "home"
    (parent / "bundle").mkdir(parents=True)
    (parent / "bundle" / "thesis.txt").write_text("the user's own folder next to the home\n")
    (outer / "targets").mkdir()
    (outer / "targets" / "keep.txt").write_text("another user folder\n")
    assert cli.main(["import", str(local_bundle), "--home", str(home)]) == 0  # a home with its targets/ etc.
    (home / "targets" / "mine").mkdir(parents=True)
    (home / "targets" / "mine" / "w.txt").write_text("the home's own target\n")
    capsys.readouterr()
    before_outside, before_home = tree(outer, skip=home), home_state(home)
    bad = edit_bundle(local_bundle, tmp_path / "bad.tar.gz", lambda d: d.update(target_dir=target_dir))
    assert cli.main(["import", str(bad), "--home", str(home)]) == 2
    assert "target directory" in _one_error(capsys)
    assert tree(outer, skip=home) == before_outside
    assert home_state(home) == before_home


def test_artifact_dir_other_than_the_identitys_is_refused(local_bundle, tmp_path, capsys):
    home = tmp_path / "home"
    bad = edit_bundle(local_bundle, tmp_path / "bad.tar.gz", lambda d: d.update(artifact_dir="artifacts/../../x"))
    assert cli.main(["import", str(bad), "--home", str(home)]) == 2
    assert "artifact directory" in _one_error(capsys)
    assert not home.exists() or home_state(home) == {}


@pytest.mark.parametrize("edit,words", [
    (lambda d: d["target"].update(content_sha256=12345), "content_sha256"),
    (lambda d: d["target"].update(content_sha256="A" * 64), "content_sha256"),
    (lambda d: d["target"].update(weights_sha256=None), "weights_sha256"),
    (lambda d: d["target"].update(evil=1), "unknown fields"),
    (lambda d: d.update(extra=1), "beyond or missing"),
    (lambda d: d.pop("target_dir"), "beyond or missing"),
    (lambda d: d.update(files=[]), "lists no files"),
    (lambda d: d.update(files={}), "lists no files"),
    (lambda d: next(iter(d["files"].values())).update(sha256="x"), "sha256"),
    (lambda d: next(iter(d["files"].values())).update(bytes=-1), "bytes"),
    (lambda d: next(iter(d["files"].values())).update(bytes=True), "bytes"),
    (lambda d: d.update(format_version="1"), "version"),
    (lambda d: d.update(target=[]), "identity"),
], ids=["numeric-hash", "upper-hex", "null-hash", "unknown-identity-key", "unknown-top-key", "missing-key",
        "files-list", "files-empty", "bad-sha", "negative-bytes", "bool-bytes", "string-version", "target-list"])
def test_bundle_json_schema(local_bundle, tmp_path, capsys, edit, words):
    home = tmp_path / "home"
    bad = edit_bundle(local_bundle, tmp_path / "bad.tar.gz", edit)
    assert cli.main(["import", str(bad), "--home", str(home)]) == 2
    assert words in _one_error(capsys)
    assert not [p for p in home.rglob("*") if p.name != ".prepare.lock"] if home.exists() else True


# --- group 2: bundle.json first, members stream-checked before their bytes are written ---------------------------

def test_a_zero_bomb_before_bundle_json_writes_nothing(tmp_path, capsys, monkeypatch):
    written = []
    monkeypatch.setattr(bundle_mod, "_write_member", lambda *a, **k: written.append(a))
    bomb = zeros_bundle(tmp_path / "bomb.tar.gz", 256 << 20)
    assert bomb.stat().st_size < 2 << 20
    home = tmp_path / "home"
    assert cli.main(["import", str(bomb), "--home", str(home)]) == 2
    assert f"does not start with {BUNDLE_MANIFEST}" in _one_error(capsys)
    assert written == []
    assert home_state(home) == {}


def test_an_unlisted_member_after_bundle_json_is_refused_before_its_bytes(local_bundle, tmp_path, capsys,
                                                                          monkeypatch):
    original = members(local_bundle)
    head = [(m, d) for m, d in original if m.name == BUNDLE_MANIFEST]
    written = []
    monkeypatch.setattr(bundle_mod, "_write_member", lambda *a, **k: written.append(a[2]))
    bomb = zeros_bundle(tmp_path / "bomb.tar.gz", 256 << 20, head=head)
    home = tmp_path / "home"
    assert cli.main(["import", str(bomb), "--home", str(home)]) == 2
    assert "unlisted" in _one_error(capsys)
    assert written == []
    assert home_state(home) == {}


def test_a_member_larger_than_listed_is_refused_before_its_bytes(local_bundle, tmp_path, capsys, monkeypatch):
    written = []
    monkeypatch.setattr(bundle_mod, "_write_member", lambda *a, **k: written.append(a[2]))
    out = []
    for m, data in members(local_bundle):
        out.append((m, data + b"\0" * 4096 if m.name.endswith("drafter.safetensors") else data))
    bad = write_tar(tmp_path / "bad.tar.gz", out)
    assert cli.main(["import", str(bad), "--home", str(tmp_path / "home")]) == 2
    assert "truncated or altered" in _one_error(capsys)
    assert not any(str(p).endswith("drafter.safetensors") for p in written)


def test_too_many_listed_bytes_are_refused_before_anything_is_written(local_bundle, tmp_path, capsys):
    def huge(d):  # two files, each within the per-file bound, together over the bundle's total
        for name in [n for n in d["files"] if n.endswith(".safetensors")][:2]:
            d["files"][name]["bytes"] = bundle_mod.MAX_BUNDLE_BYTES // 2 + 1
    bad = edit_bundle(local_bundle, tmp_path / "bad.tar.gz", huge)
    assert cli.main(["import", str(bad), "--home", str(tmp_path / "home")]) == 2
    assert "limit" in _one_error(capsys)


def test_twenty_thousand_empty_folders_are_refused(local_bundle, tmp_path, capsys):
    folders = []
    for i in range(20_000):
        info = tarfile.TarInfo(f"artifacts/d{i}")
        info.type = tarfile.DIRTYPE
        folders.append((info, b""))
    bad = write_tar(tmp_path / "bad.tar.gz", members(local_bundle)[:1] + folders)
    home = tmp_path / "home"
    assert cli.main(["import", str(bad), "--home", str(home)]) == 2
    assert "folder" in _one_error(capsys)
    assert home_state(home) == {}


# --- group 4: only what the manifests list travels --------------------------------------------------------------

def test_code_in_the_target_folder_is_refused(mini_bundle, tmp_path, capsys):
    bad = with_target_file(mini_bundle, tmp_path / "bad.tar.gz", "modeling_evil.py", b"import os\n")
    home = tmp_path / "home"
    assert cli.main(["import", str(bad), "--home", str(home)]) == 2
    assert "modeling_evil.py" in _one_error(capsys)
    assert not list(home.rglob("modeling_evil.py"))


def test_a_file_listed_in_bundle_json_but_not_in_the_manifest_is_refused(local_bundle, tmp_path, capsys):
    adir = json.loads(members(local_bundle)[0][1])["artifact_dir"]
    data = b'{"stray": true}'
    stray = f"{adir}/stray.json"
    bad = edit_bundle(local_bundle, tmp_path / "bad.tar.gz",
                 lambda d: d["files"].update({stray: {"sha256": hashlib.sha256(data).hexdigest(),
                                                      "bytes": len(data)}}),
                 extra=[(member_info(stray), data)])
    home = tmp_path / "home"
    assert cli.main(["import", str(bad), "--home", str(home)]) == 2
    assert "stray" in _one_error(capsys)
    assert not list(home.rglob("stray.json"))


def test_export_packs_only_manifest_listed_regular_files(mini_like_home, tmp_path):
    home = tmp_path / "home"
    shutil.copytree(mini_like_home, home)
    adir = next((home / "artifacts").iterdir())
    (adir / "passwd").symlink_to("/etc/passwd")
    (adir / "notes.txt").write_text("a stray file\n")
    (home / "targets" / "mini" / "modeling_evil.py").write_text("import os\n")
    out = tmp_path / "b.tar.gz"
    export_bundle(out, "mini", home)
    names = [m.name for m, _ in members(out)]
    assert not [n for n in names if n.endswith(("passwd", "notes.txt", "modeling_evil.py"))], names
    passwd = Path("/etc/passwd").read_bytes()
    assert not any(passwd and passwd in d for _, d in members(out))
    assert cli.main(["import", str(out), "--home", str(tmp_path / "other")]) == 0


def test_export_refuses_a_listed_file_that_is_a_link(mini_like_home, tmp_path, capsys):
    home = tmp_path / "home"
    shutil.copytree(mini_like_home, home)
    adir = next((home / "artifacts").iterdir())
    real = tmp_path / "elsewhere.json"
    shutil.move(adir / "trajectories.json", real)
    (adir / "trajectories.json").symlink_to(real)
    out = tmp_path / "b.tar.gz"
    assert cli.main(["export", "--out", str(out), "--home", str(home)]) == 2
    assert "link" in _one_error(capsys)
    assert not out.exists() and not list(tmp_path.glob(".b.tar.gz*"))


# --- group 3: a kill at each step of the import -----------------------------------------------------------------

KILL = """
import os, signal, sys
from dflash_core.prepare import bundle
def step(name):
    if name == sys.argv[3]:
        os.kill(os.getpid(), signal.SIGKILL)
bundle._step = step
bundle.import_bundle(sys.argv[1], sys.argv[2])
"""

STEPS = ["extracted", "journal", "backup:{adir}", "moved:{adir}", "backup:targets/mini", "moved:targets/mini", "done"]


@pytest.fixture(scope="module")
def crash_homes(mini_bundle, tmp_path_factory):
    """(old home, the same home after a clean import): the old one has a stale file in each directory the import
    replaces, so 'as before' and 'as after' differ."""
    root = tmp_path_factory.mktemp("crash")
    old = root / "old"
    import_bundle(mini_bundle, old)
    adir = next((old / "artifacts").iterdir())
    (adir / "stale.txt").write_text("from an older prepare\n")
    (old / "targets" / "mini" / "stale.txt").write_text("from an older build\n")
    new = root / "new"
    shutil.copytree(old, new)
    import_bundle(mini_bundle, new)
    return old, new, f"artifacts/{adir.name}"


@pytest.mark.parametrize("step", STEPS)
def test_a_kill_at_any_step_leaves_the_home_as_before_or_after(mini_bundle, crash_homes, tmp_path, step):
    from dflash_core.prepare.prepared import load_prepared
    from dflash_core.runtime.target import load_target

    old, new, adir = crash_homes
    home = tmp_path / "home"
    shutil.copytree(old, home)
    before, after = home_state(old), home_state(new)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", KILL, str(mini_bundle), str(home), step.format(adir=adir)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr  # killed at that step, not finished or failed
    with home_lock(home):  # the next command that takes the lock repairs the home first
        pass
    got = home_state(home)
    assert got in (before, after), f"after a kill at {step}: neither the old nor the new home"
    assert got == (before if step == "extracted" else after)
    assert not [p for p in home.iterdir() if p.name.startswith(".import-")]
    rt = load_target("mini", "cpu", "float32", home=home)
    assert load_prepared(rt, home=home).manifest["target"]["content_sha256"] == rt.info["identity"]["content_sha256"]


def test_a_stage_an_older_release_stranded_is_rolled_back_by_the_next_reader(crash_homes, tmp_path):
    """Repro 3: killed right after the old import's first os.replace, artifacts/<key> sat in .import-*/old and the
    next `run` started a full prepare. Now any command that reads the home puts it back first."""
    from dflash_core.prepare.prepared import load_prepared
    from dflash_core.runtime.target import load_target

    old, _, adir = crash_homes
    home = tmp_path / "home"
    shutil.copytree(old, home)
    before = home_state(home)
    stage = home / ".import-4242-deadbeef"
    (stage / "old").mkdir(parents=True)
    (stage / "bundle").mkdir()
    os.replace(home / adir, stage / "old" / adir.replace("/", "__"))
    rt = load_target("mini", "cpu", "float32", home=home)
    load_prepared(rt, home=home)  # a reader: waits for the lock, which repairs the home
    assert home_state(home) == before


# --- disk full, read-only, wrong kinds of paths -----------------------------------------------------------------

def test_import_out_of_space_is_named_not_called_corrupt(local_bundle, tmp_path, capsys, monkeypatch):
    real = os.fdopen

    class Full(io.RawIOBase):
        def writable(self):
            return True

        def write(self, b):
            raise OSError(errno.ENOSPC, "No space left on device")

    def fdopen(fd, mode="r", *a, **k):
        if "w" in mode:
            os.close(fd)
            return Full()
        return real(fd, mode, *a, **k)

    monkeypatch.setattr(bundle_mod.os, "fdopen", fdopen)
    home = tmp_path / "home"
    assert cli.main(["import", str(local_bundle), "--home", str(home)]) == 2
    line = _one_error(capsys)
    assert "no space left on device while writing" in line and "corrupt" not in line
    assert home_state(home) == {}


def test_import_refuses_up_front_when_the_home_has_no_room(local_bundle, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bundle_mod.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10, 10, 1))
    assert cli.main(["import", str(local_bundle), "--home", str(tmp_path / "home")]) == 2
    assert "no space left on device" in _one_error(capsys)


def test_import_into_a_home_that_is_a_file(local_bundle, tmp_path, capsys):
    (tmp_path / "home").write_text("not a folder")
    assert cli.main(["import", str(local_bundle), "--home", str(tmp_path / "home")]) == 2
    _one_error(capsys)
    assert (tmp_path / "home").read_text() == "not a folder"


def test_import_into_a_read_only_home(local_bundle, tmp_path, capsys, monkeypatch):
    real = Path.mkdir

    def mkdir(self, *a, **k):
        if self.name.startswith(".import-"):
            raise PermissionError(errno.EROFS, "Read-only file system", str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    assert cli.main(["import", str(local_bundle), "--home", str(tmp_path / "home")]) == 2
    assert "permission denied" in _one_error(capsys)


def test_export_to_an_existing_folder_fails_before_packing(mini_like_home, tmp_path, capsys, monkeypatch):
    import dflash_core.runtime.target as target

    monkeypatch.setattr(target, "load_target", lambda *a, **k: pytest.fail("loaded before checking --out"))
    monkeypatch.setattr(bundle_mod, "load_target", lambda *a, **k: pytest.fail("loaded before checking --out"))
    (tmp_path / "out").mkdir()
    assert cli.main(["export", "--out", str(tmp_path / "out"), "--home", str(mini_like_home)]) == 2
    assert "not a regular file" in _one_error(capsys)


@pytest.mark.parametrize("code,words", [(errno.ENOSPC, "no space left on device while writing"),
                                        (errno.EROFS, "permission denied")])
def test_export_to_a_full_or_read_only_filesystem(mini_like_home, tmp_path, capsys, monkeypatch, code, words):
    real = tarfile.open

    def tar_open(name=None, mode="r", *a, **k):
        if "w" in mode:
            raise OSError(code, os.strerror(code), str(name))
        return real(name, mode, *a, **k)

    monkeypatch.setattr(bundle_mod.tarfile, "open", tar_open)
    out = tmp_path / "b.tar.gz"
    assert cli.main(["export", "--out", str(out), "--home", str(mini_like_home)]) == 2
    line = _one_error(capsys)
    assert words in line and str(out) in line
    assert not list(tmp_path.glob("*b.tar.gz*"))


def test_export_refuses_up_front_when_out_has_no_room(mini_like_home, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bundle_mod.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10, 10, 1))
    assert cli.main(["export", "--out", str(tmp_path / "b.tar.gz"), "--home", str(mini_like_home)]) == 2
    assert "no space left on device" in _one_error(capsys)


def test_round_trip_still_works(mini_bundle, mini_like_home, tmp_path):
    home = tmp_path / "home"
    got = import_bundle(mini_bundle, home)
    src = {k: v for k, v in home_state(mini_like_home).items() if k.startswith(("targets", "artifacts"))}
    assert {k: v for k, v in home_state(home).items() if k.startswith(("targets", "artifacts"))} == src
    assert got["files"] == len(json.loads(members(mini_bundle)[0][1])["files"])


def test_bundle_error_is_still_a_bundle_error(tmp_path):
    with pytest.raises(BundleError):
        import_bundle(tmp_path / "missing.tar.gz", tmp_path / "home")
