"""Keeping a profiled process's tensors on pages already mapped, as they are without the profiler.

Without a profiler a framework's run reuses the memory the previous run freed: in the steady
state no kernel writes to a page the OS must first map (ResNet-50 v1 in torch, one thread: 0.1
page faults per run). A profiler's event memory grows in every run and takes freed blocks of
glibc's heap, so the model's next tensors land at the heap's top, on fresh pages, and the
kernels writing them fault (10,000 per run, a third of the run's time): per-layer times that no
kernel has in the user's run. ``HeapHeadroom`` stops that under glibc's allocator: after one run
outside the profiler (glibc's mmap threshold then rises as it does over the timed runs), the heap
is never trimmed, and before every profiled run its top is topped up with pages touched
beforehand, so what the profiler takes never pushes a tensor onto a page not yet mapped.

Where it cannot hold (another C library, or an allocator the user chose through ``LD_PRELOAD`` or
glibc's malloc tunables, whose own behaviour is then what the run is measured with) it does
nothing and says why (``HeapHeadroom.reason``).
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

# mallopt's parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_DEFAULT_MMAP_MAX = 65536
# free blocks of the headroom's size inside the heap held aside before one comes from the top
_MAX_HOLES = 64
# the headroom at least, whatever a run took: ResNet-50's profiled runs take 26-50 MB each
RESERVE_MIN = 256 << 20


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _glibc() -> tuple[Any | None, str | None]:
    """This process's C library when it is glibc with ``mallinfo2`` (2.33 on), else why not."""
    if os.environ.get("LD_PRELOAD"):
        return None, f"LD_PRELOAD={os.environ['LD_PRELOAD']} may replace the allocator: its behaviour is kept"
    if "malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return None, f"GLIBC_TUNABLES={os.environ['GLIBC_TUNABLES']} sets the allocator: its behaviour is kept"
    libc = ctypes.CDLL(None)
    if not all(hasattr(libc, f) for f in ("mallopt", "mallinfo2", "gnu_get_libc_version")):
        return None, "the C library is not glibc 2.33 or later (no mallinfo2)"
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.mallinfo2.restype = _MallInfo2
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return libc, None


class HeapHeadroom:
    """Call ``hold()`` once after a run outside the profiler, then ``refill()`` before and
    ``spent()`` after each profiled run. ``grown_bytes``: how far the refills grew the heap."""

    def __init__(self) -> None:
        self._libc, self.reason = _glibc()
        self.reserve = RESERVE_MIN
        self.grown_bytes = 0
        self._before = 0

    @property
    def active(self) -> bool:
        return self._libc is not None

    def hold(self) -> None:
        """From now on the heap keeps what is freed (setting the trim threshold also fixes the
        mmap threshold where the run before left it)."""
        if self._libc is not None:
            self._libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)

    def top(self) -> int:
        """Bytes free at the heap's top (what glibc could give back to the OS)."""
        return int(self._libc.mallinfo2().keepcost) if self._libc is not None else 0

    def refill(self) -> None:
        """Tops the heap's free top up to ``reserve`` bytes of touched pages: a block of that size
        cut from the top (extended as needed; a free block elsewhere the size fits is held aside
        meanwhile), taken from the heap even where glibc would map a block that size, written, and
        freed back into the top."""
        if self._libc is None:
            return
        libc, held = self._libc, []
        before = libc.mallinfo2()
        if before.keepcost < self.reserve:
            libc.mallopt(_M_MMAP_MAX, 0)
            try:
                for _ in range(_MAX_HOLES):
                    block = libc.malloc(self.reserve)
                    if not block:
                        break
                    now = libc.mallinfo2()
                    if (now.keepcost, now.arena) == (before.keepcost, before.arena):
                        held.append(block)  # a free block inside the heap, mapped already
                        continue
                    ctypes.memset(block, 0, self.reserve)
                    libc.free(block)
                    break
            finally:
                libc.mallopt(_M_MMAP_MAX, _DEFAULT_MMAP_MAX)
                for block in held:
                    libc.free(block)
        after = libc.mallinfo2()
        self.grown_bytes += int(after.arena) - int(before.arena)
        self._before = int(after.keepcost)

    def spent(self) -> None:
        """After a profiled run: a run that took much of the headroom doubles it for the next."""
        if self._libc is not None:
            self.reserve = max(self.reserve, 2 * (self._before - self.top()))
