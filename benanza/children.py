"""Child processes that never outlive Benanza.

A benchmark binary runs in its own session so that Ctrl-C reaches Benanza, not the child;
the price is that nothing kills it when Benanza itself dies. Two guards close that gap:
the kernel kills the child when its parent dies (``PR_SET_PDEATHSIG``, which also covers
``kill -9`` of Benanza), and SIGTERM is turned into the same clean interruption as Ctrl-C,
so the usual cleanup (kill the child's process group, store what was measured) runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Iterator

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: unwind like Ctrl-C, so every ``finally`` cleans up its children."""


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name or "libc.so.6", use_errno=True)
    except OSError:
        return None


_LIBC = _libc()


def die_with_parent(parent: int) -> None:
    """In a freshly forked child: ask the kernel for SIGKILL when the parent dies.

    Runs between fork and exec (``preexec_fn``). ``parent`` is the pid that forked: if it died
    before the request took effect, the child has been re-parented already and exits at once.
    """
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def popen(cmd: list[str], **kwargs) -> subprocess.Popen:
    """``subprocess.Popen`` whose child is killed by the kernel if this process dies.

    The death signal is tied to the thread that forks, which for Benanza is the thread that
    also waits for the child, so it never fires early.
    """
    parent = os.getpid()
    return subprocess.Popen(cmd, preexec_fn=lambda: die_with_parent(parent), **kwargs)  # noqa: PLW1509


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's whole process group (it leads its own session), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Inside the block SIGTERM raises :class:`Terminated` (a KeyboardInterrupt).

    Only the main thread can own signal handlers; elsewhere the block is a no-op.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
