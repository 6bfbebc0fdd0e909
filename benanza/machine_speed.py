"""The machine's speed at a moment: a fixed reference kernel, timed by the runner before each
child of benchmarks (and by an in-process backend's child between its benchmarks) and by
``benanza profile`` before, between and after the framework's timed runs.

A shared host can slow its guest for minutes without a trace in steal time or the scheduler's
counters (docs/measurement.md: the same single-thread loop ran 68–95 ms per second on an idle
VM; a whole framework profile 20–35 % slower than twenty minutes earlier). Contention checks
cannot see that; a kernel of fixed work timed on both sides can. When the profile's and the
benchmarks' readings differ, the Benanza ratio compares a run and a bound taken at two speeds,
and the analysis says so (``SpeedCompared``).

Two readings, because a host can take either from a guest: ``core_ms``, a fixed loop of small
matrix products on one thread (the core's speed: its clock, what shares it), and ``memory_ms``,
a copy of twice the last-level cache (the memory bandwidth it gets). Each is timed in pieces
and read at their median: the core's blocks of about 1 ms, shorter than a scheduler's slice, are
mostly whole beside a neighbour the scheduler counts (the contention checks catch that one), as
the benchmarks' low percentile reads their calls; a slowdown that lasts through the reading
moves it. A run of several threads is read on each CPU it may use (``Reader``): one thread on
one CPU misses a host that slows the other.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass

# How far the profile's reading may lie from the benchmarks' before an analysis warns, per part:
# the readings' own spread on a quiet machine here (95 % of back-to-back readings within this of
# their median: the memory bandwidth a shared host gives moves by tens of per cent in a second)
CORE_TOLERANCE, MEMORY_TOLERANCE = 0.15, 0.30
# 64×64 f32 products: single-threaded in numpy's BLAS (OpenBLAS threads from 65,536 × 4
# multiply-adds up), their 48 KiB in L2; a loop of small element-wise numpy calls was tried
# first and read the host's slow phases 1.77× slow where a 3×3 convolution in ONNX Runtime ran
# 1.12×, the products 1.19× (docs/measurement.md)
_CORE_BLOCKS, _CORE_CALLS, _CORE_N = 9, 150, 64
_MEMORY_COPIES = 3
_MEMORY_CHUNK_BYTES = 1 << 20  # about 0.1 ms at 20 GB/s, read and written
_MIN_COPY_BYTES = 16 << 20  # where sysfs names no cache
# a result's metrics that hold the reading taken before it: its child's own (an in-process
# backend reads at most every READ_EVERY_S, 1-2 % of its time), else the runner's before the child
METRICS = ("probe_core_ms", "probe_memory_ms")
READ_EVERY_S = 5.0


@dataclass(frozen=True)
class MachineSpeed:
    """One reading of the reference kernel: its two parts' median times, ms."""

    core_ms: float
    memory_ms: float

    def to_json(self) -> dict:
        return {"core_ms": self.core_ms, "memory_ms": self.memory_ms}

    @classmethod
    def from_json(cls, d: dict) -> MachineSpeed:
        """KeyError names a missing field; ValueError a time that is not one."""
        speed = cls(float(d["core_ms"]), float(d["memory_ms"]))
        if not (speed.core_ms > 0 and speed.memory_ms > 0):
            raise ValueError("a reading is not a positive time")
        return speed

    def metrics(self) -> dict[str, float]:
        """The reading as a result's metrics (``METRICS``)."""
        return dict(zip(METRICS, (self.core_ms, self.memory_ms), strict=True))

    @classmethod
    def from_metrics(cls, metrics: dict) -> MachineSpeed | None:
        """The reading a result's metrics hold; None for a result measured without one."""
        values = [metrics.get(k) for k in METRICS]
        if not all(isinstance(v, (int, float)) and v > 0 for v in values):
            return None
        return cls(*(float(v) for v in values))  # type: ignore[arg-type]


def _copy_bytes() -> int:
    from .system import cache_levels

    levels = cache_levels(len(os.sched_getaffinity(0)))
    return max(2 * levels[-1].total, _MIN_COPY_BYTES) if levels else _MIN_COPY_BYTES


class Reader:
    """Reads the machine's speed for a run of ``threads`` threads, its buffers allocated once: a
    benchmark child reads it every ``READ_EVERY_S`` without new pages each time.

    One thread reads it where the scheduler puts it, as it puts a one-thread benchmark (about
    0.03 s). More threads read it on each CPU this process may use in turn, and take the
    ``threads``-th fastest CPU's, part by part: such a run waits for its slowest thread, and the
    scheduler gives it the fastest CPUs it can (0.03 s per CPU)."""

    def __init__(self, threads: int = 1) -> None:
        import numpy as np

        self.threads = max(1, threads)
        self._a = np.linspace(0.5, 1.5, _CORE_N * _CORE_N, dtype=np.float32).reshape(_CORE_N, _CORE_N)
        self._b, self._c = self._a.T.copy(), np.empty_like(self._a)
        n = _copy_bytes() // 8
        # both written now (np.zeros would leave the destination's pages unmapped): the first timed
        # copy faulted them in, its chunks 1.8x the later ones', and a fault costs most where
        # the kernel must compact or reclaim memory for it, as after a long benchmark run
        self._src, self._dst = np.ones(n), np.full(n, 2.0)
        self._chunk = min(n, _MEMORY_CHUNK_BYTES // 8)

    def __call__(self) -> MachineSpeed:
        cpus = sorted(os.sched_getaffinity(0))
        if self.threads == 1 or len(cpus) == 1:
            return self._read()
        per_cpu = []
        try:
            for cpu in cpus:
                os.sched_setaffinity(0, {cpu})  # this thread only: pid 0 is the calling thread
                per_cpu.append(self._read())
        finally:
            os.sched_setaffinity(0, cpus)
        at = min(self.threads, len(cpus)) - 1
        return MachineSpeed(sorted(r.core_ms for r in per_cpu)[at], sorted(r.memory_ms for r in per_cpu)[at])

    def _read(self) -> MachineSpeed:
        import numpy as np

        blocks = []
        for _ in range(_CORE_BLOCKS):
            started = time.perf_counter()
            for _ in range(_CORE_CALLS):
                np.matmul(self._a, self._b, out=self._c)
            blocks.append(time.perf_counter() - started)
        chunks = []
        for _ in range(_MEMORY_COPIES):
            # in chunks, read at their median as the core's blocks; they stream from memory,
            # the whole copy being twice the cache
            for at in range(0, self._src.size, self._chunk):
                started = time.perf_counter()
                np.copyto(self._dst[at:at + self._chunk], self._src[at:at + self._chunk])
                chunks.append(time.perf_counter() - started)
        copy_s = statistics.median(chunks) * self._src.size / self._chunk
        return MachineSpeed(statistics.median(blocks) * 1e3, copy_s * 1e3)


class Periodic:
    """Readings for a run of ``threads`` threads, each once ``every_s`` have passed since the last
    (``due``), or longer where a reading of many CPUs is slow: readings take at most ``share`` of
    the time between them."""

    def __init__(self, threads: int, every_s: float = READ_EVERY_S, share: float = 0.02) -> None:
        self._threads, self._min_every, self._share = threads, every_s, share
        self._reader: Reader | None = None
        self._reading: MachineSpeed | None = None
        self._at, self._every = -math.inf, every_s

    def due(self) -> bool:
        return self._reading is None or time.monotonic() - self._at > self._every

    def read(self) -> MachineSpeed:
        """A reading now, whether due or not."""
        self._reader = self._reader or Reader(self._threads)
        started = time.monotonic()
        self._reading, self._at = self._reader(), time.monotonic()
        self._every = max(self._min_every, (self._at - started) / self._share)
        return self._reading

    def now(self) -> MachineSpeed:
        """The last reading, read again when due."""
        if self.due() or self._reading is None:
            return self.read()
        return self._reading


def typical(readings: Iterable[MachineSpeed]) -> MachineSpeed | None:
    """The median of several readings, part by part (None: no reading)."""
    readings = list(readings)
    if not readings:
        return None
    return MachineSpeed(statistics.median(r.core_ms for r in readings),
                        statistics.median(r.memory_ms for r in readings))


def one_speed(core_ratio: float, memory_ratio: float) -> bool:
    """Whether two readings' ratios, core and memory, lie within the readings' own spread."""
    return abs(core_ratio - 1) <= CORE_TOLERANCE and abs(memory_ratio - 1) <= MEMORY_TOLERANCE


@dataclass(frozen=True)
class RunSpeed:
    """The readings around a profile's timed runs, and between them: the machine may change speed
    during the run."""

    before: MachineSpeed
    after: MachineSpeed
    during: tuple[MachineSpeed, ...] = ()  # between the timed runs, in their order

    @property
    def readings(self) -> tuple[MachineSpeed, ...]:
        return (self.before, *self.during, self.after)

    @property
    def typical(self) -> MachineSpeed:
        """The median of all readings (of two, their mean)."""
        all_of_them = typical(self.readings)
        assert all_of_them is not None
        return all_of_them

    @property
    def steady(self) -> bool:
        """Whether the slowest and the fastest reading agree within the readings' own spread: else
        the machine changed speed during the run, and its runs hold either speed in shares the
        readings cannot tell."""
        core, memory = [r.core_ms for r in self.readings], [r.memory_ms for r in self.readings]
        return one_speed(max(core) / min(core), max(memory) / min(memory))

    def to_json(self) -> dict:
        return {"before": self.before.to_json(), "after": self.after.to_json(),
                "during": [r.to_json() for r in self.during]}

    @classmethod
    def from_json(cls, d: dict) -> RunSpeed:
        """A bundle written before readings between runs were taken has no ``during``."""
        during = d.get("during", [])
        if not isinstance(during, list):
            raise ValueError("'during' is not a list of readings")
        return cls(MachineSpeed.from_json(d["before"]), MachineSpeed.from_json(d["after"]),
                   tuple(MachineSpeed.from_json(r) for r in during))


@dataclass(frozen=True)
class SpeedCompared:
    """The machine's speed in the profiled run against the benchmarks' (``typical`` of the
    readings of the passes that measured the bound's results)."""

    profile: MachineSpeed
    benchmarks: MachineSpeed
    readings: int  # the bound's results that carried a reading

    @property
    def core_ratio(self) -> float:
        """How many times slower the core ran in the profile than in the benchmarks."""
        return self.profile.core_ms / self.benchmarks.core_ms

    @property
    def memory_ratio(self) -> float:
        return self.profile.memory_ms / self.benchmarks.memory_ms

    @property
    def differ(self) -> bool:
        return not one_speed(self.core_ratio, self.memory_ratio)

    def to_json(self) -> dict:
        return {"profile": self.profile.to_json(), "benchmarks": self.benchmarks.to_json(),
                "readings": self.readings, "core_ratio": self.core_ratio, "memory_ratio": self.memory_ratio,
                "differ": self.differ}
