"""How a benchmark's time is judged on a machine that may be busy (docs/measurement.md).

Two things, both read by the runner while a benchmark runs:

- the estimator of the bound: a low percentile of the per-call samples the runtime timed
  (noise on a CPU only ever adds time, and a call stalled by a descheduled thread is one slow
  sample, not a slower average), with the median and the spread kept for reporting;
- the contention the benchmark ran under: the share of its threads' runnable time they spent
  waiting for a CPU (the kernel's per-thread ``schedstat`` run delay), or the share of the CPUs'
  time the hypervisor stole, whichever is larger.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

# The percentile of the per-call samples the bound uses. Below the median, so a minority of
# stalled calls (up to 90% of them) cannot move it; above the minimum, which one lucky call or
# a clock tick decides and which drifts lower the more calls are timed.
LOW_PERCENTILE = 10
# The runtime sends the 0th..100th percentiles of its samples (runtime_cpp/common/README.md).
PERCENTILES = 101
# Default share of a benchmark's runnable time its threads may wait for a CPU before its
# result is contended (re-measured later, flagged if it stays so, never silently in a bound).
MAX_CONTENTION = 0.05


@dataclass(frozen=True)
class SampleSummary:
    """The per-call samples of one benchmark, all repetitions pooled."""

    low_ms: float  # the LOW_PERCENTILE-th percentile: what the bound uses
    median_ms: float
    iqr_ms: float  # 75th minus 25th percentile
    count: int


def summarize(percentiles: list[float], count: int) -> SampleSummary:
    """The summary of the runtime's percentile list (101 values, non-decreasing)."""
    if len(percentiles) != PERCENTILES:
        raise ValueError(f"{len(percentiles)} percentiles, not {PERCENTILES}")
    if count < 1:
        raise ValueError(f"sample count {count}")
    bad = [x for x in percentiles if not (math.isfinite(x) and x >= 0)]
    if bad:
        raise ValueError(f"percentile {bad[0]!r} is not a finite non-negative time")
    if any(b < a for a, b in zip(percentiles, percentiles[1:])):
        raise ValueError("percentiles decrease")
    return SampleSummary(percentiles[LOW_PERCENTILE], percentiles[50], percentiles[75] - percentiles[25], count)


# --- contention -----------------------------------------------------------------------------

@dataclass(frozen=True)
class CpuClock:
    """A process's threads' time on a CPU and waiting for one, and the steal time of the CPUs
    it may run on, at one moment."""

    run_ns: int
    wait_ns: int
    steal_ticks: int
    total_ticks: int


def _thread_times(pid: int) -> tuple[int, int] | None:
    """Summed (on-CPU, run-queue wait) nanoseconds of the process's live threads."""
    run = wait = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tasks:
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
            run += int(fields[0])
            wait += int(fields[1])
        except (OSError, IndexError, ValueError):
            continue  # the thread ended meanwhile
    return run, wait


def _cpu_ticks(cpus: set[int]) -> tuple[int, int, int]:
    """(idle + iowait, steal, total) jiffies of ``cpus`` from /proc/stat."""
    idle = steal = total = 0
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return 0, 0, 0
    for line in lines:
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        v = [int(x) for x in rest.split()]
        idle += v[3] + v[4]
        steal += v[7] if len(v) > 7 else 0
        total += sum(v[:8])
    return idle, steal, total


def _allowed_cpus() -> set[int]:
    return set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))


def cpu_clock(pid: int) -> CpuClock | None:
    """The clock of process ``pid`` now; None where the kernel keeps no schedstat (not Linux,
    or CONFIG_SCHED_INFO off): then no contention is measured."""
    times = _thread_times(pid)
    if times is None:
        return None
    _, steal, total = _cpu_ticks(_allowed_cpus())
    return CpuClock(times[0], times[1], steal, total)


def contention(before: CpuClock | None, after: CpuClock | None) -> float | None:
    """Share of the interval the benchmark lost to other work: its threads' run-queue wait over
    their runnable time, or the stolen share of the CPUs' time, whichever is larger."""
    if before is None or after is None:
        return None
    run, wait = after.run_ns - before.run_ns, after.wait_ns - before.wait_ns
    ticks = after.total_ticks - before.total_ticks
    stolen = (after.steal_ticks - before.steal_ticks) / ticks if ticks > 0 else 0.0
    waited = wait / (run + wait) if run + wait > 0 else 0.0
    return max(0.0, min(1.0, max(waited, stolen)))


@dataclass(frozen=True)
class FreeCores:
    free: int  # cores idle enough to give a benchmark thread each (at least 1)
    allowed: int  # cores this process may run on
    idle: float  # summed idle share of the allowed cores over the sampling window


def free_cores(window: float = 0.5) -> FreeCores:
    """The cores other work leaves free now: the allowed cores' idle time over ``window``
    seconds, rounded to whole cores."""
    cpus = _allowed_cpus()
    idle0, _, total0 = _cpu_ticks(cpus)
    time.sleep(window)
    idle1, _, total1 = _cpu_ticks(cpus)
    if total1 <= total0:  # no /proc/stat (or no tick passed): assume every core is free
        return FreeCores(len(cpus), len(cpus), float(len(cpus)))
    idle = len(cpus) * (idle1 - idle0) / (total1 - total0)
    return FreeCores(max(1, min(len(cpus), math.floor(idle + 0.5))), len(cpus), idle)
