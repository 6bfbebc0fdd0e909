"""benanza.torch_exec: the eager ONNX executor in PyTorch agrees with ONNX Runtime and names
its profiler ranges exactly as the processor names layers."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import helpers
from helpers import io, tensor

torch = pytest.importorskip("torch", reason="torch is not installed: the torch executor cannot run")

from benanza.errors import BenanzaError  # noqa: E402
from benanza.parsers.kineto import parse_kineto_trace  # noqa: E402
from benanza.processor import load_model  # noqa: E402
from benanza.torch_exec import load_torch_graph  # noqa: E402


def _compare(proto: onnx.ModelProto) -> None:
    batch = proto.graph.input[0].type.tensor_type.shape.dim[0].dim_value or 1
    graph = load_torch_graph(proto, batch)
    feed = graph.random_inputs()
    with torch.inference_mode():
        got = graph.run(feed, annotate=False)
    for_ort = onnx.ModelProto()
    for_ort.CopyFrom(proto)
    for_ort.ir_version = min(proto.ir_version, 8)  # onnx.helper writes an IR newer than ORT reads
    sess = ort.InferenceSession(for_ort.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {k: v.numpy() for k, v in feed.items()})
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        # float32 through different kernels: relative to the output's scale
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-3, atol=1e-5 * max(1.0, float(np.abs(w).max())))


ZOO = ("lenet", "squeezenet-v1.1", "inception-v1", "resnet18-v1", "mobilenet-v2", "bvlc-alexnet",
       "shufflenet", "tiny-yolo-v2", "emotion-ferplus", "inception-v2", "densenet-121", "arcface",
       "bvlc-googlenet", "resnet50-v2")


@pytest.mark.parametrize("name", ZOO)
def test_zoo_model_matches_onnxruntime(name):
    from benanza.zoo import MODELS

    (model,) = [m for m in MODELS if m.name == name]
    _compare(model.build())


def test_batch_size_reaches_the_inputs():
    graph = load_torch_graph(helpers.conv_net(), batch_size=3)
    (x,) = graph.random_inputs().values()
    with torch.inference_mode():
        (y,) = graph.run({"x": x})
    assert tuple(x.shape) == (3, 3, 8, 8) and tuple(y.shape) == (3, 10)


@pytest.mark.parametrize("weights_as", ["initializer", "constant", "constant_of_shape"])
def test_layer_names_and_order_are_the_processors(weights_as):
    proto = helpers.conv_net(weights_as)
    for n in proto.graph.node:
        if n.op_type == "Relu":
            n.name = ""  # unnamed: the processor's f"{op_type}_{index}"
    graph = load_torch_graph(proto)
    assert [n.name for n in graph.nodes] == [n.name for n in load_model(proto).nodes]
    assert "Relu_1" in [n.name for n in graph.nodes]
    assert not any(n.op in ("Constant", "ConstantOfShape") for n in graph.nodes)  # evaluated at load
    _compare(proto)


def test_unimplemented_op_is_an_error_naming_op_and_node():
    proto = helpers.model([helper.make_node("Einsum", ["x", "x"], ["y"], equation="ij,ij->i", name="ein")],
                          [io("x", [2, 3])], [io("y", [2])])
    with pytest.raises(BenanzaError, match=r"node 'ein': op Einsum is not implemented"):
        load_torch_graph(proto)


def _single(node: onnx.NodeProto, shape, inits=(), opset: int = 13, elem=onnx.TensorProto.FLOAT):
    return helpers.model([node], [io("x", shape, elem)], [io("y", None)], list(inits), opset=opset)


def _ints(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


EDGE_CASES = {
    "conv asymmetric pads, groups, dilation": _single(
        helper.make_node("Conv", ["x", "W"], ["y"], pads=[0, 1, 2, 1], group=2, dilations=[2, 1], name="c"),
        [1, 4, 9, 9], [tensor("W", (6, 2, 3, 3))]),
    "conv auto_pad SAME_UPPER stride 2": _single(
        helper.make_node("Conv", ["x", "W"], ["y"], auto_pad="SAME_UPPER", strides=[2, 2], name="c"),
        [1, 3, 8, 8], [tensor("W", (4, 3, 3, 3))]),
    "maxpool ceil_mode asymmetric pads": _single(
        helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1],
                         ceil_mode=1, name="p"), [1, 2, 10, 10]),
    "avgpool excluding asymmetric pads": _single(
        helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 0, 1],
                         name="p"), [1, 2, 9, 9]),
    "avgpool including pads, ceil_mode": _single(
        helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                         count_include_pad=1, ceil_mode=1, name="p"), [1, 2, 10, 10]),
    "gemm transA, alpha, beta": _single(
        helper.make_node("Gemm", ["x", "B", "C"], ["y"], transA=1, alpha=0.5, beta=2.0, name="g"),
        [5, 3], [tensor("B", (5, 4)), tensor("C", (4,))]),
    "softmax opset 11 coerces to 2-D": _single(
        helper.make_node("Softmax", ["x"], ["y"], axis=1, name="s"), [2, 3, 4], opset=11),
    "reshape 0 and -1": _single(helper.make_node("Reshape", ["x", "shape"], ["y"], name="r"), [2, 3, 4],
                                [_ints("shape", [0, -1])]),
    "unsqueeze attr axes opset 11": _single(helper.make_node("Unsqueeze", ["x"], ["y"], axes=[0, -1], name="u"),
                                            [2, 3], opset=11),
    "squeeze input axes": _single(helper.make_node("Squeeze", ["x", "axes"], ["y"], name="s"), [1, 3, 1],
                                  [_ints("axes", [-1])]),
    "slice negative step": _single(helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["y"], name="s"),
                                   [4, 6], [_ints("st", [-1, 1]), _ints("en", [-100, 5]), _ints("ax", [0, 1]),
                                            _ints("sp", [-2, 2])]),
    "pad reflect": _single(helper.make_node("Pad", ["x", "pads"], ["y"], mode="reflect", name="p"),
                           [1, 2, 4, 4], [_ints("pads", [0, 0, 1, 2, 0, 0, 2, 1])]),
    "reduce mean keepdims 0": _single(helper.make_node("ReduceMean", ["x"], ["y"], axes=[1, -1], keepdims=0,
                                                       name="m"), [2, 3, 4]),
    "gather negative indices": _single(helper.make_node("Gather", ["x", "i"], ["y"], axis=1, name="g"),
                                       [2, 5, 3], [_ints("i", [[-1, 0], [2, 2]])]),
    "transpose default perm": _single(helper.make_node("Transpose", ["x"], ["y"], name="t"), [2, 3, 4]),
    "prelu per-channel slope": _single(helper.make_node("PRelu", ["x", "s"], ["y"], name="p"), [1, 3, 2, 2],
                                       [tensor("s", (3, 1, 1))]),
    "clip with one bound": helpers.model(
        [helper.make_node("Clip", ["x", "", "hi"], ["y"], name="c")], [io("x", [2, 3])], [io("y", None)],
        [tensor("hi", (), 0.5)]),
}


@pytest.mark.parametrize("case", sorted(EDGE_CASES))
def test_op_semantics_match_onnxruntime(case):
    _compare(EDGE_CASES[case])


def test_lrn_even_size_follows_the_onnx_formula():
    # ORT only takes odd sizes (and onnx.reference's LRN loops over the batch, not the channels),
    # so the expectation is the operator spec's formula, written out
    size, alpha, beta, bias = 4, 0.01, 0.7, 2.0
    proto = _single(helper.make_node("LRN", ["x"], ["y"], size=size, alpha=alpha, beta=beta, bias=bias, name="n"),
                    [1, 7, 3, 3])
    graph = load_torch_graph(proto)
    x = graph.random_inputs()["x"]
    with torch.inference_mode():
        (y,) = graph.run({"x": x})
    xn = x.numpy().astype(np.float64)
    want = np.empty_like(xn)
    for c in range(xn.shape[1]):
        lo, hi = max(0, c - (size - 1) // 2), min(xn.shape[1], c + -(-(size - 1) // 2) + 1)
        square_sum = (xn[:, lo:hi] ** 2).sum(axis=1)
        want[:, c] = xn[:, c] / (bias + alpha / size * square_sum) ** beta
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-5)


def test_split_outputs_match_onnxruntime():
    proto = helpers.model([helper.make_node("Split", ["x", "s"], ["a", "b"], axis=1, name="sp")],
                          [io("x", [2, 5])], [io("a", None), io("b", None)], [_ints("s", [2, 3])])
    _compare(proto)


def test_profiler_ranges_are_layer_names(tmp_path):
    proto = helpers.conv_net()
    graph = load_torch_graph(proto)
    feed = graph.random_inputs()
    with torch.inference_mode(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            with torch.profiler.record_function("benanza_run"):
                graph.run(feed)
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    trace = parse_kineto_trace(tmp_path / "t.json")
    names = [n.name for n in load_model(proto).nodes]
    assert len(trace.runs) == 2
    assert [o.name for o in trace.ops if o.run == 1] == names
    ops = {o.name: o.op for o in trace.ops}
    assert ops["conv1"] == "aten::conv2d" and ops["fc"] == "aten::linear"
