"""Quantized layers and the small element-wise ops of decoder models: recognition, keys, work and
coverage on graphs built with onnx.helper, checked against values computed another way (NumPy's
shapes and byte counts, ONNX Runtime's outputs for the tensors' shapes)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from helpers import io, model
from onnx import TensorProto, helper, numpy_helper

from benanza.backends import onednn
from benanza.cli import main
from benanza.fusion import match_fusions
from benanza.generator import read_variants
from benanza.ops.registry import parse_layer_key
from benanza.processor import load_model
from tests.backends.test_cudnn import NEED_TOOLCHAIN, _build, _lines, _run_without_gpu

M, K, N = 4, 64, 32


def _quantized_linear() -> onnx.ModelProto:
    """ONNX Runtime's dynamic quantization of one Linear, as ``quantize_dynamic`` writes it:
    DynamicQuantizeLinear → MatMulInteger(s8 weights, zero point 0) → Cast → Mul(scales) → Add(bias)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.integers(-127, 127, (K, N), dtype=np.int8), "W"),
             numpy_helper.from_array(np.array(0, np.int8), "Wzp"),
             numpy_helper.from_array(np.array(0.02, np.float32), "Ws"),
             numpy_helper.from_array(rng.standard_normal(N).astype(np.float32), "bias")]
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xzp"], name="dq"),
        helper.make_node("Mul", ["xs", "Ws"], ["s"], name="scales"),
        helper.make_node("MatMulInteger", ["xq", "W", "xzp", "Wzp"], ["acc"], name="mm"),
        helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT, name="cast"),
        helper.make_node("Mul", ["accf", "s"], ["y0"], name="scale"),
        helper.make_node("Add", ["y0", "bias"], ["y"], name="add"),
    ]
    return model(nodes, [io("x", [1, M, K])], [io("y", None)], inits)


def _run(m: onnx.ModelProto, feeds: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
    """ONNX Runtime's values of intermediate tensors (the independent source of their shapes)."""
    m2 = onnx.ModelProto()
    m2.CopyFrom(m)
    del m2.graph.output[:]
    m2.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in names)
    sess = ort.InferenceSession(m2.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip(names, sess.run(names, feeds)))


def test_dynamic_quantization_is_costed_as_int8_layers() -> None:
    m = _quantized_linear()
    x = np.random.default_rng(1).standard_normal((1, M, K)).astype(np.float32)
    real = _run(m, {"x": x}, ["xq", "acc", "accf", "y"])
    processed = load_model(m, name="qlinear")
    by_name = {n.name: n.layer for n in processed.nodes}

    mm = by_name["mm"]
    assert mm.key == f"matmulint:a{M}x{K}_b{K}x{N}_ws1_azp1_u8"  # the weights' zero point 0 is no zero point
    assert parse_layer_key(mm.key) == (mm.problem, "u8")
    # the work and bytes of what ONNX Runtime computed: A u8, B s8, A's zero point, s32 result
    assert mm.macs == real["xq"].shape[-2] * K * real["acc"].shape[-1]
    assert mm.flops == 2 * mm.macs
    assert mm.bytes == real["xq"].nbytes + K * N + 1 + 1 + real["acc"].nbytes
    assert onednn.covers(mm) and mm.onednn_primitive == "matmul" and mm.cudnn_api == "cublasLtMatmul"

    dq = by_name["dq"]
    assert dq.key == f"dynquant:in1x{M}x{K}_f32" and dq.flops == 3 * x.size
    assert dq.bytes == x.nbytes + real["xq"].nbytes + 4 + 1
    assert onednn.covers(dq) and dq.onednn_primitive == "reduction+reorder"

    cast = by_name["cast"]
    assert cast.key == f"convert:int_in1x{M}x{N}_f32" and cast.dtype == "f32"  # the type it writes
    assert cast.bytes == real["acc"].nbytes + real["accf"].nbytes and onednn.covers(cast)

    (match,) = match_fusions(processed)
    assert match.pattern.name == "mmint_scale_bias" and match.conv is mm
    assert [processed.nodes[i].name for i in match.nodes] == ["mm", "cast", "scale", "add"]


def test_int8_layers_get_their_own_type_only() -> None:
    """A quantized layer is benchmarked in its activations' type whatever float types are asked."""
    from benanza.generator import GenOptions
    from benanza.layers import UniqueLayer

    processed = load_model(_quantized_linear(), name="qlinear")
    mm = next(n.layer for n in processed.nodes if n.name == "mm")
    variants = onednn.BACKEND.variants(UniqueLayer(mm, []), ("mmint_scale_bias",), GenOptions(dtypes=("f32", "bf16")))
    assert {(v.dtype, v.fusion) for v in variants} == {("u8", "none"), ("u8", "mmint_scale_bias")}


def test_cudnn_rows_of_int8_layers_by_hand() -> None:
    """The rows the cuDNN runtime reads, by hand from the ONNX shapes: MatMulInteger as cuBLASLt's
    int8 GEMM (M x N x K of the activations and weights, one variant per heuristic rank in its
    own u8 type), DynamicQuantizeLinear and the int32 Cast as quant-table graph nodes; weights'
    zero points, which cuBLASLt has none of, leave a MatMulInteger not covered, with the reason."""
    from benanza.backends import cudnn
    from benanza.generator import GenOptions
    from benanza.layers import UniqueLayer
    from benanza.ops.registry import uncovered_reason

    processed = load_model(_quantized_linear(), name="qlinear")
    layers = {n.name: n.layer for n in processed.nodes}
    mm, dq, cast = layers["mm"], layers["dq"], layers["cast"]
    row = cudnn.lowering(mm).row(mm.problem, mm.cudnn_api)
    assert (row.m, row.n, row.k, row.batch, row.trans_a, row.trans_b) == (M, N, K, 1, False, False)
    assert cudnn.lowering(mm).call == "kLtInt8" and cudnn.family_of(mm) is cudnn.BLAS
    variants = cudnn.BACKEND.variants(UniqueLayer(mm, []), ("mmint_scale_bias",), GenOptions(dtypes=("f32", "f16")))
    assert [(v.api, v.algo, v.dtype, v.fusion) for v in variants] == [
        ("cublasLtMatmul", f"heuristic{i}", "u8", "none") for i in range(8)]
    dq_row = cudnn.lowering(dq).row(dq.problem, dq.cudnn_api)
    assert (dq_row.op, dq_row.rank, dq_row.in_[:4]) == ("QuantOp::DynamicQuantize", 4, (1, 1, M, K))
    cast_row = cudnn.lowering(cast).row(cast.problem, cast.cudnn_api)
    assert (cast_row.op, cast_row.source, cast_row.in_[:4]) == ("QuantOp::Convert", "DType::I32", (1, 1, M, N))

    # per-column weights' zero points (nonzero): no cuBLASLt int8 GEMM computes them
    w = numpy_helper.from_array(np.ones((K, N), np.int8), "W")
    wzp = numpy_helper.from_array(np.arange(1, N + 1, dtype=np.int8), "Wzp")
    node = helper.make_node("MatMulInteger", ["x", "W", "", "Wzp"], ["y"], name="mm")
    graph = model([node], [io("x", [M, K], TensorProto.UINT8)], [io("y", None, TensorProto.INT32)], [w, wzp])
    zp = load_model(graph, name="zp")
    (layer,) = [n.layer for n in zp.nodes]
    assert layer.key == f"matmulint:a{M}x{K}_b{K}x{N}_ws1_bzp{N}_u8" and layer.cudnn_api is None
    assert uncovered_reason(layer, "cudnn") == "cuBLASLt's int8 GEMM has no weights' zero points"


def test_qdq_keys_name_type_axis_and_zero_point() -> None:
    w = np.arange(K * N, dtype=np.int8).reshape(K, N)
    inits = [numpy_helper.from_array(np.array(0.1, np.float32), "xs"),
             numpy_helper.from_array(np.array(7, np.uint8), "xzp"),
             numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.full(N, 0.01, np.float32), "Ws")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xzp"], ["xq"], name="q"),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xzp"], ["xd"], name="dqx"),
             helper.make_node("DequantizeLinear", ["W", "Ws"], ["Wd"], axis=1, name="dqw"),
             helper.make_node("MatMul", ["xd", "Wd"], ["y"], name="mm")]
    processed = load_model(model(nodes, [io("x", [M, K])], [io("y", None)], inits), name="qdq")
    keys = {n.name: n.layer.key for n in processed.nodes}
    assert keys["q"] == f"quant:byte_in{M}x{K}_zp_f32"
    assert keys["dqx"] == f"dequant:byte_in{M}x{K}_zp_f32"
    assert keys["dqw"] == f"dequant:sbyte_in{K}x{N}_axis1_f32"  # per-column scales, no zero point
    for n in processed.nodes:
        assert parse_layer_key(n.layer.key)[0] == n.layer.problem
        assert onednn.covers(n.layer), n.name
    # cuDNN: the dequantizations as graph nodes, the per-column scale [1, N] broadcast over [K, N]
    from benanza.backends import cudnn

    dqw = next(n.layer for n in processed.nodes if n.name == "dqw")
    row = cudnn.lowering(dqw).row(dqw.problem, dqw.cudnn_api)
    assert (row.op, row.source, row.zp, row.in_[:4], row.scale[:4]) == (
        "QuantOp::Dequantize", "DType::I8", False, (1, 1, K, N), (1, 1, 1, N))
    # QuantizeLinear: x / scale + zero point written as the integer type (the row's source)
    q = next(n.layer for n in processed.nodes if n.name == "q")
    row = cudnn.lowering(q).row(q.problem, q.cudnn_api)
    assert (row.op, row.source, row.zp, row.in_[:4], row.scale[:4]) == (
        "QuantOp::Quantize", "DType::U8", True, (1, 1, M, K), (1, 1, 1, 1))


def test_small_eltwise_ops_and_casts() -> None:
    nodes = [helper.make_node("Cast", ["pos"], ["posf"], to=TensorProto.FLOAT, name="cast64"),
             helper.make_node("Cos", ["posf"], ["c"], name="cos"), helper.make_node("Sin", ["posf"], ["s"], name="sin"),
             helper.make_node("Reciprocal", ["c"], ["r"], name="recip"),
             helper.make_node("IsNaN", ["r"], ["nan"], name="isnan"),
             helper.make_node("Cast", ["r"], ["same"], to=TensorProto.FLOAT, name="same"),
             helper.make_node("Cast", ["idx"], ["idxf"], to=TensorProto.FLOAT, name="cast32"),
             helper.make_node("Cast", ["r"], ["ri"], to=TensorProto.INT64, name="toint"),
             helper.make_node("Cast", ["pos"], ["pb"], to=TensorProto.BOOL, name="mask")]
    m = model(nodes, [io("pos", [1, 8], TensorProto.INT64), io("idx", [1, 8], TensorProto.INT32)],
              [io("s", None), io("nan", None), io("same", None), io("idxf", None), io("ri", None),
               io("pb", None)])
    layers = {n.name: n.layer for n in load_model(m, name="ew").nodes}
    assert layers["cos"].key == "eltwise:cos_in1x8_f32" and layers["recip"].key == "eltwise:reciprocal_in1x8_f32"
    # oneDNN: 1/x is its eltwise pow (x^-1); it has no cos/sin; cuDNN: pointwise nodes for all three
    assert layers["recip"].onednn_primitive == "eltwise"
    assert layers["cos"].onednn_primitive is None and layers["sin"].onednn_primitive is None
    assert {layers[n].cudnn_api for n in ("cos", "sin", "recip")} == {"cudnn_frontend.pointwise"}
    # IsNaN: oneDNN's binary_ne of x with itself; cuDNN's CMP_NEQ pointwise node of x with itself
    assert layers["isnan"].key == "eltwise:isnan_in1x8_f32"
    assert layers["isnan"].onednn_primitive == "eltwise"
    assert layers["isnan"].cudnn_api == "cudnn_frontend.pointwise"
    # an int64 source has no oneDNN type; int32 does; a Cast to its own type is free
    assert layers["cast64"].key == "convert:long_in1x8_f32" and not onednn.covers(layers["cast64"])
    assert layers["cast32"].key == "convert:int_in1x8_f32" and onednn.covers(layers["cast32"])
    # cuDNN: a pointwise IDENTITY node from int32 and from int64 (the graph API's INT64 tensors)
    from benanza.backends import cudnn

    assert layers["cast32"].cudnn_api == layers["cast64"].cudnn_api == "cudnn_frontend.quant"
    row = cudnn.lowering(layers["cast64"]).row(layers["cast64"].problem, layers["cast64"].cudnn_api)
    assert (row.op, row.source) == ("QuantOp::Convert", "DType::I64") and cudnn.covers(layers["cast64"])
    # into bool: the tobool family, x ≠ 0 in one-byte booleans (cuDNN's CMP_NEQ with 0); oneDNN has none
    mask = layers["mask"]
    assert mask.key == "tobool:long_in1x8_b" and parse_layer_key(mask.key) == (mask.problem, "b")
    assert mask.flops == 8 and mask.bytes == 8 * 8 + 8  # int64 in, one byte per bool out
    assert mask.onednn_primitive is None and not onednn.covers(mask)
    row = cudnn.lowering(mask).row(mask.problem, mask.cudnn_api)
    assert (row.op, row.source) == ("QuantOp::NonZero", "DType::I64") and cudnn.covers(mask)
    assert layers["same"].free
    # a Cast into an integer type stays a generic layer, its key the `cast:` one it always had
    assert layers["toint"].key.startswith("cast:") and layers["toint"].family == "cast"
    assert parse_layer_key(layers["toint"].key)[0] == layers["toint"].problem


def test_matmulnbits_is_a_named_gap_with_its_weight_bytes() -> None:
    k, n, block = 64, 32, 32
    blocks = k // block
    packed = np.random.default_rng(0).integers(0, 255, (n, blocks, block // 2), dtype=np.uint8)
    inits = [numpy_helper.from_array(packed, "B"), numpy_helper.from_array(np.full(n * blocks, 0.01, np.float32), "S")]
    node = helper.make_node("MatMulNBits", ["A", "B", "S"], ["Y"], domain="com.microsoft", K=k, N=n, bits=4,
                            block_size=block, name="mm4")
    graph = helper.make_graph([node], "g", [io("A", [M, k])], [io("Y", None)], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    y = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"A": np.ones((M, k), np.float32)})[0]
    (layer,) = [nd.layer for nd in load_model(m, name="nbits").nodes]
    assert layer.key == f"nbitsmatmul:m{M}k{k}n{n}_bits4block{block}_f32"
    assert layer.macs == M * k * y.shape[-1] and layer.flops == 2 * layer.macs
    # the 4-bit weights are half a byte each: K·N/2 bytes, plus A, the scales and Y
    assert layer.bytes == M * k * 4 + k * n // 2 + n * blocks * 4 + y.nbytes
    assert layer.onednn_primitive is None and layer.cudnn_api is None


def _static_quantized(tmp: Path, per_channel: bool = False) -> dict[str, Path]:
    """An MLP (MatMul→Relu→MatMul) through ONNX Runtime's static quantization, in both of its
    formats: QOperator (QuantizeLinear→QLinearMatMul→QLinearMatMul→DequantizeLinear) and QDQ;
    ``per_channel``: the weights' scales per output column."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((K, N)).astype(np.float32), "W1"),
             numpy_helper.from_array(rng.standard_normal((N, 16)).astype(np.float32), "W2")]
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm1"), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "W2"], ["y"], name="mm2")]
    src = tmp / "mlp.onnx"
    onnx.save(model(nodes, [io("x", [M, K])], [io("y", [M, 16])], inits, opset=17), src)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([{"x": rng.standard_normal((M, K)).astype(np.float32)} for _ in range(4)])

        def get_next(self) -> dict | None:
            return next(self.batches, None)

    out = {}
    for fmt, name in ((QuantFormat.QOperator, "qop"), (QuantFormat.QDQ, "qdq")):
        out[name] = tmp / f"mlp_{name}{'_pc' * per_channel}.onnx"
        quantize_static(str(src), str(out[name]), Reader(), quant_format=fmt, activation_type=QuantType.QUInt8,
                        weight_type=QuantType.QInt8, per_channel=per_channel)
    return out


@pytest.mark.slow  # runs ONNX Runtime's calibration, builds and runs oneDNN benchmarks
def test_static_quantization_costed_and_checked(tmp_path) -> None:
    paths = _static_quantized(tmp_path)
    layers = {n.name: n.layer for n in load_model(paths["qop"], name="qop").nodes}
    qlinear = [la for la in layers.values() if la.op == "QLinearMatMul"]
    assert [la.key for la in qlinear] == [f"qmatmul:a{M}x{K}_b{K}x{N}_ws1_azp1_ys0_u8",
                                          f"qmatmul:a{M}x{N}_b{N}x16_ws1_ys0_u8"]  # ReLU's range: zero point 0
    assert all(la.macs == la.problem.a[0] * la.problem.a[1] * la.problem.b[1] and onednn.covers(la) for la in qlinear)
    bench = tmp_path / "bench"
    r = CliRunner().invoke(main, ["generate", str(paths["qop"]), str(paths["qdq"]), "--out", str(bench),
                                  "--backend", "onednn", "--dtype", "f32", "--json"])
    assert r.exit_code == 0, r.output
    for m in json.loads(r.output)["models"]:
        assert m["backends"]["onednn"]["covered_pct"] == 100.0, m
    r = CliRunner().invoke(main, ["check", str(paths["qop"]), str(paths["qdq"]), "--bench-dir", str(bench),
                                  "--show-ok"])
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.output.splitlines() if ln.startswith(("ok:", "mismatch:", "not checked:", "failed:"))]
    assert len(lines) == 12 and all(ln.startswith("ok:") for ln in lines), r.output
    assert sum(ln.startswith("ok: qmatmul:") for ln in lines) == 2
    # the QDQ format's DequantizeLinear → MatMul → QuantizeLinear, run as the QLinearMatMul it is
    qdq = load_model(paths["qdq"], name="qdq")
    matches = match_fusions(qdq)
    assert [m.pattern.name for m in matches] == ["qdq_matmul", "qdq_matmul"]
    assert [[qdq.nodes[i].layer.op for i in m.nodes] for m in matches] == [
        ["MatMul", "DequantizeLinear", "QuantizeLinear"]] * 2
    assert sum("/fusion=qdq_matmul:" in ln for ln in lines) == 2


@pytest.mark.slow  # runs ONNX Runtime's calibration, builds a cuDNN project
@NEED_TOOLCHAIN
def test_static_quantization_on_cudnn(tmp_path, cudnn_runtime) -> None:
    """ONNX Runtime's QOperator exports, per-tensor and per-channel, on the GPU backend: every layer
    covered (generate --json), QLinearMatMul as cuBLASLt's int8 GEMM requantized into s8 in the
    same call, one variant per heuristic rank: by a scalar fp32 alpha (kLtInt8Requant) or, with
    the weights' scales per output column, by a device vector of them (kLtInt8RequantPerColumn);
    QuantizeLinear and DequantizeLinear as graph nodes. The project compiles and links against the
    cuDNN/cuBLAS wheels, every benchmark fails cleanly without a GPU, and the cuDNN frontend
    validates the quantization graphs for an sm_90 GPU."""
    paths = _static_quantized(tmp_path)
    per_channel = _static_quantized(tmp_path, per_channel=True)["qop"]
    bench = tmp_path / "bench"
    r = CliRunner().invoke(main, ["generate", str(paths["qop"]), str(per_channel), "--out", str(bench),
                                  "--backend", "cudnn", "--dtype", "f32", "--json"])
    assert r.exit_code == 0, r.output
    models = json.loads(r.output)["models"]
    assert len(models) == 2 and all(m["backends"]["cudnn"]["covered_pct"] == 100.0 for m in models), models
    variants = read_variants(bench / "cudnn")
    gemms = [v for v in variants if v.problem.family == "qmatmul"]
    # the per-channel export's scales: one per column of each weight (N, then 16)
    assert {v.layer_key for v in gemms} == {
        f"qmatmul:a{M}x{K}_b{K}x{N}_ws1_azp1_ys0_u8", f"qmatmul:a{M}x{N}_b{N}x16_ws1_ys0_u8",
        f"qmatmul:a{M}x{K}_b{K}x{N}_ws1_azp1_ys0_bsc{N}_u8", f"qmatmul:a{M}x{N}_b{N}x16_ws1_ys0_bsc16_u8"}
    assert {(v.api, v.dtype, v.math) for v in gemms} == {("cublasLtMatmul", "u8", "default")} and len(gemms) == 32
    blas = "".join(p.read_text() for p in (bench / "cudnn").glob("tables_blas_*.cpp"))
    calls = {name: call for name, call in re.findall(r'\.name = "([^"]+)".*?\.call = (\w+)', blas)}
    assert {v.name: calls[v.name] for v in gemms} == {
        v.name: "kLtInt8RequantPerColumn" if "_bsc" in v.layer_key else "kLtInt8Requant" for v in gemms}
    assert {v.problem.family for v in variants if v.api == "cudnn_frontend.quant"} == {"quant", "dequant"}

    binary = _build(bench / "cudnn", runtime=cudnn_runtime)
    _run_without_gpu(binary, variants)
    done = subprocess.run([str(binary), "--benanza_check_graphs=90"], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = {ln["name"].split("/")[0]: ln for ln in _lines(done.stdout, "BENANZA_GRAPH")}
    assert set(lines) == {f"quant:byte_in{M}x{K}_zp_f32", "dequant:byte_in4x16_zp_f32"}, set(lines)
    assert all(ln["ok"] for ln in lines.values()), lines


def test_qlinear_matmul_zero_points_cublaslt_lacks_are_named() -> None:
    """cuBLASLt's int8 GEMM has no weights' zero points and no per-row activation zero points: a
    QLinearMatMul with either is not covered on cuDNN, with that reason, per-column scales or not."""
    from benanza.ops.registry import uncovered_reason

    w = numpy_helper.from_array(np.ones((K, N), np.int8), "W")
    scalars = [numpy_helper.from_array(np.array(v, t), n) for n, v, t in (("xs", 0.1, np.float32),
                                                                         ("ys", 0.2, np.float32), ("yzp", 0, np.uint8))]
    node = helper.make_node("QLinearMatMul", ["x", "xs", "xzp", "W", "ws", "wzp", "ys", "yzp"], ["y"], name="qmm")
    cases = {"weights' zero points": (np.full(N, 0.01, np.float32), np.arange(1, N + 1, dtype=np.int8),
                                      np.array(128, np.uint8)),
             "per-row activation zero points": (np.array(0.01, np.float32), np.array(0, np.int8),
                                                np.full(M, 128, np.uint8))}
    for reason, (ws, wzp, xzp) in cases.items():
        inits = [w, *scalars, numpy_helper.from_array(ws, "ws"), numpy_helper.from_array(wzp, "wzp"),
                 numpy_helper.from_array(xzp, "xzp")]
        graph = model([node], [io("x", [M, K], TensorProto.UINT8)], [io("y", None, TensorProto.UINT8)], inits)
        (layer,) = [n.layer for n in load_model(graph, name="zp").nodes]
        assert layer.cudnn_api is None and reason in uncovered_reason(layer, "cudnn"), (layer.key, reason)


F8 = TensorProto.FLOAT8E4M3FN
FM, FK, FN = 16, 64, 32  # multiples of 16, as cuBLAS documents its FP8 kernels' dimensions


def _fp8_qdq_matmul() -> onnx.ModelProto:
    """One MatMul in ONNX's QDQ form on float8 e4m3 data (opset 19), built by hand as ONNX
    Runtime's QFLOAT8E4M3FN quantization writes it: QuantizeLinear → DequantizeLinear of x, the
    DequantizeLinear of constant float8 weights, the MatMul, QuantizeLinear → DequantizeLinear of
    its result, every scale per tensor, the float8 zero points 0."""
    rng = np.random.default_rng(0)
    inits = [helper.make_tensor("W", F8, [FK, FN], rng.uniform(-2, 2, FK * FN).astype(np.float32).tolist()),
             helper.make_tensor("zp", F8, [], [0.0])]
    inits += [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("ws", 0.05), ("xs", 0.1), ("ys", 0.2))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "zp"], ["xq"], name="qx"),
             helper.make_node("DequantizeLinear", ["xq", "xs", "zp"], ["xd"], name="dqx"),
             helper.make_node("DequantizeLinear", ["W", "ws", "zp"], ["wd"], name="dqw"),
             helper.make_node("MatMul", ["xd", "wd"], ["h"], name="mm"),
             helper.make_node("QuantizeLinear", ["h", "ys", "zp"], ["hq"], name="qy"),
             helper.make_node("DequantizeLinear", ["hq", "ys", "zp"], ["y"], name="dqy")]
    return model(nodes, [io("x", [FM, FK])], [io("y", [FM, FN])], inits, opset=19)


def test_qdq_fp8_matmul_is_one_fp8_gemm_on_cudnn_only(tmp_path) -> None:
    """A float8 QDQ MatMul (a valid model: ONNX Runtime runs it) loads with its float8 tensors
    named and sized as ONNX defines them (one byte an element); the qdq_fp8_matmul pattern
    matches it; on cuDNN its fused form is cuBLASLt's FP8 GEMM (kLtFp8, one variant per
    heuristic rank, on the MatMul's row: its 2·M·N·K FLOPs and M·K + K·N + M·N elements, one
    byte each in the FP8 call); on oneDNN it has none, and generate says why. The float8
    QuantizeLinear/DequantizeLinear pieces are not covered on either backend, counted as such."""
    m = _fp8_qdq_matmul()
    x = np.random.default_rng(1).standard_normal((FM, FK)).astype(np.float32)
    real = _run(m, {"x": x}, ["xq", "h", "y"])  # ONNX Runtime runs the model: a valid float8 QDQ graph
    assert real["xq"].dtype.itemsize == 1 and real["h"].shape == (FM, FN)
    path = tmp_path / "fp8.onnx"
    onnx.save(m, path)
    processed = load_model(path, name="fp8")
    nodes = {n.name: n for n in processed.nodes}
    dqx, mm, qy = nodes["dqx"].layer, nodes["mm"].layer, nodes["qy"].layer
    assert (dqx.dtype, dqx.inputs[0].dtype, qy.outputs[0].dtype) == ("f8e4m3fn", "f8e4m3fn", "f8e4m3fn")
    assert dqx.key.endswith("_f8e4m3fn") and parse_layer_key(dqx.key)[1] == "f8e4m3fn"
    # x's float8 bytes, the scale, the float8 zero point, the f32 result
    assert dqx.bytes == real["xq"].nbytes + 4 + 1 + x.nbytes
    assert mm.key == f"matmul:a{FM}x{FK}_b{FK}x{FN}_f32" and mm.flops == 2 * FM * FK * FN
    (match,) = match_fusions(processed)
    assert match.pattern.name == "qdq_fp8_matmul"
    assert [processed.nodes[i].name for i in match.nodes] == ["mm", "dqx", "qy"]

    bench = tmp_path / "bench"
    r = CliRunner().invoke(main, ["generate", str(path), "--out", str(bench), "--backend", "cudnn", "--dtype", "f32",
                                  "--json"])
    assert r.exit_code == 0, r.output
    (stats,) = json.loads(r.output)["models"]
    cover = stats["backends"]["cudnn"]
    # the folded weights' DequantizeLinear aside, five layers run: the MatMul is covered (unfused as
    # a float GEMM, fused as the FP8 GEMM); the float8 QuantizeLinear/DequantizeLinear are not
    assert (stats["running_layers"], cover["covered_layers"]) == (5, 1)
    assert cover["not_covered"] == {"DequantizeLinear": 2, "QuantizeLinear": 2}
    fp8 = [v for v in read_variants(bench / "cudnn") if v.fusion == "qdq_fp8_matmul"]
    assert [(v.layer_key, v.api, v.algo, v.dtype, v.math) for v in fp8] == [
        (mm.key, "cublasLtMatmul", f"heuristic{i}", "f32", "default") for i in range(8)]
    blas = "".join(p.read_text() for p in (bench / "cudnn").glob("tables_blas_*.cpp"))
    calls = dict(re.findall(r'\.name = "([^"]+)".*?\.call = (\w+)', blas))
    assert {calls[v.name] for v in fp8} == {"kLtFp8"}
    elements = FM * FK + FK * FN + FM * FN
    row = rf"\.m = {FM}, \.n = {FN}, \.k = {FK},.*?\.work = {{\.flops = ([\d.]+), \.elements = ([\d.]+)}}"
    rows = re.findall(row, blas)
    assert rows and {(float(f), float(e)) for f, e in rows} == {(2.0 * FM * FK * FN, float(elements))}

    r = CliRunner().invoke(main, ["generate", str(path), "--out", str(tmp_path / "cpu"), "--backend", "onednn",
                                  "--dtype", "f32"])
    assert r.exit_code == 0, r.output
    assert "not covered by onednn: the fused qdq_fp8_matmul at MatMul 'mm'" in r.output
    assert "oneDNN 2.6 has no float8 data type" in r.output
    assert not [v for v in read_variants(tmp_path / "cpu" / "onednn") if v.fusion != "none"]


def _fp8_static_quantized(tmp: Path) -> Path:
    """An MLP (MatMul→Relu→MatMul, dims multiples of 16) through ONNX Runtime's static
    quantization into float8 e4m3 (QFLOAT8E4M3FN activations and weights, QDQ format; ONNX
    Runtime calibrates float8 with its Distribution method only)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((FK, FN)).astype(np.float32), "W1"),
             numpy_helper.from_array(rng.standard_normal((FN, 16)).astype(np.float32), "W2")]
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm1"), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "W2"], ["y"], name="mm2")]
    src = tmp / "mlp.onnx"
    onnx.save(model(nodes, [io("x", [FM, FK])], [io("y", [FM, 16])], inits, opset=19), src)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([{"x": rng.standard_normal((FM, FK)).astype(np.float32)} for _ in range(4)])

        def get_next(self) -> dict | None:
            return next(self.batches, None)

    out = tmp / "mlp_fp8.onnx"
    quantize_static(str(src), str(out), Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QFLOAT8E4M3FN, weight_type=QuantType.QFLOAT8E4M3FN,
                    calibrate_method=CalibrationMethod.Distribution)
    return out


@pytest.mark.slow  # runs ONNX Runtime's calibration, builds a cuDNN project
@NEED_TOOLCHAIN
def test_fp8_static_quantization_on_cudnn(tmp_path, cudnn_runtime) -> None:
    """ONNX Runtime's own float8 QDQ export: both MatMuls match qdq_fp8_matmul, each gets eight
    kLtFp8 variants on cuDNN, and the project compiles and links against the cuBLAS wheel; without
    a GPU every benchmark, the FP8 GEMMs included, fails cleanly with the CUDA error."""
    path = _fp8_static_quantized(tmp_path)
    exported = onnx.load(str(path))
    assert {i.data_type for i in exported.graph.initializer if i.name.endswith("_quantized")} == {F8}
    processed = load_model(path, name="fp8")
    matches = match_fusions(processed)
    assert [[processed.nodes[i].layer.op for i in m.nodes] for m in matches] == [
        ["MatMul", "DequantizeLinear", "QuantizeLinear"]] * 2
    assert {m.pattern.name for m in matches} == {"qdq_fp8_matmul"}
    bench = tmp_path / "bench"
    r = CliRunner().invoke(main, ["generate", str(path), "--out", str(bench), "--backend", "cudnn", "--dtype", "f32"])
    assert r.exit_code == 0, r.output
    variants = read_variants(bench / "cudnn")
    fp8 = [v for v in variants if v.fusion == "qdq_fp8_matmul"]
    assert {v.layer_key for v in fp8} == {f"matmul:a{FM}x{FK}_b{FK}x{FN}_f32", f"matmul:a{FM}x{FN}_b{FN}x16_f32"}
    assert len(fp8) == 16
    blas = "".join(p.read_text() for p in (bench / "cudnn").glob("tables_blas_*.cpp"))
    assert blas.count(".call = kLtFp8") == 16
    binary = _build(bench / "cudnn", runtime=cudnn_runtime)
    _run_without_gpu(binary, variants)


def test_cudnn_runs_no_float_epilogue_for_a_qdq_matmul(tmp_path) -> None:
    """The qdq_matmul pattern's int8 GEMM is oneDNN's only: a QDQ MatMul gets no cuBLASLt bias-epilogue
    variant (a float GEMM would cost the int8 one wrongly), while the float MLP's MatMul→Add still
    gets its epilogues."""
    paths = _static_quantized(tmp_path)
    linear = tmp_path / "linear.onnx"
    onnx.save(model([helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "B"], ["y"])],
                    [io("x", [M, K])], [io("y", [M, N])],
                    [numpy_helper.from_array(np.ones((K, N), np.float32), "W"),
                     numpy_helper.from_array(np.ones(N, np.float32), "B")], opset=17), linear)
    bench = tmp_path / "bench"
    r = CliRunner().invoke(main, ["generate", str(paths["qdq"]), str(linear), "--out", str(bench),
                                  "--backend", "cudnn", "--dtype", "f32"])
    assert r.exit_code == 0, r.output
    fusions = {v.fusion for v in read_variants(bench / "cudnn")}
    assert "qdq_matmul" not in fusions and "mm_bias" in fusions, fusions


def _cnn(tmp: Path) -> Path:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 8, 3, 3)).astype(np.float32), "W1"),
             numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "B1"),
             numpy_helper.from_array(rng.standard_normal((16, 4, 3, 3)).astype(np.float32), "W2")]
    nodes = [helper.make_node("Conv", ["x", "W1", "B1"], ["h"], pads=[1, 1, 1, 1], name="c1"),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Conv", ["r", "W2"], ["y"], pads=[1, 1, 1, 1], group=4, name="c2")]
    src = tmp / "cnn.onnx"
    onnx.save(model(nodes, [io("x", [1, 8, 8, 8])], [io("y", [1, 16, 8, 8])], inits, opset=17), src)
    return src


def _quantized_cnns(tmp_path: Path) -> list[Path]:
    """The CNN through ONNX Runtime's static quantization (QOperator: QLinearConv, per-tensor and
    per-channel weights' scales) and its dynamic quantization (ConvInteger)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    src = _cnn(tmp_path)
    rng = np.random.default_rng(1)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([{"x": rng.standard_normal((1, 8, 8, 8)).astype(np.float32)} for _ in range(4)])

        def get_next(self) -> dict | None:
            return next(self.batches, None)

    paths = []
    for per_channel in (False, True):
        paths.append(tmp_path / f"cnn_q{int(per_channel)}.onnx")
        quantize_static(str(src), str(paths[-1]), Reader(), quant_format=QuantFormat.QOperator,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=per_channel)
    paths.append(tmp_path / "cnn_dyn.onnx")
    quantize_dynamic(str(src), str(paths[-1]), weight_type=QuantType.QInt8, op_types_to_quantize=["Conv"])
    return paths


_CONV = "mb1_ic8ih8iw8_oc16oh8ow8_kh3kw3_sh1sw1_ph1pw1_dh1dw1_g1"
_GROUPED = "mb1_ic16ih8iw8_oc16oh8ow8_kh3kw3_sh1sw1_ph1pw1_dh1dw1_g4"
# what the two convolutions of _cnn become in _quantized_cnns' three models
_QCONV_KEYS = {f"qconv:{_CONV}_bias1_ws1_azp1_ys0_u8", f"qconv:{_GROUPED}_bias0_ws1_ys0_u8",
               f"qconv:{_CONV}_bias1_ws1_azp1_ys0_bsc16_u8", f"qconv:{_GROUPED}_bias0_ws1_ys0_bsc16_u8",
               f"convint:{_CONV}_bias0_ws1_azp1_u8", f"convint:{_GROUPED}_bias0_ws1_azp1_u8"}


@pytest.mark.slow  # runs ONNX Runtime's calibration, builds and runs oneDNN benchmarks
def test_quantized_convs_costed_and_checked(tmp_path) -> None:
    """QLinearConv (per-tensor and per-channel weights' scales, a bias, groups) from static
    quantization and ConvInteger from dynamic quantization, through oneDNN's int8 convolution."""
    paths = _quantized_cnns(tmp_path)
    keys = {n.layer.key for p in paths for n in load_model(p).nodes if n.layer.op in ("QLinearConv", "ConvInteger")}
    assert keys == _QCONV_KEYS
    bench = tmp_path / "bench"
    r = CliRunner().invoke(main, ["generate", *map(str, paths), "--out", str(bench), "--backend", "onednn",
                                  "--dtype", "f32", "--json"])
    assert r.exit_code == 0, r.output
    for m in json.loads(r.output)["models"]:
        assert m["backends"]["onednn"]["covered_pct"] == 100.0, m
    r = CliRunner().invoke(main, ["check", *map(str, paths), "--bench-dir", str(bench), "--show-ok",
                                  "--filter", "^(qconv|convint):"])
    assert r.exit_code == 0, r.output
    # every algorithm and layout oneDNN accepts computes ONNX Runtime's outputs; it has no int8
    # winograd (6 layers × 3 layouts refused)
    assert "checked 54 benchmarks (seed 0): 36 ok, 0 mismatch, 0 not checked, 18 unsupported, 0 failed" in r.output
    assert all("/algo=winograd/" not in ln for ln in r.output.splitlines() if ln.startswith("ok:"))
    # one step of tolerance for requantized outputs (halfway ties) hides no wrong input: one u8
    # element off by 64 (the runtime's fault hook) is a mismatch
    wrong = next(ln.split(": ")[1] for ln in r.output.splitlines()
                 if ln.startswith(f"ok: qconv:{_CONV}_bias1_ws1_azp1_ys0_u8/"))
    r = CliRunner(env={"BENANZA_FAULT_PERTURB": wrong}).invoke(
        main, ["check", *map(str, paths), "--bench-dir", str(bench), "--filter", f"^{re.escape(wrong)}$"])
    assert r.exit_code == 1 and f"mismatch: {wrong}: " in r.output and "(quantization steps)" in r.output, r.output


@pytest.mark.slow  # runs ONNX Runtime's calibration, builds a cuDNN project
@NEED_TOOLCHAIN
def test_quantized_convs_on_cudnn(tmp_path, cudnn_runtime) -> None:
    """QLinearConv (per-tensor and per-channel weights' scales, a bias, groups) and ConvInteger on
    the GPU backend: each an int8 convolution graph (the qconv table), its plan slots in NHWC, on
    the keys oneDNN benchmarks; the project compiles and links against the cuDNN wheels, every
    benchmark fails cleanly without a GPU, and the cuDNN frontend validates every int8
    convolution graph for an sm_90 GPU. Channels that are not multiples of 4, u8 weights and
    weights' zero points are not covered, by name."""
    from benanza.ops.registry import uncovered_reason

    paths = _quantized_cnns(tmp_path)
    keys = {}
    for backend in ("cudnn", "onednn"):
        bench = tmp_path / backend
        r = CliRunner().invoke(main, ["generate", *map(str, paths), "--out", str(bench), "--backend", backend,
                                      "--dtype", "f32", "--json"])
        assert r.exit_code == 0, r.output
        assert [m["backends"][backend]["covered_pct"] for m in json.loads(r.output)["models"]] == [100.0] * 3
        variants = read_variants(bench / backend)
        keys[backend] = {v.layer_key for v in variants if v.problem.family in ("qconv", "convint")}
    assert keys["cudnn"] == keys["onednn"] == _QCONV_KEYS
    variants = read_variants(tmp_path / "cudnn" / "cudnn")
    convs = [v for v in variants if v.problem.family in ("qconv", "convint")]
    assert {(v.api, v.dtype, v.layout, v.math) for v in convs} == {("cudnn_frontend.qconv", "u8", "nhwc", "default")}
    assert sorted(v.algo for v in convs) == sorted([f"plan{i}" for i in range(8)] * 6)
    table = (tmp_path / "cudnn" / "cudnn" / "tables_qconv_0.cpp").read_text()
    rows = re.findall(r"\.groups = (\d+),.*\.bias = (\w+), \.requant = (\w+), \.bscales = (\d+),.*// (\w+):", table)
    assert sorted(rows) == sorted([("1", "false", "false", "1", "convint"), ("4", "false", "false", "1", "convint"),
                                   ("1", "true", "true", "1", "qconv"), ("1", "true", "true", "16", "qconv"),
                                   ("4", "false", "true", "1", "qconv"), ("4", "false", "true", "16", "qconv")])

    binary = _build(tmp_path / "cudnn" / "cudnn", runtime=cudnn_runtime)
    _run_without_gpu(binary, variants)
    done = subprocess.run([str(binary), "--benanza_check_graphs=90"], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = {ln["name"].split("/")[0]: ln for ln in _lines(done.stdout, "BENANZA_GRAPH")}
    assert {k for k in lines if k.startswith(("qconv:", "convint:"))} == _QCONV_KEYS
    assert all(ln["ok"] for ln in lines.values()), lines

    # the first convolution of an image model (3 channels), u8 weights, weights' zero points
    xzp = numpy_helper.from_array(np.array(128, np.uint8), "xzp")
    cases = {"3 input and 16 output channels per group": (np.int8, 3, None),
             "u8 weights": (np.uint8, 4, None), "no weights' zero points": (np.int8, 4, 3)}
    for reason, (wtype, channels, wzp) in cases.items():
        inits = [numpy_helper.from_array(np.ones((16, channels, 3, 3), wtype), "W"), xzp]
        inputs = ["x", "W", "xzp"]
        if wzp is not None:
            inits.append(numpy_helper.from_array(np.array(wzp, wtype), "wzp"))
            inputs.append("wzp")
        node = helper.make_node("ConvInteger", inputs, ["y"], pads=[1, 1, 1, 1], name="ci")
        graph = model([node], [io("x", [1, channels, 8, 8], TensorProto.UINT8)], [io("y", None, TensorProto.INT32)],
                      inits)
        (layer,) = [n.layer for n in load_model(graph, name="uncovered").nodes]
        assert layer.cudnn_api is None and reason in uncovered_reason(layer, "cudnn"), (reason, layer.key)


def _conv_rows(x: np.ndarray, w: np.ndarray, row) -> np.ndarray:
    """The integer convolution a cuDNN QconvLayer row describes, in NumPy: x (N, C, H, W) and w
    (K, C/groups, R, S) as int64, zero padding per end, strides, dilations and groups of the row."""
    xp = np.pad(x, ((0, 0), (0, 0), (row.pad_t, row.pad_b), (row.pad_l, row.pad_r)))
    per_group, k_group = row.c // row.groups, row.k // row.groups
    out = np.zeros((row.n, row.k, row.out_h, row.out_w), np.int64)
    for i in range(row.r):
        for j in range(row.s):
            top, left = i * row.dil_h, j * row.dil_w
            patch = xp[:, :, top:top + row.stride_h * (row.out_h - 1) + 1:row.stride_h,
                       left:left + row.stride_w * (row.out_w - 1) + 1:row.stride_w]
            for g in range(row.groups):
                cs, ks = slice(g * per_group, (g + 1) * per_group), slice(g * k_group, (g + 1) * k_group)
                out[:, ks] += np.einsum("nchw,kc->nkhw", patch[:, cs], w[ks, :, i, j])
    return out


@pytest.mark.slow  # runs ONNX Runtime's calibration
def test_cudnn_int8_conv_rows_compute_onnx_runtimes_convs(tmp_path) -> None:
    """What the int8 convolution graph computes, replayed in NumPy from each generated row (the
    s8 convolution of u8 activations read as s8, u8 − 128; QLinearConv's MUL by sa·sb/sy and ADD
    of the per-channel offset the docs name, into s8 read back as u8), against ONNX Runtime
    running each QLinearConv and ConvInteger node alone: QLinearConv's outputs agree within one
    quantization step wherever the window lies inside the input, and everywhere once the
    activations' zero-point correction at the borders, which the graph leaves out, is added;
    ConvInteger's differ by exactly that correction, all of which its graph leaves out."""
    from benanza.backends import cudnn

    rng = np.random.default_rng(3)
    checked = []
    for path in _quantized_cnns(tmp_path):
        src = onnx.load(path)
        inits = {t.name: t for t in src.graph.initializer}
        layers = {n.name: n.layer for n in load_model(path).nodes}
        for node in (n for n in src.graph.node if n.op_type in ("QLinearConv", "ConvInteger")):
            layer = layers[node.name]
            p, row = layer.problem, cudnn.lowering(layer).row(layer.problem, layer.cudnn_api)
            qlinear = node.op_type == "QLinearConv"
            # ConvInteger's activation zero point is a run-time value (DynamicQuantizeLinear's): any will do
            zps = {node.input[2]: numpy_helper.from_array(np.array(rng.integers(1, 255), np.uint8), node.input[2])}
            consts = [inits[name] if name in inits else zps[name] for name in node.input[1:] if name]
            single = model([node], [io(node.input[0], [p.mb, p.ic, p.ih, p.iw], TensorProto.UINT8)],
                           [io(node.output[0], None, TensorProto.UINT8 if qlinear else TensorProto.INT32)], consts)
            x = rng.integers(0, 256, (p.mb, p.ic, p.ih, p.iw)).astype(np.uint8)
            sess = ort.InferenceSession(single.SerializeToString(), providers=["CPUExecutionProvider"])
            (want,) = sess.run(None, {node.input[0]: x})
            value = {c.name: numpy_helper.to_array(c) for c in consts}
            w = value[node.input[3 if qlinear else 1]].astype(np.int64)
            xzp = int(value[node.input[2]])
            acc = _conv_rows(x.astype(np.int64) - 128, w, row)  # what the graph's convolution computes
            # the activations' zero-point correction: (128 - zp) times the weights on the taps
            # inside the input; per channel (the weights' sums) where the window lies inside it
            inside = _conv_rows(np.ones(x.shape, np.int64), w, row)
            correction = (128 - xzp) * inside
            per_channel = (128 - xzp) * w.sum(axis=(1, 2, 3)).reshape(1, -1, 1, 1)
            interior = inside * (128 - xzp) == per_channel
            assert interior.any() and not interior.all()
            if not qlinear:
                assert np.array_equal(want.astype(np.int64) - acc, correction), node.name
                checked.append(node.op_type)
                continue
            assert row.requant and row.bias == (len(node.input) > 8) and row.bscales == value[node.input[4]].size
            scale = (value[node.input[1]] * value[node.input[4]] / value[node.input[6]]).astype(np.float32)
            scale = np.broadcast_to(scale.reshape(-1), (row.k,)).reshape(1, -1, 1, 1)
            bias = value[node.input[8]].astype(np.float32) if row.bias else np.zeros(row.k, np.float32)
            # the offset a framework folds at load time: the bias times the scale, the output's
            # zero point, -128 for a u8 output written as s8, the zero point's per-channel part
            offset = (bias.reshape(1, -1, 1, 1) + per_channel) * scale + float(value[node.input[7]]) - 128
            # the graph's accumulator agrees inside; with the border correction added, everywhere
            # (one step apart where the two roundings meet a tie, which is rare: an offset one
            # step off, or a misplaced pad, moves most outputs)
            for total, where in ((acc, interior), (acc + correction - per_channel, np.ones_like(interior))):
                y = np.clip(np.rint(total * scale + offset), -128, 127).astype(np.int64) + 128
                steps = np.abs(y - want)[where]
                assert steps.max() <= 1 and steps.mean() < 0.01, (node.name, steps.max(), steps.mean())
            checked.append(node.op_type)
    assert sorted(checked) == ["ConvInteger"] * 2 + ["QLinearConv"] * 4


# --- the QDQ Conv as one int8 convolution (qdq_conv, qdq_conv_per_channel) -------------------

def _qdq_cnns(tmp_path: Path) -> list[Path]:
    """The CNN through ONNX Runtime's static quantization in its QDQ format (its default), with
    per-tensor and per-channel weights' scales: DequantizeLinear(u8) → Conv(·, DequantizeLinear(s8
    weights)[, DequantizeLinear(int32 bias)]) → QuantizeLinear(u8) for each Conv (the quantizer
    folds the Relu into the first Conv's output range: it writes none)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    src = _cnn(tmp_path)
    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            rng = np.random.default_rng(1)
            self.batches = iter([{"x": rng.standard_normal((1, 8, 8, 8)).astype(np.float32)} for _ in range(4)])

        def get_next(self) -> dict | None:
            return next(self.batches, None)

    paths = []
    for per_channel in (False, True):
        paths.append(tmp_path / f"cnn_qdq{int(per_channel)}.onnx")
        quantize_static(str(src), str(paths[-1]), Reader(), quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=per_channel)
    return paths


_FLOAT_CONVS = {f"conv:{_CONV}_bias1_f32", f"conv:{_GROUPED}_bias0_f32"}


@pytest.mark.slow  # runs ONNX Runtime's calibration, builds and runs oneDNN benchmarks
def test_qdq_convs_run_as_int8_convolutions_checked_and_analyzed(tmp_path) -> None:
    """quantize_static's QDQ CNN (per-tensor and per-channel weights' scales, a bias, groups): each
    Conv matches qdq_conv (qdq_conv_per_channel), whose fused variant on the float Conv's key is
    oneDNN's int8 convolution requantized into u8 (QLinearConv's); run, every one computes what
    ONNX Runtime computes for the pattern's nodes (one quantization step at ties), a wrong input
    does not; and Q5's fused bound takes them in place of the float pieces."""
    from benanza.perfdb import PerfDB

    paths = _qdq_cnns(tmp_path)
    for path, name in zip(paths, ("qdq_conv", "qdq_conv_per_channel"), strict=True):
        m = load_model(path)
        matches = match_fusions(m)
        assert [x.pattern.name for x in matches] == [name, name]
        assert [[m.nodes[i].layer.op for i in x.nodes] for x in matches] == [
            ["Conv", "DequantizeLinear", "QuantizeLinear"]] * 2
        assert {x.conv_key for x in matches} == _FLOAT_CONVS
    bench, db = tmp_path / "bench", tmp_path / "perf.db"
    r = CliRunner().invoke(main, ["generate", *map(str, paths), "--out", str(bench), "--backend", "onednn",
                                  "--dtype", "f32", "--json"])
    assert r.exit_code == 0, r.output
    for m in json.loads(r.output)["models"]:
        assert m["backends"]["onednn"]["covered_pct"] == 100.0, m
    fused = [v for v in read_variants(bench / "onednn") if v.fusion.startswith("qdq_conv")]
    # both Convs, both patterns, every algorithm and layout a conv has, in the f32 asked for
    assert {(v.layer_key, v.fusion) for v in fused} == {
        (k, f) for k in _FLOAT_CONVS for f in ("qdq_conv", "qdq_conv_per_channel")}
    assert len(fused) == 2 * 2 * 3 * 3 and {v.dtype for v in fused} == {"f32"}
    source = (bench / "onednn" / "benchmarks.cpp").read_text()
    # the int8 convolution's rows: a u8 source with its zero point, s8 weights, a u8 result; the
    # weights' scales per tensor or one per output channel
    rows = re.findall(r'\{\.mb = 1, [^}]*\.azp = 1, \.out = "byte", \.bscales = (\d+), \.a_type = "byte"\}', source)
    assert sorted(rows) == ["1", "1", "16", "16"]
    r = CliRunner().invoke(main, ["run", "--bench-dir", str(bench), "--system", "box", "--db", str(db), "--backend",
                                  "onednn", "--threads", "1", "--min-time", "0.01", "--repetitions", "1",
                                  "--max-contention", "1", "--no-peaks"])
    assert r.exit_code == 0, r.output
    with PerfDB(db) as perf:
        results = [res for res in perf.results("box") if res.variant.fusion.startswith("qdq_conv")]
    # oneDNN has no int8 winograd: 2 convs × 2 patterns × 3 layouts refused
    assert len(results) == 36 and sum(res.ok for res in results) == 24, results
    r = CliRunner().invoke(main, ["check", *map(str, paths), "--bench-dir", str(bench), "--show-ok",
                                  "--filter", "fusion=qdq_conv"])
    assert r.exit_code == 0, r.output
    assert "checked 36 benchmarks (seed 0): 24 ok, 0 mismatch, 0 not checked, 12 unsupported, 0 failed" in r.output
    oks = [ln for ln in r.output.splitlines() if ln.startswith("ok:")]
    assert all("'W1_DequantizeLinear' and 'B1_DequantizeLinear'" in ln for ln in oks if "_bias1_" in ln), oks
    # one element of the u8 source perturbed (the runtime's fault hook) is a mismatch
    wrong = next(ln.split(": ")[1] for ln in oks if "_bias1_" in ln and ln.split(": ")[1].endswith("=qdq_conv"))
    r = CliRunner(env={"BENANZA_FAULT_PERTURB": wrong}).invoke(
        main, ["check", *map(str, paths), "--bench-dir", str(bench), "--filter", f"^{re.escape(wrong)}$"])
    assert r.exit_code == 1 and f"mismatch: {wrong}: " in r.output, r.output
    for path, name in zip(paths, ("qdq_conv", "qdq_conv_per_channel"), strict=True):
        r = CliRunner().invoke(main, ["analyze", str(path), "--system", "box", "--db", str(db), "--json"])
        assert r.exit_code == 0, r.output
        (an,) = json.loads(r.output)["analyses"]
        fusion = an["fusion"]
        applied = fusion["applied"] + fusion["unprofitable"]
        assert sorted(a["pattern"] for a in applied) == [name, name], fusion
        best = {res.variant.name: res.latency_ms for res in results if res.ok}
        # both sides measured: the int8 convolution against the float Conv and its DequantizeLinear
        # and QuantizeLinear
        assert all(a["variant"].endswith(f"/fusion={name}") and a["fused_ms"] > 0 and a["unfused_ms"] > 0
                   for a in applied), applied
        # the fused time is the measured benchmark's (analyze rounds to the nanosecond)
        assert all(a["fused_ms"] == pytest.approx(best[a["variant"]], abs=1e-6) for a in applied), (applied, best)


def _qdq_conv_by_hand(quantized_bias: bool = True) -> onnx.ModelProto:
    """One Conv of 3 input channels (an image model's first) in ONNX Runtime's QDQ form, built by
    hand as quantize_static writes it: x quantized and dequantized (u8, a zero point), the
    dequantized s8 weights (zero point 0) and int32 bias (scale sa·sb), the result quantized and
    dequantized; ``quantized_bias`` False: a float bias instead, which QLinearConv has not."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.integers(-127, 128, (8, 3, 3, 3)).astype(np.int8), "Wq"),
             numpy_helper.from_array(np.array(0, np.int8), "wzp"),
             numpy_helper.from_array(np.array(128, np.uint8), "xzp"),
             numpy_helper.from_array(np.array(0, np.uint8), "yzp")]
    inits += [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("xs", 0.1), ("ws", 0.05), ("ys", 0.2))]
    if quantized_bias:
        inits += [numpy_helper.from_array(rng.integers(-100, 100, 8).astype(np.int32), "Bq"),
                  numpy_helper.from_array(np.array([0.005], np.float32), "bs")]
    else:
        inits.append(numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "bd"))
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xzp"], ["xq"], name="qx"),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xzp"], ["xd"], name="dqx"),
             helper.make_node("DequantizeLinear", ["Wq", "ws", "wzp"], ["wd"], name="dqw"),
             helper.make_node("Conv", ["xd", "wd", "bd"], ["h"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("QuantizeLinear", ["h", "ys", "yzp"], ["hq"], name="qy"),
             helper.make_node("DequantizeLinear", ["hq", "ys", "yzp"], ["y"], name="dqy")]
    if quantized_bias:
        nodes.insert(3, helper.make_node("DequantizeLinear", ["Bq", "bs"], ["bd"], name="dqb"))
    return model(nodes, [io("x", [1, 3, 8, 8])], [io("y", [1, 8, 8, 8])], inits, opset=17)


def test_qdq_conv_of_three_channels_is_a_named_cudnn_gap(tmp_path) -> None:
    """A QDQ Conv of 3 input channels matches qdq_conv (its int32 bias part of it), and gets its
    oneDNN int8 convolution; cuDNN's int8 convolution takes channel counts that are multiples of 4,
    so there it has no fused form, by name, and the float Conv and the pieces stay costed. With a
    float bias it is not matched (QLinearConv's bias is int32)."""
    path = tmp_path / "qdq3.onnx"
    onnx.save(_qdq_conv_by_hand(), path)
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    assert _run(_qdq_conv_by_hand(), {"x": x}, ["y"])["y"].shape == (1, 8, 8, 8)  # a valid model
    m = load_model(path, name="qdq3")
    (match,) = match_fusions(m)
    assert match.pattern.name == "qdq_conv" and [m.nodes[i].name for i in match.nodes] == ["conv", "dqx", "qy"]
    key = "conv:mb1_ic3ih8iw8_oc8oh8ow8_kh3kw3_sh1sw1_ph1pw1_dh1dw1_g1_bias1_f32"
    assert match.conv_key == key
    for backend in ("onednn", "cudnn"):
        r = CliRunner().invoke(main, ["generate", str(path), "--out", str(tmp_path / backend), "--backend", backend,
                                      "--dtype", "f32"])
        assert r.exit_code == 0, r.output
        fused = {v.fusion for v in read_variants(tmp_path / backend / backend) if v.layer_key == key}
        assert fused == ({"none", "qdq_conv"} if backend == "onednn" else {"none"}), (backend, fused)
    assert ("not covered by cudnn: the fused qdq_conv at Conv 'conv' (its pieces are costed): 3 input and 8 "
            "output channels per group: cuDNN's int8 convolutions take NHWC data") in r.output, r.output
    float_bias = tmp_path / "float_bias.onnx"
    onnx.save(_qdq_conv_by_hand(quantized_bias=False), float_bias)
    # the float Conv with its bias, as any float Conv
    assert [x.pattern.name for x in match_fusions(load_model(float_bias, name="float_bias"))] == ["bias"]


@pytest.mark.slow  # runs ONNX Runtime's calibration, builds a cuDNN project
@NEED_TOOLCHAIN
def test_qdq_convs_on_cudnn_are_int8_convolution_graphs(tmp_path, cudnn_runtime) -> None:
    """On the GPU backend the qdq_conv patterns are QLinearConv's int8 convolution graph (the qconv
    table, its requantizing epilogue, the weights' scales per tensor or per output channel), plan
    slots in NHWC, on the float Conv's key; not a float fused conv (cudnnConvolutionBiasActivationForward).
    The project compiles and links, every benchmark fails cleanly without a GPU, and the cuDNN
    frontend validates the graphs for sm_90 (which proves little for these graphs: above, and
    docs/quantized.md)."""
    paths = _qdq_cnns(tmp_path)
    bench = tmp_path / "bench"
    r = CliRunner().invoke(main, ["generate", *map(str, paths), "--out", str(bench), "--backend", "cudnn",
                                  "--dtype", "f32", "--json"])
    assert r.exit_code == 0, r.output
    for m in json.loads(r.output)["models"]:
        assert m["backends"]["cudnn"]["covered_pct"] == 100.0, m
    fused = [v for v in read_variants(bench / "cudnn") if v.fusion != "none" and v.layer_key in _FLOAT_CONVS]
    assert {(v.layer_key, v.fusion) for v in fused} == {
        (k, f) for k in _FLOAT_CONVS for f in ("qdq_conv", "qdq_conv_per_channel")}
    assert {(v.api, v.layout, v.math, v.dtype) for v in fused} == {("cudnn_frontend.qconv", "nhwc", "default", "f32")}
    assert sorted(v.algo for v in fused) == sorted([f"plan{i}" for i in range(8)] * 4)
    table = "".join(p.read_text() for p in (bench / "cudnn").glob("tables_qconv_*.cpp"))
    rows = re.findall(r"\.c = (\d+),.*?\.groups = (\d+),.*?\.requant = true, \.bscales = (\d+)", table)
    assert sorted(rows) == [("16", "4", "1"), ("16", "4", "16"), ("8", "1", "1"), ("8", "1", "16")]

    variants = read_variants(bench / "cudnn")
    binary = _build(bench / "cudnn", runtime=cudnn_runtime)
    _run_without_gpu(binary, variants)
    done = subprocess.run([str(binary), "--benanza_check_graphs=90"], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    graphs = [ln for ln in _lines(done.stdout, "BENANZA_GRAPH") if "fusion=qdq_conv" in ln["name"]]
    assert len(graphs) >= 4 and all(ln["ok"] for ln in graphs), graphs
