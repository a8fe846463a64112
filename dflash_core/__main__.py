"""Command line: `python -m dflash_core {prepare,run,methods,check,bench,report,compare,gate,export,import,
export-drafter}`.

stdout carries results only (with --json exactly one JSON document); progress and logs go to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from . import __version__, options
from .bench.config import check_widths_fit
from .errors import REPORT_UNWRITTEN, BadInputError, DFlashError, guarded
from .prepare import distributed as dist
from .prepare.bundle import check_export_out, export_bundle, import_bundle
from .prepare.model_card import find_report, measured_tau, model_card
from .prepare.traindata import load_train_text
from .quiet import quiet_third_party
from .runtime.checkpoint import resolve_target_source
from .runtime.decode import greedy
from .runtime.device import check_device_name, resolve_device, resolve_dtype
from .runtime.devicecheck import device_check
from .runtime.exactness import classify
from .runtime.target import load_target
from .safeio import check_writable_dir, read_json
from .store.artifacts import MANIFEST, check_home, mini_target_dir, target_identity
from .store.prompt_file import read_prompt_file

# Which table options each command takes (dflash_core.options: flag, environment variable, default, checks).
RUN_OPTIONS = options.for_command("run")
PREPARE_OPTIONS = options.for_command("prepare")
BENCH_OPTIONS = options.for_command("bench")
EXPORT_OPTIONS = options.for_command("export")
EXPORT_DRAFTER_OPTIONS = options.for_command("export-drafter")
IMPORT_OPTIONS = options.for_command("import")
# What `bench` hands to the child pytest as options (the child reads the environment through the same table).
BENCH_FORWARDED = tuple(name for name in BENCH_OPTIONS if options.option(name).pytest)


class MethodIds:
    """`run --method`'s choices, read from the registry only when argparse needs them (checking a value or
    printing help), so `--version` and `methods` do not import torch just to build the parser."""

    def _ids(self) -> list[str]:
        from .methods import method_ids  # lazy: pulls torch in (--help stays fast)

        return method_ids()

    def __iter__(self):
        return iter(self._ids())

    def __contains__(self, value) -> bool:
        return value in self._ids()


def _version() -> str:
    return f"dflash-mini-lab {__version__}"


def _quiet(a) -> None:
    """Before a command loads a model (after its arguments were checked: importing transformers takes seconds):
    transformers' bars and known fallback warnings are hidden unless -v (dflash_core.quiet)."""
    quiet_third_party(a.verbose)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m dflash_core", description=__doc__)
    ap.add_argument("--version", action="version", version=_version())
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="store_true",
                        help="also show transformers' progress bars and its known kernel fallback warnings")
    sub = ap.add_subparsers(dest="cmd", required=True)

    def add(name: str, **kw) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], **kw)

    p = add("prepare", help="build the mini target (if asked), train the drafter, fit method artifacts")
    for name in PREPARE_OPTIONS:
        options.add_cli_option(p, name)
    p.add_argument("--refresh", action="store_true", help="rebuild even when verified artifacts exist")
    p.add_argument("--no-progress", action="store_true")
    r = add("run", help="decode one prompt with one method and print text + stats")
    for name in RUN_OPTIONS:
        options.add_cli_option(r, name)
    r.add_argument("--method", required=True, choices=MethodIds(), metavar="METHOD",
                   help="method id: %(choices)s (`python -m dflash_core methods` describes them)")
    r.add_argument("--prompt", required=True)
    r.add_argument("--tokens", type=int, required=True, help="new tokens to decode (>= 0)")
    r.add_argument("--width", type=int, default=None, help="verify width 1..B (default: B); not for normal")
    r.add_argument("--eos", action="store_true", help="stop at the target's EOS token")
    r.add_argument("--no-check", action="store_true", help="skip the greedy reference comparison")
    r.add_argument("--json", action="store_true", help="one JSON document on stdout")
    mt = add("methods", help="list the method registry")
    mt.add_argument("--markdown", action="store_true", help="the README's methods table (generated from the registry)")
    c = add("check", help="device check: CUDA, name, memory, capability, versions, FP16 matmul")
    c.add_argument("--device", default="cuda")
    b = add("bench", help="prepare what is missing, run the benchmark matrix, write reports/<device>/")
    for name in BENCH_OPTIONS:
        options.add_cli_option(b, name)
    b.add_argument("--smoke", action="store_true", help="1 prompt, 8 tokens, 1 round")
    b.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    e = add("export", help="pack a verified target (mini: its weights) and its artifacts into one bundle")
    for name in EXPORT_OPTIONS:
        options.add_cli_option(e, name)
    e.add_argument("--out", required=True, help="bundle file to write (a .tar.gz)")
    i = add("import", help="verify a bundle from `export` and install it into the home")
    for name in IMPORT_OPTIONS:
        options.add_cli_option(i, name)
    i.add_argument("bundle", help="bundle file written by `export`")
    x = add("export-drafter", help="write the prepared drafter as a transformers DFlash checkpoint "
            "(config.json + model.safetensors, MuseGlimmerAssistantModel) with its model card README.md")
    for name in EXPORT_DRAFTER_OPTIONS:
        options.add_cli_option(x, name)
    x.add_argument("--out", required=True, help="directory to write (new or empty)")
    for name, text in REPORT_COMMANDS.items():  # listed here; main() hands their arguments to dflash_core.report
        sub.add_parser(name, help=text, add_help=False).add_argument("args", nargs=argparse.REMAINDER)
    return ap


# The report's commands (dflash_core.report.__main__), reachable here too: one CLI, one console script.
REPORT_COMMANDS = {
    "report": "rebuild the report from saved runs (run ids such as 0001, files or globs; several are pooled)",
    "compare": "compare two runs side by side: compare.html and compare.json",
    "gate": "judge NEW against BASE: exit 0 no regression, 1 regression, 3 inconclusive",
}


def report_argv(argv: list[str]) -> list[str] | None:
    """The argument list for `dflash_core.report.main` when `argv` names one of the report's commands, else None
    (`report ...` is the report's own first form; `compare` and `gate` keep their name)."""
    if not argv or argv[0] not in REPORT_COMMANDS:
        return None
    return list(argv[1:]) if argv[0] == "report" else list(argv)


def _optional(**kw) -> dict:
    """Keywords worth passing: the ones that are set (so an unset --revision reaches no function)."""
    return {k: v for k, v in kw.items() if v is not None}


def _resolve(a, names: tuple[str, ...]) -> list[str]:
    """Fill the table's options from the environment, then check what can be checked before any work: the home
    is a directory (or can become one) and a local --drafter directory is a DFlash drafter of sane size."""
    explicit = options.resolve(a, names)
    if "home" in names:
        check_home(a.home)
    if "drafter" in names and a.drafter and Path(a.drafter).expanduser().is_dir():
        from .prepare.drafter_format import resolve_drafter_source  # lazy: pulls torch in (--help stays fast)

        resolve_drafter_source(a.drafter)  # config.json schema and bounds, weight files regular
    return explicit



def check_device_args(device: str, dtype: str, kernels: str):
    """Device, dtype and kernel path, checked before anything is built or loaded. Returns the torch.device."""
    dev = resolve_device(check_device_name(device))
    tdtype = resolve_dtype(dtype, dev)
    if kernels in ("onednn", "tuned") and (dev.type != "cpu" or str(tdtype) != "torch.float32"):
        raise BadInputError(f"--kernels {kernels} is for CPU float32 targets (asked: {device} "
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
    kind, _ = resolve_target_source(target, home)
    if revision is not None and kind != "hub":
        raise BadInputError(f"--revision {revision!r} applies to hub ids only; {target!r} is a {kind} target: "
                            "drop --revision (DFLASH_REVISION) or name a hub id")


def cmd_methods(markdown: bool = False) -> int:
    from .methods import METHODS, markdown_table, method_ids  # lazy: pulls torch in (--help stays fast)

    if markdown:
        print(markdown_table())
        return 0
    for mid in method_ids():
        m = METHODS[mid]
        print(f"{m.index:02d}  {m.id:<22} {m.label:<28} {m.mechanism}")
    return 0


def cmd_prepare(a) -> int:
    from .prepare.pipeline import prepare  # lazy: pulls torch in (--help stays fast)

    _resolve(a, PREPARE_OPTIONS)
    _quiet(a)
    if a.train_data:  # hostile input is refused before any model is built or loaded
        load_train_text(a.train_data, "english")
    try:
        out = prepare(a.target, home=a.home, refresh=a.refresh, progress=not a.no_progress,
                      threads=a.threads, **_optional(revision=a.revision, drafter=a.drafter,
                                                     train_data=a.train_data, train_budget=a.train_budget,
                                                     train_seeds=a.train_seeds, teacher_dtype=a.teacher_dtype,
                                                     prepare_budget=a.prepare_budget, device=a.device))
    finally:
        dist.shutdown()  # under torchrun: leave the group before exit (a no-op in one process)
    print(out)
    return 0


def cmd_export(a) -> int:
    _resolve(a, EXPORT_OPTIONS)
    check_export_out(Path(a.out))
    check_target_args(a.target, a.home, None)
    _quiet(a)
    doc = export_bundle(a.out, a.target, a.home)
    print(json.dumps({"bundle": str(a.out), "target": a.target, "content_sha256": doc["target"]["content_sha256"],
                      "files": len(doc["files"])}))
    return 0


def cmd_export_drafter(a) -> int:
    """The verified prepared drafter of `--target` as a transformers checkpoint (AutoModel loads it, and
    `generate(assistant_model=..., speculation_type="dflash")` drafts with it)."""
    from .prepare.drafter_format import check_drafter_out, export_drafter  # lazy: pulls torch in (--help stays fast)
    from .prepare.prepared import load_prepared
    _resolve(a, EXPORT_DRAFTER_OPTIONS)
    check_drafter_out(Path(a.out))
    check_target_args(a.target, a.home, a.revision)
    _quiet(a)
    rt = load_target(a.target, "cpu", "float32", home=a.home, kernels="eager", **_optional(revision=a.revision))
    prepared = load_prepared(rt, home=a.home)  # refuses (with the prepare to run) when there is no drafter
    ident = target_identity(rt)
    cfg = prepared.drafter.cfg
    measured = _drafter_report(prepared, ident)
    card = model_card(ident, prepared.manifest, rt.info.get("kind", "local"), cfg.to_dict(), measured_tau(measured))
    out = export_drafter(prepared.drafter, rt.config, a.out, ident, card=card)
    print(json.dumps({"out": str(out), "target": a.target, "block_size": cfg.block_size + 1,
                      "mask_token_id": cfg.mask_token_id, "target_layer_ids": list(cfg.taps),
                      "benchmark_report": measured is not None}))
    return 0


def default_width(method: str, report: dict | None, block_size: int) -> tuple[int, str]:
    """`run`'s width when --width is not given, and why: the width the last benchmark of this model chose for the
    method (its own, `settings.method_widths`, where recorded), else that benchmark's ranking width, else the
    drafter's block size B, said as such."""
    if isinstance(report, dict):
        st = report.get("settings") if isinstance(report.get("settings"), dict) else {}
        own = (st.get("method_widths") or {}).get(method) if isinstance(st.get("method_widths"), dict) else None
        sel = own.get("selected") if isinstance(own, dict) else None
        rk = (report.get("ranking") or {}).get("width") if isinstance(report.get("ranking"), dict) else None
        for w, why in ((sel, f"the width the last benchmark of this model chose for {method}"),
                       (rk, "the ranking width the last benchmark of this model chose")):
            if isinstance(w, int) and not isinstance(w, bool) and 1 <= w <= block_size:
                return w, why
    return block_size, f"the drafter's block size B (no benchmark of this model found in {_reports_root()})"


def _reports_root() -> Path:
    reports = options.env_value("reports")
    return Path(reports) if reports else Path(__file__).resolve().parents[1] / "reports"


def _drafter_report(prepared, ident: dict) -> dict | None:
    """A benchmark.json of this drafter on this target, for the model card's tokens per target call: searched in
    the report root `bench` writes to (DFLASH_REPORTS, else reports/ beside the package)."""
    from .prepare.prepared import DRAFTER_FILE  # lazy: pulls torch in (--help stays fast)
    from .report.schema import check_benchmark  # lazy: jsonschema, paid only by the commands that read a report

    sha = ((prepared.manifest.get("files") or {}).get(DRAFTER_FILE) or {}).get("sha256")
    return find_report([_reports_root()], sha, ident.get("content_sha256"), check=check_benchmark)


def cmd_import(a) -> int:
    _resolve(a, IMPORT_OPTIONS)
    print(json.dumps(import_bundle(a.bundle, a.home)))
    return 0


def cmd_run(a) -> int:
    from .methods import get_method  # lazy: pulls torch in (--help stays fast)

    _resolve(a, RUN_OPTIONS)
    info = get_method(a.method)
    check_run_args(a, info)
    _quiet(a)

    import torch

    from .methods.runner import run_method  # lazy: pulls torch in (--help stays fast)
    from .prepare.pipeline import load_prepared, prepare
    torch.set_num_threads(a.threads)
    where = _optional(revision=a.revision)
    if a.target == "mini":
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
    width = a.width
    if info.build is not None and width is None:
        width, why = default_width(a.method, _drafter_report(prepared, target_identity(rt)),
                                   prepared.drafter.cfg.block_size)
        print(f"[run] width {width}: {why} (--width to choose)", file=sys.stderr)
    ids, stats = run_method(a.method, rt, prepared, prompt_ids, a.tokens, width, stop_at_eos=a.eos)
    doc = {"method": a.method, "target": a.target, "device": str(rt.device),
           "dtype": str(rt.dtype).replace("torch.", ""),  # as --dtype spells it
           "kernels": rt.kernels, "kernel_layouts": rt.info.get("kernel_layouts"),
           "prompt": a.prompt, "prompt_ids": prompt_ids, "ids": ids, "text": rt.decode(ids),
           "stats": stats.to_dict()}
    doc["stats"].pop("margins", None)
    if not a.no_check:
        ref, gst = greedy(rt, prompt_ids, a.tokens, stop_at_eos=a.eos, record_margins=True)
        v = classify(ids, ref, gst.margins, rt.dtype)
        doc["exactness"] = {"verdict": v.kind, "position": v.position, "gap": v.gap}
        # the greedy reference ran anyway: its wall time over the method's is the speedup of this one decode
        # (one unpaired, unwarmed run each, not a benchmark: `bench` measures speedups in paired rounds)
        if stats.wall_seconds > 0 and info.build is not None:
            doc["speedup_vs_greedy"] = {"speedup": gst.wall_seconds / stats.wall_seconds, "kind": "one-shot, unpaired",
                                        "greedy_seconds": gst.wall_seconds, "method_seconds": stats.wall_seconds,
                                        "note": "one unpaired, unwarmed decode each; bench measures paired rounds"}
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
        if "speedup_vs_greedy" in doc:
            sp = doc["speedup_vs_greedy"]
            print(f"one-shot speedup vs greedy (unpaired, unwarmed): {sp['speedup']:.2f}x ({sp['greedy_seconds']:.3f} "
                  f"s / {sp['method_seconds']:.3f} s; one decode each, not a measurement: `bench` measures paired "
                  "rounds)", file=sys.stderr)
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
    from .prepare.pipeline import prepare  # lazy: pulls torch in (--help stays fast)

    options.check_environment()  # every DFLASH_* knob the child pytest will read, before prepare
    options.check_pytest_args(list(a.pytest_args))
    explicit = _resolve(a, BENCH_OPTIONS)
    bench_dir = Path(__file__).resolve().parents[1] / "benchmarks"
    if not (bench_dir / "test_decode.py").is_file():
        raise BadInputError(f"no benchmarks/ next to the dflash_core package ({bench_dir}): `bench` runs from a "
                            "clone of the lab (pip install -e .), not from an installed wheel")
    check_device_args(a.device, a.dtype, a.kernels)
    check_target_args(a.target, a.home, a.revision)
    if a.calibration_from:
        from .bench.reuse import load_reused  # lazy: pulls torch in (--help stays fast)

        load_reused(a.calibration_from)  # unknown methods or bad options: exit 2 before prepare
    if a.prompts_file:
        read_prompt_file(a.prompts_file)  # a bad file: exit 2 before prepare (held-out: checked in the session)
    reports = options.env_value("reports")
    root = Path(reports) if reports else bench_dir.parent / "reports"
    # before any work: an unwritable report folder failed only after the whole benchmark had run
    check_writable_dir(root / a.device.split(":")[0], "the report folder", BadInputError,
                       "set DFLASH_REPORTS to a folder you can write")
    _quiet(a)
    env = dict(os.environ)
    if not a.verbose:  # the child pytest's transformers bars (its conftest hides the fallback warnings)
        env.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if a.home is not None:
        env["DFLASH_HOME"] = str(a.home)
    if a.revision is not None:
        env["DFLASH_REVISION"] = a.revision
    # Builds (or verifies) the artifacts on CPU float32, whatever the benchmark device.
    out = prepare(a.target, home=a.home, threads=options.env_value("threads"),
                  **_optional(revision=a.revision, drafter=a.drafter))
    check_bench_widths(Path(out), list(a.pytest_args))
    env["DFLASH_PREPARED"] = str(out)  # the child's session loads the target once instead of preparing again
    dev = a.device.split(":")[0]
    # pytest-benchmark's own default storage (./.benchmarks/<machine>/), where `pytest-benchmark compare 0001 0002`
    # and `python -m dflash_core.report 0001 0002` look: the README's compare block runs on these runs as written.
    args = [sys.executable, "-m", "pytest", str(bench_dir), "-p", "no:cacheprovider", "--benchmark-autosave",
            "--benchmark-storage=file://.benchmarks", "--benchmark-columns=median,iqr,rounds",
            "--benchmark-sort=name"]
    args += [f"{options.option(name).pytest}={getattr(a, name)}" for name in BENCH_FORWARDED if name in explicit]
    if a.smoke:
        args.append("--smoke")
    started = time.time()
    rc = subprocess.call(args + list(a.pytest_args), env=env)
    if rc == REPORT_UNWRITTEN:  # the plugin said why in the line above; the saved run itself was written
        raise BadInputError(f"the benchmark ran but its report could not be written to {root / dev} (see the line "
                            "above); the saved run is kept in .benchmarks/: make the folder writable (or set "
                            "DFLASH_REPORTS) and rebuild it with python -m dflash_core.report on that run")
    written = root / dev / "benchmark.json"
    if written.is_file() and written.stat().st_mtime >= started - 1:
        print(f"report: {root / dev / 'index.html'} (report.html, benchmark.json)", file=sys.stderr)
        sys.stderr.flush()
        print(_headline_of(written))  # the answer, last: after pytest-benchmark's tables and the report's path
    else:
        print(f"no report was written (pytest exit {rc})", file=sys.stderr)
    if rc not in (0, 1):  # pytest's usage error, interruption or internal error: not a failed exactness gate
        raise BadInputError(f"the benchmark's pytest stopped with exit code {rc} before finishing: see its output "
                            "above")
    return rc


def _headline_of(benchmark_json: Path) -> str:
    """The report's finding for the terminal: its detail sentence (benchmark.json `headline`), then its answer
    (`answer`: the leader's speedup over greedy with its interval, the width, the target, what the noise allows) as
    the very last line, where a reader's eye lands after pytest-benchmark's tables."""
    doc = read_json(benchmark_json, "report", BadInputError, "rebuild it with python -m dflash_core report SAVED")
    text = doc.get("headline") if isinstance(doc, dict) else None
    ans = doc.get("answer") if isinstance(doc, dict) else None
    detail = f"dflash headline: {text}\n" if isinstance(text, str) else ""
    return detail + (f"dflash answer: {ans}" if isinstance(ans, str) else "dflash answer: none (the report has none)")


def check_bench_widths(artifacts: Path, pytest_args: list[str]) -> None:
    """Widths above the prepared drafter's block size B, refused once, before the child pytest starts (it
    refused them in each of its cases)."""
    given = options.env_value("widths")
    flag = options.option("widths").pytest
    for i, arg in enumerate(pytest_args):
        if arg == flag and i + 1 < len(pytest_args):
            given = options.option("widths").parse(pytest_args[i + 1], flag)
        elif arg.startswith(flag + "="):
            given = options.option("widths").parse(arg.split("=", 1)[1], flag)
    if given == "auto":
        return
    doc = read_json(artifacts / MANIFEST, "manifest", BadInputError, "run `python -m dflash_core prepare --refresh`")
    block = ((doc.get("drafter") or {}).get("config") or {}).get("block_size") if isinstance(doc, dict) else None
    if isinstance(block, int):
        check_widths_fit([int(w) for w in str(given).split(",")], block, f"DFLASH_WIDTHS / --bench-widths {given}")


def _export_mini_seed(a) -> None:
    """--mini-seed reaches every mini_target_dir and the child pytest of `bench` as DFLASH_MINI_SEED (and
    --rebuild-mini prepare's ensure_target as DFLASH_REBUILD_MINI)."""
    if getattr(a, "mini_seed", None) is not None:
        os.environ["DFLASH_MINI_SEED"] = str(a.mini_seed)
    if getattr(a, "rebuild_mini", None):  # read by prepare's ensure_target, like the seed
        os.environ["DFLASH_REBUILD_MINI"] = "1"


def _dispatch(a) -> int:
    if a.cmd == "methods":
        return cmd_methods(a.markdown)
    if a.cmd == "check":
        print(json.dumps(device_check(a.device), indent=2))
        return 0
    commands = {"prepare": cmd_prepare, "bench": cmd_bench, "export": cmd_export, "import": cmd_import,
                "export-drafter": cmd_export_drafter, "run": cmd_run}
    options.check_environment()  # every DFLASH_* knob, whichever command reads it (a typo is not "false")
    return commands[a.cmd](a)


def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0 ok, 1 an exactness gate failed, 2 bad input (one `error:` line, no traceback).

    Every command runs inside one error boundary (`errors.guarded`): bad input, unreadable or unwritable files,
    a full disk and absurdly nested input all end as one `error:` line and exit 2, never a traceback (whose
    exit status 1 would read as a failed exactness gate).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    rest = report_argv(args)
    if rest is not None:
        from .report.__main__ import main as report_main  # its own parsers, exit codes and error boundary

        return report_main(rest)
    a = build_parser().parse_args(args)
    _export_mini_seed(a)
    return guarded(_dispatch, a)


def cli() -> None:
    """The `dflash-lab` console script."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
