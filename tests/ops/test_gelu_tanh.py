"""The tanh GELU decomposition (``gelu_tanh`` pattern) as one tanh-approximation GELU, and ONNX
IsNaN (the masked softmax's NaN guard) as one oneDNN call: recognised in real exporter output
(transformers' Phi, ``nn.GELU(approximate="tanh")``, both exporters), their keys, work and
lowerings by hand, and generate → run → database → ``check`` against ONNX Runtime on oneDNN."""

from __future__ import annotations

import math
import subprocess

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from helpers import generate_bench, io, model
from onnx import helper, numpy_helper
from torch_models import D_MODEL, SEQ, export

from benanza.backends import cudnn, onednn
from benanza.fusion import BY_NAME, match_fusions
from benanza.ops.eltwise import EltwiseProblem
from benanza.ops.registry import PATTERN_LOWERINGS, parse_layer_key
from benanza.processor import load_model
from tests.backends.test_cudnn import NEED_TOOLCHAIN, _build, _lines

ROWS, COLS = 4, 64
K0, K1 = 0.044715, math.sqrt(2 / math.pi)


def _decomposition(cube: str, tail: str) -> list:
    """½·x·(1 + tanh(√(2/π)(x + 0.044715x³))) with x³ and the last products in the given form."""
    n = helper.make_node
    cubed = {"pow": [n("Pow", ["x", "three"], ["x3"])],
             "mul": [n("Mul", ["x", "x"], ["x2"]), n("Mul", ["x", "x2"], ["x3"])]}[cube]
    body = [n("Mul", ["x3", "k0"], ["kx3"]), n("Add", ["x", "kx3"], ["inner"]), n("Mul", ["inner", "k1"], ["arg"]),
            n("Tanh", ["arg"], ["t"]), n("Add", ["t", "one"], ["t1"])]
    last = {"x_then_half": [n("Mul", ["x", "t1"], ["xt"]), n("Mul", ["xt", "half"], ["y"])],
            "half_then_x": [n("Mul", ["t1", "half"], ["ht"]), n("Mul", ["x", "ht"], ["y"])],
            "half_x_apart": [n("Mul", ["x", "half"], ["hx"]), n("Mul", ["hx", "t1"], ["y"])]}[tail]
    return cubed + body + last


def _inits() -> list:
    return [numpy_helper.from_array(np.array(v, np.float32), name)
            for name, v in (("three", 3.0), ("k0", K0), ("k1", K1), ("one", 1.0), ("half", 0.5))]


def _values(path_or_model, feed: dict) -> dict:
    """Every node output of the model, run by ONNX Runtime with its graph optimizations off."""
    m = onnx.load(str(path_or_model)) if not isinstance(path_or_model, onnx.ModelProto) else path_or_model
    have = {o.name for o in m.graph.output}
    m.graph.output.extend(onnx.ValueInfoProto(name=t) for nd in m.graph.node for t in nd.output if t and t not in have)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feed), strict=True)) | feed


@pytest.mark.parametrize("cube", ["pow", "mul"])
@pytest.mark.parametrize("tail", ["x_then_half", "half_then_x", "half_x_apart"])
def test_every_form_is_one_gelu_tanh_with_its_key_and_work(cube, tail) -> None:
    m = load_model(model(_decomposition(cube, tail), [io("x", [ROWS, COLS])], [io("y", None)], _inits(), opset=17),
                   name=f"{cube}_{tail}")
    (match,) = match_fusions(m)
    assert match.pattern is BY_NAME["gelu_tanh"] and sorted(match.nodes) == list(range(len(m.nodes)))
    ops = [m.nodes[i].layer.op for i in match.nodes]
    assert ops[0] == "Tanh" and ops[1] == ("Pow" if cube == "pow" else "Mul")  # the anchor, then x's reader
    assert m.nodes[match.nodes[1]].inputs[0] == "x" and m.nodes[match.nodes[-1]].outputs == ("y",)
    # the fused benchmark is keyed by its Tanh's problem: one function of x per element
    assert match.conv_key == f"eltwise:tanh_in{ROWS}x{COLS}_f32"
    assert parse_layer_key(match.conv_key) == (EltwiseProblem("tanh", (ROWS, COLS)), "f32")
    assert match.conv.problem.flops() == ROWS * COLS
    lowering = PATTERN_LOWERINGS["gelu_tanh"]
    assert lowering.onednn is not None and lowering.cudnn is not None
    table, row = lowering.onednn
    params = row(match.conv.problem, "eltwise")
    assert table == "eltwise" and (params.alg, params.shape) == ("gelutanh", (ROWS, COLS))
    point = lowering.cudnn.row(match.conv.problem, "cudnn_frontend.pointwise")
    assert str(point.op) == "PointwiseOp::GeluTanh" and not point.binary and point.out[:4] == (1, 1, ROWS, COLS)
    # the decomposition is what torch's tanh GELU computes (ONNX Runtime runs the nodes)
    x = np.random.default_rng(1).standard_normal((ROWS, COLS)).astype(np.float32) * 3
    m_proto = model(_decomposition(cube, tail), [io("x", [ROWS, COLS])], [io("y", None)], _inits(), opset=17)
    want = torch.nn.functional.gelu(torch.from_numpy(x), approximate="tanh").numpy()
    np.testing.assert_allclose(_values(m_proto, {"x": x})["y"], want, rtol=1e-5, atol=1e-6)


def test_the_pattern_needs_every_piece() -> None:
    nodes = _decomposition("pow", "x_then_half")
    nodes[-2] = helper.make_node("Mul", ["t1", "t1"], ["xt"])  # (1 + tanh)², not x·(1 + tanh)
    m = load_model(model(nodes, [io("x", [ROWS, COLS])], [io("y", None)], _inits(), opset=17), name="sq")
    assert not match_fusions(m)
    nodes = _decomposition("pow", "x_then_half")
    nodes[0] = helper.make_node("Pow", ["x", "two"], ["x3"])  # x², not x³
    inits = _inits() + [numpy_helper.from_array(np.array(2.0, np.float32), "two")]
    m = load_model(model(nodes, [io("x", [ROWS, COLS])], [io("y", None)], inits, opset=17), name="x2")
    assert not match_fusions(m)


def test_opset20_gelu_tanh_and_isnan_are_single_ops() -> None:
    n = helper.make_node
    ops = [n("Gelu", ["x"], ["g"], approximate="tanh", name="gelu"), n("IsNaN", ["g"], ["nan"], name="isnan")]
    layers = {nd.name: nd.layer for nd in load_model(model(ops, [io("x", [ROWS, COLS])], [io("nan", None)],
                                                           opset=20), name="ops").nodes}
    gelu, isnan = layers["gelu"], layers["isnan"]
    assert gelu.key == f"eltwise:gelutanh_in{ROWS}x{COLS}_f32" and isnan.key == f"eltwise:isnan_in{ROWS}x{COLS}_f32"
    for layer in (gelu, isnan):
        assert parse_layer_key(layer.key) == (layer.problem, "f32") and layer.problem.flops() == ROWS * COLS
        assert layer.onednn_primitive == "eltwise" and onednn.covers(layer)
    # cuDNN has no isnan pointwise mode: IsNaN is a CMP_NEQ node of x with itself, written as
    # one-byte booleans (graph.cpp), in the pointwise table as GELU
    assert gelu.cudnn_api == isnan.cudnn_api == "cudnn_frontend.pointwise"
    row = cudnn.lowering(isnan).row(isnan.problem, isnan.cudnn_api)
    assert (row.op, row.binary, row.out[:4]) == ("PointwiseOp::IsNan", False, (1, 1, ROWS, COLS))


@pytest.mark.slow  # exports torch models
@pytest.mark.parametrize(("exporter", "opset"), [("torchscript", 17), ("dynamo", 18)])
def test_found_in_nn_gelu_tanh_exports(tmp_path, exporter, opset) -> None:
    """``nn.GELU(approximate="tanh")`` from both exporters (TorchScript writes x·x·x, dynamo
    Pow(x, 3)): one gelu_tanh match, whose last node is torch's tanh GELU of x."""
    path = export("gelu-tanh", opset, tmp_path, exporter=exporter)
    m = load_model(path)
    (gelu,) = [f for f in match_fusions(m) if f.pattern.name == "gelu_tanh"]
    assert m.nodes[gelu.nodes[1]].layer.op == ("Mul" if exporter == "torchscript" else "Pow")
    assert gelu.conv_key == f"eltwise:tanh_in1x{SEQ}x{4 * D_MODEL}_f32"
    x = np.random.default_rng(2).standard_normal((1, SEQ, D_MODEL)).astype(np.float32)
    v = _values(path, {"x": x})
    xs = v[m.nodes[gelu.nodes[1]].inputs[0]]
    want = torch.nn.functional.gelu(torch.from_numpy(xs), approximate="tanh").numpy()
    np.testing.assert_allclose(v[m.nodes[gelu.nodes[-1]].outputs[0]], want, rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # exports transformers' Phi with both exporters
def test_found_in_phi_exports(tmp_path) -> None:
    """transformers' Phi MLP (``gelu_new``: ``0.5 * x * (1 + tanh(…pow(x, 3)…))``, ½·x computed
    apart) from both exporters: one match per layer; every Tanh of the model is one."""
    import hf_models

    step = hf_models.Step("phi", 8, 0)
    layers = hf_models.config("phi").num_hidden_layers
    for exporter in hf_models.EXPORTERS:
        m = load_model(hf_models.export(step, exporter, tmp_path))
        matches = [f for f in match_fusions(m) if f.pattern.name == "gelu_tanh"]
        tanhs = [nd.index for nd in m.nodes if nd.layer.op == "Tanh"]
        assert len(matches) == layers and sorted(f.nodes[0] for f in matches) == tanhs
        width = hf_models.config("phi").intermediate_size
        assert {f.conv_key for f in matches} == {f"eltwise:tanh_in1x8x{width}_f32"}


@pytest.mark.slow  # builds and runs a oneDNN project
def test_generate_run_check_on_onednn(tmp_path) -> None:
    """The fused variant and IsNaN through the real pipeline: generated, built, run into the
    database (every result OK), substituted by Q5 for the pattern's 8 or 9 layers, and computing
    what ONNX Runtime computes of the model's own nodes (``benanza check``)."""
    from benanza.analyzer import analyze
    from benanza.check import CheckOptions, CheckStatus, check
    from benanza.generator import GenOptions
    from benanza.perfdb import PerfDB
    from benanza.runner import RunOptions, run

    isnan = tmp_path / "isnan.onnx"
    onnx.save(model([helper.make_node("IsNaN", ["x"], ["y"], name="isnan")], [io("x", [1, SEQ, D_MODEL])],
                    [io("y", None)]), isnan)
    paths = [export("gelu-tanh", 17, tmp_path), export("gelu-tanh", 18, tmp_path, exporter="dynamo"), isnan]
    models = [load_model(p) for p in paths]
    out = tmp_path / "bench"
    _, gen = generate_bench(models, "onednn", out, GenOptions(dtypes=("f32",)))
    fused = [v for v in gen.variants if v.fusion == "gelu_tanh"]
    assert {v.layer_key for v in fused} == {f"eltwise:tanh_in1x{SEQ}x{4 * D_MODEL}_f32"}
    summary = run(out, "ci", "onednn", tmp_path / "r.db", RunOptions(min_time=0.01, repetitions=1, build_jobs=1))
    assert summary.failed == 0, summary.failures
    with PerfDB(tmp_path / "r.db") as pdb:
        results = pdb.results("ci")
    assert all(r.ok for r in results), [(r.variant.name, r.message) for r in results if not r.ok]
    assert any(r.variant.fusion == "gelu_tanh" for r in results)
    assert any(r.variant.layer_key.startswith("eltwise:isnan_") for r in results)
    for m in models[:2]:
        a = analyze(m, results, "ci", "onednn")
        uses = [u for u in a.fusion.applied + a.fusion.unprofitable if u.pattern == "gelu_tanh"]
        assert len(uses) == 1 and len(uses[0].nodes) in (8, 9)
        assert uses[0].fused_ms == pytest.approx(min(r.latency_ms for r in results if r.variant.fusion == "gelu_tanh"))
    checked = check(out, models, CheckOptions(build_jobs=1))
    by_name = {r.name: r for r in checked}
    for v in gen.variants:
        if v.fusion == "gelu_tanh" or v.layer_key.startswith("eltwise:isnan_"):
            r = by_name[v.name]
            assert r.status is CheckStatus.OK, (v.name, r.status, r.compared, r.where)


@pytest.mark.slow  # builds a cuDNN project
@NEED_TOOLCHAIN
def test_cudnn_fused_form_is_one_gelu_tanh_node_that_validates(tmp_path, cudnn_runtime) -> None:
    """On cuDNN the Tanh gets the pattern's fused variants (one per plan slot and dtype): one
    GELU_APPROX_TANH_FWD pointwise node, built and accepted by the cuDNN frontend's own validation
    for an sm_90 GPU (no GPU needed)."""
    from benanza.generator import GenOptions, generate
    from benanza.layers import unique_layers
    from benanza.manifest import build_manifest

    path = tmp_path / "gelu_tanh.onnx"
    onnx.save(model(_decomposition("pow", "half_x_apart"), [io("x", [1, ROWS, COLS])], [io("y", None)], _inits(),
                    opset=17), path)
    models = [load_model(path)]
    g = generate(build_manifest(models, unique_layers(models)), "cudnn", tmp_path, GenOptions(dtypes=("f32", "f16")))
    fused = [v for v in g.variants if v.fusion == "gelu_tanh"]
    assert {(v.layer_key, v.api) for v in fused} == {(f"eltwise:tanh_in1x{ROWS}x{COLS}_{d}", "cudnn_frontend.pointwise")
                                                     for d in ("f32", "f16")}
    assert sorted(v.algo for v in fused) == sorted(cudnn.PLAN_ALGOS * 2)
    binary = _build(g.out_dir, runtime=cudnn_runtime)
    done = subprocess.run([str(binary), "--benanza_check_graphs=90"], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [ln for ln in _lines(done.stdout, "BENANZA_GRAPH") if "/fusion=gelu_tanh" in ln["name"]]
    assert len(lines) == 2 and all(ln["ok"] for ln in lines), lines
