"""The resource floors under the parallel bound, end to end: a transformer block whose q/k/v
projections run side by side, generated for oneDNN, measured by `benanza run` at one thread and
at two (two stacks of one system), analysed by `benanza analyze --json` against peaks stored in
the database. Every floor is recomputed here from the ONNX file's own tensors (weight bytes from
the initializers, FLOPs by the README's convention) and the stored peaks, and the parallel bound
must be at least each of them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import io, model, tensor
from onnx import helper, numpy_helper

from benanza.peaks import Peak, Peaks
from benanza.perfdb import PerfDB

slow = pytest.mark.slow  # builds and runs oneDNN benchmarks

SEQ, DIM = 16, 64
LLC = 20_000  # the stored peaks' last-level cache: above each projection's weights, below their sum
BENANZA = str(Path(sys.executable).parent / "benanza")


def block():
    """x → q, k, v projections (side by side) → softmax(q·kᵀ)·v → output projection + x."""
    weights = [tensor(n, (DIM, DIM)) for n in ("Wq", "Wk", "Wv", "Wo")]
    nodes = [
        helper.make_node("MatMul", ["x", "Wq"], ["q"], name="q_proj"),
        helper.make_node("MatMul", ["x", "Wk"], ["k"], name="k_proj"),
        helper.make_node("MatMul", ["x", "Wv"], ["v"], name="v_proj"),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1], name="k_t"),
        helper.make_node("MatMul", ["q", "kt"], ["s"], name="scores"),
        helper.make_node("Softmax", ["s"], ["p"], axis=-1, name="softmax"),
        helper.make_node("MatMul", ["p", "v"], ["o"], name="mix"),
        helper.make_node("MatMul", ["o", "Wo"], ["y"], name="o_proj"),
        helper.make_node("Add", ["y", "x"], ["z"], name="residual"),
    ]
    return model(nodes, [io("x", [1, SEQ, DIM])], [io("z", None)], weights), weights


def hand_flops() -> int:
    """2 per multiply-add of each MatMul, 5 per softmax element, 1 per added element; a
    transpose computes nothing."""
    projection = 2 * SEQ * DIM * DIM
    return 4 * projection + 2 * (2 * SEQ * SEQ * DIM) + 5 * SEQ * SEQ + SEQ * DIM


def peaks(bandwidth: float, gemm: float = 1e13, contended: float = 0.0) -> Peaks:
    return Peaks((Peak("gemm", gemm, 1024, dtype="f32"), Peak("bandwidth", 1e12, 1024, level="L1"),
                  Peak("bandwidth", bandwidth, 1 << 26, level="DRAM")), threads=1,
                 levels=(("L1", 4096), ("L3", LLC)), contended=contended)


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run([BENANZA, *args], capture_output=True, text=True, timeout=1500,
                          env=dict(os.environ, COLUMNS="250", **(env or {})))
    assert done.returncode == 0, f"benanza {' '.join(args)}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """The block measured at 1 and 2 threads under system "box"; its stacks by thread count."""
    d = tmp_path_factory.mktemp("floors")
    onnx_model, weights = block()
    path = d / "block.onnx"
    import onnx

    onnx.save(onnx_model, str(path))
    cli("generate", str(path), "--out", str(d / "bench"), "--backend", "onednn", "--dtype", "f32")
    for threads in ("1", "2"):
        cli("run", "--bench-dir", str(d / "bench"), "--system", "box", "--db", str(d / "perf.db"), "--backend",
            "onednn", "--threads", threads, "--min-time", "0.01", "--repetitions", "1", "--max-contention", "1",
            "--no-peaks")
    with PerfDB(d / "perf.db") as db:
        stacks = {dict(s.stack)["threads"]: s for s, _, _ in db.stacks("box")}
    assert set(stacks) == {"1", "2"}
    return d, path, weights, stacks


def analyze(d: Path, path: Path, stack, stored: Peaks, *extra: str) -> dict:
    with PerfDB(d / "perf.db") as db:
        db.store_peaks(stack, stored)
    out = cli("analyze", str(path), "--system", "box", "--db", str(d / "perf.db"), "--stack", stack.stack_id,
              "--json", *extra)
    (a,) = json.loads(out.stdout)["analyses"]
    assert not a["coverage"]["missing"] and not a["coverage"]["not_covered"]
    return a


def floor_of(a: dict, name: str) -> dict:
    (f,) = [f for f in a["floors"]["floors"] if f["name"] == name]
    return f


def check_floors(a: dict, weights, stored: Peaks, work_ms: float, threads: int) -> None:
    """Each floor recomputed from the file's tensors and the stored peaks; the parallel bound is
    at least each, and is the critical path where none is higher."""
    dram = stored.dram
    assert dram is not None
    streamed = sum(numpy_helper.to_array(w).nbytes for w in weights) - LLC
    memory = 1e3 * streamed / dram.value  # no projection's weights exceed the LLC: no layer raises the rate
    gemm = stored.gemm("f32")
    assert gemm is not None
    compute = 1e3 * hand_flops() / gemm.value  # far above any layer's rate here: the peak stands
    work = work_ms / threads
    f = a["floors"]
    assert floor_of(a, "memory")["amount"] == streamed and floor_of(a, "compute")["amount"] == hand_flops()
    assert floor_of(a, "memory")["ms"] == pytest.approx(memory, rel=1e-4)
    assert floor_of(a, "compute")["ms"] == pytest.approx(compute, rel=1e-4)
    # the JSON rounds every figure to 1e-6 ms: `work`, a sum of the layers' rounded latencies, is
    # off by up to half that per layer, more than 1e-4 of a bound of 0.02 ms
    tolerance = 1e-6 + 0.5e-6 * sum(1 for r in a["layers"] if r["status"] == "ok")
    assert floor_of(a, "work")["ms"] == pytest.approx(work, rel=1e-4, abs=tolerance)
    parallel = a["bounds"]["parallel_ms"]
    assert all(parallel >= x - tolerance for x in (memory, compute, work, f["critical_path_ms"]))
    assert parallel == pytest.approx(max(memory, compute, work, f["critical_path_ms"]), abs=tolerance)
    assert f["parallel_ms"] == pytest.approx(parallel, abs=tolerance)


@slow
def test_on_one_thread_the_work_floor_binds(measured):
    """One thread runs one layer at a time: the branches side by side gain nothing, and the
    parallel bound is the sequential one, though the critical path leaves two projections out."""
    d, path, weights, stacks = measured
    stored = peaks(bandwidth=1e12)
    a = analyze(d, path, stacks["1"], stored)
    seq = a["bounds"]["sequential_ms"]
    ok = [r["latency_ms"] for r in a["layers"] if r["status"] == "ok"]
    work = sum(ok)
    assert work == pytest.approx(seq, rel=1e-4, abs=1e-6 + 0.5e-6 * len(ok))  # the JSON's rounding (above)
    check_floors(a, weights, stored, work, 1)
    assert a["floors"]["critical_path_ms"] < seq  # q_proj and v_proj are off the critical path
    assert a["floors"]["binds"] == "work"
    assert a["bounds"]["parallel_ms"] == pytest.approx(seq, rel=1e-4)


@slow
def test_the_work_floor_of_two_threads_comes_from_the_one_thread_stack(measured):
    d, path, weights, stacks = measured
    stored = peaks(bandwidth=1e12)
    single = analyze(d, path, stacks["1"], stored)
    a = analyze(d, path, stacks["2"], stored)
    one = {r["index"]: r["latency_ms"] for r in single["layers"] if r["status"] == "ok"}
    # a layer's work: its single-thread time, or twice its two-thread time where that is less
    work = sum(min(one[r["index"]], 2 * r["latency_ms"]) for r in a["layers"] if r["status"] == "ok")
    check_floors(a, weights, stored, work, 2)
    assert floor_of(a, "work")["layers"] == sum(1 for r in a["layers"] if r["status"] == "ok")
    # so the floor never exceeds the bound the sequential schedule reaches on the same threads
    assert floor_of(a, "work")["ms"] <= a["bounds"]["sequential_ms"] + 1e-6 * len(one)


@slow
def test_memory_floor_binds_and_a_floor_above_the_measurement_is_said(measured):
    """Memory 1/3 as fast as the sum of the layers needs: one pass over the weights beyond the
    cache outlasts every layer, the parallel bound is the memory floor, above the sequential bound
    too (each benchmark kept its weights in cache) and above a measurement put between it and the
    critical path, which a warning says."""
    d, path, weights, stacks = measured
    fast = analyze(d, path, stacks["2"], peaks(bandwidth=1e12))
    seq, cp = fast["bounds"]["sequential_ms"], fast["floors"]["critical_path_ms"]
    streamed = sum(numpy_helper.to_array(w).nbytes for w in weights) - LLC
    slow = peaks(bandwidth=streamed / (3 * seq / 1e3))
    measured_ms = f"{(cp + 3 * seq) / 2:.6g}"
    a = analyze(d, path, stacks["2"], slow, "--measured-ms", measured_ms)
    single = analyze(d, path, stacks["1"], peaks(bandwidth=1e12))
    work = sum(r["latency_ms"] for r in single["layers"] if r["status"] == "ok")
    check_floors(a, weights, slow, work, 2)
    assert a["floors"]["binds"] == "memory"
    # the roofline's critical path sits on the same floor (one run streams the weights either way)
    assert a["speed_of_light"]["parallel_ms"] == pytest.approx(floor_of(a, "memory")["ms"], rel=1e-4)
    assert a["bounds"]["parallel_ms"] == pytest.approx(3 * seq, rel=1e-3)
    assert a["speedup"]["parallel"] == pytest.approx(float(measured_ms) / a["bounds"]["parallel_ms"], rel=1e-3)
    assert any("memory floor" in n and "above the sequential bound" in n for n in a["notes"])
    (warning,) = [w for w in a["warnings"] if w.startswith("bound above measured")]
    assert "the memory floor" in warning and "raised the parallel bound above the critical path" in warning
    assert "streamed fewer weight bytes than the floor counts" in warning
    text = cli("analyze", str(path), "--system", "box", "--db", str(d / "perf.db"), "--stack", stacks["2"].stack_id,
               "--measured-ms", measured_ms).stdout
    assert "the memory floor binds" in text and "critical path, without the floors" in text
    html = d / "r.html"
    cli("analyze", str(path), "--system", "box", "--db", str(d / "perf.db"), "--stack", stacks["2"].stack_id,
        "--report", str(html))
    page = html.read_text()
    assert "memory floor (ms) <b>binds</b>" in page and "critical path, without the floors" in page


@slow
def test_no_trusted_peaks_no_memory_or_compute_floor(measured):
    d, path, _, stacks = measured
    a = analyze(d, path, stacks["2"], peaks(bandwidth=1e3, contended=0.5))
    names = {f["name"] for f in a["floors"]["floors"]}
    assert names == {"work"}  # the 1-byte/ms memory would bind if these peaks were believed
    assert any(x.startswith("memory and compute floors: the stack's peaks were measured while other processes "
                            "took 50%") for x in a["floors"]["absent"])
    f = a["floors"]
    assert a["bounds"]["parallel_ms"] == pytest.approx(max(f["critical_path_ms"], floor_of(a, "work")["ms"]),
                                                       abs=1e-6)


@slow
def test_weights_without_a_peak_table_entry_for_levels_say_so(measured):
    """Peaks stored without cache sizes (an older version's) give no memory floor, with the reason."""
    d, path, _, stacks = measured
    stored = Peaks(peaks(bandwidth=1e12).peaks, threads=1)
    a = analyze(d, path, stacks["2"], stored)
    assert "memory" not in {f["name"] for f in a["floors"]["floors"]}
    assert any("name no cache sizes" in x for x in a["floors"]["absent"])
    assert np.isfinite(a["bounds"]["parallel_ms"])


@pytest.mark.parametrize("math", ["exact", "tf32"])
def test_a_gpu_stack_has_memory_and_compute_floors_and_no_work_floor(math, save):
    """A cuDNN stack's peaks (GEMM per type, device copies beyond L2, the L2's size): the weights
    beyond L2 over the device memory's bandwidth, the FLOPs at the peak of each layer's math (fp32
    allowed TF32: the faster TF32 peak), and no work floor (no CPU threads), said."""
    from benanza.analyzer import analyze
    from benanza.processor import load_model
    from benanza.records import Result, System, Variant
    from tests.analysis.test_analyzer import results_for

    onnx_model, weights = block()
    m = load_model(save(onnx_model, "block.onnx"), name="block")
    results = results_for(m, ms_of=lambda n: 0.01, backend="cudnn")
    if math == "tf32":
        results = [Result(Variant(r.variant.problem, "cudnn", "api", dtype="f32", math="tf32_allowed"), "sys",
                          r.status, median_ms=r.median_ms) for r in results]
    gpu = Peaks((Peak("gemm", 2e13, 4096, dtype="f32"), Peak("gemm", 5e14, 4096, dtype="tf32"),
                 Peak("bandwidth", 6e12, 1 << 20, level="L2"), Peak("bandwidth", 3e12, 1 << 28, level="DRAM")),
                levels=(("L2", LLC),))
    stack = System("h100", "cudnn", "NVIDIA H100", (("cudnn", "9.0"),))
    a = analyze(m, results, "h100", "cudnn", peaks=gpu, stack=stack, math=math)
    assert not a.not_covered and not a.missing
    assert a.floors is not None
    got = {f.name: f for f in a.floors.floors}
    streamed = sum(numpy_helper.to_array(w).nbytes for w in weights) - LLC
    assert got["memory"].amount == streamed and got["memory"].ms == pytest.approx(1e3 * streamed / 3e12)
    peak = 5e14 if math == "tf32" else 2e13
    assert got["compute"].amount == hand_flops() and got["compute"].ms == pytest.approx(1e3 * hand_flops() / peak)
    assert "work" not in got and any(x.startswith("work floor: the stack names no CPU threads")
                                     for x in a.floors.absent)
    assert a.bounds.parallel_ms == pytest.approx(max(a.floors.critical_path_ms, got["memory"].ms,
                                                     got["compute"].ms))
