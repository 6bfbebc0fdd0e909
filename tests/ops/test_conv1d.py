"""1-D convolutions (audio front ends) are the 2-D convolutions of height 1 they compute, and 1-D
pooling the 2-D pooling of height 1: checked on the PyTorch-exported Conv1d files and the pooling
cases the `onnx` wheel ships with its backend test data (files nobody here wrote), against the
reference outputs shipped beside them and against ONNX Runtime (`benanza check`)."""

from __future__ import annotations

import math
from pathlib import Path

import onnx
import pytest
from helpers import generate_bench
from onnx import numpy_helper

from benanza.backends.base import build
from benanza.check import CheckOptions, CheckStatus, check
from benanza.generator import GenOptions
from benanza.model_stats import model_stats
from benanza.processor import load_model

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data" / "pytorch-converted"
CONV1D = sorted(DATA.glob("test_Conv1d*/model.onnx"))


def _reference_output_shape(path: Path) -> tuple[int, ...]:
    t = onnx.TensorProto()
    t.ParseFromString((path.parent / "test_data_set_0" / "output_0.pb").read_bytes())
    return numpy_helper.to_array(t).shape


def test_the_wheel_ships_the_conv1d_files():
    assert len(CONV1D) >= 8, DATA


@pytest.mark.parametrize("path", CONV1D, ids=lambda p: p.parent.name)
def test_conv1d_is_costed_as_a_conv_both_backends_cover(path):
    """MACs: each output element of the shipped reference output takes (input channels per
    group) × kernel width multiply-adds, the weight's dims read from the file."""
    proto = onnx.load(str(path))
    weight = next(t for t in proto.graph.initializer if len(t.dims) == 3)
    out = _reference_output_shape(path)
    m = load_model(path, batch_size=out[0])  # the batch the reference output was computed at
    (node,) = [n for n in m.nodes if n.runs]
    assert node.layer.op == "Conv" and node.layer.family == "conv"
    assert node.layer.outputs[0].shape == out
    assert node.layer.macs == math.prod(out) * weight.dims[1] * weight.dims[2]
    assert {b.backend: (b.covered, b.running) for b in model_stats(m).backends} == {"cudnn": (1, 1), "onednn": (1, 1)}


def _checked_on_onednn(models, out):
    """The models' f32 oneDNN benchmarks generated into ``out``, built, and checked against ONNX Runtime."""
    manifest, gen = generate_bench(models, "onednn", out, GenOptions(dtypes=("f32",), fusion=False))
    build(out / "onednn", jobs=1)
    return manifest, gen, check(out, models, CheckOptions(build_jobs=1))


@pytest.mark.slow
def test_conv1d_benchmarks_compute_what_onnx_runtime_computes(tmp_path):
    """generate → build → check: every 1-D conv's oneDNN benchmarks (f32, each layout and
    algorithm the CPU runs) give ONNX Runtime's output for the file's own node."""
    chosen = [p for p in CONV1D if p.parent.name in ("test_Conv1d_dilated", "test_Conv1d_groups",
                                                     "test_Conv1d_pad2", "test_Conv1d_stride")]
    models = [load_model(p) for p in chosen]
    manifest, gen, results = _checked_on_onednn(models, tmp_path / "bench")
    assert not [(r.name, r.status.value, r.where) for r in results
                if r.status not in (CheckStatus.OK, CheckStatus.UNSUPPORTED)]
    ok = {r.name for r in results if r.status is CheckStatus.OK}
    assert {v.problem for v in gen.variants if v.name in ok} == {u.layer.problem for u in manifest.layers}


@pytest.mark.slow
def test_one_d_pooling_benchmarks_compute_what_onnx_runtime_computes(tmp_path):
    """ONNX's own 1-D MaxPool and AveragePool cases (the onnx wheel's): pooled as the 2-D pooling
    of height 1, every oneDNN benchmark (each layout) gives ONNX Runtime's output."""
    import warnings

    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the case code's own overflow warnings
        cases = [c for c in collect_testcases(None) if c.name in ("test_maxpool_1d_default",
                                                                    "test_averagepool_1d_default")]
    assert len(cases) == 2
    models = []
    for c in cases:
        onnx.save(c.model, str(tmp_path / f"{c.name}.onnx"))
        models.append(load_model(tmp_path / f"{c.name}.onnx"))
    assert all(n.layer.problem.ih == 1 for m in models for n in m.nodes)
    _, gen, results = _checked_on_onednn(models, tmp_path / "bench")
    assert len(results) == len(gen.variants) >= 2
    assert all(r.status is CheckStatus.OK for r in results), [(r.name, r.status.value, r.where) for r in results]
