"""cuDNN/cuBLAS backend: variant expansion, generated tables, and a real nvcc build.

There is no GPU here: the build must compile and link against the cuDNN/cuBLAS wheels, and the
binary must report every benchmark cleanly (the CUDA error, or the library's refusal) instead
of crashing.
"""

from __future__ import annotations

import json
import logging
import math
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO, TESTS, io, model, tensor
from onnx import helper, numpy_helper

from benanza.backends import cudnn
from benanza.errors import BenanzaError
from benanza.fusion import BY_NAME
from benanza.generator import GenOptions, generate, read_variants
from benanza.layers import unique_layers
from benanza.manifest import Manifest, build_manifest
from benanza.processor import load_model
from benanza.records import Variant
from benanza.toolchain import cuda_toolkit


def _wheels_present() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("nvidia.cudnn", "nvidia.cu13"))


NEED_TOOLCHAIN = pytest.mark.skipif(
    not (_wheels_present() and shutil.which("cmake") and cuda_toolkit() is not None),
    reason="needs the nvidia-cudnn-cu13 and nvidia-cublas wheels, cmake, and nvcc (the machine's CUDA "
           "or the nvidia-cuda-nvcc wheel): scripts/setup.sh installs them",
)


# --- a model with every family the backend covers ----------------------------------------

def every_family_model():
    """Conv (bias, asymmetric pads; grouped + dilated) with both fusion kinds, BN, LRN, max/avg/
    global pooling, five activations, AddTensor/OpTensor/ScaleTensor, dropout, GEMV, softmax,
    LSTM, bidirectional GRU, batched and plain MatMul, a MatMul with a bias+ReLU epilogue."""
    inits = [
        tensor("W1", (8, 3, 3, 3)), tensor("B1", (8,)), tensor("W2", (8, 2, 3, 3)),
        tensor("scale", (8,), 1.0), tensor("shift", (8,), 0.0), tensor("mean", (8,), 0.0),
        tensor("var", (8,), 1.0), tensor("lo", (), 0.0), tensor("hi", (), 6.0),
        tensor("bias8", (8, 1, 1)), tensor("two", (), 2.0), tensor("ratio", (), 0.25),
        tensor("Wfc", (8, 16)), tensor("Bfc", (16,)),
        tensor("Wl", (1, 64, 8)), tensor("Rl", (1, 64, 16)), tensor("Bl", (1, 128)),
        tensor("Wg", (2, 48, 8)), tensor("Rg", (2, 48, 16)),
        tensor("Wm", (5, 8, 12)), tensor("Wn", (8, 6)), tensor("Bn", (6,)),  # Wm has its own batch: a batched GEMM
        numpy_helper.from_array(np.array([5, 2, 8], np.int64), "seq_shape"),
        numpy_helper.from_array(np.array([4, 8], np.int64), "mat_shape"),
        numpy_helper.from_array(np.array(True), "train"),
    ]
    n = helper.make_node
    nodes = [
        # sequences come from reshapes: the batch override only touches graph inputs' dim 0
        n("Reshape", ["s", "seq_shape"], ["seq"]),
        n("Reshape", ["t", "mat_shape"], ["mat"]),
        n("Conv", ["x", "W1", "B1"], ["c1"], pads=[0, 0, 1, 1], name="conv_asym"),
        n("Relu", ["c1"], ["r1"]),
        n("Conv", ["r1", "W2"], ["c2"], pads=[2, 2, 2, 2], dilations=[2, 2], group=4, name="conv_group"),
        n("BatchNormalization", ["c2", "scale", "shift", "mean", "var"], ["b2"]),
        n("Relu", ["b2"], ["r2"]),
        n("LRN", ["r2"], ["l3"], size=3),
        n("MaxPool", ["l3"], ["p3"], kernel_shape=[2, 2], strides=[2, 2]),
        n("AveragePool", ["p3"], ["a3"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1),
        n("Sigmoid", ["a3"], ["s4"]),
        n("Tanh", ["a3"], ["t4"]),
        n("Elu", ["a3"], ["e4"]),
        n("Clip", ["a3", "lo", "hi"], ["k4"]),
        n("Add", ["e4", "k4"], ["add5"]),
        n("Add", ["add5", "bias8"], ["bias5"]),
        n("Sub", ["bias8", "bias5"], ["sub5"]),
        n("Mul", ["sub5", "two"], ["mul5"]),
        n("Max", ["mul5", "s4"], ["max5"]),
        n("Max", ["max5", "t4"], ["max6"]),
        n("GlobalAveragePool", ["max6"], ["g"]),
        n("Dropout", ["g", "ratio", "train"], ["d"]),  # training mode: cudnnDropoutForward
        n("Dropout", ["d", "ratio"], ["d2"]),  # inference: the identity, no call
        n("Flatten", ["d2"], ["flat"]),
        n("Gemm", ["flat", "Wfc", "Bfc"], ["fc"]),
        n("Softmax", ["fc"], ["y"], axis=1),
        n("LSTM", ["seq", "Wl", "Rl", "Bl"], ["ly"], hidden_size=16),
        n("GRU", ["seq", "Wg", "Rg"], ["gy"], hidden_size=16, direction="bidirectional"),
        n("MatMul", ["seq", "Wm"], ["mm3"]),
        n("MatMul", ["mat", "Wn"], ["mm2"]),
        # a Linear with ReLU: the cublasLtMatmul RELU_BIAS epilogue (and AddTensor, activation unfused)
        n("MatMul", ["mat", "Wn"], ["lin"]),
        n("Add", ["lin", "Bn"], ["lin_b"]),
        n("Relu", ["lin_b"], ["lin_r"]),
        # data movement: copies of the same bytes (a region of the input per output; a dense one)
        n("Split", ["max6"], ["half0", "half1"], axis=1),
        n("Expand", ["g", "wide"], ["ex"]),  # of data: an Expand of a weight is folded at load time
        n("Transpose", ["max6"], ["tr"], perm=[0, 2, 3, 1]),
        n("Transpose", ["seq"], ["tr3"], perm=[1, 0, 2]),  # 3-d: padded to 4 with a leading 1
        n("Concat", ["half1", "max6"], ["cat"], axis=1),  # each input written into its box of the output
        # reductions: keepdims on a 4-d tensor; a 3-d one without keepdims
        n("ReduceMean", ["max6"], ["rmean"], axes=[2, 3]),
        n("ReduceMax", ["seq"], ["rmax"], axes=[2], keepdims=0),
        n("Sqrt", ["s4"], ["sqrt4"]),  # cudnnOpTensor's unary SQRT
        n("ReduceL2", ["s4"], ["rl2"], axes=[1]),
    ]
    inits.append(numpy_helper.from_array(np.array([2, 8, 1, 1], np.int64), "wide"))
    return model(nodes, [io("x", [1, 3, 16, 16]), io("s", [1, 80]), io("t", [1, 32])],
                 [io("y", None), io("ly", None), io("gy", None), io("mm3", None), io("mm2", None), io("lin_r", None),
                  io("half0", None), io("half1", None), io("ex", None), io("tr", None), io("tr3", None),
                  io("cat", None), io("rmean", None), io("rmax", None), io("sqrt4", None), io("rl2", None)],
                 inits, opset=13)


@pytest.fixture
def family_manifest(save) -> Manifest:
    path = save(every_family_model(), "every_family.onnx")
    m = load_model(path)
    return build_manifest([m], unique_layers([m]))


def _by_api(manifest: Manifest) -> Counter:
    return Counter(u.layer.cudnn_api for u in manifest.layers if u.layer.cudnn_api)


def _one_gemm(p) -> bool:
    """A convolution that is a matrix product per image (1x1, strides 1, no padding, one group):
    it also runs as a cublasLtMatmul, unfused and per fusion pattern."""
    return (p.kh, p.kw, p.sh, p.sw, p.pt, p.pl, p.pb, p.pr, p.g) == (1, 1, 1, 1, 0, 0, 0, 0, 1)


def expected_count(manifest: Manifest, dtypes=2, layouts=2, maths=1) -> int:
    """Variants the backend must generate, counted from the manifest (defaults: f32+f16,
    NCHW+NHWC, one math mode per dtype)."""
    combos_spatial = dtypes * layouts * maths
    lt_gemms = len(cudnn.LT_ALGOS) * dtypes * maths  # a GEMM's cublasLtMatmul: every heuristic rank, NCHW
    total = 0
    for u in manifest.layers:
        api = u.layer.cudnn_api
        if api is None:
            continue
        if api == "cudnnConvolutionForward":  # the legacy algorithms, the graph API's plan slots, a GEMM's ranks
            total += (len(cudnn.CONV_ALGOS) + len(cudnn.PLAN_ALGOS)) * combos_spatial + \
                (lt_gemms if _one_gemm(u.layer.problem) else 0)
        elif api in ("cudnnPoolingForward", "cudnnBatchNormalizationForwardInference",
                     "cudnnLRNCrossChannelForward"):
            total += dtypes * layouts
        elif api in ("cudnnRNNForward", "cublasGemmEx", "cublasGemmStridedBatchedEx", "cublasSgemv"):
            total += dtypes * maths
        else:
            total += dtypes
    problems = {u.layer.key: u.layer.problem for u in manifest.layers}
    for f in manifest.fusions:
        if f.pattern not in BY_NAME:
            continue  # a framework's own fusion (benanza.ort_fusions): its backend's alone
        pattern = BY_NAME[f.pattern]
        if pattern.anchor == "Conv":
            total += (8 if pattern.activation == "relu" else 1) * combos_spatial
            total += lt_gemms if _one_gemm(problems[f.layer]) else 0
        elif pattern.anchor == "MatMul" and not pattern.attention:  # a GEMM epilogue: every heuristic rank
            total += lt_gemms
        # the other patterns (decompositions, attention) have no cuDNN/cuBLAS fused call
    return total


# --- expansion -----------------------------------------------------------------------------

def test_every_family_is_covered(family_manifest):
    apis = _by_api(family_manifest)
    assert set(apis) == {
        "cudnnConvolutionForward", "cudnnBatchNormalizationForwardInference",
        "cudnnLRNCrossChannelForward", "cudnnPoolingForward", "cudnnActivationForward",
        "cudnnAddTensor", "cudnnOpTensor", "cudnnScaleTensor", "cudnnDropoutForward",
        "cublasSgemv", "cudnnSoftmaxForward", "cudnnRNNForward", "cublasGemmStridedBatchedEx",
        "cublasGemmEx", "cudnnTransformTensor", "cudnnReduceTensor"}
    # ONNX Runtime runs the MatMul→Add of the mm_bias_relu match as a Gemm and its Relu apart: its
    # own fusion, which only the onnxruntime backend benchmarks
    assert {f.pattern for f in family_manifest.fusions} == {"bias_relu", "bn_relu", "mm_bias_relu", "ort_gemm"}
    assert not {v.fusion for v in _expand(family_manifest)} & {"ort_gemm"}


def test_variant_counts_match_manifest(family_manifest):
    variants = _expand(family_manifest)
    assert len(variants) == expected_count(family_manifest)
    names = [v.name for v in variants]
    assert len(set(names)) == len(names)
    assert all(Variant.from_name(n) == v for n, v in zip(names, variants))


def _expand(manifest, options=None):
    from benanza.generator import expand_variants

    return expand_variants(manifest, cudnn.BACKEND, GenOptions() if options is None else options)


def test_convolution_expansion(family_manifest):
    variants = _expand(family_manifest)
    asym = next(u.layer.problem for u in family_manifest.layers if "pb1pr1" in u.layer.key)
    plain = [v for v in variants if v.problem == asym and v.fusion == "none"]
    combos = {("f32", "nchw", "fma"), ("f32", "nhwc", "fma"),
              ("f16", "nchw", "tensor_op"), ("f16", "nhwc", "tensor_op")}
    # the legacy API's algorithms and the graph API's plan slots, each in every dtype, layout and math
    for api, algos in (("cudnnConvolutionForward", cudnn.CONV_ALGOS), (cudnn.CUDNN_CONV_GRAPH, cudnn.PLAN_ALGOS)):
        of_api = [v for v in plain if v.api == api]
        assert {(v.algo, v.dtype, v.layout, v.math) for v in of_api} == {(a, *c) for a in algos for c in combos}
    assert len(plain) == (len(cudnn.CONV_ALGOS) + len(cudnn.PLAN_ALGOS)) * len(combos)
    fused = [v for v in variants if v.problem == asym and v.fusion != "none"]
    assert {v.fusion for v in fused} == {"bias_relu"}
    assert all(v.api == cudnn.FUSED_API for v in fused)
    assert len(fused) == 8 * 4


def test_identity_fusion_uses_the_one_algorithm_cudnn_allows(save):
    # Conv(bias) with no activation after it: the Conv→Bias pattern, IDENTITY activation.
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["y"], pads=[1, 1, 1, 1])]
    m = model(nodes, [io("x", [1, 4, 8, 8])], [io("y", None)],
              [tensor("W", (4, 4, 3, 3)), tensor("B", (4,))])
    loaded = load_model(save(m))
    manifest = build_manifest([loaded], unique_layers([loaded]))
    assert [f.pattern for f in manifest.fusions] == ["bias"]
    fused = [v for v in _expand(manifest) if v.fusion == "bias"]
    assert {v.algo for v in fused} == set(cudnn.IDENTITY_ALGOS) == {"IMPLICIT_PRECOMP_GEMM"}
    assert len(fused) == 4


def test_options_dtype_math_layout(family_manifest):
    opts = GenOptions(dtypes=("f32", "bf16"), layouts=("nhwc",), math=("tf32_allowed", "fma"))
    variants = _expand(family_manifest, opts)
    conv = {(v.dtype, v.layout, v.math) for v in variants if v.api == "cudnnConvolutionForward"}
    # f32 gets both requested modes; bf16 has neither, so its default (tensor_op)
    assert conv == {("f32", "nhwc", "fma"), ("f32", "nhwc", "tf32_allowed"), ("bf16", "nhwc", "tensor_op")}
    act = {(v.dtype, v.layout, v.math) for v in variants if v.api == "cudnnActivationForward"}
    assert act == {("f32", "nchw", "default"), ("bf16", "nchw", "default")}
    gemv = [(v.api, v.dtype, v.math) for v in variants if "m1n16k8" in v.layer_key]
    # cublasSgemv has no math setting: one fp32 variant, not one per requested mode
    assert sorted(gemv) == [("cublasGemmEx", "bf16", "tensor_op"), ("cublasSgemv", "f32", "fma")]


def test_unusable_options_are_errors(family_manifest, caplog):
    cudnn.expansion.cache_clear()
    with pytest.raises(BenanzaError, match="no layouts the cuDNN backend can run"):
        _expand(family_manifest, GenOptions(layouts=("any",)))
    with caplog.at_level(logging.WARNING):
        variants = _expand(family_manifest, GenOptions(layouts=("any", "nchw")))
    assert "ignores layouts any" in caplog.text
    assert {v.layout for v in variants} == {"nchw"}


def test_asymmetric_pads_are_reported(family_manifest, caplog):
    with caplog.at_level(logging.WARNING, logger="benanza.backends.cudnn"):
        _expand(family_manifest)
    assert "asymmetric pads (top 0, left 0, bottom 1, right 1)" in caplog.text
    assert "benchmarked with 1x1" in caplog.text


def test_uncovered_layers_get_no_variants(family_manifest):
    variants = _expand(family_manifest)
    problems = {v.problem for v in variants}
    uncovered = [u.layer for u in family_manifest.layers if u.layer.cudnn_api is None]
    assert uncovered and all(layer.problem not in problems for layer in uncovered)  # Flatten, inference Dropout
    assert {layer.op for layer in uncovered if layer.identity} == {"Dropout"}


# --- generated sources ---------------------------------------------------------------------

@pytest.fixture
def generated(tmp_path, family_manifest):
    return generate(family_manifest, "cudnn", tmp_path, GenOptions(cupti_metrics=("dram__bytes.sum",)))


def test_generated_files_and_variants_json(generated):
    out = generated.out_dir
    assert read_variants(out) == generated.variants
    names = {p.name for p in out.glob("tables_*.cpp")}
    assert names == {f"tables_{f}_0.cpp" for f in ("conv", "bnorm", "lrn", "pool", "activation", "binary",
                                                   "dropout", "blas", "softmax", "rnn", "copy",
                                                   "reduce", "qconv")}  # qconv: the convs' graph-API variants
    for part in ("common/benanza/runtime.hpp", "cudnn/benanza_cudnn/tables.hpp", "cudnn/conv.cpp",
                 "cmake/BenanzaCudaLibs.cmake"):
        assert (out / "runtime" / part).is_file()
    # every benchmark name in the tables is a generated variant, once
    rows = []
    for p in out.glob("tables_*.cpp"):
        rows += [json.loads(line.split(".name = ", 1)[1].split(", .layer", 1)[0])
                 for line in p.read_text().splitlines() if ".name = " in line]
    assert sorted(rows) == sorted(v.name for v in generated.variants)


def test_golden_conv_rows(generated):
    text = (generated.out_dir / "tables_conv_0.cpp").read_text()
    assert ("{.n = 1, .c = 3, .h = 16, .w = 16, .k = 8, .r = 3, .s = 3, .pad_t = 0, .pad_l = 0, "
            ".pad_b = 1, .pad_r = 1, .stride_h = 1, .stride_w = 1, .dil_h = 1, .dil_w = 1, "
            ".groups = 1, .out_h = 15, .out_w = 15, .bias = true, ") in text
    assert ".groups = 4, .out_h = 15, .out_w = 15, .bias = false" in text
    assert ".dil_h = 2, .dil_w = 2" in text
    assert ("algo=WINOGRAD/dtype=f16/layout=nhwc/math=tensor_op/fusion=bias_relu\", .layer = 0, "
            ".call = kConvBiasRelu, .algo = 6, .dtype = DType::F16, .layout = Layout::NHWC, "
            ".math = Math::TensorOp}") in text
    assert ".call = kConvBiasRelu, .algo = 1" in text
    assert "benanza::cudnn::add_conv(r, kLayers, kVariants" in text


def test_golden_conv_graph_rows(generated):
    """A Conv's graph-API variants: rows of the qconv table with the layer's exact pads (the graph
    pads each end on its own), no requantization, and the call that says layout and math."""
    text = (generated.out_dir / "tables_qconv_0.cpp").read_text()
    assert (".pad_b = 1, .pad_r = 1, .stride_h = 1, .stride_w = 1, .dil_h = 1, .dil_w = 1, .groups = 1, "
            ".out_h = 15, .out_w = 15, .bias = true, .requant = false, .bscales = 1, ") in text
    assert ("api=cudnn_frontend.conv/algo=plan3/dtype=f16/layout=nhwc/math=tensor_op/fusion=none\", .layer = 0, "
            ".call = kConvGraphNhwc, .algo = 3, .dtype = DType::F16, .layout = Layout::NHWC") in text
    assert ("/algo=plan0/dtype=f32/layout=nchw/math=fma/fusion=none\", .layer = 0, .call = kConvGraphFma, "
            ".algo = 0") in text
    assert "benanza::cudnn::add_qconv(r, kLayers, kVariants" in text


def test_golden_other_rows(generated):
    out = generated.out_dir
    binary = (out / "tables_binary_0.cpp").read_text()
    # Sub(bias8[8,1,1], x[1,8,7,7]): the full-shape operand goes first, the subtraction flips
    assert ("{.op = BinaryOp::Sub, .swapped = true, .rank = 4, .a = {1, 8, 7, 7, 0}, "
            ".b = {1, 8, 1, 1, 0}, .out = {1, 8, 7, 7, 0}") in binary
    assert ".op = BinaryOp::Scale, .swapped = false" in binary
    assert ".op = BinaryOp::AddTensor" in binary
    blas = (out / "tables_blas_0.cpp").read_text()
    assert ("{.m = 1, .n = 16, .k = 8, .trans_a = false, .trans_b = false, .batch = 1, .a_count = 1, "
            ".b_count = 1, .alpha = 1.0, .beta = 1.0") in blas
    assert ".m = 2, .n = 12, .k = 8, .trans_a = false, .trans_b = false, .batch = 5, .a_count = 5, .b_count = 5" in blas
    assert ".call = kSgemv" in blas and ".call = kGemmStridedBatchedEx" in blas
    rnn = (out / "tables_rnn_0.cpp").read_text()
    assert "{.cell = Cell::Lstm, .seq = 5, .batch = 2, .input = 8, .hidden = 16, .dirs = 1, .bias = true" in rnn
    assert "{.cell = Cell::Gru, .seq = 5, .batch = 2, .input = 8, .hidden = 16, .dirs = 2, .bias = false" in rnn
    softmax = (out / "tables_softmax_0.cpp").read_text()
    assert "{.log = false, .n = 1, .c = 16, .h = 1" in softmax
    copy = (out / "tables_copy_0.cpp").read_text()
    # Split of [1, 8, 7, 7] into two [1, 4, 7, 7] boxes at channel 0 and 4; Expand [1, 8, 1, 1] →
    # [2, 8, 1, 1], copied dense
    assert ("{.region = true, .into = false, .rank = 4, .count = 2, .src = {1, 8, 7, 7, 0, 0, 0, 0}, "
            ".outs = {{1, 4, 7, 7, 0, 0, 0, 0}, {1, 4, 7, 7, 0, 0, 0, 0}, ") in copy
    assert ".at = {{0, 0, 0, 0, 0, 0, 0, 0}, {0, 4, 0, 0, 0, 0, 0, 0}, " in copy
    assert ("{.region = false, .into = false, .rank = 4, .count = 1, .src = {1, 1, 1, 1, 0, 0, 0, 0}, "
            ".outs = {{2, 8, 1, 1") in copy
    assert "api=cudnnTransformTensor" in copy
    # the copies read in order; Transpose [1, 8, 7, 7] → [1, 7, 7, 8] reads dim d of its box
    # through the input's stride of dim perm[d]; a 3-d [5, 2, 8] one keeps its leading 1 in place
    assert ".perm = {0, 1, 2, 3, 0, 0, 0, 0}, .work" in copy
    assert ("{.region = true, .into = false, .rank = 4, .count = 1, .src = {1, 8, 7, 7, 0, 0, 0, 0}, "
            ".outs = {{1, 7, 7, 8, 0, 0, 0, 0}, ") in copy
    assert ".perm = {0, 2, 3, 1, 0, 0, 0, 0}, .work" in copy
    assert ".src = {1, 5, 2, 8, 0, 0, 0, 0}, .outs = {{1, 2, 5, 8, 0, 0, 0, 0}, " in copy
    assert ".perm = {0, 2, 1, 3, 0, 0, 0, 0}, .work" in copy
    # Concat of [1, 4, 7, 7] and [1, 8, 7, 7] on channels: each packed input written into its box
    # of the [1, 12, 7, 7] output, at channel 0 and 4
    assert ("{.region = true, .into = true, .rank = 4, .count = 2, .src = {1, 12, 7, 7, 0, 0, 0, 0}, .outs = "
            "{{1, 4, 7, 7, 0, 0, 0, 0}, {1, 8, 7, 7, 0, 0, 0, 0}, ") in copy
    assert ".at = {{0, 0, 0, 0, 0, 0, 0, 0}, {0, 4, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 0}" in copy
    reduce = (out / "tables_reduce_0.cpp").read_text()
    # ReduceMean over H, W of [1, 8, 7, 7]; ReduceMax over the last axis of [5, 2, 8], aligned to 4-d
    assert "{.op = ReduceOp::Avg, .rank = 4, .src = {1, 8, 7, 7, 0, 0, 0, 0}, .dst = {1, 8, 1, 1, 0, 0, 0, 0}" in reduce
    assert "{.op = ReduceOp::Max, .rank = 4, .src = {1, 5, 2, 8, 0, 0, 0, 0}, .dst = {1, 5, 2, 1, 0, 0, 0, 0}" in reduce
    assert ("{.op = ReduceOp::Norm2, .rank = 4, .src = {1, 8, 7, 7, 0, 0, 0, 0}, "
            ".dst = {1, 1, 7, 7, 0, 0, 0, 0}") in reduce
    assert "api=cudnnReduceTensor" in reduce
    binary = (out / "tables_binary_0.cpp").read_text()
    # Sqrt: cudnnOpTensor's unary op over one [1, 8, 7, 7] shape (its B operand ignored)
    assert ("{.op = BinaryOp::Sqrt, .swapped = false, .rank = 4, .a = {1, 8, 7, 7, 0}, .b = {1, 8, 7, 7, 0}, "
            ".out = {1, 8, 7, 7, 0}, ") in binary
    pool = (out / "tables_pool_0.cpp").read_text()
    assert "{.mode = PoolMode::AvgIncludePad" in pool and "{.mode = PoolMode::Max" in pool
    registry = (out / "registry.cpp").read_text()
    assert "benanza_cudnn_conv_0(r);" in registry and '"dram__bytes.sum",' in registry
    assert "kCuptiMetricCount = 1;" in registry
    cmake = (out / "CMakeLists.txt").read_text()
    assert "tables_conv_0.cpp" in cmake and 'option(BENANZA_CUPTI' in cmake and "OFF)" in cmake


def _rows(path: Path) -> dict[str, dict[str, list[int]]]:
    """The generated table's integer fields per layer key (its row's trailing comment)."""
    rows = {}
    for line in path.read_text().splitlines():
        if not line.strip().startswith("{.") or "// " not in line or ".name = " in line:
            continue
        body, key = line.rsplit("// ", 1)
        fields = re.findall(r"\.(\w+) = ((?:\{[^=]*\})|[^,]+)", body.split(".work", 1)[0])
        rows[key.strip()] = {name: [int(x) for x in re.findall(r"-?\d+", value)] for name, value in fields
                             if re.fullmatch(r"[{}\d, -]+", value)}
    return rows


def test_transpose_and_reduce_rows_compute_what_numpy_does(generated, family_manifest):
    """The runtime's reading of a row (tables.hpp), replayed in NumPy: a Transpose's source view
    (dim d through the input's stride of dim perm[d]) is np.transpose of the input, and a
    reduction's C shape is np's keepdims result, aligned to the row's rank."""
    problems = {u.layer.problem.text(): u.layer.problem for u in family_manifest.layers}
    copies = _rows(generated.out_dir / "tables_copy_0.cpp")
    transposes = [k for k in copies if k.startswith("transpose:")]
    assert len(transposes) == 2
    for key in transposes:
        row, p = copies[key], problems[key]
        rank = row["rank"][0]
        src, out, perm = row["src"][:rank], row["outs"][:rank], row["perm"][:rank]
        x = np.arange(math.prod(src), dtype=np.int64)
        strides = [math.prod(src[d + 1:]) * x.itemsize for d in range(rank)]
        view = np.lib.stride_tricks.as_strided(x, shape=out, strides=[strides[a] for a in perm])
        expected = np.transpose(x.reshape(p.shape), p.perm)
        assert np.array_equal(view.reshape(expected.shape), expected), key
    reduces = _rows(generated.out_dir / "tables_reduce_0.cpp")
    assert len(reduces) == 3
    for key, row in reduces.items():
        p = problems[key]
        rank = row["rank"][0]
        kept = np.sum(np.ones(p.shape), axis=p.axes, keepdims=True).shape
        assert row["src"][:rank] == [1] * (rank - len(p.shape)) + list(p.shape), key
        assert row["dst"][:rank] == [1] * (rank - len(kept)) + list(kept), key


def test_large_families_are_split_into_parts(tmp_path, family_manifest, monkeypatch):
    monkeypatch.setattr(cudnn, "PART_SIZE", 40)
    g = generate(family_manifest, "cudnn", tmp_path)
    conv_parts = sorted(p.name for p in g.out_dir.glob("tables_conv_*.cpp"))
    # two conv layers of 64 and 64 variants: one part each, a layer is never split
    assert conv_parts == ["tables_conv_0.cpp", "tables_conv_1.cpp"]
    monkeypatch.setattr(cudnn, "PART_SIZE", 100000)
    generate(family_manifest, "cudnn", tmp_path)
    assert sorted(p.name for p in g.out_dir.glob("tables_conv_*.cpp")) == ["tables_conv_0.cpp"]


def test_regeneration_keeps_unchanged_files(generated, family_manifest):
    out = generated.out_dir
    before = {p: p.stat().st_mtime_ns for p in out.glob("*.cpp")}
    generate(family_manifest, "cudnn", out.parent, GenOptions(cupti_metrics=("dram__bytes.sum",)))
    assert {p: p.stat().st_mtime_ns for p in out.glob("*.cpp")} == before


# --- build and run (nvcc, no GPU) ----------------------------------------------------------

def _cmake(source: Path, build: Path, *args: str) -> None:
    """Configures (Release) and builds a CMake project, the way `benanza run` does."""
    cmd = ["cmake", "-S", str(source), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", *args]
    if shutil.which("ninja"):
        cmd += ["-G", "Ninja"]
    for step in (cmd, ["cmake", "--build", str(build), "-j", "2"]):
        done = subprocess.run(step, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _build(project: Path, *args: str, runtime: Path | None = None) -> Path:
    """The generated project's binary; with ``runtime`` (the session's ``cudnn_runtime``) it links
    that build of the runtime instead of compiling the runtime again, which is most of a build."""
    if runtime is not None:
        args = (*args, f"-DBENANZA_CUDNN_RUNTIME={runtime}")
    _cmake(project, project / "build", *args)
    return project / "build" / "benanza_bench"


def build_cudnn_runtime(build: Path) -> Path:
    """runtime_cpp/cudnn built alone (BENANZA_CUPTI off), for ``_build(..., runtime=)``; with the
    wheels of this interpreter, as the generated projects are."""
    _cmake(RUNTIME / "cudnn", build, f"-DBENANZA_PYTHON={sys.executable}")
    return build


def _lines(stdout: str, tag: str) -> list[dict]:
    return [json.loads(line.split(" ", 1)[1]) for line in stdout.splitlines() if line.startswith(tag + " ")]


def _says_no_gpu(text: str) -> bool:
    """Whether text holds the CUDA error of a machine without a GPU: no driver, or no device."""
    return "cudaErrorInsufficientDriver" in text or "cudaErrorNoDevice" in text


def _run_without_gpu(binary: Path, variants: Sequence[Variant], *flags: str,
                     needing_gpu: Iterable[Variant] | None = None) -> str:
    """Runs ``binary`` with ``flags`` here, where there is no GPU: it exits cleanly with one
    BENANZA_RESULT for each of ``variants``, and each of ``needing_gpu`` (all of ``variants`` by
    default) failed with the CUDA error and nothing else. Returns its stdout."""
    run = subprocess.run([str(binary), "--benchmark_min_time=0.01", *flags], capture_output=True, text=True,
                         timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    results = _lines(run.stdout, "BENANZA_RESULT")
    assert sorted(r["name"] for r in results) == sorted(v.name for v in variants)
    failing = {v.name for v in (variants if needing_gpu is None else needing_gpu)}
    for r in results:
        if r["name"] in failing:
            assert r["status"] == "failed", r
            assert _says_no_gpu(r["message"]), r
    return run.stdout


@pytest.mark.slow
@NEED_TOOLCHAIN
def test_reference_models_build_and_report_no_gpu(tmp_path, save, zoo_model):
    paths = [zoo_model(n) for n in ("resnet50-v1", "inception-v1", "mobilenet-v2")]
    paths.append(save(every_family_model(), "every_family.onnx"))
    models = [load_model(p) for p in paths]
    manifest = build_manifest(models, unique_layers(models))
    g = generate(manifest, "cudnn", tmp_path)
    assert len(g.variants) == expected_count(manifest)
    assert Counter(v.api for v in g.variants)[cudnn.FUSED_API] > 0

    binary = _build(g.out_dir)
    listed = subprocess.run([str(binary), "--benanza_list"], capture_output=True, text=True, check=True)
    assert listed.stdout.split() == [v.name for v in _registration_order(g)]

    stdout = _run_without_gpu(binary, g.variants)
    context = _lines(stdout, "BENANZA_CONTEXT")[0]["custom"]
    assert context["backend"] == "cudnn" and context["cudnn_version"].startswith("9.")
    assert context["gpu"].startswith("unavailable: cudaError")


def _registration_order(g) -> list[Variant]:
    """Variants in the order the tables register them: family parts in file order."""
    registry = (g.out_dir / "registry.cpp").read_text()
    order = [line.strip()[len("benanza_cudnn_"):-len("(r);")] for line in registry.splitlines()
             if line.strip().startswith("benanza_cudnn_") and line.strip().endswith("(r);")]
    by_name = {v.name: v for v in g.variants}
    out = []
    for function in order:
        text = (g.out_dir / f"tables_{function}.cpp").read_text()
        out += [by_name[json.loads(line.split(".name = ", 1)[1].split(", .layer", 1)[0])]
                for line in text.splitlines() if ".name = " in line]
    return out


@pytest.mark.slow
@NEED_TOOLCHAIN
def test_cupti_mode_builds_and_refusals_need_no_gpu(tmp_path, save):
    # A MatMul whose operands broadcast over different batch dims: strided-batched GEMM cannot
    # express it, and the runtime says so before touching the GPU.
    nodes = [helper.make_node("MatMul", ["a", "b"], ["y"])]
    m = model(nodes, [io("a", [1, 2, 1, 4, 8]), io("b", [1, 1, 3, 8, 4])], [io("y", None)])
    loaded = load_model(save(m))
    manifest = build_manifest([loaded], unique_layers([loaded]))
    g = generate(manifest, "cudnn", tmp_path, GenOptions(cupti=True, cupti_metrics=("sm__throughput.avg",)))
    assert "BENANZA_CUPTI \"Profile kernels with CUPTI (fixed iterations) instead of timing only\" ON" in \
        (g.out_dir / "CMakeLists.txt").read_text()
    binary = _build(g.out_dir)
    run = subprocess.run([str(binary), "--benanza_cupti_iterations=3"], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert _lines(run.stdout, "BENANZA_CONTEXT")[0]["custom"]["mode"] == "cupti"
    results = _lines(run.stdout, "BENANZA_RESULT")
    assert len(results) == len(g.variants) == 2
    for r in results:
        assert r["status"] == "unsupported"
        assert r["message"] == "cublasGemmStridedBatchedEx cannot broadcast 2 matrices over 6 products"


@pytest.mark.slow
@NEED_TOOLCHAIN
def test_top_level_cmake_builds_a_bench_folder(tmp_path, save):
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    loaded = load_model(save(model(nodes, [io("x", [1, 4])], [io("y", None)])))
    manifest = build_manifest([loaded], unique_layers([loaded]))
    bench = tmp_path / "bench"
    generate(manifest, "cudnn", bench)
    build = tmp_path / "build"
    # the wheels (and, without a CUDA install, their nvcc) are this interpreter's
    _cmake(REPO, build, f"-DBENANZA_BENCH_DIR={bench}", f"-DBENANZA_PYTHON={sys.executable}")
    listed = subprocess.run([str(build / "cudnn" / "benanza_bench"), "--benanza_list"],
                            capture_output=True, text=True, check=True)
    assert len(listed.stdout.split()) == 2  # relu in f32 and f16


def test_top_level_cmake_rejects_an_empty_folder(tmp_path):
    done = subprocess.run(["cmake", "-S", str(REPO), "-B", str(tmp_path / "b"),
                           f"-DBENANZA_BENCH_DIR={tmp_path}"], capture_output=True, text=True)
    assert done.returncode != 0
    assert "holds no generated backend folder" in " ".join(done.stderr.split())  # CMake wraps lines


@pytest.mark.slow  # configures cuDNN projects against the session's runtime build
@NEED_TOOLCHAIN
def test_a_prebuilt_runtime_is_refused_by_a_project_it_was_not_built_for(tmp_path, save, cudnn_runtime):
    """A project links a prebuilt runtime only if it was compiled from the project's own runtime
    sources with the project's BENANZA_CUPTI: otherwise configuring it fails, saying which."""
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    loaded = load_model(save(model(nodes, [io("x", [1, 4])], [io("y", None)])))
    manifest = build_manifest([loaded], unique_layers([loaded]))

    def configure(project: Path) -> str:
        done = subprocess.run(["cmake", "-S", str(project), "-B", str(project / "build"),
                               f"-DBENANZA_CUDNN_RUNTIME={cudnn_runtime}"], capture_output=True, text=True)
        assert done.returncode != 0, done.stdout[-2000:]
        return " ".join(done.stderr.split())  # CMake wraps lines

    cupti = generate(manifest, "cudnn", tmp_path / "cupti", GenOptions(cupti=True)).out_dir
    assert "was built with BENANZA_CUPTI=OFF, this project wants ON" in configure(cupti)
    edited = generate(manifest, "cudnn", tmp_path / "edited").out_dir
    with (edited / "runtime" / "cudnn" / "core.cpp").open("a") as f:
        f.write("// a local change\n")
    assert "was built from other runtime sources" in configure(edited)


# --- host-only checks of the runtime (status tables, sticky errors, measurement arithmetic) ---

HOST_SOURCES = TESTS / "cudnn_host"
RUNTIME = REPO / "runtime_cpp"


def _wheel_dir(package: str) -> Path:
    import importlib

    return Path(next(iter(importlib.import_module(package).__path__)))


def _toolkit():
    cuda = cuda_toolkit()
    assert cuda is not None, "no CUDA toolkit (the machine's or the nvidia-cuda-nvcc wheel): run scripts/setup.sh"
    return cuda


def _host_compile(out: Path, *sources: Path) -> Path:
    """g++ against the CUDA toolkit headers and the cuDNN/cuBLAS wheels; links, runs without a GPU."""
    cudnn_dir, cublas_dir = _wheel_dir("nvidia.cudnn"), _wheel_dir("nvidia.cu13")
    cuda = _toolkit()
    libs = [cudnn_dir / "lib" / "libcudnn.so.9", cublas_dir / "lib" / "libcublas.so.13", cuda.cudart]
    cmd = ["g++", "-std=c++17", "-O1", "-Wall", "-Werror", "-o", str(out),
           f"-I{RUNTIME / 'cudnn'}", f"-I{RUNTIME / 'common'}", f"-I{cuda.include}",
           f"-I{cudnn_dir / 'include'}", f"-I{cublas_dir / 'include'}", *map(str, sources),
           *map(str, libs), f"-Wl,-rpath,{cudnn_dir / 'lib'}:{cublas_dir / 'lib'}:{cuda.lib}",
           "-lbenchmark", "-lpthread"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def host_checks(tmp_path_factory) -> Path:
    cudnn_src = RUNTIME / "cudnn"
    return _host_compile(tmp_path_factory.mktemp("host") / "host_checks", HOST_SOURCES / "host_checks.cpp",
                         cudnn_src / "core.cpp", cudnn_src / "status.cpp", cudnn_src / "measure.cpp")


def _run_host(tool: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(tool), *args], capture_output=True, text=True, timeout=60, check=False)


def _header_enum(path: Path, enum: str) -> dict[str, int]:
    """name → value of a C enum as the installed header declares it (aliases to names skipped)."""
    import re

    text = path.read_text()
    end = re.search(r"}\s*" + enum + r"\s*;", text).start()  # typedef enum { ... } name;
    body = text[text.rindex("{", 0, end):end]
    body = re.sub(r"/\*.*?\*/|//[^\n]*", "", body, flags=re.DOTALL)
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"(\w+)(?:\s+CUDNN_DEPRECATED_ENUM)?\s*=\s*(\d+)", body)}


@pytest.mark.slow
@NEED_TOOLCHAIN
def test_status_tables_cover_every_code_of_the_installed_headers(host_checks):
    rows = [json.loads(line) for line in _run_host(host_checks, "tables").stdout.splitlines()]
    table = {(r["library"], r["name"]): (r["code"], r["verdict"]) for r in rows if "name" in r}
    cudnn_codes = _header_enum(_wheel_dir("nvidia.cudnn") / "include" / "cudnn_graph.h", "cudnnStatus_t")
    cublas_codes = _header_enum(_wheel_dir("nvidia.cu13") / "include" / "cublas_api.h", "cublasStatus_t")
    assert len(cudnn_codes) > 40 and "CUDNN_STATUS_NOT_SUPPORTED_SHAPE" in cudnn_codes
    for library, codes in (("cudnn", cudnn_codes), ("cublas", cublas_codes)):
        for name, code in codes.items():
            if code == 0:
                continue
            assert table.get((library, name), (None,))[0] == code, f"{name} = {code} missing from the table"
    assert len(table) == sum(1 for c in (*cudnn_codes.values(), *cublas_codes.values()) if c)

    verdict = {name: v for (_, name), (_, v) in table.items()}
    # docs/gpu.md shows the same table
    import re

    documented = dict(re.findall(r"^\| `(\w+)[^`]*` \| (unsupported|failed) \|", (REPO / "docs" / "gpu.md").read_text(),
                                 re.MULTILINE))
    assert documented == verdict
    # The library refusing the configuration ...
    for name in ("CUDNN_STATUS_NOT_SUPPORTED", "CUDNN_STATUS_NOT_SUPPORTED_SHAPE",
                 "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE", "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT",
                 "CUDNN_STATUS_NOT_SUPPORTED_PADDING", "CUDNN_STATUS_BAD_PARAM",
                 "CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH", "CUBLAS_STATUS_NOT_SUPPORTED"):
        assert verdict[name] == "unsupported", name
    # ... versus harness bugs and the environment.
    for name in ("CUDNN_STATUS_BAD_PARAM_NULL_POINTER", "CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER",
                 "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH", "CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED",
                 "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER",
                 "CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING",
                 "CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE", "CUDNN_STATUS_INTERNAL_ERROR",
                 "CUDNN_STATUS_EXECUTION_FAILED_CUDART", "CUBLAS_STATUS_INVALID_VALUE",
                 "CUBLAS_STATUS_EXECUTION_FAILED"):
        assert verdict[name] == "failed", name


@pytest.mark.slow
@NEED_TOOLCHAIN
def test_checks_store_status_names_and_refusals_only_as_unsupported(host_checks):
    codes = _header_enum(_wheel_dir("nvidia.cudnn") / "include" / "cudnn_graph.h", "cudnnStatus_t")
    shape = _run_host(host_checks, "cudnn", str(codes["CUDNN_STATUS_NOT_SUPPORTED_SHAPE"])).stdout
    assert shape.startswith("unsupported: ")
    assert "CUDNN_STATUS_NOT_SUPPORTED_SHAPE" in shape
    null = _run_host(host_checks, "cudnn", str(codes["CUDNN_STATUS_BAD_PARAM_NULL_POINTER"])).stdout
    assert null.startswith("failed: ") and "CUDNN_STATUS_BAD_PARAM_NULL_POINTER" in null
    driver = _run_host(host_checks, "cudnn", str(codes["CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER"])).stdout
    assert driver.startswith("failed: ") and "INCOMPATIBLE_CUDA_DRIVER" in driver
    unknown = _run_host(host_checks, "cudnn", "3999").stdout  # a sub-code a newer cuDNN might add
    assert unknown.startswith("failed: ")
    invalid = _run_host(host_checks, "cublas", "7").stdout
    assert invalid.startswith("failed: ") and "CUBLAS_STATUS_INVALID_VALUE" in invalid


def _cuda_errors_header() -> dict[str, tuple[int, str]]:
    """cudaError_t from driver_types.h: name → (value, its documentation comment)."""
    import re

    text = (_toolkit().include / "driver_types.h").read_text()
    body = text[text.index("enum __device_builtin__ cudaError"):]
    body = body[:body.index("};")]
    return {m.group(2): (int(m.group(3)), " ".join(m.group(1).replace("*", " ").split()))
            for m in re.finditer(r"/\*\*(.*?)\*/\s*(cudaError\w+)\s*=\s*(\d+)", body, re.DOTALL)}


@pytest.mark.slow
@NEED_TOOLCHAIN
def test_every_error_the_cuda_header_calls_fatal_aborts(host_checks):
    rows = [json.loads(line) for line in _run_host(host_checks, "tables").stdout.splitlines()]
    sticky = {r["code"] for r in rows if r.get("sticky")}
    errors = _cuda_errors_header()
    documented = {code for code, doc in errors.values() if "terminated and relaunched" in doc}
    assert errors["cudaErrorIllegalAddress"][0] in documented and len(documented) >= 10
    assert documented <= sticky

    illegal = _run_host(host_checks, "cuda", str(errors["cudaErrorIllegalAddress"][0]))
    assert illegal.returncode == -signal.SIGABRT
    assert illegal.stdout == ""  # not stored as an ordinary failure: the process ends
    assert "cudaErrorIllegalAddress" in illegal.stderr and "sticky CUDA error" in illegal.stderr
    oom = _run_host(host_checks, "cuda", str(errors["cudaErrorMemoryAllocation"][0]))
    assert oom.returncode == 0 and oom.stdout.startswith("failed: ") and "cudaErrorMemoryAllocation" in oom.stdout


@pytest.mark.slow  # compiles the host checks (the `host_checks` fixture)
@NEED_TOOLCHAIN
def test_cupti_records_without_an_end_are_not_durations(host_checks):
    assert _run_host(host_checks, "duration", "1000", "1750").stdout.split() == ["750"]
    for start, end in (("1000", "0"), ("0", "500"), ("2000", "1000")):
        # unsigned end - start would be ~1.8e19 ns here
        assert _run_host(host_checks, "duration", start, end).stdout.split() == ["incomplete"]


@pytest.mark.slow  # compiles the host checks (the `host_checks` fixture)
@NEED_TOOLCHAIN
def test_repetitions_are_sized_by_gpu_time(host_checks):
    def plan(*args: float) -> tuple[int, float]:
        calls, delay = _run_host(host_checks, "plan", *map(str, args)).stdout.split()
        return int(calls), float(delay)

    # 10 us calls fill 1 ms with 100 of them; the hold covers twice their 5 us of host time + 20 us
    assert plan(1.0, 0.010, 5.0, 1000) == (100, 2 * 100 * 5.0 + 20)
    assert plan(1.0, 3.0, 5.0, 1000) == (1, 30.0)  # a call longer than the target: one
    assert plan(1.0, 0.0001, 1.0, 1000)[0] == 1000  # capped
    assert plan(1.0, 0.001, 100.0, 1000) == (1000, 20000.0)  # the hold is capped too
    assert plan(0.0, 0.01, 5.0, 1000) == (1, 30.0)  # CUPTI mode: one call per iteration


@pytest.mark.slow
@NEED_TOOLCHAIN
def test_sticky_error_aborts_and_the_runner_restarts_after_it(tmp_path):
    """The real runtime and check_cuda in a stand-in binary: the faulting benchmark is stored as
    failed with the abort line, and the runner restarts the binary for the benchmarks after it."""
    import os

    from benanza.perfdb import PerfDB
    from benanza.records import Status, System
    from benanza.runner import RunOptions, RunSummary, _execute

    cudnn_src = RUNTIME / "cudnn"
    binary = _host_compile(tmp_path / "benanza_bench", HOST_SOURCES / "sticky_standin.cpp",
                           RUNTIME / "common" / "benanza" / "runtime.cpp", cudnn_src / "core.cpp",
                           cudnn_src / "status.cpp")
    variants = [Variant.of_key(f"eltwise:relu_in1x{n}_f32", "cudnn", "cudnnActivationForward") for n in (8, 16, 32)]
    env = dict(os.environ, STANDIN_NAMES=",".join(v.name for v in variants), STANDIN_STICKY=variants[1].name)
    system = System("gpu-box", "cudnn", "stand-in", (("cuda", "13.0"),))
    summary = RunSummary(system, "cudnn", tmp_path / "r.db", total=3, already=0)
    with PerfDB(tmp_path / "r.db") as db:
        _execute(binary, variants, env, RunOptions(timeout=30, repetitions=1), db, system, summary, None)
        results = {r.variant.name: r for r in db.results("gpu-box")}
    assert [results[v.name].status for v in variants] == [Status.OK, Status.FAILED, Status.OK]
    message = results[variants[1].name].message
    assert "SIGABRT" in message and "cudaErrorIllegalAddress" in message and "sticky CUDA error" in message


# --- the GPU kit's results page (the kit itself: tests/scripts/test_gpukit.py) ----------------------------

@pytest.mark.slow
@NEED_TOOLCHAIN
def test_gpu_results_page_renders_what_the_pipeline_stored(tmp_path, save, cudnn_runtime):
    """generate → real cuDNN binary (no GPU here: every variant fails) → runner → database →
    `benanza analyze --json` → gpu-results.py: the page's counts are the database's."""
    import os
    import sys

    from click.testing import CliRunner

    from benanza.cli import main
    from benanza.perfdb import PerfDB
    from benanza.records import System
    from benanza.runner import RunOptions, RunSummary, _execute

    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])]
    path = save(model(nodes, [io("x", [1, 4, 8, 8])], [io("y", None)], [tensor("W", (4, 4, 3, 3))]), "cr.onnx")
    loaded = load_model(path)
    manifest = build_manifest([loaded], unique_layers([loaded]))
    g = generate(manifest, "cudnn", tmp_path / "bench", GenOptions(dtypes=("f32",), layouts=("nchw",)))
    binary = _build(g.out_dir, runtime=cudnn_runtime)
    db_path = tmp_path / "gpu.db"
    # named as CUDA names an H100, so the page sets the stored peaks beside that GPU's datasheet
    system = System("ci-gpu", "cudnn", "NVIDIA H100 80GB HBM3", (("cuda", "13"),))
    summary = RunSummary(system, "cudnn", db_path, total=len(g.variants), already=0)
    from benanza.peaks import Peak, Peaks

    with PerfDB(db_path) as db:
        db.record_models(manifest)
        db.upsert_system(system)
        db.store_peaks(system, Peaks((Peak("gemm", 700e12, 8192, dtype="f16"),
                                      Peak("bandwidth", 3.0e12, 400 << 20, level="DRAM")),
                                     (("s8", "cuBLAS: CUBLAS_STATUS_NOT_SUPPORTED"),)))
        _execute(binary, g.variants, dict(os.environ), RunOptions(timeout=120, repetitions=1), db, system,
                 summary, None)
    assert summary.failed == len(g.variants)

    analysis = CliRunner().invoke(main, ["analyze", str(path), "--system", "ci-gpu", "--db", str(db_path), "--json",
                                         "--measured-ms", "0.5"])
    assert analysis.exit_code == 0, analysis.output
    (tmp_path / "a.json").write_text(analysis.stdout)
    doc = json.loads(analysis.stdout)["analyses"][0]
    page = tmp_path / "results.md"
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu-results.py"), "--db", str(db_path),
                           "--system", "ci-gpu", "--out", str(page), "--campaign-seconds", "12",
                           "--note", "a note", str(tmp_path / "a.json")], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr
    text = page.read_text()
    apis = Counter(v.api for v in g.variants)
    for api, n in apis.items():
        assert f"| {api} | {n} | 0 | 0 | {n} |" in text
    assert f"| **all** | {len(g.variants)} | 0 | 0 | {len(g.variants)} |" in text
    assert "**12 s**" in text and "- a note" in text
    missing = len(doc["coverage"]["missing"])
    assert missing == 2  # conv and relu: every variant failed, so no layer has a result
    sol = doc["speed_of_light"]
    flagged = str(len(sol["impossible"])) if sol else "—"  # results faster than their roofline
    assert (f"| cr | {doc['batch_size']} | {doc['math']} | f32 | 0.500 | 0.000 | 0.000 | 0.00 | 0.00 | yes | "
            f"{missing} | 0 | {flagged} |") in text
    assert _says_no_gpu(text)
    assert "No convolution results." in text
    # measured / datasheet, recomputed: 700 of H100 SXM's 989.4 dense f16 TFLOP/s, 3000 of its 3350 GB/s
    assert "| GEMM f16 | 700.0 TFLOP/s | 8192³ | 989.4 TFLOP/s | 0.71 |" in text
    assert "| bandwidth DRAM | 3000 GB/s | 400 MiB | 3350 GB/s | 0.90 |" in text
    assert "| GEMM s8 | not run: cuBLAS: CUBLAS_STATUS_NOT_SUPPORTED |" in text
