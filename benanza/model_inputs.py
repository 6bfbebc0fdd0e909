"""The model inputs a command names: ``--input-shape`` and ``--input-value``, parsed, and each
model's share of them when a command takes several models.

Apart from the processor, which reads and infers the ONNX file: parsing what a command was given
needs neither, and a command whose model is already processed (``benanza.model_cache``) loads
neither ONNX nor the processor.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TypeVar

from .errors import BenanzaError, UsageError
from .limits import MAX_DIM, MAX_RANK
from .shapes_by_execution import parse_input_value

_V = TypeVar("_V")


def _parse_input_shape(spec: str) -> tuple[str, tuple[int, ...]]:
    name, sep, dims = spec.rpartition("=")
    try:
        shape = tuple(int(d) for d in dims.split("x"))
    except ValueError:
        shape = ()
    if not sep or not name or not shape or any(d < 0 for d in shape):
        raise UsageError(f"--input-shape {spec!r}: want NAME=D1xD2x... with dims ≥ 0 (0: an empty axis, such as "
                         f"an empty KV cache)")
    if len(shape) > MAX_RANK or max(shape) > MAX_DIM:
        raise UsageError(f"--input-shape {spec!r}: at most {MAX_RANK} dims of at most {MAX_DIM} each")
    return name, shape


def parse_input_shapes(specs: Iterable[str]) -> dict[str, tuple[int, ...]]:
    """``["data=1x3x224x224"]`` → ``{"data": (1, 3, 224, 224)}``."""
    return dict(_parse_input_shape(spec) for spec in specs)


def input_shapes_per_model(specs: Iterable[str], models: Sequence[str]) -> dict[str, dict[str, tuple[int, ...]]]:
    """The ``--input-shape`` values of each model of a multi-model command.

    ``NAME=D1xD2x..`` applies to every model that has an input ``NAME``; ``MODEL:NAME=D1xD2x..``
    (``MODEL``: the path as given, its file name or its stem) to that model alone, and wins
    over the plain form. A plain ``NAME`` no model has is an error; a model whose file cannot
    be read gets none, and its own error from ``load_model``.
    """
    aliases: dict[str, set[str]] = {}
    for m in models:
        for alias in (m, Path(m).name, Path(m).stem):
            aliases.setdefault(alias, set()).add(m)
    plain: dict[str, tuple[int, ...]] = {}
    out: dict[str, dict[str, tuple[int, ...]]] = {m: {} for m in models}
    for spec in specs:
        name, shape = _parse_input_shape(spec)
        target = next(((name[:i], name[i + 1:]) for i, c in enumerate(name) if c == ":" and name[:i] in aliases),
                      None)
        if target is None:
            plain[name] = shape
            continue
        owners = aliases[target[0]]
        if len(owners) > 1:
            raise UsageError(f"--input-shape {spec!r}: {target[0]!r} names {len(owners)} of the models "
                             f"({', '.join(sorted(owners))}); use the path as given")
        out[next(iter(owners))][target[1]] = shape
    if plain:
        for m, given in _per_model("--input-shape", plain, models).items():
            out[m] = {**given, **out[m]}
    return out


def input_values_per_model(specs: Iterable[str], models: Sequence[str]) -> dict[str, dict[str, tuple[float, ...]]]:
    """The ``--input-value`` values of each model of a multi-model command: ``NAME=…`` applies to
    every model with an input NAME; a NAME no model has is an error."""
    return _per_model("--input-value", dict(parse_input_value(s) for s in specs), models)


def _per_model(option: str, given: dict[str, _V], models: Sequence[str]) -> dict[str, dict[str, _V]]:
    """Each model's share of ``given`` (input name → value): the names among its graph inputs."""
    if not given:
        return {m: {} for m in models}
    inputs = {m: _real_inputs(m) for m in models}
    stray = sorted(n for n in given if not any(n in names for names in inputs.values()))
    if stray:
        listing = "; ".join(f"{m}: {', '.join(sorted(names)) or 'none'}" for m, names in inputs.items())
        raise UsageError(f"{option} {', '.join(stray)}: no given model has such an input ({listing})")
    return {m: {n: v for n, v in given.items() if n in names} for m, names in inputs.items()}


def _real_inputs(path: str) -> set[str]:
    """A model's graph inputs that are not weights; none when the file cannot be read."""
    from .processor import read_onnx  # only a command given input values reads the file here

    try:
        graph = read_onnx(path).graph
    except BenanzaError:
        return set()
    weights = {t.name for t in graph.initializer}
    return {i.name for i in graph.input if i.name not in weights}


