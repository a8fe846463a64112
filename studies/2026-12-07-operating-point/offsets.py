"""Width model probe (the operating-point study): plain dflash's tokens per target call on replayed decodes of 96
tokens, by where the decode starts in a 512-token greedy continuation (0 = at the prompt, as the benchmark decodes).
Run from the repository root: `python studies/2026-12-07-operating-point/offsets.py` (the mini home imported)."""
import sys, time, torch
from collections import defaultdict
from dflash_core.prepare.pipeline import load_prepared
from dflash_core.runtime.target import load_target
from dflash_core.runtime.decode import greedy, speculative
from dflash_core.store.data import load_prompts
from dflash_core.bench.replay import trajectories, segments, ReplayRuntime
from dflash_core.methods import get_method
torch.set_num_threads(2)
rt = load_target("mini", "cpu", "float32")
prep = load_prepared(rt)
ps = load_prompts("code")
B = prep.drafter.cfg.block_size
for name, texts in (("calibration", ps.calibration), ("benchmark", ps.benchmark)):
    ids = [rt.encode(t) for t in texts]
    conts = [greedy(rt, p, 512)[0] for p in ids]
    trajs = trajectories(rt, ids, conts, tuple(prep.drafter.cfg.taps))
    segs = segments(trajs, 96, 48)
    rr = ReplayRuntime(rt, segs)
    build = get_method("dflash").build
    for w in (7, 16):
        by = defaultdict(lambda: [0, 0])
        for s in segs:
            start = len(s.prompt) - len(ids[s.source])
            out, st = speculative(rr, build(rr, prep), list(s.prompt), 96, w)
            by[start][0] += len(out); by[start][1] += st.target_calls
        print(name, "w", w, " ".join(f"{k}:{v[0]/v[1]:.2f}" for k, v in sorted(by.items())), flush=True)
