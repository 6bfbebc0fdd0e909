"""benanza.torch_exec: the eager ONNX executor in PyTorch agrees with ONNX Runtime and names
its profiler ranges exactly as the processor names layers."""

from __future__ import annotations

import helpers
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers import io, tensor
from onnx import helper, numpy_helper

torch = pytest.importorskip("torch", reason="torch is not installed: the torch executor cannot run")

from benanza.errors import BenanzaError  # noqa: E402
from benanza.parsers.kineto import parse_kineto_trace  # noqa: E402
from benanza.processor import load_model  # noqa: E402
from benanza.torch_exec import load_torch_graph  # noqa: E402


def _compare(proto: onnx.ModelProto, input_shapes: dict[str, tuple[int, ...]] | None = None) -> None:
    batch = proto.graph.input[0].type.tensor_type.shape.dim[0].dim_value or 1
    graph = load_torch_graph(proto, batch, input_shapes)
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


@pytest.mark.slow
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
    "reduce l1 keepdims 0": _single(helper.make_node("ReduceL1", ["x"], ["y"], axes=[1, -1], keepdims=0,
                                                     name="m"), [2, 3, 4]),
    "reduce l2 all axes": _single(helper.make_node("ReduceL2", ["x"], ["y"], name="m"), [2, 3, 4]),
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


# --- transformer-era and remaining ops -------------------------------------------------------------

def _float(name, values):
    return numpy_helper.from_array(np.array(values, np.float32), name)


def _bool(name, values):
    return numpy_helper.from_array(np.array(values, bool), name)


def _rnn_case(op: str, gates: int, direction: str = "forward", layout: int = 0, **attrs):
    # _compare sets the batch axis to dim 0's size: batch and sequence are both 4
    dirs, hidden, inp, batch, seq = (2 if direction == "bidirectional" else 1), 5, 3, 4, 4
    x = [batch, seq, inp] if layout else [seq, batch, inp]
    state = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    names = ["x", "W", "R", "B", "", "h0"] + (["c0"] if op == "LSTM" else [])
    inits = [tensor("W", (dirs, gates * hidden, inp)), tensor("R", (dirs, gates * hidden, hidden)),
             tensor("B", (dirs, 2 * gates * hidden)), tensor("h0", state)]
    if op == "LSTM":
        inits.append(tensor("c0", state))
    outs = ["y", "yh"] + (["yc"] if op == "LSTM" else [])
    node = helper.make_node(op, names, outs, hidden_size=hidden, direction=direction, layout=layout, name="r",
                            **attrs)
    return helpers.model([node], [io("x", x)], [io(o, None) for o in outs], inits, opset=14)


MORE_CASES = {
    "layernorm axis 1 with mean and inv std dev": helpers.model(
        [helper.make_node("LayerNormalization", ["x", "s", "b"], ["y", "mean", "isd"], axis=1, epsilon=1e-3,
                          name="ln")],
        [io("x", [2, 3, 4])], [io("y", None), io("mean", None), io("isd", None)],
        [tensor("s", (3, 4)), tensor("b", (4,))], opset=17),
    "gelu tanh": _single(helper.make_node("Gelu", ["x"], ["y"], approximate="tanh", name="g"), [2, 8], opset=20),
    "gelu erf": _single(helper.make_node("Gelu", ["x"], ["y"], name="g"), [2, 8], opset=20),
    "hardswish": _single(helper.make_node("HardSwish", ["x"], ["y"], name="h"), [2, 8], opset=14),
    "hardsigmoid": _single(helper.make_node("HardSigmoid", ["x"], ["y"], alpha=0.3, beta=0.4, name="h"), [2, 8]),
    "where bool mask": _single(helper.make_node("Where", ["m", "x", "z"], ["y"], name="w"), [3, 4],
                               [_bool("m", [[True, False, True, False]]), tensor("z", (3, 1))]),
    "trilu lower k=-1 and not, equal": helpers.model(
        [helper.make_node("Trilu", ["x", "k"], ["t"], upper=0, name="t"),
         helper.make_node("Equal", ["t", "zero"], ["e"], name="e"),
         helper.make_node("Not", ["e"], ["y"], name="n")],
        [io("x", [4, 5])], [io("y", None, onnx.TensorProto.BOOL)], [_ints("k", -1), _float("zero", 0.0)], opset=14),
    "expand both ways": _single(helper.make_node("Expand", ["x", "shape"], ["y"], name="e"), [3, 1],
                                [_ints("shape", [2, 1, 4])]),
    "range from a shape, mod": helpers.model(
        [helper.make_node("Shape", ["x"], ["s"], name="shape"),
         helper.make_node("Gather", ["s", "one"], ["n"], axis=0, name="n"),
         helper.make_node("Range", ["zero", "n", "step"], ["r"], name="range"),
         helper.make_node("Mod", ["r", "three"], ["m"], name="mod"),
         helper.make_node("Cast", ["m"], ["f"], to=onnx.TensorProto.FLOAT, name="cast"),
         helper.make_node("Add", ["x", "f"], ["y"], name="add")],
        [io("x", [2, 7])], [io("y", None)],
        [_ints("one", 1), _ints("zero", 0), _ints("step", 1), _ints("three", 3)]),
    "convtranspose asymmetric pads, groups, dilation, output_padding": _single(
        helper.make_node("ConvTranspose", ["x", "W", "b"], ["y"], pads=[0, 1, 2, 1], group=2, dilations=[2, 1],
                         strides=[3, 2], output_padding=[1, 1], name="ct"),
        [1, 4, 5, 5], [tensor("W", (4, 3, 3, 3)), tensor("b", (6,))]),
    "convtranspose output_shape": _single(
        helper.make_node("ConvTranspose", ["x", "W"], ["y"], strides=[2, 2], output_shape=[10, 9], name="ct"),
        [1, 2, 5, 5], [tensor("W", (2, 3, 3, 3))]),
    "convtranspose SAME_LOWER": _single(
        helper.make_node("ConvTranspose", ["x", "W"], ["y"], strides=[2, 2], auto_pad="SAME_LOWER", name="ct"),
        [1, 2, 4, 4], [tensor("W", (2, 3, 4, 4))]),
    "convtranspose 1-d symmetric": _single(
        helper.make_node("ConvTranspose", ["x", "W"], ["y"], strides=[2], pads=[1, 1], name="ct"),
        [1, 2, 6], [tensor("W", (2, 3, 3))]),
    "resize nearest asymmetric floor": _single(
        helper.make_node("Resize", ["x", "", "sc"], ["y"], mode="nearest", nearest_mode="floor",
                         coordinate_transformation_mode="asymmetric", name="r"),
        [1, 2, 3, 4], [_float("sc", [1, 1, 2.0, 1.5])]),
    "resize nearest half_pixel round_prefer_ceil sizes": _single(
        helper.make_node("Resize", ["x", "", "", "sz"], ["y"], mode="nearest", nearest_mode="round_prefer_ceil",
                         name="r"), [1, 2, 5, 4], [_ints("sz", [1, 2, 7, 9])]),
    "resize linear half_pixel": _single(
        helper.make_node("Resize", ["x", "", "sc"], ["y"], mode="linear", name="r"),
        [1, 2, 3, 4], [_float("sc", [1, 1, 2.0, 2.0])]),
    "resize linear align_corners downscale": _single(
        helper.make_node("Resize", ["x", "", "", "sz"], ["y"], mode="linear",
                         coordinate_transformation_mode="align_corners", name="r"),
        [1, 2, 8, 6], [_ints("sz", [1, 2, 5, 4])]),
    "resize cubic half_pixel": _single(
        helper.make_node("Resize", ["x", "", "sc"], ["y"], mode="cubic", name="r"),
        [1, 1, 4, 4], [_float("sc", [1, 1, 2.0, 2.0])]),
    "upsample opset 9 nearest": _single(
        helper.make_node("Upsample", ["x", "sc"], ["y"], mode="nearest", name="u"),
        [1, 2, 3, 3], [_float("sc", [1, 1, 2.0, 3.0])], opset=9),
    "lstm bidirectional, bias, initial state": _rnn_case("LSTM", 4, "bidirectional"),
    "gru linear_before_reset": _rnn_case("GRU", 3, "bidirectional", linear_before_reset=1),
    "rnn relu": _rnn_case("RNN", 1, activations=["Relu"]),
    "rnn tanh reverse": _rnn_case("RNN", 1, "reverse"),
}


@pytest.mark.parametrize("case", sorted(MORE_CASES))
def test_more_op_semantics_match_onnxruntime(case):
    _compare(MORE_CASES[case])


def _attention(q, k, v, extra_inputs=(), inits=(), n_out=1, **attrs):
    names = ["q", "k", "v", *extra_inputs]
    outs = ["y", "pk", "pv"][:n_out]
    node = helper.make_node("Attention", names, outs, name="att", **attrs)
    m = helpers.model([node], [io("q", q), io("k", k), io("v", v)], [io(o, None) for o in outs], list(inits),
                      opset=23)
    return m


REFERENCE = {
    "4-d": _attention([1, 2, 5, 4], [1, 2, 6, 4], [1, 2, 6, 3]),
    "4-d causal, scale": _attention([1, 2, 5, 4], [1, 2, 5, 4], [1, 2, 5, 4], is_causal=1, scale=0.3),
    "3-d grouped heads": _attention([1, 5, 8], [1, 6, 4], [1, 6, 6], q_num_heads=4, kv_num_heads=2),
    "bool mask": _attention([1, 2, 3, 4], [1, 2, 5, 4], [1, 2, 5, 4], ["m"],
                            [_bool("m", np.random.default_rng(1).random((3, 5)) > 0.3)]),
    "float mask": _attention([1, 2, 3, 4], [1, 2, 5, 4], [1, 2, 5, 4], ["m"], [tensor("m", (1, 1, 3, 5))]),
    # ONNX Runtime refuses batch-first (layout 1) recurrences: the reference evaluator is the oracle
    "lstm reverse, batch first": _rnn_case("LSTM", 4, "reverse", layout=1),
    "causal with past cache": _attention([1, 2, 2, 4], [1, 2, 2, 4], [1, 2, 2, 4], ["", "pk0", "pv0"],
                                         [tensor("pk0", (1, 2, 3, 4)), tensor("pv0", (1, 2, 3, 4))], n_out=3,
                                         is_causal=1),
}


@pytest.mark.parametrize("case", sorted(REFERENCE))
def test_attention_and_batch_first_lstm_match_the_onnx_reference(case):
    from onnx.reference import ReferenceEvaluator

    proto = REFERENCE[case]
    graph = load_torch_graph(proto, proto.graph.input[0].type.tensor_type.shape.dim[0].dim_value)
    feed = graph.random_inputs()
    with torch.inference_mode():
        got = graph.run(feed, annotate=False)
    want = ReferenceEvaluator(proto).run(None, {k: v.numpy() for k, v in feed.items()})
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-4, atol=1e-5)


def test_refused_variants_name_what_they_lack():
    gru = _rnn_case("GRU", 3)  # linear_before_reset=0: not what torch's GRU computes
    with pytest.raises(BenanzaError, match=r"node 'r' \(GRU\): linear_before_reset=0"):
        load_torch_graph(gru).run(load_torch_graph(gru).random_inputs())
    resize = _single(helper.make_node("Resize", ["x", "", "sc"], ["y"], mode="linear",
                                      coordinate_transformation_mode="asymmetric", name="r"),
                     [1, 2, 3, 4], [_float("sc", [1, 1, 2.0, 2.0])])
    with pytest.raises(BenanzaError, match=r"node 'r' \(Resize\): mode 'linear' with coordinate_transformation"):
        load_torch_graph(resize).run(load_torch_graph(resize).random_inputs())


@pytest.mark.parametrize("name,opset", [("encoder", 14), ("encoder", 17), ("gpt", 14), ("gpt", 17),
                                        ("gpt", 20), ("gpt", 23)])
def test_transformer_exports_match_onnxruntime(tmp_path_factory, name, opset):
    from torch_models import export

    _compare(onnx.load(str(export(name, opset, tmp_path_factory.mktemp("tx")))))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["encoder", "gpt", "vit", "mbv3"])
@pytest.mark.parametrize("opset", [18, 23])
def test_dynamo_exports_match_onnxruntime(tmp_path_factory, name, opset):
    from torch_models import export

    _compare(onnx.load(str(export(name, opset, tmp_path_factory.mktemp("dynamo"), exporter="dynamo"))))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["encoder", "gpt"])
@pytest.mark.parametrize("opset", [18, 23])
def test_dynamo_exports_with_a_dynamic_sequence_match_onnxruntime(tmp_path_factory, name, opset):
    from torch_models import D_MODEL, SEQ, export

    path = export(name, opset, tmp_path_factory.mktemp("dynamo"), dynamic=True, exporter="dynamo")
    # a sequence length other than the one torch.export traced with: the causal mask and the
    # reshapes follow it
    _compare(onnx.load(str(path)), {"x": (1, SEQ + 8, D_MODEL)})


def _vit_like():
    """Patch embedding, class token, position embedding, a pre-LN encoder layer with GELU, head."""
    from torch import nn

    class Vit(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.patch = nn.Conv2d(3, 32, 4, 4)
            self.cls = nn.Parameter(torch.randn(1, 1, 32))
            self.pos = nn.Parameter(torch.randn(1, 17, 32))
            self.block = nn.TransformerEncoderLayer(32, 4, 64, activation="gelu", batch_first=True, norm_first=True)
            self.norm, self.head = nn.LayerNorm(32), nn.Linear(32, 10)

        def forward(self, x):
            t = self.patch(x).flatten(2).transpose(1, 2)
            t = torch.cat([self.cls.expand(x.shape[0], -1, -1), t], dim=1) + self.pos
            return self.head(self.norm(self.block(t, is_causal=False))[:, 0])

    return Vit(), (1, 3, 16, 16)


def _mobilenet_v3_like():
    """Inverted residual with squeeze-excitation: HardSwish, HardSigmoid, depthwise conv, pooling."""
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.Hardswish())
            self.dw = nn.Sequential(nn.Conv2d(16, 16, 3, 1, 1, groups=16), nn.BatchNorm2d(16), nn.Hardswish())
            self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(16, 4, 1), nn.ReLU(), nn.Conv2d(4, 16, 1),
                                    nn.Hardsigmoid())
            self.up = nn.ConvTranspose2d(16, 8, 2, 2)

        def forward(self, x):
            y = self.stem(x)
            z = self.dw(y)
            z = z * self.se(z) + y
            return torch.nn.functional.interpolate(self.up(z), scale_factor=0.5, mode="bilinear")

    return Block(), (1, 3, 16, 16)


@pytest.mark.parametrize("build", [_vit_like, _mobilenet_v3_like])
@pytest.mark.parametrize("opset", [14, 17])
def test_vit_and_mobilenet_v3_like_exports_match_onnxruntime(tmp_path, build, opset):
    import warnings

    torch.manual_seed(0)
    module, shape = build()
    path = tmp_path / "m.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), (torch.randn(*shape),), str(path), opset_version=opset, dynamo=False,
                          input_names=["x"], output_names=["y"])
    _compare(onnx.load(str(path)))


def test_a_dynamically_quantized_matmul_matches_onnxruntime(tmp_path):
    """ONNX Runtime's own dynamic quantization of a linear layer (DynamicQuantizeLinear of the
    activations, MatMulInteger against uint8/int8 weights with their zero point, Cast, Mul by the
    scales): the executor's uint8 rounding and integer product give ORT's output."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(0)
    fp32 = tmp_path / "linear.onnx"
    onnx.save(helpers.model([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], [io("x", [8, 64])],
                            [io("y", None)],
                            [numpy_helper.from_array(rng.standard_normal((64, 32)).astype(np.float32), "W")]),
              str(fp32))
    for weight_type in (QuantType.QUInt8, QuantType.QInt8):
        quantized = tmp_path / f"linear-{weight_type.name}.onnx"
        quantize_dynamic(str(fp32), str(quantized), weight_type=weight_type)
        proto = onnx.load(str(quantized))
        assert {"DynamicQuantizeLinear", "MatMulInteger"} <= {n.op_type for n in proto.graph.node}
        _compare(proto)
