"""HeapHeadroom: the kernel's own count of page faults (getrusage) is the oracle, never the
headroom's bookkeeping. mallopt changes the whole process, so each case runs in a child."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from benanza.heap import RESERVE_MIN, HeapHeadroom

# Allocates half of the headroom as 64 KiB blocks (below glibc's smallest mmap threshold, 128 KiB,
# so from the heap whatever the threshold was left at), writes every page, and prints the faults
# that took.
CHILD = textwrap.dedent("""
    import ctypes, json, resource, sys
    from benanza.heap import HeapHeadroom, RESERVE_MIN
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    def resident():
        return int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize()
    heap = HeapHeadroom()
    heap.hold()
    rss = resident()
    if sys.argv[1] == "refill":
        heap.refill()
    rss = resident() - rss
    block = 64 << 10
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(RESERVE_MIN // 2 // block):
        ctypes.memset(libc.malloc(block), 1, block)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    print(json.dumps({"faults": faults, "top": heap.top(), "active": heap.active, "grown": heap.grown_bytes,
                      "resident": rss}))
""")


def child(mode: str) -> dict:
    # glibc as it comes: no allocator preloaded or tuned by the environment the tests run in
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "GLIBC_TUNABLES")}
    done = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True, env=env)
    return json.loads(done.stdout)


def test_refilled_headroom_takes_new_tensors_without_a_fault():
    pages = RESERVE_MIN // 2 // 4096
    cold, kept = child("none"), child("refill")
    assert cold["active"] and kept["active"]
    # without it every page of the new blocks is mapped on first touch; with it, none is
    assert cold["faults"] >= 0.9 * pages
    assert kept["faults"] <= 0.02 * pages
    assert kept["top"] >= RESERVE_MIN // 2 - (1 << 20)  # what is left of the headroom, by glibc's count
    # how far the refill grew the heap is memory the process now holds, by the kernel's count
    assert kept["grown"] > RESERVE_MIN // 2 and abs(kept["resident"] - kept["grown"]) <= 0.05 * kept["grown"]


@pytest.mark.parametrize("name, value", [("LD_PRELOAD", "libjemalloc.so.2"),
                                         ("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=0")])
def test_an_allocator_the_user_chose_is_left_as_it_is(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    heap = HeapHeadroom()
    assert not heap.active and name in heap.reason
    heap.hold()
    heap.refill()
    heap.spent()
    assert heap.grown_bytes == 0 and heap.top() == 0
