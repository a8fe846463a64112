"""Running one probe case and classifying its outcome (held / traceback / defect / skipped)."""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ...support.homes import tree


@dataclass
class Outcome:
    rc: int | None
    out: str
    err: str
    seconds: float
    timed_out: bool = False


@dataclass
class Case:
    group: str
    name: str
    build: Callable[[Path, dict], dict]  # (case dir, shared) -> {"argv", "env"?, "cwd"?, "home"?, "allowed"?}
    expect: str = "error"  # error (exit 2, one error: line) | ok (exit 0) | regression (exit 1)
    words: tuple[str, ...] = ()  # all must appear in the error line (or stdout for ok)
    check: Callable[[Path, dict, Outcome], str | None] | None = None  # extra judgement: a reason it is a defect
    needs_root: bool = False


@dataclass
class Result:
    case: Case
    verdict: str
    why: str = ""
    outcome: Outcome | None = None
    extra: dict = field(default_factory=dict)


class SkipCase(Exception):
    """The case cannot run on this machine."""


def run(argv: list[str], env: dict, cwd: Path, timeout: float) -> Outcome:
    t0 = time.perf_counter()
    try:
        p = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                           errors="replace")
        return Outcome(p.returncode, p.stdout, p.stderr, time.perf_counter() - t0)
    except subprocess.TimeoutExpired as exc:
        return Outcome(None, str(exc.stdout or ""), str(exc.stderr or ""), time.perf_counter() - t0, True)


def error_lines(err: str) -> list[str]:
    """`error:` lines: ours start with it; argparse's read `prog: error: ...`."""
    return [ln for ln in err.splitlines() if ln.startswith("error:") or ": error: " in ln]


def judge(case: Case, o: Outcome, outside_changed: list[str], extra: str | None) -> tuple[str, str]:
    if o.timed_out:
        return "defect", f"hung (killed after {o.seconds:.0f}s)"
    if "Traceback (most recent call last)" in o.err:
        last = [ln for ln in o.err.splitlines() if ln.strip()][-1:]
        return "traceback", (last[0][:160] if last else "")
    if outside_changed:
        return "defect", f"changed outside the home: {outside_changed[:3]}"
    if case.expect == "error":
        lines = error_lines(o.err)
        if o.rc != 2 or len(lines) != 1:
            return "defect", f"exit {o.rc}, {len(lines)} error line(s): {o.err.strip()[-200:]!r}"
        missing = [w for w in case.words if w.lower() not in lines[0].lower()]
        if missing:
            return "defect", f"error line lacks {missing}: {lines[0][:200]}"
    elif case.expect == "ok":
        if o.rc != 0:
            return "defect", f"exit {o.rc}: {o.err.strip()[-200:]!r}"
        missing = [w for w in case.words if w not in o.out]
        if missing:
            return "defect", f"output lacks {missing}"
    elif case.expect == "regression":
        if o.rc != 1:
            return "defect", f"exit {o.rc} (a regression must exit 1): {o.out.strip()[-160:]!r}"
    if extra:
        return "defect", extra
    return "held", ""


def probe(case: Case, shared: dict, work: Path, timeout: float) -> Result:
    """Run `case` in a fresh case folder: a bystander folder (`outside/`) and folders named like the lab's own
    (`bundle/`, `targets/`) next to the home's parent `P/`, every byte of it hashed before and after."""
    if case.needs_root and not shared["root"]:
        return Result(case, "skipped", "needs root (tmpfs mounts)")
    d = Path(tempfile.mkdtemp(prefix="case-", dir=work))
    outside = d / "outside"
    outside.mkdir()
    (outside / "thesis.txt").write_text("a bystander file next to the home\n")
    (d / "bundle").mkdir()
    (d / "bundle" / "keep.txt").write_text("the user's folder named bundle\n")
    (d / "targets").mkdir()
    (d / "targets" / "keep.txt").write_text("the user's folder named targets\n")
    (d / "P").mkdir()  # the home's parent: creating the home itself is the command's right
    try:
        spec = case.build(d, shared)
    except SkipCase as exc:
        return Result(case, "skipped", str(exc))
    except KeyError as exc:  # material that could not be built (see the warning at the start)
        return Result(case, "skipped", f"no material {exc}")
    home = spec.get("home", d / "P" / "home")
    allowed = [home, *spec.get("allowed", [])]
    env = {**shared["env"], "DFLASH_HOME": str(home), **spec.get("env", {})}
    before = tree(d, allowed)
    o = run(spec["argv"], env, spec.get("cwd", d), spec.get("timeout", timeout))
    after = tree(d, allowed)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    extra = case.check(d, spec, o) if case.check else None
    verdict, why = judge(case, o, changed, extra)
    for cleanup in spec.get("cleanup", []):
        cleanup()
    return Result(case, verdict, why, o)
