"""What the in-process measuring children share (``onnxruntime``, ``torch``): the runtime's line
protocol (runtime_cpp/common/README.md) over a generated ``benchmarks.json``.

A child measures each benchmark its ``--benanza_names`` file names and prints one
``BENANZA_START`` and one ``BENANZA_RESULT`` line per benchmark, so the runner isolates, times out,
resumes and re-measures it as it does a C++ binary. The runtime's fault hooks
(``BENANZA_FAULT_ABORT``/``BENANZA_FAULT_HANG``) act here, before the backend sees the benchmark.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

INDEX_NAME = "benchmarks.json"

# (project, variant name, its index entry, threads, min time s, repetitions) → its result line
Measure = Callable[[Path, str, dict[str, str], int, float, int], dict[str, Any]]


class Refused(Exception):
    """The framework has no kernel for this variant (stored as unsupported, with its words)."""


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
    if "benanza_context" in flags:
        emit("BENANZA_CONTEXT", json.dumps(context(threads)))
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
    for name in names:
        if name not in index:
            emit("BENANZA_RESULT", json.dumps({"name": name, "status": "failed",
                                               "message": f"not in this project's {INDEX_NAME}"}))
            continue
        emit("BENANZA_START", name)
        emit("BENANZA_RESULT", json.dumps(_one(project, name, index[name], threads, min_time, repetitions, measure)))
    return 0


def _one(project: Path, name: str, entry: dict[str, str], threads: int, min_time: float, repetitions: int,
         measure: Measure) -> dict[str, Any]:
    if os.environ.get("BENANZA_FAULT_ABORT") == name:  # the runtime's fault hooks (tests)
        os.abort()
    if os.environ.get("BENANZA_FAULT_HANG") == name:
        while True:
            time.sleep(3600)
    if "unsupported" in entry:
        return {"name": name, "status": "unsupported", "message": entry["unsupported"]}
    try:
        return measure(project, name, entry, threads, min_time, repetitions)
    except Refused as exc:
        return {"name": name, "status": "unsupported", "message": str(exc)}
    except Exception as exc:  # noqa: BLE001 - the frameworks' errors share no base class; the runner stores it
        return {"name": name, "status": "failed", "message": f"{type(exc).__name__}: {str(exc)[:500]}"}
