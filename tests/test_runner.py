"""`benanza run`: incremental runs, crash and hang recovery, Ctrl-C resume, GPU guard."""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import generate_bench

from benanza.cli import main
from benanza.generator import GenOptions
from benanza.perfdb import PerfDB
from benanza.processor import load_model
from benanza.records import Status, System
from benanza.runner import NoDeviceError, RunOptions, run
from benanza.system import probe_gpu
from tests.backends.test_onednn import HAVE_TOOLCHAIN, small_cnn

# No re-measurement (of results unstable or contended on a busy machine: tested on its own), so
# these tests can count measurements.
FAST = dict(min_time=0.01, repetitions=1, remeasure=0)

needs_toolchain = pytest.mark.skipif(not HAVE_TOOLCHAIN, reason="needs cmake, libdnnl-dev and libbenchmark-dev")


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> Path:
    """A small model's f32 benchmarks, generated and built once for the module."""
    root = tmp_path_factory.mktemp("bench")
    models = [load_model(small_cnn(root / "small.onnx"), batch_size=1)]
    generate_bench(models, "onednn", root, GenOptions(dtypes=("f32",), layouts=("nchw", "any")))
    return root


def names(db: Path) -> dict[str, Status]:
    with PerfDB(db) as pdb:
        return {r.variant.name: r.status for r in pdb.results("ci")}


@pytest.mark.slow
@needs_toolchain
def test_second_run_measures_nothing_new_and_force_remeasures(bench, tmp_path):
    db = tmp_path / "r.db"
    first = run(bench, "ci", "onednn", db, RunOptions(**FAST))
    assert first.stored == first.total > 20 and first.failed == 0
    second = run(bench, "ci", "onednn", db, RunOptions(**FAST))
    assert second.already == second.total and second.stored == 0 and second.to_run == []
    dry = run(bench, "ci", "onednn", db, RunOptions(dry_run=True, force=True, filter="^pool:"))
    assert dry.to_run and all(n.startswith("pool:") for n in dry.to_run)
    forced = run(bench, "ci", "onednn", db, RunOptions(force=True, filter="^pool:", **FAST))
    assert forced.stored == len(dry.to_run)
    with PerfDB(db) as pdb:
        assert pdb.db["results"].count == first.total + forced.stored


@pytest.mark.slow
@needs_toolchain
def test_each_child_runs_seconds_of_benchmarks_after_its_reading(bench, tmp_path, monkeypatch):
    """The runner reads the machine's speed before each child of a CPU backend, and gives each
    child about ``READ_EVERY_S`` of benchmarks (1 s here), so a result's reading is that fresh,
    not a whole pass old. Oracle: the results' own store times; results that share a reading
    (one child's) lie within a few seconds of each other, and the run has several readings."""
    from datetime import datetime

    from benanza import machine_speed

    monkeypatch.setattr(machine_speed, "READ_EVERY_S", 1.0)
    db = tmp_path / "r.db"
    summary = run(bench, "ci", "onednn", db, RunOptions(min_time=0.05, repetitions=1, remeasure=0))
    with PerfDB(db) as pdb:
        rows = list(pdb.db.query("SELECT metrics, timestamp FROM results ORDER BY id"))
    assert len(rows) == summary.total and summary.failed == 0
    children: list[list[datetime]] = []
    last = None
    for row in rows:
        metrics = json.loads(row["metrics"])
        reading = (metrics.get("probe_core_ms"), metrics.get("probe_memory_ms"))
        if reading == (None, None):  # an unsupported variant: measured nothing
            continue
        if reading != last:
            children.append([])
            last = reading
        children[-1].append(datetime.fromisoformat(row["timestamp"]))
    spans = [(c[-1] - c[0]).total_seconds() for c in children]
    whole = (children[-1][-1] - children[0][0]).total_seconds()
    assert len(children) >= max(2, whole / 2), (whole, spans)
    assert max(spans) <= 3, (whole, spans)


@pytest.mark.slow
@needs_toolchain
def test_crashing_and_hanging_benchmarks_do_not_lose_the_others(bench, tmp_path):
    all_names = run(bench, "ci", "onednn", tmp_path / "dry.db", RunOptions(dry_run=True)).to_run
    crash, hang = all_names[3], all_names[7]
    db = tmp_path / "r.db"
    summary = run(bench, "ci", "onednn", db, RunOptions(
        # long enough that no healthy benchmark hits it on a loaded 2-core machine
        timeout=10, env=(("BENANZA_FAULT_ABORT", crash), ("BENANZA_FAULT_HANG", hang)), **FAST))
    stored = names(db)
    assert set(stored) == set(all_names)  # every benchmark has a row, including after the faults
    assert stored[crash] is Status.FAILED and stored[hang] is Status.FAILED
    assert summary.failed == 2
    with PerfDB(db) as pdb:
        msgs = {r.variant.name: r.message for r in pdb.results("ci")}
    assert "SIGABRT" in msgs[crash] and "timed out after 10s" in msgs[hang]
    assert sum(s is Status.OK for s in stored.values()) > len(all_names) // 2


@pytest.mark.slow
@needs_toolchain
def test_interrupted_run_keeps_results_and_resumes(bench, tmp_path):
    db = tmp_path / "r.db"
    total = len(run(bench, "ci", "onednn", db, RunOptions(dry_run=True)).to_run)
    # A hanging benchmark late in the list holds the run so it can be interrupted mid-way.
    hang_at = run(bench, "ci", "onednn", db, RunOptions(dry_run=True)).to_run[total // 2]
    # PYTHONFAULTHANDLER: a run that ignores the interrupt is sent SIGABRT, which prints where
    # each of its threads stood; its output goes to a file, which never fills as a pipe would
    env = dict(os.environ, BENANZA_FAULT_HANG=hang_at, PYTHONFAULTHANDLER="1")
    err_path = tmp_path / "stderr"
    with open(err_path, "wb") as err_file:
        proc = subprocess.Popen([str(Path(sys.executable).parent / "benanza"), "run", "--system", "ci",
                                 "--backend", "onednn", "--bench-dir", str(bench), "--db", str(db), "--min-time",
                                 "0.01", "--repetitions", "1"], env=env, stdout=subprocess.DEVNULL, stderr=err_file,
                                # SIGINT as a terminal's Ctrl-C finds it: a suite started in the
                                # background of a script inherits it ignored, and so would the run
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
            if db.exists() and len(names(db)) >= total // 2:
                break
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=180)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            proc.wait(timeout=60)
            raise AssertionError("benanza run went on 180 s after SIGINT:\n" + err_path.read_text()[-8000:]) from None
    assert proc.returncode == 130, err_path.read_text()[-8000:]
    kept = names(db)
    assert total // 2 <= len(kept) < total and hang_at not in kept
    resumed = run(bench, "ci", "onednn", db, RunOptions(**FAST))
    assert resumed.already == len(kept) and resumed.stored == total - len(kept)
    assert len(names(db)) == total


@pytest.mark.gpu
@pytest.mark.skipif(probe_gpu().present, reason="checks the no-GPU guard: a GPU device is present")
def test_cudnn_without_gpu_stops_before_building(tmp_path):
    db = tmp_path / "never.db"
    with pytest.raises(NoDeviceError, match="no CUDA device found.*onednn"):
        run(tmp_path / "nothing-generated-here", "gpu", "cudnn", db)
    out = CliRunner().invoke(main, ["run", "--system", "gpu", "--backend", "cudnn", "--bench-dir",
                                    str(tmp_path), "--db", str(db)])
    assert out.exit_code == 1 and "no CUDA device found" in out.output
    assert not db.exists() and not (tmp_path / "cudnn").exists()


def test_bad_filter_and_missing_project_are_clear_errors(tmp_path):
    out = CliRunner().invoke(main, ["run", "--system", "x", "--backend", "onednn", "--bench-dir", str(tmp_path),
                                    "--db", str(tmp_path / "a.db")])
    assert out.exit_code == 1 and "layers.json" in out.output


def test_cupti_kernel_records_are_stored_with_their_result(tmp_path):
    """A stand-in binary speaking the runtime's line protocol as a CUPTI-mode build does."""
    from benanza.records import System, Variant
    from benanza.runner import RunSummary, _execute

    variants = [Variant.of_key(f"eltwise:relu_in1x{n}_f32", "cudnn", "cudnnActivationForward") for n in (8, 16)]
    fake = tmp_path / "benanza_bench"
    fake.write_text(f"""#!{sys.executable}
import json, sys
names = open(sys.argv[1].split("=", 1)[1]).read().split()
for n in names:
    print("BENANZA_START", n, flush=True)
    print("BENANZA_METRICS", json.dumps({{"name": n, "profile": {{"kernels": [{{"name": "relu_kernel", \
"duration_ns": 1200}}]}}}}), flush=True)
    print("BENANZA_RESULT", json.dumps({{"name": n, "status": "ok", "median_ms": 0.01, "iterations": 10, \
"repetitions": 1}}), flush=True)
""")
    fake.chmod(0o755)
    system = System("gpu-box", "cudnn", "stand-in", (("cuda", "13.0"),))
    summary = RunSummary(system, "cudnn", tmp_path / "r.db", total=len(variants), already=0)
    with PerfDB(tmp_path / "r.db") as db:
        _execute(fake, variants, dict(os.environ), RunOptions(timeout=30), db, system, summary, None)
        results = {r.variant.name: r for r in db.results("gpu-box")}
    assert set(results) == {v.name for v in variants}
    for r in results.values():
        assert r.status is Status.OK
        assert r.metrics["cupti"]["kernels"][0]["name"] == "relu_kernel"


def _stand_in(path: Path, script: str) -> Path:
    """A benchmark binary speaking the runtime's line protocol; ``script`` prints per name ``n``."""
    path.write_text(f"""#!{sys.executable}
import json, statistics, sys
from pathlib import Path
names = open(sys.argv[1].split("=", 1)[1]).read().split()
def result(n, times):
    med = statistics.median(times)
    print("BENANZA_RESULT", json.dumps({{"name": n, "status": "ok", "median_ms": med, "mean_ms": statistics.mean(times),
          "stddev_ms": statistics.stdev(times), "min_ms": min(times), "iterations": 10, "repetitions": len(times),
          "times_ms": times}}), flush=True)
for n in names:
    print("BENANZA_START", n, flush=True)
{script}
""")
    path.chmod(0o755)
    return path


def test_unstable_results_are_remeasured_and_what_stays_noisy_is_flagged(tmp_path):
    from benanza.records import Variant
    from benanza.runner import RunSummary, _execute

    noisy, settles, calm = (Variant.of_key(f"eltwise:relu_in1x{n}_f32", "onednn", "eltwise") for n in (8, 16, 32))
    # the demo's fused conv: median 2.03, mean 8.5, stddev 12.3 ms; "settles" is noisy only at first
    fake = _stand_in(tmp_path / "benanza_bench", f"""
    seen = Path({str(tmp_path / "seen")!r}) / n.replace("/", "_")
    seen.parent.mkdir(exist_ok=True)
    first = not seen.exists()
    seen.touch()
    if n == {noisy.name!r} or (n == {settles.name!r} and first):
        result(n, [0.5, 2.03, 23.0])
    else:
        result(n, [0.50, 0.52, 0.53])
""")
    system = System("ci", "onednn", "stand-in", (("threads", "1"),))
    summary = RunSummary(system, "onednn", tmp_path / "r.db", total=3, already=0)
    with PerfDB(tmp_path / "r.db") as db:
        # stability alone: a loaded machine's contention must not add re-measurements of its own
        _execute(fake, [noisy, settles, calm], dict(os.environ),
                 RunOptions(timeout=30, remeasure=2, max_rsd=0.1, max_contention=1.0), db, system, summary, None)
        latest = {r.variant: r for r in db.results(system)}
        rows = dict(db.db.execute("SELECT variant, count(*) FROM results GROUP BY variant").fetchall())
    assert rows == {noisy.name: 3, settles.name: 2, calm.name: 1}  # bounded: 1 + 2 re-measurements
    assert latest[noisy].unstable and latest[noisy].rsd == pytest.approx(statistics.stdev([0.5, 2.03, 23.0]) / 2.03)
    assert not latest[settles].unstable and latest[settles].median_ms == pytest.approx(0.52)
    assert summary.ok == 3 and summary.unstable == 1 and summary.remeasured == 3


def test_failed_variants_are_retried_by_later_runs_until_they_failed_too_often(tmp_path):
    from benanza.records import Variant
    from benanza.runner import _execute, _plan

    good, bad = (Variant.of_key(f"eltwise:relu_in1x{n}_f32", "onednn", "eltwise") for n in (8, 16))
    fake = _stand_in(tmp_path / "benanza_bench", f"""
    if n == {bad.name!r}:
        sys.exit(3)  # dies while running it
    result(n, [0.5, 0.5, 0.5])
""")
    system = System("ci", "onednn", "stand-in", (("threads", "1"),))
    options = RunOptions(timeout=30, max_failures=2)
    with PerfDB(tmp_path / "r.db") as db:
        plans = []
        for _ in range(3):
            plan = _plan(db, system, [good, bad], options, tmp_path / "r.db")
            plans.append((plan.to_run, plan.gave_up, plan.already))
            todo = [v for v in (good, bad) if v.name in plan.to_run]
            if todo:
                _execute(fake, todo, dict(os.environ), options, db, system, plan, None)
    assert plans[0] == ([good.name, bad.name], [], 0)
    assert plans[1] == ([bad.name], [], 1)  # the failure is retried without --force
    assert plans[2] == ([], [bad.name], 1)  # failed twice in a row: skipped, and said so


@pytest.mark.slow
@needs_toolchain
def test_real_onednn_results_carry_their_dispersion_and_are_remeasured(bench, tmp_path):
    """Real oneDNN runs with a threshold no measurement meets: each is measured 1 + 1 times and flagged."""
    db = tmp_path / "r.db"
    summary = run(bench, "ci", "onednn", db, RunOptions(filter="^pool:", min_time=0.01, repetitions=3,
                                                         max_rsd=1e-12, remeasure=1))
    assert summary.ok >= 1 and summary.unstable == summary.ok and summary.remeasured == summary.ok
    with PerfDB(db) as pdb:
        latest = [r for r in pdb.results("ci") if r.ok]
        counts = dict(pdb.db.execute("SELECT variant, count(*) FROM results GROUP BY variant").fetchall())
    for r in latest:
        times = r.metrics["times_ms"]  # Google Benchmark's per-repetition times, as the runtime reported them
        assert len(times) == 3 and counts[r.variant.name] == 2 and r.unstable
        assert r.rsd == pytest.approx(statistics.stdev(times) / statistics.median(times), rel=1e-3)


def test_progress_lines_when_not_a_terminal(monkeypatch):
    """One line per period and one at the last benchmark; the time left is the mean time per
    benchmark since the first one started (the build before it excluded) times those left."""
    from benanza import cli
    from benanza.records import Status
    from benanza.runner import Progress

    now = [100.0]
    printed: list[str] = []
    monkeypatch.setattr(cli.err_console, "print", lambda text, **kw: printed.append(text))
    lines = cli._ProgressLines({"ok": 0, "unsupported": 0, "failed": 0}, every=30.0, clock=lambda: now[0])
    now[0] = 160.0  # a minute of building
    lines.step(Progress(0, 4, "a", None))
    for done, status, t in ((1, Status.OK, 170.0), (2, Status.UNSUPPORTED, 200.0), (3, Status.FAILED, 210.0),
                            (4, Status.OK, 215.0)):
        now[0] = t
        lines.step(Progress(done, 4, "x", status))
    assert printed == [
        "run: 1/4 benchmarks (ok 1, unsupported 0, failed 0), 1m10s spent, about 30s left",  # 10 s for 1
        "run: 2/4 benchmarks (ok 1, unsupported 1, failed 0), 1m40s spent, about 40s left",  # 40 s for 2
        "run: 4/4 benchmarks (ok 2, unsupported 1, failed 1), 1m55s spent, about 0s left",
    ]
    # a second pass re-measures what stayed unstable or contended: counted on its own
    now[0] = 216.0
    lines.step(Progress(0, 1, "x", None))
    now[0] = 218.0
    lines.step(Progress(1, 1, "x", Status.OK))
    assert printed[-1] == "re-measure: 1/1 benchmarks (ok 1, unsupported 0, failed 0), 1m58s spent, about 0s left"


def test_progress_lines_say_the_build_is_going_on_until_the_first_benchmark(monkeypatch):
    """Not a terminal: before the first benchmark starts (the build) a line at each period,
    none once benchmarks run."""
    from benanza import cli
    from benanza.runner import Progress

    printed: list[str] = []
    monkeypatch.setattr(cli.err_console, "print", lambda text, **kw: printed.append(text))
    with cli._ProgressLines({"ok": 0, "unsupported": 0, "failed": 0}, every=0.05) as lines:
        deadline = time.monotonic() + 10
        while len(printed) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        lines.step(Progress(0, 3, "a", None))
        lines.beat.join(timeout=10)
        assert not lines.beat.is_alive()
        building = len(printed)
        time.sleep(0.2)
    assert building >= 2 and len(printed) == building  # nothing after the first benchmark started
    assert all(re.fullmatch(r"run: building, \d+s spent", p) for p in printed), printed
