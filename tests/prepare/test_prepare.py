"""prepare: deterministic artifacts, verified on load; bad artifacts refused with the file and the fix.

These reuse the session's prepared tiny target (conftest `tiny_prepared`); only the determinism check
prepares a second time, on purpose.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from dflash_core.errors import ArtifactError, BadInputError
from dflash_core.prepare.pipeline import DRAFTER_FILE, prepare
from dflash_core.prepare.prepared import load_prepared
from dflash_core.runtime.target import load_target
from dflash_core.testing import TinySpec, build_tiny, tiny_prepare_config

TINY_PREP = tiny_prepare_config()


@pytest.fixture(scope="module")
def tiny_dir(tiny_prepared):
    """The session's tiny checkpoint (float32 on disk)."""
    return tiny_prepared.path


@pytest.fixture(scope="module")
def prepared_home(tiny_prepared):
    """The session's prepared home and artifact directory (prepared once by conftest)."""
    return tiny_prepared.home, tiny_prepared.prepared.directory


def test_prepare_is_deterministic(tiny_dir, prepared_home, tmp_path):
    home, out = prepared_home
    rt = load_target(str(tiny_dir), "cpu", "float32")
    out2 = prepare(str(tiny_dir), home=tmp_path, cfg=TINY_PREP, rt=rt, progress=False)
    m1 = json.loads((out / "manifest.json").read_text())
    m2 = json.loads((out2 / "manifest.json").read_text())
    assert m1["files"] == m2["files"]
    assert m1["files"][DRAFTER_FILE]["bytes"] > 0


def test_prepare_reuses_verified_artifacts(tiny_dir, prepared_home):
    home, out = prepared_home
    before = (out / "manifest.json").read_text()
    rt = load_target(str(tiny_dir), "cpu", "float32")
    assert prepare(str(tiny_dir), home=home, cfg=TINY_PREP, rt=rt, progress=False) == out
    assert (out / "manifest.json").read_text() == before


def _copy_home(src_home, dst):
    import shutil

    shutil.copytree(src_home, dst)
    return dst


def test_flipped_byte_is_refused(tiny_dir, prepared_home, tmp_path):
    home = _copy_home(prepared_home[0], tmp_path / "h")
    rt = load_target(str(tiny_dir), "cpu", "float32")
    out = next((home / "artifacts").iterdir())
    data = bytearray((out / DRAFTER_FILE).read_bytes())
    data[len(data) // 2] ^= 0x01
    (out / DRAFTER_FILE).write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=r"drafter\.safetensors fails its SHA-256 check.*--refresh"):
        load_prepared(rt, home=home)


def test_truncated_file_is_refused(tiny_dir, prepared_home, tmp_path):
    home = _copy_home(prepared_home[0], tmp_path / "h")
    rt = load_target(str(tiny_dir), "cpu", "float32")
    out = next((home / "artifacts").iterdir())
    data = (out / DRAFTER_FILE).read_bytes()
    (out / DRAFTER_FILE).write_bytes(data[:-10])
    with pytest.raises(ArtifactError, match=r"drafter\.safetensors has \d+ bytes.*truncated.*--refresh"):
        load_prepared(rt, home=home)


def test_wrong_target_is_refused(prepared_home, tmp_path):
    home = _copy_home(prepared_home[0], tmp_path / "h")
    other = tmp_path / "other"
    build_tiny(TinySpec(dtype="float32", pattern="CCACAC", seed=99)).save_pretrained(other)
    rt = load_target(str(other), "cpu", "float32")
    # point the other target at the first target's artifact directory
    src = next((home / "artifacts").iterdir())
    from dflash_core.store.artifacts import artifact_dir, target_identity

    src.rename(artifact_dir(target_identity(rt), home))
    with pytest.raises(ArtifactError, match="prepared for another target.*--refresh"):
        load_prepared(rt, home=home)


def test_missing_method_artifact_names_prepare(tiny_dir, prepared_home):
    rt = load_target(str(tiny_dir), "cpu", "float32")
    with pytest.raises(ArtifactError, match="lacks 'nope.json'.*prepare"):
        load_prepared(rt, home=prepared_home[0], required=("nope.json",))


@pytest.mark.exactness
def test_dflash_on_prepared_tiny_target_is_exact(tiny_dir, prepared_home):
    from dflash_core.methods.runner import run_method
    from dflash_core.runtime.decode import greedy

    rt = load_target(str(tiny_dir), "cpu", "float64")
    prep = load_prepared(load_target(str(tiny_dir), "cpu", "float32"), home=prepared_home[0])
    prep.drafter = prep.drafter.double()
    for prompt in ([5], [7, 8, 9, 10], list(range(3, 40))):
        ref, _ = greedy(rt, prompt, 30)
        for w in (1, 2, 4):
            got, stats = run_method("dflash", rt, prep, prompt, 30, w)
            assert got == ref
            assert stats.draft_calls >= 1


def test_artifacts_are_found_from_any_run_dtype(tiny_prepared):
    """The identity is the checkpoint's (hashed at float32), so a bfloat16/float16 run (the GPU default) finds
    the artifacts that `prepare` built in float32, and the drafter comes back on the run's device."""
    from dflash_core.store.artifacts import target_identity

    fp32 = load_target(str(tiny_prepared.path), "cpu", "float32")
    bf16 = load_target(str(tiny_prepared.path), "cpu", "bfloat16")
    assert next(bf16.model.parameters()).dtype == bf16.dtype
    assert target_identity(bf16) == target_identity(fp32)
    home = tiny_prepared.home
    assert load_prepared(bf16, home=home).directory == load_prepared(fp32, home=home).directory


def test_every_method_accepts_widths_up_to_a_block_of_16(tiny_dir, tmp_path):
    """Nothing caps widths below the drafter's block size: a B=16 drafter decodes exactly at width 16 with
    every speculative method, and width 17 is refused with the bound in the message."""
    from dataclasses import replace

    from dflash_core.errors import BadInputError
    from dflash_core.methods import get_method, speculative_ids
    from dflash_core.runtime.decode import greedy, speculative

    rt32 = load_target(str(tiny_dir), "cpu", "float32")
    prepare(str(tiny_dir), home=tmp_path, cfg=replace(TINY_PREP, block_size=16, traj_tokens=32), rt=rt32,
            progress=False)
    rt = load_target(str(tiny_dir), "cpu", "float64")
    prep = load_prepared(rt, home=tmp_path)
    assert prep.drafter.cfg.block_size == 16
    prompt = [5, 17, 33, 2, 9, 41]
    ref, _ = greedy(rt, prompt, 40)
    for method in speculative_ids():
        got, stats = speculative(rt, get_method(method).build(rt, prep), prompt, 40, 16, method=method)
        assert got == ref, method
        assert stats.width == 16 and len(stats.accept_counts) == 17
        with pytest.raises(BadInputError, match=r"1\.\.16"):
            speculative(rt, get_method(method).build(rt, prep), prompt, 8, 17, method=method)


def test_prepare_defaults_are_pinned_to_the_recipe():
    """A change of PrepareConfig's defaults changes what a plain `prepare` builds: it must come with a new RECIPE,
    else homes built by the old defaults would be reused by bench/run (which accept a home's recorded config)."""
    import hashlib

    from dflash_core.prepare.pipeline import DEFAULTS_SHA256, PrepareConfig

    digest = hashlib.sha256(json.dumps(PrepareConfig().to_dict(), sort_keys=True).encode()).hexdigest()
    assert digest == DEFAULTS_SHA256, (f"PrepareConfig defaults changed: bump prepare.RECIPE and set "
                                       f"DEFAULTS_SHA256 = {digest!r}")


def test_recorded_config_is_accepted_only_without_an_explicit_config_and_only_for_this_recipe():
    from dflash_core.prepare.pipeline import RECIPE, config_mismatch

    recorded = TINY_PREP.to_dict()
    doc = {"recipe": RECIPE, "prepare_config": json.loads(json.dumps(recorded))}
    other = replace(TINY_PREP, aux_steps=TINY_PREP.aux_steps + 1)
    assert config_mismatch(doc, TINY_PREP) is None
    assert config_mismatch(doc, replace(TINY_PREP, threads=TINY_PREP.threads + 1)) is None  # recorded, not compared
    assert "aux_steps" in config_mismatch(doc, other)
    assert config_mismatch(doc, other, accept_recorded=True) is None
    old = {**doc, "recipe": "an older recipe"}
    assert "another prepare recipe" in config_mismatch(old, TINY_PREP, accept_recorded=True)


def test_a_given_train_seeds_count_is_compared_even_where_the_recorded_config_is_accepted():
    """`prepare --train-seeds N` on a home prepared with another count must rebuild, not report "present": the
    artifact directory is one per target, so accepting the recorded config would keep the old teacher data."""
    from dflash_core.prepare.pipeline import RECIPE, config_mismatch

    doc = {"recipe": RECIPE, "prepare_config": json.loads(json.dumps(TINY_PREP.to_dict()))}
    more = replace(TINY_PREP, corpus_seeds=TINY_PREP.corpus_seeds + 100)
    assert "corpus_seeds" in config_mismatch(doc, more, accept_recorded=True, pinned=("corpus_seeds",))
    assert config_mismatch(doc, more, accept_recorded=True) is None  # not given on the command line: accepted
    # a pinned knob that matches leaves the other recorded settings accepted
    other = replace(TINY_PREP, aux_steps=TINY_PREP.aux_steps + 1)
    assert config_mismatch(doc, other, accept_recorded=True, pinned=("corpus_seeds",)) is None


def test_train_seeds_sets_the_seed_count_and_pins_it(tmp_path, monkeypatch):
    import dflash_core.prepare.pipeline as pipeline

    seen = []
    monkeypatch.setattr(pipeline, "_prepare", lambda target, **kw: seen.append(kw) or tmp_path)
    pipeline.prepare("mini", home=tmp_path / "home", train_seeds=50)
    pipeline.prepare("mini", home=tmp_path / "home")
    assert seen[0]["cfg"].corpus_seeds == 50 and seen[0]["pinned"] == ("corpus_seeds",)
    assert seen[1]["cfg"].corpus_seeds == pipeline.PrepareConfig().corpus_seeds and seen[1]["pinned"] == ()


def test_teacher_dtype_sets_the_config_and_pins_it(tmp_path, monkeypatch):
    import dflash_core.prepare.pipeline as pipeline

    seen = []
    monkeypatch.setattr(pipeline, "_prepare", lambda target, **kw: seen.append(kw) or tmp_path)
    monkeypatch.setattr(pipeline, "train_in_bf16", lambda device="cpu": True)
    pipeline.prepare("mini", home=tmp_path / "home", teacher_dtype="bfloat16", train_seeds=50)
    pipeline.prepare("mini", home=tmp_path / "home")
    assert seen[0]["cfg"].teacher_dtype == "bfloat16" and seen[0]["pinned"] == ("corpus_seeds", "teacher_dtype")
    assert seen[1]["cfg"].teacher_dtype == "auto" and seen[1]["pinned"] == ()  # resolved in _prepare, per target


def test_a_given_teacher_dtype_is_compared_against_a_home_that_recorded_none():
    """Homes record teacher_dtype only when it is not float32 (LATE_KNOBS): `--teacher-dtype float32` on such a home
    accepts it, `--teacher-dtype bfloat16` rebuilds it."""
    from dflash_core.prepare.pipeline import RECIPE, config_mismatch

    doc = {"recipe": RECIPE, "prepare_config": json.loads(json.dumps(TINY_PREP.to_dict()))}
    assert "teacher_dtype" not in doc["prepare_config"]
    assert config_mismatch(doc, TINY_PREP, accept_recorded=True, pinned=("teacher_dtype",)) is None
    bf16 = replace(TINY_PREP, teacher_dtype="bfloat16")
    assert "teacher_dtype" in config_mismatch(doc, bf16, accept_recorded=True, pinned=("teacher_dtype",))


@pytest.mark.parametrize("bad", ["bf16", "Auto", 16, None])
def test_a_bad_or_emulated_teacher_dtype_is_refused_before_any_work(bad, tmp_path, monkeypatch):
    """A bad value, and bfloat16 on a CPU that would emulate it, end before the target is loaded or the home
    is made."""
    import dflash_core.prepare.pipeline as pipeline
    from dflash_core.errors import BadInputError

    monkeypatch.setattr(pipeline, "load_target", lambda *a, **k: pytest.fail("the target was loaded"))
    if bad is None:  # stands for bfloat16 without native bf16
        monkeypatch.setattr(pipeline, "train_in_bf16", lambda device="cpu": False)
        with pytest.raises(BadInputError, match="no native bf16"):
            pipeline.prepare("mini", home=tmp_path / "home", teacher_dtype="bfloat16")
    else:
        with pytest.raises(BadInputError, match="teacher_dtype"):
            pipeline.prepare("mini", home=tmp_path / "home", teacher_dtype=bad)
    assert not (tmp_path / "home").exists()


@pytest.mark.parametrize("bad", [0, -3, True, 2.5, "100", 10**9])
def test_bad_train_seeds_are_refused_before_any_work(bad, tmp_path):
    from dflash_core.errors import BadInputError
    from dflash_core.prepare.pipeline import prepare

    with pytest.raises(BadInputError, match=r"--train-seeds='[^']*' must be an integer"):
        prepare("mini", home=tmp_path / "home", train_seeds=bad)
    assert not (tmp_path / "home").exists()


def test_the_fits_run_without_the_teacher_taps_in_memory(tiny_dir, tmp_path, monkeypatch):
    """The teacher's taps are the largest data prepare holds (~2.6 GB at 350M); the fits read only the
    trajectories, so the taps must be gone before the fits build their own examples (not both at the peak)."""
    import gc

    import dflash_core.prepare.pipeline as pipeline
    from dflash_core.methods.base import Fitter
    from dflash_core.prepare.teacher import TeacherData

    alive: list[int] = []

    def probe(ctx):
        gc.collect()
        alive.append(sum(1 for o in gc.get_objects() if isinstance(o, TeacherData) and o.taps))
        return {"files": {}, "meta": {}}

    monkeypatch.setattr(pipeline, "fitters", lambda: (Fitter("probe", (), probe),))
    rt = load_target(str(tiny_dir), "cpu", "float32")
    prepare(str(tiny_dir), home=tmp_path, cfg=TINY_PREP, rt=rt, progress=False)
    assert alive == [0]


def test_the_teacher_runs_under_the_dtype_prepare_resolved(tiny_dir, tmp_path, monkeypatch):
    """teacher_dtype 'bfloat16' (native bf16 forced): every teacher forward runs under bf16 autocast and the
    manifest says so (the default at a mini-sized vocabulary, float32, runs none: test_precision.py)."""
    import torch

    import dflash_core.prepare.pipeline as pipeline
    import dflash_core.prepare.teacher as teacher

    seen: list[bool] = []
    real = teacher.batch_teacher

    def probe(*a, **k):
        seen.append(torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16)
        return real(*a, **k)

    monkeypatch.setattr(teacher, "batch_teacher", probe)
    monkeypatch.setattr(pipeline, "train_in_bf16", lambda device="cpu": True)
    rt = load_target(str(tiny_dir), "cpu", "float32")
    cfg = replace(TINY_PREP, teacher_dtype="bfloat16", aux_steps=1)
    out = prepare(str(tiny_dir), home=tmp_path / "bf16", cfg=cfg, rt=rt, progress=False)
    assert seen and all(seen)
    assert json.loads((out / "manifest.json").read_text())["teacher"]["dtype"] == "bfloat16"


def test_the_teacher_pads_its_batches_where_prepare_resolved_padding(tiny_dir, tmp_path, monkeypatch):
    """teacher_batching 'padded' (the auto choice at a real vocabulary): every teacher batch runs padded, the seeds'
    lengths mix in one batch, and the manifest says so (the mini-sized default runs length buckets: the test
    above and the pinned mini config)."""
    import dflash_core.prepare.teacher as teacher

    seen: list[tuple[bool, int]] = []
    real = teacher.batch_teacher

    def probe(rt, prompts, *a, **k):
        seen.append((k.get("padded", False), len({len(p) for p in prompts})))
        return real(rt, prompts, *a, **k)

    monkeypatch.setattr(teacher, "batch_teacher", probe)
    rt = load_target(str(tiny_dir), "cpu", "float32")
    cfg = replace(TINY_PREP, teacher_batching="padded", aux_steps=1)
    out = prepare(str(tiny_dir), home=tmp_path / "padded", cfg=cfg, rt=rt, progress=False)
    assert seen and all(padded for padded, _ in seen) and max(n for _, n in seen) > 1
    doc = json.loads((out / "manifest.json").read_text())
    assert doc["teacher"]["batched"].startswith("mixed lengths left-padded")
    assert doc["prepare_config"]["teacher_batching"] == "padded"


@pytest.mark.parametrize("field, value", [("anchor_embed", "yes"), ("anchor_embed", "auto"), ("teacher_dtype", "fp32"),
                                          ("teacher_dtype", None), ("teacher_dtype", 32),
                                          ("teacher_batching", "pad"), ("teacher_batching", True)])
def test_prepare_refuses_bad_teacher_and_drafter_knobs_before_any_work(tmp_path, field, value):
    from dflash_core.errors import BadInputError
    from dflash_core.prepare.pipeline import PrepareConfig

    with pytest.raises(BadInputError, match=field):
        prepare("mini", home=tmp_path / "home", cfg=replace(PrepareConfig(), **{field: value}), progress=False)
    assert not (tmp_path / "home").exists()  # refused before the home was touched


def test_knobs_added_since_leave_the_recorded_config_as_it_was_at_their_defaults():
    """anchor_embed and teacher_dtype at their defaults build what was built before they existed: the config dict
    (so the pinned defaults, every home and the shipped bundle) is unchanged; set, a knob is recorded and compared."""
    from dflash_core.prepare.pipeline import LATE_KNOBS, RECIPE, PrepareConfig, config_mismatch

    d = PrepareConfig().to_dict()
    assert not set(LATE_KNOBS) & set(d)
    doc = {"recipe": RECIPE, "prepare_config": json.loads(json.dumps(d))}
    assert config_mismatch(doc, PrepareConfig()) is None
    assert "anchor_embed" in config_mismatch(doc, PrepareConfig(anchor_embed=True))
    assert PrepareConfig(teacher_dtype="bfloat16").to_dict()["teacher_dtype"] == "bfloat16"


@pytest.mark.parametrize("value, vocab, native, dtype, want", [
    ("auto", 16384, True, "float32", "bfloat16"),  # a real vocabulary where bf16 is native
    ("auto", 16384, False, "float32", "float32"),  # a CPU that would emulate bf16
    ("auto", 64, True, "float32", "float32"),  # the mini target's vocabulary: its recipe unchanged
    ("auto", 16384, True, "float64", "float32"),  # a target loaded in another dtype
    ("float32", 16384, True, "float32", "float32"), ("bfloat16", 64, True, "float32", "bfloat16"),  # given: as given
])
def test_the_auto_teacher_dtype_is_bf16_only_at_a_real_vocabulary_where_bf16_is_native(monkeypatch, value, vocab,
                                                                                         native, dtype, want):
    from types import SimpleNamespace

    import torch

    import dflash_core.prepare.pipeline as P

    monkeypatch.setattr(P, "train_in_bf16", lambda device="cpu": native)
    rt = SimpleNamespace(dtype=getattr(torch, dtype), device="cpu", vocab_size=vocab)
    assert P.resolve_auto_teacher(value, rt) == want


@pytest.mark.parametrize("value, vocab, model_type, want", [
    ("auto", 16384, "lfm2", "padded"), ("auto", 16384, "llama", "padded"),  # a real vocabulary, a type that pads
    ("auto", 64, "lfm2", "length"),  # the mini target's vocabulary: its recipe unchanged
    ("auto", 16384, "gpt2", "length"),  # a type not known to pad exactly
    ("length", 16384, "lfm2", "length"), ("padded", 64, "lfm2", "padded"),  # given: as given
])
def test_the_auto_teacher_batching_pads_only_at_a_real_vocabulary_of_a_type_that_pads_exactly(value, vocab,
                                                                                             model_type, want):
    from types import SimpleNamespace

    import dflash_core.prepare.pipeline as P

    rt = SimpleNamespace(vocab_size=vocab, model=SimpleNamespace(config=SimpleNamespace(model_type=model_type)))
    assert P.resolve_teacher_batching(value, rt) == want


@pytest.mark.parametrize("value, model_type, match", [("padded", "gpt2", "needs a target of model type"),
                                                      ("zigzag", "lfm2", "must be one of"),
                                                      (None, "lfm2", "must be one of")])
def test_a_padded_teacher_is_refused_where_it_could_leak_and_bad_values_are_named(value, model_type, match):
    from types import SimpleNamespace

    import dflash_core.prepare.pipeline as P

    rt = SimpleNamespace(vocab_size=16384, model=SimpleNamespace(config=SimpleNamespace(model_type=model_type)))
    with pytest.raises(BadInputError, match=match):
        P.resolve_teacher_batching(value, rt)


@pytest.mark.parametrize("vocab, native, want", [(64, True, "float32"), (16384, True, "bfloat16"),
                                                 (16384, False, "float32")])
def test_prepare_resolves_the_teacher_dtype_before_it_compares_or_records_a_config(tmp_path, monkeypatch, vocab,
                                                                                     native, want):
    # the work directory, the comparison with a home and the manifest all see the resolved dtype: a mini-sized
    # vocabulary records what it recorded before the knob (nothing), a real one on a native-bf16 CPU 'bfloat16'
    import dflash_core.prepare.pipeline as P
    from dflash_core.runtime.target import TargetRuntime

    class Resolved(Exception):
        pass

    seen = {}

    def fake_work_dir(out, cfg):
        seen["cfg"] = cfg
        raise Resolved

    monkeypatch.setattr(P, "work_dir", fake_work_dir)
    monkeypatch.setattr(P, "train_in_bf16", lambda device="cpu": native)
    rt = TargetRuntime.from_model(build_tiny(TinySpec(dtype="float32", pattern="CACA", vocab_size=vocab,
                                                      hidden_size=32, intermediate_size=64)))
    cfg = tiny_prepare_config()
    assert cfg.teacher_dtype == "auto" and "teacher_dtype" not in cfg.to_dict()
    with pytest.raises(Resolved):
        prepare("tiny", home=tmp_path / "home", cfg=cfg, rt=rt, progress=False)
    assert seen["cfg"].teacher_dtype == want
    assert seen["cfg"].to_dict().get("teacher_dtype") == (None if want == "float32" else want)
    padded = vocab >= 16384  # the tiny target is an LFM2, a type that pads exactly
    assert seen["cfg"].teacher_batching == ("padded" if padded else "length")
    assert seen["cfg"].to_dict().get("teacher_batching") == ("padded" if padded else None)


@pytest.mark.parametrize("vocab, want", [(64, "accuracy"), (16384, "loss")])
def test_prepare_resolves_the_selection_rule_for_the_targets_vocabulary(tmp_path, monkeypatch, vocab, want):
    # the drafter trains (and the config is compared and recorded) with the rule resolved: loss at a real vocabulary,
    # accuracy below it, where the recorded config stays what the reference bundle's manifest holds
    import dflash_core.prepare.pipeline as P
    from dflash_core.runtime.target import TargetRuntime

    class Trained(Exception):
        pass

    seen = {}

    def fake_train(rt, trajs, dcfg, tcfg, **kw):
        seen["tcfg"] = tcfg
        raise Trained

    monkeypatch.setattr(P, "train_drafter", fake_train)
    rt = TargetRuntime.from_model(build_tiny(TinySpec(dtype="float32", pattern="CACA", vocab_size=vocab,
                                                      hidden_size=32, intermediate_size=64)))
    cfg = tiny_prepare_config()
    assert cfg.train.select == "auto"
    with pytest.raises(Trained):
        prepare("tiny", home=tmp_path / "home", cfg=cfg, rt=rt, progress=False)
    assert seen["tcfg"].select == want
    recorded = replace(cfg, train=seen["tcfg"]).to_dict()["train"]
    assert recorded.get("select") == (None if want == "accuracy" else want)
    # seed_labels is resolved the same way: the target's own labels at a real vocabulary, the text below it
    assert recorded.get("seed_labels") == ("target" if want == "loss" else None)
    assert cfg.to_dict()["train"] == {k: v for k, v in recorded.items() if k not in ("select", "seed_labels")}
