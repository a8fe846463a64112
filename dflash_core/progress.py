"""Progress through `logging`: timestamped lines wherever a long step runs (CLI, pytest, a notebook).

One line per step, nowhere twice: every long loop logs "desc: i/total, elapsed, ~left" at INFO (at most every
`every_s` seconds, and once when done), which the CLI prints to stderr and `pytest --log-cli-level=INFO` shows live.
There is no tqdm bar beside it: a bar only reaches a terminal (it is off under pytest, where a ~9-minute prepare
looked hung) and drawn beside the log line it said everything twice.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def ensure_console_logging(level: int = logging.INFO) -> None:
    """Give the lab's loggers a timestamped stderr handler when the application configured none.

    Under pytest (or any app that set up logging) the root logger has handlers and this does nothing, so the
    app decides what is shown; from the plain CLI or a script, prepare's progress still reaches stderr.
    """
    lg = logging.getLogger("dflash_core")
    if lg.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT, "%Y-%m-%d %H:%M:%S"))
    lg.addHandler(handler)
    if lg.level == logging.NOTSET:
        lg.setLevel(level)


def clock(seconds: float) -> str:
    """A duration as people read it: 42s, 3m05s, 1h02m."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def eta_line(desc: str, done: int, total: int, elapsed: float, work_done: float, work_total: float,
             unit: str = "") -> str:
    """`desc: done/total unit, 1m35s elapsed, ~3m40s left`: the time left extrapolates the elapsed time over the
    work done (items may weigh more than one unit of work, e.g. a pass over every case)."""
    left = elapsed / work_done * max(0.0, work_total - work_done) if work_done > 0 else None
    return (f"{desc}: {done}/{total}{' ' + unit if unit else ''}, {clock(elapsed)} elapsed"
            + (f", ~{clock(left)} left" if left is not None else ""))


class Progress:
    """A counter that logs `desc: done/total` every `every_s` seconds and when finished; with `show` False only the
    final line (`prepare --no-progress`)."""

    def __init__(self, desc: str, total: int, logger: logging.Logger, *, show: bool = True, every_s: float = 20.0):
        self.desc, self.total, self.log, self.every_s, self.show = desc, int(total), logger, every_s, show
        self.done, self.note = 0, ""
        self.t0 = self.last = time.perf_counter()

    def update(self, n: int = 1, note: str = "") -> None:
        self.done += n
        self.note = note or self.note
        now = time.perf_counter()
        if self.done >= self.total or (self.show and now - self.last >= self.every_s):
            self.last = now
            self.log.info("%s%s", eta_line(self.desc, self.done, self.total, now - self.t0, self.done, self.total),
                          f" ({self.note})" if self.note else "")


def logged(items: Iterable[T], desc: str, total: int, logger: logging.Logger, *, show: bool = True) -> Iterator[T]:
    """Iterate `items`, reporting progress through `logger` (every `every_s` seconds when `show`, and when done)."""
    p = Progress(desc, total, logger, show=show)
    for x in items:
        yield x
        p.update()
