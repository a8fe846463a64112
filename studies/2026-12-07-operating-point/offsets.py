"""Width model probe (the operating-point study): plain dflash's tokens per target call on replayed decodes of 96
tokens, by where the decode starts in a 512-token greedy continuation (0 = at the prompt, as the benchmark decodes).
Run from the repository root: `python studies/2026-12-07-operating-point/offsets.py` (the mini home imported)."""

from collections import defaultdict

import torch

from dflash_core.bench.replay import ReplayRuntime, segments, trajectories
from dflash_core.methods import get_method
from dflash_core.prepare.pipeline import load_prepared
from dflash_core.runtime.decode import greedy, speculative
from dflash_core.runtime.target import load_target
from dflash_core.store.data import load_prompts


def main() -> None:
    torch.set_num_threads(2)
    rt = load_target("mini", "cpu", "float32")
    prep = load_prepared(rt)
    ps = load_prompts("code")
    build = get_method("dflash").build
    for name, texts in (("calibration", ps.calibration[:4]), ("benchmark", ps.benchmark)):
        ids = [rt.encode(t) for t in texts]
        conts = [greedy(rt, p, 512)[0] for p in ids]
        segs = segments(trajectories(rt, ids, conts, tuple(prep.drafter.cfg.taps)), 96, 48)
        rr = ReplayRuntime(rt, segs)
        for w in (7, 16):
            by: dict[int, list[int]] = defaultdict(lambda: [0, 0])
            for s in segs:
                start = len(s.prompt) - len(ids[s.source])
                out, st = speculative(rr, build(rr, prep), list(s.prompt), 96, w)
                by[start][0] += len(out)
                by[start][1] += st.target_calls
            print(name, "w", w, " ".join(f"{k}:{v[0] / v[1]:.2f}" for k, v in sorted(by.items())), flush=True)


if __name__ == "__main__":
    main()
