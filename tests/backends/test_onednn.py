"""oneDNN backend: variant expansion, generated tables, and a real build + run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import generate_bench
from onnx import TensorProto, helper, numpy_helper

from benanza.backends.onednn import BACKEND, CONV_ALGOS, DTYPES, SPATIAL_LAYOUTS
from benanza.generator import GenOptions, expand_variants, generate
from benanza.layers import unique_layers
from benanza.machine_speed import MachineSpeed
from benanza.manifest import build_manifest, write_manifest
from benanza.processor import load_model
from benanza.records import Variant

HAVE_TOOLCHAIN = bool(shutil.which("cmake")) and Path("/usr/include/dnnl.hpp").exists() or bool(
    list(Path("/usr").glob("lib/*/cmake/dnnl")))


def _init(name: str, shape: tuple[int, ...]):
    return numpy_helper.from_array(np.random.RandomState(0).rand(*shape).astype(np.float32), name)


def small_cnn(path: Path, c: int = 8, hw: int = 16) -> Path:
    """Conv+Bias+Relu, Conv+BN+Relu, residual Add, LRN, pools, Concat, Gemm, Softmax."""
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        n("Relu", ["c1"], ["r1"]),
        n("Conv", ["r1", "w2"], ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        n("BatchNormalization", ["c2", "s", "bb", "m", "v"], ["n2"]),
        n("Relu", ["n2"], ["r2"]),
        n("Add", ["r2", "r1"], ["a"]),
        n("LRN", ["a"], ["l"], size=5),
        n("MaxPool", ["l"], ["p1"], kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1]),
        n("AveragePool", ["l"], ["p2"], kernel_shape=[2, 2], strides=[2, 2]),
        n("Concat", ["p1", "p2"], ["cat"], axis=1),
        n("Sigmoid", ["cat"], ["sg"]),
        n("GlobalAveragePool", ["sg"], ["g"]),
        n("Flatten", ["g"], ["f"]),
        n("Gemm", ["f", "wf", "bf"], ["y0"], transB=1),
        n("MatMul", ["y0", "wm"], ["y1"]),
        n("Softmax", ["y1"], ["y"], axis=1),
    ]
    inits = [_init("w1", (c, 3, 3, 3)), _init("b1", (c,)), _init("w2", (c, c, 3, 3)), _init("s", (c,)),
             _init("bb", (c,)), _init("m", (c,)), _init("v", (c,)), _init("wf", (10, 2 * c)),
             _init("bf", (10,)), _init("wm", (10, 6))]
    for i, node in enumerate(nodes):
        node.name = f"{node.op_type.lower()}{i}"
    graph = helper.make_graph(nodes, "small_cnn",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, hw, hw])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    path = small_cnn(tmp_path_factory.mktemp("models") / "small.onnx")
    models = [load_model(path, batch_size=1)]
    return build_manifest(models, unique_layers(models))


def test_full_expansion_counts(manifest):
    variants = expand_variants(manifest, BACKEND, GenOptions())
    by_family: dict[str, list[Variant]] = {}
    for v in variants:
        by_family.setdefault(v.layer_key.split(":")[0], []).append(v)
    fusions = {f.layer: f.pattern for f in manifest.fusions}
    assert sorted(fusions.values()) == ["bias_relu", "bn_relu"]
    per_conv = len(CONV_ALGOS) * len(DTYPES) * len(SPATIAL_LAYOUTS)
    assert len(by_family["conv"]) == 2 * per_conv * 2  # two convs, each unfused + its fused pattern
    assert {v.fusion for v in by_family["conv"]} == {"none", "bias_relu", "bn_relu"}
    assert len(by_family["pool"]) == 3 * len(DTYPES) * len(SPATIAL_LAYOUTS)  # max, avg, global avg
    assert len(by_family["lrn"]) == len(DTYPES) * len(SPATIAL_LAYOUTS)
    assert len(by_family["concat"]) == len(DTYPES) * len(SPATIAL_LAYOUTS)  # 4-d inputs
    layers = {}
    for u in manifest.layers:
        layers[u.layer.family] = layers.get(u.layer.family, 0) + 1
    assert layers["eltwise"] == 2  # relu, sigmoid
    for fam in ("eltwise", "binary", "gemm", "matmul", "softmax"):
        assert {v.layout for v in by_family[fam]} == {"plain"}
        assert len(by_family[fam]) == layers[fam] * len(DTYPES)
    assert "flatten" not in by_family  # no oneDNN primitive: not covered, not faked
    assert {v.api for v in by_family["gemm"]} == {"inner_product"}
    restricted = expand_variants(manifest, BACKEND, GenOptions(dtypes=("f32", "f16"), layouts=("any",),
                                                               fusion=False))
    assert {v.dtype for v in restricted} == {"f32"} and {v.fusion for v in restricted} == {"none"}
    assert sum(v.layer_key.startswith("conv:") for v in restricted) == 2 * len(CONV_ALGOS)


def test_generated_tables_name_every_variant(manifest, tmp_path):
    gen = generate(manifest, "onednn", tmp_path, GenOptions())
    source = (tmp_path / "onednn" / "benchmarks.cpp").read_text()
    for v in gen.variants:
        assert f'"{v.name}"' in source
    assert "bo::ConvAlgo::winograd" in source and "bo::DType::bf16" in source
    data = json.loads((tmp_path / "onednn" / "variants.json").read_text())
    assert [d["name"] for d in data["variants"]] == [v.name for v in gen.variants]
    assert (tmp_path / "onednn" / "runtime" / "common" / "benanza" / "runtime.cpp").is_file()
    again = generate(manifest, "onednn", tmp_path, GenOptions())
    assert (tmp_path / "onednn" / "benchmarks.cpp").read_text() == source  # deterministic
    assert len(again.variants) == len(gen.variants)


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_TOOLCHAIN, reason="needs cmake, libdnnl-dev and libbenchmark-dev")
def test_build_and_run_every_variant_reports_a_status(manifest, tmp_path):
    from benanza.runner import RunOptions, run

    write_manifest(manifest, tmp_path)
    generate(manifest, "onednn", tmp_path, GenOptions())
    db = tmp_path / "r.db"
    summary = run(tmp_path, "ci", "onednn", db, RunOptions(min_time=0.01, repetitions=1))
    assert summary.stored == summary.total and summary.failed == 0
    from benanza.perfdb import PerfDB

    with PerfDB(db) as pdb:
        results = pdb.results("ci")
    assert len(results) == summary.total
    for r in results:
        assert (r.ok and r.median_ms > 0 and r.implementation) or (not r.ok and r.message), r
    # the machine's speed, read by the runner before each start of the binary
    assert all(MachineSpeed.from_metrics(r.metrics) is not None for r in results if r.ok)
    ok_keys = {r.variant.layer_key for r in results if r.ok and r.variant.dtype == "f32"}
    assert ok_keys == {u.layer.key for u in manifest.layers if BACKEND.variants(u, (), GenOptions())}
    winograd_nchw = [r for r in results if r.variant.algo == "winograd" and r.variant.layout == "nchw"]
    # oneDNN 2.x takes winograd only with format any; where it refuses, oneDNN's text is kept
    assert all(r.ok or "oneDNN" in r.message for r in winograd_nchw)
    from benanza.system import cpu_has_bf16

    bf16 = [r for r in results if r.variant.dtype == "bf16" and r.variant.layer_key.startswith("conv:")]
    if not cpu_has_bf16():
        assert all(r.status.value == "unsupported" and "bf16" in r.message for r in bf16)
    # the analyzer's bounds from these real measurements, per dtype this CPU runs, against SQL + a DP
    from click.testing import CliRunner

    from benanza.cli import main
    from tests.analysis.test_bounds_e2e import JSON_MS, best_by_key, floored, longest_path, node_keys

    model = Path(manifest.models[0].path)
    for dtype in ("f32", "bf16") if cpu_has_bf16() else ("f32",):
        r = CliRunner().invoke(main, ["analyze", str(model), "--system", "ci", "--db", str(db), "--dtype", dtype,
                                      "--json"])
        assert r.exit_code == 0, r.output
        (a,) = json.loads(r.output)["analyses"]
        keys = node_keys(tmp_path, model.stem, dtype)
        best = best_by_key(db, "ci", dtype)
        weight = {name: best.get(key, 0.0) for name, key in keys.items()}
        assert not a["bounds"]["partial"] and a["bounds"]["sequential_ms"] > 0
        assert a["bounds"]["sequential_ms"] == pytest.approx(sum(weight.values()), **JSON_MS)
        assert a["bounds"]["parallel_ms"] == pytest.approx(floored(a, longest_path(model, weight)), **JSON_MS)


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_TOOLCHAIN, reason="needs cmake, libdnnl-dev and libbenchmark-dev")
def test_reference_models_lenet_resnet50_all_layers_measured(tmp_path):
    """CI's real model set: every oneDNN-covered layer of LeNet and ResNet50-v1 gets a latency
    or an explicit status (f32, layout any, unfused, to stay within CI time)."""
    from benanza.perfdb import PerfDB
    from benanza.runner import RunOptions, run
    from benanza.zoo import build_all

    paths = build_all(tmp_path / "models", names=["lenet", "resnet50-v1"])
    models = [load_model(p, batch_size=1) for p in paths]
    manifest, gen = generate_bench(models, "onednn", tmp_path / "bench",
                                   GenOptions(dtypes=("f32",), layouts=("any",), fusion=False))
    summary = run(tmp_path / "bench", "ci", "onednn", tmp_path / "r.db", RunOptions(min_time=0.01, repetitions=1))
    assert summary.stored == len(gen.variants) and summary.failed == 0
    with PerfDB(tmp_path / "r.db") as pdb:
        results = pdb.results("ci")
    assert all((r.ok and r.median_ms > 0) or (r.status.value != "ok" and r.message) for r in results)
    measured = {r.variant.layer_key for r in results if r.ok}
    covered = {u.layer.key for u in manifest.layers if BACKEND.variants(u, (), GenOptions(dtypes=("f32",)))}
    assert covered and measured == covered
    assert sum(k.startswith("conv:") for k in measured) >= 20  # ResNet-50's distinct convolutions
