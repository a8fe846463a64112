"""Command line: `python -m dflash_core {prepare,run,methods}`.

stdout carries results only (with --json exactly one JSON document); progress and logs go to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .errors import BadInputError, DFlashError


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="mini", help="'mini' (default), a local checkpoint dir, or a hub id")
    p.add_argument("--home", default=None, help="artifact cache (default: $DFLASH_HOME or ~/.cache/dflash-mini-lab)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m dflash_core", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="build the mini target (if asked), train the drafter, fit method artifacts")
    _common(p)
    p.add_argument("--refresh", action="store_true", help="rebuild even when verified artifacts exist")
    p.add_argument("--no-progress", action="store_true")
    r = sub.add_parser("run", help="decode one prompt with one method and print text + stats")
    _common(r)
    r.add_argument("--method", required=True)
    r.add_argument("--prompt", required=True)
    r.add_argument("--tokens", type=int, required=True)
    r.add_argument("--width", type=int, default=None, help="verify width 1..B (default: B)")
    r.add_argument("--device", default="cpu")
    r.add_argument("--dtype", default="auto")
    r.add_argument("--kernels", default="auto", help="linear-layer path: auto, eager or onednn (CPU float32)")
    r.add_argument("--eos", action="store_true", help="stop at the target's EOS token")
    r.add_argument("--no-check", action="store_true", help="skip the greedy reference comparison")
    r.add_argument("--json", action="store_true", help="one JSON document on stdout")
    sub.add_parser("methods", help="list the method registry")
    c = sub.add_parser("check", help="device check: CUDA, name, memory, capability, versions, FP16 matmul")
    c.add_argument("--device", default="cuda")
    b = sub.add_parser("bench", help="prepare what is missing, run the benchmark matrix, write reports/<device>/")
    b.add_argument("--target", default="mini")
    b.add_argument("--device", default="cpu")
    b.add_argument("--dtype", default="auto")
    b.add_argument("--kernels", default="auto", help="linear-layer path: auto, eager or onednn (CPU float32)")
    b.add_argument("--smoke", action="store_true", help="1 prompt, 8 tokens, 1 round")
    b.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    return ap


def cmd_methods() -> int:
    from .methods import METHODS, method_ids

    for mid in method_ids():
        m = METHODS[mid]
        print(f"{m.index:02d}  {m.id:<22} {m.label:<28} {m.mechanism}")
    return 0


def cmd_prepare(a) -> int:
    from .prepare import prepare

    out = prepare(a.target, home=a.home, refresh=a.refresh, progress=not a.no_progress)
    print(out)
    return 0


def cmd_run(a) -> int:
    import torch

    from .exactness import classify
    from .methods import get_method
    from .prepare import load_prepared, prepare
    from .runner import run_method
    from .target import load_target

    torch.set_num_threads(a.threads)
    info = get_method(a.method)
    rt = load_target(a.target, a.device, a.dtype, home=a.home, kernels=a.kernels) if a.target != "mini" else None
    if rt is None:
        from .artifacts import mini_target_dir

        if not (mini_target_dir(a.home) / "config.json").is_file():
            print("[run] the mini target is not built yet: running `prepare` first", file=sys.stderr)
            prepare("mini", home=a.home)
        rt = load_target("mini", a.device, a.dtype, home=a.home, kernels=a.kernels)
    prepared = None
    if info.build is not None:
        try:
            prepared = load_prepared(rt, home=a.home, required=info.needs)
        except DFlashError as exc:
            print(f"[run] artifacts missing or stale ({exc}); running `prepare` first", file=sys.stderr)
            base = rt if a.device == "cpu" and str(rt.dtype) == "torch.float32" and rt.kernels == "eager" else None
            prepare(a.target, home=a.home, rt=base)
            prepared = load_prepared(rt, home=a.home, required=info.needs)
    prompt_ids = rt.encode(a.prompt)
    ids, stats = run_method(a.method, rt, prepared, prompt_ids, a.tokens, a.width, stop_at_eos=a.eos)
    doc = {"method": a.method, "target": a.target, "device": str(rt.device), "dtype": str(rt.dtype),
           "kernels": rt.kernels,
           "prompt": a.prompt, "prompt_ids": prompt_ids, "ids": ids, "text": rt.decode(ids),
           "stats": stats.to_dict()}
    doc["stats"].pop("margins", None)
    if not a.no_check:
        from .decode import greedy

        ref, gst = greedy(rt, prompt_ids, a.tokens, stop_at_eos=a.eos, record_margins=True)
        v = classify(ids, ref, gst.margins, rt.dtype)
        doc["exactness"] = {"verdict": v.kind, "position": v.position, "gap": v.gap}
    if a.json:
        print(json.dumps(doc, allow_nan=False))
    else:
        s = stats
        print(a.prompt + doc["text"])
        print("---", file=sys.stderr)
        print(f"method={a.method} width={s.width} tokens={s.new_tokens} target_calls={s.target_calls} "
              f"tokens/call={s.tokens_per_target_call:.2f} acceptance={s.acceptance_rate:.3f} "
              f"tok/s={s.tokens_per_second:.1f} per-position={[round(x, 2) for x in s.per_position_acceptance]}"
              + (f" exactness={doc['exactness']['verdict']}" if "exactness" in doc else ""), file=sys.stderr)
    if "exactness" in doc and doc["exactness"]["verdict"] == "diverged":
        return 1
    return 0


def cmd_bench(a) -> int:
    """The main job: pytest benchmarks with autosave; the report plugin writes reports/<device>/.

    pytest runs in a child process: `prepare` has already imported transformers (and its plugins' deps),
    which pytest could then no longer assertion-rewrite.
    """
    import subprocess

    from .prepare import prepare

    bench_dir = Path(__file__).resolve().parents[1] / "benchmarks"
    if not (bench_dir / "test_decode.py").is_file():
        raise BadInputError(f"no benchmarks/ next to the dflash_core package ({bench_dir}): `bench` runs from a "
                            "clone of the lab (pip install -e .), not from an installed wheel")
    prepare(a.target)  # builds (or verifies) the artifacts on CPU float32, whatever the benchmark device
    dev = a.device.split(":")[0]
    args = [sys.executable, "-m", "pytest", str(bench_dir), "-p", "no:cacheprovider", "--benchmark-autosave",
            f"--benchmark-storage=file://.benchmarks/{dev}", "--benchmark-columns=median,iqr,rounds",
            "--benchmark-sort=name", f"--target={a.target}", f"--device={a.device}", f"--dtype={a.dtype}",
            f"--kernels={a.kernels}"]
    if a.smoke:
        args.append("--smoke")
    rc = subprocess.call(args + list(a.pytest_args))
    import os

    root = Path(os.environ.get("DFLASH_REPORTS") or bench_dir.parent / "reports")
    print(f"report: {root / dev / 'index.html'} (report.html, benchmark.json)", file=sys.stderr)
    return rc


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        if a.cmd == "methods":
            return cmd_methods()
        if a.cmd == "prepare":
            return cmd_prepare(a)
        if a.cmd == "check":
            from .devicecheck import device_check

            print(json.dumps(device_check(a.device), indent=2))
            return 0
        if a.cmd == "bench":
            return cmd_bench(a)
        return cmd_run(a)
    except DFlashError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
