"""trim_free_memory (runtime/allocator.py), which drafter training calls at each held-out evaluation: measured
through the resident set of a fresh process, so the test sees pages going back to the system, not a return value."""

import platform
import subprocess
import sys

import pytest

# 3,000 touched 64 KiB blocks (under glibc's mmap threshold: they come from the heap), all freed but the last, which
# pins the heap's top so glibc's own top trim cannot release them; prints the resident MiB handed back after
# `trim_free_memory` (mode "trim") or after nothing (mode "keep").
PROBE = """
import ctypes, sys
from dflash_core.runtime.allocator import trim_free_memory
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def rss_mib():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
blocks = [libc.malloc(64 << 10) for _ in range(3000)]
for b in blocks:
    ctypes.memset(b, 1, 64 << 10)
for b in blocks[:-1]:
    libc.free(b)
before = rss_mib()
released = trim_free_memory() if sys.argv[1] == "trim" else False
print(before - rss_mib(), int(released))
"""


def _released_mib(mode: str) -> tuple[float, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=60, check=True)
    mib, flag = out.stdout.split()
    return float(mib), int(flag)


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                    reason="malloc_trim is glibc's; elsewhere trim_free_memory does nothing and returns False")
def test_trim_hands_freed_heap_pages_back():
    kept, _ = _released_mib("keep")
    trimmed, flag = _released_mib("trim")
    assert kept < 16  # freed but held: glibc alone keeps the ~187 MiB
    assert trimmed > 150 and flag == 1


def test_trim_is_a_no_op_without_glibc(monkeypatch):
    from dflash_core.runtime import allocator

    allocator._glibc.cache_clear()
    monkeypatch.setattr(allocator.platform, "libc_ver", lambda: ("", ""))
    try:
        assert allocator.trim_free_memory() is False
    finally:
        allocator._glibc.cache_clear()
