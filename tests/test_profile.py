"""benanza profile: timing API, latency statistics, bundles from real ONNX Runtime runs, nsys."""

from __future__ import annotations

import json
import shutil
import sys
import time

import helpers
import pytest
from click.testing import CliRunner

import benanza
from benanza.cli import main
from benanza.errors import UsageError
from benanza.parsers import latency_stats, load_profile
from benanza.profiler import ProfileSpec, check_framework, profile_model


def test_trimmed_mean_drops_20_percent_each_side():
    samples = [100.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 0.01]
    s = latency_stats(samples)
    # MLModelScope: Mean(Sort(list)[floor(0.2 n) : -floor(0.2 n)])
    assert s.trimmed_mean_ms == pytest.approx(sum([2.0, 3.0, 4.0, 5.0, 6.0, 7.0]) / 6)
    assert s.p50_ms == pytest.approx(4.5) and s.p90_ms == pytest.approx(17.2)
    assert s.min_ms == 0.01 and s.max_ms == 100.0


def test_measure_times_a_block():
    with benanza.measure("sleep") as m:
        time.sleep(0.02)
    assert 15 <= m.elapsed_ms < 1000 and m.name == "sleep"


PAGE = 4096
TOUCHED = 512  # pages


def _touch_fresh_pages(n: int) -> None:
    """Maps ``n`` fresh anonymous pages and writes one byte of each: ``n`` first-touch faults."""
    import mmap

    m = mmap.mmap(-1, n * PAGE)
    for off in range(0, n * PAGE, PAGE):
        m[off] = 1
    m.close()


def test_measure_counts_the_page_faults_of_its_block():
    """The oracle is the block's own work: it touches TOUCHED fresh pages, so the kernel faulted at
    least that often (the interpreter's own allocations add a few)."""
    with benanza.measure("touch") as m:
        _touch_fresh_pages(TOUCHED)
    assert TOUCHED <= m.page_faults <= TOUCHED + 64
    with benanza.measure("none") as m:
        sum(range(1000))
    assert m.page_faults <= 8


def test_a_faults_cost_is_the_time_of_touching_fresh_pages():
    """Recomputed another way: time writing to TOUCHED fresh pages against pages already mapped."""
    import mmap

    from benanza.profiler import fault_cost_us

    cost = fault_cost_us()
    assert cost is not None and 0.02 < cost < 200
    costs = []
    for _ in range(5):
        m = mmap.mmap(-1, 4096 * PAGE)
        start = time.perf_counter()
        for off in range(0, 4096 * PAGE, PAGE):
            m[off] = 1
        first = time.perf_counter() - start
        start = time.perf_counter()
        for off in range(0, 4096 * PAGE, PAGE):
            m[off] = 2
        costs.append((first - (time.perf_counter() - start)) / 4096 * 1e6)
        m.close()
    assert cost == pytest.approx(sorted(costs)[2], rel=0.5)


@pytest.fixture
def convnet_file(save):
    return save(helpers.conv_net(), "convnet.onnx")


@pytest.mark.slow
def test_profile_onnxruntime_bundle(tmp_path, convnet_file):
    out = profile_model(ProfileSpec(str(convnet_file), "onnxruntime", str(tmp_path / "b"), batch_size=2,
                                    warmup=1, iterations=7, trace_iterations=3))
    index = json.loads((out / "profile.json").read_text())
    assert index["schema_version"] == 2 and index["framework"] == "onnxruntime"
    assert len(index["latency_ms"]["samples"]) == 7
    assert index["latency_ms"]["min"] <= index["latency_ms"]["p50"] <= index["latency_ms"]["p90"]
    assert index["providers"] == ["CPUExecutionProvider"]
    assert any("MLAS" in n and "oneDNN" in n for n in index["notes"]), "the empty oneDNN log is explained"
    assert (out / index["files"]["trace"]).exists() and (out / "onednn.log").read_text() == ""
    prof = load_profile([out])
    assert prof.batch_size == 2 and prof.library_calls == {"onednn": []}
    assert len(prof.trace.runs) == 3
    conv = next(o for o in prof.trace.ops if o.op == "Conv")
    assert conv.input_shapes[0] == (2, 3, 8, 8)  # the batch size reached the framework
    assert prof.measured_ms == pytest.approx(index["latency_ms"]["trimmed_mean"])


@pytest.mark.slow
def test_profile_cli(tmp_path, convnet_file):
    r = CliRunner().invoke(main, ["profile", str(convnet_file), "--out", str(tmp_path / "p"), "--iterations", "3",
                                  "--warmup", "0", "--trace-iterations", "2"])
    assert r.exit_code == 0, r.output
    assert "trimmed mean" in r.output and "MLAS" in r.output


def test_cuda_device_without_cuda_provider_is_said_plainly(monkeypatch):
    import onnxruntime as ort

    # whatever this machine's build has: the CPU-only build's provider list
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    with pytest.raises(UsageError, match="no CUDA execution provider"):
        check_framework("onnxruntime", "cuda")


def _torch_ok() -> bool:
    try:
        import torch  # noqa: F401
        return True
    except ImportError:
        return False


def test_torch_framework_without_torch_is_said_plainly(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    with pytest.raises(UsageError, match=r"torch is not installed: pip install torch"):
        check_framework("torch", "cpu")


@pytest.mark.slow
@pytest.mark.skipif(not _torch_ok(), reason="torch is not installed (pip install torch)")
def test_profile_torch(tmp_path, convnet_file):
    out = profile_model(ProfileSpec(str(convnet_file), "torch", str(tmp_path / "t"), batch_size=2, iterations=3,
                                    warmup=1, trace_iterations=2))
    prof = load_profile([out])
    assert prof.framework == "torch" and len(prof.trace.runs) == 2
    # one op per layer per run, named as the processor names the layers
    layers = ["conv1", "relu1", "conv2", "bn2", "relu2", "pool2", "flatten", "fc", "softmax"]
    assert [o.name for o in prof.trace.ops if o.run == 1] == layers
    conv = next(o for o in prof.trace.ops if o.name == "conv1")
    # no shapes in a torch trace (the analysis reads none, and recording them costs each op time)
    assert conv.op == "aten::conv2d" and conv.input_shapes == ()
    assert "onednn" in prof.library_calls  # the log was captured (torch may run tiny convs natively)
    # the runs were at the batch asked for: the bundle says so, and oneDNN's own log where it ran a conv
    assert json.loads((out / "profile.json").read_text())["input_shapes"] == {"x": [2, 3, 8, 8]}
    assert all(c.conv.mb == 2 for c in prof.library_calls["onednn"] if c.conv)
    assert any("eager executor" in n for n in prof.notes)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nsys") is None, reason="Nsight Systems not installed (scripts/install-nsys.sh)")
def test_profile_with_nsys_on_cpu(tmp_path, convnet_file):
    """nsys --trace=osrt,nvtx → .qdstrm → QdstrmImporter → .nsys-rep → nsys export → parser."""
    pytest.importorskip("nvtx")
    out = profile_model(ProfileSpec(str(convnet_file), "onnxruntime", str(tmp_path / "n"), warmup=1,
                                    iterations=4, trace_iterations=2), nsys=True)
    index = json.loads((out / "profile.json").read_text())
    assert index["files"].get("nsys") == "nsys.nsys-rep", index["notes"]
    prof = load_profile([out])
    assert prof.nsys is not None
    assert any(a.kind == "osrt" for a in prof.nsys.api_calls)
    # benanza.measure's NVTX ranges: one per traced iteration (nsys records the traced run only)
    assert len(prof.nsys.runs) == 2


def _big_conv(save):
    """A conv large enough that torch on CPU sends it to oneDNN (tiny ones run natively)."""
    t, io = helpers.tensor, helpers.io
    from onnx import helper

    nodes = [helper.make_node("Conv", ["x", "W"], ["y"], pads=[1, 1, 1, 1], name="conv")]
    return save(helpers.model(nodes, [io("x", [1, 64, 56, 56])], [io("y", None)], [t("W", (64, 64, 3, 3))]),
                "bigconv.onnx")


# a plain torch process timing the model's convolution under oneDNN's verbose log, no profiler
CONV_ORACLE = """
import torch, torch.nn.functional as F
torch.set_num_threads(1)
x, w = torch.rand(1, 64, 56, 56), torch.rand(64, 64, 3, 3)
with torch.no_grad():
    for _ in range(33):
        F.conv2d(x, w, padding=1)
"""


def _conv_ms(text: str) -> list[float]:
    return [float(ln.rsplit(",", 1)[1]) for ln in text.splitlines()
            if ",primitive,exec," in ln and ",convolution," in ln]


@pytest.mark.slow
@pytest.mark.skipif(not _torch_ok(), reason="torch is not installed (pip install torch)")
def test_onednn_times_come_from_runs_without_the_profiler(tmp_path, save):
    """The torch profiler's event memory makes kernels fault on fresh pages (docs/profile.md): the
    bundle's oneDNN log holds only runs made without it, one per traced iteration, at the times a
    plain torch process under the same log gives the convolution (three oracle processes; the
    bundle's median within ±30% of the range they span)."""
    import os
    import statistics
    import subprocess

    model = _big_conv(save)
    out = profile_model(ProfileSpec(str(model), "torch", str(tmp_path / "t"), iterations=3, warmup=1,
                                    trace_iterations=30, threads=1))
    ours = _conv_ms((out / "onednn.log").read_text())
    assert len(ours) == 30  # the runs without the profiler, and only those
    index = json.loads((out / "profile.json").read_text())
    assert any("the oneDNN log comes from 30 runs after the profiler's" in n for n in index["notes"])
    assert any(n.startswith("the profiler's runs took ") and "page faults per run" in n for n in index["notes"])
    oracle = []
    for _ in range(3):
        run = subprocess.run([sys.executable, "-c", CONV_ORACLE], env={**os.environ, "ONEDNN_VERBOSE": "1"},
                             capture_output=True, text=True, check=True, timeout=300)
        oracle.append(statistics.median(_conv_ms(run.stdout)[3:]))
    assert 0.7 * min(oracle) <= statistics.median(ours) <= 1.3 * max(oracle)


@pytest.mark.slow
@pytest.mark.skipif(not _torch_ok(), reason="torch is not installed (pip install torch)")
def test_latency_is_timed_without_loggers_and_logs_come_from_a_second_run(tmp_path, save, monkeypatch):
    monkeypatch.setenv("ONEDNN_VERBOSE", "1")  # even a user's own setting stays out of the timed run
    model = _big_conv(save)
    out = profile_model(ProfileSpec(str(model), "torch", str(tmp_path / "t"), iterations=3, warmup=1,
                                    trace_iterations=2))
    index = json.loads((out / "profile.json").read_text())
    assert index["runs"]["timed"]["loggers"] == {}  # what the timing child's os.environ held
    assert index["runs"]["traced"]["loggers"]["ONEDNN_VERBOSE"] == "1"
    # oneDNN itself agrees: the timing child printed no verbose line, the tracing child did
    assert "onednn_verbose" not in (out / "child-timed.stdout").read_text()
    assert ",primitive,exec," in (out / "child.stdout").read_text()
    prof = load_profile([out])
    assert prof.library_calls["onednn"] and prof.library_versions["onednn"].startswith("3.")
    assert len(index["latency_ms"]["samples"]) == 3  # the timed run's samples, not the traced run's 2


def test_a_bundle_of_another_model_is_refused(tmp_path, convnet_file, save):
    out = profile_model(ProfileSpec(str(convnet_file), "onnxruntime", str(tmp_path / "b"), warmup=0,
                                    iterations=2, trace_iterations=1))
    index = json.loads((out / "profile.json").read_text())
    assert index["model_identity"]["name"] == "convnet" and index["model_identity"]["inputs"] == {"x": ["N", 3, 8, 8]}
    other = _big_conv(save)
    r = CliRunner().invoke(main, ["analyze", str(other), "--system", "nobody", "--profile", str(out),
                                  "--db", str(tmp_path / "p.db")])
    assert r.exit_code == 1
    import hashlib

    import onnx

    theirs, ours = (hashlib.sha256(onnx.load(str(p)).graph.SerializeToString(deterministic=True)).hexdigest()[:12]
                    for p in (convnet_file, other))
    assert index["model_identity"]["graph_sha256"][:12] == theirs
    line = f"error: {out}: a profile of model 'convnet' (graph {theirs}), not of {other} (graph {ours})"
    assert r.output.strip().splitlines() == [line]
    # the same model gets past the check (to the next problem: no database; reading never creates one)
    same = CliRunner().invoke(main, ["analyze", str(convnet_file), "--system", "nobody", "--profile", str(out),
                                     "--db", str(tmp_path / "p.db")])
    assert same.exit_code == 1 and "p.db: no such database file" in same.output


def test_onnxruntime_gets_the_path_and_opens_one_session(tmp_path, monkeypatch):
    """ORT is handed the file, never its bytes (a model past 2 GB cannot be serialized; its
    external data ORT reads itself), and one session opens per run: for a file ORT reads as it
    is, and for one whose IR version it must lower (written beside the file, then removed, so
    the external data resolves)."""
    from pathlib import Path

    import numpy as np
    import onnx
    import onnxruntime as ort
    from helpers import io, model, tensor
    from onnx import helper

    from benanza import profiler

    weights = tensor("W", (64, 32))
    opened: list = []
    real = ort.InferenceSession

    class Counting(real):  # type: ignore[misc, valid-type]
        def __init__(self, what, *args, **kwargs):
            super().__init__(what, *args, **kwargs)
            opened.append(what)

    monkeypatch.setattr(ort, "InferenceSession", Counting)
    x = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)
    expected = x @ onnx.numpy_helper.to_array(weights)
    for ir in (8, 100):  # 100: newer than this ORT reads
        m = model([helper.make_node("MatMul", ["x", "W"], ["y"])], [io("x", [2, 64])], [io("y", None)], [weights],
                  ir_version=ir)
        path = tmp_path / f"ext{ir}.onnx"
        onnx.save(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=f"w{ir}.bin",
                  size_threshold=0)
        assert (tmp_path / f"w{ir}.bin").stat().st_size == 64 * 32 * 4
        opened.clear()
        notes: list[str] = []
        sess = profiler._ort_session(str(path), notes, ["CPUExecutionProvider"])
        (y,) = sess.run(None, {"x": x})
        np.testing.assert_allclose(y, expected, rtol=1e-5)
        assert len(opened) == 1 and isinstance(opened[0], str), opened
        if ir == 8:
            assert opened == [str(path)] and notes == []
        else:
            assert "lowered" in notes[0] and Path(opened[0]).parent == tmp_path and not Path(opened[0]).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ext100.onnx", "ext8.onnx", "w100.bin", "w8.bin"]
