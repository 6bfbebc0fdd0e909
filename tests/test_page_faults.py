"""A framework's page faults per run, through the real pipeline: generate → run (torch) →
`benanza profile --framework torch` → analyze.

glibc's allocator is steered by its own tunables in the profiled process: with a fixed, low mmap
threshold every tensor of 64 KiB or more is a fresh mapping that is unmapped when freed, so each
run faults in every page of those tensors again; with the threshold at its maximum and the heap
never trimmed, freed memory is reused and runs fault (almost) never. Oracles: the pages of the
model's intermediate tensors, computed from the ONNX file's shapes alone, and the latency the
profile measured under each allocator setting (the faults' estimated time against the measured
difference).
"""

from __future__ import annotations

import json
import math

import onnx
import pytest
from helpers import invoke, io, model
from onnx import helper, shape_inference

pytestmark = pytest.mark.slow

SYSTEM = "faultbox"
SHAPE = [1, 64, 112, 112]  # 3.2 MB per tensor: 784 pages
OPS = ("Relu", "Sigmoid", "Tanh", "Abs")
MMAP_THRESHOLD = 65536
# every allocation of MMAP_THRESHOLD bytes or more mapped afresh, and unmapped when freed
FAULTING = f"glibc.malloc.mmap_threshold={MMAP_THRESHOLD}"
# the advice's own setting: freed memory stays in the heap for the next run
KEEPING = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296"


def chain() -> onnx.ModelProto:
    names = ["x", *(f"t{i}" for i in range(len(OPS) - 1)), "y"]
    nodes = [helper.make_node(op, [names[i]], [names[i + 1]], name=op.lower()) for i, op in enumerate(OPS)]
    return model(nodes, [io("x", SHAPE)], [io("y", None)], [])


def fresh_pages(path) -> int:
    """The pages the run's tensors of MMAP_THRESHOLD bytes or more occupy: each node's output,
    from the shapes ONNX infers (f32), one mapping each."""
    m = shape_inference.infer_shapes(onnx.load(str(path)))
    values = {v.name: v for v in [*m.graph.value_info, *m.graph.output]}
    pages = 0
    for node in m.graph.node:
        dims = [d.dim_value for d in values[node.output[0]].type.tensor_type.shape.dim]
        nbytes = 4 * math.prod(dims)
        if nbytes >= MMAP_THRESHOLD:
            pages += math.ceil(nbytes / 4096)
    return pages


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    path = root / "chain.onnx"
    onnx.save(chain(), path)
    invoke("generate", str(path), "--backend", "torch", "--dtype", "f32", "--out", str(root / "bench"))
    invoke("run", "--system", SYSTEM, "--backend", "torch", "--bench-dir", str(root / "bench"),
           "--db", str(root / "perf.db"), "--threads", "1", "--min-time", "0.02", "--repetitions", "2",
           "--remeasure", "0", "--max-contention", "1")
    return root, path


def profiled(pipeline, tunables: str, monkeypatch) -> dict:
    root, path = pipeline
    out = root / f"prof-{len(tunables)}"
    monkeypatch.setenv("GLIBC_TUNABLES", tunables)  # read by ld.so as the profiled child starts
    invoke("profile", str(path), "--framework", "torch", "--threads", "1", "--out", str(out),
           "--iterations", "40", "--warmup", "5", "--trace-iterations", "2")
    monkeypatch.delenv("GLIBC_TUNABLES")
    (a,) = json.loads(invoke("analyze", str(path), "--system", SYSTEM, "--db", str(root / "perf.db"),
                             "--profile", str(out), "--json", "--allow-contended"))["analyses"]
    return a


def test_faults_per_run_are_the_pages_the_runs_map_afresh_and_their_time_is_measured(pipeline, monkeypatch):
    faulting = profiled(pipeline, FAULTING, monkeypatch)
    keeping = profiled(pipeline, KEEPING, monkeypatch)
    pages = fresh_pages(pipeline[1])
    assert pages == len(OPS) * 784
    f, k = faulting["page_faults"], keeping["page_faults"]
    # each output tensor is mapped afresh in every run; oneDNN's and torch's scratch adds a little
    assert pages <= f["per_run"] <= 1.3 * pages
    assert k["per_run"] <= 0.05 * pages
    # the estimate is time: what the faults cost by the count and one fault's measured cost is
    # what the run lost, as the two allocator settings' measured latencies show
    lost = faulting["measured_ms"] - keeping["measured_ms"]
    # (seen here: 3140 faults per run at 3.05 µs, 9.4 ms estimated against 6.2 ms measured)
    assert 0.4 * lost <= f["ms"] - k["ms"] <= 2.5 * lost
    assert f["notable"]
    # the keeping heap may still grow once inside the timed runs (seen: 3,137 faults in one of 40
    # runs, 78.4 per run; or none), a fortieth of the faulting run's faults. Their shares are of
    # two latencies 3-10x apart (a tiny model: even that one growth may be a notable share of the
    # keeping run; CI once read 0.089 against the faulting run's 0.864), so their times are compared
    assert k["ms"] < f["ms"] / 10


def test_the_advice_names_what_keeps_the_memory(pipeline, monkeypatch):
    root, path = pipeline
    profiled(pipeline, FAULTING, monkeypatch)
    html = root / "report.html"
    text = invoke("analyze", str(path), "--system", SYSTEM, "--db", str(root / "perf.db"),
                  "--profile", str(root / f"prof-{len(FAULTING)}"), "--allow-contended", "--report", str(html))
    line = next(ln for ln in text.splitlines() if ln.startswith("page faults:"))
    assert "per run" in line and "LD_PRELOAD" in line and KEEPING in " ".join(text.split())
    page = html.read_text()
    assert "<h3>Page faults</h3>" in page and KEEPING in page


def test_the_profilers_runs_put_no_tensor_on_a_fresh_page(zoo_model, tmp_path, monkeypatch):
    """The torch profiler's event memory grows in every run; without care the model's tensors land
    on fresh pages and its per-layer times hold faults the user's run never takes (benanza/heap.py).
    Oracle: the timed runs, another process without the profiler, and the same model's profiler
    runs with the heap left as glibc keeps it."""
    path = zoo_model("squeezenet-v1.1")

    def profile(out):
        invoke("profile", str(path), "--framework", "torch", "--threads", "1", "--out", str(out),
               "--iterations", "10", "--warmup", "3", "--trace-iterations", "5")
        return json.loads((out / "profile.json").read_text())

    kept = profile(tmp_path / "kept")
    # glibc's own default: the allocator as it was, but set by the user, so the profile leaves it be
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.tcache_count=7")
    left = profile(tmp_path / "left")
    assert kept["runs"]["traced"]["heap"]["kept"] and kept["runs"]["traced"]["heap"]["grown_bytes"] > 0
    assert not left["runs"]["traced"]["heap"]["kept"] and "GLIBC_TUNABLES" in left["runs"]["traced"]["heap"]["why_not"]
    untraced = kept["page_faults"]["per_run"]
    lost = left["runs"]["traced"]["page_faults"]["per_run"]
    # (seen: 0 per timed run; the profiler's runs 965 left alone, 6 kept, all in the first run)
    assert lost >= 200
    assert kept["runs"]["traced"]["page_faults"]["per_run"] <= untraced + 0.05 * lost
