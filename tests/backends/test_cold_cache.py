"""Cold-cache readings of the in-process backends (`benanza run --cold-cache`).

The oracle for the eviction is the memory itself: the test reads the cache sizes from sysfs on
its own and times a buffer streamed from a working set several times the last-level cache, which
no cache holds; a buffer read after the eviction must take about as long per byte, and much
longer than the same buffer read warm. The stacks and results are read back with SQL.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from helpers import invoke, io, model
from onnx import helper

from benanza.backends.inprocess import EVICT_FACTOR, Evictor
from benanza.cli import main
from benanza.perfdb import PerfDB

SYSTEM = "coldbox"
ROUNDS = 15


def _llc_bytes() -> int:
    """The last-level cache of the CPUs this process may run on, read from sysfs here: the size
    of cpu0's highest cache level times its distinct instances among those CPUs."""
    root = Path("/sys/devices/system/cpu")
    top = max((root / "cpu0" / "cache").glob("index*"), key=lambda p: int((p / "level").read_text()))
    size = (top / "size").read_text().strip()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1], 1)
    shared = {
        (root / f"cpu{c}" / "cache" / top.name / "shared_cpu_list").read_text().strip() for c in os.sched_getaffinity(0)
    }
    return int(size.rstrip("KMG")) * scale * len(shared)


def _read_s(a: np.ndarray) -> float:
    started = time.perf_counter()
    np.bitwise_or.reduce(a)
    return time.perf_counter() - started


def _stream_s(nbytes: int) -> float:
    """The time to read ``nbytes`` from memory: the 10th percentile over the ``nbytes`` chunks of
    a buffer four last-level caches long, read in order on its second pass, when each chunk was
    last read four caches' worth of data ago (a short read each, as the one it is compared with,
    so a busy machine disturbs both alike)."""
    big = np.ones(max(4 * _llc_bytes(), 16 * nbytes) // 8, np.int64).reshape(-1, nbytes // 8)
    for chunk in big:
        _read_s(chunk)
    return float(np.percentile([_read_s(chunk) for chunk in big], 10))


def test_a_read_after_the_eviction_runs_at_the_speed_of_memory():
    llc = _llc_bytes()
    evict = Evictor()
    assert evict.llc_bytes == llc and evict.nbytes >= EVICT_FACTOR * llc
    small = np.ones(min(llc // 8, 4 << 20) // 8, np.int64)  # fits the last-level cache, warm
    warm, cold = [], []
    for _ in range(ROUNDS):
        _read_s(small)
        warm.extend(_read_s(small) for _ in range(3))
        evict()
        cold.append(_read_s(small))
    # the cache's speed is the fastest warm read: a neighbour sharing the last-level cache slows
    # warm reads towards memory's (a busy CI machine read warm at 1.6x this one's), never cold ones
    # towards the cache's
    warm_s, cold_s = min(warm), np.percentile(cold, 10)
    memory_s = _stream_s(small.nbytes)
    assert cold_s >= 0.5 * memory_s, (cold_s, memory_s)  # from memory
    assert cold_s >= 2 * warm_s, (cold_s, warm_s)  # not from a cache


def test_cold_cache_is_refused_where_no_backend_reads_cold(tmp_path):
    out = CliRunner().invoke(
        main,
        [
            "run",
            "--system",
            SYSTEM,
            "--backend",
            "onednn",
            "--bench-dir",
            str(tmp_path),
            "--db",
            str(tmp_path / "p.db"),
            "--cold-cache",
        ],
    )
    assert out.exit_code == 1, out.output
    assert out.output.strip().splitlines() == [
        "error: --cold-cache: the onednn backend has no cold-cache reading (the torch and onnxruntime backends have)"
    ]


def _relu(path: Path, nbytes: int) -> None:
    """A Relu over ``nbytes`` of f32: with its output a quarter of the last-level cache, so a warm
    call finds both there and a cold one in memory."""
    n = nbytes // 4
    onnx.save(
        model(
            [helper.make_node("Relu", ["x"], ["y"], name="relu")],
            [io("x", [1, n // 1024, 32, 32])],
            [io("y", None)],
            opset=17,
        ),
        path,
    )


@pytest.mark.slow  # runs a framework's benchmarks twice
@pytest.mark.parametrize("backend", ["onnxruntime", "torch"])
def test_a_cold_run_is_its_own_stack_and_reads_its_data_from_memory(backend, tmp_path):
    llc = _llc_bytes()
    nbytes = llc // 8
    _relu(tmp_path / "relu.onnx", nbytes)
    bench, db = tmp_path / "bench", tmp_path / "p.db"
    # one variant: the model's own dtype and layout
    invoke(
        "generate",
        str(tmp_path / "relu.onnx"),
        "--backend",
        backend,
        "--out",
        str(bench),
        "--dtype",
        "f32",
        "--layout",
        "nchw",
    )
    run = [
        "run",
        "--system",
        SYSTEM,
        "--backend",
        backend,
        "--bench-dir",
        str(bench),
        "--db",
        str(db),
        "--threads",
        "1",
        "--min-time",
        "0.05",
        "--repetitions",
        "3",
    ]
    invoke(*run)
    invoke(*run, "--cold-cache")
    with sqlite3.connect(db) as conn:
        stacks = {sid: json.loads(stack) for sid, stack in conn.execute("SELECT stack_id, stack FROM systems")}
        rows = conn.execute("SELECT stack_id, low_ms, metrics FROM results WHERE status = 'ok' ORDER BY id").fetchall()
    (cold_id,) = [sid for sid, s in stacks.items() if s.get("cache") == "cold"]
    (warm_id,) = [sid for sid, s in stacks.items() if "cache" not in s]
    assert {k: v for k, v in stacks[cold_id].items() if k != "cache"} == stacks[warm_id]  # the cache alone differs
    low = {}
    for sid, low_ms, metrics in rows:  # the newest result of each stack (a re-measured one replaces the first)
        low[sid] = low_ms
        assert ("evict_bytes" in json.loads(metrics)) == (sid == cold_id)
        if sid == cold_id:
            assert json.loads(metrics)["evict_bytes"] >= EVICT_FACTOR * llc
    assert set(low) == {warm_id, cold_id}
    assert low[cold_id] >= low[warm_id], low
    memory_s = _stream_s(nbytes)
    assert low[cold_id] / 1e3 >= 0.5 * memory_s, (low, memory_s)  # its input from memory
    for cold in ([], ["--cold-cache"]):  # each stack is complete: neither run counts the other's result
        assert "0 of 1 benchmarks would run" in invoke(*run, *cold, "--dry-run")
    # the newer cold stack is not what an analysis reads by default: the warm one is
    with PerfDB(db, readonly=True) as pdb:
        default = pdb.system(SYSTEM, backend)
    assert default is not None and default.stack_id == warm_id
