"""The CLI contract under bad input: option values each backend offers, numbers past int64,
broken profile bundles and graphs, foreign and read-only databases. Each gets one line that
names the problem, never a traceback, and reading commands never create files."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner
from helpers import FIXTURES, conv_net, io, model
from onnx import helper

from benanza.cli import main
from benanza.generator import GenOptions, expand_variants, get_backend
from benanza.layers import unique_layers
from benanza.manifest import build_manifest
from benanza.perfdb import SCHEMA_VERSION, PerfDB
from benanza.processor import load_model
from benanza.records import Result, Status, System

BENANZA = str(Path(sys.executable).parent / "benanza")


def invoke(*args: str):
    out = CliRunner().invoke(main, list(args))
    assert "Traceback" not in out.output, out.output
    if out.exception is not None and not isinstance(out.exception, SystemExit):
        raise out.exception
    return out


@pytest.fixture
def net(save) -> Path:
    return save(conv_net(), "net.onnx")


# --- variant options --------------------------------------------------------------------

def test_dtype_layout_math_are_validated_per_backend(net, tmp_path):
    out = invoke("generate", str(net), "--out", str(tmp_path / "b"), "--backend", "onednn", "--dtype", "f16")
    assert out.exit_code == 1 and "--dtype f16: the onednn backend offers f32, bf16" in out.output
    assert not (tmp_path / "b").exists()
    out = invoke("generate", str(net), "--out", str(tmp_path / "b"), "--backend", "onednn", "--math", "tf32")
    assert out.exit_code == 1 and "--math tf32: the onednn backend has no such option" in out.output
    out = invoke("generate", str(net), "--out", str(tmp_path / "b"), "--layout", "nwhc")
    assert out.exit_code == 1 and "--layout nwhc: no backend offers it (cudnn: nchw, nhwc; onednn: nchw, nhwc, any)" \
        in out.output
    # several backends: each gets what it offers; one that offers none of it says so
    out = invoke("generate", str(net), "--out", str(tmp_path / "b"), "--dtype", "f16")
    assert out.exit_code == 0, out.output
    assert "cudnn: " in out.output and "benchmark variants" in out.output
    assert "onednn: nothing generated (it offers dtypes f32, bf16" in out.output
    cudnn = json.loads((tmp_path / "b" / "cudnn" / "variants.json").read_text())["variants"]
    assert cudnn and {v["dtype"] for v in cudnn} == {"f16"}


def test_numbers_past_int64_are_usage_errors(net, tmp_path):
    out = invoke("generate", str(net), "--backend", "none", "--out", str(tmp_path), "--batch-size", str(2**63))
    assert out.exit_code == 2 and "--batch-size" in out.output
    out = invoke("generate", str(net), "--backend", "none", "--out", str(tmp_path),
                 "--input-shape", "x=1x3x99999999999999999999x8")
    assert out.exit_code == 1 and "at most 32 dims of at most 2147483647 each" in out.output


def test_db_lookup_expects_what_generate_makes_for_the_systems_backend(net, tmp_path):
    db = tmp_path / "l.db"
    models = [load_model(net)]
    manifest = build_manifest(models, unique_layers(models))
    f32 = expand_variants(manifest, get_backend("onednn"), GenOptions(dtypes=("f32",)))
    system = System("box", "onednn", "cpu", (("onednn", "2.6"),))
    with PerfDB(db) as pdb:
        pdb.insert_results(system, [Result(v, "box", Status.OK, median_ms=1.0, iterations=1, repetitions=1)
                                    for v in f32])
    out = invoke("db", "lookup", str(net), "--system", "box", "--db", str(db), "--dtype", "f32")
    assert out.exit_code == 0 and f"all {len(f32)} benchmarks" in out.output
    out = invoke("db", "lookup", str(net), "--system", "box", "--db", str(db))  # generate's defaults: + bf16
    assert out.exit_code == 1
    missing = [ln.split("missing: ", 1)[1] for ln in out.output.splitlines() if ln.startswith("missing: ")]
    assert missing and all("/dtype=bf16/" in n for n in missing)
    out = invoke("db", "lookup", str(net), "--system", "nobody", "--db", str(db))
    assert out.exit_code == 1 and "system 'nobody' is not in" in out.output and "box" in out.output


# --- broken inputs --------------------------------------------------------------------

def test_graph_cycle_names_the_file(save):
    nodes = [helper.make_node("Relu", ["b"], ["a"], name="r1"), helper.make_node("Relu", ["a"], ["b"], name="r2")]
    path = save(model(nodes, [io("x", [1, 4])], [io("b", [1, 4])]), "cycle.onnx")
    out = invoke("generate", str(path), "--backend", "none", "--out", str(path.parent / "o"))
    assert out.exit_code == 1 and f"{path}: graph has a cycle or undefined tensors: a, b" in out.output


def test_reshape_claiming_a_million_dims_is_refused_at_once(save):
    import time

    import numpy as np
    from onnx import numpy_helper

    shape = numpy_helper.from_array(np.ones(1 << 20, np.int64), "shape")
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Reshape", ["r", "shape"], ["y"], name="reshape")]
    path = save(model(nodes, [io("x", [1, 4])], [io("y", None)], [shape]), "huge.onnx")
    started = time.monotonic()
    out = invoke("generate", str(path), "--backend", "none", "--out", str(path.parent / "o"))
    assert time.monotonic() - started < 20
    assert out.exit_code == 1 and "its shape input 'shape' has 1048576 elements" in out.output


def test_symbolic_inference_runs_under_a_time_limit(save, monkeypatch):
    """ONNX Runtime's symbolic inference (pure Python) is stopped at its budget, in one line."""
    from benanza import processor
    from benanza.errors import ShapeError

    n = 2000  # ONNX does not know the contrib op, so symbolic inference walks every node (~0.1 s)
    nodes = [helper.make_node("Gelu", [f"t{i}"], [f"t{i + 1}"], domain="com.microsoft", name=f"g{i}")
             for i in range(n)]
    m = model(nodes, [io("t0", [1, 64])], [io(f"t{n}", None)])
    m.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    path = save(m, "contrib.onnx")
    assert len(processor.load_model(path).nodes) == n  # within the default budget it resolves all
    monkeypatch.setattr(processor, "SYMBOLIC_SECONDS", 0.002)
    with pytest.raises(ShapeError, match="contrib.onnx: symbolic shape inference took longer than 0.002s"):
        processor.load_model(path)


def bundle(folder: Path, index: dict) -> Path:
    folder.mkdir()
    (folder / "profile.json").write_text(json.dumps({"schema_version": 1, **index}))
    return folder


LATENCY = {"trimmed_mean": 1.0, "p50": 1.0, "p90": 1.2, "mean": 1.05, "min": 0.9, "max": 1.5}


def test_broken_profile_bundles_are_one_line(net, tmp_path):
    gone = bundle(tmp_path / "gone", {"latency_ms": LATENCY, "files": {"trace": "ort_profile.json"}})
    out = invoke("analyze", str(net), "--system", "x", "--profile", str(gone))
    assert out.exit_code == 1
    assert "profile.json: names trace file 'ort_profile.json', which is missing from the bundle" in out.output
    partial = bundle(tmp_path / "partial", {"latency_ms": {k: v for k, v in LATENCY.items() if k != "p90"}})
    out = invoke("analyze", str(net), "--system", "x", "--profile", str(partial))
    assert out.exit_code == 1 and "latency_ms lacks the 'p90' field" in out.output
    faults = bundle(tmp_path / "faults", {"latency_ms": LATENCY, "page_faults": {"per_run": 3, "samples": [-1]}})
    out = invoke("analyze", str(net), "--system", "x", "--profile", str(faults))
    assert out.exit_code == 1 and "page_faults is not a page-fault record" in out.output
    assert len(out.output.strip().splitlines()) == 1


def test_failed_profile_run_reports_the_exception_line(tmp_path):
    from benanza.profiler import _last_error

    err = tmp_path / "child.stderr"
    with err.open("w") as f:
        subprocess.run([sys.executable, "-c", "def f():\n    raise ValueError('boom | bang')\nf()"], stderr=f)
    assert _last_error(err) == "ValueError: boom | bang"


# --- databases ------------------------------------------------------------------------

def test_reading_commands_never_create_files(tmp_path):
    out = invoke("db", "info", "--db", str(tmp_path / "typo" / "new.db"))
    assert out.exit_code == 1 and "no such database file" in out.output
    assert not (tmp_path / "typo").exists()
    empty = tmp_path / "empty.db"
    empty.touch()
    out = invoke("db", "merge", str(tmp_path / "target.db"), str(empty))
    assert out.exit_code == 1 and "empty file, not a Benanza performance database" in out.output
    assert empty.stat().st_size == 0


def _sqlite(path: Path, *sql: str) -> Path:
    conn = sqlite3.connect(path)
    for s in sql:
        conn.execute(s)
    conn.commit()
    conn.close()
    return path


@pytest.mark.parametrize("sql, problem", [
    (("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)", "INSERT INTO meta VALUES ('schema_version', 'one')"),
     "schema_version 'one' is not an integer"),
    (("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)", "INSERT INTO meta VALUES ('schema_version', '0')"),
     "schema version 0 predates every version Benanza can read"),
    (("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)",), "meta has no schema_version"),
    (("CREATE TABLE photos (id INTEGER)",), "not a Benanza performance database (no meta table)"),
])
def test_foreign_databases_are_refused_by_reading_and_writing_commands(tmp_path, sql, problem):
    db = _sqlite(tmp_path / "f.db", *sql)
    before = db.read_bytes()
    for args in (["db", "info", "--db", str(db)], ["db", "merge", str(db), str(tmp_path / "none.db")],
                 ["db", "merge", str(tmp_path / "t.db"), str(db)]):
        out = invoke(*args)
        assert out.exit_code == 1 and problem in out.output, out.output
    assert db.read_bytes() == before  # nothing stamped into it


def test_a_file_that_is_not_sqlite(tmp_path):
    db = tmp_path / "x.db"
    db.write_bytes(b"PK\x03\x04 this is a zip, not a database" * 40)
    out = invoke("db", "info", "--db", str(db))
    assert out.exit_code == 1 and "not a usable SQLite database (file is not a database)" in out.output


def _as_unprivileged(cmd: list[str]) -> list[str]:
    """Root ignores permissions; drop to nobody so a read-only folder is read-only."""
    if os.geteuid() != 0:
        return cmd
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]


@pytest.fixture
def readonly_db():
    """A database with a result, in WAL mode, in a folder nobody may write."""
    base = Path(tempfile.mkdtemp(prefix="benanza-ro-", dir="/tmp"))
    folder = base / "ro"
    folder.mkdir()
    db = folder / "b.db"
    system = System("box", "onednn", "cpu", (("onednn", "2.6"),))
    models = [load_model(conv_net())]
    manifest = build_manifest(models, unique_layers(models))
    relu = next(v for v in expand_variants(manifest, get_backend("onednn"), GenOptions(dtypes=("f32",)))
                if v.name.startswith("eltwise:relu"))
    with PerfDB(db) as pdb:
        pdb.insert_results(system, [Result(relu, "box", Status.OK, median_ms=0.5, iterations=10, repetitions=1)])
    assert pdb.db.conn  # closed: WAL checkpointed, no -wal/-shm left
    assert sorted(p.name for p in folder.iterdir()) == ["b.db"]
    onnx.save(conv_net(), str(base / "net.onnx"))
    (base / "net.onnx").chmod(0o644)
    db.chmod(0o444)
    folder.chmod(0o555)
    base.chmod(0o755)
    yield db
    folder.chmod(0o755)
    import shutil

    shutil.rmtree(base)


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() == 0 and not Path("/usr/bin/setpriv").exists(), reason="needs setpriv as root")
def test_read_only_folder_reads_work_and_writes_fail_in_one_line(readonly_db):
    folder = readonly_db.parent
    info = subprocess.run(_as_unprivileged([BENANZA, "db", "info", "--db", str(readonly_db)]),
                          capture_output=True, text=True)
    assert info.returncode == 0, info.stderr
    assert f"schema {SCHEMA_VERSION}" in info.stdout and "box" in info.stdout
    listing = subprocess.run(_as_unprivileged([BENANZA, "db", "list", "--system", "box", "--db", str(readonly_db)]),
                             capture_output=True, text=True, env=dict(os.environ, COLUMNS="400"))
    assert listing.returncode == 0 and "eltwise:relu" in listing.stdout, listing.stderr
    ana = subprocess.run(_as_unprivileged([BENANZA, "analyze", str(folder.parent / "net.onnx"), "--system", "box",
                                           "--db", str(readonly_db), "--json"]), capture_output=True, text=True)
    assert ana.returncode == 0, ana.stderr
    (a,) = json.loads(ana.stdout)["analyses"]
    assert a["system"] == "box" and a["bounds"]["partial"]  # nothing of this model measured: all missing
    assert sorted(p.name for p in folder.iterdir()) == ["b.db"]  # no journal, no -shm left behind
    src = Path(tempfile.mkdtemp(prefix="benanza-src-", dir="/tmp")) / "s.db"
    PerfDB(src).close()
    src.parent.chmod(0o755)
    src.chmod(0o644)
    merge = subprocess.run(_as_unprivileged([BENANZA, "db", "merge", str(readonly_db), str(src)]),
                           capture_output=True, text=True)
    assert merge.returncode == 1 and "Traceback" not in merge.stderr
    assert "read-only" in merge.stderr and str(readonly_db) in merge.stderr, merge.stderr
    assert stat.S_IMODE(readonly_db.stat().st_mode) == 0o444


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() == 0 and not Path("/usr/bin/setpriv").exists(), reason="needs setpriv as root")
def test_outputs_into_a_folder_the_user_may_not_write_fail_in_one_line(readonly_db):
    """Generating, and a report, into a folder the user may not write: one line naming the
    file, and nothing left behind (no 0-byte *.tmp)."""
    folder = readonly_db.parent
    net = str(folder.parent / "net.onnx")
    cases = {folder / "g" / "layers.json": ["generate", net, "--backend", "onednn", "--out", str(folder / "g")],
             folder / "r.html": ["analyze", net, "--system", "box", "--db", str(readonly_db),
                                 "--report", str(folder / "r.html")]}
    for target, args in cases.items():
        done = subprocess.run(_as_unprivileged([BENANZA, *args]), capture_output=True, text=True)
        errors = [ln for ln in done.stderr.splitlines() if ln.startswith("error:")]
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert errors == [f"error: {target}: cannot write (Permission denied)"], done.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["b.db"]


@pytest.mark.slow
def test_reading_an_older_schema_migrates_it_or_says_why_not(tmp_path):
    """A schema-1 file (written by the schema-1 code) read by a reading command: migrated in
    place like any opening, then read; in a read-only folder refused in one line, untouched."""
    fixture = FIXTURES / "perfdb_v1.db"
    db = tmp_path / "v1.db"
    db.write_bytes(fixture.read_bytes())
    out = invoke("db", "info", "--db", str(db))
    assert out.exit_code == 0 and f"schema {SCHEMA_VERSION}" in out.output and "A" in out.output
    base = Path(tempfile.mkdtemp(prefix="benanza-ro1-", dir="/tmp"))
    ro = base / "v1.db"
    ro.write_bytes(fixture.read_bytes())
    ro.chmod(0o444)
    base.chmod(0o555)
    try:
        done = subprocess.run(_as_unprivileged([BENANZA, "db", "info", "--db", str(ro)]), capture_output=True,
                              text=True, check=False)
        assert done.returncode == 1 and "Traceback" not in done.stderr
        assert "schema version 1 must be migrated to" in done.stderr and "read-only" in done.stderr, done.stderr
        assert ro.read_bytes() == fixture.read_bytes()
    finally:
        base.chmod(0o755)
        import shutil

        shutil.rmtree(base)
