"""How a benchmark's time is judged on a machine that may be busy (docs/measurement.md).

Two things, both read by the runner while a benchmark runs:

- the estimator of the bound: a low percentile of the per-call samples the runtime timed
  (noise on a CPU only ever adds time, and a call stalled by a descheduled thread is one slow
  sample, not a slower average), with the median and the spread kept for reporting;
- the contention the benchmark ran under: the share of its threads' runnable time they spent
  waiting for a CPU (the kernel's per-thread ``schedstat`` run delay), or the share of the CPUs'
  time the hypervisor stole, whichever is larger; and how often its threads lost their CPU,
  which says whether a call as short as the estimator is likely to have run untouched.
"""

from __future__ import annotations

import itertools
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
# Default relative standard deviation (stddev / median of the repetitions) above which a
# result is unstable: re-measured by `benanza run`, flagged when it stays so.
UNSTABLE_RSD = 0.1

# Adaptive sampling (`benanza run --precision`, the runtime's sample_more): a benchmark times
# calls until the 95% confidence interval of its LOW_PERCENTILE-th percentile is within the
# precision asked (relative half-width), after at least MIN_SAMPLES calls and
# MIN_SAMPLING_SECONDS, and never longer than --max-time (default MAX_SAMPLING_SECONDS).
MIN_SAMPLING_SECONDS = 0.01
MAX_SAMPLING_SECONDS = 0.5
# `benanza run`'s default precision: on the 30 reference models it moved no sequential bound by
# more than the fixed budget's own run-to-run spread (docs/measurements.md, bench_campaign.py).
DEFAULT_PRECISION = 0.02
# Racing stores a variant it stopped early with these in its metrics: the --precision and
# --max-time its full sampling would have had, so it can be measured in full later, the same way.
RACE_PRECISION, RACE_MAX_TIME = "race_precision", "race_max_time"


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
    if any(b < a for a, b in itertools.pairwise(percentiles)):
        raise ValueError("percentiles decrease")
    return SampleSummary(percentiles[LOW_PERCENTILE], percentiles[50], percentiles[75] - percentiles[25], count)


# --- contention -----------------------------------------------------------------------------

# A contended benchmark's estimator is still kept when at least this share of its calls is
# expected to have run without a thread losing its CPU, and at least half of them were in fact
# close to the low percentile (the median within SPREAD_CLEAN of it), over at least MIN_SAMPLES
# calls: the low percentile then lies among clean calls.
MIN_CLEAN_SHARE = 0.5
SPREAD_CLEAN = 1.5
MIN_SAMPLES = 20
# Below this much runnable time (on a CPU or waiting for one) between a benchmark's first and
# last line, a waiting share is one accident of scheduling rather than a measurement of the
# machine (every real benchmark runs --min-time per repetition; only a stand-in that answers at
# once is this short). Not CPU time alone: a benchmark starved of its CPU runs little and waits
# long, and that is the contention to catch.
MIN_RUNNABLE_NS = 1_000_000


@dataclass(frozen=True)
class ThreadClock:
    run_ns: int  # on a CPU
    wait_ns: int  # runnable, waiting for a CPU
    slices: int  # times it was put on a CPU (after a preemption or a sleep)


@dataclass(frozen=True)
class CpuClock:
    """A process's threads' scheduler counters, and the steal time of the CPUs it may run on,
    at one moment."""

    threads: dict[int, ThreadClock]
    steal_ticks: int
    total_ticks: int


@dataclass(frozen=True)
class Contention:
    """What other work cost one benchmark while it ran."""

    waited: float  # share of its threads' runnable time spent waiting for a CPU
    stolen: float  # share of its CPUs' time the hypervisor gave to other guests
    # times a thread was put back on a CPU, summed over the threads, per second of each one's
    # time on a CPU: every one may have held up a call (a preempted thread, or one woken late
    # from an OpenMP barrier)
    switches_per_s: float

    @property
    def share(self) -> float:
        """The larger of the two losses: what is compared with --max-contention."""
        return max(self.waited, self.stolen)

    def clean_share(self, call_ms: float) -> float:
        """Expected share of calls of ``call_ms`` during which no thread left its CPU: each
        leaves it at its measured rate per second of running (a call needs ``call_ms`` of
        running, however long the waits between)."""
        return math.exp(-self.switches_per_s * call_ms / 1000.0)

    def spoils(self, samples: SampleSummary | None, max_share: float) -> bool:
        """Whether a result with these per-call ``samples`` (None: none) cannot be trusted: it
        lost more than ``max_share`` of its time, and the loss was stolen time (no scheduler
        count sees it), or there are no or too few samples, or too few calls are expected to be
        clean, or more than half of them were far above the low percentile."""
        if self.share <= max_share:
            return False
        return (self.stolen > max_share or samples is None or samples.count < MIN_SAMPLES
                or self.clean_share(samples.low_ms) < MIN_CLEAN_SHARE
                or samples.median_ms > SPREAD_CLEAN * samples.low_ms)


def _thread_clock(pid: int, tid: str) -> ThreadClock | None:
    try:
        sched = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
        return ThreadClock(int(sched[0]), int(sched[1]), int(sched[2]))
    except (OSError, IndexError, ValueError):
        return None  # the thread ended meanwhile


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
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    threads = {int(t): c for t in tids if (c := _thread_clock(pid, t)) is not None}
    if not threads:
        return None
    _, steal, total = _cpu_ticks(_allowed_cpus())
    return CpuClock(threads, steal, total)


def clock_of(data: object) -> CpuClock | None:
    """The clock a benchmark binary read of itself (the ``sched`` field of its result line:
    runtime_cpp/common/README.md); None for ``{}`` (no schedstat there); ValueError when it
    is not one."""
    if not isinstance(data, dict):
        raise ValueError(f"{data!r} is not an object")
    if not data:
        return None
    threads, steal, total = data.get("threads"), data.get("steal_ticks"), data.get("total_ticks")
    if not (isinstance(threads, dict) and isinstance(steal, int) and isinstance(total, int) and steal >= 0
            and total >= 0):
        raise ValueError("no threads object, or steal_ticks and total_ticks not counts")
    clocks = {}
    for tid, counts in threads.items():
        if not (tid.isdigit() and isinstance(counts, list) and len(counts) == 3
                and all(isinstance(x, int) and x >= 0 for x in counts)):
            raise ValueError(f"thread {tid!r}: {counts!r} is not three counts")
        clocks[int(tid)] = ThreadClock(*counts)
    return CpuClock(clocks, steal, total)


def contention(before: CpuClock | None, after: CpuClock | None) -> Contention | None:
    """What other work cost the process between two clocks (threads born in between count from
    zero; threads that ended in between are not seen); None when it ran too little to tell."""
    if before is None or after is None:
        return None
    run = wait = 0
    rate = 0.0
    for tid, now in after.threads.items():
        then = before.threads.get(tid, ThreadClock(0, 0, 0))
        d_run, d_wait = now.run_ns - then.run_ns, now.wait_ns - then.wait_ns
        run, wait = run + d_run, wait + d_wait
        if d_run > 0:
            rate += (now.slices - then.slices) / (d_run * 1e-9)
    if run + wait < MIN_RUNNABLE_NS:
        return None
    ticks = after.total_ticks - before.total_ticks
    stolen = (after.steal_ticks - before.steal_ticks) / ticks if ticks > 0 else 0.0
    waited = wait / (run + wait) if run + wait > 0 else 0.0
    return Contention(min(1.0, max(0.0, waited)), min(1.0, max(0.0, stolen)), max(0.0, rate))


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
