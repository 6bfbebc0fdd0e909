"""ONNX Runtime's profiler costs each kernel time of its own (it formats every input's and output's
shape inside the kernel's event): on microsecond kernels that cost is more than the kernel. The
onnxruntime backend times such kernels by its replicas clock instead (copies of the subgraph in
one untraced session, against one copy), so the bound of a model of microsecond kernels is a
floor under ORT's own untraced run.

Oracles: ORT's untraced ``run()`` of a chain of the same kernel, computed here without Benanza
(the chain's time less one node's, per node); the raw ORT profile JSON of a bundle's traced runs
(its kernel events summed per run) against the latency of the bundle's timed runs.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from collections import defaultdict

import numpy as np
import onnxruntime as ort
import pytest
from helpers import invoke, io, model, newest_row, tensor
from onnx import helper
from torch_models import export

pytestmark = pytest.mark.slow

SYSTEM = "ortcost"
CHAIN = 33  # nodes of the chain: its time less one node's is 32 nodes' time
SHAPE = [1, 16, 64]


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


def add_chain(n: int):
    """``n`` Adds of a constant row, each reading the one before: one unique layer."""
    names = ["x", *(f"h{i}" for i in range(n - 1)), "y"]
    nodes = [helper.make_node("Add", [names[i], "c"], [names[i + 1]], name=f"add{i}") for i in range(n)]
    return model(nodes, [io("x", SHAPE)], [io("y", SHAPE)], [tensor("c", (SHAPE[-1],))], opset=17)


def untraced_per_node_ms(n: int) -> float:
    """One node's time inside an untraced run of the chain: the chain's ``run()`` less a one-node
    model's, in calls that alternate, per node (medians; ORT at the backend's level, one thread)."""
    def session(m):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        return ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])

    one, chain = session(add_chain(1)), session(add_chain(n))
    x = {"x": np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)}
    times: tuple[list[float], list[float]] = ([], [])
    for i in range(3000):
        for sess, out in ((one, times[0]), (chain, times[1])):
            started = time.perf_counter()
            sess.run(None, x)
            if i >= 100:
                out.append(time.perf_counter() - started)
    return float(np.median(times[1]) - np.median(times[0])) * 1e3 / (n - 1)


def test_the_replicas_clock_is_the_kernels_time_in_an_untraced_run(tmp_path):
    """Measured one after the other, the two clocks can see two speeds of the shared host (its
    speed has moved by 1.6× between minutes here, invisible to steal time): a pair out of the band
    is measured again, both sides, twice at most."""
    path = tmp_path / "chain.onnx"
    path.write_bytes(add_chain(CHAIN).SerializeToString())
    invoke("generate", str(path), "--backend", "onnxruntime", "--out", str(tmp_path / "bench"))
    for attempt in range(3):
        invoke("run", "--system", SYSTEM, "--backend", "onnxruntime", "--bench-dir", str(tmp_path / "bench"),
               "--db", str(tmp_path / "perf.db"), "--threads", "1", "--min-time", "0.1", "--repetitions", "3",
               "--remeasure", "1", *(["--force"] if attempt else []))
        con = sqlite3.connect(tmp_path / "perf.db")
        (variant,) = {v for (v,) in con.execute("SELECT variant FROM results WHERE status = 'ok'")}
        # the newest measurement, as an analysis reads it: an unstable first one is measured again
        row = newest_row(tmp_path / "perf.db", variant)
        low_ms, metrics = row["low_ms"], json.loads(row["metrics"])
        assert metrics["replicas"] == 8
        # the profiler's reading of the same kernel holds its cost: more than the kernel itself
        assert metrics["profiled_ms"] > 2 * low_ms, (metrics["profiled_ms"], low_ms)
        oracle = untraced_per_node_ms(CHAIN)
        # measured here 0.57 against 0.64 µs: the chain's nodes also hand their outputs on
        if 0.6 < low_ms / oracle < 1.3:
            break
        assert attempt < 2, (low_ms, oracle)


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    """The test suite's encoder layer (kernels of 1–5 µs) through generate → run → profile →
    analyze on one thread: the model, the database, the profile bundle and the analysis."""
    tmp_path = tmp_path_factory.mktemp("ortenc")
    path = export("encoder", 17, tmp_path)
    invoke("generate", str(path), "--backend", "onnxruntime", "--out", str(tmp_path / "bench"))
    invoke("run", "--system", SYSTEM, "--backend", "onnxruntime", "--bench-dir", str(tmp_path / "bench"),
           "--db", str(tmp_path / "perf.db"), "--threads", "1", "--min-time", "0.05", "--repetitions", "2",
           "--remeasure", "1")
    prof = tmp_path / "prof"
    invoke("profile", str(path), "--framework", "onnxruntime", "--threads", "1", "--out", str(prof),
           "--iterations", "300", "--trace-iterations", "50")
    (a,) = json.loads(invoke("analyze", str(path), "--system", SYSTEM, "--db", str(tmp_path / "perf.db"),
                             "--profile", str(prof), "--json", "--allow-contended"))["analyses"]
    return path, tmp_path / "perf.db", prof, a, tmp_path / "bench"


def test_the_bound_of_microsecond_kernels_is_a_floor_under_the_untraced_run(encoder):
    _, _, prof, a, _ = encoder
    index = json.loads((prof / "profile.json").read_text())
    measured = index["latency_ms"]["trimmed_mean"]
    kernels = kernel_ms_per_run(prof / index["files"]["trace"])
    assert kernels > measured  # the profiled kernels alone take longer than a whole untraced run
    assert a["framework"]["op_ms"] == pytest.approx(kernels, rel=0.05)
    assert a["measured_ms"] == pytest.approx(measured, rel=1e-3)
    # each of the encoder's kernels is timed without the profiler, and their sum is below the run
    # they are kernels of (measured here: 0.0418 ms run, 0.089 ms bound on the profiler's clock)
    assert a["bounds"]["sequential_ms"] < measured
    assert not any("benchmark, which the same profiler times" in w for w in a["warnings"])


def small_conv():
    """A 1×1 Conv+Relu of a few tens of microseconds: its plain variants are timed by the replicas
    clock, its NCHWc ones (reorders at their edges) by the profiler, and ORT runs it NCHWc."""
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    return model(nodes, [io("x", [1, 256, 13, 13])], [io("y", None)],
                 [tensor("W", (24, 256, 1, 1)), tensor("B", (24,))], opset=17)


def test_q3_compares_an_ops_variants_on_the_one_clock_they_share(tmp_path):
    """A variant timed without the profiler looks faster by the profiler's cost alone: Q3 holds the
    NCHWc kernel ORT ran against the others on the profiler's clock, each variant's own reading of
    it (SQL: the NCHWc result's low percentile, the others' ``profiled_ms``)."""
    path = tmp_path / "conv.onnx"
    path.write_bytes(small_conv().SerializeToString())
    db = tmp_path / "perf.db"
    invoke("generate", str(path), "--backend", "onnxruntime", "--out", str(tmp_path / "bench"))
    invoke("run", "--system", SYSTEM, "--backend", "onnxruntime", "--bench-dir", str(tmp_path / "bench"),
           "--db", str(db), "--threads", "1", "--min-time", "0.05", "--repetitions", "3", "--remeasure", "1")
    prof = tmp_path / "prof"
    invoke("profile", str(path), "--framework", "onnxruntime", "--threads", "1", "--out", str(prof),
           "--iterations", "50", "--trace-iterations", "50")
    con = sqlite3.connect(db)
    rows = con.execute("SELECT v.algo, r.low_ms, r.metrics FROM results r JOIN variants v ON v.name = r.variant "
                       "WHERE r.status = 'ok' AND v.fusion = 'bias_relu'").fetchall()
    clocks = {algo: (low, json.loads(m)) for algo, low, m in rows}
    assert set(clocks) == {"all", "extended"}
    nchwc_low, nchwc = clocks["all"]
    plain_low, plain = clocks["extended"]
    assert "replicas" not in nchwc and nchwc["reorder_ms"] > 0  # the profiler's clock
    assert plain["replicas"] == 8 and plain["profiled_ms"] > plain_low  # the replicas clock, below its traced reading
    (a,) = json.loads(invoke("analyze", str(path), "--system", SYSTEM, "--db", str(db), "--profile", str(prof),
                             "--json", "--allow-contended"))["analyses"]
    (k,) = [k for k in a["framework"]["kernels"] if k["name"] == "conv"]
    assert (k["fusion"], k["layout"]) == ("bias_relu", "any")
    assert k["used_ms"] == pytest.approx(nchwc_low, rel=1e-3)
    assert k["best_ms"] == pytest.approx(min(nchwc_low, plain["profiled_ms"]), rel=1e-3)


def test_orts_own_fusions_are_benchmarked_as_the_ops_it_ran(encoder, tmp_path):
    """ORT runs the encoder as fewer kernels than layers (SkipLayerNormalization, FusedMatMul,
    Split, Gemm): each of its ops is compared with the benchmark of exactly what it computed, a
    fusion variant whose isolated session runs that same kernel and nothing of the model's besides
    (the Reshapes ORT puts around a fused kernel are views: ``view_ms``), and whose reading on the
    profiler's clock is the op's own time in ORT's profile of the whole model (raw JSON, 10th
    percentiles) within ±30 % or one step of that clock (1 µs)."""
    from benanza.analysis.matching import match_trace
    from benanza.parsers import load_bundle
    from benanza.processor import load_model

    path, shared_db, prof, a, bench = encoder
    # the pairs measured again below go into a copy: the module's other tests read the database
    # the fixture's analysis was made from
    db = tmp_path / "perf.db"
    src, dst = sqlite3.connect(shared_db), sqlite3.connect(db)
    src.backup(dst)  # what a write-ahead log still holds too
    src.close()
    dst.close()
    kernels = a["framework"]["kernels"]
    assert kernels and all(k["comparable"] for k in kernels), [k["name"] for k in kernels if not k["comparable"]]
    own = {"ort_split": "Split", "ort_fused_matmul": "com.microsoft.FusedMatMul",
           "ort_skip_layernorm": "com.microsoft.SkipLayerNormalization", "ort_gemm": "Gemm"}
    fused = [k for k in kernels if k["fusion"] in own]
    assert {k["fusion"] for k in fused} == set(own)
    model = load_model(path)
    for attempt in range(3):  # a pair measured apart in a busy moment is measured again, both sides
        op_of = {i: g.name for g in match_trace(model, load_bundle(prof).trace).groups for i in g.nodes}
        index = json.loads((prof / "profile.json").read_text())
        times: dict[str, list[float]] = defaultdict(list)
        for e in json.loads((prof / index["files"]["trace"]).read_text()):
            if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
                times[e["name"].removesuffix("_kernel_time")].append(e["dur"] / 1e3)
        misses = []
        for k in fused:
            row = newest_row(db, k["used_variant"])
            assert row["implementation"] == f"CPUExecutionProvider:{own[k['fusion']]}", (k["fusion"], dict(row))
            isolated = json.loads(row["metrics"])["profiled_ms"]
            in_model = float(np.percentile(times[op_of[k["node"]]][5:], 10))
            if abs(isolated - in_model) > max(0.3 * in_model, 0.001):
                misses.append((k["used_variant"], isolated, in_model))
        if not misses:
            break
        assert attempt < 2, misses
        for name, _, _ in misses:
            invoke("run", "--system", SYSTEM, "--backend", "onnxruntime", "--bench-dir", str(bench), "--db", str(db),
                   "--threads", "1", "--min-time", "0.05", "--repetitions", "2", "--force",
                   "--filter", "^" + re.escape(name) + "$")
        prof = prof.parent / f"prof-again{attempt}"
        invoke("profile", str(path), "--framework", "onnxruntime", "--threads", "1", "--out", str(prof),
               "--iterations", "300", "--trace-iterations", "50")
    # the 3-D MatMul+Add ORT runs as Reshape→Gemm→Reshape: the Reshapes left out of the samples
    (gemm,) = [k["used_variant"] for k in fused if k["fusion"] == "ort_gemm"]
    assert json.loads(newest_row(db, gemm)["metrics"])["view_ms"] > 0


def test_q5_on_the_onnxruntime_backend_weighs_orts_own_fusions(encoder):
    """Q5's fusions on ORT's backend are what ORT itself fuses: its own (the Gemm of linear1's
    MatMul and bias) in place of a library match over the same nodes (``mm_bias_relu``), each
    weighed by its benchmark (SQL) against its layers unfused; the fused sequential bound is the
    unfused one less what the applied fusions save."""
    _, db, _, a, _ = encoder
    uses = a["fusion"]["applied"] + a["fusion"]["unprofitable"]
    patterns = {u["pattern"] for u in uses}
    assert {"ort_gemm", "ort_skip_layernorm", "ort_split", "ort_fused_matmul"} <= patterns
    assert "mm_bias_relu" not in patterns  # its MatMul and Add are ORT's Gemm's
    weight = {la["index"]: la["latency_ms"] for la in a["layers"]}
    for u in uses:  # the JSON's milliseconds have six decimals
        assert u["fused_ms"] == pytest.approx(newest_row(db, u["variant"])["low_ms"], abs=1e-6)
        assert u["unfused_ms"] == pytest.approx(sum(weight[i] for i in u["nodes"]), abs=1e-6 * len(u["nodes"]))
        assert (u in a["fusion"]["applied"]) == (u["fused_ms"] < u["unfused_ms"])
    saved = sum(u["unfused_ms"] - u["fused_ms"] for u in a["fusion"]["applied"])
    assert a["fusion"]["bounds"]["sequential_ms"] == pytest.approx(a["bounds"]["sequential_ms"] - saved,
                                                                   abs=1e-6 * len(a["layers"]))
