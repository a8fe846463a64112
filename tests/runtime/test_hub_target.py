"""Hub ids: the real target's id is accepted (huggingface_hub's own validation) and loads from a locally
populated hub cache with HF_HUB_OFFLINE=1 (no network), recording the resolved commit and the revision."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_core.errors import BadInputError, TargetNotFoundError
from dflash_core.runtime.target import load_target, resolve_target_source

REAL_ID = "LiquidAI/LFM2.5-350M-Base"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize("hub_id", [REAL_ID, "Qwen/Qwen2.5-0.5B", "meta-llama/Llama-3.1-8B"])
def test_hub_ids_with_dots_are_hub_ids(hub_id):
    assert resolve_target_source(hub_id) == ("hub", hub_id)


@pytest.mark.parametrize("bad", ["owner/na me", "owner/name..x", "a/b/c", "minii", "./missing", "/no/such/dir",
                                 "owner/-name"])
def test_malformed_names_are_refused_with_the_options(bad):
    with pytest.raises(TargetNotFoundError, match="not 'mini', not an existing directory"):
        resolve_target_source(bad)


def test_revision_is_for_hub_ids_only(tmp_path):
    from dflash_core.testing import TinySpec, build_tiny

    build_tiny(TinySpec(dtype="float32")).save_pretrained(tmp_path / "ckpt")
    with pytest.raises(BadInputError, match="hub ids only"):
        load_target(str(tmp_path / "ckpt"), "cpu", "float32", revision="main")


def _populate_hub_cache(cache: Path) -> Path:
    """The hub cache layout (refs/main -> snapshots/<commit>/...) holding a tiny LFM2 and a tokenizer."""
    from dflash_core.prepare import minitarget as mt
    from dflash_core.testing import TinySpec, build_tiny

    repo = cache / ("models--" + REAL_ID.replace("/", "--"))
    snap = repo / "snapshots" / COMMIT
    tcfg = mt.MiniTargetConfig(vocab_size=320, corpus_files=3, threads=1)
    tok = mt.train_tokenizer(mt.corpus_texts(tcfg), tcfg)
    build_tiny(TinySpec(dtype="float32", vocab_size=len(tok))).save_pretrained(snap)
    tok.save_pretrained(snap)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    return snap


PROBE = """
import json, sys
from dflash_core.errors import TargetNotFoundError
from dflash_core.runtime.target import load_target
out = {}
rt = load_target(sys.argv[1], "cpu", "float32")
out["main"] = {k: rt.info[k] for k in ("kind", "commit", "revision", "location")}
out["identity"] = rt.info["identity"]
out["encoded"] = rt.encode("def forward(self):")
pinned = load_target(sys.argv[1], "cpu", "float32", revision=sys.argv[2])
out["pinned"] = {k: pinned.info[k] for k in ("commit", "revision")}
out["pinned_identity"] = pinned.info["identity"]
try:
    load_target(sys.argv[1], "cpu", "float32", revision="no-such-branch")
except TargetNotFoundError as exc:
    out["bad_revision"] = str(exc)
print(json.dumps(out))
"""


def test_real_target_id_loads_from_an_offline_hub_cache(tmp_path):
    snap = _populate_hub_cache(tmp_path / "hub")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub"),
           "HF_HOME": str(tmp_path / "hf-home")}
    proc = subprocess.run([sys.executable, "-c", PROBE, REAL_ID, COMMIT], env=env, capture_output=True, text=True,
                          timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["main"] == {"kind": "hub", "commit": COMMIT, "revision": None, "location": str(snap)}
    assert out["identity"]["hub_commit"] == COMMIT and out["identity"]["name"] == REAL_ID
    assert out["encoded"][0] == 1 and len(out["encoded"]) > 2  # the snapshot's tokenizer, BOS first
    assert out["pinned"] == {"commit": COMMIT, "revision": COMMIT}
    assert out["pinned_identity"]["revision"] == COMMIT
    assert out["pinned_identity"]["content_sha256"] == out["identity"]["content_sha256"]
    assert "no-such-branch" in out["bad_revision"] and "--target /path/to/checkpoint" in out["bad_revision"]
    # Same weights as the snapshot folder passed by path: the same artifacts.
    local = load_target(str(snap), "cpu", "float32")
    assert local.info["identity"]["content_sha256"] == out["identity"]["content_sha256"]
