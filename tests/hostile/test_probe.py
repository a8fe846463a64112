"""A quick subset of the hostile-input probe (`tests/hostile/probe/`, a manual run of every case: see
docs/hostile-input.md): one representative case of each kind of surface, each the real CLI in a subprocess with a
home of its own next to a hashed bystander folder, must hold (one `error:` line and exit 2, or the right success;
nothing outside the home changed; no hang, no traceback). The material is the session's tiny prepared target,
copied, so only the bundles, the drafter and the saved runs these cases use are built here."""

from __future__ import annotations

import shutil

import pytest

from .probe.cases import cases
from .probe.judge import probe
from .probe.material import prepare_material

# one case per kind of surface, chosen for speed (the whole list is `python -m tests.hostile.probe`)
QUICK = {
    "1 security": "target_dir absolute",  # a bundle that names a folder outside the home
    "2 bomb": "listed bytes over the cap",  # a bundle that would fill the disk
    "3 crash": "stage an older release stranded",  # a half-done import found by the next command
    "4 export": "export with a symlink to /etc/passwd and stray files",  # what travels (expect ok)
    "5 resources": "report on 50k rounds",  # bounded memory
    "6 gate": "--speedup-drop nan with a 69 % regression",  # the gate's knobs, on schema-7 runs
    "7 bench": "DFLASH_TOKENS=abc bench --smoke",  # validate before work
    "r3 drafter": "--drafter header claiming 6.7 GB for one weight",  # a drafter folder (peak memory checked)
    "10 hangs": "report input is a FIFO",  # a FIFO where a file is expected
    "tb report": "report on rounds of 1e308",  # numbers that overflow
    "r3 lock": ".prepare.lock is a FIFO",  # the home's own files
    "r3 prompts": "a JSONL prompt holding a lone surrogate",  # a prompt file
}
BY_NAME = {c.name: c for c in cases()}


@pytest.fixture(scope="module")
def material(tiny_prepared, tmp_path_factory):
    work = tmp_path_factory.mktemp("probe")
    shutil.copytree(tiny_prepared.path, work / "lab" / "ckpt")
    shutil.copytree(tiny_prepared.home, work / "lab" / "home")
    return work, prepare_material(work, work / "lab")


def test_the_quick_cases_are_cases_of_the_probe():
    assert {BY_NAME[name].group for name in QUICK.values()} == set(QUICK)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(QUICK.values()), ids=list(QUICK))
def test_a_probe_case_holds(material, name):
    work, shared = material
    r = probe(BY_NAME[name], shared, work, timeout=120)
    assert r.verdict == "held", f"{name}: {r.verdict} -- {r.why}"
