"""studies/drafter_lab/arch.py (the drafter-architecture harness) refuses bad knobs with one `error:` line and
exit 2 before it loads a target or spends minutes on a teacher pass (the target path here does not exist: a check
that ran after loading would fail there)."""

from __future__ import annotations

import pytest

from studies.drafter_lab import arch


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
    (["--teacher-dtype", "bf16"], "teacher_dtype must be one of auto, float32, bfloat16, got 'bf16'"),
    (["--heldout-cache", "ref.pt"], "--heldout-cache needs --shares"),
])
def test_bad_knobs_are_refused_before_the_target_loads(tmp_path, capsys, args, says):
    with pytest.raises(SystemExit) as exc:
        arch.main(["--target", str(tmp_path / "no-such-target"), "--out", str(tmp_path / "o.json"), *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and says in err[-1]
    assert not (tmp_path / "o.json").exists()


def test_the_variant_names_it_accepts_are_the_ones_it_builds():
    mod = arch
    for name in ("base", "anchor", "mask", "block", "deep3", "init2", "base+emb", "deep2+emb"):
        assert mod.VARIANT.fullmatch(name)
    for name in ("deep", "deep12", "base+", "emb", ""):
        assert not mod.VARIANT.fullmatch(name)


def test_a_bf16_teacher_is_refused_where_bf16_would_be_emulated(tmp_path, capsys, monkeypatch):
    import dflash_core.prepare.pipeline as pipeline

    monkeypatch.setattr(pipeline, "train_in_bf16", lambda device="cpu": False)
    with pytest.raises(SystemExit) as exc:
        arch.main(["--target", str(tmp_path / "no-such-target"), "--out", str(tmp_path / "o.json"),
                            "--teacher-dtype", "bfloat16"])
    assert exc.value.code == 2
    assert "no native bf16" in capsys.readouterr().err.strip().splitlines()[-1]


def test_the_heldout_cache_must_hold_this_runs_seeds_and_taps(tmp_path, capsys):
    """--heldout-cache scores every row on another teacher set's continuations of the same seeds: a set of other
    seeds or other taps is refused (one `error:` line, exit 2); the same seeds give that set."""
    from types import SimpleNamespace

    import torch

    from dflash_core.prepare.teacher import TeacherData

    mod = arch
    seeds = [[1, 2], [3, 4, 5]]
    own = TeacherData([s + [9, 9] for s in seeds], [2, 3], tap_layers=(0, 2))
    ref = TeacherData([s + [8, 8] for s in seeds], [2, 3], tap_layers=(0, 2))
    path = tmp_path / "ref.pt"
    torch.save({"teacher": dict(vars(ref)), "seeds_kept": seeds, "teacher_dtype": "float32"}, path)
    got = mod.reference_set(SimpleNamespace(heldout_cache=str(path)), own, seeds)
    assert got.sequences == ref.sequences and mod.reference_set(SimpleNamespace(heldout_cache=None), own, seeds) is None
    for other_seeds, taps, says in ((seeds[:1] + [[3, 4, 6]], (0, 2), "other seeds"), (seeds, (0, 1), "layers")):
        torch.save({"teacher": dict(vars(ref)) | {"tap_layers": taps}, "seeds_kept": other_seeds}, path)
        with pytest.raises(SystemExit) as exc:
            mod.reference_set(SimpleNamespace(heldout_cache=str(path)), own, seeds)
        assert exc.value.code == 2 and says in capsys.readouterr().err
