"""Q3 and the expected calls against PyTorch's cuDNN graph-API convolutions: the real cuDNN 9.19
log of an H200 (tests/fixtures/cudnn_v9_19_h200.log: F.relu(F.conv2d(x 1x3x224x224, w 64x3x7x7,
b, stride 2, pad 3)) run twice, each an execute of engine 28 with TF32 allowed), a model of that
convolution, and results stored as `benanza run` stores them: a stand-in benchmark binary
speaking the runtime's line protocol (the counters the cuDNN runtime prints, engine_id among
them), read and stored by the runner, read back from the database."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace

import helpers
import onnx
import pytest
from helpers import io, model, tensor
from onnx import helper

from benanza.analysis.questions import call_layout
from benanza.analyzer import MATH_TF32, analyze
from benanza.backends import cudnn
from benanza.generator import GenOptions, expand_variants
from benanza.layers import unique_layers
from benanza.manifest import build_manifest
from benanza.parsers import ExecutionProfile, parse_cudnn_log
from benanza.perfdb import PerfDB
from benanza.processor import load_model
from benanza.records import System
from benanza.runner import RunOptions, RunSummary, _execute

LOG = helpers.FIXTURES / "cudnn_v9_19_h200.log"
SYSTEM = System("h200", "cudnn", "stand-in", (("cudnn", "9.19.0"),))


@pytest.fixture(scope="module")
def conv_relu(tmp_path_factory):
    """The log's convolution as an ONNX model: Conv (bias) → Relu."""
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], name="conv1", strides=[2, 2], pads=[3, 3, 3, 3]),
             helper.make_node("Relu", ["c"], ["y"], name="relu1")]
    inits = [tensor("W", [64, 3, 7, 7], 0.01), tensor("B", [64], 0.0)]
    path = tmp_path_factory.mktemp("q3") / "conv.onnx"
    onnx.save(model(nodes, [io("x", [1, 3, 224, 224])], [io("y", None)], inits), str(path))
    return load_model(path)


@pytest.fixture(scope="module")
def variants(conv_relu):
    manifest = build_manifest([conv_relu], unique_layers([conv_relu]))
    return expand_variants(manifest, cudnn.BACKEND, GenOptions(dtypes=("f32",), math=("fma", "tf32_allowed")))


def _pick(variants, api: str, algo: str, math: str):
    return next(v for v in variants if (v.api, v.algo, v.dtype, v.layout, v.math, v.fusion)
                == (api, algo, "f32", "nchw", math, "none"))


def _stored(tmp_path, lines: dict) -> list:
    """``lines``: variant → (median ms, implementation, counters), printed by a stand-in binary
    as the runtime prints BENANZA_RESULT; what the runner stored, read back."""
    table = {v.name: [ms, impl, counters] for v, (ms, impl, counters) in lines.items()}
    fake = tmp_path / "benanza_bench"
    fake.write_text(f"""#!{sys.executable}
import json, sys
table = json.loads({json.dumps(json.dumps(table))})
for n in open(sys.argv[1].split("=", 1)[1]).read().split():
    ms, impl, counters = table[n]
    print("BENANZA_START", n, flush=True)
    print("BENANZA_RESULT", json.dumps({{"name": n, "implementation": impl, "status": "ok", "median_ms": ms,
          "mean_ms": ms, "stddev_ms": ms / 1000, "min_ms": ms, "iterations": 200, "repetitions": 5,
          "times_ms": [ms] * 5, "counters": counters}}), flush=True)
""")
    fake.chmod(0o755)
    summary = RunSummary(SYSTEM, "cudnn", tmp_path / "r.db", total=len(lines), already=0)
    with PerfDB(tmp_path / "r.db") as db:
        _execute(fake, list(lines), dict(os.environ), RunOptions(timeout=30), db, SYSTEM, summary, None)
        return db.results(SYSTEM.name)


def _graph(engine: int, configs: int = 3) -> dict:
    return {"flops": 2.4e8, "bytes": 4e6, "workspace_bytes": 0.0, "engine_configs": float(configs),
            "engine_id": float(engine), "calls": 1.0, "l2_flushed": 1.0}


LEGACY = {"flops": 2.4e8, "bytes": 4e6, "workspace_bytes": 0.0, "algo": 1.0, "heuristic_algo": 1.0, "calls": 1.0}


def _results(tmp_path, variants, plan0_engine: int):
    """The graph API's plan0 (``plan0_engine``, 0.050 ms) and plan1 (engine 41, 0.060 ms) with
    TF32 allowed, the legacy IMPLICIT_PRECOMP_GEMM faster with TF32 (0.030 ms) and slower
    without (0.080 ms), and the ReLU."""
    graph, legacy = cudnn.CUDNN_CONV_GRAPH, "cudnnConvolutionForward"
    relu = next(v for v in variants if v.api == "cudnnActivationForward" and v.dtype == "f32")
    engine = f"cudnn_frontend conv_fprop NCHW eng{plan0_engine}_k2=4_k13=0+cudnnAddTensor"
    precomp = "IMPLICIT_PRECOMP_GEMM+cudnnAddTensor"
    lines = {
        _pick(variants, graph, "plan0", "tf32_allowed"): (0.050, engine, _graph(plan0_engine)),
        _pick(variants, graph, "plan1", "tf32_allowed"): (0.060, "cudnn_frontend conv_fprop NCHW eng41", _graph(41)),
        _pick(variants, legacy, "IMPLICIT_PRECOMP_GEMM", "tf32_allowed"): (0.030, precomp, LEGACY),
        _pick(variants, legacy, "IMPLICIT_PRECOMP_GEMM", "fma"): (0.080, precomp, LEGACY),
        relu: (0.010, "cudnnActivationForward", {"flops": 8e5, "bytes": 6.4e6}),
    }
    return _stored(tmp_path, lines), lines


def _library(conv_relu, results, math: str):
    profile = ExecutionProfile(path=str(LOG), library_calls={"cudnn": parse_cudnn_log(LOG)})
    a = analyze(conv_relu, results, SYSTEM.name, "cudnn", profile=profile, math=math)
    (lib,) = a.libraries
    return a, lib


def test_the_engine_the_log_names_is_compared_with_its_plan(tmp_path, conv_relu, variants):
    results, lines = _results(tmp_path, variants, plan0_engine=28)
    stored = {r.variant.name: r for r in results}
    plan0 = _pick(variants, cudnn.CUDNN_CONV_GRAPH, "plan0", "tf32_allowed")
    assert stored[plan0.name].metrics["engine_id"] == 28  # the runner kept the runtime's counter
    _, lib = _library(conv_relu, results, MATH_TF32)
    (c,) = lib.algorithms
    assert (c.name, c.used, c.layout) == ("conv1", "eng28", "nchw")
    assert c.used_ms == pytest.approx(0.050) and c.used_variant == plan0.name
    # the best is the fastest TF32 variant over both APIs: the legacy call, not the exact-f32 one
    assert c.best_ms == pytest.approx(0.030) and c.best == "IMPLICIT_PRECOMP_GEMM+cudnnAddTensor"
    assert c.suboptimal and c.gain_ms == pytest.approx(0.050 - 0.030)
    assert c.explanation == ""


def test_an_engine_no_plan_ran_is_said(tmp_path, conv_relu, variants):
    results, _ = _results(tmp_path, variants, plan0_engine=58)
    _, lib = _library(conv_relu, results, MATH_TF32)
    (c,) = lib.algorithms
    assert c.used == "eng28" and c.used_ms is None and c.used_variant == ""
    assert c.comparable and not c.suboptimal and c.best_ms == pytest.approx(0.030)
    assert c.explanation == "engine 28 was not among the measured plans (engines 41, 58)"


def test_a_tf32_call_is_not_compared_with_exact_f32_benchmarks(tmp_path, conv_relu, variants):
    results, _ = _results(tmp_path, variants, plan0_engine=28)
    a, lib = _library(conv_relu, results, "exact")  # the exact-f32 analysis has no TF32 variant
    (c,) = lib.algorithms
    assert not c.comparable and c.used_ms is None and c.best_ms is None
    assert "allowed TF32" in c.explanation
    assert any("not comparable: the call allowed TF32" in n for n in a.notes)


def test_graph_api_executes_count_as_the_convolution_calls(tmp_path, conv_relu, variants):
    results, _ = _results(tmp_path, variants, plan0_engine=28)
    _, lib = _library(conv_relu, results, MATH_TF32)
    al = lib.alignment
    assert len(al.passes) == 2 and al.missing == [] and al.extra == [] and al.out_of_order == []
    # one conv per pass, run as an execute: the conv's call, not a missing conv plus an unexpected execute
    assert al.api_counts["cudnnConvolutionForward"] == (1, 1)
    assert "cudnnBackendExecute" not in al.api_counts


def test_a_graph_call_layout_is_read_from_its_strides():
    call = parse_cudnn_log(LOG)[0]
    assert call_layout(call) == "nchw"  # x 1x3x224x224, strides [150528,50176,224,1]
    nhwc = tuple((p, "[150528,1,672,3]" if p.endswith("xDesc.strideA") else v) for p, v in call.detail)
    assert call_layout(replace(call, detail=nhwc)) == "nhwc"
    odd = tuple((p, "[150528,1,1,3]" if p.endswith("xDesc.strideA") else v) for p, v in call.detail)
    assert call_layout(replace(call, detail=odd)) == ""
