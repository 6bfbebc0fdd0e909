"""The boolean ops of a padding mask (ONNX And, Or; Equal of booleans): keyed in the binary
family in dtype ``b``, run on oneDNN as its binary primitive on u8 0/1 (binary_min for And,
binary_max for Or, binary_eq), which equals them exactly on 0/1, and on cuDNN as graph-API
pointwise nodes on one-byte booleans. Checked end to end on oneDNN on a model built here
(generate → run → the database → `benanza check` against ONNX Runtime); the cuDNN graphs built
and validated by the cuDNN frontend for an sm_90 GPU (no GPU here); and the coverage of the
masked decode steps transformers' own code exports (tests/hf_models.py), from `generate --json`'s
own figures."""

from __future__ import annotations

import json
import subprocess

import pytest
from click.testing import CliRunner
from helpers import io, model
from onnx import TensorProto, helper

from benanza.backends import cudnn, onednn
from benanza.cli import main
from benanza.generator import GenOptions, generate
from benanza.layers import unique_layers
from benanza.manifest import build_manifest
from benanza.ops.binary import BinaryProblem
from benanza.ops.registry import parse_layer_key
from benanza.perfdb import PerfDB
from benanza.processor import load_model
from tests.backends.test_cudnn import NEED_TOOLCHAIN, _build, _lines

MASK, KEYS = [1, 1, 4, 9], [1, 1, 1, 9]


def _mask_model():
    """A padding mask's And with a causal mask (one operand broadcast over the query rows, put
    first to show the operands' order does not matter), an Or, and an Equal of booleans."""
    nodes = [helper.make_node("And", ["pad", "causal"], ["both"], name="and_bcast"),
             helper.make_node("Or", ["both", "extra"], ["either"], name="or"),
             helper.make_node("Equal", ["either", "causal"], ["same"], name="eq_bool")]
    return model(nodes, [io("causal", MASK, TensorProto.BOOL), io("pad", KEYS, TensorProto.BOOL),
                         io("extra", MASK, TensorProto.BOOL)], [io("same", None)])


def test_boolean_ops_keys_and_coverage() -> None:
    layers = {n.name: n.layer for n in load_model(_mask_model(), name="mask").nodes}
    # by hand: the output-shaped operand first (And is commutative), the layer's type is ONNX bool
    assert layers["and_bcast"].key == "binary:and_in1x1x4x9_in1x1x1x9_b"
    assert layers["or"].key == "binary:or_in1x1x4x9_in1x1x4x9_b"
    assert layers["eq_bool"].key == "binary:eq_in1x1x4x9_in1x1x4x9_b"
    for la in layers.values():
        assert parse_layer_key(la.key) == (la.problem, "b") and isinstance(la.problem, BinaryProblem)
        assert la.flops == 36 and la.bytes == 3 * 36 - (27 if la.op == "And" else 0)  # one byte per bool
        assert la.onednn_primitive == "binary" and onednn.covers(la)
        assert la.cudnn_api == "cudnn_frontend.pointwise" and cudnn.covers(la)


@pytest.mark.slow  # builds a cuDNN project
@NEED_TOOLCHAIN
def test_cudnn_boolean_graphs_validate(tmp_path, cudnn_runtime) -> None:
    """One variant per layer, in its own type: LOGICAL_AND, LOGICAL_OR and CMP_EQ pointwise nodes
    on one-byte booleans, accepted by the cuDNN frontend's own validation for an sm_90 GPU; and a
    comparison of floats, which writes one-byte booleans too."""
    path, floats = tmp_path / "mask.onnx", tmp_path / "greater.onnx"
    path.write_bytes(_mask_model().SerializeToString())
    greater = model([helper.make_node("Greater", ["x", "y"], ["g"])], [io("x", MASK), io("y", KEYS)], [io("g", None)])
    floats.write_bytes(greater.SerializeToString())
    models = [load_model(path), load_model(floats)]
    g = generate(build_manifest(models, unique_layers(models)), "cudnn", tmp_path, GenOptions(dtypes=("f32", "f16")))
    assert {v.dtype for v in g.variants} == {"b", "f32", "f16"}
    binary = _build(g.out_dir, runtime=cudnn_runtime)
    done = subprocess.run([str(binary), "--benanza_check_graphs=90"], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = {ln["name"].split("/")[0]: ln for ln in _lines(done.stdout, "BENANZA_GRAPH")}
    assert set(lines) == {"binary:and_in1x1x4x9_in1x1x1x9_b", "binary:or_in1x1x4x9_in1x1x4x9_b",
                          "binary:eq_in1x1x4x9_in1x1x4x9_b", "binary:gt_in1x1x4x9_in1x1x1x9_f32",
                          "binary:gt_in1x1x4x9_in1x1x1x9_f16"}
    assert all(ln["ok"] for ln in lines.values()), lines


@pytest.mark.slow  # builds and runs oneDNN benchmarks
def test_boolean_ops_measured_and_checked(tmp_path) -> None:
    path = tmp_path / "mask.onnx"
    path.write_bytes(_mask_model().SerializeToString())
    bench, db = tmp_path / "bench", tmp_path / "perf.db"
    runner = CliRunner()
    r = runner.invoke(main, ["generate", str(path), "--out", str(bench), "--backend", "onednn", "--json"])
    assert r.exit_code == 0, r.output
    (m,) = json.loads(r.output)["models"]
    assert m["backends"]["onednn"]["covered_pct"] == 100.0, m
    r = runner.invoke(main, ["run", "--bench-dir", str(bench), "--system", "box", "--db", str(db), "--backend",
                             "onednn", "--threads", "1", "--min-time", "0.02", "--repetitions", "1",
                             "--max-contention", "1", "--no-peaks"])
    assert r.exit_code == 0, r.output
    with PerfDB(db) as perf:
        results = {res.variant.layer_key: res for res in perf.results("box")}
    # one variant each, in their own type (whatever --dtype asks), timed by oneDNN's binary
    assert set(results) == {"binary:and_in1x1x4x9_in1x1x1x9_b", "binary:or_in1x1x4x9_in1x1x4x9_b",
                            "binary:eq_in1x1x4x9_in1x1x4x9_b"}
    assert all(res.ok and res.variant.dtype == "b" and res.median_ms > 0 for res in results.values()), results
    r = runner.invoke(main, ["check", str(path), "--bench-dir", str(bench), "--show-ok"])
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.output.splitlines() if ln.startswith(("ok:", "mismatch:", "not checked:", "failed:"))]
    assert len(lines) == 3 and all(ln.startswith("ok:") for ln in lines), r.output


@pytest.mark.slow  # exports transformers' Llama twice, builds a cuDNN project
@NEED_TOOLCHAIN
def test_masked_decode_step_coverage(tmp_path, cudnn_runtime) -> None:
    """A masked Llama decode step (1 token after 8): And is costed on both backends; on cuDNN
    also the NaN guard's IsNaN (CMP_NEQ of x with itself) and both int64 Casts (the positions'
    IDENTITY into float, the mask's CMP_NEQ with 0 into bool), whose graphs the cuDNN frontend
    validates for an sm_90 GPU (no GPU here); the mask's Gather (GatherND) and TorchScript's
    Expand of booleans stay uncosted, and oneDNN has neither int64 nor cos/sin."""
    import hf_models

    step = hf_models.Step("llama", seq=1, past=8)
    paths = [hf_models.export(step, exporter, tmp_path) for exporter in ("torchscript", "dynamo")]
    bench = tmp_path / "bench"
    r = CliRunner().invoke(main, ["generate", *map(str, paths), "--out", str(bench), "--backend", "all", "--dtype",
                                  "f32", "--json"])
    assert r.exit_code == 0, r.output
    got = {m["model"]: (m["running_layers"], {b: (v["covered_pct"], v["not_covered"])
                                              for b, v in m["backends"].items()})
           for m in json.loads(r.output)["models"]}
    mask_gap = {"Cast": 2}  # the mask's Cast of int64 to bool and the positions' Cast to float
    # TorchScript: 131 of 133 on cuDNN, dynamo 131 of 132 (percentages as generate rounds them)
    assert got["llama_decode_l8_torchscript"] == (133, {
        "onednn": (95.49, {**mask_gap, "Cos": 1, "Sin": 1, "Expand": 1, "Gather": 1}),
        "cudnn": (98.5, {"Expand": 1, "Gather": 1})})
    assert got["llama_decode_l8_dynamo"] == (132, {
        "onednn": (96.21, {**mask_gap, "Cos": 1, "Sin": 1, "GatherND": 1}),
        "cudnn": (99.24, {"GatherND": 1})})
    binary = _build(bench / "cudnn", runtime=cudnn_runtime)
    done = subprocess.run([str(binary), "--benanza_check_graphs=90"], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = {ln["name"].split("/")[0]: ln for ln in _lines(done.stdout, "BENANZA_GRAPH")}
    assert all(ln["ok"] for ln in lines.values()), lines
    # the IsNaN of each exporter's attention probabilities (their shapes differ) and the int64
    # Casts, each one graph of its own
    assert {k for k in lines if k.startswith(("eltwise:isnan", "convert:long", "tobool:"))} == {
        "eltwise:isnan_in1x4x1x9_f32", "eltwise:isnan_in1x2x2x9_f32", "convert:long_in1x1x1_f32",
        "tobool:long_in1x9_b"}
