"""Fault suite, data side: damaged databases, unwritable outputs, hostile profile bundles.

Every case runs the `benanza` command a user would run and must end in one clean line (or
succeed with what can be read), never a traceback or a hang, and must lose no good row.
The database comes from the real pipeline: `benanza generate` variants of a saved model, run
by the stand-in benchmark binary of tests/faults/test_run.py.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path

import onnx
import pytest
from faultprobe import benanza
from helpers import REPO, TESTS, conv_net, generate_bench

from benanza.generator import GenOptions, generate, read_variants
from benanza.layers import unique_layers
from benanza.manifest import build_manifest
from benanza.perfdb import PerfDB
from benanza.processor import load_model
from tests.faults.test_run import execute


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> Path:
    """A folder with conv.onnx and r.db: every variant of it measured ok on system `box`."""
    root = tmp_path_factory.mktemp("measured")
    onnx.save(conv_net(), root / "conv.onnx")
    models = [load_model(root / "conv.onnx", batch_size=1)]
    manifest, _ = generate_bench(models, "onednn", root / "bench",
                                 GenOptions(dtypes=("f32",), layouts=("nchw",), fusion=False))
    variants = read_variants(root / "bench" / "onednn")
    (root / "run").mkdir()
    execute(root / "run", variants, "")
    shutil.move(root / "run" / "r.db", root / "r.db")
    with PerfDB(root / "r.db") as db:
        db.record_models(manifest)
    return root


CORRUPTIONS = {  # what a damaged or hand-edited file holds: SQL, and the row problem it reports
    "stack": ("UPDATE systems SET stack = '{oops'", "stack is not JSON"),
    "metrics": ("UPDATE results SET metrics = 'nope' WHERE id = 1", "metrics is not JSON"),
    "metrics_nan": ("UPDATE results SET metrics = '{\"x\": NaN}' WHERE id = 1", "metrics is not JSON"),
    "status": ("UPDATE results SET status = 'weird' WHERE id = 2", "unknown status 'weird'"),
    "median_text": ("UPDATE results SET median_ms = 'fast' WHERE id = 3", "median_ms is 'fast'"),
    "median_negative": ("UPDATE results SET median_ms = -4.999 WHERE id = 4", "median_ms is -4.999"),
}


def corrupt(measured: Path, tmp_path: Path, case: str) -> Path:
    db = tmp_path / f"{case}.db"
    shutil.copy(measured / "r.db", db)
    with sqlite3.connect(db) as conn:
        conn.execute(CORRUPTIONS[case][0])
    conn.close()
    return db


def corrupt_row_probes(measured: Path, tmp_path: Path, case: str):
    """The reading commands and a merge over one damaged database."""
    db = corrupt(measured, tmp_path, case)
    target = tmp_path / f"merged-{case}.db"
    return db, target, {
        "info": benanza("db", "info", "--db", str(db)),
        "list": benanza("db", "list", "--db", str(db), "--system", "box", env=dict(os.environ, COLUMNS="4000")),
        "analyze": benanza("analyze", str(measured / "conv.onnx"), "--system", "box", "--db", str(db), "--json"),
        "merge": benanza("db", "merge", str(target), str(db)),
    }


@pytest.mark.slow  # `benanza` db, analyze and merge processes per corruption
@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_corrupt_rows_are_named_the_rest_is_read_and_merge_refuses(measured, tmp_path, case):
    with PerfDB(measured / "r.db", readonly=True) as db:
        good = {r.variant.name: r.median_ms for r in db.results("box")}
    path, target, probes = corrupt_row_probes(measured, tmp_path, case)
    why = CORRUPTIONS[case][1]
    for what, p in probes.items():
        assert not p.traceback and not p.hung, (what, p.err)
    merge = probes["merge"]
    assert merge.clean_error and why in merge.error and str(path) in merge.error
    with PerfDB(target, readonly=True) as merged:  # nothing of the damaged file came in
        assert merged.counts()[3].rows == 0
    if case == "stack":  # the system itself is unreadable: named, then not found
        assert all(why in p.err for p in probes.values())
        assert probes["info"].rc == 0 and probes["list"].clean_error
        return
    (bad_id,) = {"metrics": 1, "metrics_nan": 1, "status": 2, "median_text": 3, "median_negative": 4}[case],
    with sqlite3.connect(path) as conn:
        (bad_name,) = conn.execute("SELECT variant FROM results WHERE id = ?", (bad_id,)).fetchone()
    conn.close()
    listed = probes["list"]
    assert listed.rc == 0 and f"id {bad_id} ({why}" in listed.err
    shown = {ln.split("│")[1].strip() for ln in listed.out.splitlines() if ln.startswith("│")}
    assert shown == set(good) - {bad_name}  # every good row, and only those
    with PerfDB(path, readonly=True) as db:
        assert {r.variant.name: r.median_ms for r in db.results("box")} == {
            n: ms for n, ms in good.items() if n != bad_name}
    analysis = probes["analyze"]
    assert analysis.rc == 0 and f"id {bad_id} ({why}" in analysis.err
    json.loads(analysis.out, parse_constant=lambda c: pytest.fail(f"{c} in --json"))
    assert "-4.999" not in analysis.out


# --- outputs that cannot be written -----------------------------------------------------

def _small_files(limit: int = 512):
    """The child's files stop growing at ``limit`` bytes (EFBIG, as a full disk's ENOSPC)."""
    import resource

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def output_probes(measured: Path, tmp_path: Path) -> dict:
    """Every output the reading and generating commands write, where it cannot be written."""
    import subprocess

    from faultprobe import CLI, Probe

    model = str(measured / "conv.onnx")
    # a rollback-journal copy: a WAL database's reader needs a 32 KiB -shm file the size limit forbids
    shutil.copy(measured / "r.db", tmp_path / "r.db")
    with sqlite3.connect(tmp_path / "r.db") as conn:
        conn.execute("PRAGMA journal_mode=delete")
    conn.close()
    db = str(tmp_path / "r.db")
    afile = tmp_path / "a-file"
    afile.write_text("not a folder")
    full = tmp_path / "full"
    full.mkdir()
    analyze = ("analyze", model, "--system", "box", "--db", db)

    def small(*args: str) -> Probe:
        done = subprocess.run([CLI, *args], capture_output=True, text=True, timeout=120,
                              preexec_fn=_small_files(), check=False)
        return Probe(args, done.returncode, done.stdout, done.stderr)

    def to_dev_full(*args: str) -> Probe:
        with open("/dev/full", "w") as out:
            done = subprocess.run([CLI, *args], stdout=out, stderr=subprocess.PIPE, text=True, timeout=120,
                                  check=False)
        return Probe(args, done.returncode, "", done.stderr)

    return {
        "generate under /dev/null": (benanza("generate", model, "--out", "/dev/null/x"), "/dev/null/x"),
        "generate under a file": (benanza("generate", model, "--out", str(afile / "x")), str(afile / "x")),
        "generate, disk full": (small("generate", model, "--out", str(full / "g")), str(full / "g")),
        "--report under /dev/null": (benanza(*analyze, "--report", "/dev/null/r.html"), "/dev/null/r.html"),
        "--report, disk full": (small(*analyze, "--report", str(full / "r.html")), str(full / "r.html")),
        "--csv, disk full": (small(*analyze, "--csv", str(full / "r.csv")), str(full / "r.csv")),
        "--json to a full stdout": (to_dev_full(*analyze, "--json"), "standard output"),
        "generate --json to a full stdout": (to_dev_full("generate", model, "--out", str(tmp_path / "g2"),
                                                         "--json"), "standard output"),
        "db export, disk full": (small("db", "export", "--db", db, "--out", str(full / "e.csv")),
                                 str(full / "e.csv")),
        "db export under /dev/null": (benanza("db", "export", "--db", db, "--out", "/dev/null/e.csv"),
                                      "/dev/null/e.csv"),
    }


@pytest.mark.slow  # ten full commands (generate, run, analyze with reports)
def test_unwritable_outputs_are_one_line_and_leave_no_temp_file(measured, tmp_path):
    probes = output_probes(measured, tmp_path)
    for case, (p, named) in probes.items():
        assert p.clean_error and named in p.error, (case, p.err)
    assert "is a file, not a folder" in probes["generate under a file"][0].error
    assert "File too large" in probes["--report, disk full"][0].error
    left = [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]
    assert left == []
    assert not (tmp_path / "full" / "r.html").exists() and not (tmp_path / "full" / "e.csv").exists()


# --- hostile profile bundles --------------------------------------------------------------

NSYS_STANDIN = """#!{python}
# `nsys export --type sqlite --force-overwrite true --output OUT REPORT`: an export as nsys writes it
import sys
sys.path[:0] = [{repo!r}, {tests!r}]
from pathlib import Path
from tests.parsers.test_formats import make_nsys_sqlite
make_nsys_sqlite(Path(sys.argv[sys.argv.index("--output") + 1]))
"""


def make_bundle(folder: Path, **fields) -> Path:
    folder.mkdir(parents=True)
    index = {"schema_version": 2, "model": "conv", "framework": "onnxruntime", "device": "cpu", "batch_size": 1,
             "latency_ms": {"trimmed_mean": 1.0, "p50": 1.0, "p90": 1.0, "mean": 1.0, "min": 1.0, "max": 1.0},
             "files": {}, "notes": [], **fields}
    (folder / "profile.json").write_text(json.dumps(index))
    return folder


def bundle_probes(measured: Path, tmp_path: Path) -> dict:
    """Each hostile bundle, analysed with `nsys` on PATH; the value: the probe and the bundle."""
    import sys

    from benanza.parsers.bundle import model_identity

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nsys").write_text(NSYS_STANDIN.format(python=sys.executable, repo=str(REPO), tests=str(TESTS)))
    (bin_dir / "nsys").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "r.nsys-rep").write_bytes(b"\0" * 64)
    identity = model_identity(measured / "conv.onnx", 1)
    bundles = {
        "nsys report": make_bundle(tmp_path / "rep", model_identity=identity, files={"nsys": "nsys.nsys-rep"}),
        "nsys path out of the bundle": make_bundle(tmp_path / "esc", files={"nsys": "../outside/r.nsys-rep"}),
        "absolute trace path": make_bundle(tmp_path / "abs", files={"trace": "/etc/shadow"}),
        "symlink out of the bundle": make_bundle(tmp_path / "link", files={"trace": "t.json"}),
        "model_identity -1": make_bundle(tmp_path / "ident", model_identity=-1),
        "notes 0": make_bundle(tmp_path / "notes", notes=0),
        "batch_size text": make_bundle(tmp_path / "batch", batch_size="one"),
        "deeply nested index": make_bundle(tmp_path / "deep"),
        "no model_identity": make_bundle(tmp_path / "noid"),
    }
    (tmp_path / "rep" / "nsys.nsys-rep").write_bytes(b"\0" * 64)
    (tmp_path / "link" / "t.json").symlink_to(outside / "r.nsys-rep")
    (tmp_path / "deep" / "profile.json").write_text("[" * 100_000 + "]" * 100_000)
    return {case: (benanza("analyze", str(measured / "conv.onnx"), "--system", "box", "--db", str(measured / "r.db"),
                           "--profile", str(folder), "--json", env=env), folder)
            for case, folder in bundles.items()}


@pytest.mark.slow  # a `benanza` process per hostile bundle
def test_hostile_bundles_are_one_line_and_reading_never_writes(measured, tmp_path):
    probes = bundle_probes(measured, tmp_path)
    expected = {
        "nsys path out of the bundle": "names nsys file '../outside/r.nsys-rep', which is outside the bundle",
        "absolute trace path": "names trace file '/etc/shadow', which is outside the bundle",
        "symlink out of the bundle": "names trace file 't.json', which is outside the bundle",
        "model_identity -1": "model_identity is '-1', not an object",
        "notes 0": "notes is '0', not a list",
        "batch_size text": "batch_size is 'one', not a whole number",
        "deeply nested index": "nested deeper than Python's JSON reader goes",
    }
    for case, why in expected.items():
        p, folder = probes[case]
        assert p.clean_error and why in p.error and str(folder / "profile.json") in p.error, (case, p.err)
    rep, folder = probes["nsys report"]
    assert rep.rc == 0, rep.err
    assert sorted(p.name for p in folder.iterdir()) == ["nsys.nsys-rep", "profile.json"]  # no export beside it
    assert sorted(p.name for p in (tmp_path / "outside").iterdir()) == ["r.nsys-rep"]
    noid, _ = probes["no model_identity"]
    (analysis,) = json.loads(noid.out)["analyses"]
    assert noid.rc == 0 and any("cannot verify that it ran the model analysed" in w for w in analysis["warnings"])


# --- names that would drive the terminal ------------------------------------------------------

TERMINAL_NAMES = {"conv1": "c\x1b]52;c;aGk=\x07", "relu1": "r\x1b[2J", "conv2": "k\u202eevil", "bn2": "b\x9b31m"}


def _on_a_tty(*args: str) -> tuple[int, bytes]:
    """`benanza ARGS` with stdout and stderr on a pseudo-terminal (rich styles for a TTY)."""
    import pty
    import subprocess

    from faultprobe import CLI

    leader, follower = pty.openpty()
    proc = subprocess.Popen([CLI, *args], stdout=follower, stderr=follower, env=dict(os.environ, COLUMNS="300"))
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    return proc.wait(timeout=60), out


def terminal_probes(tmp_path: Path) -> dict:
    """analyze's table, on a TTY and piped, for a model whose node names hold terminal commands."""
    m = conv_net()
    for node in m.graph.node:
        node.name = TERMINAL_NAMES.get(node.name, node.name)
    onnx.save(m, tmp_path / "evil.onnx")
    models = [load_model(tmp_path / "evil.onnx", batch_size=1)]
    manifest = build_manifest(models, unique_layers(models))
    generate(manifest, "onednn", tmp_path / "bench", GenOptions(dtypes=("f32",), layouts=("nchw",), fusion=False))
    execute(tmp_path, read_variants(tmp_path / "bench" / "onednn"), "")
    args = ("analyze", str(tmp_path / "evil.onnx"), "--system", "box", "--db", str(tmp_path / "r.db"))
    return {"tty": _on_a_tty(*args), "pipe": benanza(*args, env=dict(os.environ, COLUMNS="300"))}


@pytest.mark.slow  # generate, run and analyze end to end
def test_control_characters_in_names_print_escaped(tmp_path):
    probes = terminal_probes(tmp_path)
    rc, raw = probes["tty"]
    piped = probes["pipe"]
    assert rc == 0 and piped.rc == 0, piped.err
    for out in (raw, piped.out.encode()):
        for name in TERMINAL_NAMES.values():
            # the command never reaches the terminal; its escaped form does
            assert name.encode() not in out and name[1:].encode() not in out
        for shown in ("c\\x1b]52;c;aGk=\\x07", "r\\x1b[2J", "k\\u202eevil", "b\\x9b31m"):
            assert shown.encode() in out, shown


# --- db serve ------------------------------------------------------------------------------------

def serve_probe(measured: Path, tmp_path: Path) -> dict:
    """`db serve --db ./--root` in the database's folder: what it served, printed and left."""
    import signal
    import socket
    import subprocess
    import time
    import urllib.request

    from faultprobe import CLI

    shutil.copy(measured / "r.db", tmp_path / "--root")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([CLI, "db", "serve", "--db", "./--root", "--port", str(port)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    served = None
    deadline = time.monotonic() + 60
    while served is None and time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/--root/results.json?_shape=array&_size=max",
                                        timeout=5) as r:
                served = json.loads(r.read())
        except OSError:
            time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    return {"served": served, "output": out, "left": sorted(p.name for p in tmp_path.iterdir())}


def test_db_serve_of_a_file_named_like_a_flag_serves_it_immutable(measured, tmp_path):
    probe = serve_probe(measured, tmp_path)
    with sqlite3.connect(measured / "r.db") as conn:
        ids = [r[0] for r in conn.execute("SELECT id FROM results ORDER BY id")]
    conn.close()
    assert probe["served"] is not None, probe["output"]
    assert sorted(r["id"] for r in probe["served"]) == ids  # the file itself, every row
    assert "auth-token" not in probe["output"]  # `--root` was never Datasette's flag
    assert probe["left"] == ["--root"]  # no -shm/-wal beside it


def test_nsys_collection_keeps_the_report_drops_the_raw_stream_and_applies_the_umask(tmp_path):
    """A real nsys run (CPU: it leaves the raw .qdstrm), collected into a bundle as `profile --nsys` does."""
    import subprocess

    from benanza.profiler import _collect_nsys

    done = subprocess.run(["nsys", "profile", "--trace=osrt", "--sample=none", "--cpuctxsw=none",
                           "--force-overwrite=true", "-o", str(tmp_path / "nsys"), "true"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert (tmp_path / "nsys.qdstrm").exists() or (tmp_path / "nsys.nsys-rep").exists(), done.stdout + done.stderr
    for made in tmp_path.glob("nsys.*"):
        made.chmod(0o666)  # as nsys leaves them in a bundle
    files: dict = {}
    notes: list = []
    old = os.umask(0o027)
    try:
        _collect_nsys(tmp_path, files, notes)
    finally:
        os.umask(old)
    assert files == {"nsys": "nsys.nsys-rep"} and notes == []
    assert sorted(p.name for p in tmp_path.glob("nsys.*")) == ["nsys.nsys-rep"]
    assert (tmp_path / "nsys.nsys-rep").stat().st_mode & 0o777 == 0o640
