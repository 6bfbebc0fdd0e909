"""Performance database: storage, latest-per-variant lookups, schema guard, merge, concurrency."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import FIXTURES

from benanza.cli import main
from benanza.perfdb import DEFAULT_PATH, SCHEMA_VERSION, DatabaseError, PerfDB, missing_command, resolve_db_path
from benanza.records import Result, Status, System, Variant

SYSTEM = System("box", "onednn", "Test CPU", (("onednn", "2.6.3"), ("threads", "2")))
OTHER_STACK = System("box", "onednn", "Test CPU", (("onednn", "3.2.0"), ("threads", "2")))


def variant(i: int, dtype: str = "f32") -> Variant:
    return Variant.of_key(f"conv:mb1_ic{i}ih8iw8_oc8oh8ow8_kh3kw3_sh1sw1_ph1pw1_dh1dw1_g1_bias0_f32", "onednn",
                   "convolution", "direct", dtype, "nchw", "default", "none")


def result(v: Variant, ms: float | None = 1.0, status: Status = Status.OK, stamp: str = "") -> Result:
    return Result(v, SYSTEM.name, status, "" if status is Status.OK else "refused", ms, ms, 0.01, ms,
                  100, 3, 64, "jit:avx2", {"times_ms": [ms]}, stamp)


def test_insert_and_latest_result_per_variant(tmp_path):
    with PerfDB(tmp_path / "a.db") as db:
        v1, v2 = variant(1), variant(2)
        assert db.insert_results(SYSTEM, [result(v1, 2.0), result(v2, status=Status.UNSUPPORTED, ms=None)],
                                 command="benanza run", raw={"x": 1}) == 2
        db.insert_results(SYSTEM, [result(v1, 1.5)])
        got = {r.variant: r for r in db.results("box")}
        assert got[v1].median_ms == 1.5 and got[v1].implementation == "jit:avx2"
        assert got[v1].workspace_bytes == 64 and got[v1].metrics == {"times_ms": [1.5]}
        assert got[v2].status is Status.UNSUPPORTED and got[v2].message == "refused" and not got[v2].ok
        assert [r.variant for r in db.results("box", [v2.layer_key])] == [v2]
        assert db.results("box", []) == [] and db.results("nobody") == []
        assert db.db["results"].count == 3  # history kept, never overwritten


def test_missing_is_per_stack_and_systems_are_tracked(tmp_path):
    with PerfDB(tmp_path / "a.db") as db:
        vs = [variant(i) for i in range(4)]
        assert db.missing("box", vs) == vs  # unknown system: everything missing
        db.insert_results(SYSTEM, [result(vs[0]), result(vs[1])])
        assert db.missing("box", vs) == vs[2:]
        assert db.missing(OTHER_STACK, vs) == vs  # a new oneDNN version measures again
        db.upsert_system(OTHER_STACK)
        assert db.system("box") == OTHER_STACK  # the most recently used stack
        assert set(db.systems()) == {SYSTEM, OTHER_STACK}
        assert db.system("nobody") is None


def test_newer_schema_and_foreign_files_are_refused(tmp_path):
    path = tmp_path / "a.db"
    PerfDB(path).close()
    con = sqlite3.connect(path)
    con.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    con.commit()
    con.close()
    with pytest.raises(DatabaseError, match="schema version 99 is newer"):
        PerfDB(path)
    foreign = tmp_path / "f.db"
    con = sqlite3.connect(foreign)
    con.execute("CREATE TABLE t(x)")
    con.execute("INSERT INTO t VALUES (1)")
    con.commit()
    con.close()
    with pytest.raises(DatabaseError, match="not a Benanza"):
        PerfDB(foreign)
    assert sqlite3.connect(foreign).execute("SELECT x FROM t").fetchall() == [(1,)]  # untouched
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(DatabaseError, match="junk.db"):
        PerfDB(junk)


def test_merge_keeps_every_row_of_both_and_is_idempotent(tmp_path):
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    with PerfDB(a) as db:
        db.insert_results(SYSTEM, [result(variant(1), 1.0, stamp="2024-01-01T00:00:00+00:00")])
    with PerfDB(b) as db:
        db.insert_results(SYSTEM, [result(variant(1), 3.0, stamp="2024-01-02T00:00:00+00:00"),
                                   result(variant(2), 2.0, stamp="2024-01-02T00:00:00+00:00")])
        db.insert_results(OTHER_STACK, [result(variant(1), 5.0, stamp="2024-01-03T00:00:00+00:00")])
    out = CliRunner().invoke(main, ["db", "merge", str(a), str(b)])
    assert out.exit_code == 0, out.output
    with PerfDB(a) as db:
        assert db.db["results"].count == 4 and db.db["systems"].count == 2
        assert sorted(r[0] for r in db.db.execute("SELECT median_ms FROM results")) == [1.0, 2.0, 3.0, 5.0]
        assert db.merge_from(b)["results"] == 0  # again: nothing duplicated
    with PerfDB(b) as db:
        assert db.db["results"].count == 3  # the source is never modified
    with pytest.raises(DatabaseError, match="into itself"):
        PerfDB(a).merge_from(a)


def _writer(path: str, offset: int, n: int) -> None:
    with PerfDB(path) as db:
        for i in range(n):
            db.insert_results(SYSTEM, [result(variant(offset + i))])


@pytest.mark.slow
def test_two_concurrent_writer_processes_lose_nothing(tmp_path):
    path = str(tmp_path / "c.db")
    PerfDB(path).close()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, k * 1000, 150)) for k in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    with PerfDB(path) as db:
        assert db.db["results"].count == 300
        assert len(db.results("box")) == 300
        assert db.db.journal_mode == "wal"


def test_resolve_db_path_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv("BENANZA_DB", raising=False)
    assert resolve_db_path(None) == DEFAULT_PATH
    monkeypatch.setenv("BENANZA_DB", str(tmp_path / "env.db"))
    assert resolve_db_path(None) == tmp_path / "env.db"
    assert resolve_db_path("flag.db").name == "flag.db"


def test_missing_command_is_a_runnable_pipeline():
    cmd = missing_command(["models/resnet50-v1.onnx", "my model.onnx"], "box", "onednn")
    assert cmd == ("benanza generate models/resnet50-v1.onnx 'my model.onnx' --out out/bench --backend onednn"
                   " && benanza run --system box --backend onednn --bench-dir out/bench")


def test_cli_info_list_export(tmp_path):
    path = tmp_path / "a.db"
    with PerfDB(path) as db:
        db.insert_results(SYSTEM, [result(variant(1), 1.25), result(variant(2), None, Status.FAILED)])
    runner = CliRunner()
    out = runner.invoke(main, ["db", "info", "--db", str(path)])
    assert out.exit_code == 0 and "results" in out.output and "box" in out.output
    out = runner.invoke(main, ["db", "list", "--db", str(path), "--system", "box", "--status", "ok"])
    assert out.exit_code == 0 and "1.2500" in out.output and "refused" not in out.output
    csv = tmp_path / "r.csv"
    out = runner.invoke(main, ["db", "export", "--db", str(path), "--out", str(csv)])
    assert out.exit_code == 0, out.output
    import pandas as pd

    frame = pd.read_csv(csv)
    assert len(frame) == 2 and set(frame["status"]) == {"ok", "failed"}
    pytest.importorskip("pyarrow")
    pq = tmp_path / "r.parquet"
    assert runner.invoke(main, ["db", "export", "--db", str(path), "--out", str(pq)]).exit_code == 0
    assert len(pd.read_parquet(pq)) == 2
    bad = runner.invoke(main, ["db", "export", "--db", str(path), "--out", str(tmp_path / "r.txt")])
    assert bad.exit_code == 1 and "csv or .parquet" in bad.output


@pytest.mark.slow
@pytest.mark.skipif(__import__("importlib").util.find_spec("datasette") is None,
                    reason="Datasette not installed (pip install 'benanza[serve]')")
def test_db_serve_shows_the_results_in_a_web_page(tmp_path):
    import json
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    path = tmp_path / "a.db"
    with PerfDB(path) as db:
        db.insert_results(SYSTEM, [result(variant(7), 0.25)])
    with socket.socket() as s:  # a free loopback port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    cli = Path(sys.executable).parent / "benanza"  # the installed console command
    proc = subprocess.Popen([str(cli), "db", "serve", "--db", str(path),
                             "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                url = f"http://127.0.0.1:{port}/a/results.json?_shape=array"
                with urllib.request.urlopen(url, timeout=5) as r:
                    rows = json.loads(r.read())
                break
            except OSError:
                assert proc.poll() is None, proc.stdout.read().decode()
                assert time.monotonic() < deadline, "datasette did not answer within 60 s"
                time.sleep(0.5)
        assert len(rows) == 1 and rows[0]["median_ms"] == 0.25
    finally:
        proc.terminate()
        proc.wait(timeout=10)


CUDNN = System("box", "cudnn", "Test GPU", (("cudnn", "9.1.0"), ("driver", "550")))


def cudnn_variant(i: int) -> Variant:
    return Variant(variant(i).problem, "cudnn", "cudnnConvolutionForward", "IMPLICIT_GEMM", "f32", "nchw",
                   "default", "none")


def test_a_second_name_on_the_same_machine_is_its_own_system(tmp_path):
    a = SYSTEM
    b = System("other", a.backend, a.device, a.stack)
    with PerfDB(tmp_path / "a.db") as db:
        vs = [variant(i) for i in range(3)]
        db.insert_results(a, [result(v) for v in vs])
        assert db.missing(b, vs) == vs  # nothing of b is measured yet, whatever a stored
        db.insert_results(b, [result(vs[0], 7.0)])
        assert [r.median_ms for r in db.results("other")] == [7.0]
        assert {s.name for s in db.systems()} == {"box", "other"}
        assert len(db.results("box")) == 3


def test_a_lookup_never_mixes_backends_or_stacks(tmp_path):
    with PerfDB(tmp_path / "a.db") as db:
        db.insert_results(SYSTEM, [result(variant(1), 1.0)])
        db.insert_results(CUDNN, [result(cudnn_variant(1), 0.1)])  # newest stack of the name: cuDNN
        assert [r.variant.backend for r in db.results("box")] == ["cudnn"]
        onednn = db.system("box", backend="onednn")
        assert onednn == SYSTEM and [r.median_ms for r in db.results(onednn)] == [1.0]
        db.insert_results(OTHER_STACK, [result(variant(2), 2.0)])  # a oneDNN upgrade
        assert db.system("box", backend="onednn") == OTHER_STACK
        assert [r.median_ms for r in db.results(OTHER_STACK)] == [2.0]  # not the old stack's 1.0
        assert db.system("box", stack=SYSTEM.stack_id[:6]) == SYSTEM
        assert db.stacks("box")[0][0] == OTHER_STACK


def test_failed_results_are_retried_until_they_failed_too_often(tmp_path):
    with PerfDB(tmp_path / "a.db") as db:
        ok, unsup, flaky = variant(1), variant(2), variant(3)
        db.insert_results(SYSTEM, [result(ok), result(unsup, None, Status.UNSUPPORTED),
                                   result(flaky, None, Status.FAILED)])
        assert db.missing(SYSTEM, [ok, unsup, flaky]) == [flaky]  # unsupported stays measured
        db.insert_results(SYSTEM, [result(flaky, None, Status.FAILED)] * 2)
        assert db.failure_streaks(SYSTEM) == {flaky.name: 3}
        assert db.missing(SYSTEM, [flaky], max_failures=3) == []
        assert db.missing(SYSTEM, [flaky], max_failures=4) == [flaky]
        db.insert_results(SYSTEM, [result(flaky, 1.0)])
        db.insert_results(SYSTEM, [result(flaky, None, Status.FAILED)])
        assert db.failure_streaks(SYSTEM) == {flaky.name: 1}  # an ok run in between resets the streak


def test_dispersion_and_the_unstable_flag_are_stored(tmp_path):
    with PerfDB(tmp_path / "a.db") as db:
        v = variant(1)
        noisy = Result(v, "box", Status.OK, "", 2.03, 8.5, 12.3, 0.5, 100, 3, 0, "jit:avx2",
                       {"times_ms": [0.5, 2.03, 23.0]}, "", unstable=True)
        db.insert_results(SYSTEM, [noisy])
        (got,) = db.results("box")
        assert got.unstable and got.rsd == pytest.approx(12.3 / 2.03)
        assert db.db.execute("SELECT rsd FROM results").fetchone()[0] == pytest.approx(12.3 / 2.03)


def _copy(src, dst):
    dst.write_bytes(src.read_bytes())
    return dst


def test_v1_database_migrates_without_losing_rows(tmp_path):
    """tests/fixtures/perfdb_v1.db was written by the schema-1 code (make_perfdb_v1.py)."""
    path = _copy(FIXTURES / "perfdb_v1.db", tmp_path / "v1.db")
    raw = sqlite3.connect(path)
    before = raw.execute("SELECT system, variant, status, median_ms, timestamp FROM results ORDER BY id").fetchall()
    shared = raw.execute("SELECT DISTINCT stack_id FROM results").fetchall()
    raw.close()
    assert len(shared) == 1  # v1: A and B under one stack id
    with PerfDB(path) as db:
        assert db.schema_version == SCHEMA_VERSION  # v1 → v2 → v3 in one opening
        after = db.db.execute(
            "SELECT system, variant, status, median_ms, timestamp FROM results ORDER BY id").fetchall()
        assert after == before
        assert {s.name for s in db.systems()} == {"A", "B"}
        a, b = db.system("A"), db.system("B")
        assert a is not None and b is not None and a.stack_id != b.stack_id and a.stack == b.stack
        assert [r.median_ms for r in db.results("B")] == [0.61]
        by_fusion = {r.variant.fusion: r for r in db.results("A") if r.ok}
        assert by_fusion["bias_relu"].unstable and not by_fusion["none"].unstable
        assert len(db.missing(a, [r.variant for r in db.results("A")])) == 1  # the failed one is retried


def test_merge_reports_and_keeps_conflicting_rows(tmp_path):
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    with PerfDB(a) as db:
        db.insert_results(SYSTEM, [result(variant(1))])
    with PerfDB(b) as db:
        db.insert_results(SYSTEM, [result(variant(2))])
        # same key, different content: the layer row another Benanza version wrote
        db.db.execute("INSERT INTO layers VALUES ('k', 'h', 'Conv', 'conv', '{}', '[]', '[]', 1, 2, 3, NULL, NULL)")
        db.db.execute("INSERT INTO models VALUES ('m', 1, 'm.onnx', '{}', 'now')")
        db.db.execute("INSERT INTO occurrences VALUES ('m', 1, 'n0', 0, 'k')")
    with PerfDB(a) as db:
        db.db.execute("INSERT INTO layers VALUES ('k', 'h', 'Conv', 'conv', '{}', '[]', '[]', 1, 99, 3, NULL, NULL)")
        db.db.execute("INSERT INTO models VALUES ('m', 1, 'elsewhere/m.onnx', '{}', 'now')")
        db.db.execute("INSERT INTO occurrences VALUES ('m', 1, 'n0', 0, 'other')")
    out = CliRunner().invoke(main, ["db", "merge", str(a), str(b)])
    assert out.exit_code == 0 and "conflicts +2" in out.output, out.output
    with PerfDB(a) as db:
        kept = db.conflicts()
        assert sorted(t for t, *_ in kept) == ["layers", "occurrences"]
        assert any('"flops": 2' in row for *_, row in kept)  # the source's row, whole
        assert db.db.execute("SELECT flops FROM layers WHERE key='k'").fetchone()[0] == 99  # target's kept
        assert db.db["results"].count == 2
        assert db.merge_from(b)["conflicts"] == 0 and len(db.conflicts()) == 2  # idempotent


def test_merging_a_v1_source_migrates_a_copy_and_leaves_the_file_alone(tmp_path):
    src = _copy(FIXTURES / "perfdb_v1.db", tmp_path / "v1.db")
    blob = src.read_bytes()
    with PerfDB(tmp_path / "t.db") as db:
        added = db.merge_from(src)
        assert added["results"] == 4 and added["systems"] == 2
        assert [r.median_ms for r in db.results("B")] == [0.61]
    assert src.read_bytes() == blob


def test_results_are_ordered_as_sqlite_orders_key_and_variant_whatever_a_row_holds():
    """``results`` sorts its rows in Python; SQLite's own ORDER BY over the same values, damaged
    ones of every storage class included, is the oracle."""
    from benanza.perfdb import _sqlite_order

    values = [None, 3, -1.5, 2, "b", "a", "ä", "€", "Z", "", b"\x00", b"ab", 0, "10", "9"]
    pairs = [(k, v) for k in values for v in values[::3]]
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (i INTEGER, k, v)")  # no affinity: each value keeps its class
    conn.executemany("INSERT INTO t VALUES (?, ?, ?)", [(i, k, v) for i, (k, v) in enumerate(pairs)])
    want = [i for (i,) in conn.execute("SELECT i FROM t ORDER BY k, v, i")]
    got = sorted(range(len(pairs)), key=lambda i: (_sqlite_order(pairs[i][0]), _sqlite_order(pairs[i][1]), i))
    assert got == want
