"""A model whose weights lie in external files, through the framework-native backends
(generate → run → database → analyze → check), reading only the weights its layers need.

The model is small, but what matters past protobuf's 2 GB is there: every weight (a Constant
node's value too) in an external file; a layer reading a value the model computes from shapes
(a Slice's ends from Shape→Gather→Concat); and a weight no benchmark reads (the
last MatMul is the first one's layer again, cut from the first), deleted from disk, so any code
that loads all of the model's weights fails. With ``PROTOBUF_LIMIT`` lowered, each subgraph
holding a weight is written with its weights beside it as external data, the branch a layer
past 2 GB takes.

The oracle is ONNX Runtime's run of the whole original model (before the weight is deleted),
each intermediate tensor an output: every subgraph, run as its benchmark runs it, fed the
original values of its inputs, must give the original values of its outputs."""

from __future__ import annotations

import json
import sqlite3
import zlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers import invoke, io, model, tensor
from onnx import TensorProto, helper, numpy_helper

from benanza.generator import get_backend

SYSTEM = "extbox"
SEQ, WIDTH = 64, 256  # a MatMul of some 0.5 ms, elementwise layers of microseconds: above the timers' resolution


def external_net() -> onnx.ModelProto:
    """MatMul→Relu, × a Constant node's vector, then a MatMul of the first one's shapes (weight W3);
    and the Relu's output sliced to half its width, the Slice's ends a value the model computes
    from shapes, Concat(Gather(Shape(r), [1]), [WIDTH / 2])."""
    n = helper.make_node
    nodes = [n("MatMul", ["x", "W1"], ["a"], name="mm1"), n("Relu", ["a"], ["r"], name="relu"),
             n("Constant", [], ["scale"], value=tensor("scale", (WIDTH,))),
             n("Mul", ["r", "scale"], ["p"], name="scale"), n("MatMul", ["p", "W3"], ["y"], name="mm3"),
             n("Shape", ["r"], ["s"], name="shape"), n("Gather", ["s", "idx"], ["rows"], axis=0, name="gather"),
             n("Concat", ["rows", "half"], ["ends"], axis=0, name="concat"),
             n("Slice", ["r", "starts", "ends", "axes"], ["z"], name="slice")]
    inits = [tensor("W1", (WIDTH, WIDTH)), tensor("W3", (WIDTH, WIDTH))]
    inits += [numpy_helper.from_array(np.array(v, np.int64), name) for name, v in
              (("idx", [1]), ("half", [WIDTH // 2]), ("starts", [0, 0]), ("axes", [1, 2]))]
    return model(nodes, [io("x", [1, SEQ, WIDTH])], [io("y", None), io("z", None)], inits)


def _every_tensor(path) -> dict[str, np.ndarray]:
    """ONNX Runtime's values of every tensor of the model at ``path`` (all its weights loaded)."""
    m = onnx.load(str(path))
    m.graph.output.extend(helper.make_empty_tensor_value_info(o) for nd in m.graph.node for o in nd.output
                          if o not in {g.name for g in m.graph.output})
    x = np.random.default_rng(zlib.crc32(b"x")).standard_normal((1, SEQ, WIDTH)).astype(np.float32)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in m.graph.output]
    return {"x": x, **dict(zip(names, sess.run(names, {"x": x})))}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The model with each weight in its own file, the values of its tensors, W3's file deleted."""
    root = tmp_path_factory.mktemp("external")
    path = root / "net.onnx"
    # tensors of 1 KB or more in files (onnx's default threshold): the processor's shape inference
    # reads the small ones (Gather's indices) from the graph
    onnx.save_model(external_net(), str(path), save_as_external_data=True, all_tensors_to_one_file=False,
                    size_threshold=1024, convert_attribute=True)
    stored = onnx.load(str(path), load_external_data=False)
    assert {t.name for t in stored.graph.initializer if t.data_location == TensorProto.EXTERNAL} == {"W1", "W3"}
    assert stored.graph.node[2].attribute[0].t.data_location == TensorProto.EXTERNAL  # the Constant's value
    values = _every_tensor(path)
    (root / "W3").unlink()
    return path, values


@pytest.mark.slow  # runs each backend's benchmarks (ORT sessions, torch in a child)
@pytest.mark.parametrize("beside", [False, True], ids=["inline", "external"])
@pytest.mark.parametrize("backend", ["onnxruntime", "torch"])
def test_a_model_with_external_weights_through_the_native_backends(saved, tmp_path, monkeypatch, backend, beside):
    path, values = saved
    if beside:  # a subgraph holding a weight (256 KB) is past this limit, one without is not
        monkeypatch.setattr("benanza.model_values.PROTOBUF_LIMIT", 32 * 1024)
    bench, db = tmp_path / "bench", tmp_path / "perf.db"
    invoke("generate", str(path), "--out", str(bench), "--backend", backend, "--dtype", "f32")
    project = bench / backend
    index = json.loads((project / "benchmarks.json").read_text())
    entries = {e["model"]: e for e in index.values() if "model" in e}
    assert not [e for e in index.values() if "model" not in e], index
    # the MatMul layer is cut from mm1 (its first occurrence): mm3, whose weight is gone, from none
    assert {e["nodes"] for e in entries.values()} >= {"mm1", "scale", "slice"}
    assert not any("mm3" in e["nodes"] for e in entries.values())

    computed = set()
    for model_path, entry in entries.items():
        file = project / model_path
        sub = onnx.load(str(file), load_external_data=False)
        inits = {t.name for t in sub.graph.initializer}
        computed |= inits & {"ends"}
        # weights ride inline below the limit, in one file beside the subgraph above it
        data = file.with_name(file.name + ".data")
        external = {t.name for t in sub.graph.initializer if t.data_location == TensorProto.EXTERNAL}
        assert data.exists() == bool(external) == (beside and "W1" in inits), (entry, external)
        if external:
            assert file.stat().st_size < 32 * 1024 < data.stat().st_size
        # the oracle: the subgraph as its benchmark runs it, on the original values of its inputs
        feeds = {i.name: values[i.name] for i in sub.graph.input if i.name not in inits}
        got = get_backend(backend).outputs(file, entry, feeds, 1)
        want = [values[o.name] for o in sub.graph.output]
        assert len(got) == len(want), entry
        for g, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-4, err_msg=str(entry))
    assert computed, "no subgraph reads a constant the model computes"

    invoke("run", "--system", SYSTEM, "--backend", backend, "--bench-dir", str(bench), "--db", str(db),
           "--threads", "1", "--min-time", "0.01", "--repetitions", "2")
    with sqlite3.connect(db) as con:
        rows = dict(con.execute("SELECT variant, status FROM results"))
    assert set(rows) == set(index) and set(rows.values()) == {"ok"}, rows
    (a,) = json.loads(invoke("analyze", str(path), "--system", SYSTEM, "--db", str(db), "--backend", backend,
                             "--json", "--allow-contended"))["analyses"]
    statuses = {la["name"]: la["status"] for la in a["layers"]}
    assert statuses["mm1"] == statuses["mm3"] == statuses["slice"] == statuses["scale"] == "ok", statuses
    out = invoke("check", str(path), "--bench-dir", str(bench), "--backend", backend)
    assert f"checked {len(index)} benchmarks (seed 0): {len(index)} ok, 0 mismatch" in out, out


@pytest.mark.parametrize("backend", ["onnxruntime", "torch"])
def test_a_weight_a_layer_needs_missing_is_one_line_naming_the_model(tmp_path, backend):
    from click.testing import CliRunner

    from benanza.cli import main

    path = tmp_path / "net.onnx"
    onnx.save_model(external_net(), str(path), save_as_external_data=True, all_tensors_to_one_file=False,
                    size_threshold=1024)
    (tmp_path / "W1").unlink()
    out = CliRunner().invoke(main, ["generate", str(path), "--out", str(tmp_path / "bench"), "--backend", backend,
                                    "--dtype", "f32"])
    assert out.exit_code == 1 and out.output.startswith(f"error: {path}: its external data does not read ("), \
        out.output
    assert "W1" in out.output and "Traceback" not in out.output
