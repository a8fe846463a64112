"""What each probe case sets up: a case folder `d` and the shared material `s` in, a spec out (argv, env, cwd,
the home, the paths it may change, cleanups), plus the extra judgements (`check`) some cases need."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from ...support.bundles import edit_bundle, members
from ...support.bundles import member_info as info
from ...support.homes import tree
from .judge import Outcome, SkipCase, run
from .material import PY, cli, mount_tmpfs, report, saved


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



def planted_artifacts_link(d: Path, s: dict) -> dict:
    """A link planted at <home>/artifacts to a folder outside the home: prepare wrote a whole artifact folder
    there."""
    home = d / "P" / "home"
    home.mkdir()
    (d / "outside" / "arts").mkdir()
    (home / "artifacts").symlink_to(d / "outside" / "arts", target_is_directory=True)
    return {"argv": cli("prepare", "--target", str(s["ckpt"])), "home": home}


def shard_index(d: Path, s: dict, shard: str) -> dict:
    """A checkpoint whose model.safetensors.index.json names `shard` (outside its folder, /dev/zero, a FIFO)."""
    ckpt = d / "ckpt"
    shutil.copytree(s["ckpt"], ckpt)
    (d / "outside" / "x.safetensors").write_bytes((ckpt / "model.safetensors").read_bytes())
    if shard == "fifo.safetensors":
        os.mkfifo(ckpt / shard)
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {
        "model.embed_tokens.weight": shard}}))
    return {"argv": cli("run", "--method", "normal", "--prompt", "x y", "--tokens", "2", "--target", str(ckpt)),
            "timeout": 90}


def huge_header_drafter(d: Path, s: dict) -> dict:
    """A drafter folder whose safetensors header claims 6.7 GB for one weight (a sparse file): prepare loaded all
    of it before comparing shapes with config.json. Run under a parent that reports the command's peak memory."""
    from ...support.safetensors_files import with_header

    out = drafter_with(d, s)
    with_header(s["drafter"] / "model.safetensors", out / "model.safetensors", "encoder.fc.weight",
                [48, 35_000_000])
    code = ("import resource, subprocess, sys\nrc = subprocess.call(sys.argv[1:])\n"
            "print('maxrss_kb', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\nsys.exit(rc)\n")
    return {"argv": [PY, "-c", code, *cli("prepare", "--target", str(s["ckpt"]), "--drafter", str(out))],
            "timeout": 180}


def reports_read_only(d: Path, s: dict) -> dict:
    """DFLASH_REPORTS on a read-only filesystem: the whole benchmark ran, then the report was lost."""
    mnt = d / "mnt"
    cleanup = mount_tmpfs(mnt, "64k", readonly=True)
    return {"argv": cli("bench", "--smoke"), "env": {"DFLASH_REPORTS": str(mnt / "reports")}, "cleanup": [cleanup],
            "allowed": [mnt]}


def prompts_accepted(d: Path, name: str, data: bytes) -> dict:
    """A prompts file that must pass its check, followed by the next check bench makes (an unwritable report
    folder): the case holds when the error names the report folder, not the prompts file."""
    spec = prompts_case(d, name, data)
    spec["env"] = reports_under_file(d)["env"]
    return spec
