"""Progress through `logging`: timestamped lines wherever a long step runs (CLI, pytest, a notebook).

tqdm bars only reach a terminal and are off under pytest, so a ~9-minute prepare looked hung there. Every
long loop also logs "desc: i/total" at INFO (at most every `every_s` seconds, and once when done), which
`pytest --log-cli-level=INFO` shows live; the bar stays for interactive runs.
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


class Progress:
    """A counter that logs `desc: done/total` every `every_s` seconds and when finished (plus an optional bar)."""

    def __init__(self, desc: str, total: int, logger: logging.Logger, *, bar: bool = False, every_s: float = 20.0):
        from tqdm.auto import tqdm

        self.desc, self.total, self.log, self.every_s = desc, int(total), logger, every_s
        self.done, self.note = 0, ""
        self.t0 = self.last = time.perf_counter()
        self.bar = tqdm(total=total, desc=desc, file=sys.stderr, leave=False) if bar else None

    def update(self, n: int = 1, note: str = "") -> None:
        self.done += n
        self.note = note or self.note
        if self.bar is not None:
            self.bar.update(n)
            if note:
                self.bar.set_postfix_str(note)
        now = time.perf_counter()
        if self.done >= self.total or now - self.last >= self.every_s:
            self.last = now
            elapsed = now - self.t0
            eta = elapsed / self.done * (self.total - self.done) if self.done else 0.0
            self.log.info("%s: %d/%d (%.0fs elapsed, ~%.0fs left)%s", self.desc, self.done, self.total, elapsed,
                          eta, f" {self.note}" if self.note else "")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def logged(items: Iterable[T], desc: str, total: int, logger: logging.Logger, *, bar: bool = False) -> Iterator[T]:
    """Iterate `items`, reporting progress through `logger` (and a tqdm bar when `bar`)."""
    p = Progress(desc, total, logger, bar=bar)
    try:
        for x in items:
            yield x
            p.update()
    finally:
        p.close()
