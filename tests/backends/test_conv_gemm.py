"""A 1x1 convolution as a cuBLASLt GEMM on the cuDNN backend: which convolutions get the
cublasLtMatmul variants (ResNet-50's, and a small model's look-alikes that must not), the calls
and rows they run on, and the geometry: the generated row replayed the way blas.cpp hands it to
cublasLtMatmul (column-major, strided batches) on random NCHW data, against NumPy's convolution
of the same layer. There is no GPU here: what cuBLASLt's heuristic offers for these GEMMs, and
how fast they run, is not tested."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import io, model, tensor
from onnx import helper

from benanza.backends import cudnn
from benanza.generator import GenOptions, generate
from benanza.layers import unique_layers
from benanza.manifest import build_manifest
from benanza.ort_fusions import benchmarked_by
from benanza.problems import ConvProblem
from benanza.processor import load_model
from benanza.records import Variant
from tests.backends.test_cudnn import NEED_TOOLCHAIN, _build, _one_gemm, _run_without_gpu
from tests.backends.test_gemm_epilogues import _table_rows

F32 = GenOptions(dtypes=("f32",))


def _generated(models, out: Path, options: GenOptions = F32):
    manifest = build_manifest(models, unique_layers(models))
    return manifest, generate(manifest, "cudnn", out, options)


def _conv_gemms(variants: list[Variant]) -> dict[ConvProblem, list[Variant]]:
    out: dict[ConvProblem, list[Variant]] = {}
    for v in variants:
        if v.api == cudnn.LT_API and isinstance(v.problem, ConvProblem):
            out.setdefault(v.problem, []).append(v)
    return out


# --- which convolutions --------------------------------------------------------------------

@pytest.fixture(scope="module")
def resnet(zoo_model) -> Path:
    return zoo_model("resnet50-v1")


def test_resnet50_gets_gemm_variants_for_its_stride_1_1x1_convolutions_only(resnet, tmp_path):
    m = load_model(resnet)
    manifest, g = _generated([m], tmp_path, GenOptions())
    convs = [u.layer.problem for u in manifest.layers if isinstance(u.layer.problem, ConvProblem)]
    gemms = _conv_gemms(g.variants)
    qualifying = [p for p in convs if _one_gemm(p)]
    assert set(gemms) == set(qualifying)
    # ResNet-50 holds both kinds that must not: its downsampling 1x1 convolutions of stride 2 and
    # its padded 3x3 and 7x7 ones
    assert any(p.kh == 1 and p.sh == 2 for p in convs) and any(p.kh == 3 for p in convs)
    assert len(qualifying) >= 10
    fusions = {(f.layer, f.pattern) for f in manifest.fusions}
    for p, vs in gemms.items():
        key = next(u.layer.key for u in manifest.layers if u.layer.problem == p)
        # every heuristic rank, in f32 and f16 with their default math, unfused and per fusion of the
        # layer, in NCHW only
        patterns = {pat for layer, pat in fusions if layer == key and benchmarked_by(pat, cudnn.NAME)}
        assert {(v.algo, v.dtype, v.math, v.fusion) for v in vs} == {
            (a, d, cudnn.DEFAULT_MATH[d], f) for a in cudnn.LT_ALGOS for d in ("f32", "f16")
            for f in {"none"} | patterns}
        assert {v.layout for v in vs} == {"nchw"}
        assert all(Variant.from_name(v.name) == v for v in vs)


def _look_alikes():
    """1x1 convolutions that are matrix products (plain; its own bias then Relu; dilated; then a
    BatchNorm and Relu), and those that are not (stride 2, padded, grouped), and a 3x3; a
    rectangular image of 3 channels more than output channels, so no transpose passes unseen."""
    ic, oc = 11, 8
    inits = [tensor("W", (oc, ic, 1, 1)), tensor("B", (oc,)), tensor("Wb", (oc, ic, 1, 1)),
             tensor("Wd", (oc, ic, 1, 1)), tensor("Wn", (oc, ic, 1, 1)), tensor("Ws", (oc, ic, 1, 1)),
             tensor("Wp", (oc, ic, 1, 1)), tensor("Wg", (oc, 1, 1, 1)), tensor("W3", (oc, ic, 3, 3)),
             tensor("scale", (oc,), 1.0), tensor("shift", (oc,), 0.0), tensor("mean", (oc,), 0.0),
             tensor("var", (oc,), 1.0)]
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "W"], ["plain"]),
        n("Conv", ["x", "Wb", "B"], ["biased"]), n("Relu", ["biased"], ["biased_r"]),
        n("Conv", ["x", "Wd"], ["dilated"], dilations=[2, 2]),
        n("Conv", ["x", "Wn"], ["bn_in"]), n("BatchNormalization", ["bn_in", "scale", "shift", "mean", "var"], ["bn"]),
        n("Relu", ["bn"], ["bn_r"]),
        n("Conv", ["x", "Ws"], ["strided"], strides=[2, 2]),
        n("Conv", ["x", "Wp"], ["padded"], pads=[1, 1, 1, 1]),
        n("Conv", ["xg", "Wg"], ["grouped"], group=8),
        n("Conv", ["x", "W3"], ["three"], pads=[1, 1, 1, 1]),
    ]
    outs = ["plain", "biased_r", "dilated", "bn_r", "strided", "padded", "grouped", "three"]
    return model(nodes, [io("x", [1, ic, 5, 7]), io("xg", [1, oc, 5, 7])], [io(o, None) for o in outs], inits)


def test_only_the_matrix_products_among_look_alikes(save, tmp_path):
    m = load_model(save(_look_alikes()))
    manifest, g = _generated([m], tmp_path)
    gemms = _conv_gemms(g.variants)
    convs = [u.layer.problem for u in manifest.layers if isinstance(u.layer.problem, ConvProblem)]
    refused = [p for p in convs if not _one_gemm(p)]
    assert {(p.sh, p.pt, p.g, p.kh) for p in refused} == {(2, 0, 1, 1), (1, 1, 1, 1), (1, 0, 8, 1), (1, 1, 1, 3)}
    assert set(gemms) == {p for p in convs if _one_gemm(p)}
    # plain and dilated are one problem apart from dh, dw; the bias one, the BatchNorm one
    assert len(gemms) == 3 and {(p.bias, p.dh) for p in gemms} == {(False, 1), (True, 1), (False, 2)}


def test_calls_and_rows_follow_bias_and_activation(save, tmp_path):
    """Unfused: the conv's own bias as C (beta 1), no epilogue; Conv(bias)→Relu: C and the ReLU
    epilogue; Conv→BN(→Relu): the folded BatchNorm is a bias, so C too."""
    m = load_model(save(_look_alikes()))
    _, g = _generated([m], tmp_path)
    layers, rows = _table_rows(g.out_dir)
    seen = {}
    for r in rows:
        v = Variant.from_name(r["name"])
        if isinstance(v.problem, ConvProblem):
            seen[(v.problem.bias, v.problem.dh, v.fusion)] = (r["call"], float(layers[int(r["layer"])]["beta"]))
    assert seen == {
        (False, 1, "none"): ("kLtGemm", 0.0), (False, 2, "none"): ("kLtGemm", 0.0),
        (True, 1, "none"): ("kLtGemm", 1.0), (True, 1, "bias_relu"): ("kLtRelu", 1.0),
        (False, 1, "bn_relu"): ("kLtRelu", 1.0)}


# --- the geometry: the row as cuBLASLt reads memory ------------------------------------------

def _colmajor(buf: np.ndarray, offset: int, rows: int, cols: int, ld: int) -> np.ndarray:
    """The rows×cols matrix a cuBLASLt layout (column-major, leading dimension ld) names at offset."""
    return buf[offset + np.arange(rows)[:, None] + np.arange(cols)[None, :] * ld]


def _lt_like_the_runtime(layer: dict[str, str], call: str, a: np.ndarray, b: np.ndarray,
                         c: np.ndarray) -> np.ndarray:
    """D as blas.cpp's LtProblem asks cublasLtMatmul for it, from a table row and flat buffers of
    ONNX's A (a), B (b) and C (c; D's own buffer, read in place): Lt's A is ONNX's B with
    TRANSA = trans_b, layout (trans_b ? k : n) × (trans_b ? n : k), ld its rows, batch stride
    b_count > 1 ? k·n : 0; Lt's B is ONNX's A with TRANSB = trans_a, (trans_a ? m : k) ×
    (trans_a ? k : m), stride a_count > 1 ? m·k : 0; D (and C) n × m, ld n, stride m·n;
    D = act(alpha·op(A)·op(B) + beta·C)."""
    m, n, k, batch = (int(layer[f]) for f in ("m", "n", "k", "batch"))
    ta, tb = layer["trans_a"] == "true", layer["trans_b"] == "true"
    a_count, b_count = int(layer["a_count"]), int(layer["b_count"])
    alpha, beta = float(layer["alpha"]), float(layer["beta"])
    lt_a = ((k, n) if tb else (n, k), k * n if b_count > 1 else 0)
    lt_b = ((m, k) if ta else (k, m), m * k if a_count > 1 else 0)
    d = np.empty(batch * m * n, np.float64)
    for i in range(batch):
        (ra, ca), sa = lt_a
        (rb, cb), sb = lt_b
        op_a = _colmajor(b, i * sa, ra, ca, ra)
        op_b = _colmajor(a, i * sb, rb, cb, rb)
        prod = (op_a.T if tb else op_a) @ (op_b.T if ta else op_b)
        assert prod.shape == (n, m)
        out = alpha * prod + beta * _colmajor(c, i * m * n, n, m, n)
        if call == "kLtRelu":
            out = np.maximum(out, 0.0)
        d[i * m * n + np.arange(n)[:, None] + np.arange(m)[None, :] * n] = out
    return d


@pytest.mark.parametrize("batch", [1, 3])
def test_the_row_computes_resnet50s_convolutions(resnet, tmp_path, batch):
    """Every unfused GEMM row of ResNet-50's 1x1 convolutions (and the look-alikes' forms, bias and
    ReLU), replayed on random NCHW data, is the convolution: np.einsum over the same arrays."""
    models = [load_model(resnet, batch_size=batch), load_model(_look_alikes(), batch_size=batch)]
    _, g = _generated(models, tmp_path)
    layers, rows = _table_rows(g.out_dir)
    rng = np.random.default_rng(batch)
    checked = 0
    for r in rows:
        v = Variant.from_name(r["name"])
        p = v.problem
        if not isinstance(p, ConvProblem) or v.algo != "heuristic0":
            continue
        assert p.mb == batch
        x = rng.standard_normal((p.mb, p.ic, p.ih, p.iw))
        w = rng.standard_normal((p.oc, p.ic, 1, 1))
        bias = rng.standard_normal(p.oc)
        adds_bias = float(layers[int(r["layer"])]["beta"]) != 0.0
        want = np.einsum("oi,nihw->nohw", w[:, :, 0, 0], x) + (bias[None, :, None, None] if adds_bias else 0.0)
        if r["call"] == "kLtRelu":
            want = np.maximum(want, 0.0)
        # C holds the bias broadcast over the image, as the benchmark's in-place D stands for
        c = np.broadcast_to(bias[None, :, None, None], want.shape).ravel()
        got = _lt_like_the_runtime(layers[int(r["layer"])], r["call"], w.ravel(), x.ravel(), c)
        np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-10, atol=1e-10)
        checked += 1
    assert checked >= 15


def test_the_replay_tells_wrong_layouts_apart():
    """The oracle is not blind: weights stored transposed, or every image read at the first
    image's offset (a batch stride of 0 where it must be one image), do not give the convolution."""
    rng = np.random.default_rng(0)
    mb, ic, oc, hw = 2, 5, 3, 7
    x, w = rng.standard_normal((mb, ic, hw)), rng.standard_normal((oc, ic))
    row = dict(m=str(oc), n=str(hw), k=str(ic), trans_a="false", trans_b="false", batch=str(mb), a_count="1",
               b_count=str(mb), alpha="1.0", beta="0.0")
    want = np.einsum("oi,nip->nop", w, x)
    c = np.zeros(want.size)

    def replay(layer: dict[str, str], weights: np.ndarray) -> np.ndarray:
        return _lt_like_the_runtime(layer, "kLtGemm", weights.ravel(), x.ravel(), c).reshape(want.shape)

    np.testing.assert_allclose(replay(row, w), want)
    assert not np.allclose(replay(row, w.T.copy()), want)
    assert not np.allclose(replay(dict(row, b_count="1"), w), want)


# --- a real build, run to the clean no-device failure -----------------------------------------

@pytest.mark.slow
@NEED_TOOLCHAIN
def test_conv_gemm_variants_build_and_report_no_gpu(save, tmp_path, cudnn_runtime):
    m = load_model(save(_look_alikes()), batch_size=3)  # batched: the layouts' strided batches compile
    _, g = _generated([m], tmp_path, GenOptions(dtypes=("f32", "f16"), math=("fma", "tf32_allowed", "tensor_op")))
    binary = _build(g.out_dir, runtime=cudnn_runtime)
    gemms = [v for vs in _conv_gemms(g.variants).values() for v in vs]
    assert gemms
    _run_without_gpu(binary, gemms, "--benchmark_filter=cublasLtMatmul")
