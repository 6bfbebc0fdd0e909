"""Input shapes for dynamic models: `profile --input-shape`, and `generate` over models whose inputs differ."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from helpers import io, model, tensor
from onnx import helper
from torch_models import D_MODEL, export

from benanza.analysis.matching import match_trace
from benanza.cli import main
from benanza.parsers import load_bundle
from benanza.processor import load_model

SEQ = 8  # not the export's 16: the run must follow --input-shape, not the file


@pytest.fixture(scope="module", params=[("torchscript", 17), ("dynamo", 18)], ids=["torchscript", "dynamo"])
def dynamic_gpt(tmp_path_factory, request):
    exporter, opset = request.param
    return export("gpt", opset, tmp_path_factory.mktemp("dyn"), dynamic=True, exporter=exporter)


def conv_model(save, name: str, input_name: str):
    """Conv over an image input whose H and W are symbolic."""
    conv = helper.make_node("Conv", [input_name, "W"], ["y"], name="conv", pads=[1, 1, 1, 1], kernel_shape=[3, 3])
    return save(model([conv], [io(input_name, ["N", 3, "H", "W"])], [io("y", None)], [tensor("W", (4, 3, 3, 3))]),
                name)


def one_error_line(r) -> str:
    lines = [ln for ln in (r.stderr or r.output).splitlines() if ln.strip()]
    assert r.exit_code != 0 and "Traceback" not in r.output
    return next(ln for ln in lines if ln.startswith("error:"))


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["onnxruntime", "torch"])
def test_profile_runs_a_dynamic_sequence_model_at_the_given_shape(tmp_path, dynamic_gpt, framework):
    out = tmp_path / "bundle"
    r = CliRunner().invoke(main, ["profile", str(dynamic_gpt), "--framework", framework, "--out", str(out),
                                  "--input-shape", f"x=1x{SEQ}x{D_MODEL}", "--warmup", "0", "--iterations", "2",
                                  "--trace-iterations", "2"])
    assert r.exit_code == 0, r.output
    index = json.loads((out / "profile.json").read_text())
    assert index["input_shapes"] == {"x": [1, SEQ, D_MODEL]}
    prof = load_bundle(out)
    if framework == "onnxruntime":
        # ORT's own record of what it ran: every activation has the given sequence length
        shapes = {s for o in prof.trace.ops for s in o.input_shapes + o.output_shapes}
        assert (1, SEQ, D_MODEL) in shapes and (1, 16, D_MODEL) not in shapes
    # the trace maps onto the model processed at the same shape
    m = load_model(dynamic_gpt, input_shapes={"x": (1, SEQ, D_MODEL)})
    match = match_trace(m, prof.trace)
    assert sum(len(g.nodes) for g in match.groups) >= len(m.nodes) // 2


@pytest.mark.slow
def test_profile_without_the_shape_of_a_symbolic_dim_is_one_error(tmp_path, dynamic_gpt):
    r = CliRunner().invoke(main, ["profile", str(dynamic_gpt), "--out", str(tmp_path / "b")])
    line = one_error_line(r)
    assert "'x'" in line and "--input-shape x=1xNx32" in line
    r = CliRunner().invoke(main, ["profile", str(dynamic_gpt), "--out", str(tmp_path / "b"),
                                  "--input-shape", "image=1x3x8x8"])
    assert "names no graph input: image (inputs: x)" in one_error_line(r)


@pytest.mark.slow  # exports a torch model (the `dynamic_gpt` fixture)
def test_generate_applies_each_input_shape_to_the_models_with_that_input(tmp_path, save, dynamic_gpt):
    a = conv_model(save, "a.onnx", "image")
    b = conv_model(save, "b.onnx", "pixels")
    r = CliRunner().invoke(main, ["generate", str(a), str(b), str(dynamic_gpt), "--out", str(tmp_path / "o"),
                                  "--backend", "none", "--json",
                                  "--input-shape", "image=1x3x8x8", "--input-shape", "pixels=1x3x6x6",
                                  "--input-shape", f"x=1x{SEQ}x{D_MODEL}",
                                  # the per-model form wins over the plain one for its model
                                  "--input-shape", "b:pixels=1x3x10x10"])
    assert r.exit_code == 0, r.output
    convs = {o["model"]: u["key"] for u in json.loads((tmp_path / "o" / "layers.json").read_text())["layers"]
             for o in u["occurrences"] if u["key"].startswith("conv:")}
    assert "ih8iw8" in convs["a"] and "ih10iw10" in convs["b"]
    gpt = load_model(dynamic_gpt, input_shapes={"x": (1, SEQ, D_MODEL)})
    stats = {s["model"]: s for s in json.loads(r.stdout)["models"]}
    assert stats[dynamic_gpt.stem]["layers"] == len(gpt.nodes)


@pytest.mark.slow  # exports a torch model (the `dynamic_gpt` fixture)
def test_generate_input_shape_errors(tmp_path, save, dynamic_gpt):
    a = conv_model(save, "a.onnx", "image")
    b = conv_model(save, "b.onnx", "pixels")
    out = str(tmp_path / "o")
    r = CliRunner().invoke(main, ["generate", str(a), str(b), "--out", out, "--backend", "none",
                                  "--input-shape", "imag=1x3x8x8"])
    line = one_error_line(r)
    assert "--input-shape imag: no given model has such an input" in line and "pixels" in line
    # a model left with a symbolic dim fails alone; the others are processed
    r = CliRunner().invoke(main, ["generate", str(a), str(b), "--out", out, "--backend", "none", "--json",
                                  "--input-shape", "image=1x3x8x8"])
    assert r.exit_code == 1
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "b.onnx" in errors[0] and "'pixels'" in errors[0]
    assert [s["model"] for s in json.loads(r.stdout)["models"]] == ["a"]
    r = CliRunner().invoke(main, ["generate", str(a), str(b), "--out", out, "--backend", "none",
                                  "--input-shape", "b.onnx:image=1x3x8x8"])
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.exit_code == 1 and len(errors) == 2  # a has no shape for image; b no input image
    assert any("b.onnx: --input-shape names no graph input: image (inputs: pixels)" in e for e in errors)
