"""Free heap memory handed back to the system during long CPU jobs (drafter training).

Why: glibc raises its mmap threshold every time a large mmapped block is freed (up to 32 MiB on 64-bit), after
which tensors of up to that size come from the heap, and freed heap memory stays in the process. A training loop
that allocates and frees tensors of varying sizes each step then grows its resident set step after step: at the
350M architecture ~1.6 GiB in 3 minutes of drafter training and still rising, about 5 GiB over a prepare's
15-minute budget (docs/real-targets.md, "Resident memory of drafter training"). Fixing the threshold instead (every
large tensor mmapped, returned when freed) stops the growth but halves the training step rate (page faults on
every large buffer, measured there), so training keeps glibc's fast reuse and calls `trim_free_memory` at each
held-out evaluation: `malloc_trim(0)` returns the free pages of every arena. No library exposes it, so this is
ctypes on the C library; elsewhere (musl, macOS, Windows) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import platform

log = logging.getLogger(__name__)


@functools.cache
def _glibc():
    """The C library when it is glibc, else None (looked up once, on first use: no import-time work)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        return libc
    except (OSError, AttributeError) as exc:
        log.debug("malloc_trim unavailable (%s): freed heap memory stays with the process", exc)
        return None


def trim_free_memory() -> bool:
    """Hand the allocator's free heap pages back to the system; True when glibc released any."""
    libc = _glibc()
    return bool(libc.malloc_trim(0)) if libc is not None else False
