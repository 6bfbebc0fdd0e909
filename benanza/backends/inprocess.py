"""What the in-process measuring children share (``onnxruntime``, ``torch``): the runtime's line
protocol (runtime_cpp/common/README.md) over a generated ``benchmarks.json``.

A child measures each benchmark its ``--benanza_names`` file names and prints one
``BENANZA_START`` and one ``BENANZA_RESULT`` line per benchmark, so the runner isolates, times out,
resumes and re-measures it as it does a C++ binary. The runtime's fault hooks
(``BENANZA_FAULT_ABORT``/``BENANZA_FAULT_HANG``) act here, before the backend sees the benchmark.

Both backends time their calls through ``timed_calls``. With ``COLD_ENV=cold`` (``benanza run
--cold-cache``) it evicts the last-level cache before every timed call, so a layer's inputs,
weights and outputs come from DRAM as a layer's do inside a whole model whose other layers have
run since; with ``COLD_ENV=cold-weights`` (``--cold-weights``) it then reads the layer's inputs
back, so only its weights come from DRAM, as inside a whole model too big for the cache, where
the layer before has just written the inputs. The framework's own timer still times only the
kernels (docs/backends.md).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .. import machine_speed

INDEX_NAME = "benchmarks.json"

# (project, variant name, its index entry, threads, min time s, repetitions, the evictor of a
# cold-cache reading or None) → its result line
Measure = Callable[[Path, str, dict[str, str], int, float, int, "Evictor | None"], dict[str, Any]]

COLD_ENV = "BENANZA_CACHE"  # one of CACHE_STATES
# what a timed call finds in the CPU's caches: whatever the calls before left ("warm"), nothing
# ("cold"), or its inputs alone ("cold-weights")
CACHE_STATES = ("warm", "cold", "cold-weights")
# The eviction buffer, in last-level caches: a cache that keeps some lines of an older set
# (adaptive replacement, or a victim L3 beside the private L2s) still loses all of them to twice
# its size written through it.
EVICT_FACTOR = 2
# Timed calls per repetition a cold reading makes at least, whatever --min-time: the eviction
# (milliseconds per call) takes most of the budget, and the low percentile needs samples.
COLD_MIN_CALLS = 20


class Refused(Exception):
    """The framework has no kernel for this variant (stored as unsupported, with its words)."""


class Evictor:
    """Evicts the last-level cache: writes a buffer ``EVICT_FACTOR`` times the size of the
    last-level caches of the CPUs this process may run on, from the calling thread (the other
    cores' private caches keep what they hold: at most one private cache each); with
    ``inputs_warm``, then reads the inputs it is given back into the caches."""

    def __init__(self, inputs_warm: bool = False) -> None:
        import numpy as np

        from ..system import cache_levels

        levels = cache_levels(len(os.sched_getaffinity(0)))
        if not levels:
            raise RuntimeError("sysfs (/sys/devices/system/cpu/cpu*/cache) names no cache of this CPU: "
                               "no size to evict for a cold-cache reading")
        self.llc_bytes = levels[-1].total
        self.inputs_warm = inputs_warm
        self._buffer = np.zeros(EVICT_FACTOR * self.llc_bytes // 8, np.int64)  # its pages touched now

    @property
    def nbytes(self) -> int:
        return int(self._buffer.nbytes)

    @property
    def state(self) -> str:
        return "cold-weights" if self.inputs_warm else "cold"

    def __call__(self, inputs: Iterable[Any] = ()) -> None:
        """Evicts the caches, then reads ``inputs`` (numpy arrays or torch tensors) when they are to
        be warm."""
        import numpy as np

        # a read and a write of every line: dirty lines leave even a cache that drops clean victims
        np.add(self._buffer, 1, out=self._buffer)
        if self.inputs_warm:
            for value in inputs:
                value.sum()  # every element read, whatever the type, layout or library


def evictor() -> Evictor | None:
    """The child's evictor when the runner asked for a cold reading (``COLD_ENV``), else None."""
    state = os.environ.get(COLD_ENV, "warm")
    if state not in CACHE_STATES:
        raise RuntimeError(f"{COLD_ENV}={state!r}: not one of {', '.join(CACHE_STATES)}")
    return None if state == "warm" else Evictor(inputs_warm=state == "cold-weights")


def timed_calls(call: Callable[[], object], min_time: float, repetitions: int, max_calls: int,
                evict: Evictor | None, inputs: Iterable[Any] = ()) -> list[int]:
    """Runs ``call`` for ``repetitions`` repetitions of ``min_time`` seconds each (at least one
    call, at most ``max_calls``), evicting the cache before each call when ``evict`` is given
    (then at least ``COLD_MIN_CALLS`` calls, the eviction counted in the time, and ``inputs``,
    the call's own, read back where the evictor keeps them warm); the calls made per
    repetition. The caller's framework times the calls' kernels."""
    least = COLD_MIN_CALLS if evict is not None else 1
    inputs = list(inputs)
    counts = []
    for _ in range(repetitions):
        n, started = 0, time.perf_counter()
        while n < least or (time.perf_counter() - started < min_time and n < max_calls):
            if evict is not None:
                evict(inputs)
            call()
            n += 1
        counts.append(n)
    return counts


def cache_context(evict: Evictor | None) -> dict[str, Any]:
    """What the context line says of the cache: its state, with the sizes where it is evicted."""
    if evict is None:
        return {"cache": "warm"}
    return {"cache": evict.state, "llc_bytes": evict.llc_bytes, "evict_bytes": evict.nbytes}


def emit(tag: str, payload: str) -> None:
    sys.stdout.write(f"{tag} {payload}\n")
    sys.stdout.flush()


def result_line(name: str, reps: list[list[float]], implementation: str, counters: dict[str, float],
                zero: str) -> dict[str, Any]:
    """The protocol's result line: statistics over the repetitions of the mean per-call time,
    and the pooled per-call samples' percentiles (``reps``: per-call kernel times, ms, by
    repetition). ``zero``: why a median sample of 0 is no time to store."""
    import numpy as np

    means = [float(np.mean(r)) for r in reps]
    pooled = np.array([x for r in reps for x in r])
    if float(np.median(pooled)) <= 0:
        return {"name": name, "status": "failed", "implementation": implementation, "message": zero}
    return {"name": name, "status": "ok", "median_ms": float(np.median(means)), "mean_ms": float(np.mean(means)),
            "stddev_ms": float(np.std(means, ddof=1)) if len(means) > 1 else 0.0, "min_ms": min(means),
            "iterations": int(pooled.size), "repetitions": len(reps), "times_ms": means,
            "samples": int(pooled.size),
            "sample_percentiles_ms": [float(x) for x in np.percentile(pooled, np.arange(101))],
            "implementation": implementation, "counters": counters}


def serve(argv: list[str], threads_env: str, context: Callable[[int], dict[str, Any]], measure: Measure) -> int:
    """The child's main: the runtime's flags (``--benanza_project`` names the generated folder)."""
    flags = {a[2:].partition("=")[0]: a.partition("=")[2] for a in argv if a.startswith("--")}
    project = Path(flags.get("benanza_project", "."))
    threads = int(os.environ.get(threads_env, "1"))
    evict = evictor()
    if "benanza_context" in flags:
        line = context(threads)
        emit("BENANZA_CONTEXT", json.dumps({**line, "custom": {**line["custom"], **cache_context(evict)}}))
        return 0
    index = json.loads((project / INDEX_NAME).read_text())
    if "benanza_list" in flags:
        for name in index:
            print(name)
        return 0
    if "benanza_names" in flags:
        names = [n for n in Path(flags["benanza_names"]).read_text().splitlines() if n]
    else:
        rx = re.compile(flags.get("benchmark_filter", ""))
        names = [n for n in index if rx.search(n)]
    min_time = float(flags.get("benchmark_min_time", "0.2"))
    repetitions = int(flags.get("benchmark_repetitions", "3"))
    speed = machine_speed.Periodic(threads)
    for name in names:
        if name not in index:
            emit("BENANZA_RESULT", json.dumps({"name": name, "status": "failed",
                                               "message": f"not in this project's {INDEX_NAME}"}))
            continue
        reading = speed.now()  # before its start line: outside the window the runner's contention counts
        emit("BENANZA_START", name)
        line = _one(project, name, index[name], threads, min_time, repetitions, measure, evict)
        if line["status"] == "ok":
            line["counters"] = {**line["counters"], **reading.metrics()}
        emit("BENANZA_RESULT", json.dumps(line))
    return 0


def _one(project: Path, name: str, entry: dict[str, str], threads: int, min_time: float, repetitions: int,
         measure: Measure, evict: Evictor | None) -> dict[str, Any]:
    if os.environ.get("BENANZA_FAULT_ABORT") == name:  # the runtime's fault hooks (tests)
        os.abort()
    if os.environ.get("BENANZA_FAULT_HANG") == name:
        while True:
            time.sleep(3600)
    if "unsupported" in entry:
        return {"name": name, "status": "unsupported", "message": entry["unsupported"]}
    try:
        line = measure(project, name, entry, threads, min_time, repetitions, evict)
    except Refused as exc:
        return {"name": name, "status": "unsupported", "message": str(exc)}
    except Exception as exc:  # noqa: BLE001 - the frameworks' errors share no base class; the runner stores it
        return {"name": name, "status": "failed", "message": f"{type(exc).__name__}: {str(exc)[:500]}"}
    if evict is not None and line["status"] == "ok":  # each result says it was read cold, and how
        line["counters"] = {**line["counters"], "evict_bytes": evict.nbytes}
    return line
