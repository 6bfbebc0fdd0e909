"""Transformer-era models: processing real exporter output, and what the backends cost of it."""

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from helpers import conv_net, io, model, tensor
from onnx import TensorProto, helper, numpy_helper
from torch_models import D_MODEL, SEQ, export

from benanza.cli import main
from benanza.errors import ShapeError
from benanza.processor import load_model


def _i64(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("torch")
    return lambda name, opset: export(name, opset, out)


# --- processing ----------------------------------------------------------------------------

def test_unread_optional_output_without_shape_is_no_error(save):
    # opset 6 Dropout: ONNX shape inference leaves its mask unknown; nothing reads the mask
    m = model([helper.make_node("Dropout", ["x"], ["y", "mask"], is_test=1),
               helper.make_node("Relu", ["y"], ["z"])], [io("x", [1, 8])], [io("z", [1, 8])], opset=6)
    nodes = load_model(save(m)).nodes
    assert [n.layer.key for n in nodes] == ["dropout:in1x8_f32", "eltwise:relu_in1x8_f32"]
    assert nodes[0].layer.identity and len(nodes[0].layer.outputs) == 1


def test_read_output_without_shape_is_still_an_error(save):
    m = model([helper.make_node("Mystery", ["x"], ["y"], domain="example.com"),
               helper.make_node("Relu", ["y"], ["z"])], [io("x", [1, 8])], [io("z", [1, 8])],
              opset=13)
    m.opset_import.append(helper.make_opsetid("example.com", 1))
    with pytest.raises(ShapeError, match="Mystery"):
        load_model(save(m))


def test_shape_cast_slice_cast_concat_feeding_reshape_resolves(save):
    # a Paddle-exported classifier's flatten: the batch read back from the Conv output's shape
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"]),
             helper.make_node("Shape", ["c"], ["s"]),
             helper.make_node("Cast", ["s"], ["sf"], to=TensorProto.FLOAT),
             helper.make_node("Slice", ["sf", "st", "en", "ax"], ["sl"]),
             helper.make_node("Cast", ["sl"], ["si"], to=TensorProto.INT64),
             helper.make_node("Concat", ["si", "minus1"], ["shape"], axis=0),
             helper.make_node("Reshape", ["c", "shape"], ["y"]),
             helper.make_node("Gemm", ["y", "Wf"], ["z"], transB=1)]
    m = model(nodes, [io("x", ["N", 3, 8, 8])], [io("z", None)],
              [tensor("W", (4, 3, 3, 3)), tensor("Wf", (10, 144)), _i64("st", [0]), _i64("en", [1]),
               _i64("ax", [0]), _i64("minus1", [-1])], opset=11)
    keys = [n.layer.key for n in load_model(save(m), batch_size=2).nodes]
    assert keys[-2:] == ["reshape:in2x4x6x6_in2_out2x144_f32", "gemm:m2n10k144_ta0tb1_alpha1beta0_f32"]


def test_mod_of_constants_feeding_slice_is_folded(save):
    # TorchScript's exporter slices q/k/v with an end computed as Reshape(Mod(Constant, Constant))
    nodes = [helper.make_node("Constant", [], ["a"], value=_i64("a", [7])),
             helper.make_node("Constant", [], ["b"], value=_i64("b", [4])),
             helper.make_node("Mod", ["a", "b"], ["m"]),
             helper.make_node("Reshape", ["m", "one"], ["end"]),
             helper.make_node("Slice", ["x", "zero", "end", "axis"], ["y"]),
             helper.make_node("Relu", ["y"], ["z"])]
    m = model(nodes, [io("x", [1, 8])], [io("z", None)],
              [_i64("one", [1]), _i64("zero", [0]), _i64("axis", [1])], opset=13)
    layers = {n.layer.op: n.layer for n in load_model(save(m)).nodes}
    assert layers["Slice"].outputs[0].shape == (1, 7 % 4)  # numpy's answer to the same arithmetic
    assert layers["Relu"].key == "eltwise:relu_in1x3_f32"


def _old_opset_model():
    """Opset 6 with an op ONNX's shape inference does not know: ONNX Runtime's symbolic
    inference, the fallback, refuses opsets before 7 (it returned None: AttributeError)."""
    m = model([helper.make_node("Mystery", ["x"], ["y"], domain="example.com"),
               helper.make_node("Relu", ["y"], ["z"])], [io("x", [1, 8])], [io("z", None)], opset=6)
    m.opset_import.append(helper.make_opsetid("example.com", 1))
    return m


def test_opset_below_7_failing_inference_is_one_clear_error(save, capfd):
    with pytest.raises(ShapeError) as e:
        load_model(save(_old_opset_model(), "old.onnx"))
    text = str(e.value)
    assert "old.onnx" in text and "Mystery" in text and "no concrete shape" in text and "\n" not in text
    assert capfd.readouterr().out == ""  # ORT's "Only support models of onnx opset 7" print is kept quiet


def test_generate_reports_old_opset_and_goes_on(tmp_path, save):
    old = _old_opset_model()
    bad, good = save(old, "old.onnx"), save(conv_net(), "good.onnx")
    r = CliRunner().invoke(main, ["generate", str(bad), str(good), "--out", str(tmp_path / "o"),
                                  "--backend", "none", "--json"])
    assert r.exit_code == 1 and r.exception is None or isinstance(r.exception, SystemExit)
    assert [s["model"] for s in json.loads(r.stdout)["models"]] == ["good"]
    assert "old.onnx" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("as_json", [False, True])
def test_generate_with_every_model_failing_exits_nonzero_without_crash(tmp_path, save, as_json):
    old = _old_opset_model()
    args = ["generate", str(save(old, "old.onnx")), str(tmp_path / "none.onnx"), "--out", str(tmp_path / "o"),
            "--backend", "none"] + (["--json"] if as_json else [])
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit)
    assert "old.onnx" in r.stderr and "none.onnx: no such file" in r.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("name", ["encoder", "gpt"])
@pytest.mark.parametrize("opset", [14, 17])
def test_torchscript_exports_process(exported, name, opset):
    path = exported(name, opset)
    m = load_model(path)
    ops = {n.layer.op for n in m.nodes}
    assert ("LayerNormalization" in ops) == (opset >= 17)  # torch writes the op from opset 17 on
    # every MatMul's shapes agree with what ONNX Runtime computes for the real tensors
    import onnxruntime as ort

    proto = onnx.load(str(path))
    wanted = [o for n in m.nodes if n.layer.op in ("MatMul", "Softmax", "Slice") for o in n.outputs]
    known = {vi.name for vi in proto.graph.output}
    for name_ in wanted:
        if name_ not in known:
            proto.graph.output.append(helper.make_empty_tensor_value_info(name_))
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((1, SEQ, D_MODEL)).astype(np.float32)
    real = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"x": x})))
    for n in m.nodes:
        for spec, out in zip(n.layer.outputs, n.outputs):
            if out in real:
                assert spec.shape == real[out].shape, (n.name, out)


# --- free views ----------------------------------------------------------------------------

VIEWS = {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"}


@pytest.mark.parametrize("backend", ["onednn", "cudnn"])
def test_pure_views_are_free_not_uncovered(exported, backend):
    from benanza.analyzer import analyze
    from benanza.processor import model_stats
    from benanza.report import document

    m = load_model(exported("encoder", 17))
    ops = [n.layer.op for n in m.nodes]
    n_views = sum(op in VIEWS for op in ops)
    assert n_views >= 12  # 11 Reshapes, a Squeeze and an Unsqueeze in torch's MultiheadAttention
    a = analyze(m, [], "sys", backend)
    status = {r.index: r.status for r in a.rows}
    for n in m.nodes:
        assert (status[n.index] == "free_view") == (n.layer.op in VIEWS), n.name
    assert "Reshape" not in {r.op for r in a.not_covered} and len(a.views) == n_views
    assert any("free views" in note for note in a.notes)
    assert document([a])["analyses"][0]["coverage"]["views"] == sorted(r.index for r in a.views)
    stats = model_stats(m)
    assert stats.free_layers == n_views
    assert not VIEWS & {op for op, _ in stats.not_covered}
    assert stats.layers == stats.covered_layers + stats.free_layers + sum(n for _, n in stats.not_covered)


# --- MatMul with a broadcast weight ---------------------------------------------------------

@pytest.mark.parametrize(("a", "b", "key", "macs"), [
    ((128, 1, 256), (256, 768), "matmul:a128x256_b256x768", 128 * 256 * 768),
    ((197, 1, 768), (768, 2304), "matmul:a197x768_b768x2304", 197 * 768 * 2304),  # ViT-B/16's qkv
    ((1, 16, 32), (1, 32, 96), "matmul:a16x32_b32x96", 16 * 32 * 96),  # a weight with a unit batch
    ((12, 197, 64), (12, 64, 197), "matmul:a12x197x64_b12x64x197", 12 * 197 * 64 * 197),  # truly batched
    ((2, 12, 16, 8), (2, 12, 8, 16), "matmul:a2x12x16x8_b2x12x8x16", 24 * 16 * 8 * 16),
])
def test_matmul_with_a_broadcast_weight_is_one_gemm(save, a, b, key, macs):
    from benanza.backends.onednn import BACKEND, PARAMS
    from benanza.generator import GenOptions
    from benanza.layers import UniqueLayer

    out = np.matmul(np.zeros(a, np.float32), np.zeros(b, np.float32)).shape
    m = model([helper.make_node("MatMul", ["x", "w"], ["y"])], [io("x", list(a))], [io("y", list(out))],
              [tensor("w", b)])
    layer = load_model(save(m)).nodes[0].layer
    assert layer.key == f"{key}_f32" and layer.macs == macs == np.prod(out) * a[-1]  # numpy's work
    assert layer.outputs[0].shape == out  # the node keeps its real output; only the problem folds
    batched = len(key.split("_")[0].split("x")) > 2
    assert layer.cudnn_api == ("cublasGemmStridedBatchedEx" if batched else "cublasGemmEx")
    variants = BACKEND.variants(UniqueLayer(layer), (), GenOptions(dtypes=("f32",)))
    dims = [tuple(int(d) for d in t[1:].split("x")) for t in key.split(":")[1].split("_")]
    assert [PARAMS["matmul"](v) for v in variants] == [
        "{{" + ", ".join(map(str, dims[0])) + "}, {" + ", ".join(map(str, dims[1])) + "}}"]
