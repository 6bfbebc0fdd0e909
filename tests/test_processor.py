"""Model processor: shapes, constants, layer keys, defaults, batch override, errors."""

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from helpers import conv_net, io, model, tensor
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper, numpy_helper

from benanza.cli import main
from benanza.errors import ModelError, ShapeError, UsageError
from benanza.layers import key_hash, parse_key, unique_layers
from benanza.model_inputs import parse_input_shapes
from benanza.processor import load_model

GOLDEN = {
    "conv1": "conv:mb1_ic3ih8iw8_oc8oh8ow8_kh3kw3_sh1sw1_ph1pw1_dh1dw1_g1_bias1_f32",
    "relu1": "eltwise:relu_in1x8x8x8_f32",
    "bn2": "bnorm:mb1ic8ih8iw8_eps0.00001_f32",
    "pool2": "pool:max_mb1ic8ih8iw8_oh4ow4_kh2kw2_sh2sw2_ph0pw0_f32",
    "flatten": "flatten:in1x8x4x4_out1x128_axis1_f32",
    "fc": "gemm:m1n10k128_ta0tb1_alpha1beta1_c10_f32",
    "softmax": "softmax:softmax_in1x10_axis1_f32",
}


def test_golden_keys(save):
    m = load_model(save(conv_net()))
    keys = {n.name: n.layer.key for n in m.nodes}
    for name, key in GOLDEN.items():
        assert keys[name] == key


def test_key_hash_is_pinned():
    # a sha256 prefix of the key: identical on every machine, whatever the Python hash seed
    assert key_hash(GOLDEN["conv1"]) == "359c50c3d7bde0f3"


def test_layers_edges_and_macs(save):
    m = load_model(save(conv_net()))
    assert [n.layer.op for n in m.nodes] == ["Conv", "Relu", "Conv", "BatchNormalization", "Relu",
                                             "MaxPool", "Flatten", "Gemm", "Softmax"]
    assert m.edges == [(i, i + 1) for i in range(8)]
    assert m.macs == 8 * 8 * 8 * 3 * 9 + 8 * 8 * 8 * 8 * 9 + 10 * 128
    fc = m.nodes[7].layer
    assert fc.cudnn_api == "cublasSgemv" and fc.onednn_primitive == "inner_product"
    assert m.nodes[6].layer.cudnn_api is None  # Flatten: no library runs it, still a layer


@pytest.mark.parametrize("weights_as", ["constant", "constant_of_shape"])
def test_constant_nodes_are_not_layers(save, weights_as):
    ref = load_model(save(conv_net(), "ref.onnx"))
    m = load_model(save(conv_net(weights_as), "c.onnx"))
    assert len(m.nodes) == len(ref.nodes) == 9
    assert [n.layer.key for n in m.nodes] == [n.layer.key for n in ref.nodes]


def test_identity_and_cast_of_constants_fold(save):
    nodes = [
        helper.make_node("Identity", ["W"], ["Wi"]),
        helper.make_node("Cast", ["Wi"], ["Wc"], to=onnx.TensorProto.FLOAT),
        helper.make_node("Conv", ["x", "Wc"], ["y"]),
        helper.make_node("Identity", ["y"], ["z"]),  # identity of a real tensor is a layer
    ]
    m = load_model(save(model(nodes, [io("x", [1, 3, 5, 5])], [io("z", None)],
                              [tensor("W", (4, 3, 3, 3))])))
    assert [n.layer.op for n in m.nodes] == ["Conv", "Identity"]


def test_omitted_and_explicit_defaults_give_one_key(save):
    def net(explicit: bool):
        conv_attrs = dict(strides=[1, 1], dilations=[1, 1], group=1, pads=[0, 0, 0, 0],
                          auto_pad="NOTSET", kernel_shape=[3, 3]) if explicit else {}
        lrn_attrs = dict(alpha=1e-4, beta=0.75, bias=1.0) if explicit else {}
        gemm_attrs = dict(alpha=1.0, beta=1.0, transA=0) if explicit else {}
        nodes = [
            helper.make_node("Conv", ["x", "W"], ["c"], **conv_attrs),
            helper.make_node("LRN", ["c"], ["l"], size=5, **lrn_attrs),
            helper.make_node("LeakyRelu", ["l"], ["r"], **({"alpha": 0.01} if explicit else {})),
            helper.make_node("Flatten", ["r"], ["f"], **({"axis": 1} if explicit else {})),
            helper.make_node("Gemm", ["f", "Wfc"], ["y"], transB=1, **gemm_attrs),
        ]
        return model(nodes, [io("x", [1, 3, 6, 6])], [io("y", None)],
                     [tensor("W", (4, 3, 3, 3)), tensor("Wfc", (2, 64))])

    a = load_model(save(net(False), "a.onnx"))
    b = load_model(save(net(True), "b.onnx"))
    assert [n.layer.key for n in a.nodes] == [n.layer.key for n in b.nodes]


def test_auto_pad_resolves_to_explicit_asymmetric_pads(save):
    nodes = [helper.make_node("Conv", ["x", "W"], ["y"], strides=[2, 2], auto_pad="SAME_UPPER")]
    m = load_model(save(model(nodes, [io("x", [1, 3, 8, 8])], [io("y", None)],
                              [tensor("W", (4, 3, 3, 3))])))
    key = m.nodes[0].layer.key
    assert "_ph0pw0pb1pr1_" in key  # SAME_UPPER puts the odd pad at the end
    assert m.nodes[0].layer.problem.pb == 1 and m.nodes[0].layer.problem.pt == 0


def test_batch_override(save):
    m = load_model(save(conv_net()), batch_size=4)
    assert m.nodes[0].layer.key.startswith("conv:mb4_")
    assert m.nodes[7].layer.key.startswith("gemm:m4n10k128")
    assert m.input_shapes == {"x": (4, 3, 8, 8)}


def test_symbolic_non_batch_dims_need_input_shape(save):
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    path = save(model(nodes, [io("x", ["N", 3, "H", "W"])], [io("y", None)]))
    with pytest.raises(ShapeError) as e:
        load_model(path)
    msg = str(e.value)
    assert str(path) in msg and "'x'" in msg and "Nx3xHxW" in msg and "--input-shape x=" in msg
    m = load_model(path, input_shapes={"x": (2, 3, 10, 12)})
    assert m.nodes[0].layer.key == "eltwise:relu_in2x3x10x12_f32"
    with pytest.raises(ShapeError, match="names no graph input"):
        load_model(path, input_shapes={"nope": (1, 3, 4, 4)})


def test_parse_input_shapes():
    assert parse_input_shapes(["data=1x3x224x224"]) == {"data": (1, 3, 224, 224)}
    assert parse_input_shapes(["past=1x2x0x16"]) == {"past": (1, 2, 0, 16)}  # an empty KV cache
    for bad in ["data", "data=", "data=1xAx2", "=1x2", "d=-1x3"]:
        with pytest.raises(UsageError):
            parse_input_shapes([bad])


def test_weights_as_graph_inputs_ir3(save):
    m = conv_net()
    m.ir_version = 3
    for init in m.graph.initializer:  # IR 3: every initializer is also a graph input
        m.graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    m.opset_import[0].version = 8
    del m.graph.node[-1]  # Softmax(axis=1) is fine; keep the graph valid for opset 8 with Flatten
    m.graph.output[0].name = "logits"
    processed = load_model(save(m))
    assert processed.input_shapes == {"x": (1, 3, 8, 8)}
    assert len(processed.nodes) == 8


def test_external_data(tmp_path):
    m = conv_net()
    path = tmp_path / "ext.onnx"
    onnx.save(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location="ext.onnx.data", size_threshold=0)
    assert (tmp_path / "ext.onnx.data").stat().st_size > 0
    processed = load_model(path)
    assert [n.layer.key for n in processed.nodes][0] == GOLDEN["conv1"]


def test_clip_bounds_from_constant_inputs_are_in_the_key(save):
    def net(hi):
        nodes = [helper.make_node("Clip", ["x", "lo", "hi"], ["y"])]
        return model(nodes, [io("x", [1, 4])], [io("y", None)],
                     [tensor("lo", (), 0.0), tensor("hi", (), hi)])

    a = load_model(save(net(6.0), "a.onnx")).nodes[0].layer
    b = load_model(save(net(1.0), "b.onnx")).nodes[0].layer
    assert a.key == "eltwise:clip_in1x4_min0max6_f32"
    assert a.cudnn_api == "cudnnActivationForward"  # clipped ReLU
    assert b.key != a.key


def test_reshape_target_values_are_in_the_key(save):
    def net(shape):
        nodes = [helper.make_node("Reshape", ["x", "s"], ["y"])]
        return model(nodes, [io("x", [1, 2, 3, 4])], [io("y", None)],
                     [numpy_helper.from_array(np.array(shape, np.int64), "s")])

    a = load_model(save(net([0, -1]), "a.onnx")).nodes[0].layer
    assert a.key == "reshape:in1x2x3x4_in2_v0x-1_out1x24_f32"
    assert str(parse_key(a.key)) == a.key


def test_dedup_within_and_across_models(save):
    a = load_model(save(conv_net(), "a.onnx"))
    b = load_model(save(conv_net(), "b.onnx"))
    uniques = unique_layers([a, b])
    assert len(uniques) == 8  # relu1 and relu2 have the same shape: one unique layer
    relu = [u for u in uniques if u.layer.op == "Relu"]
    assert len(relu) == 1 and len(relu[0].occurrences) == 4
    assert {o.model for o in relu[0].occurrences} == {"a", "b"}


def test_opset7_model(save):
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "s", "s", "s"], ["b"]),
             helper.make_node("Dropout", ["b"], ["y"], ratio=0.3)]
    m = model(nodes, [io("x", [1, 3, 4, 4])], [io("y", None)],
              [tensor("W", (2, 3, 3, 3)), tensor("s", (2,), 1.0)], opset=7, ir_version=3)
    processed = load_model(save(m))
    assert processed.opset == 7
    dropout = processed.nodes[2].layer  # opsets 7-11 have no training mode: inference, the identity
    assert dropout.key == "dropout:in1x2x4x4_f32" and dropout.identity and dropout.cudnn_api is None


# --- keys: grammar round trip ------------------------------------------------------------

ints = st.integers(min_value=0, max_value=4096)


@given(mb=ints, ic=ints, ih=ints, oc=ints, k=st.integers(1, 11), pads=st.lists(ints, min_size=4, max_size=4),
       eps=st.floats(min_value=1e-12, max_value=10, allow_nan=False))
def test_key_grammar_round_trip(mb, ic, ih, oc, k, pads, eps):
    from benanza.layers import format_number

    pt, pl, pb, pr = pads
    key = (f"conv:mb{mb}_ic{ic}ih{ih}iw{ih}_oc{oc}_kh{k}kw{k}_ph{pt}pw{pl}pb{pb}pr{pr}"
           f"_eps{format_number(eps)}_in1x-1x3_f32")
    parsed = parse_key(key)
    assert str(parsed) == key
    pairs = dict(parsed.pairs())
    assert pairs["ic"] == str(ic) and pairs["pb"] == str(pb) and ("f", "32") in parsed.tokens[-1]
    assert "e" not in format_number(eps)


def test_every_processed_key_round_trips(save):
    for n in load_model(save(conv_net())).nodes:
        assert str(parse_key(n.layer.key)) == n.layer.key


# --- errors ------------------------------------------------------------------------------

def test_errors_name_the_file(tmp_path, save):
    with pytest.raises(ModelError, match="no such file"):
        load_model(tmp_path / "missing.onnx")
    junk = tmp_path / "junk.onnx"
    junk.write_text("this is not a protobuf\n")
    with pytest.raises(ModelError, match="junk.onnx"):
        load_model(junk)
    good = save(conv_net(), "good.onnx")
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(ModelError, match="truncated.onnx"):
        load_model(truncated)


def test_unknown_op_is_a_clear_error(save, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    node = helper.make_node("Mystery", ["x"], ["y"], domain="com.example")
    m = model([node], [io("x", [1, 4])], [io("y", None)])
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(ShapeError) as e:
        load_model(save(m))
    assert "Mystery" in str(e.value) and "m.onnx" in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]  # nothing left behind


def test_generate_cli_reports_each_bad_file_and_continues(tmp_path, save):
    good = save(conv_net(), "good.onnx")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00\x01garbage")
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["generate", str(good), str(junk), str(tmp_path / "none.onnx"),
                                  "--out", str(out), "--backend", "none", "--json"])
    assert r.exit_code == 1
    stats = json.loads(r.stdout)
    assert [s["model"] for s in stats["models"]] == ["good"]
    assert stats["models"][0]["layers"] == 9 and stats["models"][0]["covered_layers"] == 8
    assert stats["total"]["unique_layers"] == 8
    assert "junk.onnx" in r.stderr and "none.onnx: no such file" in r.stderr
    manifest = json.loads((out / "layers.json").read_text())
    assert len(manifest["layers"]) == 8
    conv2 = next(la for la in manifest["layers"] if la["key"].startswith("conv:") and "bias0" in la["key"])
    assert manifest["fusions"] == [
        {"layer": GOLDEN["conv1"], "pattern": "bias_relu", "count": 1},
        {"layer": conv2["key"], "pattern": "bn_relu", "count": 1},
    ]

    # the typed manifest reads back to itself, and writes back the same bytes
    from benanza.manifest import FusionCount, read_manifest, write_manifest

    back = read_manifest(out)
    assert back.fusions[0] == FusionCount(GOLDEN["conv1"], "bias_relu", 1)
    assert back.models[0].stats.layers == 9 and back.models[0].path == str(good)
    assert json.loads((write_manifest(back, tmp_path / "again")).read_text()) == manifest


def test_symbolic_inference_fills_what_onnx_inference_leaves_unknown(save):
    # ONNX does not know ONNX Runtime's contrib ops; symbolic inference does
    node = helper.make_node("Gelu", ["x"], ["y"], domain="com.microsoft")
    m = model([node, helper.make_node("Relu", ["y"], ["z"])], [io("x", [1, 4])], [io("z", None)])
    m.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    processed = load_model(save(m))
    # com.microsoft's Gelu is the erf GELU of ONNX's opset-20 Gelu: one eltwise problem
    assert [n.layer.key for n in processed.nodes] == ["eltwise:gelu_in1x4_f32",
                                                      "eltwise:relu_in1x4_f32"]


def test_in_memory_model_is_processed_and_left_unchanged():
    proto = conv_net()
    before = proto.SerializeToString()
    m = load_model(proto, batch_size=2, name="net")
    assert m.name == "net" and m.nodes[0].layer.key.startswith("conv:mb2_")
    assert proto.SerializeToString() == before


# --- batch override: only the batch axis --------------------------------------------------

def test_batch_size_sets_the_documented_batch_axis_only(save, caplog):
    lstm = [helper.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=4)]
    path = save(model(lstm, [io("x", [5, 1, 8])], [io("y", None)],
                      [tensor("W", (1, 16, 8)), tensor("R", (1, 16, 4))]))
    for batch in (1, 4):  # sequence-first: dim 0 is the sequence length, dim 1 the batch
        (node,) = load_model(path, batch_size=batch).nodes
        assert (node.layer.problem.seq, node.layer.problem.mb) == (5, batch)
    batch_first = [helper.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=4, layout=1)]
    path = save(model(batch_first, [io("x", [2, 5, 8])], [io("y", None)],
                      [tensor("W", (1, 16, 8)), tensor("R", (1, 16, 4))]), "bf.onnx")
    (node,) = load_model(path, batch_size=3).nodes
    assert (node.layer.problem.seq, node.layer.problem.mb) == (5, 3)
    conv = [helper.make_node("Conv", ["x", "W"], ["y"])]
    path = save(model(conv, [io("x", [1, 3, 8, 8])], [io("y", None)], [tensor("W", (4, 3, 3, 3))]), "c.onnx")
    assert load_model(path, batch_size=4).nodes[0].layer.problem.mb == 4  # N of NCHW, even when fixed
    flat = [helper.make_node("Reshape", ["x", "s"], ["y"])]
    path = save(model(flat, [io("x", [6, 4])], [io("y", None)], [tensor("s", (1,), 24, dtype=np.int64)]), "r.onnx")
    with caplog.at_level("WARNING"):
        assert load_model(path, batch_size=2).input_shapes["x"] == (6, 4)  # not a batch: unchanged, and said
    assert "fixed dim 0 (6)" in caplog.text
    symbolic = save(model(flat, [io("x", ["N", 4])], [io("y", None)],
                          [tensor("s", (1,), -1, dtype=np.int64)]), "n.onnx")
    assert load_model(symbolic, batch_size=2).input_shapes["x"] == (2, 4)
