"""What a command loads: start-up is most of a short command's time (docs/measurements.md), so
the libraries only some commands need load where those commands use them. Checked by the
modules a real command has loaded when it exits, never by timing it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnx
from helpers import conv_net

from benanza.generator import GenOptions, expand_variants, get_backend
from benanza.layers import unique_layers
from benanza.manifest import build_manifest
from benanza.perfdb import PerfDB
from benanza.processor import load_model
from benanza.records import Result, Status, System

# Libraries `analyze --json` has no use for: terminal tables (rich), the HTML report (jinja2,
# markupsafe), writing to the database (sqlite_utils), symbolic shape inference and profiling
# (onnxruntime, torch), the tests' graph oracle (networkx), and what those would drag in.
NOT_FOR_ANALYZE_JSON = {"rich", "jinja2", "markupsafe", "sqlite_utils", "pandas", "onnxruntime", "torch",
                        "networkx", "scipy", "matplotlib", "submitit", "datasette"}

# What analyzing a model whose processing is cached (benanza.model_cache) has no use for either:
# reading ONNX (onnx, and protobuf's google package) and processing it, nor NumPy, whose import
# was a fifth of the command's time while the key grammar printed its floats with it.
NOT_FOR_A_PROCESSED_MODEL = {"onnx", "google", "onnxruntime", "numpy"}

# Runs the console script's own call and, at exit, writes the modules it loaded.
_LOADED = ("import atexit, json, sys\n"
           "atexit.register(lambda: sys.stderr.write('\\nLOADED ' + json.dumps(sorted(sys.modules))))\n"
           "from benanza.cli import main\n"
           "sys.exit(main())\n")


def _loaded_modules(*args: str, cwd: Path) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    out = subprocess.run([sys.executable, "-c", _LOADED, *args], capture_output=True, text=True, cwd=cwd)
    line = out.stderr.rpartition("\nLOADED ")[2]
    return out, set(json.loads(line))


def _loaded(*args: str, cwd: Path) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """The top-level packages the command loaded."""
    out, modules = _loaded_modules(*args, cwd=cwd)
    return out, {m.split(".")[0] for m in modules}


def test_analyze_json_loads_none_of_the_libraries_it_does_not_use(save, tmp_path):
    net = save(conv_net(), "net.onnx")
    models = [load_model(onnx.load(str(net)))]
    variants = expand_variants(build_manifest(models, unique_layers(models)), get_backend("onednn"),
                               GenOptions(dtypes=("f32",)))
    system = System("box", "onednn", "cpu", (("onednn", "2.6"),))
    with PerfDB(tmp_path / "b.db") as db:
        db.insert_results(system, [Result(v, "box", Status.OK, median_ms=0.5, iterations=10, repetitions=1)
                                   for v in variants])
    out, loaded = _loaded("analyze", str(net), "--system", "box", "--db", str(tmp_path / "b.db"), "--json",
                          cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    (a,) = json.loads(out.stdout)["analyses"]  # a real analysis ran: every layer has its result
    assert a["system"] == "box" and not a["bounds"]["partial"] and a["bounds"]["sequential_ms"] > 0
    assert {"benanza", "onnx", "numpy", "click", "sqlite3"} <= loaded  # what the analysis does use
    assert loaded & NOT_FOR_ANALYZE_JSON == set()
    # again, the processed model now cached: the same bytes, without ONNX or the processor
    again, modules = _loaded_modules("analyze", str(net), "--system", "box", "--db", str(tmp_path / "b.db"), "--json",
                                     cwd=tmp_path)
    assert again.returncode == 0 and again.stdout == out.stdout, again.stderr
    assert "benanza.model_cache" in modules and "benanza.processor" not in modules
    assert {m.split(".")[0] for m in modules} & (NOT_FOR_ANALYZE_JSON | NOT_FOR_A_PROCESSED_MODEL) == set()


def test_the_command_line_alone_loads_no_model_library(tmp_path):
    """Declaring the commands and their options needs neither ONNX nor NumPy (nor Rich): `--help`
    and every usage error answer without them."""
    out, loaded = _loaded("--help", cwd=tmp_path)
    assert out.returncode == 0 and "analyze" in out.stdout, out.stderr
    assert loaded & ({"onnx", "numpy", "google"} | NOT_FOR_ANALYZE_JSON) == set()
