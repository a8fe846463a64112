"""Probe the CLI with hostile input and classify each outcome.

    python scripts/probe_hostile.py [--work DIR] [--lab DIR] [--only SUBSTRING] [--timeout 120]

Every case runs the real CLI (`python -m dflash_core ...`, `python -m dflash_core.report ...`) in a subprocess
with its own temporary home next to a folder of bystander files, and is classified:

* held      - one `error:` line and exit 2 (or, where the input is fine, the right success), nothing outside the
              home changed, no hang;
* traceback - a Python traceback reached the user (its exit 1 reads as "exactness failed");
* defect    - the wrong exit code or message, a write outside the home, a hang, or a wrong result;
* skipped   - the case needs something this machine lacks (root to mount a small or read-only filesystem).

The tiny lab (`dflash_core.testing.build_tiny_lab`, a tiny LFM2 with a tokenizer, prepared in miniature) stands
in for the mini target, so no case needs the full `prepare`. Totals are printed as tried / held / tracebacks /
defects. This is a script, not a test: it takes minutes and mounts tmpfs when it runs as root.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable


# --- running and judging one case ---------------------------------------------------------------------------------

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


def tree(root: Path, skip: list[Path]) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        if any(p == s or s in p.parents for s in skip):
            continue
        rel = p.relative_to(root).as_posix()
        try:
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_file():
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest() if p.stat().st_size < (64 << 20) else \
                    f"size:{p.stat().st_size}"
            else:
                out[rel] = "dir" if p.is_dir() else "other"
        except OSError:
            out[rel] = "unreadable"
    return out


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


class SkipCase(Exception):
    """The case cannot run on this machine."""


# --- material: the tiny lab, its bundles, a drafter, saved runs ---------------------------------------------------

def cli(*args: str) -> list[str]:
    return [PY, "-m", "dflash_core", *args]


def report(*args: str) -> list[str]:
    return [PY, "-m", "dflash_core.report", *args]


def prepare_material(work: Path, lab: Path | None) -> dict:
    """Build (or reuse) the tiny lab, a mini-like home, both kinds of bundle, an exported drafter, saved runs."""
    sys.path.insert(0, str(REPO))
    from dflash_core.store.artifacts import write_target_manifest
    from dflash_core.testing import build_tiny_lab

    lab = lab or work / "lab"
    if not (lab / "home" / "artifacts").is_dir():
        print(f"building the tiny lab in {lab} (a few minutes on a busy 2-core box)", flush=True)
        build_tiny_lab(lab)
    ckpt, lab_home = lab / "ckpt", lab / "home"
    adir = next((lab_home / "artifacts").iterdir())
    mini_home = work / "mini-home"
    if not mini_home.exists():
        shutil.copytree(ckpt, mini_home / "targets" / "mini")
        write_target_manifest(mini_home / "targets" / "mini")
        shutil.copytree(adir, mini_home / "artifacts" / adir.name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFLASH_")}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    shared = {"lab": lab, "ckpt": ckpt, "lab_home": lab_home, "adir": adir.name, "mini_home": mini_home, "env": env,
              "root": os.geteuid() == 0 and shutil.which("mount") is not None}
    mini_bundle, local_bundle, drafter = work / "mini.tar.gz", work / "local.tar.gz", work / "drafter"
    steps = [(mini_bundle, cli("export", "--out", str(mini_bundle), "--home", str(mini_home))),
             (local_bundle, cli("export", "--out", str(local_bundle), "--target", str(ckpt), "--home",
                                str(lab_home))),
             (drafter, cli("export-drafter", "--out", str(drafter), "--target", str(ckpt), "--home", str(lab_home)))]
    for out, argv in steps:
        if not out.exists():
            o = run(argv, env, work, 600)
            if o.rc != 0:
                raise SystemExit(f"could not prepare the probe's material ({' '.join(argv[2:4])}): {o.err[-800:]}")
    shared.update(mini_bundle=mini_bundle, local_bundle=local_bundle, drafter=drafter)
    runs = work / "runs"
    runs.mkdir(exist_ok=True)
    base, slower = saved([1.45, 1.5, 1.55], 1.5, 3.0), saved([0.45, 0.46, 0.47], 0.46, 3.0)
    (runs / "base.json").write_text(json.dumps(base))
    (runs / "slower.json").write_text(json.dumps(slower))
    for name, src in (("base", runs / "base.json"), ("slower", runs / "slower.json")):
        o = run(report(str(src), "--out", str(runs / f"{name}-report")), env, work, 300)
        if o.rc != 0:  # the report cases are skipped (their material is missing), the others still run
            print(f"warning: could not build the probe's benchmark.json: {o.err[-300:]}", flush=True)
            return shared
    shared.update(base_run=runs / "base.json", base_bj=runs / "base-report" / "cpu" / "benchmark.json",
                  slower_bj=runs / "slower-report" / "cpu" / "benchmark.json")
    return shared


def bench_row(method: str, width: int, speedup: float = 1.0, rounds: list[float] | None = None, tau: float = 2.0):
    rounds = rounds or [speedup]
    extra = {"method": method, "device": "cpu", "width": width, "tokens_per_second": 100.0 * speedup,
             "normal_tokens_per_second": 100.0, "speedup": speedup, "speedup_iqr": 0.05, "speedup_rounds": rounds,
             "acceptance_rate": 0.5, "rounds": len(rounds), "tokens_per_target_call": tau if width else 1.0,
             "accept_histogram": [1] * (width + 1), "per_position_acceptance": [0.5] * width, "guidance_work": 0,
             "overhead_fraction": 0.01, "exact": True, "verdicts": {"exact": 1}}
    return {"name": f"test_decode[{method}-cpu-w{width}]",
            "fullname": f"benchmarks/test_decode.py::test_decode[{method}-cpu-w{width}]",
            "stats": {"median": 0.1, "iqr": 0.01, "rounds": 3}, "extra_info": extra}


def saved(rounds: list[float], speedup: float, tau: float, extra_rows: list[dict] = ()) -> dict:
    return {"machine_info": {"node": "n", "machine": "x86_64"}, "commit_info": {"id": "abc", "dirty": False},
            "datetime": "2026-12-01T00:00:00", "version": "5.3.1",
            "benchmarks": [bench_row("normal", 0), bench_row("dflash", 2, speedup, rounds, tau), *extra_rows],
            "dflash": {"methods": {}, "settings": {"tokens": 8},
                       "target": {"name": "mini", "content_sha256": "e" * 64, "dtype": "float32"},
                       "provenance": {"artifacts": {"files": {"drafter.safetensors": {"sha256": "d" * 64}}}}}}


# --- bundle surgery -------------------------------------------------------------------------------------------

def members(path: Path) -> list[tuple[tarfile.TarInfo, bytes]]:
    with tarfile.open(path, "r:gz") as tar:
        return [(m, tar.extractfile(m).read() if m.isfile() else b"") for m in tar.getmembers()]


def write_tar(dst: Path, entries) -> Path:
    with tarfile.open(dst, "w:gz", compresslevel=1) as tar:
        for info, data in entries:
            if info.isfile():
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return dst


def info(name: str, kind=tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    i = tarfile.TarInfo(name)
    i.type, i.linkname, i.mode = kind, link, 0o644
    return i


def edit_bundle(src: Path, dst: Path, edit=None, extra=()) -> Path:
    out = []
    for m, data in members(src):
        if m.name == "bundle.json" and edit is not None:
            doc = json.loads(data)
            edit(doc)
            data = json.dumps(doc).encode()
        out.append((m, data))
    return write_tar(dst, out + list(extra))


def zeros_bundle(dst: Path, size: int, head=()) -> Path:
    class Zeros(io.RawIOBase):
        def __init__(self, n):
            self.left = n

        def readable(self):
            return True

        def readinto(self, b):
            k = min(len(b), self.left)
            b[:k] = bytes(k)
            self.left -= k
            return k

    with tarfile.open(dst, "w:gz", compresslevel=1) as tar:
        for i, data in head:
            i.size = len(data)
            tar.addfile(i, io.BytesIO(data))
        z = info("artifacts/zeros.safetensors")
        z.size = size
        tar.addfile(z, io.BufferedReader(Zeros(size), 1 << 20))
    return dst


def with_target_file(src: Path, dst: Path, name: str, data: bytes) -> Path:
    """A consistent bundle with one more target file, listed in bundle.json and target_manifest.json."""
    entry = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    out, tm_name, tm_entry = [], "targets/mini/target_manifest.json", None
    for m, d in members(src):
        if m.name == tm_name:
            tm = json.loads(d)
            tm["files"][name] = entry
            d = json.dumps(tm).encode()
            tm_entry = {"sha256": hashlib.sha256(d).hexdigest(), "bytes": len(d)}
        out.append((m, d))
    doc = json.loads(out[0][1])
    doc["files"][f"targets/mini/{name}"], doc["files"][tm_name] = entry, tm_entry
    out[0] = (out[0][0], json.dumps(doc).encode())
    return write_tar(dst, out + [(info(f"targets/mini/{name}"), data)])


def import_case(make: Callable[[Path, dict], Path], home_from: str | None = "mini") -> Callable:
    """An import of a bundle `make(d, shared)` into a home that already holds a prepared target."""
    def build(d: Path, s: dict) -> dict:
        home = d / "P" / "home"
        if home_from == "mini":
            shutil.copytree(s["mini_home"], home)
        elif home_from == "local":
            shutil.copytree(s["lab_home"], home)
        (home / "targets" / "mine").mkdir(parents=True, exist_ok=True)
        (home / "targets" / "mine" / "w.txt").write_text("the home's own target\n")
        shutil.move(str(d / "bundle"), str(d / "P" / "bundle"))  # the user's folder next to the home
        return {"argv": cli("import", str(make(d, s)), "--home", str(home)), "home": home,
                "snapshot": tree(home, [home / ".prepare.lock"])}
    return build


def home_unchanged(d: Path, spec: dict, o: Outcome) -> str | None:
    home = spec["home"]
    now = tree(home, [home / ".prepare.lock"])
    if now != spec["snapshot"]:
        diff = sorted(k for k in set(now) | set(spec["snapshot"]) if now.get(k) != spec["snapshot"].get(k))
        return f"the home changed: {diff[:3]}"
    return None


# --- mounts (root only): a full or read-only filesystem ---------------------------------------------------------

def mount_tmpfs(where: Path, size: str, readonly: bool = False) -> Callable[[], None]:
    where.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    if r.returncode:
        raise SkipCase(f"cannot mount tmpfs: {r.stderr.decode()[:80]}")
    if readonly:
        subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
    return lambda: subprocess.run(["umount", "-l", str(where)], capture_output=True)


# --- the cases ------------------------------------------------------------------------------------------------

def drafter_with(d: Path, s: dict, **changes) -> Path:
    out = d / "drafter"
    shutil.copytree(s["drafter"], out)
    doc = json.loads((out / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            doc.pop(k, None)
        else:
            doc[k] = v
    (out / "config.json").write_text(json.dumps(doc))
    return out


def drafter_case(**changes) -> Callable:
    def build(d, s):
        return {"argv": cli("prepare", "--target", str(s["ckpt"]), "--drafter", str(drafter_with(d, s, **changes)))}
    return build


def bj_with(d: Path, src: Path, edit, raw: str | None = None) -> Path:
    out = d / f"edited-{src.name}"
    if raw is not None:
        out.write_text(raw)
        return out
    doc = json.loads(src.read_text())
    edit(doc)
    out.write_text(json.dumps(doc))
    return out


def saved_with(d: Path, s: dict, edit=None, raw: str | None = None) -> Path:
    return bj_with(d, s["base_run"], edit or (lambda doc: None), raw)


def row(doc: dict, **kw) -> None:
    doc["methods"]["dflash"]["rows"]["2"].update(kw)


def deep(n: int = 100_000) -> str:
    return "[" * n + "]" * n


def kill_case(step: str) -> Callable:
    """Import killed by SIGKILL at `step`; the next command (export) must find the home whole."""
    def build(d, s):
        home = d / "P" / "home"
        shutil.copytree(s["mini_home"], home)
        (home / "artifacts" / s["adir"] / "stale.txt").write_text("older\n")
        code = ("import os, signal, sys\nfrom dflash_core.prepare import bundle\n"
                "def step(name):\n    if name == sys.argv[3]:\n        os.kill(os.getpid(), signal.SIGKILL)\n"
                "bundle._step = step\nbundle.import_bundle(sys.argv[1], sys.argv[2])\n")
        o = run([PY, "-c", code, str(s["mini_bundle"]), str(home), step.format(adir=f"artifacts/{s['adir']}")],
                s["env"], d, 300)
        if o.rc != -9:
            raise SkipCase(f"the import was not killed at {step} (exit {o.rc}): {o.err[-200:]}")
        return {"argv": cli("export", "--out", str(d / "after.tar.gz"), "--home", str(home)), "home": home,
                "allowed": [d / "after.tar.gz"], "expect_ok": True}
    return build


def kill_check(d: Path, spec: dict, o: Outcome) -> str | None:
    home = spec["home"]
    if [p for p in home.iterdir() if p.name.startswith(".import-")]:
        return "a .import-* stage is left after the next command"
    adirs = list((home / "artifacts").iterdir())
    if len(adirs) != 1 or not (adirs[0] / "manifest.json").is_file():
        return f"the home's artifacts are not whole: {adirs}"
    return None


def legacy_stage(d, s):
    home = d / "P" / "home"
    shutil.copytree(s["mini_home"], home)
    stage = home / ".import-4242-deadbeef"
    (stage / "old").mkdir(parents=True)
    os.replace(home / "artifacts" / s["adir"], stage / "old" / f"artifacts__{s['adir']}")
    return {"argv": cli("export", "--out", str(d / "after.tar.gz"), "--home", str(home)), "home": home,
            "allowed": [d / "after.tar.gz"]}


def export_links(d, s):
    home = d / "P" / "home"
    shutil.copytree(s["mini_home"], home)
    (home / "artifacts" / s["adir"] / "passwd").symlink_to("/etc/passwd")
    (home / "artifacts" / s["adir"] / "notes.txt").write_text("stray\n")
    (home / "targets" / "mini" / "modeling_evil.py").write_text("import os\n")
    return {"argv": cli("export", "--out", str(d / "b.tar.gz"), "--home", str(home)), "home": home,
            "allowed": [d / "b.tar.gz"]}


def export_links_check(d, spec, o):
    if not (d / "b.tar.gz").is_file():
        return "no bundle written"
    names = [m.name for m, _ in members(d / "b.tar.gz")]
    bad = [n for n in names if n.endswith(("passwd", "notes.txt", "modeling_evil.py"))]
    passwd = Path("/etc/passwd").read_bytes()
    if bad or any(passwd and passwd in data for _, data in members(d / "b.tar.gz")):
        return f"packed {bad or '/etc/passwd contents'}"
    return None


def mini_with_auto_map(d, s):
    sys.path.insert(0, str(REPO))
    from dflash_core.store.artifacts import write_target_manifest

    home = d / "P" / "home"
    shutil.copytree(s["mini_home"], home)
    cfg_path = home / "targets" / "mini" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}
    cfg_path.write_text(json.dumps(cfg))
    write_target_manifest(home / "targets" / "mini")
    return {"argv": cli("run", "--method", "dflash", "--prompt", "def f(x):", "--tokens", "4", "--home", str(home)),
            "home": home}


def mode_case(d, s):
    code = ("from dflash_core.prepare import minitarget as mt\nimport os, sys\n"
            "cfg = mt.MiniTargetConfig(vocab_size=320, hidden_size=32, num_layers=2, attention_layers=(1,), "
            "num_heads=2, num_kv_heads=1, intermediate_size=64, max_position_embeddings=128, seq_len=32, "
            "batch_size=4, max_steps=1, corpus_files=3, threads=1)\n"
            "out = sys.argv[1]\nmt.build_mini_target(out, cfg, progress=False)\n"
            "m = os.umask(0o022); os.umask(m)\n"
            "bad = [f for f in os.listdir(out) if os.stat(os.path.join(out, f)).st_mode & 0o777 != 0o666 & ~m]\n"
            "print('modes ok' if not bad else 'modes wrong: ' + ' '.join(bad))\n")
    home = d / "P" / "home"
    return {"argv": [PY, "-c", code, str(home / "targets" / "mini")], "home": home}


def other_uid_case(d, s):
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        raise SkipCase("needs root and setpriv to run as another uid")
    home = d / "P" / "home"
    shutil.copytree(s["mini_home"], home)
    os.chmod(home, 0o755)
    for p in [home, *home.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    os.chmod(home / "artifacts" / s["adir"], 0o700)
    out = Path(tempfile.mkdtemp(prefix="uid-out-"))
    os.chmod(out, 0o777)
    os.chmod(d, 0o755)
    for p in d.parents:
        if str(p).startswith(str(Path(tempfile.gettempdir()))) and p != Path(tempfile.gettempdir()):
            os.chmod(p, 0o755)
    return {"argv": ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cli(
        "export-drafter", "--out", str(out / "d"), "--target", "mini", "--home", str(home))], "home": home,
        "cleanup": [lambda: shutil.rmtree(out, ignore_errors=True)]}


def full_fs(kind: str, readonly: bool) -> Callable:
    """export / export-drafter / import / report onto a tiny (or read-only) tmpfs."""
    def build(d, s):
        mnt = d / "mnt"
        cleanup = mount_tmpfs(mnt, "64k", readonly=readonly and kind != "import-ro")
        spec = {"cleanup": [cleanup], "allowed": [mnt]}
        if kind == "import-ro":  # a home that exists but cannot be written
            (mnt / "home").mkdir()
            subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
            spec["argv"] = cli("import", str(s["mini_bundle"]), "--home", str(mnt / "home"))
            spec["home"] = mnt / "home"
        if kind == "export":
            spec["argv"] = cli("export", "--out", str(mnt / "b.tar.gz"), "--home", str(s["mini_home"]))
        elif kind == "export-drafter":
            spec["argv"] = cli("export-drafter", "--out", str(mnt / "d"), "--target", str(s["ckpt"]), "--home",
                               str(s["lab_home"]))
        elif kind == "import":
            spec["argv"] = cli("import", str(s["mini_bundle"]), "--home", str(mnt / "home"))
            spec["home"] = mnt / "home"
        elif kind == "report":
            spec["argv"] = report(str(s["base_run"]), "--out", str(mnt / "reports"))
        return spec
    return build


def bench_env(d, s, **env):
    """bench on a copy of the tiny lab's home (prepare only verifies it), reports in the case folder."""
    home = d / "P" / "home"
    shutil.copytree(s["lab_home"], home)
    return {"argv": cli("bench", "--smoke"), "env": {"DFLASH_TARGET": str(s["ckpt"]),
                                                     "DFLASH_REPORTS": str(d / "reports"), **env},
            "home": home, "allowed": [d / "reports"]}


def cases() -> list[Case]:
    C = Case
    mini, local = "mini_bundle", "local_bundle"
    run_argv = ["run", "--method", "dflash", "--prompt", "def f(x):", "--tokens", "4"]

    def imp(group, name, make, words=(), home_from="mini"):
        return C(group, name, import_case(make, home_from), words=words, check=home_unchanged)

    def b(name, edit, which=local, extra=()):
        return lambda d, s: edit_bundle(s[which], d / f"{name}.tar.gz", edit, extra)

    L = [
        # 1. target_dir / artifact_dir / member paths that leave the home
        imp("1 security", "target_dir ../bundle (artifacts-only)", b("t1", lambda x: x.update(target_dir="../bundle")),
            ("target directory",), "local"),
        imp("1 security", "target_dir ../../targets", b("t2", lambda x: x.update(target_dir="../../targets")),
            ("target directory",), "local"),
        imp("1 security", "target_dir absolute", b("t3", lambda x: x.update(target_dir=str(Path("/tmp")))),
            ("target directory",), "local"),
        imp("1 security", "artifact_dir ../../x", b("t4", lambda x: x.update(artifact_dir="artifacts/../../x")),
            ("artifact directory",)),
        imp("1 security", "member ../escaped.txt", b("t5", None, extra=[(info("../escaped.txt"), b"x")]),
            ("unlisted",)),
        imp("1 security", "member with an absolute path", b("t6", None, extra=[(info("/tmp/abs-probe.txt"), b"x")]),
            ("unlisted",)),
        imp("1 security", "symlink member to /etc/passwd",
            b("t7", None, which=mini, extra=[(info("targets/mini/link", tarfile.SYMTYPE, "/etc/passwd"), b"")]),
            ("link",)),
        imp("1 security", "hardlink member",
            b("t8", None, extra=[(info("artifacts/x", tarfile.LNKTYPE, "bundle.json"), b"")]), ("link",)),
        imp("1 security", "target_dir targets/mini/../../../bundle",
            b("t9", lambda x: x.update(target_dir="targets/mini/../../../bundle")), ("target directory",), "local"),
        # 2. resource use before refusing
        imp("2 bomb", "2 GiB zero member before bundle.json", lambda d, s: zeros_bundle(d / "z.tar.gz", 2 << 30),
            ("does not start with bundle.json",)),
        imp("2 bomb", "512 MiB unlisted member after bundle.json",
            lambda d, s: zeros_bundle(d / "z.tar.gz", 512 << 20, head=[m for m in members(s[local])[:1]]),
            ("unlisted",)),
        imp("2 bomb", "member larger than listed",
            lambda d, s: write_tar(d / "big.tar.gz", [(m, data + b"\0" * 4096 if m.name.endswith(
                "drafter.safetensors") else data) for m, data in members(s[local])]), ("truncated or altered",)),
        imp("2 bomb", "listed bytes over the cap",
            b("t10", lambda x: [v.update(bytes=9 << 30) for v in list(x["files"].values())[:2]]), ("limit",)),
        # 3. crash safety
        *[C("3 crash", f"import killed at {st}", kill_case(st), expect="ok", check=kill_check)
          for st in ("extracted", "journal", "backup:{adir}", "moved:{adir}", "backup:targets/mini",
                     "moved:targets/mini", "done")],
        C("3 crash", "stage an older release stranded", legacy_stage, expect="ok", check=kill_check),
        # 4. what travels
        C("4 export", "export with a symlink to /etc/passwd and stray files", export_links, expect="ok",
          check=export_links_check),
        imp("4 import", "bundle listing targets/mini/modeling_evil.py",
            lambda d, s: with_target_file(s[mini], d / "evil.tar.gz", "modeling_evil.py", b"import os\n"),
            ("modeling_evil.py",)),
        imp("4 import", "20,000 empty folders",
            lambda d, s: write_tar(d / "dirs.tar.gz", members(s[local])[:1] + [
                (info(f"artifacts/d{i}", tarfile.DIRTYPE), b"") for i in range(20_000)]), ("folder",)),
        imp("4 import", "a file listed in bundle.json but not in the manifest",
            lambda d, s: stray_bundle(d, s), ("stray",)),
        # 5. bounded resources
        C("5 resources", "report on 15k rounds (bounded memory)", lambda d, s: rss_case(d, s, 15_000),
          expect="ok", check=rss_check),
        C("5 resources", "report on 50k rounds", lambda d, s: rounds_case(d, s, 50_000), words=("20000",)),
        C("5 resources", "report on 1M rounds", lambda d, s: rounds_case(d, s, 1_000_000)),
        # 6. the gate
        C("6 gate", "NaN speedup on a regressed row", lambda d, s: gate_new(d, s, lambda x: row(x, speedup=float(
            "nan"))), words=("NaN",)),
        C("6 gate", "NaN tokens per call on a regressed row", lambda d, s: gate_new(d, s, lambda x: row(
            x, tokens_per_target_call=float("nan"))), words=("NaN",)),
        C("6 gate", "--speedup-drop nan with a 69 % regression",
          lambda d, s: {"argv": report("gate", str(s["base_bj"]), str(s["slower_bj"]), "--speedup-drop", "nan")},
          words=("finite fraction",)),
        C("6 gate", "a 69 % regression is caught", lambda d, s: {"argv": report("gate", str(s["base_bj"]),
                                                                                 str(s["slower_bj"]))},
          expect="regression"),
        C("6 gate", "all_exact 'false' (a string) with a failure", lambda d, s: gate_new(
            d, s, lambda x: x["exactness"].update(all_exact="false", failures=["dflash-w2"]), base_as_new=True),
          words=("all_exact",)),
        C("6 gate", "--tau-tolerance -1 on identical runs",
          lambda d, s: {"argv": report("gate", str(s["base_bj"]), str(s["base_bj"]), "--tau-tolerance", "-1")},
          words=("finite fraction",)),
        C("6 gate", "methods: []", lambda d, s: gate_base(d, s, lambda x: x.update(methods=[]))),
        C("6 gate", "rows: []", lambda d, s: gate_base(d, s, lambda x: x["methods"]["dflash"].update(rows=[]))),
        C("6 gate", "100k-deep JSON", lambda d, s: {"argv": report("gate", str(s["base_bj"]), str(
            bj_with(d, s["base_bj"], None, raw=deep())))}, words=("nests deeper",)),
        C("6 gate", "a missing file", lambda d, s: {"argv": report("gate", str(s["base_bj"]), str(d / "nope.json"))}),
        C("6 gate", "a missing /file (pathlib's glob)", lambda d, s: {"argv": report(
            "gate", str(s["base_bj"]), "/dflash-probe-missing.json"), "cwd": benchmarks_dir(d)}),
        C("6 gate", "speedup as a string", lambda d, s: gate_new(d, s, lambda x: row(x, speedup="1.5"),
                                                                  base_as_new=True)),
        # 7. validate before work
        C("7 bench", "DFLASH_TOKENS=abc bench --smoke", lambda d, s: bench_env(d, s, DFLASH_TOKENS="abc"),
          words=("DFLASH_TOKENS",), check=quick(20)),
        C("7 bench", "DFLASH_WIDTHS=99 bench --smoke", lambda d, s: bench_env(d, s, DFLASH_WIDTHS="99"),
          words=("block size",), check=no_report_named),
        C("7 bench", "bench -- --bench-widths 0", lambda d, s: {**bench_env(d, s), "argv": cli(
            "bench", "--smoke", "--", "--bench-widths", "0")}, words=("--bench-widths",), check=quick(20)),
        C("7 bench", "DFLASH_THREADS=1000000 bench", lambda d, s: bench_env(d, s, DFLASH_THREADS="1000000"),
          words=("DFLASH_THREADS",), check=quick(20)),
        # 8. resource blow-ups before any check
        C("8 bounds", "run --threads 1000000", lambda d, s: {"argv": cli(*run_argv, "--threads", "1000000")},
          words=("<= 256",)),
        C("8 bounds", "DFLASH_THREADS=1000000 run", lambda d, s: {"argv": cli(*run_argv),
                                                                  "env": {"DFLASH_THREADS": "1000000"}},
          words=("DFLASH_THREADS",)),
        C("8 bounds", "--drafter num_hidden_layers 100000", drafter_case(num_hidden_layers=100_000),
          words=("num_hidden_layers",)),
        C("8 bounds", "--drafter intermediate_size 1e9", drafter_case(intermediate_size=1e9),
          words=("intermediate_size",)),
        C("8 bounds", "--drafter intermediate_size 10**9 (int)", drafter_case(intermediate_size=10 ** 9),
          words=("intermediate_size",)),
        C("8 bounds", "--target config with 100,000 layers", lambda d, s: target_with(d, s, num_hidden_layers=100_000),
          words=("num_hidden_layers",)),
        C("8 bounds", "--target config with hidden 10**7", lambda d, s: target_with(d, s, hidden_size=10 ** 7),
          words=("hidden_size",)),
        # 9. non-finite drafter weights
        C("9 weights", "--drafter with NaN weights", lambda d, s: nan_drafter(d, s, float("nan")),
          words=("NaN",), check=quick(60)),
        C("9 weights", "--drafter with inf weights", lambda d, s: nan_drafter(d, s, float("inf")),
          words=("NaN or infinite",), check=quick(60)),
        # 10. hangs
        C("10 hangs", "--drafter model.safetensors -> /dev/zero", lambda d, s: hang_drafter(d, s, "zero"),
          words=("not a regular file",), check=quick(30)),
        C("10 hangs", "--drafter model.safetensors is a FIFO", lambda d, s: hang_drafter(d, s, "fifo"),
          words=("FIFO",), check=quick(30)),
        C("10 hangs", "--drafter config.json is a FIFO", lambda d, s: hang_drafter(d, s, "config"),
          words=("FIFO",), check=quick(30)),
        C("10 hangs", "--target model.safetensors is a FIFO", lambda d, s: fifo_target(d, s, "model.safetensors"),
          words=("FIFO",), check=quick(30)),
        C("10 hangs", "--target tokenizer.json is a FIFO", lambda d, s: fifo_target(d, s, "tokenizer.json"),
          words=("FIFO",), check=quick(30)),
        C("10 hangs", "report input is a FIFO", lambda d, s: fifo_report(d), words=("FIFO",), check=quick(30)),
        C("10 hangs", "report input -> /dev/zero", lambda d, s: zero_report(d), words=("not a regular file",),
          check=quick(30)),
        # 11. misleading or unreadable
        C("11 misleading", "import onto a full filesystem", full_fs("import", False),
          words=("no space left on device",), needs_root=True),
        C("11 misleading", "auto_map in the mini target's config", mini_with_auto_map, words=("auto_map",)),
        C("11 misleading", "mini target weights get the umask's mode", mode_case, expect="ok", words=("modes ok",)),
        C("11 misleading", "artifacts unreadable for another uid", other_uid_case, needs_root=True),
        # the tracebacks of the issue
        C("tb report", "report on 100k-deep JSON", lambda d, s: {"argv": report(str(
            saved_with(d, s, raw=deep())), "--out", str(d / "r"))}, words=("nests deeper",)),
        C("tb report", "report on rounds of 1e308", lambda d, s: report_with(d, s, speedup_rounds=[1e308, 1e308])),
        C("tb report", "report on a 400-digit integer", lambda d, s: {"argv": report(str(saved_with(
            d, s, raw=s["base_run"].read_text().replace('"speedup": 1.5', '"speedup": ' + "9" * 400))),
            "--out", str(d / "r"))}),
        C("tb report", "report on a non-integer verify-cost width key", lambda d, s: verify_cost_case(d, s)),
        C("tb report", "report --out a file", lambda d, s: out_file_case(d, s)),
        C("tb report", "report --out read-only", full_fs("report", True), words=("permission denied",),
          needs_root=True),
        C("tb report", "report on a missing /file while .benchmarks exists", lambda d, s: {
            "argv": report("/dflash-probe-missing.json"), "cwd": benchmarks_dir(d)}),
        C("tb import", "import with a numeric content_sha256",
          import_case(b("n1", lambda x: x["target"].update(content_sha256=12345))), words=("content_sha256",),
          check=home_unchanged),
        C("tb import", "import into a read-only home", full_fs("import-ro", True), needs_root=True),
        C("tb import", "import --home a file", lambda d, s: home_file_case(d, s, cli("import", str(s[mini])))),
        C("tb export", "export to a full filesystem", full_fs("export", False), words=("no space left on device",),
          needs_root=True),
        C("tb export", "export to a read-only filesystem", full_fs("export", True), words=("permission denied",),
          needs_root=True),
        C("tb export", "export to an existing folder", lambda d, s: export_existing(d, s),
          words=("not a regular file",), check=quick(20)),
        C("tb export", "export-drafter to a read-only filesystem", full_fs("export-drafter", True),
          words=("permission denied",), needs_root=True),
        C("tb export", "export-drafter to a full filesystem", full_fs("export-drafter", False),
          words=("no space left on device",), needs_root=True),
        C("tb drafter", "--drafter without hidden_size", drafter_case(hidden_size=None), words=("hidden_size",)),
        C("tb drafter", "--drafter num_attention_heads 0", drafter_case(num_attention_heads=0),
          words=("num_attention_heads",)),
        C("tb drafter", "--drafter target_layer_ids ['a']", drafter_case(target_layer_ids=["a"]),
          words=("target_layer_ids",)),
        C("tb drafter", "--drafter hidden_size '384x'", drafter_case(hidden_size="384x"), words=("hidden_size",)),
        C("tb home", "DFLASH_HOME a file (run)", lambda d, s: home_file_case(d, s, cli(*run_argv))),
        C("tb home", "DFLASH_HOME a file (prepare)", lambda d, s: home_file_case(d, s, cli("prepare"))),
        C("tb home", "a deeply nested manifest.json", lambda d, s: nested_manifest(d, s), words=("nests deeper",)),
        # more of the probe's own
        imp("extra import", "not a gzip file", lambda d, s: write_bytes(d / "x.tar.gz", os.urandom(4096)),
            ("truncated or corrupt",)),
        imp("extra import", "an empty file", lambda d, s: write_bytes(d / "x.tar.gz", b""), ()),
        imp("extra import", "bundle.json of 10 MB", lambda d, s: write_tar(d / "x.tar.gz", [
            (info("bundle.json"), b" " * (10 << 20))]), ("limit",)),
        imp("extra import", "bundle.json with a NaN literal", lambda d, s: write_tar(d / "x.tar.gz", [
            (info("bundle.json"), b'{"format": NaN}')] + members(s[local])[1:]), ("NaN",)),
        imp("extra import", "a listed file twice", lambda d, s: write_tar(d / "x.tar.gz", members(s[local]) + members(
            s[local])[1:2]), ("duplicate",)),
        imp("extra import", "a FIFO member", b("f1", None, extra=[(info("artifacts/fifo", tarfile.FIFOTYPE), b"")]),
            ("special",)),
        imp("extra import", "unknown top-level key", b("k1", lambda x: x.update(extra=1)), ("beyond or missing",)),
        C("extra report", "report on a width of 10**30", lambda d, s: report_with(d, s, width=10 ** 30)),
        C("extra report", "report on NaN rounds", lambda d, s: {"argv": report(str(saved_with(
            d, s, raw=s["base_run"].read_text().replace("[1.45,", "[NaN,"))), "--out", str(d / "r"))}),
        C("extra run", "--target with auto_map in config.json", lambda d, s: target_with(d, s, auto_map={"x": "y"}),
          words=("auto_map",)),
        C("extra run", "--drafter block_size 10**6", drafter_case(block_size=10 ** 6), words=("block_size",)),
        C("extra run", "--drafter num_key_value_heads 3 (does not divide)", drafter_case(num_key_value_heads=3),
          words=("num_key_value_heads",)),
        C("extra run", "export-drafter --out a file", lambda d, s: export_drafter_file(d, s),
          words=("not an empty directory",)),
        C("extra ok", "a clean import still works", import_case(lambda d, s: s[mini]), expect="ok",
          words=("artifact_dir",)),
        # round three (issue 70)
        C("r3 hangs", "--calibration-from run id -> a FIFO", lambda d, s: calibration_special(d, s, "fifo"),
          words=("FIFO",), check=quick(60)),
        C("r3 hangs", "--calibration-from run id -> /dev/zero", lambda d, s: calibration_special(d, s, "zero"),
          words=("device",), check=quick(60)),
        C("r3 hangs", "a FIFO at <home>/.import-x/journal.json", lambda d, s: journal_fifo(d, s), expect="ok",
          words=("artifact_dir",), check=quick(60)),
        C("r3 lock", ".prepare.lock is a link", lambda d, s: lock_case(d, s, "link"), words=("lock",)),
        C("r3 lock", ".prepare.lock is a FIFO", lambda d, s: lock_case(d, s, "fifo"), words=("lock",),
          check=quick(60)),
        C("r3 lock", ".prepare.lock is a folder", lambda d, s: lock_case(d, s, "dir"), words=("lock",)),
        C("r3 budget", "--bench-budget 1e308", lambda d, s: {"argv": cli("bench", "--smoke"),
                                                              "env": {"DFLASH_BENCH_BUDGET": "1e308"}},
          words=("minutes",)),
        C("r3 env", "DFLASH_REQUIRE_GPU=maybe", lambda d, s: {"argv": cli("prepare"),
                                                            "env": {"DFLASH_REQUIRE_GPU": "maybe"}},
          words=("DFLASH_REQUIRE_GPU",)),
        C("r3 env", "DFLASH_REBUILD_MINI=ture", lambda d, s: {"argv": cli("prepare"),
                                                            "env": {"DFLASH_REBUILD_MINI": "ture"}},
          words=("DFLASH_REBUILD_MINI",)),
        C("r3 seed", "--mini-seed 2**64", lambda d, s: {"argv": cli("prepare", "--mini-seed", str(2 ** 64))},
          words=("--mini-seed",), check=no_seed_folder),
        C("r3 reports", "DFLASH_REPORTS under a file", lambda d, s: reports_under_file(d), words=("report folder",),
          check=quick(60)),
        C("r3 prompts", "a JSONL prompt holding a lone surrogate", lambda d, s: prompts_case(
            d, "p.jsonl", b'{"text": "a\\ud800"}\n'), words=("surrogate",), check=quick(60)),
        C("r3 prompts", "a 5,000-digit integer in a JSONL line", lambda d, s: prompts_case(
            d, "p.jsonl", b'{"text": "a", "n": ' + b"9" * 5000 + b"}\n"), words=("JSON",), check=quick(60)),
    ]
    return L


def calibration_special(d: Path, s: dict, kind: str) -> dict:
    store = d / ".benchmarks" / "Linux-CPython"
    store.mkdir(parents=True)
    if kind == "fifo":
        os.mkfifo(store / "0001_run.json")
    else:
        (store / "0001_run.json").symlink_to("/dev/zero")
    return {"argv": cli("bench", "--calibration-from", "0001"), "timeout": 90}


def journal_fifo(d: Path, s: dict) -> dict:
    home = d / "P" / "home"
    shutil.copytree(s["mini_home"], home)
    (home / ".import-x").mkdir()
    os.mkfifo(home / ".import-x" / "journal.json")
    return {"argv": cli("import", str(s["mini_bundle"]), "--home", str(home)), "home": home, "timeout": 90}


def lock_case(d: Path, s: dict, kind: str) -> dict:
    home = d / "P" / "home"
    shutil.copytree(s["mini_home"], home)
    lock = home / ".prepare.lock"
    lock.unlink(missing_ok=True)  # the copied home's own
    if kind == "link":
        lock.symlink_to(d / "outside" / "planted.lock")
    elif kind == "fifo":
        os.mkfifo(lock)
    else:
        lock.mkdir()
    return {"argv": cli("export", "--out", str(d / "P" / "b.tar.gz"), "--home", str(home)), "home": home,
            "allowed": [d / "P" / "b.tar.gz"], "timeout": 90}


def no_seed_folder(d: Path, spec: dict, o: Outcome) -> str | None:
    left = list((d / "P" / "home" / "targets").glob("mini-seed-*")) if (d / "P" / "home").exists() else []
    return f"left {left[0]}" if left else None


def reports_under_file(d: Path) -> dict:
    (d / "f").write_text("a file")
    return {"argv": cli("bench", "--smoke"), "env": {"DFLASH_REPORTS": str(d / "f" / "reports")}}


def prompts_case(d: Path, name: str, data: bytes) -> dict:
    (d / name).write_bytes(data)
    return {"argv": cli("bench", "--prompts-file", str(d / name))}


def write_bytes(p: Path, data: bytes) -> Path:
    p.write_bytes(data)
    return p


def stray_bundle(d: Path, s: dict) -> Path:
    doc = json.loads(members(s["local_bundle"])[0][1])
    data, name = b'{"stray": 1}', f"{doc['artifact_dir']}/stray.json"
    return edit_bundle(s["local_bundle"], d / "stray.tar.gz", lambda x: x["files"].update(
        {name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}}), [(info(name), data)])


def rounds_case(d: Path, s: dict, n: int) -> dict:
    import random

    r = random.Random(0)
    doc = saved([1.0 + r.random() for _ in range(n)], 1.5, 3.0)
    p = d / "rounds.json"
    p.write_text(json.dumps(doc))
    return {"argv": report(str(p), "--out", str(d / "r")), "allowed": [d / "r"]}


def rss_case(d: Path, s: dict, n: int) -> dict:
    spec = rounds_case(d, s, n)
    code = ("import resource, sys\nfrom dflash_core.report.__main__ import main\nrc = main(sys.argv[1:])\n"
            "print('maxrss_kb', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\nsys.exit(rc)\n")
    spec["argv"] = [PY, "-c", code, *spec["argv"][3:]]
    return spec


def rss_check(d, spec, o) -> str | None:
    kb = [int(ln.split()[1]) for ln in o.out.splitlines() if ln.startswith("maxrss_kb")]
    if not kb:
        return "no memory figure"
    return None if kb[0] < 1_000_000 else f"peak memory {kb[0] // 1024} MB"


def gate_new(d: Path, s: dict, edit, base_as_new: bool = False) -> dict:
    new = bj_with(d, s["base_bj"] if base_as_new else s["slower_bj"], edit)
    return {"argv": report("gate", str(s["base_bj"]), str(new))}


def gate_base(d: Path, s: dict, edit) -> dict:
    return {"argv": report("gate", str(bj_with(d, s["base_bj"], edit)), str(s["base_bj"]))}


def benchmarks_dir(d: Path) -> Path:
    (d / ".benchmarks" / "cpu").mkdir(parents=True, exist_ok=True)
    return d


def report_with(d: Path, s: dict, **extra) -> dict:
    def edit(doc):
        doc["benchmarks"][1]["extra_info"].update(extra)
    return {"argv": report(str(saved_with(d, s, edit)), "--out", str(d / "r"))}


def verify_cost_case(d: Path, s: dict) -> dict:
    def edit(doc):
        doc["benchmarks"].append({"name": "test_verify_cost[cpu]", "fullname": "b::test_verify_cost[cpu]",
                                  "stats": {"median": 0.1, "iqr": 0.0, "rounds": 1},
                                  "extra_info": {"verify_cost": {"ratio": {"2x": 1.1}, "t_decode_seconds": 0.01}}})
    return {"argv": report(str(saved_with(d, s, edit)), "--out", str(d / "r"))}


def out_file_case(d: Path, s: dict) -> dict:
    (d / "out").write_text("a file")
    return {"argv": report(str(s["base_run"]), "--out", str(d / "out"))}


def home_file_case(d: Path, s: dict, argv: list[str]) -> dict:
    f = d / "home-file"
    f.write_text("not a folder")
    return {"argv": [*argv, "--home", str(f)] if "--home" not in argv else argv, "home": f}


def export_existing(d: Path, s: dict) -> dict:
    (d / "out").mkdir()
    return {"argv": cli("export", "--out", str(d / "out"), "--home", str(s["mini_home"]))}


def export_drafter_file(d: Path, s: dict) -> dict:
    (d / "out").write_text("a file")
    return {"argv": cli("export-drafter", "--out", str(d / "out"), "--target", str(s["ckpt"]), "--home",
                        str(s["lab_home"]))}


def target_with(d: Path, s: dict, **changes) -> dict:
    ckpt = d / "ckpt"
    shutil.copytree(s["ckpt"], ckpt)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg.update(changes)
    (ckpt / "config.json").write_text(json.dumps(cfg))
    return {"argv": cli("run", "--method", "normal", "--prompt", "def f(x):", "--tokens", "2", "--target",
                        str(ckpt))}


def nan_drafter(d: Path, s: dict, value: float) -> dict:
    sys.path.insert(0, str(REPO))
    from safetensors.torch import load_file, save_file

    out = drafter_with(d, s)
    sd = load_file(str(out / "model.safetensors"))
    k = sorted(sd)[0]
    sd[k] = sd[k].clone()
    sd[k].view(-1)[0] = value
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    return {"argv": cli("prepare", "--target", str(s["ckpt"]), "--drafter", str(out))}


def hang_drafter(d: Path, s: dict, kind: str) -> dict:
    out = drafter_with(d, s)
    name = "config.json" if kind == "config" else "model.safetensors"
    (out / name).unlink()
    if kind == "zero":
        (out / name).symlink_to("/dev/zero")
    else:
        os.mkfifo(out / name)
    return {"argv": cli("run", "--method", "dflash", "--prompt", "def f(x):", "--tokens", "2", "--target",
                        str(s["ckpt"]), "--drafter", str(out)), "timeout": 60}


def fifo_target(d: Path, s: dict, name: str) -> dict:
    ckpt = d / "ckpt"
    shutil.copytree(s["ckpt"], ckpt)
    (ckpt / name).unlink()
    os.mkfifo(ckpt / name)
    return {"argv": cli("run", "--method", "normal", "--prompt", "x y", "--tokens", "2", "--target", str(ckpt)),
            "timeout": 60}


def fifo_report(d: Path) -> dict:
    os.mkfifo(d / "in.json")
    return {"argv": report(str(d / "in.json"), "--out", str(d / "r")), "timeout": 60}


def zero_report(d: Path) -> dict:
    (d / "in.json").symlink_to("/dev/zero")
    return {"argv": report(str(d / "in.json"), "--out", str(d / "r")), "timeout": 60}


def nested_manifest(d: Path, s: dict) -> dict:
    home = d / "P" / "home"
    shutil.copytree(s["mini_home"], home)
    (home / "artifacts" / s["adir"] / "manifest.json").write_text(deep())
    return {"argv": cli("export", "--out", str(d / "b.tar.gz"), "--home", str(home)), "home": home}


def quick(seconds: float) -> Callable:
    def check(d, spec, o):
        return None if o.seconds < seconds else f"refused only after {o.seconds:.0f}s (validate before work)"
    return check


def no_report_named(d, spec, o) -> str | None:
    return "named a report that was not written" if "report: " in o.err else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default: a new temp folder)")
    ap.add_argument("--lab", type=Path, default=None, help="reuse a tiny lab built by build_tiny_lab")
    ap.add_argument("--only", default=None, help="run the cases whose name contains this")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds before a case counts as hung")
    ap.add_argument("--show", action="store_true", help="print each case's error line (what the user reads)")
    a = ap.parse_args()
    work = a.work or Path(tempfile.mkdtemp(prefix="dflash-probe-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    shared = prepare_material(work, a.lab)
    todo = [c for c in cases() if a.only is None or a.only in c.name or a.only in c.group]
    results = []
    for i, case in enumerate(todo, 1):
        r = probe(case, shared, work, a.timeout)
        results.append(r)
        secs = f"{r.outcome.seconds:5.1f}s" if r.outcome else "   -  "
        print(f"[{i:3d}/{len(todo)}] {r.verdict:9s} {secs} {case.group:14s} {case.name}"
              + (f"  -- {r.why}" if r.why else ""), flush=True)
        if a.show and r.outcome is not None:
            for line in error_lines(r.outcome.err)[:1]:
                print(f"{'':18s}{line[:300]}", flush=True)
    counts = {k: sum(r.verdict == k for r in results) for k in ("held", "traceback", "defect", "skipped")}
    tried = len(results) - counts["skipped"]
    print(f"\ntried {tried} / held {counts['held']} / tracebacks {counts['traceback']} / defects {counts['defect']}"
          f" (skipped {counts['skipped']}) in {time.perf_counter() - t0:.0f}s; work folder {work}")
    return 0 if counts["traceback"] == counts["defect"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
