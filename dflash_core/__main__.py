"""Command line: `python -m dflash_core {prepare,run,methods,check,bench,export,import,export-drafter}`.

stdout carries results only (with --json exactly one JSON document); progress and logs go to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import options
from .errors import BadInputError, DFlashError

# Which table options each command takes (dflash_core.options: flag, environment variable, default, checks).
RUN_OPTIONS = ("target", "revision", "home", "threads", "device", "dtype", "kernels", "drafter")
PREPARE_OPTIONS = ("target", "revision", "home", "threads", "drafter", "train_data", "train_budget")
BENCH_OPTIONS = ("target", "revision", "home", "device", "dtype", "kernels", "drafter")
EXPORT_OPTIONS = ("target", "home")
EXPORT_DRAFTER_OPTIONS = ("target", "revision", "home")
IMPORT_OPTIONS = ("home",)
# What `bench` hands to the child pytest as options (the child reads the environment through the same table).
BENCH_FORWARDED = ("target", "device", "dtype", "kernels", "drafter")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m dflash_core", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="build the mini target (if asked), train the drafter, fit method artifacts")
    for name in PREPARE_OPTIONS:
        options.add_cli_option(p, name)
    p.add_argument("--refresh", action="store_true", help="rebuild even when verified artifacts exist")
    p.add_argument("--no-progress", action="store_true")
    r = sub.add_parser("run", help="decode one prompt with one method and print text + stats")
    for name in RUN_OPTIONS:
        options.add_cli_option(r, name)
    r.add_argument("--method", required=True)
    r.add_argument("--prompt", required=True)
    r.add_argument("--tokens", type=int, required=True, help="new tokens to decode (>= 0)")
    r.add_argument("--width", type=int, default=None, help="verify width 1..B (default: B); not for normal")
    r.add_argument("--eos", action="store_true", help="stop at the target's EOS token")
    r.add_argument("--no-check", action="store_true", help="skip the greedy reference comparison")
    r.add_argument("--json", action="store_true", help="one JSON document on stdout")
    sub.add_parser("methods", help="list the method registry")
    c = sub.add_parser("check", help="device check: CUDA, name, memory, capability, versions, FP16 matmul")
    c.add_argument("--device", default="cuda")
    b = sub.add_parser("bench", help="prepare what is missing, run the benchmark matrix, write reports/<device>/")
    for name in BENCH_OPTIONS:
        options.add_cli_option(b, name)
    b.add_argument("--smoke", action="store_true", help="1 prompt, 8 tokens, 1 round")
    b.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    e = sub.add_parser("export", help="pack a verified target (mini: its weights) and its artifacts into one bundle")
    for name in EXPORT_OPTIONS:
        options.add_cli_option(e, name)
    e.add_argument("--out", required=True, help="bundle file to write (a .tar.gz)")
    i = sub.add_parser("import", help="verify a bundle from `export` and install it into the home")
    for name in IMPORT_OPTIONS:
        options.add_cli_option(i, name)
    i.add_argument("bundle", help="bundle file written by `export`")
    x = sub.add_parser("export-drafter", help="write the prepared drafter as a transformers DFlash checkpoint "
                       "(config.json + model.safetensors, MuseGlimmerAssistantModel)")
    for name in EXPORT_DRAFTER_OPTIONS:
        options.add_cli_option(x, name)
    x.add_argument("--out", required=True, help="directory to write (new or empty)")
    return ap


def _optional(**kw) -> dict:
    """Keywords worth passing: the ones that are set (so an unset --revision reaches no function)."""
    return {k: v for k, v in kw.items() if v is not None}



def check_device_args(device: str, dtype: str, kernels: str):
    """Device, dtype and kernel path, checked before anything is built or loaded. Returns the torch.device."""
    from .runtime.device import check_device_name, resolve_device, resolve_dtype

    dev = resolve_device(check_device_name(device))
    tdtype = resolve_dtype(dtype, dev)
    if kernels == "onednn" and (dev.type != "cpu" or str(tdtype) != "torch.float32"):
        raise BadInputError(f"--kernels onednn is for CPU float32 targets (asked: {device} "
                            f"{str(tdtype).replace('torch.', '')}); use --kernels eager or auto")
    return dev


def check_run_args(a, info) -> None:
    """Everything `run` can check without a model: fail in a second, not after building the mini target."""
    if a.tokens < 0:
        raise BadInputError(f"--tokens {a.tokens}: the token budget must be an integer >= 0")
    if a.width is not None:
        if info.build is None:
            raise BadInputError(f"--width does not apply to {info.id!r} (it verifies no drafts): drop --width")
        if a.width < 1:
            raise BadInputError(f"--width {a.width}: the verify width must be an integer in 1..B (the drafter's "
                                "block size)")
    try:
        a.prompt.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadInputError(f"--prompt is not valid UTF-8 text ({exc.reason} at character {exc.start}): pass the "
                            "prompt as UTF-8") from exc
    if not a.prompt.strip():
        raise BadInputError("empty prompt: give at least one non-blank character of text")
    check_device_args(a.device, a.dtype, a.kernels)
    check_target_args(a.target, a.home, a.revision)


def check_target_args(target: str, home, revision: str | None) -> None:
    """The target's name (not its files) and that --revision goes with a hub id."""
    from .runtime.target import resolve_target_source

    kind, _ = resolve_target_source(target, home)
    if revision is not None and kind != "hub":
        raise BadInputError(f"--revision {revision!r} applies to hub ids only; {target!r} is a {kind} target: "
                            "drop --revision (DFLASH_REVISION) or name a hub id")


def cmd_methods() -> int:
    from .methods import METHODS, method_ids

    for mid in method_ids():
        m = METHODS[mid]
        print(f"{m.index:02d}  {m.id:<22} {m.label:<28} {m.mechanism}")
    return 0


def cmd_prepare(a) -> int:
    from .prepare.pipeline import prepare

    options.resolve(a, PREPARE_OPTIONS)
    if a.train_data:  # hostile input is refused before any model is built or loaded
        from .prepare.traindata import load_train_text

        load_train_text(a.train_data, "english")
    out = prepare(a.target, home=a.home, refresh=a.refresh, progress=not a.no_progress,
                  threads=a.threads, **_optional(revision=a.revision, drafter=a.drafter, train_data=a.train_data,
                                                 train_budget=a.train_budget))
    print(out)
    return 0


def cmd_export(a) -> int:
    from .prepare.bundle import export_bundle

    options.resolve(a, EXPORT_OPTIONS)
    check_target_args(a.target, a.home, None)
    doc = export_bundle(a.out, a.target, a.home)
    print(json.dumps({"bundle": str(a.out), "target": a.target, "content_sha256": doc["target"]["content_sha256"],
                      "files": len(doc["files"])}))
    return 0


def cmd_export_drafter(a) -> int:
    """The verified prepared drafter of `--target` as a transformers checkpoint (AutoModel loads it, and
    `generate(assistant_model=..., speculation_type="dflash")` drafts with it)."""
    from .prepare.artifacts import target_identity
    from .prepare.drafter_format import export_drafter
    from .prepare.prepared import load_prepared
    from .runtime.target import load_target

    options.resolve(a, EXPORT_DRAFTER_OPTIONS)
    check_target_args(a.target, a.home, a.revision)
    rt = load_target(a.target, "cpu", "float32", home=a.home, kernels="eager", **_optional(revision=a.revision))
    prepared = load_prepared(rt, home=a.home)  # refuses (with the prepare to run) when there is no drafter
    out = export_drafter(prepared.drafter, rt.config, a.out, target_identity(rt))
    cfg = prepared.drafter.cfg
    print(json.dumps({"out": str(out), "target": a.target, "block_size": cfg.block_size + 1,
                      "mask_token_id": cfg.mask_token_id, "target_layer_ids": list(cfg.taps)}))
    return 0


def cmd_import(a) -> int:
    from .prepare.bundle import import_bundle

    options.resolve(a, IMPORT_OPTIONS)
    print(json.dumps(import_bundle(a.bundle, a.home)))
    return 0


def cmd_run(a) -> int:
    from .methods import get_method

    options.resolve(a, RUN_OPTIONS)
    info = get_method(a.method)
    check_run_args(a, info)

    import torch

    from .methods.runner import run_method
    from .prepare.pipeline import load_prepared, prepare
    from .runtime.exactness import classify
    from .runtime.target import load_target

    torch.set_num_threads(a.threads)
    where = _optional(revision=a.revision)
    if a.target == "mini":
        from .prepare.artifacts import mini_target_dir

        if not (mini_target_dir(a.home) / "config.json").is_file():
            print("[run] the mini target is not built yet: running `prepare` first", file=sys.stderr)
            prepare("mini", home=a.home, threads=a.threads)  # restores this thread count itself
    rt = load_target(a.target, a.device, a.dtype, home=a.home, kernels=a.kernels, **where)
    prepared = None
    if info.build is not None:
        try:
            prepared = load_prepared(rt, home=a.home, required=info.needs, drafter=a.drafter)
        except BadInputError:
            raise  # an unusable --drafter: preparing again would not help
        except DFlashError as exc:
            print(f"[run] artifacts missing or stale ({exc}); running `prepare` first", file=sys.stderr)
            base = rt if a.device == "cpu" and str(rt.dtype) == "torch.float32" and rt.kernels == "eager" else None
            prepare(a.target, home=a.home, rt=base, threads=a.threads, drafter=a.drafter, **where)
            prepared = load_prepared(rt, home=a.home, required=info.needs, drafter=a.drafter)
    prompt_ids = rt.encode(a.prompt)
    ids, stats = run_method(a.method, rt, prepared, prompt_ids, a.tokens, a.width, stop_at_eos=a.eos)
    doc = {"method": a.method, "target": a.target, "device": str(rt.device), "dtype": str(rt.dtype),
           "kernels": rt.kernels,
           "prompt": a.prompt, "prompt_ids": prompt_ids, "ids": ids, "text": rt.decode(ids),
           "stats": stats.to_dict()}
    doc["stats"].pop("margins", None)
    if not a.no_check:
        from .runtime.decode import greedy

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
    which pytest could then no longer assertion-rewrite. The child reads the DFLASH_* knobs through the same
    options table, so only what was given on this command line is forwarded as an option (forwarding this
    parser's defaults would override the environment).
    """
    import os
    import subprocess

    from .prepare.pipeline import prepare

    explicit = options.resolve(a, BENCH_OPTIONS)
    bench_dir = Path(__file__).resolve().parents[1] / "benchmarks"
    if not (bench_dir / "test_decode.py").is_file():
        raise BadInputError(f"no benchmarks/ next to the dflash_core package ({bench_dir}): `bench` runs from a "
                            "clone of the lab (pip install -e .), not from an installed wheel")
    check_device_args(a.device, a.dtype, a.kernels)
    check_target_args(a.target, a.home, a.revision)
    env = dict(os.environ)
    if a.home is not None:
        env["DFLASH_HOME"] = str(a.home)
    if a.revision is not None:
        env["DFLASH_REVISION"] = a.revision
    # Builds (or verifies) the artifacts on CPU float32, whatever the benchmark device.
    prepare(a.target, home=a.home, threads=options.env_value("threads"),
            **_optional(revision=a.revision, drafter=a.drafter))
    dev = a.device.split(":")[0]
    args = [sys.executable, "-m", "pytest", str(bench_dir), "-p", "no:cacheprovider", "--benchmark-autosave",
            f"--benchmark-storage=file://.benchmarks/{dev}", "--benchmark-columns=median,iqr,rounds",
            "--benchmark-sort=name"]
    args += [f"{options.option(name).pytest}={getattr(a, name)}" for name in BENCH_FORWARDED if name in explicit]
    if a.smoke:
        args.append("--smoke")
    rc = subprocess.call(args + list(a.pytest_args), env=env)
    reports = options.env_value("reports")
    root = Path(reports) if reports else bench_dir.parent / "reports"
    print(f"report: {root / dev / 'index.html'} (report.html, benchmark.json)", file=sys.stderr)
    return rc


def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0 ok, 1 an exactness gate failed, 2 bad input (a clear `error:` line, no traceback)."""
    a = build_parser().parse_args(argv)
    try:
        if a.cmd == "methods":
            return cmd_methods()
        if a.cmd == "prepare":
            return cmd_prepare(a)
        if a.cmd == "check":
            from .runtime.devicecheck import device_check

            print(json.dumps(device_check(a.device), indent=2))
            return 0
        if a.cmd == "bench":
            return cmd_bench(a)
        if a.cmd == "export":
            return cmd_export(a)
        if a.cmd == "import":
            return cmd_import(a)
        if a.cmd == "export-drafter":
            return cmd_export_drafter(a)
        return cmd_run(a)
    except DFlashError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
