"""RMS normalization in decoder exports: the single ops (opset 23's RMSNormalization, ONNX
Runtime's SimplifiedLayerNormalization) and the decomposition's forms, recognised and lowered as
one RMS normalization; its FLOPs against an operation count of the decomposition's ONNX nodes."""

from __future__ import annotations

import subprocess

import numpy as np
import onnx
import pytest
from helpers import io, model
from onnx import helper, numpy_helper

from benanza.backends import onednn
from benanza.fusion import BY_NAME, match_fusions
from benanza.generator import GenOptions, generate
from benanza.layers import unique_layers
from benanza.manifest import build_manifest
from benanza.ops.norm import RmsnormProblem
from benanza.ops.registry import PATTERN_LOWERINGS, parse_layer_key
from benanza.processor import load_model
from tests.backends.test_cudnn import NEED_TOOLCHAIN, _build, _lines

ROWS, COLS = 3, 32


def _decomposition(form: str) -> list:
    """x → Pow(2) → ReduceMean → Add(ε) → Sqrt → the form's normalising step → Mul(scale)."""
    head = [helper.make_node("Pow", ["x", "two"], ["sq"]),
            helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1], keepdims=1),
            helper.make_node("Add", ["ms", "eps"], ["mse"]), helper.make_node("Sqrt", ["mse"], ["rms"])]
    times_x = helper.make_node("Mul", ["x", "inv"], ["n"])
    steps = {"reciprocal": [helper.make_node("Reciprocal", ["rms"], ["inv"]), times_x],
             "div_one": [helper.make_node("Div", ["one", "rms"], ["inv"]), times_x],
             "div_x": [helper.make_node("Div", ["x", "rms"], ["n"])]}[form]
    return head + steps + [helper.make_node("Mul", ["n", "w"], ["y"], name="scale")]


def _inits() -> list:
    return [numpy_helper.from_array(np.array(2.0, np.float32), "two"),
            numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
            numpy_helper.from_array(np.array(1.0, np.float32), "one"),
            numpy_helper.from_array(np.linspace(0.5, 1.5, COLS, dtype=np.float32), "w")]


@pytest.mark.parametrize("form", ["reciprocal", "div_one", "div_x"])
def test_rmsnorm_decomposition_is_one_rms_normalization(form) -> None:
    m = load_model(model(_decomposition(form), [io("x", [ROWS, COLS])], [io("y", None)], _inits(), opset=17),
                   name=form)
    (match,) = match_fusions(m)
    assert match.pattern is BY_NAME["rmsnorm"] and len(match.nodes) == len(m.nodes)
    assert m.nodes[match.nodes[0]].layer.op == "ReduceMean"  # the anchor, first
    lowering = PATTERN_LOWERINGS["rmsnorm"]
    assert lowering.onednn is not None and lowering.cudnn is not None
    table, row = lowering.onednn
    params = row(match.conv.problem, "layer_normalization")
    assert table == "lnorm" and params.rms and not params.bias and params.shape == (ROWS, COLS) and params.axis == 1
    cudnn_row = lowering.cudnn.row(match.conv.problem, "cudnn_frontend.rmsnorm")
    assert (cudnn_row.rows, cudnn_row.cols, cudnn_row.rms, cudnn_row.bias) == (ROWS, COLS, True, False)


def test_rmsnorm_pattern_needs_every_piece() -> None:
    nodes = _decomposition("reciprocal")
    nodes[-1] = helper.make_node("Mul", ["n", "x"], ["y"])  # times data, not a constant scale
    m = load_model(model(nodes, [io("x", [ROWS, COLS])], [io("y", None)], _inits(), opset=17), name="noscale")
    assert not match_fusions(m)


def test_rmsnorm_ops_and_their_work() -> None:
    w = numpy_helper.from_array(np.ones(COLS, np.float32), "w")
    ops = [helper.make_node("RMSNormalization", ["x", "w"], ["y"], epsilon=1e-6, name="onnx23")]
    (onnx23,) = load_model(model(ops, [io("x", [2, ROWS, COLS])], [io("y", None)], [w], opset=23), name="o").nodes
    simplified = helper.make_node("SimplifiedLayerNormalization", ["x", "w"], ["y"], domain="com.microsoft",
                                  epsilon=1e-6, axis=-1, name="ort")
    graph = helper.make_graph([simplified], "g", [io("x", [2, ROWS, COLS])], [io("y", None)], [w])
    ort_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                        helper.make_opsetid("com.microsoft", 1)])
    (ort,) = load_model(ort_model, name="ort").nodes
    for layer in (onnx23.layer, ort.layer):
        assert layer.key == f"rmsnorm:in2x{ROWS}x{COLS}_axis2_eps0.000001_f32"
        assert parse_layer_key(layer.key) == (layer.problem, "f32")
        assert layer.onednn_primitive == "layer_normalization" and layer.cudnn_api == "cudnn_frontend.rmsnorm"
        assert onednn.covers(layer)
    # the decomposition's own count, node by node (ONNX Runtime runs it): Pow, ReduceMean's sums and
    # its division, Add(ε), Sqrt, Reciprocal, Mul(x), Mul(scale); a kernel's rsqrt is √ and 1/x at once
    x = np.ones((2, ROWS, COLS), np.float32)
    sq = x ** 2
    ms = sq.mean(-1, keepdims=True)
    counted = sq.size + (sq.size + ms.size) + ms.size + ms.size + ms.size + x.size + x.size
    assert RmsnormProblem((2, ROWS, COLS), 2, 1e-6).flops() == counted - ms.size


@pytest.mark.slow  # builds a cuDNN project
@NEED_TOOLCHAIN
def test_cudnn_graphs_of_decoder_ops_validate(tmp_path, cudnn_runtime) -> None:
    """RMS normalization (the graph API's RMS norm node), Cos, Sin, Reciprocal (pointwise nodes)
    and IsNaN (a CMP_NEQ node reading one tensor as both operands) built, and accepted by the
    cuDNN frontend's own validation for an sm_90 GPU (no GPU needed)."""
    w = numpy_helper.from_array(np.ones(COLS, np.float32), "w")
    nodes = [helper.make_node("RMSNormalization", ["x", "w"], ["y"], epsilon=1e-6),
             helper.make_node("Cos", ["y"], ["c"]), helper.make_node("Sin", ["c"], ["s"]),
             helper.make_node("Reciprocal", ["s"], ["r"]), helper.make_node("IsNaN", ["r"], ["nan"])]
    path = tmp_path / "decoder_ops.onnx"
    onnx.save(model(nodes, [io("x", [1, ROWS, COLS])], [io("nan", None)], [w], opset=23), path)
    models = [load_model(path)]
    g = generate(build_manifest(models, unique_layers(models)), "cudnn", tmp_path, GenOptions(dtypes=("f32", "f16")))
    binary = _build(g.out_dir, runtime=cudnn_runtime)
    done = subprocess.run([str(binary), "--benanza_check_graphs=90"], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = {ln["name"].split("/")[0]: ln for ln in _lines(done.stdout, "BENANZA_GRAPH")}
    assert set(lines) == {f"{k}_{dt}" for k in (f"rmsnorm:in1x{ROWS}x{COLS}_axis2_eps0.000001",
                                                 f"eltwise:cos_in1x{ROWS}x{COLS}", f"eltwise:sin_in1x{ROWS}x{COLS}",
                                                 f"eltwise:reciprocal_in1x{ROWS}x{COLS}",
                                                 f"eltwise:isnan_in1x{ROWS}x{COLS}") for dt in ("f32", "f16")}
    assert all(ln["ok"] for ln in lines.values()), lines
    # one pointwise table row per layer, the isnan one with no B operand: the graph reads A twice
    tables = "".join(p.read_text() for p in g.out_dir.glob("tables_pointwise_*.cpp"))
    assert tables.count("PointwiseOp::IsNan") == 1
