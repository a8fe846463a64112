"""What a saved run records about the machine: no volatile clock readings, and the thread environment that
changes CPU timings (OMP_WAIT_POLICY=PASSIVE slowed a one-row decode step 1.4-2.1x on a 2-core Xeon)."""

from __future__ import annotations

from dflash_core.report.plugin import pytest_benchmark_update_machine_info


def test_machine_info_records_the_thread_environment_and_drops_clock_readings(monkeypatch):
    for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "KMP_BLOCKTIME", "MKL_NUM_THREADS", "OMPX_OTHER"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setenv("KMP_BLOCKTIME", "0")
    monkeypatch.setenv("PATH_LIKE_OMP_", "not a thread setting")
    info = {"cpu": {"brand_raw": "x", "hz_actual": [1, 0], "hz_actual_friendly": "1 Hz"}}
    pytest_benchmark_update_machine_info(None, info)
    assert info["cpu"] == {"brand_raw": "x"}
    env = info["accelerator"]["thread_env"]
    assert env["OMP_WAIT_POLICY"] == "PASSIVE" and env["KMP_BLOCKTIME"] == "0"
    assert "PATH_LIKE_OMP_" not in env and list(env) == sorted(env)
    assert isinstance(info["accelerator"]["threads"], int)
    monkeypatch.delenv("OMP_WAIT_POLICY")
    again = {}
    pytest_benchmark_update_machine_info(None, again)
    assert "OMP_WAIT_POLICY" not in again["accelerator"]["thread_env"]  # compares see the setting change
