"""Fuzzing the untrusted inputs: bundle.json (with the members that follow it) for `import`, and saved
runs / benchmark.json for `report` and `gate`. Whatever Hypothesis generates, the command ends in success or in
exactly one `error:` line with exit 2 (the report and the gate may also say 1: exactness failed / regression
found), never a traceback, and nothing outside the home or the report folder changes.

The bundles are synthetic (a manifest, two artifact files, a target manifest): import never loads a model, so
each example takes milliseconds and no prepared target is needed."""

from __future__ import annotations

import copy
import hashlib
import io
import json
import tarfile
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dflash_core import __main__ as cli
from dflash_core.report.__main__ import main as report_main
from dflash_core.store.artifacts import FORMAT_VERSION, target_key

from ..support.homes import tree
from ..support.report_data import bench_row, saved_run

HOSTILE_STRINGS = ["../x", "/etc/passwd", "targets/mini/../../x", "..", ".", "", "a" * 300, "artifacts/../../evil",
                   "targets/mini/modeling_evil.py", "0" * 64, "f" * 64, "../../targets", "../bundle", "targets/mini",
                   "artifacts", "cpu", "cuda:0", "../../elsewhere", "bundle.json", "\x00", "é/ü", "-1", "1e400",
                   "targets//mini", "targets/mini/", "C:\\x"]


def _deep(n: int):
    x: object = []
    for _ in range(n):
        x = [x]
    return x


VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2 ** 70), 2 ** 70), st.integers(-3, 3),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(HOSTILE_STRINGS), st.text(max_size=12),
    st.lists(st.one_of(st.integers(-2, 2), st.sampled_from(HOSTILE_STRINGS)), max_size=3),
    st.dictionaries(st.sampled_from(HOSTILE_STRINGS + ["sha256", "bytes"]), st.integers(-1, 10 ** 12), max_size=2),
    st.just(_deep(200)), st.just({}), st.just([]),
)


def _paths(obj, prefix=()):
    """Every location inside a JSON document (the document itself included), at most 10 levels down."""
    yield prefix
    if len(prefix) >= 10:
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, (*prefix, i))


def mutate(doc, data, rounds: int = 3, focus: tuple[tuple, ...] = ()):
    """1..rounds random edits: replace a value, delete a key or item, add a key, or rename a key. Half the edits
    hit one of the `focus` paths (the fields a defect was found in) when they exist."""
    doc = copy.deepcopy(doc)
    for _ in range(data.draw(st.integers(1, rounds))):
        present = [p for p in focus if p in set(_paths(doc))]
        if present and data.draw(st.booleans()):
            path = data.draw(st.sampled_from(present))
        else:
            path = data.draw(st.sampled_from(list(_paths(doc))))
        action = data.draw(st.sampled_from(["replace", "delete", "add", "rename"]))
        if not path:
            if action == "replace":
                doc = copy.deepcopy(data.draw(VALUES))
            continue
        parent = doc
        try:
            for step in path[:-1]:
                parent = parent[step]
        except (KeyError, IndexError, TypeError):
            continue
        key = path[-1]
        if action == "replace":
            parent[key] = copy.deepcopy(data.draw(VALUES))
        elif action == "delete":
            del parent[key]
        elif action == "add" and isinstance(parent, dict):
            parent[data.draw(st.sampled_from(HOSTILE_STRINGS + ["extra"]))] = copy.deepcopy(data.draw(VALUES))
        elif action == "rename" and isinstance(parent, dict):
            parent[data.draw(st.sampled_from(HOSTILE_STRINGS))] = parent.pop(key)
    return doc


def _one_error_or_none(err: str, rc: int) -> None:
    lines = [ln for ln in err.splitlines() if ln.startswith("error:") or "Traceback" in ln]
    if rc == 2:
        assert len(lines) == 1 and lines[0].startswith("error: "), err
    else:
        assert not lines, err


# --- a synthetic bundle ------------------------------------------------------------------------------------------

def _entry(data: bytes) -> dict:
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def synthetic_bundle() -> tuple[dict, dict[str, bytes]]:
    """(bundle.json's data, member name -> bytes) of a small, valid mini bundle."""
    identity = {"name": "mini", "model_type": "lfm2", "config_sha256": "c" * 64, "weights_sha256": "d" * 64,
                "tokenizer_sha256": "e" * 64, "parameters": 10, "vocab_size": 4, "hidden_size": 2, "num_layers": 1,
                "content_sha256": "a" * 64, "revision": None, "hub_commit": None}
    adir = f"artifacts/{target_key(identity)}"
    arts = {"drafter.safetensors": b"\x00" * 64, "trajectories.json": b'{"sequences": []}'}
    manifest = json.dumps({"format_version": FORMAT_VERSION, "target": identity,
                           "files": {k: _entry(v) for k, v in arts.items()}}).encode()
    tfiles = {"config.json": b'{"model_type": "lfm2"}', "model.safetensors": b"\x01" * 32}
    tmanifest = json.dumps({"format_version": FORMAT_VERSION, "files": {k: _entry(v) for k, v in tfiles.items()}}
                           ).encode()
    blobs = {f"{adir}/manifest.json": manifest, **{f"{adir}/{k}": v for k, v in arts.items()},
             "targets/mini/target_manifest.json": tmanifest, **{f"targets/mini/{k}": v for k, v in tfiles.items()}}
    doc = {"format": "dflash-bundle", "format_version": 1, "target": identity, "artifact_dir": adir,
           "target_dir": "targets/mini", "files": {k: _entry(v) for k, v in blobs.items()}}
    return doc, blobs


def write_bundle(path: Path, doc, blobs: dict[str, bytes], extra: list[tarfile.TarInfo] = ()) -> None:
    """bundle.json first, then a member for every name the (possibly mutated) doc lists, then `extra`."""
    files = doc.get("files") if isinstance(doc, dict) else None
    names = [n for n in files if isinstance(n, str)] if isinstance(files, dict) else list(blobs)
    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        body = json.dumps(doc).encode()
        info = tarfile.TarInfo("bundle.json")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
        for name in names:
            if not name or "\x00" in name:
                continue
            data = blobs.get(name, b"x" * 16)
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra:
            tar.addfile(info)


EXTRA_MEMBERS = st.lists(st.sampled_from(["symlink", "hardlink", "dir", "fifo"]), max_size=2)


def _extra(kinds: list[str]) -> list[tarfile.TarInfo]:
    out = []
    for kind in kinds:
        info = tarfile.TarInfo("targets/mini/extra")
        info.type = {"symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE, "dir": tarfile.DIRTYPE,
                     "fifo": tarfile.FIFOTYPE}[kind]
        info.linkname = "/etc/passwd" if "link" in kind else ""
        out.append(info)
    return out


def test_the_synthetic_bundle_imports(tmp_path, capsys):
    """The fuzz test's starting point is a bundle import accepts: the mutations, not the base, are refused."""
    doc, blobs = synthetic_bundle()
    write_bundle(tmp_path / "b.tar.gz", doc, blobs)
    assert cli.main(["import", str(tmp_path / "b.tar.gz"), "--home", str(tmp_path / "home")]) == 0, \
        capsys.readouterr().err
    assert (tmp_path / "home" / doc["artifact_dir"] / "manifest.json").is_file()


def artifacts_only(doc: dict, blobs: dict[str, bytes]) -> tuple[dict, dict[str, bytes]]:
    """The same bundle for a local target: only the artifact directory travels (target_dir null)."""
    doc = copy.deepcopy(doc)
    doc["target_dir"] = None
    doc["files"] = {k: v for k, v in doc["files"].items() if k.startswith("artifacts/")}
    return doc, {k: v for k, v in blobs.items() if k.startswith("artifacts/")}


def bundle_focus(doc: dict) -> tuple[tuple, ...]:
    names = sorted(doc["files"])
    return (("target_dir",), ("artifact_dir",), ("target", "content_sha256"), ("target", "model_type"),
            ("format_version",), ("files",), *((("files", n),) for n in names),
            *((("files", n, "bytes"),) for n in names[:2]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), extra=EXTRA_MEMBERS, local=st.booleans())
def test_fuzz_bundle_json(data, extra, local):
    doc, blobs = synthetic_bundle()
    if local:
        doc, blobs = artifacts_only(doc, blobs)
    bad = mutate(doc, data, focus=bundle_focus(doc))
    with tempfile.TemporaryDirectory() as d, pytest.MonkeyPatch.context() as mp:
        import sys

        root = Path(d)
        outer = root / "outer"
        parent = outer / "P"
        home = parent / "home"
        for folder, name in ((parent / "bundle", "thesis.txt"), (outer / "targets", "keep.txt"),
                             (home / "targets" / "mine", "w.txt")):
            folder.mkdir(parents=True)
            (folder / name).write_text("the user's own file\n")
        path = root / "b.tar.gz"
        write_bundle(path, bad, blobs, _extra(extra))
        before_outside, before_home = tree(outer, skip=home), tree(home)
        err = io.StringIO()
        mp.setattr(sys, "stderr", err)
        mp.setattr(sys, "stdout", io.StringIO())
        rc = cli.main(["import", str(path), "--home", str(home)])
        assert rc in (0, 2)
        _one_error_or_none(err.getvalue(), rc)
        assert tree(outer, skip=home) == before_outside, "a write outside the home"
        after = tree(home)
        if rc == 2:
            assert {k: v for k, v in after.items() if k != ".prepare.lock"} == before_home
        else:
            assert bad["artifact_dir"] == doc["artifact_dir"] and bad["target_dir"] in (None, "targets/mini")
            assert all(k.startswith(("artifacts", "targets")) or k == ".prepare.lock" for k in after), after
            assert (home / "targets" / "mine" / "w.txt").is_file()


# --- saved runs and benchmark.json --------------------------------------------------------------------------------

def _base_run() -> dict:
    return saved_run([bench_row("normal", 0), bench_row("dflash", 2, speedup=1.5, rounds=[1.45, 1.5, 1.55]),
                      bench_row("mobs", 2, speedup=1.6, rounds=[1.5, 1.6, 1.7])])


@pytest.fixture(scope="module")
def canonical(tmp_path_factory) -> dict:
    """A report's benchmark.json (the gate's other input kind), built by the CLI from the base run."""
    d = tmp_path_factory.mktemp("canon")
    (d / "run.json").write_text(json.dumps(_base_run()))
    assert report_main([str(d / "run.json"), "--out", str(d / "r")]) == 0
    return json.loads((d / "r" / "cpu" / "benchmark.json").read_text())


def _run_cli(args: list[str]) -> tuple[int, str]:
    import sys

    err = io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "stderr", err)
        mp.setattr(sys, "stdout", io.StringIO())
        rc = report_main(args)
    return rc, err.getvalue()


def judgeable(doc) -> bool:
    """An independent statement of what the gate needs to judge a document (fail closed: else exit 2)."""
    import math

    def num(x):
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0

    if not isinstance(doc, dict) or not isinstance(doc.get("methods"), dict):
        return False
    ex = doc.get("exactness")
    if not (isinstance(ex, dict) and isinstance(ex.get("all_exact"), bool) and isinstance(ex.get("failures"), list)
            and all(isinstance(f, str) for f in ex["failures"])):
        return False
    for m in doc["methods"].values():
        rows = m.get("rows") if isinstance(m, dict) else None
        if not isinstance(rows, dict) or not rows:
            return False
        for r in rows.values():
            if not (isinstance(r, dict) and all(num(r.get(k)) for k in ("tokens_per_target_call", "speedup",
                                                                         "speedup_q1", "speedup_q3"))):
                return False
    return True


def report_focus(doc: dict) -> tuple[tuple, ...]:
    if "benchmarks" in doc:
        return tuple((("benchmarks", i, "extra_info", k),) for i in range(3)
                     for k in ("speedup", "speedup_rounds", "width", "tokens_per_target_call", "exact"))
    return (("methods",), ("exactness", "all_exact"), ("exactness", "failures"), ("exactness",),
            *((("methods", m, "rows"),) for m in doc["methods"]),
            *((("methods", m, "rows", w, k),) for m in doc["methods"] for w in doc["methods"][m]["rows"]
              for k in ("speedup", "tokens_per_target_call", "speedup_q1", "speedup_q3")))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), which=st.sampled_from(["saved", "canonical"]))
def test_fuzz_report_and_gate_inputs(canonical, data, which):
    base = _base_run() if which == "saved" else canonical
    bad = mutate(base, data, focus=report_focus(base))
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        (root / "bystander.txt").write_text("keep\n")
        good, hostile = root / "good.json", root / "hostile.json"
        good.write_text(json.dumps(_base_run()))
        hostile.write_text(json.dumps(bad))  # NaN and Infinity become their (non-JSON) literals, as a file may hold
        before = tree(root)
        out = root / "reports"
        if which == "saved":
            rc, err = _run_cli([str(hostile), "--out", str(out)])
            assert rc in (0, 1, 2)
            _one_error_or_none(err, rc)
        for args in (["gate", str(good), str(hostile)], ["gate", str(hostile), str(good)]):
            rc, err = _run_cli(args)
            assert rc in (0, 1, 2, 3)  # 3: the gate's "inconclusive" (a run that cannot support a verdict)
            _one_error_or_none(err, rc)
            if which == "canonical" and not judgeable(bad):
                assert rc == 2, f"the gate judged a document it cannot judge: {args[1:]}"
        written = {k for k in tree(root) if k not in before}
        assert all(k.startswith("reports") for k in written), written
        assert {k: v for k, v in tree(root).items() if k in before} == before


def test_a_gate_with_no_regression_needs_a_judgeable_document(canonical):
    """Fail closed, the property the fuzzing leans on: a NEW without numbers is never 'no regression'."""
    from dflash_core.errors import ReportInputError
    from dflash_core.report.gate import gate

    new = copy.deepcopy(canonical)
    for m in new["methods"].values():
        for r in m["rows"].values():
            r.pop("speedup")
    with pytest.raises(ReportInputError):
        gate(canonical, new)
