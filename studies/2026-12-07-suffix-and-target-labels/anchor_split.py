"""Today's held-out accuracy of a prepared drafter split by where the anchor sits: inside the seed text (labels:
the human token, or the target's own argmax) or from the last seed token on (the anchors a decode drafts from).
No training: the drafter, trajectories and split are the prepared home's (train_drafter's own split rule).

    python studies/2026-12-07-suffix-and-target-labels/anchor_split.py [--target mini|DIR] [--home DIR] --out F.json
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


def main(argv=None) -> dict:
    import torch

    from dflash_core.prepare.prepared import load_prepared
    from dflash_core.prepare.teacher import TeacherData
    from dflash_core.prepare.train import (
        TrainConfig,
        heldout_eval,
        prompt_predictions,
        split_trajectories,
        trajectories_taps,
    )
    from dflash_core.runtime.target import load_target

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="mini")
    ap.add_argument("--home", default=None)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    torch.set_num_threads(2)
    rt = load_target(a.target, "cpu", "float32", home=a.home)
    prep = load_prepared(rt, home=a.home)
    drafter, man = prep.drafter, prep.manifest
    recorded = man["prepare_config"]["train"]
    tc = TrainConfig(**{k: v for k, v in recorded.items() if k in TrainConfig.__dataclass_fields__})
    trajs = json.loads((prep.directory / "trajectories.json").read_text())
    B = drafter.cfg.block_size
    data = TeacherData(trajs["sequences"], trajs["prompt_lens"])
    data = data.select([i for i, s in enumerate(data.sequences) if len(s) > B + 2])  # train_drafter's filter
    _, val = split_trajectories(len(data), tc.seed, tc.val_fraction)
    if len(val) > tc.val_sequences:
        val = sorted(random.Random(tc.seed + 2).sample(val, tc.val_sequences))
    # indexes stay the training data's: eval_anchors seeds each trajectory's anchors by its index
    data.taps = [None] * len(data)
    for i, t in zip(val, trajectories_taps(rt, [data.sequences[i] for i in val], drafter.cfg.taps)):
        data.taps[i] = t
    data.prompt_preds = prompt_predictions(rt, data.select(val))
    data.prompt_preds = {i: p for i, p in zip(val, data.prompt_preds)}
    idx = list(val)
    seeded = [i for i in idx if data.prompt_lens[i] >= 3]  # trajectories with an anchor inside the seed
    embed, head = rt.model.get_input_embeddings(), rt.model.get_output_embeddings()
    n = tc.anchors_per_sequence

    def ev(ids, rule, relabel=False):
        r = heldout_eval(drafter, embed, head, data, None, ids, n, tc.seed + 3, tc.batch_sequences, rule=rule,
                         relabel=relabel, compute_dtype=torch.float32)
        return {"position_accuracy": [round(x, 4) for x in r.accuracy], "accepted": round(r.accepted, 4)}

    plen = [data.prompt_lens[i] for i in idx]
    seed_share = sum(max(0, min(p - 2, len(data.sequences[i]) - B - 1)) for i, p in zip(idx, plen)) / sum(
        len(data.sequences[i]) - B - 1 for i in idx)  # of the anchors rule 'all' draws from, inside the seed
    agree = [(data.prompt_preds[i] == torch.tensor(data.sequences[i][1:data.prompt_lens[i]])).float()
             for i in idx if data.prompt_lens[i] > 1]
    doc = {"target": a.target, "model_sha256": man["target"]["content_sha256"], "drafter_sha256":
           man["files"]["drafter.safetensors"]["sha256"], "block": B, "heldout_trajectories": len(idx),
           "seed_anchor_share_of_rule_all": round(seed_share, 4),
           "target_argmax_equals_seed_token": round(float(torch.cat(agree).mean()), 4) if agree else None,
           "today_all_anchors": ev(idx, "all"),
           "seed_anchors_text_labels": ev(seeded, "seed"),
           "seed_anchors_target_labels": ev(seeded, "seed", relabel=True),
           "decode_anchors": ev(idx, "continuation")}
    Path(a.out).write_text(json.dumps(doc, indent=1), encoding="utf-8")
    print(json.dumps(doc, indent=1))
    return doc


if __name__ == "__main__":
    main()
