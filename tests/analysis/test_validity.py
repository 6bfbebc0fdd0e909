"""A bound above a measured latency is always explained, and Q3 compares a fused library call
with the benchmark of the same fusion, through the real pipeline: a conv net → `benanza generate`
(oneDNN, f32, fusion variants) → `benanza run` (real measurements) → a real `benanza profile
--framework torch` bundle, and real oneDNN verbose lines of fused calls (torch's mkldnn pointwise
ops, oneDNN 3.x; our own fused benchmarks under DNNL_VERBOSE, the benchmarks' oneDNN) →
`benanza analyze --json`. Every condition is recomputed here from the database rows (SQL) and
the log's lines, independently of the analyzer.
"""

from __future__ import annotations

import json
import re
import sqlite3
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from helpers import io, model, tensor
from onnx import helper, numpy_helper

from benanza.cli import main
from benanza.generator import read_variants
from benanza.parsers.bundle import INDEX_NAME
from benanza.profiler import ProfileSpec, profile_model
from tests.analysis.test_bounds_e2e import JSON_MS, best_by_key, floored, longest_path, node_keys

pytestmark = pytest.mark.slow
SYSTEM = "valid"
C, HW = 32, 28  # 32×28×28 inputs: large enough that torch sends the 3×3 convs to oneDNN


def conv_model():
    """Conv(bias)→Relu→Conv(no bias)→BN→Relu→Conv 1×1(bias)→Clip(0, 6)."""
    inits = [tensor("W1", (C, C, 3, 3)), tensor("B1", (C,)), tensor("W2", (C, C, 3, 3)),
             tensor("scale", (C,), 1.0), tensor("shift", (C,), 0.1), tensor("mean", (C,), 0.0),
             tensor("var", (C,), 1.0), tensor("W3", (2 * C, C, 1, 1)), tensor("B3", (2 * C,)),
             numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
             numpy_helper.from_array(np.array(6.0, np.float32), "hi")]
    nodes = [
        helper.make_node("Conv", ["x", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "W2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("BatchNormalization", ["c2", "scale", "shift", "mean", "var"], ["b2"], name="bn2"),
        helper.make_node("Relu", ["b2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "W3", "B3"], ["c3"], name="conv3"),
        helper.make_node("Clip", ["c3", "lo", "hi"], ["y"], name="clip3"),
    ]
    return model(nodes, [io("x", [1, C, HW, HW])], [io("y", None)], inits)


# the same three convs as torch's oneDNN pointwise ops, which fuse their activation as a post-op
# (the BN is folded into conv2's bias, as inference frameworks do)
FUSED_TORCH = f"""
import torch
torch.set_num_threads(1)
x = torch.rand(1, {C}, {HW}, {HW})
w1, b1, w2, b2 = torch.rand({C}, {C}, 3, 3), torch.rand({C}), torch.rand({C}, {C}, 3, 3), torch.rand({C})
w3, b3 = torch.rand({2 * C}, {C}, 1, 1), torch.rand({2 * C})
pw = torch.ops.mkldnn._convolution_pointwise
with torch.inference_mode():
    for _ in range(3):
        r1 = pw(x, w1, b1, [1, 1], [1, 1], [1, 1], 1, "relu", [None], "")
        r2 = pw(r1, w2, b2, [1, 1], [1, 1], [1, 1], 1, "relu", [None], "")
        pw(r2, w3, b3, [0, 0], [1, 1], [1, 1], 1, "hardtanh", [0.0, 6.0], "")
"""


def cli(*args: str) -> str:
    r = CliRunner().invoke(main, list(args))
    assert r.exit_code == 0, r.output
    return r.output


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    import onnx

    d = tmp_path_factory.mktemp("validity")
    onnx.save(conv_model(), str(d / "convs.onnx"))
    cli("generate", str(d / "convs.onnx"), "--out", str(d / "bench"), "--backend", "onednn", "--dtype", "f32",
        "--layout", "any", "--layout", "nhwc")
    # the figures of the pipeline are checked here, not how quiet the machine is (test_measurement)
    cli("run", "--bench-dir", str(d / "bench"), "--system", SYSTEM, "--db", str(d / "perf.db"), "--backend",
        "onednn", "--threads", "1", "--min-time", "0.01", "--repetitions", "3", "--max-contention", "1")
    profile_model(ProfileSpec(str(d / "convs.onnx"), "torch", str(d / "torch"), warmup=2, iterations=10,
                              trace_iterations=3))
    return d


def analyze(d: Path, *args: str) -> dict:
    (a,) = json.loads(cli("analyze", str(d / "convs.onnx"), "--system", SYSTEM, "--db", str(d / "perf.db"),
                          "--json", *args))["analyses"]
    return a


def exec_lines(log: str) -> list[list[str]]:
    return [ln.split(",") for ln in log.splitlines() if ",exec," in ln and ",convolution," in ln]


def conv_of(fields: list[str]) -> str:
    """The conv node an eager torch call ran, from its problem descriptor and bias: conv1 and
    conv2 have one shape, and only conv1 has a bias."""
    if "kh1" in fields[-2]:
        return "conv3"
    return "conv1" if re.search(r"(^|\s)bia[_:](?!undef)", fields[-5]) else "conv2"


def kernel(fields: list[str]) -> str:
    return "1x1" if "kh1" in fields[-2] else "3x3"


def db_best(d: Path, key: str, fusion: str = "none", layout: str | None = None, impl: str | None = None) -> float:
    """The fastest OK result (each variant's latest measurement: re-measured ones have several), by
    the latency a bound uses: the calls' low percentile where they were timed, else the median."""
    query = ("SELECT min(coalesce(r.low_ms, r.median_ms)) FROM results r JOIN variants v ON v.name = r.variant "
             "WHERE r.system = ? AND r.layer_key = ? AND r.status = 'ok' AND v.fusion = ? "
             "AND r.id IN (SELECT max(id) FROM results GROUP BY system, variant)")
    args: list = [SYSTEM, key, fusion]
    if layout:
        query, args = query + " AND v.layout = ?", args + [layout]
    if impl:
        query, args = query + " AND r.implementation = ?", args + [impl]
    with sqlite3.connect(d / "perf.db") as conn:
        return conn.execute(query, args).fetchone()[0]


def test_bound_above_measured_is_explained_exactly_when_it_is(work):
    keys = node_keys(work / "bench", "convs", "f32")
    best = best_by_key(work / "perf.db", SYSTEM, "f32")
    weight = {name: best.get(key, 0.0) for name, key in keys.items()}
    seq, par = sum(weight.values()), longest_path(work / "convs.onnx", weight)
    samples = sorted(json.loads((work / "torch" / INDEX_NAME).read_text())["latency_ms"]["samples"])
    cut = int(0.2 * len(samples))  # the trimmed mean: 20% dropped at each end
    measured = statistics.mean(samples[cut:len(samples) - cut])
    # the real torch run, then measured latencies below and above both bounds (a chain has no
    # parallel branch: its two bounds are equal)
    runs = [(("--profile", str(work / "torch")), measured), (("--measured-ms", str(seq / 2)), seq / 2),
            (("--measured-ms", str(seq * 2)), seq * 2)]
    for args, m in runs:
        a = analyze(work, *args)
        assert a["measured_ms"] == pytest.approx(m, **JSON_MS)
        assert a["bounds"]["sequential_ms"] == pytest.approx(seq, **JSON_MS)
        parallel = floored(a, par)
        assert a["bounds"]["parallel_ms"] == pytest.approx(parallel, **JSON_MS)
        said = [w for w in a["warnings"] if w.startswith("bound above measured")]
        assert len(said) == (1 if seq > m or parallel > m else 0), (m, seq, a["warnings"])
        if said:
            assert f"measured {m:.4g} ms" in said[0] and "likely because" in said[0]


def test_bound_above_a_framework_call_is_explained_per_layer(work):
    """Per conv torch sent to oneDNN: flagged exactly when the bound's latency for the layer (the
    fastest unfused result, SQL) exceeds the median of torch's own per-call times (its log)."""
    log = (work / "torch" / "onednn.log").read_text()
    calls: dict[str, list[float]] = {}
    for f in exec_lines(log):
        calls.setdefault(conv_of(f), []).append(float(f[-1]))
    assert calls, "torch sent no conv to oneDNN"
    keys = node_keys(work / "bench", "convs", "f32")
    best = best_by_key(work / "perf.db", SYSTEM, "f32")
    a = analyze(work, "--profile", str(work / "torch"))
    (lib,) = [x for x in a["libraries"] if x["library"] == "onednn"]
    algos = {x["name"]: x for x in lib["algorithms"]}
    assert set(algos) == set(calls)
    nthr = re.search(r"nthr:(\d+)", log)
    assert lib["framework_threads"] == (int(nthr.group(1)) if nthr else None)
    above = set()
    for name, times in calls.items():
        x = algos[name]
        framework, bound = statistics.median(times), best[keys[name]]
        assert x["framework_ms"] == pytest.approx(framework, abs=1e-6)  # the JSON rounds to 6 decimals
        assert x["bound_ms"] == pytest.approx(bound, **JSON_MS)
        assert x["comparable"] and x["post_ops"] == []  # torch eager fuses nothing
        # conv1's and conv3's biases are the unfused conv's own, and the "bias" variant computes the same
        assert x["fusion"] in (("none",) if name == "conv2" else ("none", "bias"))
        assert x["above_framework"] == (bound > framework)
        assert (x["explanation"] is not None) == (bound > framework)
        if bound > framework:
            above.add(name)
            if lib["framework_version"] != lib["benchmark_version"]:
                assert f"{lib['framework_version']}, the benchmarks' {lib['benchmark_version']}" in x["explanation"]
            if nthr and int(nthr.group(1)) != 1:
                assert f"ran {nthr.group(1)}, the benchmarks 1 threads" in x["explanation"]
    said = [w for w in a["warnings"] if w.startswith("bound above framework calls")]
    assert len(said) == (1 if above else 0)
    if above:
        assert f"for {len(above)} of {len(calls)} layers" in said[0]
        assert all(n in said[0] for n in list(above)[:4])


def test_fused_torch_calls_compare_with_the_same_fusion_or_are_not_judged(work):
    """torch's conv+ReLU calls (oneDNN 3.x, post-op eltwise_relu) are compared with the conv+bias+ReLU
    benchmarks; its conv+clip call, which no benchmark fuses, is not comparable and not judged."""
    out = subprocess.run([sys.executable, "-c", FUSED_TORCH], capture_output=True, text=True, check=True,
                         env={"ONEDNN_VERBOSE": "1", "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    log = work / "fused_torch.log"
    log.write_text("".join(ln + "\n" for ln in out.stdout.splitlines() if ln.startswith("onednn_verbose,")))
    lines = exec_lines(log.read_text())
    assert [kernel(f) for f in lines] == ["3x3", "3x3", "1x1"] * 3  # conv1, conv2, conv3, three passes
    assert {f[-4] for f in lines} == {"attr-scratchpad:user attr-post-ops:eltwise_relu",
                                      "attr-scratchpad:user attr-post-ops:eltwise_clip:0:6"}
    a = analyze(work, "--profile", str(log), "--measured-ms", "100")
    (lib,) = [x for x in a["libraries"] if x["library"] == "onednn"]
    algos = {x["name"]: x for x in lib["algorithms"]}
    keys = node_keys(work / "bench", "convs", "f32")
    for name, fusion in (("conv1", "bias_relu"), ("conv2", "bn_relu")):
        x = algos[name]
        assert x["post_ops"] == ["eltwise_relu"] and x["fusion"] == fusion and x["layout"] == "any"
        fused, unfused = db_best(work, keys[name], fusion, "any"), db_best(work, keys[name], "none", "any")
        assert x["best_ms"] == pytest.approx(fused, **JSON_MS)
        if fused != unfused:  # two measurements can tie (CI once saw 0.069993 ms for both): then no value tells
            assert x["best_ms"] != pytest.approx(unfused)  # not the unfused conv
    clip = algos["conv3"]
    assert clip["post_ops"] == ["eltwise_clip:0:6"] and not clip["comparable"]
    assert clip["best_ms"] is None and clip["fusion"] is None and not clip["suboptimal"]
    assert lib["not_comparable"] == 1
    assert any(n.startswith("Q3: 1 onednn calls not comparable: the call fuses eltwise_clip:0:6") for n in a["notes"])


def test_fused_calls_of_the_benchmarks_own_onednn_are_judged_against_the_fused_variant(work):
    """Same library version on both sides: our own fused benchmarks' verbose lines (oneDNN 2.x,
    `attr-post-ops:eltwise_relu `) as the framework's log. Q3 finds the implementation each call
    used among the fused variants' results of the same layout, and judges with those numbers."""
    from benanza.backends.base import build

    # nhwc: the plain layout the log's memory tags (acdb) name; for format `any` oneDNN may pick
    # a plain or a blocked layout, so only a blocked tag in a log reads as `any`
    variants = [v for v in read_variants(work / "bench" / "onednn") if v.algo == "auto" and v.layout == "nhwc"
                and v.fusion in ("bias_relu", "bn_relu")]
    assert len(variants) == 2
    names = work / "fused.txt"
    names.write_text("".join(v.name + "\n" for v in variants))
    binary = build(work / "bench" / "onednn")
    out = subprocess.run([str(binary), f"--benanza_names={names}", "--benchmark_min_time=0.001",
                          "--benchmark_repetitions=1"], capture_output=True, text=True, check=True, timeout=300,
                         env={"DNNL_VERBOSE": "1", "ONEDNN_VERBOSE": "1", "OMP_NUM_THREADS": "1",
                              "PATH": "/usr/bin:/bin"})
    verbose = [ln for ln in out.stdout.splitlines() if ln.startswith(("dnnl_verbose,", "onednn_verbose,"))]
    header = [ln for ln in verbose if ",info," in ln]
    order = {"bias_relu": "conv1", "bn_relu": "conv2"}  # conv1 has a bias; conv2's BN folds into one
    per: dict[str, list[str]] = {}
    current = None
    for ln in out.stdout.splitlines():
        if ln.startswith("BENANZA_START "):
            current = order[ln.split("/fusion=")[1].split("/")[0]]
        elif current and ",exec," in ln and ",convolution," in ln:
            per.setdefault(current, []).append(ln)
    assert set(per) == {"conv1", "conv2"} and all("attr-post-ops:eltwise_relu" in per[n][0] for n in per)
    log = work / "fused_ours.log"  # real lines, in model order, three passes
    log.write_text("".join(ln + "\n" for ln in header + [per[n][k] for k in range(3) for n in ("conv1", "conv2")]))
    a = analyze(work, "--profile", str(log), "--measured-ms", "100")
    (lib,) = [x for x in a["libraries"] if x["library"] == "onednn"]
    algos = {x["name"]: x for x in lib["algorithms"]}
    keys = node_keys(work / "bench", "convs", "f32")
    if lib["framework_version"] != lib["benchmark_version"]:
        pytest.fail(f"the benchmarks' own log names oneDNN {lib['framework_version']}, the stack "
                    f"{lib['benchmark_version']}")
    for name, fusion in (("conv1", "bias_relu"), ("conv2", "bn_relu")):
        x = algos[name]
        impl = per[name][0].split(",")[-7]
        assert x["used"] == impl and x["fusion"] == fusion
        assert x["layout"] == "nhwc"
        fused = db_best(work, keys[name], fusion, "nhwc", impl)
        assert x["used_ms"] == pytest.approx(fused, **JSON_MS)  # the fused variant's own latency
        assert x["best_ms"] == pytest.approx(db_best(work, keys[name], fusion, "nhwc"), **JSON_MS)
        assert x["gain_ms"] == pytest.approx(max(0.0, x["used_ms"] - x["best_ms"]), abs=2e-6)
