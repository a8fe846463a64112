"""scripts/drafter_arch.py refuses bad knobs with one `error:` line and exit 2 before it loads a target or spends
minutes on a teacher pass (the target path here does not exist: a check that ran after loading would fail there)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "drafter_arch.py"
sys.path.insert(0, str(SCRIPT.parent))  # its helpers (recipe_variants) live beside it, not in the package


def load_script():
    spec = importlib.util.spec_from_file_location("drafter_arch", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("args, says", [
    (["--shares", "2"], "--shares must be numbers in (0, 1]"),
    (["--shares", "half"], "--shares must be numbers in (0, 1]"),
    (["--variants", "base,deep"], "unknown variant 'deep'"),
    (["--selection-study"], "--selection-study needs --shares"),
    (["--budget", "soon"], "--budget minutes"),
    (["--widths", "4,x"], "--widths must be integers"),
    (["--distill-top-k", "8", "--distill-weight", "3"], "distill_weight must be a number in 0..1"),
    (["--distill-top-k", "4096"], "distill_top_k"),
    (["--distill-top-k", "8", "--teacher-top-k", "4"], "--teacher-top-k must be at least --distill-top-k"),
    (["--feature-weight", "-1"], "feature_weight"),
    (["--teacher-dtype", "bf16"], "teacher_dtype must be one of float32, bfloat16, got 'bf16'"),
])
def test_bad_knobs_are_refused_before_the_target_loads(tmp_path, capsys, args, says):
    with pytest.raises(SystemExit) as exc:
        load_script().main(["--target", str(tmp_path / "no-such-target"), "--out", str(tmp_path / "o.json"), *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and says in err[-1]
    assert not (tmp_path / "o.json").exists()


def test_the_variant_names_it_accepts_are_the_ones_it_builds():
    mod = load_script()
    for name in ("base", "anchor", "mask", "block", "deep3", "init2", "base+emb", "deep2+emb"):
        assert mod.VARIANT.fullmatch(name)
    for name in ("deep", "deep12", "base+", "emb", ""):
        assert not mod.VARIANT.fullmatch(name)


def test_a_bf16_teacher_is_refused_where_bf16_would_be_emulated(tmp_path, capsys, monkeypatch):
    import dflash_core.prepare.pipeline as pipeline

    monkeypatch.setattr(pipeline, "train_in_bf16", lambda device="cpu": False)
    with pytest.raises(SystemExit) as exc:
        load_script().main(["--target", str(tmp_path / "no-such-target"), "--out", str(tmp_path / "o.json"),
                            "--teacher-dtype", "bfloat16"])
    assert exc.value.code == 2
    assert "no native bf16" in capsys.readouterr().err.strip().splitlines()[-1]
