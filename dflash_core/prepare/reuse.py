"""What `prepare` may reuse instead of rebuilding, each proven by a hash before it is reused.

Why: `prepare --drafter DIR` with the home's own exported drafter took 35.9 min on 2 cores: it regenerated the
teacher trajectories although the target's own `trajectories.json` was in the home, and refit every method on a
drafter identical to the one those fits were made for. Two things are reusable:

* the teacher trajectories of the target's own artifacts, when their `teacher_key` matches: the same target
  content, the same RECIPE, the same tokens per seed and the same encoded train seeds (hashed), so they are the
  same greedy continuations; the file itself is verified against its manifest's SHA-256 first;
* every artifact of the target's own directory, when the imported drafter's weights and config hash to those of
  the home's own drafter (the fits are deterministic functions of the drafter, the trajectories and the config).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from ..errors import ArtifactError
from ..store.artifacts import file_entry, load_tensor_file, read_manifest, write_atomic


def seeds_sha256(seeds: list[list[int]]) -> str:
    return hashlib.sha256(json.dumps(seeds, separators=(",", ":")).encode()).hexdigest()


def teacher_key(identity: dict, recipe: str, traj_tokens: int, seeds: list[list[int]], runtime: str) -> str:
    """What the teacher trajectories are a function of: the target's content, the recipe, the continuation length,
    the encoded train seeds (which carry the family, the seed counts and the seed) and the numerics they were
    decoded with (`runtime`: dtype and kernel path; a float32 near-tie can flip between paths)."""
    doc = {"target_content_sha256": identity.get("content_sha256"), "recipe": recipe, "traj_tokens": int(traj_tokens),
           "seeds_sha256": seeds_sha256(seeds), "runtime": runtime}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def _trajectory_file(path: Path) -> tuple[list[list[int]], list[int]]:
    """(sequences, prompt lengths) of a trajectories.json, shapes checked."""
    doc = json.loads(path.read_text("utf-8"))
    seqs, lens = doc.get("sequences"), doc.get("prompt_lens")
    ok = (isinstance(seqs, list) and isinstance(lens, list) and len(seqs) == len(lens)
          and all(isinstance(s, list) and all(isinstance(t, int) for t in s) for s in seqs)
          and all(isinstance(n, int) and 0 < n for n in lens))
    if not ok:
        raise ArtifactError(f"{path} does not hold sequences and prompt lengths")
    return seqs, lens


def _subsequence(part: list, whole: list) -> bool:
    it = iter(whole)
    return all(any(x == y for y in it) for x in part)


def reusable_trajectories(directory: Path, identity: dict, key: str, *, recipe: str, seeds: list[list[int]],
                          traj_tokens: int, log) -> tuple | None:
    """(trajectories, their seeds, the held-out record) from `directory` when they are the ones this prepare would
    generate, else None. The manifest and every file it lists are verified first (`read_manifest`: SHA-256 and
    size); then its teacher key must be `key`. A manifest written before teacher keys is accepted when its recipe is
    `recipe` and every trajectory is one of `seeds` (in order; held-out leaks dropped) plus `traj_tokens` tokens."""
    try:
        doc = read_manifest(directory, identity, required=("trajectories.json",))
        seqs, lens = _trajectory_file(directory / "trajectories.json")
    except (ArtifactError, OSError, ValueError) as exc:
        if (directory / "manifest.json").exists():
            log.info("teacher trajectories in %s not reused: %s", directory, exc)
        return None
    teacher = doc.get("teacher") if isinstance(doc.get("teacher"), dict) else {}
    prefixes = [s[:n] for s, n in zip(seqs, lens)]
    if "key" in teacher:
        ok, why = teacher["key"] == key, f"teacher key {str(teacher['key'])[:12]} != {key[:12]}"
    else:
        ok = (doc.get("recipe") == recipe and all(len(s) == n + traj_tokens for s, n in zip(seqs, lens))
              and _subsequence(prefixes, seeds))
        why = "its recipe, seeds or lengths differ (a manifest without a teacher key)"
    if not ok:
        log.info("teacher trajectories in %s not reused: built for another target, recipe or seeds (%s)", directory,
                 why)
        return None
    held = doc.get("held_out") if isinstance(doc.get("held_out"), dict) else {}
    return seqs, prefixes, {**held, "reused_from": str(directory)}


def weights_sha256(state_dict: dict) -> str:
    """SHA-256 over every tensor's name, dtype, shape and bytes (float32 on CPU): a drafter's weights."""
    import torch

    h = hashlib.sha256()
    for name in sorted(state_dict):
        t = state_dict[name].detach().to(device="cpu", dtype=torch.float32).contiguous()
        h.update(f"{name}:{list(t.shape)};".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def drafter_sha256(config: dict, state_dict: dict) -> str:
    cfg = json.dumps(json.loads(json.dumps(config)), sort_keys=True)
    return hashlib.sha256((cfg + weights_sha256(state_dict)).encode()).hexdigest()


def same_as_own(imported, own: Path, identity: dict, required: tuple[str, ...], log) -> dict | None:
    """The verified manifest of the target's own artifacts when their drafter is `imported` (same config and
    weights by hash), else None."""
    try:
        doc = read_manifest(own, identity, required=required)
        blob = load_tensor_file(own / "drafter.safetensors")
        mine = drafter_sha256(blob["config"], blob["state_dict"])
    except (ArtifactError, KeyError, TypeError) as exc:
        if (own / "manifest.json").exists():
            log.info("the home's own artifacts in %s not reused: %s", own, exc)
        return None
    theirs = drafter_sha256(imported.cfg.to_dict(), imported.state_dict())
    if mine != theirs:
        log.info("the drafter differs from the home's own (sha256 %s != %s): fitting every method on it",
                 theirs[:12], mine[:12])
        return None
    doc["drafter_sha256"] = mine
    return doc


def copy_artifacts(src: Path, dst: Path, names: list[str]) -> dict[str, Any]:
    """Copy the listed files (already verified) and return their manifest entries, re-hashed where they land."""
    files = {}
    for name in names:
        write_atomic(dst / name, (src / name).read_bytes())
        files[name] = file_entry(dst / name)
    return files
