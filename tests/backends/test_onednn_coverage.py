"""Layers detection, OCR and audio models hold, on the oneDNN backend: a zero Pad as a zero fill and
a reorder into the padded box (oneDNN has no padding primitive), and ConvTranspose as oneDNN's
deconvolution. Checked with `benanza check`: each benchmark's output against ONNX Runtime running
the model's own node on the same generated inputs, on ONNX's backend test cases (the onnx wheel's
models, which nobody here wrote) and on the zero Pads a detector or an audio front end holds."""

from __future__ import annotations

import json

import onnx
import pytest
from click.testing import CliRunner
from helpers import generate_bench

from benanza.backends.base import build
from benanza.check import CheckOptions, CheckStatus, check
from benanza.cli import main
from benanza.generator import GenOptions
from benanza.processor import load_model
from tests.backends.test_cudnn_coverage import DECONV_CASES, backend_cases, pad_model, with_constant_inputs
from tests.backends.test_onednn import HAVE_TOOLCHAIN

# ONNX's constant-mode Pad cases pad with 1.2: not covered on either backend, with the reason
PAD_CASES = ("test_constant_pad", "test_constant_pad_axes")


def _saved(tmp_path, names, constant=False):
    """Each case's model saved (its inputs but the first as constants where ``constant``), with its batch."""
    cases = backend_cases(names)
    out = {}
    for name in names:
        path = tmp_path / f"{name}.onnx"
        onnx.save(with_constant_inputs(cases[name]) if constant else cases[name].model, str(path))
        out[name] = (path, cases[name].data_sets[0][0][0].shape[0])
    return out


def test_zero_pads_are_covered_on_onednn_and_the_others_say_why(tmp_path):
    """The zero Pads get the reorder_pad benchmark; reflect, a non-zero constant (ONNX's own cases
    included) and a crop are not covered, each with its one-line reason, on oneDNN as on cuDNN."""
    path = pad_model(tmp_path / "pads.onnx")
    m = load_model(path)
    assert {n.name for n in m.nodes if n.layer.onednn_primitive == "reorder_pad"} == {"yolo", "audio", "axes"}
    onnx_cases = [str(p) for p, _ in _saved(tmp_path, PAD_CASES, constant=True).values()]
    r = CliRunner().invoke(main, ["generate", str(path), *onnx_cases, "--out", str(tmp_path / "b"),
                                  "--backend", "onednn"])
    assert r.exit_code == 0, r.output
    reasons = sorted(ln.split(": not covered by onednn: ", 1)[1] for ln in r.stdout.splitlines()
                     if ": not covered by onednn: " in ln)
    fill = "a zero fill and a reorder into the padded box"
    assert reasons == sorted([f"Pad 'crop': negative pads (a crop: {fill} only adds)",
                              f"Pad 'reflect': mode reflect ({fill} pads with zeros only)",
                              f"Pad 'value': constant value 1.5 ({fill} pads with zeros only)"]
                             + [f"Pad '{load_model(p).nodes[0].name}': constant value 1.2 ({fill} pads with zeros "
                                f"only)" for p in onnx_cases])
    r = CliRunner().invoke(main, ["generate", str(path), "--out", str(tmp_path / "j"), "--backend", "onednn",
                                  "--json"])
    backends = json.loads(r.stdout)["total"]["backends"]
    assert backends["onednn"]["not_covered"] == {"Pad": 3} == backends["cudnn"]["not_covered"]


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_TOOLCHAIN, reason="needs cmake, libdnnl-dev and libbenchmark-dev")
def test_pads_and_transposed_convolutions_compute_what_onnx_runtime_does(tmp_path):
    """`benanza check` runs every generated Pad and ConvTranspose variant once and compares its
    output with ONNX Runtime's on the same inputs: the padded tensor with its zero border, and
    the transposed convolutions of ONNX's backend cases (1-D, dilated, grouped, batch 3,
    output_padding, explicit and SAME pads), whose weights the benchmark fills in oneDNN's order."""
    saved = _saved(tmp_path, DECONV_CASES + ("test_convtranspose_autopad_same",))
    models = [load_model(p, batch_size=b) for p, b in saved.values()]
    models.append(load_model(pad_model(tmp_path / "pads.onnx")))
    out = tmp_path / "bench"
    _, gen = generate_bench(models, "onednn", out, GenOptions(dtypes=("f32",), layouts=("nchw",)))
    assert {v.problem.family for v in gen.variants} == {"deconv", "pad"}
    build(out / "onednn", jobs=1)
    results = check(out, models, CheckOptions(build_jobs=1))
    assert sorted(r.name for r in results) == sorted(v.name for v in gen.variants)
    bad = [(r.name, r.status.value, r.compared, r.where) for r in results if r.status is not CheckStatus.OK]
    assert not bad
    pads = [r for r in results if r.name.startswith("pad:")]
    assert len(pads) == 3 and all(r.error == 0.0 for r in pads), pads  # a copy and zeros: exact
