"""Core records of the model processor: tensors, layers, their canonical keys, models.

A layer key is a benchdnn-style problem descriptor: ``family:token_token_..._dtype``.
Each token is a run of ``name value`` pairs (``ic64ih56iw56``) or a bare word (``max``,
``f32``). Values are integers, ``x``-joined dims (``1x64x56x56``) or positional decimals
(never exponents), so the grammar parses back to the very same string and stays identical
across machines and Python versions.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any, Iterator

from .errors import LayerKeyError

# Short names used in keys and manifests; ONNX TensorProto element types map onto them.
DTYPE_NAMES = {
    1: "f32", 2: "u8", 3: "i8", 4: "u16", 5: "i16", 6: "i32", 7: "i64", 8: "str",
    9: "b", 10: "f16", 11: "f64", 12: "u32", 13: "u64", 16: "bf16",
}

_NUM = r"-?\d+(?:\.\d+)?"
_VALUE = rf"{_NUM}(?:x{_NUM})*"
_PAIR = re.compile(rf"([a-z]+)({_VALUE})?")
_FAMILY = re.compile(r"^[a-z][a-z0-9]*$")


def format_number(x: float | int) -> str:
    """Shortest positional decimal for a float32-valued attribute; ints stay ints."""
    if isinstance(x, bool):
        return str(int(x))
    if isinstance(x, int):
        return str(x)
    import numpy as np

    text = np.format_float_positional(np.float32(x), trim="-")
    return "0" if text == "-0" else text


def format_dims(dims: tuple[int, ...] | list[int]) -> str:
    """``1x64x56x56``; a rank-0 tensor prints as an empty value."""
    return "x".join(str(int(d)) for d in dims)


@dataclass(frozen=True)
class LayerKey:
    """A parsed layer key. ``str(parse_key(s)) == s`` for every key Benanza prints."""

    family: str
    tokens: tuple[tuple[tuple[str, str | None], ...], ...]

    def __str__(self) -> str:
        return self.family + ":" + "_".join(
            "".join(name + (value or "") for name, value in token) for token in self.tokens
        )

    def pairs(self) -> Iterator[tuple[str, str | None]]:
        for token in self.tokens:
            yield from token

    def get(self, name: str, default: str | None = None) -> str | None:
        """First value printed under ``name`` (e.g. ``ic`` → ``"64"``)."""
        for n, v in self.pairs():
            if n == name:
                return v
        return default

    def int(self, name: str) -> int:
        value = self.get(name)
        if value is None:
            raise LayerKeyError(f"key {self} has no integer field {name!r}")
        return int(value)

    @property
    def dtype(self) -> str:
        """The trailing dtype word every key ends with."""
        return "".join(n + (v or "") for n, v in self.tokens[-1])


def parse_key(text: str) -> LayerKey:
    family, sep, rest = text.partition(":")
    if not sep or not _FAMILY.match(family) or not rest:
        raise LayerKeyError(f"not a layer key (want family:tokens): {text!r}")
    tokens = []
    for token in rest.split("_"):
        pairs = []
        pos = 0
        for m in _PAIR.finditer(token):
            if m.start() != pos:
                break
            pairs.append((m.group(1), m.group(2)))
            pos = m.end()
        if pos != len(token) or not pairs:
            raise LayerKeyError(f"bad token {token!r} in layer key {text!r}")
        tokens.append(tuple(pairs))
    return LayerKey(family, tuple(tokens))


def key_hash(key: str) -> str:
    """Stable 16-hex-digit id of a key (sha256, independent of Python's hash seed)."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: str  # short name from DTYPE_NAMES

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def to_json(self) -> dict:
        return {"shape": list(self.shape), "dtype": self.dtype}


@dataclass(frozen=True)
class Layer:
    """One unique computation: op, shapes, dtypes and the attributes that change the result.

    ``params`` are the family's canonical parameters (e.g. conv: mb, ic, ih, ...) in a
    sorted tuple so the record is hashable; weights and node names are never part of it.
    """

    op: str
    family: str
    key: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    params: tuple[tuple[str, object], ...]
    macs: int
    flops: int
    bytes: int
    cudnn_api: str | None
    onednn_primitive: str | None

    @property
    def hash(self) -> str:
        return key_hash(self.key)

    @property
    def dtype(self) -> str:
        return parse_key(self.key).dtype

    @property
    def covered(self) -> bool:
        """Covered means a GPU library call (cuDNN/cuBLAS) runs it, as the paper counts."""
        return self.cudnn_api is not None

    def param(self, name: str, default: Any = None) -> Any:
        """A canonical parameter; its type depends on the family (ops.py documents each)."""
        for n, v in self.params:
            if n == name:
                return v
        return default

    def to_json(self) -> dict:
        return {
            "key": self.key,
            "hash": self.hash,
            "op": self.op,
            "family": self.family,
            "inputs": [t.to_json() for t in self.inputs],
            "outputs": [t.to_json() for t in self.outputs],
            "params": {n: v for n, v in self.params},
            "macs": self.macs,
            "flops": self.flops,
            "bytes": self.bytes,
            "cudnn_api": self.cudnn_api,
            "onednn_primitive": self.onednn_primitive,
        }

    @classmethod
    def from_json(cls, d: dict) -> "Layer":
        return cls(
            op=d["op"],
            family=d["family"],
            key=d["key"],
            inputs=tuple(TensorSpec(tuple(t["shape"]), t["dtype"]) for t in d["inputs"]),
            outputs=tuple(TensorSpec(tuple(t["shape"]), t["dtype"]) for t in d["outputs"]),
            params=tuple(sorted((n, _freeze(v)) for n, v in d["params"].items())),
            macs=d["macs"],
            flops=d["flops"],
            bytes=d["bytes"],
            cudnn_api=d["cudnn_api"],
            onednn_primitive=d["onednn_primitive"],
        )


def _freeze(v: object) -> object:
    return tuple(v) if isinstance(v, list) else v


@dataclass(frozen=True)
class Node:
    """One occurrence of a layer in a model graph."""

    index: int  # position in the model's topological node list
    name: str
    layer: Layer
    inputs: tuple[str, ...]  # non-constant tensor names consumed
    outputs: tuple[str, ...]
    constant_inputs: tuple[str, ...] = ()  # weights and other constants (not data edges)


@dataclass
class Model:
    """A processed model: its layers in topological order and the data edges between them."""

    name: str
    path: str
    nodes: list[Node]
    edges: list[tuple[int, int]]  # (producer node index, consumer node index)
    input_shapes: dict[str, tuple[int, ...]]
    batch_size: int
    opset: int

    @property
    def layers(self) -> list[Layer]:
        return [n.layer for n in self.nodes]

    @property
    def macs(self) -> int:
        return sum(n.layer.macs for n in self.nodes)

    def consumers(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {n.index: [] for n in self.nodes}
        for src, dst in self.edges:
            out[src].append(dst)
        return out

    def dag(self):
        """The layer DAG as a networkx DiGraph with integer node ids (node payload: ``node``)."""
        import networkx as nx

        g = nx.DiGraph()
        for n in self.nodes:
            g.add_node(n.index, node=n)
        g.add_edges_from(self.edges)
        return g


@dataclass(frozen=True)
class Occurrence:
    model: str
    node: str
    index: int


@dataclass
class UniqueLayer:
    layer: Layer
    occurrences: list[Occurrence] = field(default_factory=list)

    def to_json(self) -> dict:
        d = self.layer.to_json()
        d["occurrences"] = [
            {"model": o.model, "node": o.node, "index": o.index} for o in self.occurrences
        ]
        return d

    @classmethod
    def from_json(cls, d: dict) -> "UniqueLayer":
        return cls(
            Layer.from_json(d),
            [Occurrence(o["model"], o["node"], o["index"]) for o in d.get("occurrences", [])],
        )
