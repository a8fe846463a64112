"""Tokens per target call per task family of a prompt family's benchmark prompts: dflash, suffix_dflash (two
min_match values) and a suffix lookup with no drafter behind it (prompt lookup over prompt + output, what
transformers' prompt_lookup_num_tokens does), all at the same widths, every output checked against greedy ids.

Deterministic (no timing): rounds, matches and acceptance are the decode's own. The share of rounds the match
proposed is the share of drafter runs suffix_dflash skips.

    python studies/2026-12-07-suffix-and-target-labels/families.py [--target mini|DIR] [--home DIR] --out F.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


class LookupOnly:
    """Prompt lookup: the suffix match's continuation, or nothing (the round is a plain greedy step)."""

    taps: tuple = ()
    max_width = None

    def __init__(self, min_match: int):
        from dflash_core.methods.support.suffix import SuffixIndex

        self.index = SuffixIndex(min_match, max(min_match, 8))

    def begin(self, prompt, hidden):
        self.index.sync(prompt)

    def propose(self, prefix, k):
        from dflash_core.runtime.decode import Proposal

        self.index.sync(prefix)
        hit = self.index.match()
        return Proposal(ids=self.index.continuation(hit[1], k) if hit else [],
                        meta={"suffix_rounds": int(hit is not None)})

    def observe(self, hidden):
        return None


def main(argv=None) -> dict:
    import torch

    from dflash_core.methods import get_method
    from dflash_core.prepare.prepared import load_prepared
    from dflash_core.runtime.decode import DecodeStats, greedy, speculative
    from dflash_core.runtime.target import load_target
    from dflash_core.store.artifacts import target_identity
    from dflash_core.store.data import load_all_families

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="mini")
    ap.add_argument("--home", default=None)
    ap.add_argument("--family", default=None, help="prompt family (default: the prepared home's)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--widths", default="4,8")
    ap.add_argument("--no-drafter", action="store_true", help="lookup only: a target without a prepared home")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    torch.set_num_threads(2)
    rt = load_target(a.target, "cpu", "float32", home=a.home)
    prep = None if a.no_drafter else load_prepared(rt, home=a.home)
    seeds = prep.manifest.get("seeds", {}) if prep else {}
    family = a.family or seeds.get("family") or ("code" if rt.name == "mini" else "english")
    ps = {p.family: p for p in load_all_families()}[family]
    tasks = list(ps.benchmark_tasks) or [family] * len(ps.benchmark)
    prompts = [rt.encode(t) for t in ps.benchmark]
    refs = [greedy(rt, p, a.tokens)[0] for p in prompts]
    variants = {"lookup_only_n2": lambda: LookupOnly(2), "lookup_only_n4": lambda: LookupOnly(4)}
    if prep is not None:
        variants.update({"dflash": lambda: get_method("dflash").build(rt, prep),
                         "suffix_dflash_n4": lambda: get_method("suffix_dflash").build(rt, prep, min_match=4),
                         "suffix_dflash_n2": lambda: get_method("suffix_dflash").build(rt, prep, min_match=2)})
    rows = []
    for w in (int(x) for x in a.widths.split(",")):
        for name, build in variants.items():
            per: dict[str, list] = {}
            for p, ref, task in zip(prompts, refs, tasks):
                out, st = speculative(rt, build(), list(p), a.tokens, w, method=name)
                if out != ref:
                    raise SystemExit(f"{name} w{w} diverged from greedy on a {task} prompt")
                per.setdefault(task, []).append(st)
            for task, sts in [*per.items(), ("all", [s for v in per.values() for s in v])]:
                m = DecodeStats.merge(sts)
                matched = int(m.meta.get("suffix_rounds", 0))
                rows.append({"width": w, "method": name, "task": task, "prompts": len(sts),
                             "tokens_per_target_call": round(m.tokens_per_target_call, 4),
                             "target_calls": m.target_calls, "drafted_rounds": m.draft_calls,
                             "matched_rounds": matched, "acceptance_rate": round(m.acceptance_rate, 4)})
    doc = {"target": a.target, "family": family, "model_sha256": target_identity(rt)["content_sha256"],
           "drafter_sha256": prep.manifest["files"]["drafter.safetensors"]["sha256"] if prep else None,
           "tokens": a.tokens, "rows": rows}
    Path(a.out).write_text(json.dumps(doc, indent=1), encoding="utf-8")
    for r in rows:
        print(json.dumps(r))
    return doc


if __name__ == "__main__":
    main()
