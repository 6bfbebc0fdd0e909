"""Processed models kept between commands: an analysis of an unchanged file skips processing it.

Processing (reading the ONNX file, shape inference, a layer record per node) took about 0.35 s of
the 1.4–1.7 s of CPU of ``benanza analyze --json`` of DenseNet-121, with ONNX's import another
0.1 s (docs/measurements.md), done again by every command although the file had not changed. An
entry is found by a key of everything that changes the processed model: the file's bytes and the
path it is named by (the model's name and path come from it), the processing options, Benanza's
own source, and the Python and library versions processing runs (ONNX's shape inference, ONNX
Runtime's symbolic fallback, NumPy's folding, protobuf's reading).

What processing logged is kept with the model and logged again on a hit, so a hit says what
processing said; the logging level is part of the key, as it decides what was logged. Kept only
when processing ran nothing and read nothing but the file: a model that ONNX Runtime had to run
(shapes by execution, control flow) is not kept, as ONNX Runtime writes to the terminal itself,
and neither is one with weights in external files, whose bytes the key does not cover.

An entry is written to a temporary file and renamed into place, so concurrent commands read a
whole entry or none; an unreadable or foreign entry is a miss. ``BENANZA_MODEL_CACHE`` names the
folder (default ``$XDG_CACHE_HOME/benanza/models``); the newest ``KEEP`` entries are kept.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .layers import Model

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)

KEEP = 64
# the libraries whose versions change what processing gives
_LIBRARIES = ("onnx", "onnxruntime", "numpy", "protobuf")


@dataclass(frozen=True)
class _Entry:
    key: str  # checked on reading: a file renamed by hand is not taken for another's entry
    model: Model
    logged: tuple[tuple[str, int, str], ...]  # (logger, level, message) as processing logged them


def cache_dir() -> Path:
    given = os.environ.get("BENANZA_MODEL_CACHE")
    if given:
        return Path(given)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "benanza" / "models"


def load_model_cached(path: str | Path, batch_size: int = 1, input_shapes: dict[str, tuple[int, ...]] | None = None,
                      input_values: dict[str, tuple[float, ...]] | None = None,
                      input_data: dict[str, np.ndarray] | None = None) -> Model:
    """``processor.load_model`` of a file, from the cache when the same file was processed the
    same way before."""
    try:
        content = Path(path).read_bytes()
    except OSError:  # the processor names the file and the problem
        content = None
    key = None if content is None else _key(str(path), content, batch_size, input_shapes, input_values, input_data)
    entry = None if key is None else _read(key)
    if entry is not None:
        for name, level, message in entry.logged:
            logging.getLogger(name).log(level, "%s", message)
        return entry.model
    from .processor import load_model  # a hit needs neither ONNX nor shape inference

    with _recording() as logged:
        model = load_model(path, batch_size=batch_size, input_shapes=input_shapes, input_values=input_values,
                           input_data=input_data)
    if key is not None and _self_contained(model):
        _write(key, _Entry(key, model, tuple(logged)))
    return model


def _key(path: str, content: bytes, batch_size: int, input_shapes: dict[str, tuple[int, ...]] | None,
         input_values: dict[str, tuple[float, ...]] | None, input_data: dict[str, np.ndarray] | None) -> str:
    h = hashlib.sha256()

    def part(*values: object) -> None:
        h.update(repr(values).encode())

    part(len(content))  # each byte string after its length: no two keys' streams run together
    h.update(content)
    part(path, batch_size, sorted((input_shapes or {}).items()), sorted((input_values or {}).items()))
    for name, arr in sorted((input_data or {}).items()):
        data = arr.tobytes()
        part(name, arr.dtype.str, arr.shape, len(data))
        h.update(data)
    part(logging.getLogger("benanza").getEffectiveLevel(), sys.version)
    listings: dict[str, list[str]] = {}
    for lib in _LIBRARIES:
        part(lib, _installed(lib, listings))
    package = Path(__file__).parent
    for source in sorted(package.rglob("*.py")):
        text = source.read_bytes()
        part(str(source.relative_to(package)), len(text))
        h.update(text)
    return h.hexdigest()


def _installed(dist: str, listings: dict[str, list[str]]) -> tuple[str, ...]:
    """The metadata folders of ``dist`` in the first ``sys.path`` entry that has any, the one
    ``importlib.metadata`` reads; their names carry the version (``numpy-2.4.6.dist-info``), so
    the files are not read: importing ``importlib.metadata`` (email, zipfile, csv) and parsing the
    files took 0.05–0.1 s of every analysis. ``listings`` keeps each entry's names for the next."""
    for entry in sys.path:
        if entry not in listings:
            try:
                listings[entry] = os.listdir(entry or ".")
            except OSError:  # a zip archive, or gone
                listings[entry] = []
        found = sorted(n for n in listings[entry]
                       if n.startswith(dist + "-") and n.endswith((".dist-info", ".egg-info")))
        if found:
            return tuple(found)
    return ()


def _read(key: str) -> _Entry | None:
    file = cache_dir() / f"{key}.pickle"
    try:
        with open(file, "rb") as f:
            entry = pickle.load(f)
    except FileNotFoundError:
        return None
    except Exception as exc:  # noqa: BLE001 - a truncated, foreign or stale pickle raises anything
        log.debug("%s: unreadable cache entry (%s: %s)", file, type(exc).__name__, exc)
        return None
    if not isinstance(entry, _Entry) or entry.key != key:
        return None
    with suppress(OSError):  # recently used, so pruned last (a cache others share may be read-only)
        os.utime(file)
    return entry


def _write(key: str, entry: _Entry) -> None:
    folder = cache_dir()
    part = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".", suffix=".part", delete=False) as f:
            part = Path(f.name)
            pickle.dump(entry, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(part, folder / f"{key}.pickle")
        _prune(folder)
    except OSError as exc:  # a cache that cannot be written costs time, never the command
        log.debug("%s: cannot keep the processed model (%s)", folder, exc)
        if part is not None:
            part.unlink(missing_ok=True)


def _prune(folder: Path) -> None:
    entries = []
    for file in folder.glob("*.pickle"):
        try:
            entries.append((file.stat().st_mtime, file))
        except FileNotFoundError:  # another command pruned it
            continue
    for _, file in sorted(entries, reverse=True)[KEEP:]:
        file.unlink(missing_ok=True)


def _self_contained(model: Model) -> bool:
    """Processing ran nothing (no ONNX Runtime session, which may write to the terminal) and read
    nothing beside the file (external weights, whose bytes are not in the key)."""
    return not (model.executed_shapes or model.uncosted or model.control_flow or model.branch_failure
                or model.external_data)


@contextmanager
def _recording() -> Iterator[list[tuple[str, int, str]]]:
    """What is logged inside: each record a logger makes (it makes one only at a level it
    handles). Taken where records are made, not by a handler: a handler would change where they
    go (Python prints to stderr only while no handler is found)."""
    logged: list[tuple[str, int, str]] = []
    made = logging.getLogRecordFactory()

    def record(*args: Any, **kwargs: Any) -> logging.LogRecord:
        r = made(*args, **kwargs)
        logged.append((r.name, r.levelno, r.getMessage()))
        return r

    logging.setLogRecordFactory(record)
    try:
        yield logged
    finally:
        logging.setLogRecordFactory(made)
