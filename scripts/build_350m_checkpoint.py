"""Save a random-init checkpoint of the exact LFM2.5-350M-Base architecture with a real tokenizer.

`dflash_core.testing.build_real_350m` (hidden 1024, 16 layers, vocab 65,536; random weights, seed 0) saved with
the tokenizer of another checkpoint whose ids fit the vocabulary (e.g. the SmolLM2 directory written by
scripts/convert_smollm2.py: 49,152 ids), so `prepare --target OUT` runs the whole pipeline at the real shape:

    python scripts/build_350m_checkpoint.py --tokenizer-from smollm2-135m --out lfm2-350m-random

The config keeps the 350M's special ids only where the tokenizer has no own (bos/eos/pad come from the
tokenizer, so decoding and the mask-token rule see consistent ids). Weights: float32, ~1.4 GB.

When to run: once per machine, before measuring the 350M architecture's prepare or bench (docs/real-targets.md,
"Measuring the goals").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> None:
    from transformers import AutoTokenizer

    from dflash_core.testing import build_real_350m

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer-from", required=True, type=Path, help="a checkpoint directory with a tokenizer")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    tok = AutoTokenizer.from_pretrained(str(a.tokenizer_from), local_files_only=True)
    model = build_real_350m("float32", seed=a.seed)
    if len(tok) > model.config.vocab_size:
        sys.exit(f"error: the tokenizer has {len(tok)} ids, more than the model's {model.config.vocab_size}")
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if getattr(tok, name, None) is not None:
            setattr(model.config, name, getattr(tok, name))
            setattr(model.generation_config, name, getattr(tok, name))
    model.save_pretrained(str(a.out), safe_serialization=True)
    tok.save_pretrained(str(a.out))
    print(f"{a.out}: {sum(p.numel() for p in model.parameters()):,} parameters, tokenizer of {a.tokenizer_from} "
          f"({len(tok)} ids)")


if __name__ == "__main__":
    main()
