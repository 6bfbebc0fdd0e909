"""Shapes by execution, on the ONNX package's own backend test cases (models and input/output data
from onnx.backend.test.case.node, the code that writes the .pb files of its test data): where static
inference cannot give a shape, one ONNX Runtime run does, and the shapes equal the outputs the ONNX
reference computed and those ONNX Runtime computes on the original model."""

from __future__ import annotations

import json
import time
import warnings
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from helpers import io, model, tensor
from onnx import TensorProto, helper

from benanza.cli import main
from benanza.errors import ShapeError
from benanza.processor import load_model

# Ops whose output shape a value decides (a shape input, bounds, a k, a mask, a condition).
SHAPE_BY_VALUE_OPS = ["Expand", "NonZero", "TopK", "NonMaxSuppression", "Compress", "Unique", "ConstantOfShape",
                      "Range", "Tile", "Reshape", "CenterCropPad", "Slice", "Pad", "Resize", "OneHot"]


@pytest.fixture(scope="module")
def cases():
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the case code's own overflow warnings
        return {c.name: c for c in collect_testcases(None)}


def _tensor_only(case) -> bool:
    graph = case.model.graph
    return all(v.type.HasField("tensor_type") for v in list(graph.input) + list(graph.output))


def _write(case, tmp_path):
    path = tmp_path / f"{case.name}.onnx"
    onnx.save(case.model, str(path))
    inputs, outputs = case.data_sets[0]
    data = {i.name: np.asarray(a) for i, a in zip(case.model.graph.input, inputs)}
    expected = {o.name: np.asarray(a).shape for o, a in zip(case.model.graph.output, outputs)}
    return path, data, expected


def _ort_shapes(case, data) -> dict[str, tuple[int, ...]] | None:
    """ONNX Runtime's own output shapes on the original model; None where it cannot run it."""
    try:
        sess = ort.InferenceSession(case.model.SerializeToString(), providers=["CPUExecutionProvider"])
        feed = {i.name: data[i.name].astype(onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type))
                for i in case.model.graph.input}
        return {o.name: np.asarray(a).shape for o, a in zip(sess.get_outputs(), sess.run(None, feed))}
    except Exception:  # noqa: BLE001 - a dtype or op this ORT has no kernel for
        return None


def _shapes(m) -> dict[str, tuple[int, ...]]:
    return {t: s.shape for n in m.nodes for t, s in zip(n.outputs, n.layer.outputs)}


@pytest.mark.slow  # runs ONNX Runtime on onnx's backend test cases
@pytest.mark.parametrize("op", SHAPE_BY_VALUE_OPS)
def test_backend_cases_process_with_the_shapes_onnx_runtime_computes(op, cases, tmp_path):
    chosen = [c for c in cases.values() if "expanded" not in c.name and _tensor_only(c)
              and op in {n.op_type for n in c.model.graph.node}]
    assert chosen, op
    checked = 0
    for case in chosen:
        path, data, expected = _write(case, tmp_path)
        ort_out = _ort_shapes(case, data)
        if ort_out is None:  # ORT lacks the kernel: Benanza may not cost the node, and says why in one line
            try:
                m = load_model(path, input_data=data)
            except ShapeError as exc:
                assert "ONNX Runtime could not run it" in str(exc) and "\n" not in str(exc)
            else:
                assert all("ONNX Runtime could not run it" in u.reason for u in m.uncosted)
            continue
        m = load_model(path, input_data=data)
        assert m.uncosted == [], case.name
        got = _shapes(m)
        for name, shape in expected.items():
            assert got[name] == shape == ort_out[name], (case.name, name)
        checked += 1
    assert checked, op


@pytest.mark.slow  # runs onnx's backend test cases (the `cases` fixture: they take a quarter minute to build)
def test_expand_by_input_value_end_to_end(cases, tmp_path):
    path, data, expected = _write(cases["test_expand_dim_changed"], tmp_path)
    value = ",".join(str(int(v)) for v in data["new_shape"])
    r = CliRunner().invoke(main, ["generate", str(path), "--out", str(tmp_path / "o"), "--backend", "none",
                                  "--input-value", f"new_shape={value}", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["models"][0]["layers"] == 1
    layers = json.loads((tmp_path / "o" / "layers.json").read_text())["layers"]
    assert [la["outputs"][0]["shape"] for la in layers] == [list(expected["expanded"])]


@pytest.mark.slow  # runs onnx's backend test cases (the `cases` fixture: they take a quarter minute to build)
def test_nonzero_is_marked_data_dependent_with_the_size_seen(cases, tmp_path):
    path, data, expected = _write(cases["test_nonzero_example"], tmp_path)
    m = load_model(path, input_data=data)
    assert m.data_dependent == {"result": expected["result"]}
    assert expected["result"] == np.array(np.nonzero(data["condition"])).shape  # numpy's own answer
    value = ",".join(str(int(v)) for v in data["condition"].reshape(-1))
    r = CliRunner().invoke(main, ["generate", str(path), "--out", str(tmp_path / "o"), "--backend", "none", "--json",
                                  "--input-value", f"condition={value}"])
    (stats,) = json.loads(r.stdout)["models"]
    assert stats["data_dependent"] == {"result": list(expected["result"])} and stats["uncosted_nodes"] == []


@pytest.mark.slow  # runs onnx's backend test cases (the `cases` fixture: they take a quarter minute to build)
def test_input_data_file_feeds_the_run(cases, tmp_path):
    path, data, expected = _write(cases["test_top_k"], tmp_path)
    npz = tmp_path / "in.npz"
    np.savez(npz, **data)
    r = CliRunner().invoke(main, ["generate", str(path), "--out", str(tmp_path / "o"), "--backend", "none",
                                  "--input-data", str(npz)])
    assert r.exit_code == 0, r.output
    k = int(data["k"][0])
    assert expected["values"][1] == k and f"values {expected['values'][0]}x{k}" in r.stdout


@pytest.mark.parametrize("args, message", [
    ([], "input 'new_shape' (i64, 3) decides shapes or branches"),
    (["--input-value", "new_shape=1,x"], "--input-value 'new_shape=1,x': want NAME=V1,V2,..."),
    (["--input-value", "new_shape=2,1"], "--input-value new_shape: 2 values for an input of shape 3"),
    (["--input-value", "shape=2,1,6"], "--input-value shape: no given model has such an input"),
])
@pytest.mark.slow  # runs onnx's backend test cases (the `cases` fixture: they take a quarter minute to build)
def test_bad_or_missing_input_value_is_one_clear_line(cases, tmp_path, args, message):
    path, _, _ = _write(cases["test_expand_dim_changed"], tmp_path)
    r = CliRunner().invoke(main, ["generate", str(path), "--out", str(tmp_path / "o"), "--backend", "none", *args])
    assert r.exit_code != 0 and isinstance(r.exception, SystemExit)
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error")]
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in r.stderr, r.stderr


@pytest.mark.slow  # runs onnx's backend test cases (the `cases` fixture: they take a quarter minute to build)
def test_unreadable_input_data_is_one_clear_line(cases, tmp_path):
    path, _, _ = _write(cases["test_top_k"], tmp_path)
    bad = tmp_path / "bad.npz"
    bad.write_text("not a zip")
    r = CliRunner().invoke(main, ["generate", str(path), "--out", str(tmp_path / "o"), "--backend", "none",
                                  "--input-data", str(bad)])
    assert r.exit_code != 0 and "Traceback" not in r.stderr
    assert [ln for ln in r.stderr.splitlines() if "error" in ln] == [
        ln for ln in r.stderr.splitlines() if "--input-data" in ln and "bad.npz" in ln]


def test_external_weights_are_read_by_onnx_runtime_from_beside_the_file(tmp_path):
    """MatMul → Relu → NonZero with the weight in external data: the size NonZero saw equals
    numpy's count on the same input and weight."""
    w = tensor("W", (16, 8))
    m = model([helper.make_node("MatMul", ["x", "W"], ["y"]), helper.make_node("Relu", ["y"], ["r"]),
               helper.make_node("NonZero", ["r"], ["nz"]), helper.make_node("Transpose", ["nz"], ["t"])],
              [io("x", [4, 16])], [io("t", None, TensorProto.INT64)], [w])
    path = tmp_path / "ext.onnx"
    onnx.save(m, str(path), save_as_external_data=True, location="ext.bin", size_threshold=0)
    x = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    processed = load_model(path, input_data={"x": x})
    count = int(np.count_nonzero(np.maximum(x @ onnx.numpy_helper.to_array(w), 0)))
    assert processed.data_dependent == {"nz": (2, count), "t": (count, 2)}
    assert _shapes(processed)["t"] == (count, 2)


def test_a_node_without_shape_is_uncosted_and_the_rest_costed(tmp_path):
    """An op ONNX Runtime does not know on one branch: it and what reads it are uncosted, with
    the reason; the Conv and Relu beside them are costed."""
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["a"]),
             helper.make_node("Mystery", ["x"], ["q"], domain="example.com"), helper.make_node("Sigmoid", ["q"], ["b"])]
    m = model(nodes, [io("x", [1, 3, 8, 8])], [io("a", None), io("b", None)], [tensor("W", (4, 3, 3, 3))])
    m.opset_import.append(helper.make_opsetid("example.com", 1))
    path = tmp_path / "partial.onnx"
    onnx.save(m, str(path))
    processed = load_model(path)
    assert [n.layer.op for n in processed.nodes] == ["Conv", "Relu"]
    assert processed.nodes[0].layer.outputs[0].shape == (1, 4, 8, 8)
    (mystery, sigmoid) = processed.uncosted
    assert (mystery.name, mystery.op) == ("Mystery_2", "Mystery") and "ONNX Runtime could not run it" in mystery.reason
    assert (sigmoid.op, sigmoid.reason) == ("Sigmoid", "it reads the output of uncosted node 'Mystery_2'")
    from benanza.sweep import SweepRequest, run_sweep
    from tests.analysis.test_analyzer import _db_with

    (a,) = run_sweep(SweepRequest(str(path), ("cpu-a",)), _db_with(tmp_path / "p.db", processed))
    assert [w for w in a.warnings if "uncosted" in w] == [
        f"uncosted: node 'Mystery_2' (Mystery): {mystery.reason}",
        "uncosted: node 'Sigmoid_2' (Sigmoid): it reads the output of uncosted node 'Mystery_2'"]


@pytest.mark.slow  # runs onnx's backend test cases (the `cases` fixture: they take a quarter minute to build)
@pytest.mark.parametrize("backend", ["cudnn", "onednn"])
def test_coverage_is_each_backends_share_of_the_running_layers(cases, tmp_path, backend):
    """The LSTM of ONNX's test case (cuDNN's RNN call, oneDNN's lstm_forward) beside a
    conv net with a free Flatten: "% covered" for each backend is the share of running layers for
    which that backend's generator writes a benchmark, free views excluded."""
    from helpers import conv_net

    from benanza.generator import GenOptions, generate
    from benanza.layers import unique_layers
    from benanza.manifest import build_manifest
    from benanza.model_stats import total_stats

    lstm, _, _ = _write(cases["test_lstm_defaults"], tmp_path)
    conv = tmp_path / "conv.onnx"
    onnx.save(conv_net(), str(conv))
    models = [load_model(lstm), load_model(conv)]
    stats = total_stats(models).backend(backend)
    gen = generate(build_manifest(models, unique_layers(models)), backend, tmp_path / "o",
                   GenOptions(dtypes=("f32",), fusion=False))
    benchmarked = {v.problem for v in gen.variants}
    running = [n for m in models for n in m.nodes if n.runs]
    assert len(running) == 9 == stats.running  # the Flatten is free, not counted
    assert stats.covered == sum(1 for n in running if n.layer.problem in benchmarked)
    assert dict(stats.not_covered) == dict(Counter(n.layer.op for n in running
                                                   if n.layer.problem not in benchmarked))


@pytest.mark.slow  # runs onnx's backend test cases (the `cases` fixture: they take a quarter minute to build)
@pytest.mark.parametrize("cond, branch", [("1", "then"), ("0", "else")])
def test_if_of_the_backend_case_takes_the_branch_its_condition_selects(cases, tmp_path, cond, branch):
    path, _, _ = _write(cases["test_if"], tmp_path)
    r = CliRunner().invoke(main, ["generate", str(path), "--out", str(tmp_path / "o"), "--backend", "none",
                                  "--input-value", f"cond={cond}"])
    assert r.exit_code == 0, r.output
    assert f"If 'If_0' took its {branch} branch for these inputs" in r.stdout


@pytest.mark.parametrize("name, branch", [("test_affine_grid_2d_expanded", "then"),
                                          ("test_affine_grid_3d_expanded", "else"),
                                          ("test_affine_grid_3d_align_corners_expanded", "else")])
@pytest.mark.slow  # runs onnx's backend test cases (the `cases` fixture: they take a quarter minute to build)
def test_affine_grid_function_costs_the_branches_its_size_selects(cases, tmp_path, name, branch):
    """ONNX's AffineGrid function body picks its 2-D or 3-D computation with Ifs on the length of
    ``size``: the 2-D case takes the then branches, the 3-D case the else branches, and every node
    of the branches taken is costed, with the output shape the ONNX reference and ORT compute."""
    case = cases[name]
    path, data, expected = _write(case, tmp_path)
    m = load_model(path, input_data=data)
    assert m.uncosted == [] and m.branch_failure == ""
    assert (m.control_flow["If_15"], m.control_flow["If_17"]) == (branch, branch)
    assert _shapes(m)["grid"] == expected["grid"] == _ort_shapes(case, data)["grid"]
    assert any(n.name.startswith(f"If_28/{m.control_flow['If_28']}/") for n in m.nodes)
    if "align_corners" in name:  # a branch inside a branch, named by its whole path
        assert m.control_flow["If_28/else/If_4"] == "else" and "If_28/else/If_4/else/Div_0" in {n.name for n in m.nodes}


@pytest.mark.parametrize("cond", [True, False])
def test_if_costs_the_layers_of_the_branch_taken(tmp_path, cond):
    """then: Conv 3→4 (3×3, pad 1) + Relu on 1×3×8×8; else: 2×2 MaxPool. The branch taken is
    costed under its path, with the MACs of a 3×3 conv counted by hand, and the shape ORT
    computes for the If's output."""
    then = helper.make_graph([helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1], name="Conv_3"),
                              helper.make_node("Relu", ["c"], ["r"])], "then", [], [io("r", None)])
    other = helper.make_graph([helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[2, 2], strides=[2, 2])],
                              "else", [], [io("p", None)])
    m = model([helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other, name="If_1"),
               helper.make_node("Sigmoid", ["y"], ["z"])],
              [io("x", [1, 3, 8, 8]), io("cond", [], TensorProto.BOOL)], [io("z", None)], [tensor("W", (4, 3, 3, 3))])
    path = tmp_path / "if.onnx"
    onnx.save(m, str(path))
    processed = load_model(path, input_values={"cond": (float(cond),)})
    x = np.zeros((1, 3, 8, 8), np.float32)
    ort_shape = ort.InferenceSession(m.SerializeToString()).run(None, {"x": x, "cond": np.array(cond)})[0].shape
    assert processed.control_flow == {"If_1": "then" if cond else "else"}
    by_name = {n.name: n.layer for n in processed.nodes}
    if cond:
        assert list(by_name) == ["If_1/then/Conv_3", "If_1/then/Relu_1", "Sigmoid_2"]
        assert by_name["If_1/then/Conv_3"].macs == 4 * 8 * 8 * 3 * 3 * 3
    else:
        assert list(by_name) == ["If_1/else/MaxPool_0", "Sigmoid_1"]
    assert next(la for name, la in by_name.items() if name.startswith("Sigmoid")).outputs[0].shape == ort_shape


@pytest.mark.slow  # runs onnx's backend test cases (the `cases` fixture: they take a quarter minute to build)
def test_profile_feeds_the_given_values_and_ort_runs_the_shapes_generate_costs(cases, tmp_path):
    """ORT's own trace of the profiled run records the Expand's output shape: the one the
    processor costs for the same --input-value."""
    path, data, expected = _write(cases["test_expand_dim_changed"], tmp_path)
    value = ",".join(str(int(v)) for v in data["new_shape"])
    out = tmp_path / "prof"
    r = CliRunner().invoke(main, ["profile", str(path), "--input-value", f"new_shape={value}", "--warmup", "0",
                                  "--iterations", "2", "--trace-iterations", "1", "--out", str(out)])
    assert r.exit_code == 0, r.output
    events = json.loads((out / "ort_profile.json").read_text())
    traced = [e["args"]["output_type_shape"][0]["float"] for e in events
              if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    costed = load_model(path, input_values={"new_shape": tuple(float(v) for v in data["new_shape"])})
    assert traced == [list(costed.nodes[0].layer.outputs[0].shape)] == [list(expected["expanded"])]
    r = CliRunner().invoke(main, ["profile", str(path), "--input-value", "new_shape=2,1", "--out", str(out)])
    assert r.exit_code != 0 and r.stderr.strip().splitlines() == [
        "error: --input-value/--input-data new_shape: 2 values for an input of shape 3"]


def _if_model(tmp_path):
    then = helper.make_graph([helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1], name="Conv_3")],
                             "then", [], [io("c", None)])
    other = helper.make_graph([helper.make_node("Relu", ["x"], ["p"])], "else", [], [io("p", None)])
    m = model([helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other, name="If_1"),
               helper.make_node("Sigmoid", ["y"], ["z"])],
              [io("x", [1, 3, 8, 8]), io("cond", [], TensorProto.BOOL)], [io("z", None)], [tensor("W", (3, 3, 3, 3))])
    path = tmp_path / "if.onnx"
    onnx.save(m, str(path))
    return path


def test_analyze_bounds_the_branch_its_input_value_selects(tmp_path):
    """The database holds each branch's layers at 1 ms (Conv) and 0.25 ms (Relu), the Sigmoid at
    0.5 ms: the bound of each analysis is the sum along the branch taken, and says which."""
    from tests.analysis.test_analyzer import _db_with

    path = _if_model(tmp_path)
    ms = {"Conv": 1.0, "Relu": 0.25, "Sigmoid": 0.5}
    db_path = tmp_path / "p.db"
    for cond in (1, 0):
        _db_with(db_path, load_model(path, input_values={"cond": (float(cond),)}), ms_of=lambda n: ms[n.layer.op])
    for cond, branch, bound in ((1, "then", 1.5), (0, "else", 0.75)):
        r = CliRunner().invoke(main, ["analyze", str(path), "--system", "cpu-a", "--db", str(db_path), "--json",
                                      "--input-value", f"cond={cond}"])
        assert r.exit_code == 0, r.output
        (doc,) = json.loads(r.stdout)["analyses"]
        assert doc["bounds"]["sequential_ms"] == pytest.approx(bound)
        assert any(f"If 'If_1' took its {branch} branch" in n for n in doc["notes"])


def test_a_run_that_does_not_end_is_stopped_and_said(tmp_path, monkeypatch):
    """A Loop whose trip count is 2**62, with a NonZero after it: the run is stopped at the time
    limit and the NonZero is uncosted with that reason, the Loop costed."""
    from benanza import shapes_by_execution

    monkeypatch.setattr(shapes_by_execution, "RUN_SECONDS", 2.0)
    body = helper.make_graph([helper.make_node("Identity", ["c_in"], ["c_out"]),
                              helper.make_node("Add", ["v_in", "one"], ["v_out"])], "body",
                             [io("i", [], TensorProto.INT64), io("c_in", [], TensorProto.BOOL), io("v_in", [4])],
                             [io("c_out", [], TensorProto.BOOL), io("v_out", [4])], [tensor("one", (4,), 1.0)])
    big = onnx.numpy_helper.from_array(np.array(2**62, np.int64), "M")
    yes = onnx.numpy_helper.from_array(np.array(True), "go")
    m = model([helper.make_node("Loop", ["M", "go", "x"], ["v"], body=body, name="Loop_0"),
               helper.make_node("NonZero", ["v"], ["nz"], name="NonZero_1")],
              [io("x", [4])], [io("nz", None, TensorProto.INT64)], [big, yes], opset=16)
    path = tmp_path / "forever.onnx"
    onnx.save(m, str(path))
    start = time.monotonic()
    processed = load_model(path)
    assert time.monotonic() - start < 30
    (nz,) = processed.uncosted
    assert nz.name == "NonZero_1" and "did not finish the run within 2 s" in nz.reason


@pytest.mark.slow  # runs onnx's backend test cases (the `cases` fixture: they take a quarter minute to build)
def test_loop_of_the_backend_case_is_unrolled_its_trip_count_times(cases, tmp_path):
    """test_loop11: trip_count 5, the condition passed through: the body runs 5 times (its Add
    once per iteration), and the outputs, scan output stacked, have the shapes ONNX's reference
    and ORT compute."""
    case = cases["test_loop11"]
    path, data, expected = _write(case, tmp_path)
    m = load_model(path, input_data=data)
    trips = int(data["trip_count"])
    assert m.control_flow == {"Loop_0": f"{trips} iterations"} and m.uncosted == []
    # the body's unnamed Add is named as ONNX Runtime's profile names it: its index past the Constants
    assert sorted(n.name for n in m.nodes if n.name.endswith("/Add_5")) == [
        f"Loop_0/iter{i}/Add_5" for i in range(trips)]
    got, ort_out = _shapes(m), _ort_shapes(case, data)
    assert {o: got[o] for o in expected} == expected == ort_out


@pytest.mark.slow  # runs onnx's backend test cases (the `cases` fixture: they take a quarter minute to build)
def test_range_functions_unroll_their_loop_to_the_length_they_compute(cases, tmp_path):
    """ONNX's Range function body is a Loop whose trip count is computed from start, limit and
    delta: each case unrolls to its output's length."""
    chosen = [c for n, c in cases.items() if n.startswith("test_range_") and n.endswith("_expanded")]
    assert len(chosen) >= 2
    for case in chosen:
        path, data, expected = _write(case, tmp_path)
        ort_out = _ort_shapes(case, data)
        if ort_out is None:  # bfloat16: ORT has no kernel, so nothing decides the trip count, and says why
            try:
                m = load_model(path, input_data=data)
            except ShapeError as exc:
                assert "ONNX Runtime could not run it" in str(exc)
            else:
                assert "ONNX Runtime could not run it" in m.branch_failure
            continue
        m = load_model(path, input_data=data)
        (loop, became), = m.control_flow.items()
        assert became == f"{expected['output'][0]} iterations", case.name
        assert _shapes(m)["output"] == expected["output"] == ort_out["output"]


def _ort_profile(path, feed: dict[str, np.ndarray], tmp_path) -> tuple[list[np.ndarray], list[dict]]:
    """ONNX Runtime's outputs of the original model (which runs the Loop itself) and its profile's
    node events, in order: the oracle of how many times each body node ran, and on what shapes."""
    opts = ort.SessionOptions()
    opts.enable_profiling = True
    opts.profile_file_prefix = str(tmp_path / "ort")
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    outputs = sess.run(None, feed)
    with open(sess.end_profiling()) as f:
        return outputs, [e for e in json.load(f) if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]


def _ran(events: list[dict], node: str) -> list[tuple[int, ...]]:
    """The first input's shape of each run of the body node named ``node``, as ORT's profile says."""
    return [tuple(next(iter(e["args"]["input_type_shape"][0].values()))) for e in events
            if e["name"] == f"{node}_kernel_time"]


def test_a_while_loop_is_unrolled_as_many_times_as_onnx_runtime_ran_it(tmp_path):
    """No M: the body counts i + 1 < limit (limit an input, given by --input-value) and grows its
    state by one row a round (Concat). The iterations inlined are the ones ORT ran (its scan
    output's length and its profile's count of the body's Relu), each Relu on the shape ORT's
    profile gives it, and generate says the count and how it was found."""
    body = helper.make_graph([helper.make_node("Add", ["i", "one"], ["next"], name="count"),
                              helper.make_node("Less", ["next", "limit"], ["c_out"], name="check"),
                              helper.make_node("Relu", ["v_in"], ["r"], name="relu"),
                              helper.make_node("ReduceSum", ["r", "axes"], ["row"], name="sum", keepdims=1),
                              helper.make_node("Concat", ["v_in", "row"], ["v_out"], name="grow", axis=0)],
                             "body", [io("i", [], TensorProto.INT64), io("c_in", [], TensorProto.BOOL),
                                      io("v_in", None)],
                             [io("c_out", [], TensorProto.BOOL), io("v_out", None), io("row", None)],
                             [onnx.numpy_helper.from_array(np.array(1, np.int64), "one"),
                              onnx.numpy_helper.from_array(np.array([0], np.int64), "axes")])
    m = model([helper.make_node("Loop", ["", "go", "x"], ["v", "rows"], body=body, name="Loop_0"),
               helper.make_node("Relu", ["v"], ["out"], name="after")],
              [io("x", [1, 4]), io("limit", [], TensorProto.INT64)], [io("out", None), io("rows", None)],
              [onnx.numpy_helper.from_array(np.array(True), "go")], opset=16)
    path = tmp_path / "while.onnx"
    onnx.save(m, str(path))
    (out, rows), events = _ort_profile(path, {"x": np.ones((1, 4), np.float32), "limit": np.array(5, np.int64)},
                                       tmp_path)
    seen = _ran(events, "relu")
    assert len(seen) == rows.shape[0] > 1 and seen[-1] != seen[0]  # the state did grow
    processed = load_model(path, input_values={"limit": (5.0,)})
    trips = len(seen)
    assert processed.control_flow == {"Loop_0": f"{trips} iterations (condition computed by the body)"}
    relus = [n for n in processed.nodes if n.name.endswith("/relu")]
    assert [n.name for n in relus] == [f"Loop_0/iter{i}/relu" for i in range(trips)]
    assert [n.layer.inputs[0].shape for n in relus] == seen
    shapes = {n.name: n.layer.outputs[0].shape for n in processed.nodes}
    assert (shapes["after"], shapes["Loop_0/scan_0/concat"]) == (out.shape, rows.shape)
    r = CliRunner().invoke(main, ["generate", str(path), "--out", str(tmp_path / "o"), "--backend", "none",
                                  "--input-value", "limit=5"])
    assert r.exit_code == 0 and (f"Loop 'Loop_0' ran {trips} iterations for these inputs (condition computed "
                                 f"by the body; unrolled") in r.stdout
    r = CliRunner().invoke(main, ["generate", str(path), "--out", str(tmp_path / "o"), "--backend", "none"])
    assert r.exit_code != 0 and "give its value with --input-value limit=V" in r.output


@pytest.mark.parametrize("trip_count,x", [(100, 1.0), (3, 1.0), (1000, -400.0)])
def test_a_loop_with_m_and_a_computed_condition_runs_what_onnx_runtime_ran(tmp_path, trip_count, x):
    """M given, the body stopping once its state sums past 40: the Loop runs min(M, until it stops)
    iterations, as ORT's profile counts the body's Add; past 256 it stays one node and says so."""
    body = helper.make_graph([helper.make_node("Add", ["v_in", "one"], ["v_out"], name="step"),
                              helper.make_node("ReduceSum", ["v_out"], ["s"], keepdims=0),
                              helper.make_node("Less", ["s", "limit"], ["c_out"])], "body",
                             [io("i", [], TensorProto.INT64), io("c_in", [], TensorProto.BOOL), io("v_in", [4])],
                             [io("c_out", [], TensorProto.BOOL), io("v_out", [4])],
                             [tensor("one", (4,), 1.0), tensor("limit", (), 40.0)])
    m = model([helper.make_node("Loop", ["M", "go", "x"], ["v"], body=body, name="Loop_0"),
               helper.make_node("Relu", ["v"], ["r"])],
              [io("x", [4])], [io("r", None)],
              [onnx.numpy_helper.from_array(np.array(trip_count, np.int64), "M"),
               onnx.numpy_helper.from_array(np.array(True), "go")], opset=16)
    path = tmp_path / "until.onnx"
    onnx.save(m, str(path))
    feed = {"x": np.full(4, x, np.float32)}
    _, events = _ort_profile(path, feed, tmp_path)
    trips = len(_ran(events, "step"))
    processed = load_model(path, input_data=feed)
    steps = [n.name for n in processed.nodes if n.name.endswith("/step")]
    if trips > 256:
        assert processed.control_flow == {
            "Loop_0": f"stays one node: {trips} iterations, more than the 256 Benanza unrolls"}
        assert steps == [] and [n.layer.op for n in processed.nodes] == ["Loop", "Relu"]
        return
    assert trips == min(trip_count, 9)  # 4 + 4k < 40 holds for k < 9
    assert processed.control_flow == {"Loop_0": f"{trips} iterations (condition computed by the body)"}
    assert steps == [f"Loop_0/iter{i}/step" for i in range(trips)]


def test_an_unrolled_loop_holds_its_body_weights_once(tmp_path):
    """A Loop of 8 iterations whose body multiplies by a 64×64 weight: 8 MatMuls, one weight."""
    body = helper.make_graph([helper.make_node("Identity", ["c_in"], ["c_out"]),
                              helper.make_node("MatMul", ["v_in", "W"], ["v_out"])], "body",
                             [io("i", [], TensorProto.INT64), io("c_in", [], TensorProto.BOOL), io("v_in", [1, 64])],
                             [io("c_out", [], TensorProto.BOOL), io("v_out", [1, 64])], [tensor("W", (64, 64))])
    m = model([helper.make_node("Loop", ["M", "go", "x"], ["v"], body=body, name="Loop_0")],
              [io("x", [1, 64])], [io("v", None)],
              [onnx.numpy_helper.from_array(np.array(8, np.int64), "M"),
               onnx.numpy_helper.from_array(np.array(True), "go")], opset=16)
    path = tmp_path / "rnnish.onnx"
    onnx.save(m, str(path))
    processed = load_model(path)
    matmuls = [n for n in processed.nodes if n.layer.op == "MatMul"]
    assert len(matmuls) == 8 and {n.constant_inputs for n in matmuls} == {("Loop_0/W",)}
    assert all(n.layer.macs == 64 * 64 for n in matmuls)


@pytest.mark.slow  # runs onnx's backend test cases (the `cases` fixture: they take a quarter minute to build)
def test_a_graph_too_close_to_protobufs_limit_is_refused_in_one_line(cases, tmp_path, monkeypatch):
    """The copy handed to ONNX Runtime must serialise: past protobuf's 2 GB (here lowered to 64
    bytes) the model is refused with the way out, never an EncodeError."""
    from benanza import shapes_by_execution

    monkeypatch.setattr(shapes_by_execution, "PROTOBUF_LIMIT", 64)
    path, data, _ = _write(cases["test_expand_dim_changed"], tmp_path)
    with pytest.raises(ShapeError) as e:
        load_model(path, input_data=data)
    assert "2 GB limit" in str(e.value) and "save_as_external_data" in str(e.value) and "\n" not in str(e.value)


def test_an_input_read_only_through_its_shape_needs_no_value(tmp_path):
    """The If's condition is Size(ids) == 8: the token ids (int64, 8 elements) decide it by their
    shape alone, so no --input-value is asked for, and the then branch is taken."""
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [], [io("t", None)])
    other = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["e"])], "else", [], [io("e", None)])
    m = model([helper.make_node("Size", ["ids"], ["n"]), helper.make_node("Equal", ["n", "eight"], ["cond"]),
               helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other, name="If_2")],
              [io("ids", [1, 8], TensorProto.INT64), io("x", [1, 16])], [io("y", None)],
              [onnx.numpy_helper.from_array(np.array(8, np.int64), "eight")])
    path = tmp_path / "by_shape.onnx"
    onnx.save(m, str(path))
    assert load_model(path).control_flow == {"If_2": "then"}


def test_the_command_that_fills_a_bound_keeps_the_input_values(tmp_path, monkeypatch):
    """The database holds the then branch only; `analyze --input-value cond=0` bounds the else
    branch, finds it missing, and prints the command that fills it: that command must process the
    model with the same value (another value takes another branch, other layers)."""
    import shlex

    from tests.analysis.test_analyzer import _db_with

    path = _if_model(tmp_path)
    db_path = tmp_path / "p.db"
    _db_with(db_path, load_model(path, input_values={"cond": (1.0,)}), ms_of=lambda n: 1.0)
    r = CliRunner().invoke(main, ["analyze", str(path), "--system", "cpu-a", "--db", str(db_path), "--json",
                                  "--input-value", "cond=0"])
    assert r.exit_code == 0, r.output
    (doc,) = json.loads(r.stdout)["analyses"]
    (said,) = [w for w in doc["warnings"] if w.startswith("to fill the missing benchmarks run: ")]
    generate_cmd = shlex.split(said.split(": ", 1)[1].split(" && ")[0])
    assert generate_cmd[:2] == ["benanza", "generate"] and "--input-value" in generate_cmd
    monkeypatch.chdir(tmp_path)
    g = CliRunner().invoke(main, generate_cmd[1:])
    assert g.exit_code == 0, g.output
    generated = {la["key"] for la in json.loads((tmp_path / "out" / "bench" / "layers.json").read_text())["layers"]}
    wanted = {n.layer.key for n in load_model(path, input_values={"cond": (0.0,)}).nodes}
    assert wanted <= generated
    assert wanted != {n.layer.key for n in load_model(path, input_values={"cond": (1.0,)}).nodes}


def test_a_text_input_that_decides_shapes_is_asked_for_as_input_data(tmp_path):
    """The `onnx` wheel's StringNormalizer model drops stop words, so its output length is the
    text's: the one error line asks for --input-data (--input-value reads numbers only)."""
    from pathlib import Path

    path = (Path(onnx.__file__).parent / "backend" / "test" / "data" / "simple"
            / "test_strnorm_model_monday_casesensintive_lower" / "model.onnx")
    r = CliRunner().invoke(main, ["generate", str(path), "--out", str(tmp_path / "o"), "--backend", "none"])
    assert r.exit_code != 0 and "Traceback" not in r.stderr
    (error,) = [ln for ln in r.stderr.splitlines() if ln.startswith("error")]
    assert error.endswith("input 'x' (str, 4) decides shapes static inference cannot resolve: "
                          "give real inputs with --input-data FILE.npz")
