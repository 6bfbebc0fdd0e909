"""A softmax over a non-innermost axis (YOLOv8n's DFL head: axis 1 of 1×16×4×2100) gets only
oneDNN's reference code in its row-major layout, and so does a reduction over such an axis. The
`axis_inner` variant reorders the tensor so the axis is innermost, runs the optimized kernel (and
reorders a softmax back), all timed: checked end to end
on a model built here (generate → `benanza check` against ONNX Runtime → `benanza run` → the
implementation names oneDNN reports → `benanza analyze`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from helpers import io, model
from onnx import helper

from benanza.perfdb import PerfDB

pytestmark = pytest.mark.slow  # builds and runs oneDNN benchmarks

BENANZA = str(Path(sys.executable).parent / "benanza")
DFL = [1, 16, 4, 2100]


def cli(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([BENANZA, *args], capture_output=True, text=True, timeout=1500,
                          env=dict(os.environ, COLUMNS="250"))
    assert done.returncode == 0, f"benanza {' '.join(args)}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


def dfl_head():
    """The DFL head's Softmax over the 16 bins (axis 1), one over the last axis beside it, and a
    mean over the bins (a reduction over a non-innermost axis)."""
    nodes = [helper.make_node("Softmax", ["x"], ["y"], axis=1, name="dfl_softmax"),
             helper.make_node("Softmax", ["y"], ["z"], axis=-1, name="last_softmax"),
             helper.make_node("ReduceMean", ["x"], ["m"], axes=[1], keepdims=1, name="bins_mean")]
    return model(nodes, [io("x", DFL)], [io("z", None), io("m", None)])


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    d = tmp_path_factory.mktemp("softmax")
    path = d / "dfl.onnx"
    onnx.save(dfl_head(), str(path))
    cli("generate", str(path), "--out", str(d / "bench"), "--backend", "onednn", "--dtype", "f32")
    return d, path


def test_the_axis_inner_variant_computes_the_softmax(measured):
    """ONNX Runtime runs the layer on the same inputs: both variants of the axis-1 softmax agree
    with it (the reorders put every value back where the model expects it)."""
    d, path = measured
    out = cli("check", str(path), "--bench-dir", str(d / "bench"), "--show-ok")
    text = out.stdout + out.stderr
    inner = [line for line in text.splitlines() if "axis_inner" in line]
    assert inner and all(line.startswith("ok") for line in inner), text[-3000:]
    # both variants of the axis-1 softmax and of the mean, and the last-axis softmax
    assert "5 ok, 0 mismatch" in text


def test_oneDNN_runs_its_optimized_kernel_only_with_the_axis_innermost(measured):
    d, path = measured
    cli("run", "--bench-dir", str(d / "bench"), "--system", "box", "--db", str(d / "perf.db"), "--backend", "onednn",
        "--threads", "1", "--min-time", "0.02", "--repetitions", "1", "--max-contention", "1", "--no-peaks")
    with PerfDB(d / "perf.db") as db:
        results = db.results("box")
    by_layout = {}
    for r in results:
        if r.ok and "softmax_in1x16x4x2100_axis1" in r.variant.layer_key:
            by_layout[r.variant.layout] = r
    assert set(by_layout) == {"plain", "axis_inner"}, [r.variant.name for r in results]
    # the names oneDNN reports: its reference code in the row-major layout; a reorder, an optimized
    # (JIT) softmax and a reorder back with the axis innermost
    assert by_layout["plain"].implementation.startswith("ref"), by_layout["plain"].implementation
    parts = by_layout["axis_inner"].implementation.split(" + ")
    assert len(parts) == 3 and not any(p.startswith("ref") for p in parts), parts
    assert parts[1].startswith("jit"), parts
    mean = {r.variant.layout: r for r in results if r.ok and r.variant.problem.family == "reduce"}
    assert set(mean) == {"plain", "axis_inner"} and mean["plain"].implementation.startswith("ref")
    parts = mean["axis_inner"].implementation.split(" + ")  # a reorder, then a JIT reduction
    assert len(parts) == 2 and parts[1].startswith("jit"), parts
    last = [r for r in results if r.ok and "axis3" in r.variant.layer_key]
    assert [r.variant.layout for r in last] == ["plain"]  # already innermost: no second variant
    assert not last[0].implementation.startswith("ref")

    a = json.loads(cli("analyze", str(path), "--system", "box", "--db", str(d / "perf.db"), "--json").stdout)
    (an,) = a["analyses"]
    dfl = next(r for r in an["layers"] if r["name"] == "dfl_softmax")
    chosen = min(by_layout.values(), key=lambda r: (r.latency_ms, r.variant.name))
    assert dfl["variant"] == chosen.variant.name
    assert dfl["reference"] == chosen.implementation.startswith("ref")
    said = [w for w in an["warnings"] if "reference code" in w]
    assert bool(said) == dfl["reference"]


def test_a_layer_left_to_the_reference_code_is_named(measured, tmp_path):
    """With only the row-major variant measured (as before this variant existed), the analysis
    names the layer that rests on oneDNN's reference code."""
    d, path = measured
    db = tmp_path / "plain.db"
    cli("run", "--bench-dir", str(d / "bench"), "--system", "box", "--db", str(db), "--backend", "onednn",
        "--threads", "1", "--min-time", "0.02", "--repetitions", "1", "--max-contention", "1", "--no-peaks",
        "--filter", "^(?!.*axis_inner)")
    (an,) = json.loads(cli("analyze", str(path), "--system", "box", "--db", str(db), "--json").stdout)["analyses"]
    dfl = next(r for r in an["layers"] if r["name"] == "dfl_softmax")
    assert dfl["implementation"].startswith("ref") and dfl["reference"]
    (said,) = [w for w in an["warnings"] if "reference code" in w]
    assert "dfl_softmax (Softmax, ref" in said and "bins_mean (ReduceMean, ref" in said and "last_softmax" not in said
