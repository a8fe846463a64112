"""`./lab setup` installs torch from the index the machine can use, and tox (scripts/tox_pip.py) follows the same rule.

The lab runs for real, in bash, against a stand-in virtual environment: its `python` is a stub that records every
call and answers as a machine would (nothing importable yet; the `--no-index` dry run finds a local torch or not),
and `nvidia-smi` is a stub on PATH (or absent). PATH holds only these stubs and the few tools the script uses, so
a real driver or pip on the test machine cannot leak in.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CPU = "https://download.pytorch.org/whl/cpu"
CU = "https://download.pytorch.org/whl/cu128"

STUB_PYTHON = """#!/bin/sh
# one line per call: the arguments separated by US (0x1f)
for a in "$@"; do printf '%s\\037' "$a"; done >> "$STUB_LOG"; echo >> "$STUB_LOG"
case "$1$2" in
  "-cimport torch, sys"*) exit "$STUB_HAVE_TORCH" ;;  # 0: torch 2.13.0 is already in the venv
  -c*) exit 1 ;;  # the project is not installed yet
esac
case " $* " in
  *" --dry-run "*) exit "$STUB_LOCAL_TORCH" ;;  # 0: pip's configuration finds torch without an index
esac
exit 0
"""
STUB_SMI = """#!/bin/sh
echo "nvidia-smi $*" >> "$STUB_LOG.smi"
exit "$STUB_SMI_RC"
"""
ACTIVATE = 'PATH="$VIRTUAL_ENV_DIR/bin:$PATH"; export PATH\n'

# (TORCH_INDEX_URL, nvidia-smi: None = absent, else its exit code, local torch found by pip) -> torch's index args
CASES = {
    "cpu machine, nothing local": (None, None, False, ["--extra-index-url", CPU]),
    "cpu machine, local wheel configured": (None, None, True, []),
    "nvidia driver": (None, 0, False, []),
    "nvidia-smi without a working driver": (None, 9, False, ["--extra-index-url", CPU]),
    "explicit index wins over the driver": (CU, 0, True, ["--extra-index-url", CU]),
    "explicit cpu index": (CPU, None, True, ["--extra-index-url", CPU]),
}


def _tools(d: Path) -> Path:
    """A PATH folder with only what the lab's setup runs besides python and nvidia-smi."""
    d.mkdir()
    for tool in ("bash", "sh", "dirname", "touch", "cat", "env"):
        exe = shutil.which(tool)
        assert exe, tool
        (d / tool).symlink_to(exe)
    return d


def _run_lab_setup(tmp_path: Path, index_url, smi_rc, local: bool, have_torch: bool = False) -> list[list[str]]:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    py = venv / "bin" / "python"
    py.write_text(STUB_PYTHON)
    py.chmod(0o755)
    (venv / "bin" / "activate").write_text(ACTIVATE)
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    if smi_rc is not None:
        smi = stubs / "nvidia-smi"
        smi.write_text(STUB_SMI)
        smi.chmod(0o755)
    log = tmp_path / "calls.log"
    env = {"PATH": f"{stubs}:{_tools(tmp_path / 'tools')}", "HOME": str(tmp_path), "DFLASH_VENV": str(venv),
           "VIRTUAL_ENV_DIR": str(venv), "STUB_LOG": str(log), "STUB_LOCAL_TORCH": "0" if local else "1",
           "STUB_SMI_RC": str(smi_rc if smi_rc is not None else 127),
           "STUB_HAVE_TORCH": "0" if have_torch else "1"}
    if index_url:
        env["TORCH_INDEX_URL"] = index_url
    proc = subprocess.run(["bash", str(REPO / "lab"), "setup"], env=env, capture_output=True, text=True, timeout=60,
                          executable=shutil.which("bash"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (venv / ".installed").is_file()
    return [line.split("\x1f")[:-1] for line in log.read_text().splitlines()]


def _torch_install(calls: list[list[str]]) -> list[str]:
    """The arguments of the one `pip install` of torch, after the pin."""
    (install,) = [c for c in calls if c[:3] == ["-m", "pip", "install"] and "torch==2.13.0" in c
                  and "--dry-run" not in c]
    return install[install.index("torch==2.13.0") + 1:]


@pytest.mark.parametrize("case", CASES)
def test_lab_setup_installs_torch_from_the_index_the_machine_can_use(tmp_path, case):
    index_url, smi_rc, local, want = CASES[case]
    calls = _run_lab_setup(tmp_path, index_url, smi_rc, local)
    assert _torch_install(calls) == want, calls
    assert ["-m", "pip", "install", "-q", "-e", ".[dev]"] in calls  # then the project
    probed = [c for c in calls if "--dry-run" in c]
    if index_url is None and smi_rc != 0:  # the local probe runs only when the first two rules did not decide
        assert probed == [["-m", "pip", "install", "--dry-run", "--no-index", "--no-deps", "--ignore-installed", "-q",
                           "torch==2.13.0"]]
    else:
        assert probed == []


def test_lab_setup_leaves_an_installed_torch_alone(tmp_path):
    """torch 2.13.0 already in the venv: no torch install, and neither the driver nor pip is asked."""
    calls = _run_lab_setup(tmp_path, None, 0, False, have_torch=True)
    assert not [c for c in calls if "torch==2.13.0" in c]
    assert not (tmp_path / "calls.log.smi").exists()
    assert ["-m", "pip", "install", "-q", "-e", ".[dev]"] in calls


@pytest.mark.parametrize("case", CASES)
def test_tox_pip_follows_the_lab_rule(case, monkeypatch):
    """scripts/tox_pip.py gives tox envs the same torch index for the same machine."""
    from ..support.helpers import load_file

    tox_pip = load_file("scripts/tox_pip.py")
    index_url, smi_rc, local, want = CASES[case]
    monkeypatch.setattr(tox_pip, "nvidia_driver", lambda environ: smi_rc == 0)
    monkeypatch.setattr(tox_pip, "local_torch", lambda: local)
    env = {"TORCH_INDEX_URL": index_url} if index_url else {}
    assert tox_pip.pip_command(["torch==2.13.0"], env)[4:] == [*want, "torch==2.13.0"]
    lab = (REPO / "lab").read_text()
    assert " ".join(tox_pip.LOCAL_PROBE[:-1]) + ' "$TORCH_PIN"' in lab  # the same local probe as the lab's
    assert f'CPU_INDEX="{tox_pip.CPU_INDEX}"' in lab and f'TORCH_PIN="{tox_pip.TORCH_PIN}"' in lab


def test_tox_pip_checks_a_real_nvidia_smi_on_path(tmp_path):
    """nvidia_driver runs `nvidia-smi -L` found on the environment's PATH, and needs it to succeed."""
    from ..support.helpers import load_file

    tox_pip = load_file("scripts/tox_pip.py")
    assert tox_pip.nvidia_driver({"PATH": str(tmp_path)}) is False
    smi = tmp_path / "nvidia-smi"
    for rc, want in ((0, True), (9, False)):
        smi.write_text(f"#!/bin/sh\nexit {rc}\n")
        smi.chmod(0o755)
        assert tox_pip.nvidia_driver({"PATH": str(tmp_path)}) is want
    os.remove(smi)
