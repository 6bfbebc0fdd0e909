"""`benanza profile --threads N`: the framework's intra-op threads set, recorded in the bundle as the
framework itself reports them, and compared by `analyze` with the benchmarks' threads.

The oracles are the frameworks' own reports, read here from their raw output: ONNX Runtime's
thread-pool statistics in its profile JSON (a node's ``sub_threads`` plus the calling thread; no
statistics in a session of one thread), oneDNN's verbose header (``nthr:N``) in a torch run, and
``torch.get_num_threads()`` printed by the user's own command.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner
from helpers import io, model, tensor
from onnx import helper

from benanza.cli import main

# profiles ONNX Runtime and torch runs of models end to end
pytestmark = pytest.mark.slow


def conv_net() -> onnx.ModelProto:
    """A convolution torch sends to oneDNN on one thread (so its log names its threads), and a ReLU."""
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    return model(nodes, [io("x", [1, 32, 28, 28])], [io("y", None)], [tensor("W", (64, 32, 3, 3)), tensor("B", (64,))])


def invoke(*args: str) -> str:
    out = CliRunner().invoke(main, list(args))
    assert out.exit_code == 0, (out.exit_code, out.output, out.exception)
    return out.stdout


def ort_pool_threads(profile: Path) -> int:
    """The threads ONNX Runtime's profile says its session ran, read from the raw JSON."""
    counts = set()
    for e in json.loads(profile.read_text()):
        stats = (e.get("args") or {}).get("thread_scheduling_stats")
        if e.get("cat") == "Node" and stats is not None:
            counts.add(1 if stats == "" else 1 + len(stats["sub_threads"]))
    assert len(counts) == 1, counts
    return counts.pop()


def onednn_threads(log: Path) -> int:
    m = re.search(r"info,cpu,runtime:[^,]*,nthr:(\d+)", log.read_text())
    assert m is not None, "oneDNN printed no thread count"
    return int(m.group(1))


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """The net benchmarked with ONNX Runtime's kernels at 2 threads (system `two`) and at 1
    (system `one`), and profiled in ONNX Runtime at 1 thread."""
    root = tmp_path_factory.mktemp("threads")
    path = root / "net.onnx"
    onnx.save(conv_net(), path)
    bench, db = root / "bench", root / "perf.db"
    invoke("generate", str(path), "--backend", "onnxruntime", "--no-fusion", "--layout", "nchw", "--out", str(bench))
    for system, threads in (("two", "2"), ("one", "1")):
        invoke("run", "--system", system, "--backend", "onnxruntime", "--bench-dir", str(bench), "--db", str(db),
               "--threads", threads, "--min-time", "0.01", "--repetitions", "2", "--remeasure", "0",
               "--max-contention", "1")
    prof = root / "ort-1"
    invoke("profile", str(path), "--framework", "onnxruntime", "--threads", "1", "--iterations", "5",
           "--trace-iterations", "3", "--out", str(prof))
    return path, db, prof


def _analysis(path: Path, db: Path, system: str, prof: Path) -> dict:
    doc = json.loads(invoke("analyze", str(path), "--system", system, "--db", str(db), "--profile", str(prof),
                            "--json", "--allow-contended"))
    return doc["analyses"][0]


def test_the_bundle_records_the_threads_ort_ran(work, tmp_path):
    path, _, prof = work
    index = json.loads((prof / "profile.json").read_text())
    assert (index["threads"], index["threads_requested"]) == (1, 1)
    assert index["threads"] == ort_pool_threads(prof / "ort_profile.json")
    two = tmp_path / "ort-2"
    invoke("profile", str(path), "--framework", "onnxruntime", "--threads", "2", "--iterations", "3",
           "--trace-iterations", "2", "--out", str(two))
    index = json.loads((two / "profile.json").read_text())
    assert index["threads"] == ort_pool_threads(two / "ort_profile.json") == 2


def test_profile_at_1_thread_against_benchmarks_at_2_warns_once(work):
    path, db, prof = work
    a = _analysis(path, db, "two", prof)
    assert a["backend"] == "onnxruntime"
    assert a["threads"] == {"profile": 1, "benchmarks": 2, "source": "the profile's record", "differ": True}
    said = [w for w in a["warnings"] if "threads" in w and "unequal" in w]
    assert len(said) == 1 and "profile ran 1 threads" in said[0] and "benchmarks 2" in said[0], a["warnings"]
    assert a["bounds"]["unequal_threads"] and a["framework"]["unequal_threads"]
    out = invoke("analyze", str(path), "--system", "two", "--db", str(db), "--profile", str(prof),
                 "--allow-contended")
    assert "Benanza ratio (unequal threads: profile 1, benchmarks 2)" in out
    assert re.search(r"Q3: .* to gain \[unequal threads: profile 1, benchmarks 2\]", out), out


def test_equal_threads_give_no_warning(work):
    path, db, prof = work
    a = _analysis(path, db, "one", prof)
    assert a["threads"] == {"profile": 1, "benchmarks": 1, "source": "the profile's record", "differ": False}
    # the unequal-threads warning only: a busy moment may add "bound above measured", which
    # names threads among the conditions that can differ
    assert not [w for w in a["warnings"] if "unequal threads" in w], a["warnings"]
    assert "unequal_threads" not in a["bounds"]


@pytest.mark.parametrize("threads", [1, 2])
def test_torch_profile_records_the_threads_onednn_ran(work, tmp_path, threads):
    path, _, _ = work
    prof = tmp_path / "torch"
    invoke("profile", str(path), "--framework", "torch", "--threads", str(threads), "--iterations", "3",
           "--trace-iterations", "2", "--out", str(prof))
    index = json.loads((prof / "profile.json").read_text())
    assert index["threads"] == onednn_threads(prof / "onednn.log") == threads


APP = """
import sys, torch, benanza, torch.nn.functional as F
x, w = torch.rand(1, 32, 28, 28), torch.rand(64, 32, 3, 3)
for _ in range(3):
    with benanza.measure("conv"):
        F.conv2d(x, w, padding=1)
print("TORCH_THREADS", torch.get_num_threads())
"""


def test_a_command_gets_the_threads_through_its_environment(tmp_path):
    """`--command`: the threads reach the application's torch through OMP_NUM_THREADS (torch's own
    report, printed by the command, is the bundle's count), and are recorded with the variables given."""
    invoke("profile", "--out", str(tmp_path / "b"), "--warmup", "1", "--threads", "1", "--",
           sys.executable, "-c", APP)
    index = json.loads((tmp_path / "b" / "profile.json").read_text())
    printed = re.search(r"TORCH_THREADS (\d+)", (tmp_path / "b" / "command.stdout").read_text())
    assert printed is not None and index["threads"] == int(printed.group(1)) == 1
    assert index["runs"]["timed"]["threads_env"]["OMP_NUM_THREADS"] == "1"


ORT_APP = """
import numpy as np, onnxruntime as ort, benanza
sess = ort.InferenceSession(sys.argv[1], benanza.ort_session_options(), providers=["CPUExecutionProvider"])
x = np.random.rand(1, 32, 28, 28).astype(np.float32)
for _ in range(3):
    with benanza.measure("run"):
        sess.run(None, {"x": x})
"""


def test_an_ort_command_gets_the_threads_through_ort_session_options(work, tmp_path):
    path, _, _ = work
    invoke("profile", "--out", str(tmp_path / "b"), "--warmup", "1", "--threads", "1", "--",
           sys.executable, "-c", "import sys\n" + ORT_APP, str(path))
    index = json.loads((tmp_path / "b" / "profile.json").read_text())
    assert index["framework"] == "onnxruntime"
    assert index["threads"] == ort_pool_threads(tmp_path / "b" / "ort_profile.json") == 1
