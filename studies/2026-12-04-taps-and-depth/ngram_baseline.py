"""A token n-gram model on the drafter's own training trajectories, scored exactly like the drafter's held-out
accuracy: what a drafter that ignores the target's hidden states would reach.

Why: the drafter's held-out accuracy at position 1 on SmolLM2 stays near 0.4 whatever its recipe; if counting
n-grams over the same trajectories reaches as much, the drafter is not yet using the taps (the target's hidden
states), and more of its recipe will not move it: the input side is where to look. Same held-out trajectories,
same seeded anchors and the same labels as `train.eval_accuracy`; a chained prediction at positions 2+ (its own
guesses as context), as a drafter drafts a block.

    python studies/2026-12-04-taps-and-depth/ngram_baseline.py --teacher-cache /tmp/real/teacher-full.pt \
        --out ngram.json
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter, defaultdict
from pathlib import Path


def fit(seqs, idx, n: int) -> list[dict]:
    """Next-token counts for contexts of 1..n tokens over every position of trajectories `idx`."""
    tables: list[dict] = [defaultdict(Counter) for _ in range(n)]
    for i in idx:
        s = seqs[i]
        for a in range(len(s) - 1):
            for k in range(1, n + 1):
                if a - k + 1 >= 0:
                    tables[k - 1][tuple(s[a - k + 1:a + 1])][s[a + 1]] += 1
    return tables


def predict(tables, ctx: list[int]) -> int | None:
    """The most frequent next token after the longest context seen (backoff), None when even one token is new."""
    for k in range(len(tables), 0, -1):
        c = tables[k - 1].get(tuple(ctx[-k:]))
        if c:
            return c.most_common(1)[0][0]
    return None


def main(argv=None) -> dict:
    import torch

    from dflash_core.prepare.teacher import TeacherData
    from dflash_core.prepare.train import TrainConfig, eval_anchors, split_trajectories

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--teacher-cache", required=True, help="studies.drafter_lab.arch's --teacher-cache file")
    ap.add_argument("--orders", default="1,2,3,4")
    ap.add_argument("--positions", type=int, default=4)
    ap.add_argument("--block", type=int, default=16, help="the drafter's block size (the anchors' range)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    blob = torch.load(a.teacher_cache, weights_only=True)  # the script's own scratch file: tensors and ints only
    t = TeacherData(**blob["teacher"])
    tc, B = TrainConfig(), a.block
    data = t.select([i for i, s in enumerate(t.sequences) if len(s) > B + 2])  # train_drafter's length filter
    train_ids, val_ids = split_trajectories(len(data), tc.seed, tc.val_fraction)
    if len(val_ids) > tc.val_sequences:
        val_ids = sorted(random.Random(tc.seed + 2).sample(val_ids, tc.val_sequences))
    anchors = {i: eval_anchors(data, i, tc.anchors_per_sequence, B, tc.anchors, tc.seed + 3).tolist()
               for i in val_ids}
    rows = []
    for n in (int(x) for x in a.orders.split(",")):
        tables = fit(data.sequences, train_ids, n)
        hits, total = [0] * a.positions, 0
        for i in val_ids:
            s = data.sequences[i]
            for anc in anchors[i]:
                ctx, total = list(s[:anc + 1]), total + 1
                for k in range(a.positions):
                    guess = predict(tables, ctx)
                    hits[k] += guess == s[anc + 1 + k]
                    ctx.append(-1 if guess is None else guess)
        rows.append({"order": n, "heldout_position_accuracy": [h / total for h in hits], "anchors": total})
        print(json.dumps({"order": n, "acc": [round(h / total, 3) for h in hits]}), file=sys.stderr)
    doc = {"teacher_cache": a.teacher_cache, "train_sequences": len(train_ids), "heldout_sequences": len(val_ids),
           "rows": rows}
    if a.out:
        Path(a.out).write_text(json.dumps(doc, indent=1), encoding="utf-8")
    return doc


if __name__ == "__main__":
    main()
