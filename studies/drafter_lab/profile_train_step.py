"""Profile one drafter training step at a real target's shape: where the time of a step goes.

A random frozen embedding/head of the target's vocabulary and hidden size, random taps for 16 sequences of 80
rows (the default batch: 16 sequences x 8 anchors x block 16 = 2,048 head rows), the prepare drafter on top.
Each variant runs `--steps` steps after one warm-up; the JSON gives wall and process-CPU milliseconds per
step (CPU time is the figure to trust on a shared machine: with 1 thread it is the step's own work) and,
with `--ops`, torch.profiler's top ops of one more step.

    python -m studies.drafter_lab.profile_train_step --shape 350m --threads 1 [--steps 2] \
        [--variants reference,fp32,bf16]

Variants: `reference` is the earlier loss (the head applied to every block row's 4-D view, full
logits and their gradient materialised); `fp32` and `bf16` are `train.block_loss` (chunked exact
cross-entropy) with float32 / bfloat16 head matmuls; `+rows` adds `train.sample_rows` (the rows reaching the
head importance-sampled by their loss weight); in `bf16` variants the drafter's own matmuls run under bf16
autocast too (`train.matmul_autocast`). Not a test: timings are never asserted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from dflash_core.prepare import train as T  # noqa: E402
from dflash_core.prepare.teacher import TeacherData  # noqa: E402
from dflash_core.runtime.drafter import DrafterConfig, init_drafter  # noqa: E402

SHAPES = {"mini": (384, 2048, (1, 2, 3)), "135m": (576, 49152, (1, 14, 27)), "350m": (1024, 65536, (1, 7, 13))}


def reference_loss(drafter, embed, head, tok, ft, anc, gamma):
    """The pre-issue-29 loss: full logits of every block row through the 4-D head call, then F.cross_entropy."""
    B = drafter.cfg.block_size
    n, M = anc.shape
    x, pos, ctx_pos, mask = T.block_inputs(drafter, embed, tok, anc)
    h = drafter(x, ft, pos, ctx_pos, mask).view(n, M, B + 1, -1)[:, :, 1:]
    logits = head(h)
    labels = tok.gather(1, (anc.unsqueeze(-1) + 1 + torch.arange(B)).view(n, -1)).view(n, M, B)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none").view(n, M, B)
    w = torch.exp(-torch.arange(B, dtype=torch.float32) / gamma)
    return (ce * w).sum(-1).mean() / w.sum()


def setup(shape: str, seqs: int = 16, rows: int = 80, draft_vocab: int = 0):
    H, V, taps = SHAPES[shape]
    torch.manual_seed(0)
    dcfg = DrafterConfig(hidden_size=H, vocab_size=V, taps=taps, block_size=16, num_layers=1, num_heads=4,
                         intermediate_size=2 * H, mask_token_id=0, draft_vocab=min(draft_vocab, V))
    embed = nn.Embedding(V, H)
    nn.init.normal_(embed.weight, std=0.02)
    head = nn.Linear(H, V, bias=False)
    head.weight = embed.weight  # tied, frozen: as on LFM2 and SmolLM2
    embed.weight.requires_grad_(False)
    data = TeacherData([torch.randint(3, V, (rows,)).tolist() for _ in range(seqs)], [16] * seqs,
                       [torch.randn(rows - 1, len(taps) * H) for _ in range(seqs)])
    return dcfg, embed, head, data


def one_step(variant: str, drafter, opt, embed, head, data, anchors: int, gen) -> None:
    idx = list(range(len(data)))
    anc = T.draw_anchors(data, idx, anchors, drafter.cfg.block_size, "continuation", gen)
    tok, ft = T._batch(data, idx)
    if variant == "reference":
        loss = reference_loss(drafter, embed, head, tok, ft, anc, 4.0)
    else:
        dt = torch.bfloat16 if variant.startswith("bf16") else torch.float32
        keep = T.sample_rows(len(idx), anchors, drafter.cfg.block_size, 4.0, gen) if variant.endswith("+rows") else None
        with T.matmul_autocast(dt):
            loss, _ = T.block_loss(drafter, embed, head, tok, ft, anc, 4.0, compute_dtype=dt, keep=keep)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def top_ops(step) -> list[dict]:
    """torch.profiler's six costliest ops of one step (self CPU time: wall time inside each op)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    with tprofile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    return [{"op": e.key, "self_cpu_ms": e.self_cpu_time_total / 1000, "calls": e.count}
            for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:6]]


def profile(shape: str, variant: str, steps: int, anchors: int, ops: bool, draft_vocab: int = 0) -> dict:
    dcfg, embed, head, data = setup(shape, draft_vocab=draft_vocab)
    drafter = init_drafter(dcfg, 0)
    if dcfg.draft_vocab:  # prepare's head over K draft ids (an ascending map, as prepare's; which ids: no matter here)
        drafter.set_draft_map(torch.arange(dcfg.draft_vocab))
    opt = torch.optim.AdamW(drafter.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    one_step(variant, drafter, opt, embed, head, data, anchors, gen)  # warm-up
    wall, cpu = [], []
    for _ in range(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        one_step(variant, drafter, opt, embed, head, data, anchors, gen)
        wall.append(1000 * (time.perf_counter() - t0))
        cpu.append(1000 * (time.process_time() - c0))
    top = top_ops(lambda: one_step(variant, drafter, opt, embed, head, data, anchors, gen)) if ops else []
    H, V, _ = SHAPES[shape]
    return {"shape": shape, "hidden": H, "vocab": V, "draft_vocab": dcfg.draft_vocab, "variant": variant,
            "head_rows": 16 * anchors * 16,
            "wall_ms": wall, "cpu_ms": cpu, "cpu_ms_min": min(cpu), "top_ops": top}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), action="append")
    ap.add_argument("--variants", default="reference,fp32,bf16,fp32+rows,bf16+rows")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--anchors", type=int, default=8)
    ap.add_argument("--ops", action="store_true", help="also profile the top ops of one step (torch.profiler)")
    ap.add_argument("--draft-vocab", type=int, default=0, help="the drafter's head over K draft ids, as prepare's "
                    "at a real vocabulary (K 8,192 on SmolLM2, 16,384 at 350M); 0: the full vocabulary")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    out = []
    for shape in a.shape or ["135m", "350m"]:
        for v in a.variants.split(","):
            r = profile(shape, v, a.steps, a.anchors, a.ops, a.draft_vocab)
            top = f" (top op {r['top_ops'][0]['op']} {r['top_ops'][0]['self_cpu_ms']:.0f} ms)" if a.ops else ""
            print(f"{shape} {v}: cpu {r['cpu_ms_min']:.0f} ms/step, wall {min(r['wall_ms']):.0f} ms{top}",
                  file=sys.stderr, flush=True)
            out.append(r)
    json.dump({"threads": a.threads, "torch": torch.__version__, "results": out}, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
