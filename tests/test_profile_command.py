"""`benanza profile --command`: a user's own PyTorch application (ResNet-18 eager, TorchScript,
torch.compile) profiled through its `benanza.measure` blocks, then analysed against the same
network exported to ONNX and a database the real pipeline measured (generate → run, oneDNN).

Oracles: the ONNX file read with onnx, the script's own perf_counter times and environment
(tests/fixtures/resnet18_app.py records them), and the oneDNN verbose lines parsed here.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import FIXTURES
from onnx import numpy_helper, shape_inference

import benanza
from benanza.parsers import load_profile
from benanza.profiler import LOG_ENV, MEASURE_FILE_ENV
from tests.analysis.test_bounds_e2e import JSON_MS

pytestmark = pytest.mark.slow
APP = FIXTURES / "resnet18_app.py"
BIN = Path(sys.executable).parent
WARMUP, ITERATIONS = 2, 5
MODES = ("eager", "jit", "compiled")


def benanza_cli(*args: str, cwd: Path, ok: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(BIN / "benanza"), *args], cwd=cwd, capture_output=True, text=True, timeout=900,
                          check=False)
    if ok:
        assert proc.returncode == 0, f"benanza {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def app(*args: str) -> list[str]:
    return ["--", sys.executable, str(APP), *args]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("usercmd")
    subprocess.run([sys.executable, str(APP), "--export", "r18.onnx"], cwd=d, check=True, capture_output=True)
    benanza_cli("generate", "r18.onnx", "-b", "2", "--out", "bench", "--backend", "onednn", "--dtype", "f32",
                "--no-fusion", cwd=d)
    # the figures of the pipeline are checked here, not how quiet the machine is (test_measurement)
    benanza_cli("run", "--bench-dir", "bench", "--system", "ci-cpu", "--db", "perf.db", "--backend", "onednn",
                "--filter", "conv", "--min-time", "0.01", "--repetitions", "1", "--remeasure", "0",
                "--max-contention", "1", cwd=d)
    (d / "rec").mkdir()
    benanza_cli("profile", "--out", "bundle", "--name", "compiled", "--warmup", str(WARMUP), "--model", "r18.onnx",
                "-b", "2", *app("--modes", ",".join(MODES), "--iterations", str(ITERATIONS), "--record", "rec"),
                cwd=d)
    return d


def analyze(d: Path, *profiles: str) -> dict:
    out = benanza_cli("analyze", "r18.onnx", "-b", "2", "--system", "ci-cpu", "--db", "perf.db",
                      *[a for p in profiles for a in ("--profile", p)], "--json", cwd=d).stdout
    (a,) = json.loads(out)["analyses"]
    return a


def conv_problems(path: Path) -> dict[str, str]:
    """Each Conv node's oneDNN problem descriptor, computed from the ONNX file alone."""
    m = shape_inference.infer_shapes(onnx.load(str(path)))
    shapes = {v.name: [x.dim_value for x in v.type.tensor_type.shape.dim]
              for v in [*m.graph.input, *m.graph.value_info, *m.graph.output]}
    weights = {t.name: numpy_helper.to_array(t).shape for t in m.graph.initializer}
    out = {}
    for n in m.graph.node:
        if n.op_type != "Conv":
            continue
        attr = {a.name: list(a.ints) for a in n.attribute}
        mb, ic, ih, iw = shapes[n.input[0]]
        _, _, oh, ow = shapes[n.output[0]]
        oc, _, kh, kw = weights[n.input[1]]
        (sh, sw), (ph, pw) = attr["strides"], attr["pads"][:2]
        out[n.name] = (f"mb{mb}_ic{ic}oc{oc}_ih{ih}oh{oh}kh{kh}sh{sh}dh0ph{ph}"
                       f"_iw{iw}ow{ow}kw{kw}sw{sw}dw0pw{pw}")
    return out


def conv_lines_by_mode(stdout: Path) -> dict[str, list[list[str]]]:
    """Per measure name, the convolution exec lines of each block, read from the raw stdout."""
    blocks: dict[str, list[list[str]]] = {}
    current: list[str] | None = None
    for line in stdout.read_text().splitlines():
        if line.startswith("benanza_measure,begin,"):
            current = []
            blocks.setdefault(json.loads(line.split(",", 2)[2]), []).append(current)
        elif line.startswith("benanza_measure,end,"):
            current = None
        elif current is not None and ",exec," in line and ",convolution," in line:
            current.append(line)
    return blocks


def test_latency_comes_from_the_run_without_loggers(work):
    index = json.loads((work / "bundle" / "profile.json").read_text())
    assert index["measure_name"] == "compiled" and set(index["measures"]) == set(MODES)
    assert index["latency_ms"] == index["measures"]["compiled"]["latency_ms"]
    records = [json.loads(p.read_text()) for p in (work / "rec").glob("run-*.json")]
    assert len(records) == 2  # the timed run and the traced run
    (timed,) = [r for r in records if "ONEDNN_VERBOSE" not in r["env"]]
    (traced,) = [r for r in records if "ONEDNN_VERBOSE" in r["env"]]
    assert not set(LOG_ENV) & set(timed["env"])  # what the script itself saw: no logger at all
    assert set(LOG_ENV) <= set(traced["env"]) and MEASURE_FILE_ENV in timed["env"]
    for mode in MODES:
        own = [b for b in timed["blocks"] if b["name"] == mode]
        samples = index["measures"][mode]["latency_ms"]["samples"]
        assert len(own) == ITERATIONS and len(samples) == ITERATIONS - WARMUP
        assert index["measures"][mode]["warmup_dropped"] == WARMUP
        for b, s in zip(own[WARMUP:], samples):  # measure's clock sits between the script's two
            assert b["inner_ms"] <= s <= b["outer_ms"]
    assert index["runs"]["timed"]["loggers"] == {} and index["runs"]["traced"]["loggers"]["ONEDNN_VERBOSE"] == "1"


def test_analyzer_maps_the_compiled_runs_convolutions_with_their_logged_times(work):
    problems = conv_problems(work / "r18.onnx")
    assert len(problems) == 20  # ResNet-18: stem, 16 in the blocks, 3 downsamples
    a = analyze(work, "bundle")
    index = json.loads((work / "bundle" / "profile.json").read_text())
    assert a["measured_ms"] == pytest.approx(index["latency_ms"]["trimmed_mean"], **JSON_MS)
    (lib,) = [lib for lib in a["libraries"] if lib["library"] == "onednn"]
    algos = {x["name"]: x for x in lib["algorithms"]}
    assert len(algos.keys() & problems.keys()) >= 0.9 * len(problems)  # Q3 maps ≥ 90% of the convs
    assert lib["passes"] == ITERATIONS - WARMUP and lib["api_counts"]["convolution"]["logged"] == len(problems)
    assert not set(lib["missing"]) & {i for i, la in enumerate(a["layers"]) if la["op"] == "Conv"}
    blocks = conv_lines_by_mode(work / "bundle" / "command.stdout")["compiled"][WARMUP:]
    for name, x in algos.items():
        mine = [ln for blk in blocks for ln in blk if f",{problems[name]}," in ln]
        times = [float(ln.rsplit(",", 1)[1]) for ln in mine]
        assert times and f",convolution,{x['used']}," in mine[0]
        if sum(p == problems[name] for p in problems.values()) == 1:  # one layer has this shape: its own calls
            assert x["framework_ms"] == pytest.approx(statistics.median(times), **JSON_MS)
        else:
            assert min(times) - JSON_MS["abs"] <= x["framework_ms"] <= max(times) + JSON_MS["abs"]
        assert x["best_ms"] > 0 and x["layout"] == "nhwc"  # inductor runs convs channels-last
    assert any("'compiled' blocks" in n for n in a["notes"])
    assert not any("cannot verify" in n for n in a["warnings"])


@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_eager_and_torchscript_calls_map_in_model_order(work, mode):
    index = json.loads((work / "bundle" / "profile.json").read_text())
    a = analyze(work, f"bundle/{index['measures'][mode]['onednn_log']}")
    (lib,) = [lib for lib in a["libraries"] if lib["library"] == "onednn"]
    convs = {la["name"] for la in a["layers"] if la["op"] == "Conv"}
    assert len({x["name"] for x in lib["algorithms"]} & convs) >= 0.9 * len(convs)
    assert lib["out_of_order"] == [] and lib["passes"] == ITERATIONS - WARMUP
    assert lib["framework_version"].startswith("3.")  # the per-mode log keeps oneDNN's version header
    per_block = conv_lines_by_mode(work / "bundle" / "command.stdout")[mode][WARMUP:]
    assert [len(b) for b in per_block] == [len(convs)] * (ITERATIONS - WARMUP)


def test_inductor_freezing_calls_with_post_ops_map_too(work):
    """torch.compile with inductor's freezing folds BN and fuses ReLU and the residual add into
    the convs as oneDNN post-ops, with bias and blocked weights; the log is torch 2.13's own
    output of this network (fixtures/resnet18_app.py, batch 2, 64x64, freezing on)."""
    log = FIXTURES / "onednn_inductor_freezing.log"
    lines = [ln for ln in log.read_text().splitlines() if ",exec," in ln and ",convolution," in ln]
    assert sum("attr-post-ops:sum+eltwise_relu" in ln for ln in lines) > 0
    a = analyze(work, str(log))
    (lib,) = [lib for lib in a["libraries"] if lib["library"] == "onednn"]
    problems = conv_problems(work / "r18.onnx")
    algos = {x["name"]: x for x in lib["algorithms"]}
    assert algos.keys() == problems.keys() and lib["out_of_order"] == [] and lib["passes"] == 3
    for name, x in algos.items():
        times = [float(ln.rsplit(",", 1)[1]) for ln in lines if f",{problems[name]}," in ln]
        if sum(p == problems[name] for p in problems.values()) == 1:
            assert x["framework_ms"] == pytest.approx(statistics.median(times), **JSON_MS)


def test_without_model_the_analyzer_says_it_cannot_verify(work):
    benanza_cli("profile", "--out", "nomodel", "--warmup", "1", *app("--iterations", "2"), cwd=work)
    a = analyze(work, "nomodel")
    assert any("cannot verify" in n for n in a["warnings"])


@pytest.mark.skipif(shutil.which("nsys") is None, reason="Nsight Systems not installed (scripts/install-nsys.sh)")
def test_under_nsys_the_measure_blocks_are_nvtx_ranges(tmp_path):
    code = ("import torch, benanza\nx, w = torch.randn(2, 64, 56, 56), torch.randn(64, 64, 3, 3)\n"
            "for _ in range(3):\n    with benanza.measure('conv'):\n"
            "        torch.nn.functional.conv2d(x, w, padding=1)")
    benanza_cli("profile", "--out", "n", "--nsys", "--warmup", "1", "--", sys.executable, "-c", code, cwd=tmp_path)
    index = json.loads((tmp_path / "n" / "profile.json").read_text())
    assert index["files"].get("nsys") == "nsys.nsys-rep", index["notes"]
    assert "nsys" not in index["runs"]["timed"]["command"] and index["runs"]["traced"]["command"].startswith(
        shutil.which("nsys"))
    prof = load_profile([tmp_path / "n"])
    assert [a.name for a in prof.nsys.api_calls if a.kind == "nvtx"] == ["conv"] * 3
    assert len(prof.library_calls["onednn"]) >= 2  # the two blocks after warmup


# --- errors: one line, exit status 1, no traceback ------------------------------------------------


def one_error_line(tmp_path: Path, *args: str) -> str:
    proc = benanza_cli("profile", "--out", "b", *args, cwd=tmp_path, ok=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stdout + proc.stderr
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_a_failing_command_names_its_exit_status_last_line_and_output(tmp_path):
    line = one_error_line(tmp_path, "--command",
                          f"{sys.executable} -c \"import sys; print('x', file=sys.stderr); sys.exit('bad input')\"")
    stderr = tmp_path / "b" / "command-timed.stderr"
    assert (line.startswith("error: `")
            and "failed in the timed run (exit 1): bad input (full output: b/command-timed.stderr)" in line)
    assert stderr.read_text().endswith("bad input\n")


def test_a_command_that_never_measures(tmp_path):
    line = one_error_line(tmp_path, "--", sys.executable, "-c", "print('hello')")
    assert "never called benanza.measure" in line


def test_a_command_without_library_calls_gives_its_latency_and_says_what_is_missing(tmp_path):
    code = "import benanza, torch\nfor _ in range(3):\n    with benanza.measure('m'):\n        torch.ones(3) + 1"
    benanza_cli("profile", "--out", "b", "--warmup", "1", "--", sys.executable, "-c", code, cwd=tmp_path)
    index = json.loads((tmp_path / "b" / "profile.json").read_text())
    assert index["framework"] == "command" and "trace" not in index["files"]
    assert len(index["latency_ms"]["samples"]) == 2  # three blocks, one dropped as warm-up
    assert any("no library call was captured" in n and "ort_session_options" in n for n in index["notes"])


def test_a_commands_page_faults_are_its_blocks_own(tmp_path):
    """Each block of the command touches 300 fresh pages: the bundle's per-block counts hold
    those faults (oracle: the pages the command touched), the warm-up block dropped."""
    code = ("import benanza, mmap\nfor _ in range(4):\n    with benanza.measure('m'):\n"
            "        m = mmap.mmap(-1, 300 * 4096)\n        for i in range(0, 300 * 4096, 4096):\n"
            "            m[i] = 1\n        m.close()")
    benanza_cli("profile", "--out", "b", "--warmup", "1", "--", sys.executable, "-c", code, cwd=tmp_path)
    index = json.loads((tmp_path / "b" / "profile.json").read_text())
    faults = index["page_faults"]
    assert len(faults["samples"]) == 3 and all(300 <= n <= 364 for n in faults["samples"])
    assert index["measures"]["m"]["page_faults"] == faults["samples"] and faults["fault_us"] > 0
    prof = load_profile([tmp_path / "b"])
    assert prof.page_faults.per_run == pytest.approx(statistics.mean(faults["samples"]))


ORT_APP = r"""
import json, sys, time
import numpy as np, onnxruntime as ort
import benanza
model, iterations, record = sys.argv[1], int(sys.argv[2]), sys.argv[3]
so = ort.SessionOptions()
so.intra_op_num_threads = 1
sess = ort.InferenceSession(model, benanza.ort_session_options(so), providers=["CPUExecutionProvider"])
(inp,) = sess.get_inputs()
name = inp.name
x = np.random.default_rng(0).random([d if isinstance(d, int) else 2 for d in inp.shape], dtype=np.float32)
clock = []
for _ in range(iterations):
    start = time.perf_counter()
    with benanza.measure("ort"):
        sess.run(None, {name: x})
    clock.append((time.perf_counter() - start) * 1e3)
with open(record, "a") as f:
    f.write(json.dumps({"profiling": so.enable_profiling, "clock_ms": clock}) + "\n")
"""


def test_an_onnx_runtime_application_gives_orts_per_node_profile(work):
    """An application serving with ONNX Runtime on a CPU (MLAS: no library logger sees it) builds
    its session with benanza.ort_session_options(): the bundle has the latency from the run with
    the profiler off and ORT's per-node profile from the traced run, analysed as ORT's own."""
    import onnxruntime as ort

    record = work / "ort-app.jsonl"
    record.unlink(missing_ok=True)
    benanza_cli("profile", "--out", "ortapp", "--warmup", str(WARMUP), "--model", "r18.onnx", "-b", "2", "--",
                sys.executable, "-c", ORT_APP, "r18.onnx", str(ITERATIONS), str(record), cwd=work)
    timed, traced = [json.loads(line) for line in record.read_text().splitlines()]
    assert (timed["profiling"], traced["profiling"]) == (False, True)  # never timed with the profiler on
    index = json.loads((work / "ortapp" / "profile.json").read_text())
    assert index["framework"] == "onnxruntime" and index["framework_version"] == ort.__version__
    samples = index["latency_ms"]["samples"]
    assert len(samples) == ITERATIONS - WARMUP
    # each block's time lies within the application's own clock reading around it
    assert all(s <= c + 1e-3 for s, c in zip(samples, timed["clock_ms"][WARMUP:], strict=True))
    prof = load_profile([work / "ortapp"])
    assert prof.trace is not None and prof.trace.framework == "onnxruntime"
    assert len(prof.trace.runs) == ITERATIONS  # the traced run's every inference, warm-up included
    # the same kernels as ORT's own profile of the model taken here, outside Benanza
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.enable_profiling = 1, True
    so.profile_file_prefix = str(work / "ort-direct")
    sess = ort.InferenceSession(str(work / "r18.onnx"), so, providers=["CPUExecutionProvider"])
    (inp,) = sess.get_inputs()
    sess.run(None, {inp.name: np.zeros([d if isinstance(d, int) else 2 for d in inp.shape], np.float32)})
    direct = [e for e in json.loads(Path(sess.end_profiling()).read_text())
              if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    kernels = {(e["name"].removesuffix("_kernel_time"), e["args"]["op_name"]) for e in direct}
    assert kernels and {(o.name, o.op) for o in prof.trace.ops} == kernels
    a = analyze(work, "ortapp")
    assert a["framework"]["framework"] == "onnxruntime" and a["framework"]["runs"] == ITERATIONS - 1
    assert a["measured_ms"] == pytest.approx(index["latency_ms"]["trimmed_mean"], **JSON_MS)


def test_a_missing_program_and_a_hung_command(tmp_path):
    assert "cannot run `no-such-program-xyz`" in one_error_line(tmp_path, "--", "no-such-program-xyz")
    line = one_error_line(tmp_path, "--timeout", "1", "--", sys.executable, "-c", "import time; time.sleep(60)")
    assert "ran past --timeout 1 s and was killed" in line


def test_several_names_need_name(tmp_path):
    code = "import benanza\nfor n in ('a', 'b'):\n    with benanza.measure(n): pass"
    line = one_error_line(tmp_path, "--warmup", "0", "--", sys.executable, "-c", code)
    assert "measured several names (a, b)" in line and "--name" in line


def test_model_mode_options_are_refused_with_a_command(tmp_path):
    proc = benanza_cli("profile", "--iterations", "3", "--", sys.executable, "-c", "pass", cwd=tmp_path, ok=False)
    assert proc.returncode == 2 and "--iterations does not apply to --command" in proc.stderr
    proc = benanza_cli("profile", "--command", "true", "--", "true", cwd=tmp_path, ok=False)
    assert proc.returncode == 2 and "not both" in proc.stderr


def test_measure_records_concurrent_blocks_whole(tmp_path, monkeypatch):
    sink = tmp_path / "m.jsonl"
    monkeypatch.setenv(MEASURE_FILE_ENV, str(sink))

    def work(k: int) -> None:
        for _ in range(50):
            with benanza.measure(f"t{k}"):
                pass

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    records = [json.loads(ln) for ln in sink.read_text().splitlines()]
    assert len(records) == 200 and {r["name"] for r in records} == {"t0", "t1", "t2", "t3"}
    assert all(r["ms"] >= 0 for r in records)
