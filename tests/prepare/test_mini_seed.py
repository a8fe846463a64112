"""--mini-seed / DFLASH_MINI_SEED: another training seed builds another, independent mini target in its own folder
of the home (so homes never mix two models), and the seed reaches the build, the CLI's child and the metadata."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_core.prepare import pipeline
from dflash_core.store.artifacts import mini_target_dir


def test_each_seed_has_its_own_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("DFLASH_MINI_SEED", raising=False)
    assert mini_target_dir(tmp_path) == tmp_path / "targets" / "mini"
    assert mini_target_dir(tmp_path, 7) == tmp_path / "targets" / "mini-seed-7"
    monkeypatch.setenv("DFLASH_MINI_SEED", "3")
    assert mini_target_dir(tmp_path) == tmp_path / "targets" / "mini-seed-3"


def test_the_seed_reaches_the_build(monkeypatch, tmp_path):
    """ensure_target builds the missing mini target of the asked seed into that seed's folder (the build stubbed:
    its config is what matters). Break: the build at the default config -> seed 1234."""
    built = []

    monkeypatch.setattr(pipeline, "build_mini_target", lambda d, cfg, progress=True: built.append((Path(d), cfg.seed)))
    monkeypatch.setenv("DFLASH_MINI_SEED", "2")
    pipeline.ensure_target("mini", tmp_path, refresh=False, progress=False)
    monkeypatch.delenv("DFLASH_MINI_SEED")
    monkeypatch.setenv("DFLASH_REBUILD_MINI", "1")  # the standard seed built here, not the shipped reference
    pipeline.ensure_target("mini", tmp_path, refresh=False, progress=False)
    assert built == [(tmp_path / "targets" / "mini-seed-2", 2), (tmp_path / "targets" / "mini", 1234)]


def test_the_cli_flag_is_checked_and_exported(monkeypatch, capsys):
    from dflash_core import __main__ as cli
    from dflash_core.options import env_value

    monkeypatch.setenv("DFLASH_MINI_SEED", "0")  # restored (unset) after the test, whatever the CLI sets
    monkeypatch.delenv("DFLASH_MINI_SEED")
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["prepare", "--mini-seed", "-1"])
    cli._export_mini_seed(cli.build_parser().parse_args(["prepare", "--mini-seed", "5"]))
    assert env_value("mini_seed") == 5


def test_a_seed_beyond_the_generators_range_is_refused_before_any_folder_exists(tmp_path, monkeypatch, capsys):
    """--mini-seed 2**64 crashed after ~30 s of work and left an empty targets/mini-seed-N behind."""
    from dflash_core import __main__ as cli

    monkeypatch.setenv("DFLASH_MINI_SEED", "0")
    monkeypatch.delenv("DFLASH_MINI_SEED")
    monkeypatch.setattr(pipeline, "build_mini_target", lambda *a, **k: pytest.fail("built before the check"))
    with pytest.raises(SystemExit) as exc:  # argparse's usage error: `prog: error: ...` and exit 2
        cli.main(["prepare", "--home", str(tmp_path / "home"), "--mini-seed", str(2**64)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("error:") == 1 and "--mini-seed" in err and "<= 4294967295" in err
    monkeypatch.setenv("DFLASH_MINI_SEED", str(2**64))
    assert cli.main(["prepare", "--home", str(tmp_path / "home")]) == 2
    assert "DFLASH_MINI_SEED" in capsys.readouterr().err
    assert not (tmp_path / "home" / "targets").exists()
