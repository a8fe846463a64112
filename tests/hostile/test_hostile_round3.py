"""Hostile input, round three (issue 70): the new surfaces (the home's lock and import journal, checkpoint shard
indexes, saved-run copies, report folders, budgets, environment switches, Ctrl-C) end in one `error:` line and
exit 2, or in a correct result: no hang, no traceback, nothing written outside the home.

A test that would hang on the old code runs under an alarm, so it fails instead of blocking the suite."""

from __future__ import annotations

import json
import os

import pytest

from dflash_core.errors import ArtifactError

from ..support.helpers import alarm

# --- the home's lock and the import journal ------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["link", "fifo", "dir"])
def test_a_lock_file_that_is_not_a_regular_file_is_refused_not_silently_unlocked(tmp_path, kind):
    from dflash_core.store.artifacts import LOCK_FILE, home_lock

    home = tmp_path / "home"
    home.mkdir()
    lock = home / LOCK_FILE
    if kind == "link":
        lock.symlink_to(tmp_path / "elsewhere.lock")
    elif kind == "fifo":
        os.mkfifo(lock)
    else:
        lock.mkdir()
    entered = []
    with alarm(20), pytest.raises(ArtifactError, match="not the lab's lock file: remove it"):
        with home_lock(home):
            entered.append(1)
    assert entered == [] and not (tmp_path / "elsewhere.lock").exists()


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_a_journal_that_is_a_fifo_or_a_device_rolls_the_stage_back_without_hanging(tmp_path, kind):
    from dflash_core.store.artifacts import home_lock
    from dflash_core.store.journal import JOURNAL

    home = tmp_path / "home"
    stage = home / ".import-x"
    stage.mkdir(parents=True)
    if kind == "fifo":
        os.mkfifo(stage / JOURNAL)
    else:
        (stage / JOURNAL).symlink_to("/dev/zero")
    with alarm(20), home_lock(home):
        pass
    assert not stage.exists()  # rolled back (no readable journal) and removed


# --- environment switches ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["DFLASH_REBUILD_MINI", "DFLASH_REQUIRE_GPU"])
def test_a_switch_takes_only_yes_or_no_words(clean_env, monkeypatch, capsys, name):
    from dflash_core.__main__ import main
    from dflash_core.options import check_environment

    for word, want in (("1", True), ("TRUE", True), ("yes", True), ("0", False), ("false", False), ("No", False)):
        monkeypatch.setenv(name, word)
        check_environment()
        from dflash_core.options import env_value
        assert env_value("rebuild_mini" if "MINI" in name else "require_gpu") is want
    monkeypatch.setenv(name, "ture")  # a typo read as false turned a GPU runner's failures into skips
    assert main(["prepare", "--home", str(clean_env)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and name in err and "1/true/yes or 0/false/no" in err


def test_ctrl_c_is_one_line_and_exit_130(clean_env, monkeypatch, capsys):
    from dflash_core import __main__ as cli

    def interrupted(a):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "cmd_prepare", interrupted)
    assert cli.main(["prepare", "--home", str(clean_env)]) == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: interrupted (Ctrl-C)") and "Traceback" not in err


# --- files written as a set, full disks named, stale temp files removed --------------------------------------

def test_a_report_set_is_written_whole_or_not_at_all_and_a_full_disk_names_the_file(tmp_path, monkeypatch):
    import errno

    from dflash_core.errors import expected_failure
    from dflash_core.store import artifacts

    a, b = tmp_path / "a.json", tmp_path / "b.html"
    artifacts.write_atomic_set({a: b"old a", b: b"old b"})
    real, n = artifacts.os.fsync, []

    def fsync(fd):  # the second file's write finds the disk full
        n.append(fd)
        if len(n) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd)

    monkeypatch.setattr(artifacts.os, "fsync", fsync)
    with pytest.raises(OSError) as exc:
        artifacts.write_atomic_set({a: b"new a", b: b"new b"})
    assert a.read_bytes() == b"old a" and b.read_bytes() == b"old b"  # no mix of two runs
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.html"]  # no .part left
    assert str(b) in expected_failure(exc.value) and "no space left" in expected_failure(exc.value)


def test_stale_part_files_of_dead_writers_are_removed_and_a_live_ones_kept(tmp_path):
    import subprocess
    import sys

    from dflash_core.store.artifacts import remove_stale_parts

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".report.html.{int(dead.stdout)}.ab12cd34.part"
    live = tmp_path / f".index.html.{os.getpid()}.ab12cd34.part"
    for p in (stale, live):
        p.write_text("half")
    assert remove_stale_parts(tmp_path) == [stale] and live.exists() and not stale.exists()


# --- a checkpoint's shard index ----------------------------------------------------------------------------------

@pytest.mark.parametrize("shard", ["../outside.safetensors", "/dev/zero", "fifo.safetensors", "sub/x.safetensors"])
def test_a_shard_index_naming_a_file_outside_the_folder_or_not_regular_is_refused(tmp_path, shard):
    from dflash_core.runtime.checkpoint import check_checkpoint
    from dflash_core.testing import TinySpec, tiny_config

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    tiny_config(TinySpec()).save_pretrained(ckpt)
    (tmp_path / "outside.safetensors").write_bytes(b"x")
    if shard == "fifo.safetensors":
        os.mkfifo(ckpt / shard)
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a.weight": shard}}))
    with alarm(20), pytest.raises(ArtifactError, match="shard"):
        check_checkpoint(ckpt, ArtifactError)
