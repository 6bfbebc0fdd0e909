"""ONNX Runtime's profiler costs each kernel time of its own: on a model of microsecond kernels
(the test suite's encoder layer) the kernel times it reports sum to more than a whole run
without it, and the onnxruntime backend, which times its benchmarks by that profiler, gives a
bound above the measured latency. The analysis says so in its warning, never silently.

Oracles: the raw ORT profile JSON of the bundle's traced runs (its kernel events summed per
run, read here without Benanza's parser) against the latency of the bundle's timed runs.
"""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
from helpers import invoke
from torch_models import export

pytestmark = pytest.mark.slow

SYSTEM = "ortcost"


def kernel_ms_per_run(trace_path) -> float:
    """The mean over runs after the first of the kernels' time per run, from the raw profile."""
    events = json.loads(trace_path.read_text())
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "model_run")
    per_run: dict[int, float] = defaultdict(float)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            k = next((i for i, (lo, hi) in enumerate(runs) if lo <= e["ts"] <= hi), None)
            if k:  # the first run warms up
                per_run[k] += e["dur"] / 1e3
    return sum(per_run.values()) / len(per_run)


def test_the_profilers_cost_is_said_where_it_lifts_the_bound_above_the_run(tmp_path):
    path = export("encoder", 17, tmp_path)
    invoke("generate", str(path), "--backend", "onnxruntime", "--out", str(tmp_path / "bench"))
    invoke("run", "--system", SYSTEM, "--backend", "onnxruntime", "--bench-dir", str(tmp_path / "bench"),
           "--db", str(tmp_path / "perf.db"), "--threads", "1", "--min-time", "0.02", "--repetitions", "2",
           "--remeasure", "0", "--max-contention", "1")
    prof = tmp_path / "prof"
    invoke("profile", str(path), "--framework", "onnxruntime", "--threads", "1", "--out", str(prof),
           "--iterations", "200", "--trace-iterations", "50")
    index = json.loads((prof / "profile.json").read_text())
    measured = index["latency_ms"]["trimmed_mean"]
    kernels = kernel_ms_per_run(prof / index["files"]["trace"])
    assert kernels > measured  # the profiled kernels alone take longer than a whole untraced run
    (a,) = json.loads(invoke("analyze", str(path), "--system", SYSTEM, "--db", str(tmp_path / "perf.db"),
                             "--profile", str(prof), "--json", "--allow-contended"))["analyses"]
    assert a["framework"]["op_ms"] == pytest.approx(kernels, rel=0.05)
    (said,) = [w for w in a["warnings"] if w.startswith("bound above measured")]
    assert "more than the measured latency: each op's time holds the profiler's own cost" in said
    assert "and so does each onnxruntime benchmark" in said
