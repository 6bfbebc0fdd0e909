"""Recurrent layers (ONNX LSTM, GRU, RNN) on the oneDNN backend: covered where oneDNN's RNN
primitives compute the node, benchmarked through the real pipeline (generate → run → perf DB →
analyze), their outputs checked against ONNX Runtime's, and reported not covered, with the reason,
where the cell is one no library runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from helpers import generate_bench, io, model, tensor
from onnx import helper, numpy_helper

from benanza.backends.onednn import BACKEND
from benanza.cli import main
from benanza.generator import GenOptions, generate
from benanza.layers import unique_layers
from benanza.manifest import build_manifest
from benanza.model_stats import model_stats
from benanza.processor import load_model

T, N, IC, H = 6, 2, 5, 8  # sequence, batch, input and hidden sizes


def _node(op: str, name: str, x: str, hidden: int, gates: int, dirs: int, extra=(), **attrs):
    """A recurrent node reading ``x`` with its own W and R, and the optional inputs named in
    ``extra``: "B", "lens" (sequence_lens, each ``T`` unless given as ("lens", values)), "h0",
    "c0", "P" (an LSTM's peepholes); its initializers in ONNX's shapes."""
    inits = [tensor(f"{name}_W", (dirs, gates * hidden, IC)), tensor(f"{name}_R", (dirs, gates * hidden, hidden))]
    shapes = {"B": (dirs, 2 * gates * hidden), "h0": (dirs, N, hidden), "c0": (dirs, N, hidden),
              "P": (dirs, 3 * hidden)}
    names = [x, f"{name}_W", f"{name}_R", "", "", "", "", ""]
    for item in extra:
        what, lens = (item, [T] * N) if isinstance(item, str) else item
        names[{"B": 3, "lens": 4, "h0": 5, "c0": 6, "P": 7}[what]] = f"{name}_{what}"
        inits.append(numpy_helper.from_array(np.array(lens, np.int32), f"{name}_{what}") if what == "lens"
                     else tensor(f"{name}_{what}", shapes[what]))
    while not names[-1]:
        names.pop()
    return helper.make_node(op, names, [f"{name}_y"], hidden_size=hidden, name=name, **attrs), inits


def recurrent_model(path: Path) -> Path:
    """Every direction, cell, layout and optional input oneDNN's RNN primitives run: a
    bidirectional LSTM with initial states, a linear-before-reset GRU, a reversed GRU with
    full-length sequence_lens and an initial state, a plain RNN without biases, a
    batch-first (layout=1) LSTM, and a bidirectional LSTM with peepholes and initial states."""
    specs = [("LSTM", "lstm_bi", "x", 4, 2, ("B", "h0", "c0"), {"direction": "bidirectional"}),
             ("LSTM", "lstm_peep", "x", 4, 2, ("B", "h0", "c0", "P"), {"direction": "bidirectional"}),
             ("GRU", "gru_lbr", "x", 3, 1, ("B",), {"linear_before_reset": 1}),
             ("GRU", "gru_rev", "x", 3, 1, ("lens", "h0"), {"direction": "reverse"}),
             ("RNN", "rnn", "x", 1, 1, (), {}),
             ("LSTM", "lstm_bf", "xb", 4, 1, ("B",), {"layout": 1})]
    nodes, inits = [], []
    for op, name, x, gates, dirs, extra, attrs in specs:
        node, its = _node(op, name, x, H, gates, dirs, extra, **attrs)
        nodes.append(node)
        inits += its
    m = model(nodes, [io("x", [T, N, IC]), io("xb", [N, T, IC])], [io(n.output[0], None) for n in nodes], inits,
              opset=14)
    onnx.save(m, str(path))
    return path


def _gemm_flops(proto: onnx.ModelProto, node: onnx.NodeProto) -> int:
    """An independent count: each step multiplies the input by W and the state by R for every
    sequence of the batch, 2 FLOPs per weight (the weights' sizes read from the initializers)."""
    weights = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    x = next(i for i in proto.graph.input if i.name == node.input[0])
    dims = [d.dim_value for d in x.type.tensor_type.shape.dim]
    layout = next((a.i for a in node.attribute if a.name == "layout"), 0)
    steps = dims[1] if layout else dims[0]
    return 2 * (weights[node.input[1]].size + weights[node.input[2]].size) * steps * dims[1 - layout]


def test_every_cell_direction_and_layout_is_covered_with_the_right_primitive_and_flops(tmp_path):
    path = recurrent_model(tmp_path / "rnns.onnx")
    m = load_model(path, batch_size=N)
    proto = onnx.load(str(path))
    by_name = {n.name: n for n in proto.graph.node}
    primitives = {n.name: n.layer.onednn_primitive for n in m.nodes}
    assert primitives == {"lstm_bi": "lstm_forward", "lstm_peep": "lstm_forward", "gru_lbr": "lbr_gru_forward",
                          "gru_rev": "gru_forward", "rnn": "vanilla_rnn_forward", "lstm_bf": "lstm_forward"}
    for n in m.nodes:
        assert n.layer.flops == _gemm_flops(proto, by_name[n.name]), n.name
    stats = model_stats(m)
    onednn, cudnn = stats.backend("onednn"), stats.backend("cudnn")
    assert (onednn.covered, onednn.running, onednn.not_covered) == (6, 6, ())
    # cuDNN's LSTM cell has no peepholes: the one layer it cannot run
    assert cudnn.covered == 5 and dict(cudnn.not_covered) == {"LSTM": 1}
    gen = generate(build_manifest([m], unique_layers([m])), "onednn", tmp_path / "b", GenOptions(dtypes=("f32",)))
    assert sorted(v.api for v in gen.variants) == sorted(primitives.values())


@pytest.mark.parametrize("attrs, extra, reason", [
    ({"clip": 3.0}, (), "cell clip 3 (the libraries' cells do not clip)"),
    ({"activations": ["Sigmoid", "Tanh", "Relu"]}, (), "activations sigmoid, tanh, relu"),
    ({"input_forget": 1}, (), "input_forget=1"),
    ({}, (("lens", [T, T - 2]),), "sequence_lens shorter than the sequence"),
])
def test_an_lstm_no_library_cell_computes_is_not_covered_with_its_reason(tmp_path, attrs, extra, reason):
    """Through `benanza generate --backend onednn`: the LSTM is counted not covered, no benchmark
    is written for it, and one line says why."""
    node, inits = _node("LSTM", "odd", "x", H, 4, 1, extra, **attrs)
    path = tmp_path / "odd.onnx"
    onnx.save(model([node], [io("x", [T, N, IC])], [io("odd_y", None)], inits, opset=14), str(path))
    r = CliRunner().invoke(main, ["generate", str(path), "--out", str(tmp_path / "b"), "--backend", "onednn",
                                  "-b", str(N)])
    assert r.exit_code == 0, r.output
    (line,) = [ln for ln in r.stdout.splitlines() if "not covered by onednn: LSTM" in ln]
    assert line.startswith("odd: not covered by onednn: LSTM 'odd': ") and reason in line
    assert "0 benchmark variants" in r.stdout
    r = CliRunner().invoke(main, ["generate", str(path), "--out", str(tmp_path / "j"), "--backend", "onednn",
                                  "-b", str(N), "--json"])
    assert json.loads(r.stdout)["total"]["backends"]["onednn"]["not_covered"] == {"LSTM": 1}


@pytest.mark.slow
def test_generate_run_analyze_and_check_against_onnx_runtime(tmp_path):
    """The benchmarks build and run (status ok), each layer's latency is in the oneDNN bound, and
    each benchmark's output (oneDNN's gate order and layouts from ONNX's weights) equals ONNX
    Runtime's (or onnx's reference evaluator's, for layout=1, which ONNX Runtime lacks) on the same
    inputs."""
    from benanza.check import CheckStatus, check
    from benanza.perfdb import PerfDB
    from benanza.runner import RunOptions, run
    from tests.analysis.test_bounds_e2e import JSON_MS, best_by_key, node_keys

    path = recurrent_model(tmp_path / "rnns.onnx")
    m = load_model(path, batch_size=N)
    bench = tmp_path / "bench"
    _, gen = generate_bench([m], "onednn", bench, GenOptions(dtypes=("f32",)))
    summary = run(bench, "ci", "onednn", tmp_path / "r.db", RunOptions(min_time=0.01, repetitions=1))
    assert summary.stored == summary.total == len(gen.variants) == 6 and summary.failed == 0
    with PerfDB(tmp_path / "r.db") as pdb:
        results = pdb.results("ci")
    assert all(r.ok and r.median_ms > 0 and r.implementation for r in results), results

    r = CliRunner().invoke(main, ["analyze", str(path), "--system", "ci", "--db", str(tmp_path / "r.db"),
                                  "--dtype", "f32", "-b", str(N), "--json"])
    assert r.exit_code == 0, r.output
    (a,) = json.loads(r.output)["analyses"]
    best = best_by_key(tmp_path / "r.db", "ci", "f32")
    keys = node_keys(bench, path.stem, "f32")
    assert set(keys) == {n.name for n in m.nodes} and all(best[k] > 0 for k in keys.values())
    assert not a["bounds"]["partial"]
    assert a["bounds"]["sequential_ms"] == pytest.approx(sum(best[k] for k in keys.values()), **JSON_MS)

    checked = check(bench, [m])
    assert [c.status for c in checked] == [CheckStatus.OK] * 6, [c for c in checked if c.status != CheckStatus.OK]
    assert {c.compared.split(" node ")[0] for c in checked} == {"LSTM", "GRU", "RNN"}
    assert BACKEND.covers(m.nodes[0].layer)


@pytest.mark.slow
def test_onnx_backend_recurrent_cases_match_onnx_runtime(tmp_path):
    """ONNX's own LSTM, GRU and RNN test models (shipped in the onnx wheel: defaults, biases,
    full-length sequence_lens, batch-first, reverse, bidirectional, peepholes): each is covered and
    its oneDNN benchmark's Y equals ONNX Runtime's on the same inputs. The peephole case feeds
    sequence_lens as a graph input, known only at run time; its data gives every sequence its
    full length, which is what omitting the input means, so it is omitted here."""
    import warnings

    from onnx.backend.test.case.node import collect_testcases

    from benanza.check import CheckStatus, check

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the case code's own overflow warnings
        cases = [c for c in collect_testcases(None) if c.model.graph.node[0].op_type in ("LSTM", "GRU", "RNN")]
    assert len(cases) >= 18
    paths = []
    for c in cases:
        paths.append(tmp_path / f"{c.name}.onnx")
        onnx.save(_full_length_lens_omitted(c), str(paths[-1]))
    r = CliRunner().invoke(main, ["generate", *map(str, paths), "--out", str(tmp_path / "b"), "--backend", "onednn",
                                  "--dtype", "f32"])
    assert r.exit_code == 0, r.output
    assert not [ln for ln in r.stdout.splitlines() if ": not covered by onednn:" in ln], r.stdout
    models = [load_model(p) for p in paths]
    checked = check(tmp_path / "b", models)
    covered = {n.layer.key for m in models for n in m.nodes if n.layer.onednn_primitive is not None}
    assert len(checked) == len(covered) and len(covered) >= 16
    assert all(c.status == CheckStatus.OK for c in checked), [c for c in checked if c.status != CheckStatus.OK]
    (peep,) = [m for m in models if m.name == "test_lstm_with_peepholes"]
    assert peep.nodes[0].layer.problem.peephole and peep.nodes[0].layer.key in covered


def _full_length_lens_omitted(case) -> onnx.ModelProto:
    """The case's model with a sequence_lens graph input removed where the case's data gives
    every sequence the full length T (ONNX's meaning of an omitted sequence_lens)."""
    m = onnx.ModelProto()
    m.CopyFrom(case.model)
    node = m.graph.node[0]
    names = [i.name for i in m.graph.input]
    if len(node.input) <= 4 or node.input[4] not in names:
        return m
    lens, x = case.data_sets[0][0][names.index(node.input[4])], case.data_sets[0][0][0]
    layout = next((a.i for a in node.attribute if a.name == "layout"), 0)
    assert (lens == x.shape[1 if layout else 0]).all(), lens
    del m.graph.input[names.index(node.input[4])]
    node.input[4] = ""
    return m
