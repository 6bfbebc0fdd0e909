"""The processed-model cache: a hit is the model processing gives (the processor itself is the
oracle), says what processing said, and is never taken for another file or option. That the
command prints the same bytes from it, loading neither ONNX nor the processor: contract/test_startup.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version

import numpy as np
import onnx
from helpers import REPO, conv_net, io, model, tensor
from onnx import helper

from benanza.model_cache import _LIBRARIES, _installed, cache_dir, load_model_cached
from benanza.processor import load_model


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
    assert load_model(external).external_data and not load_model(save(conv_net())).external_data
    runs = [helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("Transpose", ["nz"], ["y"])]
    path = save(model(runs, [io("x", [4, 4])], [io("y", None, onnx.TensorProto.INT64)]), "run.onnx")
    ran = load_model(path)
    assert ran.executed_shapes and load_model_cached(path) == ran
    assert _entries() == []


def test_an_unreadable_entry_is_a_miss(save):
    path = save(conv_net())
    load_model_cached(path)
    (entry,) = _entries()
    entry.write_bytes(entry.read_bytes()[:100])  # as a crash mid-write would leave a file without os.replace
    assert load_model_cached(path) == load_model(path)
    assert entry.stat().st_size > 100  # written again, whole


_PROCESS = ("import sys\n"
            "from benanza.model_cache import load_model_cached\n"
            "print(*(n.layer.key for n in load_model_cached(sys.argv[1]).nodes))\n")


def _in_subprocess(path, tree=REPO) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _PROCESS, str(path)], stdout=subprocess.PIPE, text=True,
                            cwd=path.parent, env={**os.environ, "PYTHONPATH": str(tree)})


def test_other_source_is_another_key(save, tmp_path):
    path = save(conv_net())
    load_model_cached(path)
    tree = tmp_path / "tree"
    shutil.copytree(REPO / "benanza", tree / "benanza", ignore=shutil.ignore_patterns("__pycache__"))
    layers = tree / "benanza" / "layers.py"
    layers.write_text(layers.read_text() + "\n# a comment: another source all the same\n")
    proc = _in_subprocess(path, tree)
    assert proc.wait() == 0
    assert len(_entries()) == 2


def test_commands_processing_one_model_at_once_all_get_it(save):
    path = save(conv_net())
    procs = [_in_subprocess(path) for _ in range(4)]
    printed = [p.communicate()[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert set(printed) == {" ".join(n.layer.key for n in load_model(path).nodes) + "\n"}
    assert len(_entries()) == 1 and not list(cache_dir().glob(".*.part"))  # one whole entry, nothing half-written
    assert load_model_cached(path) == load_model(path)


def test_the_key_names_the_versions_importlib_metadata_reads():
    """The key reads a library's version from its metadata folder's name, not its files."""
    listings: dict[str, list[str]] = {}
    for lib in _LIBRARIES:
        try:
            expected = version(lib)
        except PackageNotFoundError:
            assert _installed(lib, listings) == ()
            continue
        (folder,) = _installed(lib, listings)
        assert folder in (f"{lib}-{expected}.dist-info", f"{lib}-{expected}.egg-info")
