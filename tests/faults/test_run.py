"""Fault suite: stand-in benchmark binaries that hang, stall, crash, lie and leak, and kills of
`benanza run` itself. Every case must end in bounded time with every variant stored (failed
with the reason where it misbehaved) and no process or temp folder left behind.

The stand-in speaks the runtime's line protocol (runtime_cpp/common/README.md) over variants
that `benanza generate` produced for a real model.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO, TESTS, generated_conv_net

from benanza.perfdb import PerfDB
from benanza.records import Status, System
from benanza.runner import RunOptions, RunSummary, _execute, _regex_literal

STANDIN = r'''#!{python}
import json, os, subprocess, sys, time
mode, target = os.environ.get("STANDIN_MODE", ""), os.environ.get("STANDIN_TARGET", "")
if "--benanza_context" in sys.argv:
    print("BENANZA_CONTEXT", json.dumps({{"custom": {{}}}}), flush=True)
    sys.exit(0)
with open(os.environ["STANDIN_PIDS"], "a") as f:
    f.write(f"{{os.getpid()}}\n")
out = sys.stdout.buffer
def emit(tag, text):
    out.write(tag + b" " + (text.encode() if isinstance(text, str) else text) + b"\n")
    out.flush()
if mode == "hang_startup":
    time.sleep(1000)
path = next(a for a in sys.argv if a.startswith("--benanza_names=")).split("=", 1)[1]
names = open(path).read().split()
for n in names:
    if mode == "stall_before" and n == target:
        time.sleep(1000)
    emit(b"BENANZA_START", n)
    if mode == "hang" and n == target:
        time.sleep(1000)
    if mode == "abort" and n == target:
        os.abort()
    result = {{"name": n, "status": "ok", "median_ms": 0.5, "mean_ms": 0.5, "stddev_ms": 0.01,
              "min_ms": 0.49, "iterations": 100, "repetitions": 1, "counters": {{"workspace_bytes": 0.0}}}}
    if mode == "noise":
        emit(b"\xff\xfe not utf-8 \xc3", b"\x80\x81")
        result["implementation"] = "jit:XX"
        emit(b"BENANZA_RESULT", json.dumps(result).encode().replace(b"XX", b"\xff\xfe"))
        continue
    if mode == "malformed" and n in target.split(","):
        bad = {{0: "{{not json", 1: json.dumps(dict(result, status="excellent")),
               2: json.dumps({{k: v for k, v in result.items() if k != "status"}}),
               3: json.dumps(dict(result, median_ms="fast")), 4: json.dumps(dict(result, iterations=-3)),
               5: json.dumps([n]), 6: json.dumps(dict(result, median_ms=-4.999)),
               7: json.dumps(dict(result, name=names[-1])), 8: json.dumps(dict(result, times_ms="abc")),
               9: json.dumps(dict(result, times_ms=[float("nan"), -1])),
               10: json.dumps(dict(result, median_ms=1e308)),
               11: json.dumps(dict(result, counters={{"workspace_bytes": 0.0, "flops": float("inf")}})),
               12: json.dumps(dict(result, min_ms=0.7))}}[target.split(",").index(n)
                                                          + int(os.environ.get("STANDIN_OFFSET", "0"))]
        emit(b"BENANZA_RESULT", bad)
        continue
    emit(b"BENANZA_RESULT", json.dumps(result))
if mode == "grandchild":
    # a helper that inherits stdout and escapes the process group: the pipe never closes
    g = subprocess.Popen(["sleep", "1000"], start_new_session=True)
    with open(os.environ["STANDIN_PIDS"], "a") as f:
        f.write(f"{{g.pid}}\n")
if mode == "hang_after":
    time.sleep(1000)
'''


def make_standin(folder: Path) -> Path:
    path = folder / "benanza_bench"
    path.write_text(STANDIN.format(python=sys.executable))
    path.chmod(0o755)
    return path


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> Path:
    """`benanza generate` output (manifest + oneDNN variants) for a small real model."""
    return generated_conv_net(tmp_path_factory.mktemp("bench"))


@pytest.fixture(scope="module")
def variants(bench):
    from benanza.generator import read_variants

    vs = read_variants(bench / "onednn")
    assert len(vs) >= 6
    return vs[:6]


def alive(pid: int) -> bool:
    """Running (a zombie awaiting its reaper counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def pids(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def execute(tmp_path: Path, variants, mode: str, target: str = "", timeout: float = 2.0, offset: int = 0):
    binary = make_standin(tmp_path)
    pid_file = tmp_path / "pids"
    env = dict(os.environ, STANDIN_MODE=mode, STANDIN_TARGET=target, STANDIN_PIDS=str(pid_file),
               STANDIN_OFFSET=str(offset))
    system = System("box", "onednn", "stand-in", (("threads", "1"),))
    summary = RunSummary(system, "onednn", tmp_path / "r.db", total=len(variants), already=0)
    started = time.monotonic()
    with PerfDB(tmp_path / "r.db") as db:
        # max_contention 1: a loaded test machine must not re-measure (and so re-number) these rows
        options = RunOptions(timeout=timeout, min_time=0.01, repetitions=1, max_contention=1.0)
        _execute(binary, variants, env, options, db, system, summary, None)
        results = {r.variant.name: r for r in db.results("box")}
    elapsed = time.monotonic() - started
    leaked = [p for p in pids(pid_file) if alive(p)]
    return summary, results, elapsed, leaked, pid_file


def test_stall_at_start_up_is_bounded_by_timeout(tmp_path, variants):
    _, results, elapsed, leaked, _ = execute(tmp_path, variants, "hang_startup")
    assert elapsed < 8 and not leaked
    assert set(results) == {v.name for v in variants}
    assert all(r.status is Status.FAILED and "printed nothing for 2s at start-up" in r.message
               for r in results.values())


@pytest.mark.slow
def test_stall_between_benchmarks_blames_the_next_and_runs_the_rest(tmp_path, variants):
    target = variants[2].name
    _, results, elapsed, leaked, _ = execute(tmp_path, variants, "stall_before", target)
    assert elapsed < 10 and not leaked
    assert results[target].status is Status.FAILED and "stalled 2s" in results[target].message
    assert all(r.status is Status.OK for n, r in results.items() if n != target)
    assert len(results) == len(variants)


@pytest.mark.slow
def test_hang_inside_a_benchmark_and_after_the_last_result(tmp_path, variants):
    target = variants[1].name
    (tmp_path / "a").mkdir()
    _, results, _, leaked, _ = execute(tmp_path / "a", variants, "hang", target)
    assert results[target].status is Status.FAILED and results[target].message == "timed out after 2s"
    assert sum(r.status is Status.OK for r in results.values()) == len(variants) - 1 and not leaked
    (tmp_path / "b").mkdir()
    _, results, elapsed, leaked, _ = execute(tmp_path / "b", variants, "hang_after")
    # everything reported: the binary gets a short grace to exit, not the whole timeout
    assert all(r.status is Status.OK for r in results.values()) and len(results) == len(variants)
    assert elapsed < 8 and not leaked


def test_grandchild_holding_stdout_does_not_hang_the_run(tmp_path, variants):
    _, results, elapsed, _, pid_file = execute(tmp_path, variants, "grandchild", timeout=60)
    try:
        assert elapsed < 15  # far below the timeout: the runner stops listening after the exit
        assert all(r.status is Status.OK for r in results.values()) and len(results) == len(variants)
    finally:
        for p in pids(pid_file):
            if alive(p):
                os.kill(p, signal.SIGKILL)


def test_output_that_is_not_utf8_is_replaced_not_fatal(tmp_path, variants):
    _, results, _, leaked, _ = execute(tmp_path, variants, "noise")
    assert all(r.status is Status.OK for r in results.values()) and len(results) == len(variants)
    assert all(r.implementation == "jit:\ufffd\ufffd" for r in results.values())
    assert not leaked


def test_malformed_result_lines_fail_their_variant_and_keep_the_line(tmp_path, variants):
    bad = [v.name for v in variants[:6]]
    summary, results, _, leaked, _ = execute(tmp_path, variants, "malformed", ",".join(bad))
    assert len(results) == len(variants) and summary.failed == 6 and not leaked
    expected = ["not a JSON object", "unknown status 'excellent'", "no status", "median_ms is 'fast'",
                "iterations is -3", "not a JSON object"]
    for name, why in zip(bad, expected):
        r = results[name]
        assert r.status is Status.FAILED and why in r.message, r.message
        assert "BENANZA_RESULT" in r.message
        assert r.metrics["reproduce"].endswith("--benchmark_repetitions=1")
    with PerfDB(tmp_path / "r.db", readonly=True) as db:
        raw = [json.loads(x[0]) for x in db.db.conn.execute("SELECT raw FROM results")]
    assert sum(1 for r in raw if r.get("line", "").startswith("BENANZA_RESULT {not json")) == 1


def test_implausible_result_fields_fail_their_variant_and_keep_the_line(tmp_path, variants):
    """Lines that parse but cannot be a measurement: each fails the running benchmark with the
    line kept; the benchmark another line named keeps its own real result."""
    bad = [v.name for v in variants[:5]]
    other = variants[-1].name
    cases = ["median_ms is -4.999", f"names {other!r}, not the running benchmark", "times_ms is 'abc'",
             "times_ms is nan", "median_ms is 1e+308"]
    summary, results, _, leaked, _ = execute(tmp_path, variants, "malformed", ",".join(bad), offset=6)
    assert summary.failed == 5 and not leaked and len(results) == len(variants)
    for name, why in zip(bad, cases):
        assert results[name].status is Status.FAILED and why in results[name].message, results[name].message
    assert results[other].status is Status.OK and results[other].median_ms == 0.5
    (tmp_path / "b").mkdir()
    summary, results, _, _, _ = execute(tmp_path / "b", variants, "malformed", ",".join(bad[:2]), offset=11)
    assert "flops is inf" in results[bad[0]].message and "min_ms 0.7 exceeds median_ms 0.5" in results[bad[1]].message
    with PerfDB(tmp_path / "r.db", readonly=True) as db:
        rows = list(db.db.conn.execute("SELECT metrics, raw, median_ms FROM results"))
    for metrics, raw, median in rows:  # every stored column is valid JSON, every time positive
        json.loads(metrics, parse_constant=lambda c: pytest.fail(f"{c} stored"))
        json.loads(raw, parse_constant=lambda c: pytest.fail(f"{c} stored"))
        assert median is None or median > 0
    assert sum("BENANZA_RESULT" in json.loads(raw).get("line", "") for _, raw, _ in rows) == 5


def test_crash_fails_only_its_benchmark_with_a_reproduce_line(tmp_path, variants):
    target = variants[4].name
    summary, results, _, leaked, _ = execute(tmp_path, variants, "abort", target)
    assert "SIGABRT" in results[target].message and not leaked
    assert sum(r.status is Status.OK for r in results.values()) == len(variants) - 1
    (failure,) = summary.failures
    assert failure.name == target and results[target].metrics["reproduce"] == failure.reproduce
    words = shlex.split(failure.reproduce)
    assert "STANDIN_MODE=abort" in words and words[-1] == "--benchmark_repetitions=1"
    assert f"--benchmark_filter=^{_regex_literal(target)}(/|$)" in words
    assert re.match(f"^{_regex_literal(target)}(/|$)", target + "/real_time")


# --- killing `benanza run` itself -------------------------------------------------------

STANDIN_PROJECT = """cmake_minimum_required(VERSION 3.19)
project(standin NONE)
configure_file(standin.py benanza_bench COPYONLY FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE)
"""


@pytest.fixture
def standin_bench(bench, tmp_path) -> Path:
    """A generated bench folder whose project builds the stand-in instead of C++."""
    import shutil

    root = tmp_path / "bench"
    shutil.copytree(bench, root, ignore=shutil.ignore_patterns("build"))
    (root / "onednn" / "CMakeLists.txt").write_text(STANDIN_PROJECT)
    make_standin(root / "onednn").rename(root / "onednn" / "standin.py")
    return root


@pytest.mark.slow
def test_cli_run_prints_each_failure_with_its_reproduce_line(standin_bench, tmp_path, variants):
    crash = variants[2].name
    env = dict(os.environ, STANDIN_MODE="abort", STANDIN_TARGET=crash, STANDIN_PIDS=str(tmp_path / "pids"),
               COLUMNS="2000")
    done = subprocess.run([str(Path(sys.executable).parent / "benanza"), "run", "--system", "box", "--backend",
                           "onednn", "--bench-dir", str(standin_bench), "--db", str(tmp_path / "r.db"),
                           "--timeout", "30"], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    at = lines.index(next(ln for ln in lines if ln.startswith(f"failed: {crash}: crashed (SIGABRT)")))
    words = shlex.split(lines[at + 1].strip().removeprefix("reproduce: "))
    # what Benanza set for the binary is on the line; what the user's shell has (STANDIN_*) is not
    assert words[0].startswith("OMP_NUM_THREADS=") and not any(w.startswith("STANDIN_") for w in words)
    binary = next(i for i, w in enumerate(words) if Path(w).name == "benanza_bench")
    assert Path(words[binary]).is_absolute()
    assert words[binary + 1] == f"--benchmark_filter=^{_regex_literal(crash)}(/|$)"
    # then the run's budget: the default, adaptive sampling to 2%
    assert "--benanza_precision=0.02" in words[binary + 2:]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_killed_run_leaves_no_process_and_no_temp_folder(standin_bench, tmp_path, variants, sig):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    pid_file = tmp_path / "pids"
    hang = variants[3].name
    env = dict(os.environ, STANDIN_MODE="hang", STANDIN_TARGET=hang, STANDIN_PIDS=str(pid_file), TMPDIR=str(tmp))
    db = tmp_path / "r.db"
    proc = subprocess.Popen([str(Path(sys.executable).parent / "benanza"), "run", "--system", "box",
                             "--backend", "onednn", "--bench-dir", str(standin_bench), "--db", str(db),
                             "--timeout", "300"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not pids(pid_file):
        time.sleep(0.1)
    time.sleep(1.0)  # the stand-in is now inside the hanging benchmark
    child = pids(pid_file)
    assert child and alive(child[0])
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(p) for p in child):
        time.sleep(0.1)
    assert not [p for p in child if alive(p)], "the benchmark child outlived `benanza run`"
    assert list(tmp.iterdir()) == []  # no temp folder, no names file
    with PerfDB(db, readonly=True) as pdb:
        system = pdb.system("box")
        peaks = pdb.peaks(system) if system is not None else None
    # the stack's peaks are measured before the pass: a run killed inside it (a GPU lease's time
    # limit cuts every campaign short) is still held to its roofline
    assert peaks is not None and peaks.peaks, err.decode()
    if sig == signal.SIGTERM:
        assert proc.returncode == 130, err.decode()
        with PerfDB(db, readonly=True) as pdb:
            kept = {r.variant.name for r in pdb.results("box")}
        assert len(kept) >= 3 and hang not in kept  # what was measured before the signal is kept


@pytest.mark.slow
def test_sigterm_of_db_serve_stops_datasette(tmp_path):
    """`db serve` becomes Datasette (exec), so a signal to it reaches the server itself."""
    pytest.importorskip("datasette")
    db = tmp_path / "s.db"
    PerfDB(db).close()
    proc = subprocess.Popen([str(Path(sys.executable).parent / "benanza"), "db", "serve", "--db", str(db),
                             "--port", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    serving = False
    while time.monotonic() < deadline and not serving:
        time.sleep(0.2)
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        serving = b"datasette" in cmdline and any(Path(f"/proc/{proc.pid}/task").glob("*"))
    assert serving, "datasette never started"
    children_file = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    kids = [int(x) for x in children_file.read_text().split()]
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(k) for k in kids):
        time.sleep(0.1)
    assert not [k for k in kids if alive(k)], "a child of `benanza db serve` outlived it"


# --- concurrent runs on one bench dir ------------------------------------------------------

def concurrent_runs(tmp_path: Path, save) -> tuple[list, list[tuple], set[str]]:
    """Four `benanza run` at once on a bench dir nobody built yet (as Slurm nodes sharing one
    folder): their probes, the rows stored, and the variant names generated."""
    from faultprobe import CLI, Probe
    from helpers import io, model
    from onnx import helper

    tiny = save(model([helper.make_node("Relu", ["x"], ["y"], name="r")], [io("x", [1, 4, 8, 8])],
                      [io("y", [1, 4, 8, 8])]), name="tiny.onnx")
    bench = tmp_path / "B"
    # f32 only: every CPU runs it, so each row is "ok" (a CPU without bf16 refuses those variants)
    subprocess.run([CLI, "generate", str(tiny), "--backend", "onednn", "--dtype", "f32", "--out", str(bench)],
                   check=True, capture_output=True, timeout=120)
    names = {v["name"] for v in json.loads((bench / "onednn" / "variants.json").read_text())["variants"]}
    db = tmp_path / "x.db"
    args = [("run", "--system", f"s{i}", "--bench-dir", str(bench), "--backend", "onednn", "--db", str(db),
             "--min-time", "0.01", "--repetitions", "1", "--remeasure", "0") for i in range(4)]
    procs = [subprocess.Popen([CLI, *a], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for a in args]
    probes = []
    for a, p in zip(args, procs):
        try:
            out, err = p.communicate(timeout=900)
            probes.append(Probe(a, p.returncode, out, err))
        except subprocess.TimeoutExpired:
            p.kill()
            probes.append(Probe(a, None, *p.communicate()))
    with PerfDB(db, readonly=True) as pdb:
        rows = list(pdb.db.conn.execute("SELECT system, variant, status FROM results"))
    return probes, rows, names


@pytest.mark.slow  # builds the oneDNN project
def test_concurrent_runs_on_an_unbuilt_bench_dir_build_once_and_store_every_row(tmp_path, save):
    """They build one at a time (no CMake collision, no binary executed while being linked),
    and every process stores each variant of the real oneDNN project exactly once."""
    probes, rows, names = concurrent_runs(tmp_path, save)
    for p in probes:
        assert p.rc == 0, p.err
    assert sorted(rows) == sorted((f"s{i}", n, "ok") for i in range(4) for n in names)


# --- a database that stops taking writes mid-run ---------------------------------------------------

FULL_RUN = """
import json, os, resource, sys
sys.path[:0] = [{repo!r}, {tests!r}]
from pathlib import Path
from tests.faults.test_run import execute
from benanza.errors import BenanzaError
from benanza.generator import read_variants
from benanza.perfdb import PerfDB
from benanza.records import System
tmp = Path({tmp!r})
variants = read_variants({bench!r})[:6]
with PerfDB(tmp / "r.db") as db:  # created, then files may not grow: the run's writes fail
    db.upsert_system(System("box", "onednn", "stand-in", (("threads", "1"),)))
    db.db.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
resource.setrlimit(resource.RLIMIT_FSIZE, (32768, 32768))  # the -shm fits, the WAL not a run
try:
    execute(tmp, variants, "")
except BenanzaError as exc:
    print(exc)
"""


def full_database_run(bench: Path, tmp_path: Path) -> tuple[subprocess.CompletedProcess, int]:
    """A run whose database stops taking writes; what it printed, and the results it kept."""
    script = FULL_RUN.format(repo=str(REPO), tests=str(TESTS), tmp=str(tmp_path), bench=str(bench / "onednn"))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    with PerfDB(tmp_path / "r.db", readonly=True) as db:
        return done, db.counts()[3].rows


def test_database_that_stops_taking_writes_says_what_was_stored(bench, tmp_path):
    done, stored = full_database_run(bench, tmp_path)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout.strip() == (f"{tmp_path / 'r.db'}: cannot write (disk I/O error); {stored} results of this "
                                   f"run were stored before it, the 6 measured since were not: run the same "
                                   f"command again to measure them")
