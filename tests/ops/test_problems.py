"""Typed problems: every family's key parses back to the same record, and a key changes exactly
when the computation does (checked against ONNX Runtime running both forms)."""

from __future__ import annotations

import re

import numpy as np
import onnxruntime as ort
import pytest
from helpers import io, model, tensor
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

from benanza import problems as P
from benanza.errors import LayerKeyError
from benanza.processor import load_model

# --- parse(format(p)) == p for every family ---------------------------------------------------

n = st.integers(0, 4096)
pos = st.integers(1, 512)
flt = st.floats(width=32, allow_nan=False, allow_infinity=False)
dims = st.lists(pos, min_size=0, max_size=5).map(tuple)
shapes = st.lists(dims, min_size=1, max_size=4).map(tuple)
words = st.sampled_from(["relu", "tanh", "sigmoid", "leakyrelu", "hardsigmoid", "elu", "softsign", "gelu",
                         "gelutanh", "hardswish"])


@st.composite
def conv(draw):
    f = {k: draw(n) for k in ("mb", "ic", "ih", "iw", "oc", "oh", "ow", "kh", "kw", "sh", "sw", "pt", "pl", "pb",
                               "pr", "dh", "dw", "g")}
    return P.ConvProblem(**f, bias=draw(st.booleans()))


@st.composite
def pool(draw):
    f = {k: draw(n) for k in ("mb", "ic", "ih", "iw", "oh", "ow", "kh", "kw", "sh", "sw", "pt", "pl", "pb", "pr",
                               "dh", "dw")}
    return P.PoolProblem(draw(st.sampled_from(["max", "gmax", "avgi", "avgx", "gavg"])), **f)


bound = st.one_of(st.none(), flt, st.just(P.FLT_MAX), st.just(-P.FLT_MAX))
problems = st.one_of(
    conv(), pool(),
    st.builds(P.BnormProblem, n, n, n, n, flt, st.booleans(), st.booleans()),
    st.builds(P.LrnProblem, n, n, n, n, n, flt, flt, flt),
    st.builds(P.EltwiseProblem, words, dims, st.none() | flt, st.none() | flt, bound, bound),
    st.builds(P.PreluProblem, dims, dims),
    st.builds(P.BinaryProblem, st.sampled_from(["add", "sub", "mul", "div", "min", "max", "sum", "pow"]), shapes,
              st.none() | flt),
    st.builds(P.GemmProblem, n, n, n, st.booleans(), st.booleans(), flt, flt, st.none() | dims),
    st.builds(P.MatMulProblem, dims.filter(bool), dims.filter(bool)),
    st.builds(P.SoftmaxProblem, st.sampled_from(["softmax", "logsoftmax"]), dims, n, st.booleans()),
    st.builds(P.DropoutProblem, dims, st.none() | flt, st.booleans()),
    st.builds(P.RnnProblem, st.sampled_from(["lstm", "gru", "rnn"]), n, n, n, n, n, st.booleans(), st.booleans(),
              st.none() | flt, st.booleans(), st.booleans(), st.lists(words, max_size=6).map(tuple),
              st.lists(flt, max_size=3).map(tuple), st.lists(flt, max_size=3).map(tuple)),
    st.builds(P.ConcatProblem, n, shapes),
    st.builds(P.LnormProblem, dims, n, flt, st.booleans()),
    st.builds(P.ReduceProblem, st.sampled_from(["mean", "sum", "max", "min", "prod"]), dims, dims),
    st.builds(P.TransposeProblem, dims, dims),
)


@settings(max_examples=600, deadline=None)
@given(problems, st.sampled_from(["f32", "f16", "bf16", "i64", "b"]))
def test_every_problem_parses_back_to_itself(p, dtype):
    text = P.format_problem(p)
    assert P.parse_problem(text) == p
    assert P.parse_layer_key(P.layer_key(p, dtype)) == (p, dtype)
    assert not re.search(r"\d[eE][-+]?\d", text)  # positional decimals, never exponents


def test_readme_keys_parse_back():
    for key in ("conv:mb1_ic64ih56iw56_oc64oh56ow56_kh3kw3_sh1sw1_ph1pw1_dh1dw1_g1_bias0_f32",
                "conv:mb1_ic3ih8iw8_oc4oh4ow4_kh3kw3_sh2sw2_ph0pw0pb1pr1_dh1dw1_g1_bias0_f32",
                "pool:max_mb1ic64ih112iw112_oh56ow56_kh3kw3_sh2sw2_ph1pw1_f32",
                "gemm:m1n1000k2048_ta0tb1_alpha1beta1_c1000_f32",
                "eltwise:clip_in1x32x112x112_min0max6_f32"):
        problem, dtype = P.parse_layer_key(key)
        assert P.layer_key(problem, dtype) == key and type(problem) is not P.GenericProblem


def test_non_canonical_or_foreign_text_is_rejected():
    with pytest.raises(LayerKeyError, match="canonical"):  # pb/pr equal to pt/pl are not printed
        P.parse_problem("conv:mb1_ic3ih8iw8_oc4oh4ow4_kh3kw3_sh2sw2_ph1pw1pb1pr1_dh1dw1_g1_bias0")
    with pytest.raises(LayerKeyError, match="does not know"):
        P.parse_problem("conv:mb1_ic3ih8iw8_oc4oh4ow4_kh3kw3_sh2sw2_ph1pw1_dh1dw1_g1_bias0_zz3")
    with pytest.raises(LayerKeyError, match="lacks"):
        P.parse_problem("gemm:m1n2k3_ta0tb0")


# --- the key changes exactly when the computation does ---------------------------------------

def _layer_and_outputs(nodes, inputs, inits, opset, feeds):
    m = model(nodes, inputs, [io("y", None)], inits, opset=opset)
    layer = load_model(m, name="m").nodes[-1].layer
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return layer, sess.run(None, feeds)[0]


# Sequence-first LSTM input, scaled so that the gates' pre-activations pass 3 somewhere whatever
# the seeded weights: a clip of 1.5 or 3 changes the outputs (one of 100 never does).
X = 4 * np.random.default_rng(0).standard_normal((3, 2, 4)).astype(np.float32)


@st.composite
def lstm_forms(draw):
    kw = {}
    clip = draw(st.sampled_from([None, 1.5, 3.0, 100.0]))
    if clip is not None:
        kw["clip"] = clip
    if draw(st.booleans()):
        kw["input_forget"] = 1
    acts = draw(st.sampled_from([None, ["Sigmoid", "Tanh", "Tanh"], ["Sigmoid", "Tanh", "Relu"]]))
    if acts:
        kw["activations"] = acts
    peep = draw(st.booleans())
    return kw, peep


@settings(max_examples=25, deadline=None)
@given(lstm_forms(), lstm_forms())
def test_lstm_keys_split_what_computes_differently(a, b):
    out = []
    for kw, peep in (a, b):
        ins = ["X", "W", "R", "B", "", "", "", "P"] if peep else ["X", "W", "R", "B"]
        inits = [tensor("W", (1, 12, 4)), tensor("R", (1, 12, 3)), tensor("B", (1, 24)), tensor("P", (1, 9))]
        out.append(_layer_and_outputs([helper.make_node("LSTM", ins, ["y"], hidden_size=3, **kw)],
                                      [io("X", list(X.shape))], inits, 13, {"X": X}))
    (la, ya), (lb, yb) = out
    if la.key == lb.key:
        np.testing.assert_allclose(ya, yb, rtol=1e-6, atol=1e-7)  # one key: one computation
    else:
        assert not np.allclose(ya, yb, rtol=1e-6, atol=1e-7) or "clip100" in la.key + lb.key, (la.key, lb.key)
    assert (la.key == lb.key) == (la.problem == lb.problem)


X4 = np.random.default_rng(1).standard_normal((2, 3, 4, 4)).astype(np.float32) * 3
B4 = np.random.default_rng(2).standard_normal((3, 1, 1)).astype(np.float32)


@st.composite
def binary_forms(draw):
    op = draw(st.sampled_from(["Add", "Mul", "Sub", "Max", "Pow"]))
    swap = draw(st.booleans())
    exponent = draw(st.sampled_from([2.0, 3.0, 0.5]))
    return op, swap, exponent


@settings(max_examples=40, deadline=None)
@given(binary_forms(), binary_forms())
def test_binary_keys_follow_the_computation(a, b):
    out = []
    for op, swap, exponent in (a, b):
        const = tensor("c", (3, 1, 1), exponent) if op == "Pow" else tensor("c", (3, 1, 1))
        if op == "Pow":
            const = tensor("c", (), exponent)
        operands = ["c", "x"] if swap and op != "Pow" else ["x", "c"]
        out.append(_layer_and_outputs([helper.make_node(op, operands, ["y"])], [io("x", list(X4.shape))],
                                      [const], 13, {"x": np.abs(X4) if op == "Pow" else X4}))
    (la, ya), (lb, yb) = out
    same_computation = ya.shape == yb.shape and np.allclose(ya, yb, rtol=1e-6, atol=1e-6)
    assert (la.key == lb.key) == same_computation, (a, b, la.key, lb.key)


def test_equivalent_forms_give_one_key():
    def key(nodes, inits, inputs=None, opset=13):
        return load_model(model(nodes, inputs or [io("x", [2, 8])], [io("y", None)], inits, opset=opset),
                          name="m").nodes[-1].layer

    w = tensor("w", (8, 4))
    # Gemm without C: beta multiplies nothing
    g0 = key([helper.make_node("Gemm", ["x", "w"], ["y"], beta=0.0)], [w])
    g1 = key([helper.make_node("Gemm", ["x", "w"], ["y"], beta=1.0)], [w])
    assert g0.key == g1.key
    gc = key([helper.make_node("Gemm", ["x", "w", "c"], ["y"], beta=0.0)], [w, tensor("c", (4,))])
    assert gc.key != g0.key  # with C, beta and C are part of it
    # Add(x, b) and Add(b, x), and the library call chosen for them
    b = tensor("b", (8,))
    xb = key([helper.make_node("Add", ["x", "b"], ["y"])], [b])
    bx = key([helper.make_node("Add", ["b", "x"], ["y"])], [b])
    assert xb.key == bx.key and xb.cudnn_api == bx.cudnn_api == "cudnnAddTensor"
    # spelled-out default LSTM activations
    lstm = [tensor("W", (1, 12, 4)), tensor("R", (1, 12, 3))]
    seq = [io("x", [3, 2, 4])]
    plain = key([helper.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=3)], lstm, seq)
    spelled = key([helper.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=3,
                                    activations=["Sigmoid", "Tanh", "Tanh"])], lstm, seq)
    assert plain.key == spelled.key and plain.cudnn_api == "cudnnRNNForward"
    # inference Dropout: the ratio changes nothing
    d1 = key([helper.make_node("Dropout", ["x", "r"], ["y"])], [tensor("r", (), 0.1)])
    d2 = key([helper.make_node("Dropout", ["x", "r"], ["y"])], [tensor("r", (), 0.7)])
    assert d1.key == d2.key and d1.identity


def test_batchnorm_spatial_and_training_are_part_of_the_key():
    x = [io("x", [2, 3, 4, 4])]

    def bn(shape, opset, outs=("y",), **kw):
        inits = [tensor(nm, shape, 1.0) for nm in ("s", "b", "m", "v")]
        return load_model(model([helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], list(outs), **kw)],
                                x, [io(o, None) for o in outs], inits, opset=opset), name="m").nodes[-1].layer

    spatial = bn((3,), 7)
    per_activation = bn((3, 4, 4), 7, spatial=0)
    assert spatial.key != per_activation.key and "peract" in per_activation.key
    assert spatial.cudnn_api and per_activation.cudnn_api is None and per_activation.onednn_primitive is None
    inference = bn((3,), 15)
    training = bn((3,), 15, outs=("y", "rm", "rv"), training_mode=1)
    assert inference.key != training.key and training.cudnn_api is None


def test_pow_exponent_is_part_of_the_key():
    def pw(e):
        return load_model(model([helper.make_node("Pow", ["x", "e"], ["y"])], [io("x", [2, 8])], [io("y", None)],
                                [tensor("e", (), e)]), name="m").nodes[-1].layer.key

    assert pw(2.0) != pw(3.0) and "exp2" in pw(2.0)


def test_integer_layers_are_covered_by_neither_library():
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Concat", ["s", "k"], ["y"], axis=0)]
    m = model(nodes, [io("x", [1, 3, 8, 8])], [io("y", None)],
              [tensor("k", (2,), 1, dtype=np.int64)])
    concat = load_model(m, name="m").nodes[-1].layer
    assert concat.dtype == "i64" and concat.family == "concat"
    assert concat.onednn_primitive is None and concat.cudnn_api is None
    assert concat.in_dtype("f16") == "i64"  # shape arithmetic is never retyped


def test_layers_json_round_trips_typed_problems(tmp_path):
    from helpers import conv_net

    from benanza.layers import unique_layers
    from benanza.manifest import build_manifest, read_manifest, write_manifest

    m = load_model(conv_net(), name="c")
    manifest = build_manifest([m], unique_layers([m]))
    write_manifest(manifest, tmp_path)
    back = read_manifest(tmp_path)
    assert [u.layer for u in back.layers] == [u.layer for u in manifest.layers]
    assert all(type(u.layer.problem) is not P.GenericProblem for u in back.layers if u.layer.op != "Flatten")
