"""A user's benchmark prompts held out from what the drafter trained on (the held-out guard, run the other way).

Shipped prompts are held out at training time: every consumer of training text refuses or drops what shares an
8-unit n-gram with them. A user's prompts arrive after training, so the bench checks them against that text
instead: the prepared teacher trajectories (train seeds and the target's continuations, `trajectories.json`),
the training text the manifest records (the family's shipped corpus, or the `--train-data` source, re-read and
required to have the recorded SHA-256) and the family's calibration prompts (calibration must not see them).
A prompt that shares an n-gram is refused with the fix; a drafter given as a transformers checkpoint
(`--drafter`) was trained elsewhere, on text the lab cannot check, which the session logs.
"""

from __future__ import annotations

import logging

from ..errors import BadInputError
from ..prepare.pipeline import TRAJ_FILE
from ..prepare.traindata import load_train_text
from ..store.data import PromptSet, check_disjoint
from ..store.heldout import check_clean, decoder_of, held_out
from ..store.prompt_file import PromptFile

log = logging.getLogger(__name__)

FIX = "drop or rewrite that prompt in --prompts-file (benchmark prompts must be held out from training text)"


def check_user_prompts(rt, prepared, family: PromptSet, pf: PromptFile) -> dict:
    """Refuse the user's prompts where they share an n-gram with the drafter's training text or the calibration
    prompts; returns what was checked (the report's provenance)."""
    check_disjoint({"benchmark": pf.prompts, "calibration": family.calibration})
    held = held_out(pf.prompts)
    checked: dict = {"file": pf.path, "prompts": len(pf.prompts), "calibration_prompts": True}
    manifest = getattr(prepared, "manifest", {}) or {}
    if TRAJ_FILE not in (manifest.get("files") or {}):
        log.warning("--prompts-file: the drafter was not trained by this lab's prepare (no %s): its training text "
                    "cannot be checked against the prompts", TRAJ_FILE)
        return checked | {"training_text": "unknown (a drafter from elsewhere)"}
    decode = decoder_of(rt)
    if decode is not None:
        seqs = prepared.load_json(TRAJ_FILE).get("sequences") or []
        check_clean([decode(list(s)) for s in seqs], held, "--prompts-file: the drafter's teacher trajectories",
                    names=[f"trajectory {i}" for i in range(len(seqs))], fix=FIX)
        checked["trajectories"] = len(seqs)
    rec = manifest.get("train_data") if isinstance(manifest.get("train_data"), dict) else {}
    source = rec.get("source")
    if isinstance(source, str) and source:
        spec = None if source.startswith("shipped:") else source
        text = load_train_text(spec, family.family)
        if rec.get("sha256") and text.sha256 != rec["sha256"]:
            raise BadInputError(f"--prompts-file: the drafter trained on {source}, which has changed since (SHA-256 "
                                f"{text.sha256[:12]}... now, {str(rec['sha256'])[:12]}... then), so the prompts "
                                "cannot be checked as held out: restore that text, or prepare again")
        check_clean(text.texts, held, f"--prompts-file: the drafter's training text {source}",
                    names=list(text.names), fix=FIX)
        checked["training_text"] = {"source": source, "sha256": text.sha256}
    return checked
