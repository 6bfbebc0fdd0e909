"""The processed-model cache: a hit is the model processing gives (the processor itself is the
oracle), says what processing said, and is never taken for another file, option or source."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
from click.testing import CliRunner
from helpers import REPO, conv_net, io, model, tensor
from onnx import helper

from benanza.cli import main
from benanza.generator import GenOptions, expand_variants, get_backend
from benanza.layers import unique_layers
from benanza.manifest import build_manifest
from benanza.model_cache import cache_dir, load_model_cached
from benanza.perfdb import PerfDB
from benanza.processor import load_model
from benanza.records import Result, Status, System


def _entries() -> list:
    return sorted(cache_dir().glob("*.pickle")) if cache_dir().is_dir() else []


def test_a_hit_is_the_model_processing_gives(save):
    path = save(conv_net())
    fresh = load_model(path, batch_size=2)
    first = load_model_cached(path, batch_size=2)
    (entry,) = _entries()
    again = load_model_cached(path, batch_size=2)
    assert first == fresh and again == fresh
    assert [n.layer.key for n in again.nodes] == [n.layer.key for n in fresh.nodes]
    assert _entries() == [entry]  # read, not written again


def test_the_key_covers_the_bytes_the_path_and_the_options(save, tmp_path):
    path = save(conv_net())
    load_model_cached(path)
    load_model_cached(path, batch_size=3)
    load_model_cached(path, input_shapes={"x": (2, 3, 8, 8)})
    copy = tmp_path / "copy.onnx"
    copy.write_bytes(path.read_bytes())
    assert load_model_cached(copy).name == "copy"  # the name and path come from the path
    assert len(_entries()) == 4
    onnx.save(conv_net(weights_as="constant"), str(path))  # other bytes, same path
    assert load_model_cached(path) == load_model(path)
    assert len(_entries()) == 5


def test_a_hit_logs_what_processing_logged(save, caplog):
    flat = [helper.make_node("Reshape", ["x", "s"], ["y"])]
    path = save(model(flat, [io("x", [6, 4])], [io("y", None)], [tensor("s", (1,), 24, dtype=np.int64)]))
    said = []
    for _ in range(2):
        caplog.clear()
        with caplog.at_level("WARNING"):
            assert load_model_cached(path, batch_size=2).input_shapes["x"] == (6, 4)
        said.append([(r.name, r.levelname, r.getMessage()) for r in caplog.records])
    assert len(_entries()) == 1
    assert said[0] == said[1] and "fixed dim 0 (6)" in said[0][0][2]


def test_what_processing_read_or_ran_beside_the_file_is_not_kept(save, tmp_path):
    external = tmp_path / "ext.onnx"
    onnx.save(conv_net(), str(external), save_as_external_data=True, location="ext.onnx.data", size_threshold=0)
    assert load_model_cached(external) == load_model(external)
    uncosted = [helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("Relu", ["nz"], ["y"])]
    path = save(model(uncosted, [io("x", [4, 4])], [io("y", None)]), "run.onnx")
    assert load_model_cached(path) == load_model(path)
    assert _entries() == []


def test_an_unreadable_entry_is_a_miss(save):
    path = save(conv_net())
    load_model_cached(path)
    (entry,) = _entries()
    entry.write_bytes(entry.read_bytes()[:100])  # as a crash mid-write would leave a file without os.replace
    assert load_model_cached(path) == load_model(path)
    assert entry.stat().st_size > 100  # written again, whole


def test_analyze_prints_the_same_bytes_from_the_cache_and_a_hit_processes_nothing(save, tmp_path):
    """The real command twice, the cache cold then warm; the warm one in a fresh interpreter,
    whose loaded modules show that neither the processor nor ONNX ran."""
    net = save(conv_net())
    models = [load_model(net)]
    variants = expand_variants(build_manifest(models, unique_layers(models)), get_backend("onednn"),
                               GenOptions(dtypes=("f32",)))
    system = System("box", "onednn", "cpu", (("onednn", "2.6"),))
    with PerfDB(tmp_path / "b.db") as db:
        db.insert_results(system, [Result(v, "box", Status.OK, median_ms=0.5, iterations=10, repetitions=1)
                                   for v in variants])
    args = ["analyze", str(net), "--system", "box", "--db", str(tmp_path / "b.db"), "--json"]
    cold = CliRunner().invoke(main, args)
    assert cold.exit_code == 0, cold.output
    assert len(_entries()) == 1
    probe = ("import atexit, json, sys\n"
             "atexit.register(lambda: sys.stderr.write('\\nLOADED ' + json.dumps(sorted(sys.modules))))\n"
             "from benanza.cli import main\n"
             "sys.exit(main())\n")
    warm = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert warm.returncode == 0, warm.stderr
    assert warm.stdout == cold.stdout
    loaded = set(json.loads(warm.stderr.rpartition("\nLOADED ")[2]))
    assert "benanza.model_cache" in loaded and "benanza.processor" not in loaded and "onnx" not in loaded
