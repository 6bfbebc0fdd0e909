"""Layers audio, detection and OCR models hold, on the cuDNN backend: a transposed convolution
(2-D and 1-D) as cudnnConvolutionBackwardData, 1-D and global pooling as cudnnPoolingForward,
a zero Pad as cudnnTransformTensorEx, HardSigmoid as a graph-API pointwise chain, a Resize by 2
as the graph API's resample node. Checked on
ONNX's own backend test cases (the onnx wheel's models and expected outputs, which nobody here
wrote) and on ONNX Runtime's outputs. There is no GPU here: each generated table row is
replayed in NumPy with the semantics of the cuDNN call it feeds and compared with the expected
output, and the generated project compiles, links and reports every benchmark with the CUDA
error, none refused by cuDNN's own shape checks."""

from __future__ import annotations

import json
import re
import subprocess
import warnings
from fractions import Fraction
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from helpers import io, model
from onnx import helper, numpy_helper

from benanza.backends.cudnn import DECONV_ALGOS
from benanza.cli import main
from benanza.generator import GenOptions, generate
from benanza.layers import unique_layers
from benanza.manifest import build_manifest
from benanza.model_stats import model_stats
from benanza.processor import load_model
from tests.backends.test_cudnn import NEED_TOOLCHAIN, _build, _lines, _rows, _run_without_gpu

# the cases each lowering covers exactly; 3-D ones (generic) and SAME-padded transposed
# convolutions (below) are not covered
DECONV_CASES = ("test_convtranspose", "test_convtranspose_1d", "test_convtranspose_dilations",
                "test_convtranspose_group_2", "test_convtranspose_group_2_image_3", "test_convtranspose_kernel_shape",
                "test_convtranspose_output_shape", "test_convtranspose_pad", "test_convtranspose_pads")
POOL_CASES = ("test_maxpool_1d_default", "test_averagepool_1d_default", "test_globalmaxpool",
              "test_globalmaxpool_precomputed", "test_globalaveragepool", "test_globalaveragepool_precomputed")
HARDSIGMOID_CASES = ("test_hardsigmoid", "test_hardsigmoid_default", "test_hardsigmoid_example")
# Resize by 2 on both spatial dims (covered), by 2×3, 0.6 and to 7×8 (not covered)
RESIZE_CASES = ("test_resize_upsample_scales_linear", "test_resize_upsample_scales_linear_align_corners")
RESIZE_GAPS = ("test_resize_upsample_scales_nearest", "test_resize_downsample_scales_linear",
               "test_resize_upsample_sizes_nearest")
ALL_CASES = DECONV_CASES + POOL_CASES + HARDSIGMOID_CASES + RESIZE_CASES + RESIZE_GAPS + (
    "test_convtranspose_autopad_same",)


def backend_cases(names: tuple[str, ...] = ALL_CASES) -> dict:
    """ONNX's backend test cases of these names (models and expected outputs), from the onnx wheel."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the case code's own overflow warnings
        return {c.name: c for c in collect_testcases(None) if c.name in names}


def with_constant_inputs(case) -> onnx.ModelProto:
    """The case's model with every input but the first an initializer holding the case's own value,
    as exporters write a Resize's scales or sizes and a Pad's pads (the backend suite feeds them)."""
    m = onnx.ModelProto()
    m.CopyFrom(case.model)
    inputs, _ = case.data_sets[0]
    graph = m.graph
    for info, value in zip(list(graph.input)[1:], inputs[1:]):
        graph.initializer.append(numpy_helper.from_array(value, info.name))
    del graph.input[1:]
    return m


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """Every case's model at its own batch, and the Pads below, generated for cuDNN in f32."""
    tmp = tmp_path_factory.mktemp("coverage")
    cases = backend_cases()
    models = {"pads": load_model(pad_model(tmp / "pads.onnx")), "yolo": load_model(upsample_model(tmp / "up.onnx"))}
    for name in DECONV_CASES + POOL_CASES + HARDSIGMOID_CASES + RESIZE_CASES:
        c = cases[name]
        path = tmp / f"{name}.onnx"
        onnx.save(with_constant_inputs(c) if name in RESIZE_CASES else c.model, str(path))
        models[name] = load_model(path, batch_size=c.data_sets[0][0][0].shape[0])
    manifest = build_manifest(list(models.values()), unique_layers(list(models.values())))
    gen = generate(manifest, "cudnn", tmp / "bench", GenOptions(dtypes=("f32",)))
    return cases, models, gen


def _backward_data(dy: np.ndarray, w: np.ndarray, row: dict[str, list[int]]) -> np.ndarray:
    """cuDNN's backward-data convolution (cross-correlation mode) as the row describes it: dx at
    i gathers dy at o times the weight at tap t wherever o·stride + t·dilation − pad = i, the
    descriptor's pad alike on both ends."""
    f = {k: v[0] for k, v in row.items()}
    n, c, h, wd, k, g = f["n"], f["c"], f["h"], f["w"], f["k"], f["groups"]
    dy = dy.reshape(n, c, h, wd).astype(np.float64)
    w = w.reshape(c, k // g, f["r"], f["s"]).astype(np.float64)
    dx = np.zeros((n, k, f["out_h"], f["out_w"]))
    cg, kg = c // g, k // g
    for oy in range(h):
        for ox in range(wd):
            for ty in range(f["r"]):
                for tx in range(f["s"]):
                    iy = oy * f["stride_h"] + ty * f["dil_h"] - f["pad_t"]
                    ix = ox * f["stride_w"] + tx * f["dil_w"] - f["pad_l"]
                    if 0 <= iy < f["out_h"] and 0 <= ix < f["out_w"]:
                        for gi in range(g):
                            dx[:, gi * kg:(gi + 1) * kg, iy, ix] += (dy[:, gi * cg:(gi + 1) * cg, oy, ox]
                                                                     @ w[gi * cg:(gi + 1) * cg, :, ty, tx])
    return dx


def test_transposed_convolutions_are_covered_and_their_rows_compute_onnx_outputs(generated):
    cases, models, gen = generated
    rows = _rows(gen.out_dir / "tables_deconv_0.cpp")
    for name in DECONV_CASES:
        (node,) = models[name].nodes
        assert node.layer.cudnn_api == "cudnnConvolutionBackwardData", name
        assert model_stats(models[name]).backend("cudnn").not_covered == (), name
        row = rows[node.layer.problem.text()]
        inputs, (want,) = cases[name].data_sets[0]
        x, w = inputs[0], inputs[1]
        # the row's input and output are the case's (a 1-D one's with height 1)
        assert [row[k][0] for k in ("n", "c", "h", "w")] == list(x.shape[:2]) + [1] * (4 - x.ndim) + list(x.shape[2:])
        assert [row[k][0] for k in ("k", "out_h", "out_w")] == [want.shape[1]] + [1] * (4 - want.ndim) + list(
            want.shape[2:]), name
        # what the runtime asks cuDNN before timing: the forward convolution of dx gives dy back
        for out, pad, tap, dil, stride, size in (("out_h", "pad_t", "r", "dil_h", "stride_h", "h"),
                                                 ("out_w", "pad_l", "s", "dil_w", "stride_w", "w")):
            span = (row[tap][0] - 1) * row[dil][0] + 1
            assert (row[out][0] + 2 * row[pad][0] - span) // row[stride][0] + 1 == row[size][0], name
        got = _backward_data(x, w, row)
        np.testing.assert_allclose(got, want.reshape(got.shape), rtol=1e-5, atol=1e-5, err_msg=name)


def test_transposed_convolution_variants_index_the_backward_data_enum(generated):
    """Each layer gets every backward-data algorithm in each layout, numbered as
    cudnnConvolutionBwdDataAlgo_t (FFT is 2 there, 4 among the forward algorithms)."""
    _, models, gen = generated
    deconv = [v for v in gen.variants if v.problem.family == "deconv"]
    keys = {n.layer.problem for name in DECONV_CASES for n in models[name].nodes}
    assert len(deconv) == len(keys) * len(DECONV_ALGOS) * 2
    text = (gen.out_dir / "tables_deconv_0.cpp").read_text()
    named = re.findall(r'algo=(\w+)/[^"]*", \.layer = \d+, \.call = kCall, \.algo = (\d+)', text)
    assert len(named) == len(deconv)
    assert all(DECONV_ALGOS[int(index)] == algo for algo, index in named)
    assert "benanza::cudnn::add_deconv(r, kLayers, kVariants" in text


def _pool(x: np.ndarray, row: dict[str, list[int]], op) -> np.ndarray:
    """cuDNN's pooling of an unpadded row: ``op`` over each kh × kw window at the strides."""
    f = {k: v[0] for k, v in row.items()}
    x = x.reshape(f["n"], f["c"], f["h"], f["w"])
    return np.stack([np.stack([op(x[:, :, i * f["stride_h"]:i * f["stride_h"] + f["kh"],
                                    j * f["stride_w"]:j * f["stride_w"] + f["kw"]], axis=(2, 3))
                               for j in range(f["out_w"])], axis=-1) for i in range(f["out_h"])], axis=-2)


def test_one_d_and_global_pooling_rows_compute_onnx_outputs(generated):
    """A 1-D pooling is the pooling of height 1; a global one's window is the input's spatial
    size, its output 1 × 1."""
    cases, models, gen = generated
    text = (gen.out_dir / "tables_pool_0.cpp").read_text()
    rows = _rows(gen.out_dir / "tables_pool_0.cpp")
    for name in POOL_CASES:
        (node,) = models[name].nodes
        key = node.layer.problem.text()
        assert node.layer.cudnn_api == "cudnnPoolingForward", name
        row = rows[key]
        (x,), (want,) = cases[name].data_sets[0]
        if name.startswith("test_global"):
            assert [row["kh"][0], row["kw"][0]] == list(x.shape[2:]) and [row["out_h"][0], row["out_w"][0]] == [1, 1]
        assert [row[p][0] for p in ("pad_t", "pad_l", "pad_b", "pad_r")] == [0, 0, 0, 0], name
        mode = re.search(r"\{\.mode = PoolMode::(\w+), [^\n]*// " + re.escape(key) + r"\s*$", text, re.M).group(1)
        assert mode == ("Max" if "max" in name else "AvgExcludePad"), name
        got = _pool(x, row, np.max if mode == "Max" else np.mean)
        np.testing.assert_allclose(got, want.reshape(got.shape), rtol=1e-5, atol=1e-6, err_msg=name)


def test_hardsigmoid_rows_compute_onnx_outputs(generated):
    """HardSigmoid is a graph-API chain (alpha·x, + beta, a ReLU clipped to [0, 1]) whose scalars
    are the node's: replayed in NumPy, it gives ONNX's expected output."""
    cases, models, gen = generated
    text = (gen.out_dir / "tables_pointwise_0.cpp").read_text()
    for name in HARDSIGMOID_CASES:
        (node,) = models[name].nodes
        assert node.layer.cudnn_api == "cudnn_frontend.pointwise", name
        attrs = {a.name: a.f for a in cases[name].model.graph.node[0].attribute}
        line = re.search(r"\{\.op = PointwiseOp::HardSigmoid, [^\n]*// " + re.escape(node.layer.problem.text())
                         + r"\s*$", text, re.M).group(0)
        alpha, beta = (float(re.search(rf"\.{f} = ([-\d.e]+)", line).group(1)) for f in ("alpha", "beta"))
        assert (alpha, beta) == pytest.approx((attrs.get("alpha", 0.2), attrs.get("beta", 0.5)), rel=1e-7), name
        (x,), (want,) = cases[name].data_sets[0]
        got = np.maximum(0, np.minimum(1, np.float32(alpha) * x + np.float32(beta)))
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=name)


def test_a_transposed_convolution_cudnn_cannot_pad_is_not_covered_with_its_reason(tmp_path):
    """SAME_UPPER with an odd total pads the end more than the begin: cuDNN's descriptor pads
    both alike, so the layer is counted not covered on cuDNN and `generate` says why; oneDNN
    still runs it."""
    path = tmp_path / "same.onnx"
    onnx.save(backend_cases()["test_convtranspose_autopad_same"].model, str(path))
    r = CliRunner().invoke(main, ["generate", str(path), "--out", str(tmp_path / "b"), "--backend", "cudnn"])
    assert r.exit_code == 0, r.output
    (line,) = [ln for ln in r.stdout.splitlines() if "not covered by cudnn:" in ln]
    assert "pads begin 0,0 end 1,1 (cuDNN's backward-data convolution pads both ends alike" in line
    r = CliRunner().invoke(main, ["generate", str(path), "--out", str(tmp_path / "j"), "--backend", "cudnn",
                                  "--json"])
    backends = json.loads(r.stdout)["total"]["backends"]
    assert backends["cudnn"]["not_covered"] == {"ConvTranspose": 1} and backends["onednn"]["not_covered"] == {}


@pytest.mark.slow
@NEED_TOOLCHAIN
def test_the_generated_project_builds_and_reports_every_benchmark_without_a_gpu(generated, cudnn_runtime):
    """nvcc/g++ against the cuDNN wheel's headers: the backward-data and padding runtime
    compiles and links, and without a GPU every benchmark fails with the CUDA error; no
    transposed convolution is refused by the shape check cuDNN makes before the device is
    needed (a Pad's transform descriptor needs the device to load)."""
    _, _, gen = generated
    assert {v.problem.family for v in gen.variants} == {"deconv", "pool", "pad", "eltwise", "resample"}
    binary = _build(gen.out_dir, runtime=cudnn_runtime)
    listed = subprocess.run([str(binary), "--benanza_list"], capture_output=True, text=True, check=True)
    assert sorted(listed.stdout.split()) == sorted(v.name for v in gen.variants)
    _run_without_gpu(binary, gen.variants)
    # the frontend validates the HardSigmoid and resample graphs (one per layer in f32) for an
    # sm_90 GPU without one
    done = subprocess.run([str(binary), "--benanza_check_graphs=90"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    graphs = _lines(done.stdout, "BENANZA_GRAPH")
    resample = {v.problem for v in gen.variants if v.problem.family == "resample"}
    assert len(graphs) == len(HARDSIGMOID_CASES) + len(resample) and all(g["ok"] for g in graphs), graphs


def pad_model(path: Path) -> Path:
    """Pads a detector or an audio model holds, zero-padded (covered) and otherwise (not):
    asymmetric spatial pads of NCHW data, a 3-d one on the time axis, opset 18's axes with the
    constant 0 given, and reflect, a non-zero constant and a crop."""
    def pads(name, values):
        return numpy_helper.from_array(np.array(values, np.int64), name)

    n = helper.make_node
    nodes = [n("Pad", ["x", "p_yolo"], ["y_yolo"], name="yolo"),
             n("Pad", ["a", "p_audio"], ["y_audio"], name="audio"),
             n("Pad", ["x", "p_axes", "zero", "axes"], ["y_axes"], name="axes"),
             n("Pad", ["x", "p_yolo"], ["y_reflect"], mode="reflect", name="reflect"),
             n("Pad", ["x", "p_yolo", "half"], ["y_value"], name="value"),
             n("Pad", ["x", "p_crop"], ["y_crop"], name="crop")]
    inits = [pads("p_yolo", [0, 0, 0, 0, 0, 0, 1, 1]), pads("p_audio", [0, 0, 2, 0, 0, 3]),
             pads("p_axes", [1, 2]), pads("axes", [-1]), pads("p_crop", [0, 0, 1, 1, 0, 0, -1, 0]),
             numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
             numpy_helper.from_array(np.array(1.5, np.float32), "half")]
    outs = ("y_yolo", "y_audio", "y_axes", "y_reflect", "y_value", "y_crop")
    onnx.save(model(nodes, [io("x", [1, 3, 6, 6]), io("a", [2, 4, 10])], [io(o, None) for o in outs], inits,
                    opset=18), str(path))
    return path


def test_zero_pads_are_covered_and_their_rows_pad_as_onnx_runtime_does(tmp_path):
    """Each covered Pad's row (right-aligned to 4 dims) pads ONNX Runtime's input with zeros into
    ONNX Runtime's output; the other Pads are not covered on cuDNN, each with its reason."""
    import onnxruntime as ort

    path = pad_model(tmp_path / "pads.onnx")
    m = load_model(path)
    covered = {n.name: n.layer for n in m.nodes if n.layer.cudnn_api == "cudnnTransformTensorEx"}
    assert set(covered) == {"yolo", "audio", "axes"}
    assert {n.name for n in m.nodes if n.layer.onednn_primitive is not None} == set(covered)
    manifest = build_manifest([m], unique_layers([m]))
    gen = generate(manifest, "cudnn", tmp_path / "bench", GenOptions(dtypes=("f32",)))
    rows = _rows(gen.out_dir / "tables_pad_0.cpp")
    rng = np.random.default_rng(3)
    feeds = {"x": rng.standard_normal((1, 3, 6, 6)).astype(np.float32),
             "a": rng.standard_normal((2, 4, 10)).astype(np.float32)}
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    real = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    proto = {n.name: n for n in onnx.load(str(path)).graph.node}
    for name, layer in covered.items():
        row = rows[layer.problem.text()]
        rank = row["rank"][0]
        src, before, after = (row[f][:rank] for f in ("src", "before", "after"))
        x = feeds[proto[name].input[0]]
        assert src == [1] * (rank - x.ndim) + list(x.shape), name
        want = real[proto[name].output[0]]
        got = np.pad(x.reshape(src), list(zip(before, after)))
        np.testing.assert_array_equal(got, want.reshape(got.shape), err_msg=name)
    r = CliRunner().invoke(main, ["generate", str(path), "--out", str(tmp_path / "b"), "--backend", "cudnn"])
    assert r.exit_code == 0, r.output
    reasons = sorted(ln.split(": not covered by cudnn: ", 1)[1] for ln in r.stdout.splitlines()
                     if ": not covered by cudnn: " in ln)
    assert reasons == ["Pad 'crop': negative pads (a crop: cudnnTransformTensorEx only adds)",
                       "Pad 'reflect': mode reflect (cudnnTransformTensorEx pads with zeros only)",
                       "Pad 'value': constant value 1.5 (cudnnTransformTensorEx pads with zeros only)"]


def upsample_model(path: Path) -> Path:
    """A detector's neck upsampling as YOLOv8's and the OCR detectors' exports write it (nearest by
    2, asymmetric, floor) and a decoder's asymmetric bilinear one, by scales and by sizes."""
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    sizes = numpy_helper.from_array(np.array([1, 8, 20, 20], np.int64), "sizes")
    n = helper.make_node
    nodes = [n("Resize", ["x", "", "scales"], ["y_nearest"], mode="nearest",
               coordinate_transformation_mode="asymmetric", nearest_mode="floor", name="nearest"),
             n("Resize", ["x", "", "", "sizes"], ["y_linear"], mode="linear",
               coordinate_transformation_mode="asymmetric", name="linear")]
    onnx.save(model(nodes, [io("x", [1, 8, 10, 10])], [io("y_nearest", None), io("y_linear", None)],
                    [scales, sizes], opset=17), str(path))
    return path


def _resampled(x: np.ndarray, row: dict[str, list[int]], linear: bool) -> np.ndarray:
    """The resample node of the runtime's configuration (graph.cpp): output i samples the input at
    i·(1/2) − 1/2 + 2/2 − 1/2 = i/2, clamped to the input; nearest takes the sample rounded down
    (a half-way sample's rounding is cuDNN's, undocumented), bilinear weighs the two pixels either
    side of it by distance, per spatial dim."""
    f = {k: v[0] for k, v in row.items()}
    x = x.reshape(f["n"], f["c"], f["h"], f["w"]).astype(np.float64)

    def taps(out: int, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        at = np.minimum(np.arange(out) / 2, size - 1)
        lo = np.floor(at).astype(int)
        return lo, np.minimum(lo + 1, size - 1), at - lo

    (y0, y1, fy), (x0, x1, fx) = taps(f["out_h"], f["h"]), taps(f["out_w"], f["w"])
    if not linear:
        return x[:, :, y0][:, :, :, x0]
    rows = x[:, :, y0] * (1 - fy)[:, None] + x[:, :, y1] * fy[:, None]
    return rows[..., x0] * (1 - fx) + rows[..., x1] * fx


def test_resize_by_two_is_a_resample_node_whose_rows_compute_onnx_runtimes_outputs(generated):
    """YOLOv8's nearest upsampling and an asymmetric bilinear one are covered on cuDNN; each row,
    replayed with the resample node's sampling, gives ONNX Runtime's output. ONNX's own linear
    cases by 2 (half_pixel, align_corners) are covered too: their rows name their shapes; they
    sample a quarter pixel (or less) away from the node, which moves no work."""
    import onnxruntime as ort

    cases, models, gen = generated
    rows = _rows(gen.out_dir / "tables_resample_0.cpp")
    text = (gen.out_dir / "tables_resample_0.cpp").read_text()
    up = models["yolo"]
    sess = ort.InferenceSession(str(up.path), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(5).standard_normal((1, 8, 10, 10)).astype(np.float32)
    real = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"x": x})))
    for node in up.nodes:
        assert node.layer.cudnn_api == "cudnn_frontend.resample", node.name
        key = node.layer.problem.text()
        row = rows[key]
        linear = re.search(r"\{\.linear = (true|false), [^\n]*// " + re.escape(key) + r"\s*$", text, re.M).group(1)
        assert linear == ("true" if node.name == "linear" else "false")
        # cuDNN's output size with the node's fractions: 1 + (in + 1/2 + 1 − 2) / (1/2) = 2·in
        for size, out in (("h", "out_h"), ("w", "out_w")):
            assert 1 + (Fraction(row[size][0]) + Fraction(1, 2) + 1 - 2) / Fraction(1, 2) == row[out][0]
        got = _resampled(x, row, node.name == "linear")
        np.testing.assert_allclose(got, real[f"y_{node.name}"], rtol=1e-6, atol=1e-6, err_msg=node.name)
    for name in RESIZE_CASES:
        (node,) = models[name].nodes
        assert node.layer.cudnn_api == "cudnn_frontend.resample", name
        (x, *_), (want,) = cases[name].data_sets[0]
        row = rows[node.layer.problem.text()]
        assert [row[k][0] for k in ("n", "c", "h", "w")] == list(x.shape), name
        assert [row[k][0] for k in ("out_h", "out_w")] == list(want.shape[2:]), name
    assert model_stats(up).backend("cudnn").not_covered == ()


def test_resize_by_other_scales_is_not_covered_on_cudnn_with_its_reason(tmp_path):
    """ONNX's nearest upsampling by 2×3 and to 7×8 and its linear downsampling by 0.6: oneDNN
    resamples them; cuDNN's resample engines upsample by 2 only, which `generate` says."""
    cases = backend_cases(RESIZE_GAPS)
    paths = []
    for name in RESIZE_GAPS:
        paths.append(tmp_path / f"{name}.onnx")
        onnx.save(with_constant_inputs(cases[name]), str(paths[-1]))
        (node,) = load_model(paths[-1]).nodes
        assert node.layer.cudnn_api is None and node.layer.onednn_primitive == "resampling", name
    r = CliRunner().invoke(main, ["generate", *map(str, paths), "--out", str(tmp_path / "b"), "--backend", "cudnn"])
    assert r.exit_code == 0, r.output
    reasons = sorted(ln.split(": not covered by cudnn: Resize ", 1)[1].split(": ", 1)[1] for ln in r.stdout.splitlines()
                     if ": not covered by cudnn: " in ln)
    because = "(cuDNN's resample engines upsample by 2 on both spatial dims only: window 2, strides 1/2)"
    assert reasons == [f"scale 0.5×0.5 {because}", f"scale 2×3 {because}", f"scale 3.5×4 {because}"]


def test_the_cases_exist_in_the_installed_onnx():
    assert set(ALL_CASES) == set(backend_cases()), Path(onnx.__file__).parent
