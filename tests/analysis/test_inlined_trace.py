"""ONNX Runtime's trace of the ops inside a Loop or Scan body, matched to the layers Benanza
inlined for them, on the ONNX package's own backend test cases (their models and inputs): ORT
names a body node by its own name once per iteration; the k-th execution is iteration k's
inlined node, with that execution's time, and the Loop/Scan kernel keeps only its time outside
its body's ops."""

from __future__ import annotations

import json
import warnings
from collections import defaultdict

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from benanza.analysis.matching import match_trace
from benanza.parsers import parse_ort_profile
from benanza.processor import load_model

RUNS = 3


@pytest.fixture(scope="module")
def cases():
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the case code's own overflow warnings
        return {c.name: c for c in collect_testcases(None)}


def _profiled(case, tmp_path):
    name = case.name
    path = tmp_path / f"{name}.onnx"
    onnx.save(case.model, str(path))
    feed = {i.name: np.asarray(a) for i, a in zip(case.model.graph.input, case.data_sets[0][0])}
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "ort")
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    for _ in range(RUNS):
        sess.run(None, feed)
    trace = sess.end_profiling()
    return load_model(path, input_data=feed), trace


def _raw_executions(trace: str) -> tuple[dict[str, list[float]], set[str]]:
    """From the JSON itself: each node name's kernel durations (µs) in the runs after the first,
    in order, and the names of the runs' events."""
    events = json.loads(open(trace).read())
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                  if e.get("cat") == "Session" and e["name"] == "model_run")
    out: defaultdict[str, list[float]] = defaultdict(list)
    for e in sorted(events, key=lambda e: e["ts"]):
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            if any(a <= e["ts"] <= b for a, b in runs[1:]):
                out[e["name"][: -len("_kernel_time")]].append(float(e["dur"]))
    return out, set(out)


@pytest.mark.slow  # builds onnx's backend test cases (a quarter minute) and profiles them in ONNX Runtime
@pytest.mark.parametrize("name,container,trips", [("test_loop11", "Loop_0", 5), ("test_scan9_sum", "Scan_0", 3)])
def test_each_iterations_body_ops_match_that_iterations_inlined_layers(name, container, trips, cases, tmp_path):
    model, trace = _profiled(cases[name], tmp_path)
    assert model.control_flow[container] == f"{trips} iterations"
    match = match_trace(model, parse_ort_profile(trace))
    by_name = {n.name: n.index for n in model.nodes}
    raw, names = _raw_executions(trace)
    body = {n for n in names if n != container}
    assert body and all(len(raw[n]) == trips * (RUNS - 1) for n in body)
    groups = {g.name: g for g in match.groups}
    for own in body:
        for k in range(trips):
            g = groups[f"{container}/iter{k}/{own}"]
            assert g.nodes == (by_name[g.name],) and g.calls_per_run == 1
            # iteration k's execution in each steady run, as the JSON holds them
            assert g.time_ms == pytest.approx(sum(raw[own][k::trips]) / (RUNS - 1) / 1000.0)
    (kernel,) = [g for g in match.groups if g.op == container.split("_")[0]]
    assert not kernel.nodes and [g.name for g in match.inserted] == [container]
    # its own time: its span less its body's ops, which it encloses
    total = sum(raw[container]) / (RUNS - 1) / 1000.0
    inside = sum(sum(raw[n]) for n in body) / (RUNS - 1) / 1000.0
    assert kernel.time_ms == pytest.approx(total - inside, abs=1e-6)
    assert match.op_ms == pytest.approx(total, abs=1e-6)
