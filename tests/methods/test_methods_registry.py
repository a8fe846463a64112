"""The method registry and what every method shares: one list, options dataclasses that refuse bad input,
needs derived from fitters, the one tie rule, missing artifacts named with their fix, no import cycle."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import FrozenInstanceError, fields

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dflash_core.errors import ArtifactError, BadInputError
from dflash_core.methods import METHOD_LIST, fit_files, fitters, get_method, method_ids, speculative_ids
from dflash_core.methods.jump import FUSED_FILE, JUMP_FILE
from dflash_core.methods.support.common import topk, topk_tensors
from dflash_core.methods.support.selector import PAIR_FILE

from ..support.strategies import METHOD_OPTIONS, tied_logits

NEW_FILES = {PAIR_FILE: "pair_selector", JUMP_FILE: "jump_head", FUSED_FILE: "fused_residual"}


# The 15 stable ids (test ids, benchmark names, report keys): a new method is added after them, never between.
STABLE_IDS = ("normal", "dflash", "dflash2", "mobs", "jump_mobs", "fused_jump", "boltzmann", "bmobs", "act",
              "dspark_lite", "boltzmann_v10", "gated_mobs_v11", "parareal_v12", "minop_v13", "simple_parareal_v14")


def test_registry_is_one_ordered_list_that_keeps_the_stable_ids():
    assert tuple(method_ids()[:len(STABLE_IDS)]) == STABLE_IDS
    assert [m.index for m in METHOD_LIST] == list(range(len(METHOD_LIST)))
    assert speculative_ids() == method_ids()[1:]
    for info in METHOD_LIST:
        assert len(info.stages) == 4 and all(isinstance(s, str) and s for s in info.stages)
        assert info.label and info.mechanism and info.complexity
    assert get_method("normal").build is None


def test_the_registry_owns_calibration_and_why_inactive():
    """Each calibrated method's entry holds its grid and search (or the method whose choice it reuses); bench runs
    the registry's `calibrated()` list, a reusing method after its source; every speculative method says why its
    draft can equal plain dflash's."""
    from dflash_core.methods import Calibration, calibrated

    cal = {m.id: m.calibration for m in calibrated()}
    ids = list(cal)
    assert [i for i in ids if i in STABLE_IDS] == ["act", "dspark_lite", "boltzmann_v10", "gated_mobs_v11", "minop_v13"]
    assert all(ids.index(i) > ids.index(c.reuses) for i, c in cal.items() if c.reuses)
    assert cal["act"].settings()[0] == {"tau": 0.0} and cal["boltzmann_v10"].search == "halving"
    assert cal["minop_v13"].reuses == "boltzmann_v10"
    assert cal["minop_v13"].adapt({"temperature": 0.1, "cutoff": 0.2, "budget": 2, "slope": 1.5}) == {
        "temperature": 0.1, "cutoff": 0.2, "slope": 1.5}
    assert all(info.why_inactive for info in METHOD_LIST[1:])
    with pytest.raises(ValueError, match="grid, or reuses"):
        Calibration()
    with pytest.raises(ValueError, match="adapt"):
        Calibration(reuses="act")


def test_needs_are_the_files_of_the_fitters():
    assert get_method("dflash2").needs == (PAIR_FILE,)
    assert get_method("jump_mobs").needs == (PAIR_FILE, JUMP_FILE)
    assert get_method("fused_jump").needs == (PAIR_FILE, FUSED_FILE)
    assert get_method("boltzmann").needs == () and get_method("act").needs == ()
    for info in METHOD_LIST:
        assert info.needs == tuple(f for fit in info.fitters for f in fit.files)
    names = [f.name for f in fitters()]
    assert len(names) == len(set(names)) and set(fit_files()) == {f for m in METHOD_LIST for f in m.needs}


def test_methods_never_import_prepare():
    """The registry is a leaf of prepare: importing every method must not import prepare (no cycle)."""
    code = ("import sys, dflash_core.methods; "
            "bad = [m for m in sys.modules if m in ('dflash_core.prepare.pipeline', 'dflash_core.bench.calibrate')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_options_strategy_covers_every_option_of_every_method():
    for info in METHOD_LIST[1:]:
        declared = {f.name for f in fields(info.options)} if info.options else set()
        assert set(METHOD_OPTIONS[info.id]) <= declared, info.id


@pytest.mark.parametrize("method", method_ids())
def test_unknown_option_is_refused_naming_the_valid_ones(tiny_prepared, method):
    """Every method, normal included, refuses an option it does not have (dflash used to accept any,
    mobs raised TypeError) and the message lists the options it does take."""
    from dflash_core.methods.runner import run_method

    info = get_method(method)
    valid = [f.name for f in fields(info.options)] if info.options else []
    with pytest.raises(BadInputError, match="no option|takes no options") as exc:
        run_method(method, tiny_prepared.rt, tiny_prepared.prepared, [5, 6], 2, bogus_option=1)
    assert "bogus_option" in str(exc.value) and all(name in str(exc.value) for name in valid)


@pytest.mark.parametrize("method,bad", [
    ("dflash2", {"top_k": 0}), ("mobs", {"top_k": 2.5}), ("jump_mobs", {"jump_weight": float("inf")}),
    ("fused_jump", {"min_margin": -1.0}), ("boltzmann", {"temperature": -1.0}), ("bmobs", {"top_k": True}),
    ("act", {"tau": float("nan")}), ("dspark_lite", {"floor": 1.0}), ("boltzmann_v10", {"temperature": 0.0}),
    ("gated_mobs_v11", {"budget": -1}), ("parareal_v12", {"correction_rounds": -1}),
    ("minop_v13", {"budget": 2}), ("simple_parareal_v14", {"max_corrections": 0.5})])
def test_out_of_range_option_is_refused(tiny_prepared, method, bad):
    name = next(iter(bad))
    with pytest.raises(BadInputError, match=name):
        get_method(method).build(tiny_prepared.rt, tiny_prepared.prepared, **bad)


def test_options_are_frozen_and_keep_their_defaults():
    opts = get_method("boltzmann_v10").parse_options({"budget": 2})
    assert (opts.temperature, opts.cutoff, opts.budget, opts.slope) == (0.03, 0.15, 2, 1.5)
    with pytest.raises(FrozenInstanceError):
        opts.budget = 3


# --- the one tie rule ---------------------------------------------------------------------------------

@given(logits=tied_logits(), data=st.data())
def test_topk_follows_the_tie_rule_with_any_number_of_ties(logits, data):
    """Higher value first, then the lower id, for any k and however many values tie at the boundary."""
    k = data.draw(st.integers(1, logits.shape[-1]), label="k")
    ids, vals = topk_tensors(logits, k)
    x = logits.float().tolist()
    want = [sorted(range(len(r)), key=lambda i: (-r[i], i))[:k] for r in x]
    assert ids.tolist() == want and vals.tolist() == [[r[i] for i in w] for r, w in zip(x, want)]
    assert topk(logits, k) == (want, vals.tolist())


def test_fit_examples_follow_the_tie_rule(tiny_prepared):
    """The 02-05 fit data ranks candidates by the tie rule too (it used raw torch.topk)."""
    from dflash_core.methods.base import FitContext
    from dflash_core.methods.support.examples import draft_examples
    from dflash_core.prepare.prepared import load_prepared
    from dflash_core.runtime.target import load_target
    from dflash_core.testing import tiny_prepare_config

    rt = load_target(str(tiny_prepared.path), "cpu", "float32")  # a fresh runtime and drafter: edited below
    drafter = load_prepared(rt, home=tiny_prepared.home).drafter
    ctx = FitContext(rt, drafter, [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14]], [3], tiny_prepare_config(), "code")
    with torch.no_grad():
        head = rt.model.get_output_embeddings()
        head.weight[10:40] = head.weight[10]  # thirty tokens with identical logits: ties at every row
        ex = draft_examples(ctx, top_k=16, with_target=False)
    ids, vals = ex.topk_ids.tolist(), ex.topk_vals.tolist()
    for row_ids, row_vals in zip((r for e in ids for r in e), (r for e in vals for r in e)):
        assert list(zip([-v for v in row_vals], row_ids)) == sorted(zip([-v for v in row_vals], row_ids))


# --- artifacts: heads in the manifest, missing files refused --------------------------------------------

def test_prepare_stores_the_new_heads(tiny_prepared):
    man = tiny_prepared.prepared.manifest
    for fname, fit in NEW_FILES.items():
        assert man["files"][fname]["bytes"] > 0 and len(man["files"][fname]["sha256"]) == 64
        meta = man["fits"][fit]
        assert meta["examples"] > 0 and meta["steps"] > 0 and meta["loss_final"] is not None
    blob = tiny_prepared.prepared.load_torch(PAIR_FILE)
    assert blob["config"]["vocab_size"] == tiny_prepared.rt.vocab_size
    assert set(blob["state_dict"]) >= {"a.weight", "b.weight", "gate.weight", "gate.bias"}


@pytest.mark.parametrize("method,missing", [("dflash2", PAIR_FILE), ("mobs", PAIR_FILE), ("bmobs", PAIR_FILE),
                                            ("jump_mobs", JUMP_FILE), ("fused_jump", FUSED_FILE)])
def test_missing_artifact_names_the_prepare_to_run(tiny_prepared, tmp_path, method, missing):
    from dflash_core.prepare.prepared import load_prepared

    home = tmp_path / "home"
    shutil.copytree(tiny_prepared.home, home)
    out = next((home / "artifacts").iterdir())
    man = json.loads((out / "manifest.json").read_text())
    del man["files"][missing]
    (out / "manifest.json").write_text(json.dumps(man))
    rt = tiny_prepared.rt
    prep = load_prepared(rt, home=home)  # the drafter alone still verifies
    with pytest.raises(ArtifactError, match=rf"lacks '{missing}'.*python -m dflash_core prepare --target .* --refresh"):
        get_method(method).build(rt, prep)
    with pytest.raises(ArtifactError, match=rf"lacks '{missing}'.*prepare"):
        load_prepared(rt, home=home, required=get_method(method).needs)




def test_every_fitter_holds_out_whole_trajectories_by_one_policy(tiny_prepared):
    """One hold-out policy for every fit (the heads of 02-05 used to hold out every 5th trajectory, the
    corrections a seeded permutation): a seeded split by trajectory, recorded in the manifest."""
    fits = tiny_prepared.prepared.manifest["fits"]
    assert set(fits) == {f.name for f in fitters()}
    for name, meta in fits.items():
        assert meta["split"] == "by trajectory (seeded permutation)", name
        train, hold = set(meta["train_trajectories"]), set(meta["holdout_trajectories"])
        assert train and hold and train.isdisjoint(hold), name


def test_readme_methods_table_is_the_registrys():
    """README's methods table is `python -m dflash_core methods --markdown` (regenerate it after a registry change)."""
    from pathlib import Path

    from dflash_core.methods import markdown_table

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    block = readme.split("<!-- methods:start -->", 1)[1].split("<!-- methods:end -->", 1)[0].strip()
    assert block == markdown_table(), "README methods table is stale: paste `python -m dflash_core methods --markdown`"
