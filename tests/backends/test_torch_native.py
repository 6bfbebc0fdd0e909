"""The torch backend through the real pipeline: generate → run → database → analyze.

The oracles are PyTorch and oneDNN themselves, in separate plain-torch processes: the same
convolution called with ``F.conv2d`` under ``ONEDNN_VERBOSE=1`` (oneDNN's own per-call execution
times, implementation and problem, read here straight from the log's lines), and with oneDNN
switched off under the torch profiler (the aten op's own time).
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner
from helpers import assert_faults_isolated, best_low_ms, invoke, io, model, newest_row, tensor
from onnx import helper

from benanza.cli import main
from benanza.generator import GenOptions, expand_variants, get_backend
from benanza.manifest import read_manifest
from benanza.perfdb import PerfDB
from benanza.records import Status

# generates, runs and profiles torch's benchmarks end to end
pytestmark = pytest.mark.slow

SYSTEM = "torchbox"
CALLS = 200  # plain-torch calls the oracles time
# oracle processes per comparison: on the shared 2-vCPU machine one process's per-call times sit
# in one of two levels some 30% apart from run to run (seen in the oracle alone); the benchmark
# must fall within ±30% of the range the oracle's runs span
ORACLE_RUNS = 3
# a convolution torch 2.x sends to oneDNN on one thread (smaller ones go to its own slow_conv2d)
CONV = "conv:mb1_ic32ih28iw28_oc64oh28ow28_kh3kw3_sh1sw1_ph1pw1_dh1dw1_g1_bias1_f32"
ONEDNN_PROBLEM = "mb1_ic32oc64_ih28oh28kh3sh1dh0ph1_iw28ow28kw3sw1dw0pw1"  # the same, in oneDNN's words


def small_net() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Conv", ["x", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("GlobalAveragePool", ["r1"], ["p"], name="gap"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "Wfc", "Bfc"], ["y"], transB=1, name="fc"),
    ]
    inits = [tensor("W1", (64, 32, 3, 3)), tensor("B1", (64,)), tensor("Wfc", (10, 64)), tensor("Bfc", (10,))]
    return model(nodes, [io("x", [1, 32, 28, 28])], [io("y", None)], inits)


# the plain-torch oracle: the model's convolution, F.conv2d as a torch model calls it
ORACLE = """
import sys, torch, torch.nn.functional as F
torch.set_num_threads(1)
layout, onednn, calls = sys.argv[1], sys.argv[2] == "on", int(sys.argv[3])
x, w, b = torch.rand(1, 32, 28, 28), torch.rand(64, 32, 3, 3), torch.rand(64)
if layout == "nhwc":
    x, w = x.contiguous(memory_format=torch.channels_last), w.contiguous(memory_format=torch.channels_last)
with torch.no_grad(), torch.backends.mkldnn.flags(enabled=onednn):
    for _ in range(3):
        F.conv2d(x, w, b, 1, 1)
    if onednn:
        for _ in range(calls):
            F.conv2d(x, w, b, 1, 1)
    else:
        with torch.profiler.profile() as prof:
            for _ in range(calls):
                F.conv2d(x, w, b, 1, 1)
        print("CONV2D_US", *[e.time_range.elapsed_us() for e in prof.events() if e.name == "aten::conv2d"])
"""


def _oracle(layout: str, onednn: str) -> str:
    env = {**os.environ, "ONEDNN_VERBOSE": "1" if onednn == "on" else "0"}
    out = subprocess.run([sys.executable, "-c", ORACLE, layout, onednn, str(CALLS)], env=env, capture_output=True,
                         text=True, check=True, timeout=300)
    return out.stdout


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    root = tmp_path_factory.mktemp("torch")
    path = root / "net.onnx"
    onnx.save(small_net(), path)
    bench, db = root / "bench", root / "perf.db"
    invoke("generate", str(path), "--backend", "torch", "--out", str(bench))
    invoke("run", "--system", SYSTEM, "--backend", "torch", "--bench-dir", str(bench), "--db", str(db),
           "--threads", "1", "--min-time", "0.05", "--repetitions", "3", "--remeasure", "1")
    return path, bench, db


def _variant(layer: str, algo: str, layout: str, fusion: str = "none") -> str:
    return f"{layer}/backend=torch/api=Conv/algo={algo}/dtype=f32/layout={layout}/math=default/fusion={fusion}"


def test_variants_are_the_choices_a_torch_user_has(measured):
    _, bench, _ = measured
    variants = expand_variants(read_manifest(bench), get_backend("torch"), GenOptions())
    conv = sorted((v.algo, v.layout, v.dtype, v.fusion) for v in variants if v.layer_key.startswith("conv:"))
    # torch's own answer whether this CPU runs oneDNN in bf16 decides the bf16 variants
    dtypes = ["f32", "bf16"] if torch.ops.mkldnn._is_mkldnn_bf16_supported() else ["f32"]
    assert conv == sorted((a, lay, d, f) for a in ("onednn", "native") for lay in ("nchw", "nhwc") for d in dtypes
                          for f in ("none", "bias_relu"))
    relu = sorted((v.algo, v.layout) for v in variants if v.problem.family == "eltwise" and v.dtype == "f32")
    assert relu == [("default", "nchw"), ("default", "nhwc")]  # oneDNN on/off only where torch has the choice
    gemm = sorted((v.algo, v.layout) for v in variants if v.problem.family == "gemm" and v.dtype == "f32")
    assert gemm == [("native", "plain"), ("onednn", "plain")]


def _agrees_with(measured, name: str, oracle) -> sqlite3.Row:
    """The variant's newest result, once its low percentile is within ±30% of the oracle's
    (``oracle()``: a plain-torch run's 10th percentile of per-call times, and what ran), taken
    ORACLE_RUNS times. A result measured in a busy moment of the shared machine is measured again
    (twice at most) as a user would, `benanza run --force` of that variant, rather than compared
    with an oracle run in a quiet one."""
    _, bench, db = measured
    for _ in range(3):
        row = newest_row(db, name)
        assert row["status"] == "ok", row["message"]
        lows = [oracle()[0] for _ in range(ORACLE_RUNS)]
        if min(lows) / 1.3 < row["low_ms"] < max(lows) * 1.3:
            return row
        invoke("run", "--system", SYSTEM, "--backend", "torch", "--bench-dir", str(bench), "--db", str(db),
               "--threads", "1", "--min-time", "0.05", "--repetitions", "3", "--force", "--filter",
               "^" + re.escape(name) + "$")
    raise AssertionError((name, row["low_ms"], lows))


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_onednn_conv_against_onednns_own_verbose_log(measured, layout):
    """The backend's oneDNN convolution: the implementation oneDNN names in its verbose log of a
    plain F.conv2d of the same problem, and a latency within ±30% of that log's per-call times
    (every primitive of a call: torch's reorders around a blocked kernel too). 10th percentiles
    of both, which a loaded machine disturbs least."""
    def oracle() -> tuple[float, str]:
        lines = [line.split(",") for line in _oracle(layout, "on").splitlines()
                 if line.startswith("onednn_verbose") and ",exec," in line]
        calls = [f[f.index("exec") + 1:] for f in lines]  # engine, primitive kind, implementation, ...
        assert calls and len(calls) % (CALLS + 3) == 0, len(calls)
        per_call = len(calls) // (CALLS + 3)
        convs = [c for c in calls if c[1] == "convolution"]
        assert {c[-2] for c in convs} == {ONEDNN_PROBLEM}
        return float(np.percentile([sum(float(c[-1]) for c in calls[i:i + per_call])
                                    for i in range(3 * per_call, len(calls), per_call)], 10)), convs[-1][2]

    row = _agrees_with(measured, _variant(CONV, "onednn", layout), oracle)
    assert row["implementation"] == oracle()[1]


def test_native_conv_against_the_torch_profilers_time(measured):
    """oneDNN off: torch's own convolution, timed as the profiler times aten::conv2d in a plain run."""
    def oracle() -> tuple[float, str]:
        out = next(line for line in _oracle("nchw", "off").splitlines() if line.startswith("CONV2D_US"))
        return float(np.percentile([float(t) for t in out.split()[1:]], 10)) / 1e3, "aten::conv2d"

    row = _agrees_with(measured, _variant(CONV, "native", "nchw"), oracle)
    assert row["implementation"].startswith("aten::") and "conv" in row["implementation"]


def test_results_carry_the_runtime_statistics(measured):
    _, bench, db = measured
    with PerfDB(db, readonly=True) as pdb:
        system = pdb.system(SYSTEM, "torch")
        assert system is not None
        results = [r for r in pdb.results(system) if r.variant.backend == "torch"]
    index = json.loads((bench / "torch" / "benchmarks.json").read_text())
    assert {r.variant.name for r in results} == set(index)
    for r in results:
        assert r.status is Status.OK, (r.variant.name, r.message)
        assert r.samples >= 3 and r.repetitions == 3
        assert r.low_ms is not None and 0 < r.low_ms <= r.sample_median_ms
        assert r.contention is not None
        assert r.metrics["reorder_ms"] >= 0


def test_stack_names_torch_its_onednn_and_threads(measured):
    _, _, db = measured
    with PerfDB(db, readonly=True) as pdb:
        stack = dict(pdb.system(SYSTEM, "torch").stack)
    assert stack["torch"] == torch.__version__
    # the version oneDNN itself prints in its verbose header, in a plain torch process
    logged = re.search(r"info,oneDNN v(\d+\.\d+\.\d+)", _oracle("nchw", "on"))
    assert logged is not None and stack["onednn"] == logged.group(1)
    assert stack["threads"] == "1"


def test_a_second_run_resumes_with_nothing_to_do(measured):
    _, bench, db = measured
    out = invoke("run", "--system", SYSTEM, "--backend", "torch", "--bench-dir", str(bench), "--db", str(db),
                 "--threads", "1", "--dry-run")
    index = json.loads((bench / "torch" / "benchmarks.json").read_text())
    assert f"0 of {len(index)} benchmarks would run ({len(index)} already in" in out, out


def test_analysis_bound_is_the_fastest_torch_variant_in_sql(measured):
    """`analyze --backend torch`: each layer's latency is the lowest low percentile among its
    unfused torch variants (any layout, oneDNN on or off), recomputed in SQL."""
    path, _, db = measured
    doc = json.loads(invoke("analyze", str(path), "--system", SYSTEM, "--db", str(db), "--backend", "torch",
                            "--json", "--allow-contended"))
    a = doc["analyses"][0]
    assert a["backend"] == "torch"
    con = sqlite3.connect(db)
    for la in a["layers"]:
        if la["status"] != "ok":
            continue
        best, = con.execute(
            "SELECT MIN(r.low_ms) FROM results r JOIN variants v ON v.name = r.variant WHERE v.backend = 'torch' "
            "AND r.layer_key = ? AND v.fusion = 'none' AND r.status = 'ok' "
            "AND r.id = (SELECT MAX(id) FROM results WHERE variant = r.variant)", (la["key"],)).fetchone()
        assert la["latency_ms"] == pytest.approx(best, rel=1e-3), la["name"]
    con.close()


def test_a_crash_and_a_hang_cost_only_their_benchmark(measured, tmp_path):
    """Crash isolation and --timeout hold for the torch child as for a C++ binary."""
    _, bench, _ = measured
    assert_faults_isolated(bench, SYSTEM, "torch", _variant(CONV, "native", "nchw"), _variant(CONV, "native", "nhwc"),
                           r"algo=native/.*fusion=none", 30, tmp_path / "faults.db")


def test_analysis_of_a_torch_profile_defaults_to_torch_and_judges_its_kernels(measured, tmp_path):
    """Against `benanza profile --framework torch` (the model as given: contiguous, oneDNN on, torch's
    defaults) the bound is torch's own backend with no --backend given, and Q3 holds the variant
    torch ran against the fastest computing the same (channels_last, oneDNN off), as stored in SQL."""
    path, _, db = measured
    prof = tmp_path / "prof"
    invoke("profile", str(path), "--framework", "torch", "--out", str(prof))
    doc = json.loads(invoke("analyze", str(path), "--system", SYSTEM, "--db", str(db), "--profile", str(prof),
                            "--json", "--allow-contended"))
    a = doc["analyses"][0]
    assert a["backend"] == "torch"
    conv1 = {k["name"]: k for k in a["framework"]["kernels"]}["conv1"]
    used = newest_row(db, _variant(CONV, "onednn", "nchw"))
    others = [newest_row(db, _variant(CONV, algo, layout))
              for algo in ("onednn", "native") for layout in ("nchw", "nhwc")]
    assert conv1["used_ms"] == pytest.approx(used["low_ms"], rel=1e-3)
    assert conv1["best_ms"] == pytest.approx(min(r["low_ms"] for r in others), rel=1e-3)
    assert conv1["gain_ms"] == pytest.approx(used["low_ms"] - conv1["best_ms"], abs=1e-6)


def test_check_compares_each_variant_with_the_unoptimized_nodes(measured):
    """`check --backend torch`: every variant (channels_last, oneDNN off, a pattern's nodes) computes
    what ONNX Runtime computes for the model's nodes with every optimization off."""
    path, bench, _ = measured
    out = CliRunner().invoke(main, ["check", str(path), "--bench-dir", str(bench), "--backend", "torch"])
    assert out.exit_code == 0, out.output
    index = json.loads((bench / "torch" / "benchmarks.json").read_text())
    assert f"checked {len(index)} benchmarks (seed 0): {len(index)} ok, 0 mismatch" in out.stdout


def test_check_catches_a_wrong_result(measured, monkeypatch):
    """The runtime's fault hook BENANZA_FAULT_PERTURB puts one wrong input element into one
    variant's run: the check names the mismatch and its element, and only that one."""
    from benanza.check import CheckOptions, CheckStatus, check_subgraphs

    _, bench, _ = measured
    name = _variant(CONV, "onednn", "nhwc")
    monkeypatch.setenv("BENANZA_FAULT_PERTURB", name)
    results = {r.name: r for r in check_subgraphs(bench, "torch", CheckOptions(filter="^conv:"))}
    assert results[name].status is CheckStatus.MISMATCH and "element" in results[name].where
    assert all(r.status is CheckStatus.OK for n, r in results.items() if n != name)


# A convolution of a few microseconds in f32: in bf16 on a CPU without bf16 instructions torch's
# own kernels convert around f32 arithmetic (over 100 times slower), and this one stays small
BF16_ORACLE = """
import torch, torch.nn.functional as F
x, w = torch.rand(1, 8, 8, 8, dtype=torch.bfloat16), torch.rand(8, 8, 3, 3, dtype=torch.bfloat16)
with torch.no_grad():
    F.conv2d(x, w, padding=1)
"""


def tiny_net() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r"], ["p"], name="gap"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "Wfc", "Bfc"], ["y"], transB=1, name="fc"),
    ]
    inits = [tensor("W", (8, 8, 3, 3)), tensor("B", (8,)), tensor("Wfc", (4, 8)), tensor("Bfc", (4,))]
    return model(nodes, [io("x", [1, 8, 8, 8])], [io("y", None)], inits)


def test_bf16_through_the_pipeline_against_torchs_own_bf16(tmp_path):
    """`--dtype bf16`: measured on any CPU, through the kernels torch runs in bf16 there. The
    oneDNN variant exists exactly where oneDNN's own verbose log shows torch sending a bf16
    convolution to it (an AVX2-only CPU: never, and torch's own bf16 kernels are measured); every
    variant is stored OK, `check` passes each against ONNX Runtime on the same bf16 values, and the
    convolution computes what a plain torch F.conv2d in bf16 computes."""
    from benanza.backends.torch_native import BACKEND
    from benanza.check import generated

    path = tmp_path / "tiny.onnx"
    onnx.save(tiny_net(), path)
    bench, db = tmp_path / "bench", tmp_path / "perf.db"
    invoke("generate", str(path), "--backend", "torch", "--dtype", "bf16", "--no-fusion", "--layout", "nchw",
           "--out", str(bench))
    index = json.loads((bench / "torch" / "benchmarks.json").read_text())
    assert index and all("/dtype=bf16/" in name for name in index)
    log = subprocess.run([sys.executable, "-c", BF16_ORACLE], env={**os.environ, "ONEDNN_VERBOSE": "1"},
                         capture_output=True, text=True, check=True, timeout=300).stdout
    onednn_bf16 = any(",exec," in line and ",convolution," in line and ":bf16" in line for line in log.splitlines())
    conv = sorted(n for n in index if n.startswith("conv:"))
    assert [re.search(r"/algo=(\w+)/", n).group(1) for n in conv] == (["native", "onednn"] if onednn_bf16
                                                                        else ["native"])

    invoke("run", "--system", "bf16box", "--backend", "torch", "--bench-dir", str(bench), "--db", str(db),
           "--threads", "1", "--min-time", "0.01", "--repetitions", "2", "--remeasure", "0", "--max-contention", "1")
    for name in index:
        row = newest_row(db, name)
        assert row["status"] == "ok", (name, row["message"])
    native = next(n for n in conv if "/algo=native/" in n)
    assert newest_row(db, native)["implementation"].startswith("aten::")

    out = CliRunner().invoke(main, ["check", str(path), "--bench-dir", str(bench), "--backend", "torch"])
    assert out.exit_code == 0, out.output
    assert f"checked {len(index)} benchmarks (seed 0): {len(index)} ok, 0 mismatch" in out.stdout

    entry = index[native]
    sub = onnx.load(bench / "torch" / entry["model"])
    weights = {t.name: torch.from_numpy(onnx.numpy_helper.to_array(t).copy()) for t in sub.graph.initializer}
    x = generated(0, (1, 8, 8, 8))
    got = BACKEND.outputs(bench / "torch" / entry["model"], entry, {"x": x}, 1)
    with torch.no_grad(), torch.backends.mkldnn.flags(enabled=False):
        want = torch.nn.functional.conv2d(torch.from_numpy(x).bfloat16(), weights["W"].bfloat16(),
                                          weights["B"].bfloat16(), padding=1)
    np.testing.assert_array_equal(got[0], want.float().numpy())


def test_across_stack_split_against_onednn_recomputed_from_sql_and_the_trace(measured, tmp_path):
    """With oneDNN's results stored for the same system, an analysis against torch's profile reads
    torch's own backend and splits the measured time: kernel headroom = torch bound − oneDNN bound,
    per layer and in all from SQL; framework overhead = the layer's own time in torch's trace (its
    record_function range, read from the raw Chrome trace) − its torch bound, and measured − the
    torch bound for the model (each over the trace's runs after the first, which warms up)."""
    path, bench, db = measured
    onednn = tmp_path / "bench"
    invoke("generate", str(path), "--backend", "onednn", "--dtype", "f32", "--no-fusion", "--out", str(onednn))
    # --max-contention 1: never stored contended, which on a busy machine withholds the split
    # (test_ort tests the contended split); this one recomputes the split's arithmetic
    invoke("run", "--system", SYSTEM, "--backend", "onednn", "--bench-dir", str(onednn), "--db", str(db),
           "--threads", "1", "--min-time", "0.05", "--repetitions", "3", "--remeasure", "1", "--no-peaks",
           "--max-contention", "1")
    prof = tmp_path / "prof"
    invoke("profile", str(path), "--framework", "torch", "--threads", "1", "--iterations", "5",
           "--trace-iterations", "5", "--out", str(prof))
    a = json.loads(invoke("analyze", str(path), "--system", SYSTEM, "--db", str(db), "--profile", str(prof),
                          "--json", "--allow-contended"))["analyses"][0]
    assert a["backend"] == "torch"
    assert a["threads"] == {"profile": 1, "benchmarks": 1, "source": "the profile's record", "differ": False}
    x = a["across_stack"]
    assert (x["framework"], x["vendor"], x["partial"]) == ("torch", "onednn", False)
    keys = {la["index"]: la["key"] for la in a["layers"]}
    events = json.loads((prof / "torch_trace.json").read_text())["traceEvents"]
    ranges = [e for e in events if e.get("cat") == "user_annotation"]
    runs = sorted(e["ts"] for e in ranges if e["name"] == "benanza_run")
    assert len(runs) == 5
    for la in x["layers"]:
        assert la["native_ms"] == pytest.approx(best_low_ms(db, "torch", keys[la["index"]]), rel=1e-3)
        vendor = best_low_ms(db, "onednn", keys[la["index"]])
        if vendor is None:  # a layer oneDNN does not run
            assert la["vendor_ms"] is None and la["kernel_headroom_ms"] is None
            continue
        assert la["vendor_ms"] == pytest.approx(vendor, rel=1e-3)
        assert la["kernel_headroom_ms"] == pytest.approx(la["native_ms"] - la["vendor_ms"], abs=1e-5)
        # per run, the first (warm-up) left out, as the analysis leaves it out
        own = sum(e["dur"] for e in ranges if e["name"] == la["name"] and e["ts"] >= runs[1]) / 4 / 1e3
        assert la["framework_ms"] == pytest.approx(own, rel=1e-3, abs=1e-5)
        assert la["framework_overhead_ms"] == pytest.approx(la["framework_ms"] - la["native_ms"], abs=1e-5)
    assert x["native_bound_ms"] == pytest.approx(sum(la["native_ms"] for la in x["layers"]), rel=1e-3)
    assert x["vendor_bound_ms"] == pytest.approx(sum(la["vendor_ms"] or 0.0 for la in x["layers"]), rel=1e-3)
    assert x["kernel_headroom_ms"] == pytest.approx(x["native_bound_ms"] - x["vendor_bound_ms"], abs=1e-5)
    assert x["framework_overhead_ms"] == pytest.approx(x["measured_ms"] - x["native_bound_ms"], abs=1e-5)
    assert x["measured_ms"] == a["measured_ms"]
    assert not [w for w in a["warnings"] if "across the stack" in w], a["warnings"]
