"""Rebuild the report from saved runs, compare two runs, or gate a run against a baseline.

  python -m dflash_core.report RUN [RUN ...] [--storage .benchmarks] [--out reports]
  python -m dflash_core.report compare BASE NEW [--out reports/compare] [gate options]
  python -m dflash_core.report gate BASE NEW [--storage .benchmarks] [--speedup-drop 0.05] [--tau-tolerance 0.005]
                                    [--min-rounds 3]

The same commands are `python -m dflash_core report|compare|gate ...` and `dflash-lab report|compare|gate ...`.
RUN, BASE and NEW are what `pytest-benchmark compare` accepts: a saved file, a run id (0001) or a glob, searched
under --storage; several runs of the same model and settings are pooled. Runs of different models are never
pooled: each model gets its own report under <out>/models/<model hash>/, and <out>/models/index.html (with
comparison.json) shows them side by side: each model's G1, what holds on all of them, Kendall's tau between their
orders. BASE and NEW may also be a report's benchmark.json. Runs of one model that chose different widths or
calibrated options are refused (exit 2) with the fix.
Exit codes: 0 ok / no regression, 1 exactness gate failed / regression found, 2 bad input, 3 (gate only)
inconclusive: no regression found, but some case could not be judged (fewer than --min-rounds rounds in a run, or no
spread measured). A speed change is judged with the ranking's statistic and rounds where the case was ranked, with an
interval that holds jointly over every case (dflash_core.stats.change): two runs of one model gate as a regression in
at most 5 % of pairs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .. import __version__
from ..errors import ReportInputError, guarded
from ..safeio import read_json
from ..savedruns import resolve_runs
from ..store.artifacts import write_atomic
from .build import SCHEMA, SCHEMA_VERSION, build_report, distinct_runs, load_saved, validate_saved
from .compare import compare, write_compare
from .gate import INCONCLUSIVE, NOT_JUDGED, GateConfig, counts, judge, threshold
from .models import compare_models, group_by_model, render_models
from .schema import check_benchmark
from .write import pooled_name, write_report


def _version() -> str:
    return f"dflash-mini-lab {__version__} (report schema {SCHEMA_VERSION})"


def _report_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m dflash_core.report", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=_version())
    ap.add_argument("saved", nargs="+", help="saved runs: file, run id (0001) or glob (pooled when several)")
    ap.add_argument("--storage", default=".benchmarks", help="pytest-benchmark storage folder searched for run ids")
    ap.add_argument("--out", default="reports", help="report root; files go to <out>/<device>/ (several runs pooled: "
                    "<out>/<device>/pooled-<run ids>/, beside the single run's report)")
    return ap


def _pair_parser(cmd: str, out: bool = False) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=f"python -m dflash_core.report {cmd}", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=_version())
    ap.add_argument("base", help="baseline: saved run (file, id, glob) or a benchmark.json")
    ap.add_argument("new", help="run to check: saved run (file, id, glob) or a benchmark.json")
    ap.add_argument("--storage", default=".benchmarks")
    if out:
        ap.add_argument("--out", default="reports/compare", help="folder for compare.html and compare.json")
    ap.add_argument("--speedup-drop", type=threshold, default=GateConfig.speedup_drop,
                    help="a regression when a case's joint 95 %% interval of the change lies below 0 and its median "
                         "dropped by more than this fraction (default %(default)s)")
    ap.add_argument("--tau-tolerance", type=threshold, default=GateConfig.tau_tolerance,
                    help="allowed relative drop of tokens per target call (default %(default)s)")
    ap.add_argument("--min-rounds", type=int, default=GateConfig.min_rounds,
                    help="speedup rounds each run needs before a case's speedup is judged (default %(default)s)")
    return ap


def _loaded(args: list[str], storage: str) -> tuple[list[dict], list[str], list[str]]:
    """The saved runs the arguments name, each read and checked once, and the distinct runs' sources; a run given
    more than once is said on stderr (the report pools it once and says so in its limitations)."""
    paths = resolve_runs(args, storage)
    docs, sources = [load_saved(p) for p in paths], [str(p) for p in paths]
    _, distinct, notes = distinct_runs(docs, sources)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    return docs, sources, distinct


def _build(args: list[str], storage: str) -> dict:
    docs, sources, _ = _loaded(args, storage)
    return build_report(docs, sources)


def _load_doc(arg: str, storage: str) -> dict:
    """A canonical benchmark.json as is, anything else as saved runs built into one (a file is read once, under
    the same limits as every saved run: safeio.read_json)."""
    if not Path(arg).exists() or Path(arg).is_dir():
        return _build([arg], storage)
    doc = read_json(arg, "benchmark file", ReportInputError, "pass a saved run or a report's benchmark.json")
    if isinstance(doc, dict) and doc.get("schema") == SCHEMA:
        if doc.get("schema_version") != SCHEMA_VERSION:
            raise ReportInputError(f"{arg}: benchmark.json schema_version {doc.get('schema_version')!r}, this lab "
                                   f"reads {SCHEMA_VERSION}: rebuild it with python -m dflash_core.report SAVED")
        check_benchmark(doc, arg)  # once, here: the gate, compare and their pages then read typed fields only
        return doc
    validate_saved(doc, arg)
    return build_report([doc], [arg])


def _side_by_side(docs: list[dict], sources: list[str], root: str) -> int:
    """Runs of several models: one report per model and the comparison page (report.models)."""
    reports, cmp = compare_models(docs, sources)
    base = Path(root) / "models"
    for doc, m in zip(reports, cmp["models"]):
        write_report(doc, base / m["model_sha256"][:16])
    base.mkdir(parents=True, exist_ok=True)
    write_atomic(base / "comparison.json", (json.dumps(cmp, indent=2, sort_keys=True, allow_nan=False) + "\n").encode())
    write_atomic(base / "index.html", render_models(cmp).encode("utf-8"))
    print(base)
    print(cmp["summary"])
    return 0 if all(d["exactness"]["all_exact"] for d in reports) else 1


def _judged(a, then=judge):
    """Load BASE and NEW and judge them (`then`: judge, or the comparison document built on it); a malformed
    document is bad input, not a crash."""
    base, new = _load_doc(a.base, a.storage), _load_doc(a.new, a.storage)
    cfg = GateConfig(a.speedup_drop, a.tau_tolerance, a.min_rounds)
    try:
        return then(base, new, cfg, (a.base, a.new))
    except (KeyError, TypeError) as exc:
        raise ReportInputError(f"a benchmark.json lacks or mistypes a field ({exc!r}): rebuild it with "
                               "python -m dflash_core.report SAVED") from exc


def print_gate(result) -> None:
    """Both runs' support, then every row that is not "no regression" (grouped by reason), then the verdict line
    with how many cases got each verdict."""
    print(f"gate: {result.base.line()}")
    print(f"gate: {result.new.line()}")
    for p in result.regressions():
        print(f"REGRESSION {p}")
    groups: dict[tuple[str, str], list[str]] = {}
    for r in result.rows:
        if r.verdict in (INCONCLUSIVE, NOT_JUDGED):
            for why in r.reasons:
                groups.setdefault((r.verdict, why), []).append(r.case)
    for (verdict, why), cases in groups.items():
        print(f"{verdict.upper()} ({len(cases)} case(s): {', '.join(cases)}): {why}")
    n = counts(result.rows)
    tally = ", ".join(f"{k} {v}" for k, v in n.items())
    print(f"gate: {result.verdict} ({tally}; of {sum(n.values())} case(s), normal the baseline; exit "
          f"{result.exit_code})")


def _gate(argv: list[str]) -> int:
    result = _judged(_pair_parser("gate").parse_args(argv))
    print_gate(result)
    return result.exit_code


def _compare(argv: list[str]) -> int:
    a = _pair_parser("compare", out=True).parse_args(argv)
    out = write_compare(_judged(a, compare), a.out)
    print(out / "compare.html")
    return 0


def _report(argv: list[str]) -> int:
    a = _report_parser().parse_args(argv)
    docs, sources, distinct = _loaded(a.saved, a.storage)
    if len(group_by_model(docs, sources)) > 1:
        return _side_by_side(docs, sources, a.out)
    doc = build_report(docs, sources)
    out = write_report(doc, a.out, pooled_name(distinct) if len(distinct) > 1 else None)
    print(out)
    return 0 if doc["exactness"]["all_exact"] else 1


def main(argv: list[str] | None = None) -> int:
    """Exit 0 ok, 1 exactness failed (report) or a regression found (gate), 3 the gate is inconclusive, 2 bad
    input: one `error:` line
    (errors.guarded: unreadable or unwritable files, a full disk, hostile JSON included)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--version"]:
        print(_version())
        return 0
    if argv[:1] == ["gate"]:
        return guarded(_gate, argv[1:])
    if argv[:1] == ["compare"]:
        return guarded(_compare, argv[1:])
    return guarded(_report, argv)


def cli() -> None:
    """The `dflash-lab-report` console script."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
