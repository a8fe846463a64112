"""studies/2026-11-30-drafter-variants/drafter_variants.py on the tiny prepared target: one row per variant, sane
figures, JSON written."""

from __future__ import annotations

import json

import pytest

from dflash_core.errors import BadInputError
from dflash_core.prepare.pipeline import PrepareConfig
from studies.drafter_lab import variants as V

from ..support.helpers import load_file


def load_script():
    return load_file("studies/2026-11-30-drafter-variants/drafter_variants.py")


@pytest.fixture(scope="module")
def result(tiny_prepared, tmp_path_factory):
    """The script's main on the tiny checkpoint (random seeds, PrepareConfig defaults but 6 steps)."""
    out = tmp_path_factory.mktemp("variants") / "variants.json"
    doc = load_script().main(["--target", str(tiny_prepared.path), "--steps", "6", "--rounds", "7",
                              "--out", str(out)])
    return doc, out


def test_one_row_per_variant_with_expected_shape(result):
    doc, _ = result
    rows = doc["rows"]
    assert [r["variant"] for r in rows] == ["block8", "layers2", "block16"]
    assert [(r["layers"], r["block_size"]) for r in rows] == [(1, 8), (2, 8), (1, 16)]
    for r in rows:
        acc = r["heldout_position_accuracy"]
        assert len(acc) == r["block_size"]
        assert all(0.0 <= a <= 1.0 for a in acc)
        assert r["train_seconds"] > 0 and r["draft_seconds_median"] > 0 and r["draft_seconds_iqr"] >= 0
        assert r["draft_calls"] == 7 and r["steps_run"] == 6
        assert [f["positions"] for f in r["at"]] == ([8, 16] if r["block_size"] == 16 else [8])
        for f in r["at"]:
            assert f["expected_accepted"] == pytest.approx(V.expected_accepted(acc[:f["positions"]]))
            assert f["accepted_per_draft_second"] == pytest.approx(f["expected_accepted"] / r["draft_seconds_median"])
    assert rows[1]["parameters"] > rows[0]["parameters"] == rows[2]["parameters"]
    # one held-out split for all: the same number of held-out trajectories everywhere
    assert {r["heldout_sequences"] for r in rows} == {doc["heldout_trajectories"]}
    assert doc["winner"]["variant"] in {"block8", "layers2", "block16"}


def test_json_written_matches_returned_document(result):
    doc, out = result
    assert json.loads(out.read_text()) == json.loads(json.dumps(doc))


def test_expected_accepted_formulas():
    acc = [0.5, 0.8, 0.25]
    assert V.expected_accepted(acc) == pytest.approx(0.5 + 0.4 + 0.1)
    assert V.expected_accepted_nested(acc) == pytest.approx(0.5 + 0.5 + 0.25)
    assert V.expected_accepted([1.0] * 4) == V.expected_accepted_nested([1.0] * 4) == 4.0


def test_different_splits_are_refused():
    base = PrepareConfig()
    trajs = [[5] * 15] * 10 + [[6] * 30] * 30  # 15 tokens: kept at block 8, dropped at block 16
    cfgs = [V.variant_config(base, v) for v in V.default_variants()]
    with pytest.raises(BadInputError, match="different held-out"):
        V.check_same_split(trajs, cfgs)


def test_bad_trajectories_and_steps_are_refused(tmp_path):
    bad = tmp_path / "t.json"
    bad.write_text(json.dumps({"sequences": [[1, 2, 999]]}))
    with pytest.raises(BadInputError, match="vocabulary"):
        V.load_trajectories(bad, 96)
    with pytest.raises(BadInputError, match="--steps"):
        V.variant_config(PrepareConfig(), V.default_variants()[0], 0)
