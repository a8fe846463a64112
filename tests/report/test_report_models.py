"""Runs of different models side by side (dflash_core.report.models): never pooled, each model's own G1, the
statements that hold on every model, Kendall's tau between their orders, and the CLI's pages for them."""

from __future__ import annotations

import json
import math

import numpy as np

from dflash_core.report.__main__ import main as report_main
from dflash_core.report.models import compare_models, group_by_model

from ..support.timing import QUIET, TRUTH, draw_run
from .test_report_ranking import run_of


def _model(truth: dict[str, float], seed: int, weights: str) -> dict:
    rng = np.random.default_rng(seed)
    saved = run_of({k: np.exp(v).tolist() for k, v in draw_run(rng, truth, QUIET, 16).items()})
    saved["dflash"]["target"]["weights_sha256"] = weights * 64
    return saved


def _three_models():
    """A (the AMD build's order), A again (a second run of the same model), B (jump_mobs last, as the Intel build)."""
    flipped = dict(TRUTH)
    flipped["jump_mobs"] = math.log(0.90)
    return [_model(TRUTH, 1, "a"), _model(TRUTH, 2, "a"), _model(flipped, 3, "b")]


def test_models_are_ranked_apart_and_only_what_holds_on_all_is_stated():
    runs = _three_models()
    groups = group_by_model(runs, ["a1", "a2", "b"])
    assert [len(g[1]) for g in groups] == [2, 1]  # the two runs of A pool, B stands alone
    reports, cmp = compare_models(runs, ["a1", "a2", "b"])
    a, b = cmp["models"]
    assert a["runs"] == 2 and b["runs"] == 1 and a["model_sha256"] != b["model_sha256"]
    assert set(a["g1"]) == {"jump_mobs", "mobs"} and "jump_mobs" not in b["g1"]
    assert reports[0]["ranking"]["rounds"]["mobs"] == 32  # A's two runs pooled; B's rounds not among them
    held = " | ".join(cmp["statements"])
    assert "in G1 (may be the fastest) on every model: mobs" in held and "jump_mobs" not in held.split("G1")[1]
    assert "every method reproduced greedy exactly on every model" in held
    (k,) = cmp["kendall"]
    assert k["methods"] == 14 and 0.3 < k["tau"] < 1.0  # the same order but for jump_mobs
    assert cmp["joint_confidence"] == 0.9


def test_the_cli_writes_one_report_per_model_and_the_side_by_side_page(tmp_path, capsys):
    paths = []
    for i, run in enumerate(_three_models()):
        p = tmp_path / f"{i}.json"
        p.write_text(json.dumps(run))
        paths.append(str(p))
    assert report_main([*paths, "--out", str(tmp_path / "r")]) == 0
    base = tmp_path / "r" / "models"
    cmp = json.loads((base / "comparison.json").read_text())
    for m in cmp["models"]:
        doc = json.loads((base / m["model_sha256"][:16] / "cpu" / "benchmark.json").read_text())
        assert doc["runs"][0]["model_sha256"] == m["model_sha256"] and doc["headline"] == m["headline"]
        assert m["model_sha256"][:12] in doc["headline"]  # every finding names its model
    page = (base / "index.html").read_text()
    assert "id=kendall" in page and "Holds on every model" in page and cmp["summary"] in capsys.readouterr().out
