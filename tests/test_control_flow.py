"""Scan unrolled like Loop (benanza.control_flow): ONNX Runtime on the unrolled model gives the
outputs ONNX Runtime gives on the original (where it runs the Scan itself) and, on the ONNX
package's own Scan cases, the outputs ONNX's reference computed; `generate` then costs the body
once per iteration, with the keys and FLOPs the same ops have outside a Scan, and the slices of
the Scan's inputs and outputs that are contiguous in memory as free views."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from helpers import best_low_ms, invoke, io, model, tensor
from onnx import TensorProto, helper, numpy_helper

from benanza import control_flow, shapes_by_execution
from benanza.cli import main
from benanza.control_flow import inline_control_flow
from benanza.processor import inferred_shapes, load_model
from tests.test_shapes_by_execution import _write, cases  # noqa: F401 - `cases` is a fixture


@pytest.fixture
def runs(monkeypatch) -> list[set[str]]:
    """The tensors each ONNX Runtime run of the processor was made for (the real runs, recorded)."""
    made: list[set[str]] = []
    real = shapes_by_execution.run_once

    def recorded(*args):
        made.append(args[3])
        return real(*args)

    monkeypatch.setattr(control_flow, "run_once", recorded)
    monkeypatch.setattr(shapes_by_execution, "run_once", recorded)
    return made


def _ort(m: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feed)


def _unrolled(m: onnx.ModelProto, tmp_path, feed: dict[str, np.ndarray]) -> tuple[onnx.ModelProto, dict[str, str]]:
    """The model as the processor inlines it, and what each control-flow node became."""
    path = tmp_path / "scan.onnx"
    onnx.save(m, str(path))
    inlined = inline_control_flow(m, path, {k: v.shape for k, v in feed.items()}, {}, feed, inferred_shapes)
    assert inlined.failure == ""
    return inlined.model, {t.node: t.branch for t in inlined.taken}


def _ops(m: onnx.ModelProto) -> set[str]:
    return {n.op_type for n in m.graph.node}


def _same_outputs(m: onnx.ModelProto, tmp_path, feed: dict[str, np.ndarray]) -> dict[str, str]:
    """Unrolls ``m``, checks ORT computes the original's outputs from the unrolled graph, and
    returns what each control-flow node became."""
    unrolled, became = _unrolled(m, tmp_path, feed)
    assert "Scan" not in _ops(unrolled)
    for want, got in zip(_ort(m, feed), _ort(unrolled, feed), strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    return became


@pytest.mark.slow  # runs onnx's backend test cases (the `cases` fixture: they take a quarter minute to build)
def test_the_backend_scan_cases_unroll_to_the_outputs_onnx_computed(cases, tmp_path):  # noqa: F811
    """Every opset-9+ case of the ONNX package with a Scan (its Scan cases, and the LinearAttention
    function bodies, which scan the sequence): the unrolled model's outputs are the ones ORT computes
    on the original and the ones ONNX's reference computed (the case's expected outputs)."""
    chosen = sorted(n for n, c in cases.items() if "Scan" in {x.op_type for x in c.model.graph.node}
                    and c.model.opset_import[0].version >= 9)
    assert {"test_scan9_sum", "test_linear_attention_gated_delta_expanded"} <= set(chosen)
    for name in chosen:
        case = cases[name]
        inputs, outputs = case.data_sets[0]
        feed = {i.name: np.asarray(a) for i, a in zip(case.model.graph.input, inputs)}
        unrolled, became = _unrolled(case.model, tmp_path, feed)
        (what,) = became.values()
        assert what.endswith(" iterations") and "Scan" not in _ops(unrolled), name
        for want, got, ort_got in zip(outputs, _ort(unrolled, feed), _ort(case.model, feed), strict=True):
            np.testing.assert_allclose(got, ort_got, rtol=1e-6, atol=1e-6, err_msg=name)
            tolerance = 2e-3 if got.dtype == np.float16 else 1e-5
            np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance, err_msg=name)


@pytest.mark.slow  # runs onnx's backend test cases (the `cases` fixture: they take a quarter minute to build)
@pytest.mark.parametrize("name", ["test_scan9_sum", "test_scan9_multi_state", "test_scan9_scalar"])
def test_the_backend_scan_cases_cost_their_body_once_per_element(cases, tmp_path, name):  # noqa: F811
    """The body's Add once per element of the scan input, named by its path; the outputs have the
    shapes ONNX's reference computed."""
    path, data, expected = _write(cases[name], tmp_path)
    m = load_model(path, input_data=data)
    trips = len(data["x"])
    assert m.control_flow == {"Scan_0": f"{trips} iterations"} and m.uncosted == []
    assert sorted(n.name for n in m.nodes if n.layer.op == "Add") == [f"Scan_0/iter{i}/Add_0" for i in range(trips)]
    assert {o: s for n in m.nodes for o, s in zip(n.outputs, (t.shape for t in n.layer.outputs))
            if o in expected} == expected


@pytest.mark.slow  # runs onnx's backend test cases (the `cases` fixture: they take a quarter minute to build)
def test_opset8_scan_stays_one_node_and_says_why(cases, tmp_path):  # noqa: F811
    path, data, expected = _write(cases["test_scan_sum"], tmp_path)
    m = load_model(path, input_data=data)
    why = "stays one node: opset 8's batched Scan (with sequence_lens) is not unrolled"
    assert m.control_flow == {"Scan_0": why}
    assert [n.layer.op for n in m.nodes] == ["Scan"] and m.nodes[0].layer.outputs[1].shape == expected["z"]
    r = CliRunner().invoke(main, ["generate", str(path), "--out", str(tmp_path / "o"), "--backend", "none",
                                  "--input-data", str(_npz(tmp_path, data))])
    assert r.exit_code == 0, r.output
    assert f"uncosted: the body of 'Scan_0', which {why}" in r.stdout


def _npz(tmp_path, data: dict[str, np.ndarray]):
    path = tmp_path / "inputs.npz"
    np.savez(path, **data)
    return path


def _two_way_scan(opset: int) -> onnx.ModelProto:
    """An RNN-like Scan with every attribute off its default: x (2×5×3) scanned on axis 1 (-2
    from opset 11), y (5×3) scanned on axis 0 backward; state h (2×4); the body reads a weight of
    its own and a tensor of the outer graph; scan outputs h stacked on axis 1 (2×5×4) and Relu(x_t)
    stacked on the last axis, prepended (2×3×5)."""
    body = helper.make_graph(
        [helper.make_node("MatMul", ["x_t", "W"], ["a"], name="MatMul_x"),
         helper.make_node("MatMul", ["y_t", "U"], ["b"], name="MatMul_y"),
         helper.make_node("Add", ["a", "b"], ["ab"]),
         helper.make_node("Add", ["ab", "h_in"], ["abh"]),
         helper.make_node("Add", ["abh", "bias"], ["pre"]),
         helper.make_node("Tanh", ["pre"], ["h_out"]),
         helper.make_node("Identity", ["h_out"], ["h_seq"]),
         helper.make_node("Relu", ["x_t"], ["x_relu"])], "body",
        [io("h_in", [2, 4]), io("x_t", [2, 3]), io("y_t", [3])],
        [io("h_out", [2, 4]), io("h_seq", [2, 4]), io("x_relu", [2, 3])], [tensor("W", (3, 4)), tensor("U", (3, 4))])
    negative = opset >= 11
    scan = helper.make_node("Scan", ["h0", "x", "y"], ["h", "hs", "xs"], body=body, num_scan_inputs=2,
                            scan_input_axes=[-2 if negative else 1, 0], scan_input_directions=[0, 1],
                            scan_output_axes=[-2 if negative else 1, -1 if negative else 2],
                            scan_output_directions=[0, 1], name="Scan_0")
    return model([scan], [io("h0", [2, 4]), io("x", [2, 5, 3]), io("y", [5, 3])],
                 [io("h", None), io("hs", None), io("xs", None)], [tensor("bias", (4,))], opset=opset)


@pytest.mark.parametrize("opset", [9, 11, 17])  # axes as attributes ≥ 0, negative, Unsqueeze's axes an input
def test_a_scan_backward_on_other_axes_unrolls_to_what_ort_computes(tmp_path, runs, opset):
    """Its scan inputs are graph inputs, so their length is static: no run is made for it."""
    rng = np.random.default_rng(0)
    feed = {"h0": rng.standard_normal((2, 4)), "x": rng.standard_normal((2, 5, 3)),
            "y": rng.standard_normal((5, 3))}
    feed = {k: v.astype(np.float32) for k, v in feed.items()}
    assert _same_outputs(_two_way_scan(opset), tmp_path, feed) == {"Scan_0": "5 iterations"}
    assert runs == []
    unrolled, _ = _unrolled(_two_way_scan(opset), tmp_path, feed)
    first = {n.name: n for n in unrolled.graph.node if n.name.startswith("Scan_0/iter0/")}
    index = {t.name: int(numpy_helper.to_array(t)) for t in unrolled.graph.initializer if "/position/" in t.name}
    assert [index[first[f"Scan_0/iter0/scan_input_{k}"].input[1]] for k in (0, 1)] == [0, 4]  # y read from its end


def _scan_of(seq: str, state: str, prefix: str) -> onnx.NodeProto:
    """A running sum over ``seq`` (n×2) from ``state`` (2), its partial sums doubled as scan output."""
    body = helper.make_graph(
        [helper.make_node("Add", [f"{prefix}s_in", f"{prefix}e"], [f"{prefix}s_out"]),
         helper.make_node("Add", [f"{prefix}s_out", f"{prefix}s_out"], [f"{prefix}twice"])], f"{prefix}body",
        [io(f"{prefix}s_in", [2]), io(f"{prefix}e", [2])], [io(f"{prefix}s_out", [2]), io(f"{prefix}twice", [2])])
    return helper.make_node("Scan", [state, seq], [f"{prefix}sum", f"{prefix}partial"], body=body, num_scan_inputs=1,
                            name="Scan_0")


def test_a_scan_in_a_loop_unrolls_in_each_iteration(tmp_path):
    """The Loop's state (4×2) is the Scan's sequence: in iteration 0 the graph input, in the next
    ones the tensor the previous iteration computes."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]),
         _scan_of("v_in", "zero", "in_"),
         helper.make_node("Add", ["v_in", "in_partial"], ["v_out"]),
         helper.make_node("Identity", ["in_sum"], ["sums"])], "loop_body",
        [io("i", [], TensorProto.INT64), io("c_in", [], TensorProto.BOOL), io("v_in", [4, 2])],
        [io("c_out", [], TensorProto.BOOL), io("v_out", [4, 2]), io("sums", [2])])
    m = model([helper.make_node("Loop", ["M", "go", "x"], ["v", "all_sums"], body=body, name="Loop_0")],
              [io("x", [4, 2])], [io("v", None), io("all_sums", None)],
              [numpy_helper.from_array(np.array(3, np.int64), "M"), numpy_helper.from_array(np.array(True), "go"),
               tensor("zero", (2,), 0.0)], opset=16)
    feed = {"x": np.arange(8, dtype=np.float32).reshape(4, 2)}
    became = _same_outputs(m, tmp_path, feed)
    assert became == {"Loop_0": "3 iterations", **{f"Loop_0/iter{i}/Scan_0": "4 iterations" for i in range(3)}}
    path = tmp_path / "scan.onnx"
    nodes = {n.name: n for n in load_model(path, input_data=feed).nodes}
    assert {f"Loop_0/iter{i}/Scan_0/iter{j}/Add_0" for i in range(3) for j in range(4)} <= set(nodes)
    # the inner Scan reads and writes its axis-0 slices in place; ORT's Loop copies its iterations'
    # outputs together (loop.cc, ConcatenateLoopOutput), so the Loop's Concat stays a copy
    assert {n for n, node in nodes.items() if node.in_place} == \
        {f"Loop_0/iter{i}/Scan_0/iter{j}/scan_input_0" for i in range(3) for j in range(4)} | \
        {f"Loop_0/iter{i}/Scan_0/scan_0/concat" for i in range(3)}
    assert nodes["Loop_0/scan_0/concat"].runs


@pytest.mark.parametrize("cond", [True, False])
def test_a_scan_in_the_branch_taken_unrolls(tmp_path, cond):
    then = helper.make_graph([_scan_of("x", "zero", "t_")], "then", [], [io("t_sum", [2]), io("t_partial", [3, 2])])
    other = helper.make_graph([helper.make_node("ReduceSum", ["x", "axis0"], ["e_sum"], keepdims=0),
                               helper.make_node("Relu", ["x"], ["e_partial"])], "else", [],
                              [io("e_sum", [2]), io("e_partial", [3, 2])])
    m = model([helper.make_node("If", ["cond"], ["s", "p"], then_branch=then, else_branch=other, name="If_0")],
              [io("x", [3, 2]), io("cond", [], TensorProto.BOOL)], [io("s", None), io("p", None)],
              [tensor("zero", (2,), 0.0), numpy_helper.from_array(np.array([0], np.int64), "axis0")], opset=16)
    feed = {"x": np.arange(6, dtype=np.float32).reshape(3, 2), "cond": np.array(cond)}
    became = _same_outputs(m, tmp_path, feed)
    assert became == ({"If_0": "then", "If_0/then/Scan_0": "3 iterations"} if cond else {"If_0": "else"})


def test_a_scan_over_embedded_token_ids_needs_no_value_and_no_run(tmp_path, runs):
    """The Scan reads the embeddings of 8 token ids (int64, few enough to be a deciding input if a
    run were made for them): static inference gives the sequence's length, so no run is made and
    no --input-value is asked for, and the Scan unrolls to the ids' count."""
    m = model([helper.make_node("Gather", ["table", "ids"], ["emb"]),
               helper.make_node("Squeeze", ["emb", "zero_axis"], ["seq"]),
               _scan_of("seq", "zero", "")],
              [io("ids", [1, 8], TensorProto.INT64)], [io("sum", None), io("partial", None)],
              [tensor("table", (100, 2)), tensor("zero", (2,), 0.0),
               numpy_helper.from_array(np.array([0], np.int64), "zero_axis")], opset=16)
    path = tmp_path / "embedded.onnx"
    onnx.save(m, str(path))
    processed = load_model(path)
    assert processed.control_flow == {"Scan_0": "8 iterations"} and runs == []


def test_a_scan_whose_length_a_value_decides_takes_it_from_the_run(tmp_path, runs):
    """The Scan reads the first k rows of x, k an input: static inference cannot tell the length,
    the run made for it can, with k's value given (and asked for when it is not)."""
    m = model([helper.make_node("Slice", ["x", "start", "k"], ["rows"]), _scan_of("rows", "zero", "")],
              [io("x", [6, 2]), io("k", [1], TensorProto.INT64)], [io("sum", None), io("partial", None)],
              [tensor("zero", (2,), 0.0), numpy_helper.from_array(np.array([0], np.int64), "start")], opset=16)
    feed = {"x": np.arange(12, dtype=np.float32).reshape(6, 2), "k": np.array([4], np.int64)}
    assert _same_outputs(m, tmp_path, feed) == {"Scan_0": "4 iterations"} and runs == [{"rows"}]
    path = tmp_path / "scan.onnx"
    assert load_model(path, input_values={"k": (4.0,)}).control_flow == {"Scan_0": "4 iterations"}
    r = CliRunner().invoke(main, ["generate", str(path), "--out", str(tmp_path / "o"), "--backend", "none"])
    assert r.exit_code != 0 and r.stderr.strip().splitlines()[-1].endswith(
        "input 'k' (i64, 1) decides shapes or branches static inference cannot resolve: give its value with "
        "--input-value k=V (or real inputs with --input-data FILE.npz)")


def test_a_scan_past_max_trips_stays_one_node_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(control_flow, "MAX_TRIPS", 4)
    m = model([_scan_of("x", "zero", "")], [io("x", [5, 2])], [io("sum", None), io("partial", None)],
              [tensor("zero", (2,), 0.0)], opset=16)
    path = tmp_path / "long.onnx"
    onnx.save(m, str(path))
    processed = load_model(path)
    assert processed.control_flow == {"Scan_0": "stays one node: 5 iterations, more than the 4 Benanza unrolls"}
    assert [n.layer.op for n in processed.nodes] == ["Scan"]


def _rnn_body(batch: int = 1) -> onnx.GraphProto:
    """An Elman cell on batch×64: h = Tanh(x_t·W + h·U)."""
    return helper.make_graph(
        [helper.make_node("MatMul", ["x_t", "W"], ["xw"], name="MatMul_0"),
         helper.make_node("MatMul", ["h_in", "U"], ["hu"], name="MatMul_1"),
         helper.make_node("Add", ["xw", "hu"], ["pre"], name="Add_2"),
         helper.make_node("Tanh", ["pre"], ["h_out"], name="Tanh_3"),
         helper.make_node("Identity", ["h_out"], ["h_seq"], name="Identity_4")], "cell",
        [io("h_in", [batch, 64]), io("x_t", [batch, 64])], [io("h_out", [batch, 64]), io("h_seq", [batch, 64])],
        [tensor("W", (64, 64)), tensor("U", (64, 64))])


def test_generate_costs_the_scan_body_once_per_iteration(tmp_path):
    """A 6-step Elman RNN as a Scan: `generate` reports the Scan unrolled 6 times, and its layers
    have the keys of the same cell processed as a model of its own (the body's inputs as graph
    inputs), FLOPs and MACs 6 × the cell's, whose MatMuls' MACs are counted by hand."""
    trips = 6
    m = model([helper.make_node("Scan", ["h0", "x"], ["h", "hs"], body=_rnn_body(), num_scan_inputs=1,
                                name="Scan_0")],
              [io("h0", [1, 64]), io("x", [trips, 1, 64])], [io("h", None), io("hs", None)], opset=17)
    path = tmp_path / "rnn.onnx"
    onnx.save(m, str(path))
    body = _rnn_body()
    cell_model = helper.make_model(helper.make_graph(body.node, "cell", body.input, body.output, body.initializer),
                                   opset_imports=[helper.make_opsetid("", 17)])
    cell_path = tmp_path / "cell.onnx"
    onnx.save(cell_model, str(cell_path))
    cell = {n.name: n.layer for n in load_model(cell_path).nodes}

    r = CliRunner().invoke(main, ["generate", str(path), "--out", str(tmp_path / "o"), "--backend", "none"])
    assert r.exit_code == 0, r.output
    assert f"Scan 'Scan_0' ran {trips} iterations for these inputs" in r.stdout
    r = CliRunner().invoke(main, ["generate", str(path), "--out", str(tmp_path / "o"), "--backend", "none", "--json"])
    (stats,) = json.loads(r.stdout)["models"]
    assert stats["control_flow"] == {"Scan_0": f"{trips} iterations"}
    assert stats["control_flow_ops"] == {"Scan_0": "Scan"}
    assert sum(la.macs for la in cell.values() if la.op == "MatMul") == 2 * 64 * 64
    assert stats["macs"] == trips * sum(la.macs for la in cell.values())

    layers = json.loads((tmp_path / "o" / "layers.json").read_text())["layers"]
    at = {o["node"]: la for la in layers for o in la["occurrences"]}
    for i in range(trips):
        for name, layer in cell.items():
            assert at[f"Scan_0/iter{i}/{name}"]["key"] == layer.key
    assert sum(la["flops"] * len(la["occurrences"]) for la in layers) == trips * sum(la.flops for la in cell.values())


TRIPS = 6


def _rnn_scan(batch: int, in_axis: int, out_axis: int = 0) -> onnx.ModelProto:
    """The Elman cell on batch×64 scanned over TRIPS steps of x, its sequence on ``in_axis`` (0:
    TRIPS×batch×64, 1 or -2: batch×TRIPS×64), its hidden states stacked on ``out_axis``."""
    x = [TRIPS, batch, 64] if in_axis == 0 else [batch, TRIPS, 64]
    scan = helper.make_node("Scan", ["h0", "x"], ["h", "hs"], body=_rnn_body(batch), num_scan_inputs=1,
                            scan_input_axes=[in_axis], scan_output_axes=[out_axis], name="Scan_0")
    return model([scan], [io("h0", [batch, 64]), io("x", x)], [io("h", None), io("hs", None)], opset=17)


def _feed(m: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
            for i in m.graph.input}


def _contiguous_by_numpy(m: onnx.ModelProto, unrolled: onnx.ModelProto, feed: dict[str, np.ndarray]) -> set[str]:
    """The unroll's slicing nodes whose slices are contiguous NumPy views of the real arrays: a
    Gather's slice of the graph input it reads, a Concat's slices of the output ORT computes for
    the original model (every slice, one per iteration)."""
    arrays = {**feed, **dict(zip([o.name for o in m.graph.output], _ort(m, feed)))}
    index = {t.name: int(numpy_helper.to_array(t)) for t in unrolled.graph.initializer if "/position/" in t.name}
    found = set()
    for n in unrolled.graph.node:
        tensor_name = n.input[0] if n.op_type == "Gather" else n.output[0]
        if n.op_type not in ("Gather", "Concat") or tensor_name not in arrays:
            continue
        a = arrays[tensor_name]
        axis = helper.get_attribute_value(next(x for x in n.attribute if x.name == "axis")) % a.ndim
        at = [index[n.input[1]]] if n.op_type == "Gather" else range(a.shape[axis])
        if all(a[(slice(None),) * axis + (i,)].flags.c_contiguous for i in at):
            found.add(n.name)
    return found


@pytest.mark.parametrize("scan", [
    _rnn_scan(1, 0), _rnn_scan(1, 1), _rnn_scan(1, -2), _rnn_scan(2, 1), _rnn_scan(1, 0, 1), _rnn_scan(2, 0, 1),
    _two_way_scan(17)], ids=["axis0", "axis1-after-1", "axis-2-after-1", "axis1-after-2", "out-axis1-after-1",
                             "out-axis1-after-2", "two-way"])
def test_the_scan_slices_marked_in_place_are_the_contiguous_ones(tmp_path, scan):
    """The nodes the unroll marks in place are exactly those whose slices NumPy views contiguously:
    the sequence on axis 0 or after dims of 1; in the two-way Scan, y (axis 0) alone, as x is
    scanned on axis 1 after a dim of 2 and both outputs stack after one. The outputs stay ORT's."""
    feed = _feed(scan)
    assert _same_outputs(scan, tmp_path, feed)["Scan_0"].endswith(" iterations")
    path = tmp_path / "scan.onnx"
    inlined = inline_control_flow(scan, path, {k: v.shape for k, v in feed.items()}, {}, feed, inferred_shapes)
    assert inlined.in_place == _contiguous_by_numpy(scan, inlined.model, feed)
    assert inlined.in_place  # every case has one: the oracle is not vacuous


@pytest.fixture(scope="module")
def rnn_bounds(tmp_path_factory):
    """The RNN Scan on axis 0 (batch 1) and on axis 1 after a dim of 2, generated, benchmarked with
    oneDNN on one thread and analyzed: each one's processed model, cell model, analysis and DB."""
    root = tmp_path_factory.mktemp("rnn_bounds")
    paths = {}
    for name, batch, axis in (("axis0", 1, 0), ("axis1", 2, 1)):
        paths[name] = root / f"{name}.onnx"
        onnx.save(_rnn_scan(batch, axis), paths[name])
        body = _rnn_body(batch)
        onnx.save(helper.make_model(helper.make_graph(body.node, "cell", body.input, body.output, body.initializer),
                                    opset_imports=[helper.make_opsetid("", 17)]), root / f"{name}_cell.onnx")
    db = root / "perf.db"
    invoke("generate", *map(str, paths.values()), "--backend", "onednn", "--out", str(root / "bench"))
    invoke("run", "--system", "box", "--backend", "onednn", "--bench-dir", str(root / "bench"), "--db", str(db),
           "--threads", "1", "--min-time", "0.01", "--repetitions", "1")
    out = {}
    for name, path in paths.items():
        (analysis,) = json.loads(invoke("analyze", str(path), "--system", "box", "--db", str(db),
                                        "--backend", "onednn", "--json"))["analyses"]
        out[name] = (load_model(path), load_model(root / f"{name}_cell.onnx"), analysis, db)
    return out


def _cell_bound_ms(cell, db) -> float:
    """One step of the cell, its layers processed outside any Scan, from the database in SQL."""
    return sum(best_low_ms(db, "onednn", n.layer.key) or 0.0 for n in cell.nodes if n.runs)


@pytest.mark.slow  # builds and runs oneDNN benchmarks
def test_the_bound_of_an_rnn_scan_on_axis_0_has_no_copy_of_its_slices(rnn_bounds):
    """Scanned on axis 0, x's slices and the stacked hidden states are free views: the bound is
    TRIPS × the cell's, from the database in SQL; the FLOPs are TRIPS × the cell's."""
    m, cell, analysis, db = rnn_bounds["axis0"]
    rows = {r["name"]: r for r in analysis["layers"]}
    slicing = [f"Scan_0/iter{i}/scan_input_0" for i in range(TRIPS)] + ["Scan_0/scan_0/concat"]
    assert [rows[n]["status"] for n in slicing] == ["free_view"] * (TRIPS + 1)
    assert not [r for r in analysis["layers"] if r["status"] != "free_view" and r["op"] in ("Gather", "Concat")]
    assert analysis["bounds"]["partial"] is False
    assert analysis["bounds"]["sequential_ms"] == pytest.approx(TRIPS * _cell_bound_ms(cell, db), abs=1e-5)
    assert sum(n.layer.flops for n in m.nodes) == TRIPS * sum(n.layer.flops for n in cell.nodes)


@pytest.mark.slow  # builds and runs oneDNN benchmarks
def test_the_bound_of_an_rnn_scan_on_axis_1_keeps_the_copies_of_its_slices(rnn_bounds):
    """Scanned on axis 1 after a dim of 2, each step's slice is a copy of its own, measured (ORT
    transposes x whole); its hidden states still stack on axis 0, in place."""
    m, cell, analysis, db = rnn_bounds["axis1"]
    rows = {r["name"]: r for r in analysis["layers"]}
    copies = [rows[f"Scan_0/iter{i}/scan_input_0"] for i in range(TRIPS)]
    assert {r["status"] for r in copies} == {"ok"} and len({r["key"] for r in copies}) == TRIPS
    assert [r["latency_ms"] for r in copies] == pytest.approx([best_low_ms(db, "onednn", r["key"]) for r in copies],
                                                              abs=1e-6)
    assert rows["Scan_0/scan_0/concat"]["status"] == "free_view"
    assert analysis["bounds"]["sequential_ms"] == pytest.approx(
        TRIPS * _cell_bound_ms(cell, db) + sum(r["latency_ms"] for r in copies), abs=1e-5)
    assert sum(n.layer.flops for n in m.nodes) == TRIPS * sum(n.layer.flops for n in cell.nodes)
