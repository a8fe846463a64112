"""Scale-out and resume of `prepare` on CPU: torchrun with 2 gloo processes trains the same drafter as one
process (float64, within 1e-9: only the order of the gradient sum differs), a 2-rank prepare writes verified
artifacts with teacher data identical to a one-process prepare's, and a prepare killed with SIGKILL after a
training checkpoint resumes from it to the artifacts an uninterrupted run writes, byte for byte."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ..support.envs import child_env

WORKER = Path(__file__).resolve().parents[1] / "support" / "prepare_worker.py"
REPO = Path(__file__).resolve().parents[2]


def _env() -> dict:
    return child_env(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")


def _torchrun(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(WORKER), *args]
    return subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=timeout, cwd=REPO)


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    from dflash_core.testing import TinySpec, build_tiny

    ckpt = tmp_path_factory.mktemp("dist") / "ckpt"
    build_tiny(TinySpec(dtype="float32", pattern="CCACAC")).save_pretrained(ckpt)
    return ckpt


def test_ddp_training_on_two_ranks_equals_one_process_in_float64(tmp_path):
    from tests.support.prepare_worker import train64

    out = tmp_path / "ddp.safetensors"
    res = _torchrun("train64", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    from safetensors.torch import load_file

    ddp = load_file(str(out))
    meta = json.loads(Path(str(out) + ".json").read_text())
    torch.set_num_threads(1)
    single, m = train64()
    assert meta["world_size"] == 2 and m["world_size"] == 1
    for k, v in single.state_dict().items():
        torch.testing.assert_close(ddp[k], v, rtol=0, atol=1e-9, msg=k)
    assert abs(meta["final_loss"] - m["final_loss"]) < 1e-9
    assert meta["heldout"] == pytest.approx(m["heldout_position_accuracy"], abs=1e-12)


def test_two_rank_prepare_writes_verified_artifacts_with_the_unsharded_teacher_data(tiny_ckpt, tmp_path):
    from dflash_core.prepare.pipeline import TRAJ_FILE
    from dflash_core.prepare.prepared import load_prepared
    from dflash_core.runtime.target import load_target

    res = _torchrun("prepare", str(tiny_ckpt), str(tmp_path / "ddp"), "12", "0")
    assert res.returncode == 0, res.stderr[-3000:]
    one = subprocess.run([sys.executable, str(WORKER), "prepare", str(tiny_ckpt), str(tmp_path / "one"), "12", "0"],
                         env=_env(), capture_output=True, text=True, timeout=600, cwd=REPO)
    assert one.returncode == 0, one.stderr[-3000:]
    rt = load_target(str(tiny_ckpt), "cpu", "float32")
    a = load_prepared(rt, home=tmp_path / "ddp")  # verified: manifest, SHA-256 of every file, target identity
    b = load_prepared(rt, home=tmp_path / "one")
    assert a.manifest["drafter"]["world_size"] == 2 and a.manifest["teacher"]["ranks"] == 2
    assert a.manifest["files"][TRAJ_FILE] == b.manifest["files"][TRAJ_FILE]  # sharded teacher == unsharded
    assert not (tmp_path / "ddp" / "work").exists() or not any((tmp_path / "ddp" / "work").iterdir())


def test_a_killed_prepare_resumes_from_its_last_checkpoint_to_the_same_artifacts(tiny_ckpt, tmp_path):
    home = tmp_path / "home"
    stalled = tmp_path / "stalled"
    args = [sys.executable, str(WORKER), "prepare", str(tiny_ckpt), str(home), "40", "10"]
    proc = subprocess.Popen([*args, "--stall"], env=_env(), cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300
        while not stalled.exists():
            assert proc.poll() is None, f"prepare ended before its first checkpoint: {proc.stderr.read()[-2000:]}"
            assert time.time() < deadline, "no training checkpoint within 300 s"
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()
    assert int(stalled.read_text()) == 10
    assert any(home.glob("work/*/train-checkpoint.safetensors")) and any(home.glob("work/*/teacher.safetensors"))
    resumed = subprocess.run(args, env=_env(), capture_output=True, text=True, timeout=600, cwd=REPO)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming drafter training from the checkpoint at step 10" in resumed.stderr
    assert "teacher data reloaded" in resumed.stderr
    fresh = subprocess.run([*args[:4], str(tmp_path / "fresh"), *args[5:]], env=_env(), capture_output=True,
                           text=True, timeout=600, cwd=REPO)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    man = [json.loads(next(h.glob("artifacts/*/manifest.json")).read_text()) for h in (home, tmp_path / "fresh")]
    assert man[0]["drafter"]["resumed_from_step"] == 10 and man[1]["drafter"]["resumed_from_step"] is None
    assert man[0]["files"] == man[1]["files"]  # every artifact byte-identical to the uninterrupted run's
    assert not any(home.glob("work/*/*"))  # the completed run removed what it could resume from


def test_ranks_on_one_machine_share_the_threads(monkeypatch):
    from dflash_core.prepare.distributed import threads_per_rank

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert threads_per_rank(2) == 2  # not launched: as asked
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert threads_per_rank(2) == 1 and threads_per_rank(1) == 1 and threads_per_rank(8) == 4
