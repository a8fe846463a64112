"""Errors the lab raises on bad input. Each message names the problem and the fix."""

from __future__ import annotations

import errno
import sys


class DFlashError(ValueError):
    """Base class: a user-facing error with an actionable message."""


class BadInputError(DFlashError):
    """An argument is out of range (width, budget, prompt, ...)."""


class DeviceError(DFlashError):
    """A device or dtype was asked for that this machine cannot give."""


class TargetNotFoundError(DFlashError):
    """The target name is neither a known alias, a local checkpoint nor a reachable hub id."""


class ArtifactError(DFlashError):
    """A prepared artifact is missing, corrupt or belongs to another target."""


class UnknownMethodError(DFlashError):
    """A method id is not in the registry."""


class BundleError(ArtifactError):
    """A prepared bundle (export/import) is corrupt, truncated, unsafe or does not match its manifests."""


class ReportInputError(DFlashError):
    """A saved benchmark file cannot be turned into a report."""


# --- the one error boundary of every command ------------------------------------------------------------

def os_error_message(exc: OSError, writing: str | None = None) -> str:
    """One line for an OSError: disk full is named as such (it is not a corrupt input), with the fix."""
    where = writing or (str(exc.filename) if exc.filename else None)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return (f"no space left on device while writing {where or 'a file'}: free space or choose another "
                "--out/--home")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return (f"permission denied on {where or 'a file'} ({exc.strerror or exc}): it is read-only or another "
                "user's; fix its permissions or choose another --home/--out")
    reason = exc.strerror or str(exc) or type(exc).__name__
    return f"{reason}: {where}" if where else f"{type(exc).__name__}: {reason}"


def expected_failure(exc: BaseException) -> str | None:
    """The `error:` text for a failure bad input can cause (None: a bug, which keeps its traceback).

    Why a fixed list: exit 1 means "exactness gate failed / regression found", so a crash on hostile input must
    never reach Python's default handler (which also exits 1); a programming error still should.
    """
    if isinstance(exc, DFlashError):
        return str(exc)
    if isinstance(exc, OSError):
        return os_error_message(exc)
    if isinstance(exc, RecursionError):
        return f"input nested too deeply to process ({exc}): pass a file written by the lab"
    if isinstance(exc, MemoryError):
        return "out of memory: the input asks for more than this machine has; pass smaller input"
    return None


REPORT_UNWRITTEN = 12  # a benchmark pytest's exit status when its cases ran but the report could not be written
INTERRUPTED = 130  # the shell's code for a command ended by SIGINT (128 + 2)


def guarded(fn, *args, **kwargs) -> int:
    """Run a command; an expected failure becomes exactly one `error:` line on stderr and exit 2, and Ctrl-C one
    line and exit 130 (a KeyboardInterrupt traceback read as a crash, and its exit 1 as "exactness failed")."""
    try:
        return fn(*args, **kwargs)
    except KeyboardInterrupt:
        print("error: interrupted (Ctrl-C): rerun the command to go on (what it had finished is kept)", file=sys.stderr)
        return INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - filtered by expected_failure, anything else is re-raised
        msg = expected_failure(exc)
        if msg is None:
            raise
        print("error: " + " ".join(msg.split("\n")), file=sys.stderr)
        return 2
