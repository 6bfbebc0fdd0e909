"""One end-to-end check per dtype: the generator's real output for a zoo model → its variants →
results in the shape the cuDNN runtime prints, stored as the runner stores them → `benanza
analyze --dtype DT` → the bounds and the heuristic-vs-ideal view equal an independent SQL query
over the results table and a longest-path DP over the ONNX file's own edges.

No GPU here, so the latencies are made up (a hash of the benchmark name), but every object on the
way is the pipeline's own: the generator's variants, runner.parse_result, PerfDB.insert_measurements.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterable
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

from benanza import runner
from benanza.backends.cudnn import CONV_ALGOS
from benanza.cli import main
from benanza.generator import read_variants
from benanza.perfdb import PerfDB
from benanza.records import System, Variant

pytestmark = pytest.mark.slow  # generates and stores the variants of whole reference models

SYSTEM = System("h100", "cudnn", "fabricated latencies", (("cudnn", "9.0"),))
DTYPES = ("f32", "f16", "bf16")


def _unit(text: str) -> float:
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF


def runtime_line(v: Variant) -> dict:
    """A BENANZA_RESULT record as runtime_cpp prints it for this variant."""
    if v.algo in ("FFT", "FFT_TILING") and v.dtype == "bf16":
        return {"name": v.name, "status": "unsupported", "message": "CUDNN_STATUS_NOT_SUPPORTED"}
    ms = 0.01 + _unit(v.name)
    line = {"name": v.name, "status": "ok", "median_ms": ms, "mean_ms": ms * 1.01, "stddev_ms": ms * 0.01,
            "min_ms": ms * 0.99, "iterations": 100, "repetitions": 3, "implementation": v.algo,
            "counters": {"flops": 1.0, "workspace_bytes": 0}}
    if v.api == "cudnnConvolutionForward":
        # one choice per problem/dtype/layout/math, as conv.cpp caches it
        config = v.name.replace(f"/algo={v.algo}/", "/")
        line["counters"] |= {"algo": CONV_ALGOS.index(v.algo),
                             "heuristic_algo": int(_unit("h" + config) * len(CONV_ALGOS)),
                             "find_algo": int(_unit("f" + config) * len(CONV_ALGOS)), "find_ms": ms}
    return line


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, zoo_model):
    d = tmp_path_factory.mktemp("bounds")
    model = zoo_model("inception-v1")
    r = CliRunner().invoke(main, ["generate", str(model), "--out", str(d / "bench"), "--backend", "cudnn",
                                  *[a for dt in DTYPES for a in ("--dtype", dt)]])
    assert r.exit_code == 0, r.output
    variants = read_variants(d / "bench" / "cudnn")
    assert {v.dtype for v in variants} == set(DTYPES)
    with PerfDB(d / "perf.db") as db:
        db.insert_measurements(SYSTEM, [(runner.parse_result(v, SYSTEM.name, line), line)
                                        for v in variants for line in [runtime_line(v)]], command="test")
    return d, model


def analyze_json(d: Path, model: Path, dtype: str) -> dict:
    r = CliRunner().invoke(main, ["analyze", str(model), "--system", SYSTEM.name, "--db", str(d / "perf.db"),
                                  "--dtype", dtype, "--json"])
    assert r.exit_code == 0, r.output
    (a,) = json.loads(r.output)["analyses"]
    return a


# --- the independent oracle ---------------------------------------------------------------------

# `analyze --json` prints milliseconds to 6 decimals: equal up to that rounding, half a unit of the
# 6th decimal, plus the binary float's own error (round(0.0581055, 6) is 0.058105, 5.0000000004e-7 off)
JSON_MS = {"rel": 1e-6, "abs": 5.001e-7}


def best_by_key(db: Path, system: str, dtype: str, exclude: Iterable[str] = ()) -> dict[str, float]:
    """Per stored layer key: the fastest OK unfused result (latest measurement per variant), by
    the samples' low percentile where the runtime timed each call, else the median; ``exclude``:
    variant names kept out (results an analysis flagged impossible against the machine's peaks)."""
    out = set(exclude)
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT r.layer_key, r.variant, coalesce(r.low_ms, r.median_ms) FROM results r "
            "JOIN variants v ON v.name = r.variant "
            "WHERE r.system = ? AND r.dtype = ? AND r.status = 'ok' AND v.fusion = 'none' "
            "AND r.id IN (SELECT max(id) FROM results GROUP BY system, variant)", (system, dtype)).fetchall()
    best: dict[str, float] = {}
    for key, variant, ms in rows:
        if variant not in out:
            best[key] = min(ms, best.get(key, ms))
    return best


def node_keys(bench: Path, model: str, dtype: str) -> dict[str, str]:
    """ONNX node name → its layer key in ``dtype``, from the manifest the generator wrote (the key
    format documents that float layers end in their dtype)."""
    out = {}
    for layer in json.loads((bench / "layers.json").read_text())["layers"]:
        key = layer["key"]
        stem, _, own = key.rpartition("_")
        for occ in layer["occurrences"]:
            if occ["model"] == model:
                out[occ["node"]] = f"{stem}_{dtype}" if own in DTYPES else key
    return out


def longest_path(onnx_path: Path, weight: dict[str, float]) -> float:
    """Heaviest path through the ONNX graph's data edges, node-weighted, by dynamic programming."""
    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    constants = {t.name for t in graph.initializer}
    producer: dict[str, str] = {}
    dist: dict[str, float] = {}
    for node in graph.node:  # the zoo writes nodes in topological order
        preds = [producer[t] for t in node.input if t and t not in constants and t in producer]
        dist[node.name] = weight.get(node.name, 0.0) + max((dist[p] for p in preds), default=0.0)
        for t in node.output:
            producer[t] = node.name
    return max(dist.values())


def floored(a: dict, critical_path: float) -> float:
    """The parallel bound an analysis prints for a DAG of this critical path: raised to its
    resource floors (docs/speed-of-light.md), whose own figures tests/analysis/test_floors.py checks."""
    assert a["floors"]["critical_path_ms"] == pytest.approx(critical_path, **JSON_MS)
    return max([critical_path, *(f["ms"] for f in a["floors"]["floors"])])


@pytest.mark.parametrize("dtype", DTYPES)
def test_bound_equals_the_database_per_dtype(pipeline, dtype):
    d, model = pipeline
    a = analyze_json(d, model, dtype)
    best = best_by_key(d / "perf.db", SYSTEM.name, dtype)
    keys = node_keys(d / "bench", model.stem, dtype)
    weight = {name: best.get(key, 0.0) for name, key in keys.items()}
    assert {la["name"]: la["key"] for la in a["layers"]} == keys  # the analysed dtype's keys
    assert not a["coverage"]["missing"] and not a["bounds"]["partial"]
    assert a["bounds"]["sequential_ms"] > 1.0  # every conv measured: never a bound of 0
    assert a["bounds"]["sequential_ms"] == pytest.approx(sum(weight.values()), **JSON_MS)
    assert a["bounds"]["parallel_ms"] == pytest.approx(floored(a, longest_path(model, weight)), **JSON_MS)
    for la in a["layers"]:
        assert (la["status"] == "ok") == (keys[la["name"]] in best), la
        if la["status"] == "ok":
            assert la["variant"].startswith(keys[la["name"]] + "/") and f"/dtype={dtype}/" in la["variant"]
    statuses = {la["op"]: la["status"] for la in a["layers"]}
    # Concat is cuDNN copies of its inputs into the output: measured like any other layer
    assert statuses["Dropout"] == "identity" and statuses["Concat"] == "ok"
    if dtype != "f32":  # Q6 and the joint what-if see the reduced-precision results
        assert dtype in a["tensor_cores"]["bounds"] and a["joint"] is not None


@pytest.mark.parametrize("dtype", DTYPES)
def test_heuristic_vs_ideal_equals_the_database(pipeline, dtype):
    d, model = pipeline
    h = analyze_json(d, model, dtype)["heuristic"]
    keys = node_keys(d / "bench", model.stem, dtype)
    convs = [n.name for n in onnx.load(str(model), load_external_data=False).graph.node if n.op_type == "Conv"]
    assert len(h["layers"]) == len(convs)
    heuristic = ideal = 0.0
    with sqlite3.connect(d / "perf.db") as conn:
        for name in convs:
            ms, layout, math, metrics = conn.execute(
                # cuDNN's legacy algorithms, the calls whose heuristic pick is stored (the figure's
                # question; the graph API's plans and the 1x1 GEMM rows have none)
                "SELECT r.median_ms, v.layout, v.math, r.metrics FROM results r JOIN variants v ON v.name = r.variant "
                "WHERE r.layer_key = ? AND r.status = 'ok' AND v.fusion = 'none' AND r.dtype = ? "
                "AND v.api = 'cudnnConvolutionForward' "
                "ORDER BY r.median_ms, r.variant LIMIT 1", (keys[name], dtype)).fetchone()
            algo = CONV_ALGOS[json.loads(metrics)["heuristic_algo"]]
            row = conn.execute(
                "SELECT r.median_ms FROM results r JOIN variants v ON v.name = r.variant WHERE r.layer_key = ? "
                "AND v.layout = ? AND v.math = ? AND v.algo = ? AND v.fusion = 'none' AND r.status = 'ok'",
                (keys[name], layout, math, algo)).fetchone()
            heuristic += row[0] if row else ms
            ideal += ms
    assert h["ideal_ms"] == pytest.approx(ideal, rel=1e-5)
    assert h["heuristic_ms"] == pytest.approx(heuristic, rel=1e-5)
    assert h["heuristic_ms"] >= h["ideal_ms"] and h["suboptimal"] > 0


def test_fill_command_asks_for_the_dtype_and_the_input_shapes(tmp_path, save):
    from helpers import io, model, tensor
    from onnx import helper

    m = model([helper.make_node("Conv", ["x", "W"], ["y"], pads=[1, 1, 1, 1])], [io("x", ["N", 3, "H", "W"])],
              [io("y", None)], [tensor("W", (4, 3, 3, 3))])
    path = save(m, "dyn.onnx")
    with PerfDB(tmp_path / "p.db") as db:  # the system exists, with nothing for this model
        line = {"name": "x", "status": "ok", "median_ms": 1.0}
        other = Variant.of_key("eltwise:relu_in1x8_f32", "cudnn", "cudnnActivationForward")
        db.insert_measurements(SYSTEM, [(runner.parse_result(other, SYSTEM.name, line), line)])
    r = CliRunner().invoke(main, ["analyze", str(path), "--system", SYSTEM.name, "--db", str(tmp_path / "p.db"),
                                  "--dtype", "f16", "--input-shape", "x=1x3x8x8", "--json"])
    assert r.exit_code == 0, r.output
    (a,) = json.loads(r.output)["analyses"]
    (fill,) = [w for w in a["warnings"] if w.startswith("to fill")]
    assert "--input-shape x=1x3x8x8" in fill and "--dtype f16" in fill and "--backend cudnn" in fill
    assert a["layers"][0]["key"].endswith("_f16") and a["coverage"]["missing"] == [0]


def test_a_dtype_the_backend_cannot_run_is_said_not_suggested(tmp_path, save):
    from helpers import conv_net

    cpu = System("cpu", "onednn", "test CPU", (("onednn", "3.2"),))
    with PerfDB(tmp_path / "p.db") as db:
        line = {"name": "x", "status": "ok", "median_ms": 1.0}
        other = Variant.of_key("eltwise:relu_in1x8_f32", "onednn", "eltwise")
        db.insert_measurements(cpu, [(runner.parse_result(other, cpu.name, line), line)])
    r = CliRunner().invoke(main, ["analyze", str(save(conv_net())), "--system", "cpu", "--db", str(tmp_path / "p.db"),
                                  "--dtype", "f16", "--json"])
    (a,) = json.loads(r.output)["analyses"]
    assert any("benchmarks f32, bf16, not f16" in w for w in a["warnings"])
    assert not any(w.startswith("to fill") for w in a["warnings"])
