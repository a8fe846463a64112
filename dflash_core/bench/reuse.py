"""`--calibration-from RUN`: reuse another run's verify widths and calibrated options instead of choosing them.

Why: `--bench-widths auto` and every calibration are timing-based, so on a loaded machine two runs of one commit
chose different widths (6,12 vs 4,11) or options (dspark_lite's floor 0.35 vs 0.0), and their cases no longer
paired (report.match refuses them). A run that reuses BASE's choice measures exactly BASE's cases.

RUN is a saved pytest-benchmark run or a report's benchmark.json (a path, or a run id / glob under .benchmarks). The
file is hostile input: `savedruns.read_source` bounds its size, requires UTF-8 JSON without NaN and checks the part
it reads field by field (shapes, types, bounds); here every method id must be in the registry and every option valid
for its method (`MethodInfo.parse_options`). Runs that predate the `chosen` record give their choice through the
options each measured case ran with.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import BadInputError
from ..methods import METHODS
from ..savedruns import Reused, read_source, resolve_source
from .config import check_widths_fit


def check_registry(reused: Reused) -> Reused:
    """Keep the calibrated methods' options, each checked by its method; refuse unknown ids and bad options."""
    kept = {}
    for mid, per in reused.options.items():
        info = METHODS.get(mid)
        if info is None:
            raise BadInputError(f"{reused.source}: unknown method {mid!r} (a run of another lab version?): pass a "
                                "run of this version, or drop --calibration-from")
        if info.calibration is None:
            if any(per.values()):
                raise BadInputError(f"{reused.source}: {mid} is not calibrated, yet the run gives it options "
                                    f"{next(o for o in per.values() if o)}: pass a run of this lab version")
            continue
        for w, opts in per.items():
            try:
                info.parse_options(opts)
            except BadInputError as exc:
                raise BadInputError(f"{reused.source}: {mid} at width {w}: {exc}") from None
        kept[mid] = per
    for mid in reused.method_widths or {}:
        if mid not in METHODS:
            raise BadInputError(f"{reused.source}: unknown method {mid!r} in its own widths (a run of another lab "
                                "version?): pass a run of this version, or drop --calibration-from")
    return Reused(reused.source, reused.widths, kept, reused.ranking_width, reused.size, reused.method_widths)


def load_reused(text: str, storage: str | Path = ".benchmarks") -> Reused:
    """Resolve, read and check a --calibration-from source."""
    return check_registry(read_source(resolve_source(text, storage)))


def check_given_widths(reused: Reused, given) -> None:
    """--bench-widths and --calibration-from together must name the same widths (else which one wins is a guess)."""
    given = tuple(sorted(set(given or ())))
    if given and given != reused.widths:
        raise BadInputError(f"--bench-widths {','.join(map(str, given))} and --calibration-from {reused.source} "
                            f"(widths {','.join(map(str, reused.widths))}) disagree: drop one of them")


def apply_reused(sess, reused: Reused) -> None:
    """Give the session the reused widths and, for every calibrated method the run chose options for at every one
    of them, those options (the rest are calibrated as usual, `calibration.calibrate_all`)."""
    cfg = sess.cfg
    check_widths_fit(reused.widths, sess.block_size, f"--calibration-from {reused.source}",
                     "the run used another drafter: drop --calibration-from")
    check_given_widths(reused, cfg.calibration_widths)
    sess.bench_widths = list(reused.widths)
    sess.ranking_width = reused.ranking_width  # None (a run before it was recorded): chosen here on calibration
    sess.width_choice = {"reused_from": reused.source, "selected": list(reused.widths),
                         "rule": f"reused from {reused.source} (--calibration-from)"}
    own = dict(reused.method_widths or {})
    check_widths_fit(sorted(set(own.values())), sess.block_size, f"--calibration-from {reused.source}",
                     "the run used another drafter: drop --calibration-from")
    sess.method_widths = {m: {"selected": int(w), "reused_from": reused.source} for m, w in own.items()}
    for mid, per in reused.options.items():
        if not set(reused.widths) <= set(per):
            continue  # a method the run chose at other widths only: calibrate it here
        sess.width_options[mid] = {w: dict(o) for w, o in per.items()}
        top = dict(per[reused.widths[-1]])
        sess.options[mid] = top
        sess.calibration[mid] = {"reused_from": reused.source, "objective": f"reused from {reused.source} "
                                 "(--calibration-from)", "selected": top, "selected_options": top,
                                 "widths": {str(w): {"selected": dict(per[w]), "selected_options": dict(per[w])}
                                            for w in reused.widths}}
