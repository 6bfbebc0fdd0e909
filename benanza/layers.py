"""Core records of the model processor: tensors, layers, models.

A layer is a typed problem (``benanza.problems``: what it computes) in the model's dtype; its
key is the problem's benchdnn-style key plus ``_<dtype>``, e.g.
``conv:mb1_ic64ih56iw56_oc64oh56ow56_kh3kw3_sh1sw1_ph1pw1_dh1dw1_g1_bias0_f32``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from .errors import BenanzaError
from .ops.grammar import FLOAT_DTYPES, LayerKey, Problem, format_dims, format_number, key_hash, layer_key, parse_key

__all__ = ["DTYPE_NAMES", "FLOAT_DTYPES", "LayerKey", "format_dims", "format_number", "key_hash", "parse_key",
           "TensorSpec", "Layer", "Node", "Model", "Dag", "Occurrence", "UniqueLayer", "Uncosted",
           "unique_layers"]

# Short names used in keys and manifests; ONNX TensorProto element types map onto them.
DTYPE_NAMES = {
    1: "f32", 2: "u8", 3: "i8", 4: "u16", 5: "i16", 6: "i32", 7: "i64", 8: "str",
    9: "b", 10: "f16", 11: "f64", 12: "u32", 13: "u64", 16: "bf16",
    # opset 19's float8 types, one byte each, by their ONNX names
    17: "f8e4m3fn", 18: "f8e4m3fnuz", 19: "f8e5m2", 20: "f8e5m2fnuz",
}


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

    def to_json(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "dtype": self.dtype}


@dataclass(frozen=True)
class Layer:
    """One unique computation: its typed problem in the model's dtype, its tensors and work.

    Weights and node names are never part of it. ``cudnn_api`` / ``onednn_primitive`` name the
    call that runs it, None when that library (or Benanza's benchmarks of it) cannot.
    """

    op: str
    problem: Problem
    dtype: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    macs: int
    flops: int
    bytes: int
    cudnn_api: str | None
    onednn_primitive: str | None
    key: str = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", layer_key(self.problem, self.dtype))

    @property
    def family(self) -> str:
        return self.problem.family

    @property
    def hash(self) -> str:
        return key_hash(self.key)

    @property
    def covered(self) -> bool:
        """Covered means a GPU library call (cuDNN/cuBLAS) runs it, as the paper counts."""
        return self.cudnn_api is not None

    @property
    def identity(self) -> bool:
        """Inference computes nothing here (Dropout with training_mode false): it costs 0."""
        return self.problem.identity

    @property
    def view(self) -> bool:
        """A pure view (Reshape, Squeeze, Unsqueeze, Flatten, Identity): it moves no data, costs 0."""
        return self.problem.view

    @property
    def free(self) -> bool:
        """Costs nothing by definition (a view, or the identity at inference): no library call is
        missing here, so coverage does not count it as uncovered."""
        return self.view or self.identity

    def in_dtype(self, dtype: str) -> str:
        """The dtype this layer is analysed in when the model runs in ``dtype``: float layers
        follow it, integer and boolean ones (shape arithmetic, masks) keep their own."""
        return dtype if self.dtype in FLOAT_DTYPES else self.dtype

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "hash": self.hash,
            "op": self.op,
            "family": self.family,
            "dtype": self.dtype,
            "problem": self.problem.to_json(),
            "inputs": [t.to_json() for t in self.inputs],
            "outputs": [t.to_json() for t in self.outputs],
            "macs": self.macs,
            "flops": self.flops,
            "bytes": self.bytes,
            "cudnn_api": self.cudnn_api,
            "onednn_primitive": self.onednn_primitive,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Layer:
        """The problem comes back from the key (``parse_layer_key`` inverts ``layer_key``)."""
        from .ops.registry import parse_layer_key  # the registry builds on these records

        problem, dtype = parse_layer_key(d["key"])
        return cls(
            op=d["op"],
            problem=problem,
            dtype=dtype,
            inputs=tuple(TensorSpec(tuple(t["shape"]), t["dtype"]) for t in d["inputs"]),
            outputs=tuple(TensorSpec(tuple(t["shape"]), t["dtype"]) for t in d["outputs"]),
            macs=d["macs"],
            flops=d["flops"],
            bytes=d["bytes"],
            cudnn_api=d["cudnn_api"],
            onednn_primitive=d["onednn_primitive"],
        )


@dataclass(frozen=True)
class Node:
    """One occurrence of a layer in a model graph."""

    index: int  # position in the model's topological node list
    name: str
    layer: Layer
    inputs: tuple[str, ...]  # non-constant tensor names consumed
    outputs: tuple[str, ...]
    constant_inputs: tuple[str, ...] = ()  # weights and other constants (not data edges)
    constant_specs: tuple[TensorSpec, ...] = ()  # their shapes and types, in the same order
    # Its outputs are constants once the input shapes are fixed (shape arithmetic, a causal mask
    # built from a Shape): frameworks fold it at load time, so nothing runs here and it costs 0.
    # Never set on a free layer (a view or identity is free whatever its inputs are).
    folded: bool = False
    # the module the node came from, as (qualified name, class or "") pairs, outermost first
    # (``benanza.scopes``); None when the file records none for this node
    scope: tuple[tuple[str, str], ...] | None = None
    # Its op copies in general, but here moves no data: a slice an unrolled Scan reads of its input,
    # or the Concat of the slices its iterations write of its output, in place (``control_flow``).
    # A free view, like a Reshape.
    in_place: bool = False

    @property
    def free(self) -> bool:
        """Costs nothing by definition: its layer is free, or it works in place."""
        return self.layer.free or self.in_place

    @property
    def runs(self) -> bool:
        """Whether anything runs here at inference: neither free by definition nor folded."""
        return not (self.free or self.folded)


@dataclass(frozen=True)
class Uncosted:
    """A node left out of the costing, and why (no concrete shape for a tensor it reads or writes)."""

    name: str
    op: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"node": self.name, "op": self.op, "reason": self.reason}


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
    scope_source: str = "op types"  # where the nodes' scopes come from (benanza.scopes)
    uncosted: list[Uncosted] = field(default_factory=list)
    # Tensors whose shape came from running the model (static inference left them unknown), and
    # of those, the ones whose size the data decided (after NonZero, NMS, TopK): the size seen.
    executed_shapes: int = 0
    data_dependent: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # What each If, Loop and Scan became (control_flow): If path → "then"/"else" (the branch taken
    # for these inputs), Loop or Scan path → "N iterations" (unrolled) or why it stays one node, with
    # each path's op type (control_flow_ops); and why the run deciding them could not be made, when
    # it could not (their bodies are then uncosted).
    control_flow: dict[str, str] = field(default_factory=dict)
    control_flow_ops: dict[str, str] = field(default_factory=dict)
    branch_failure: str = ""
    # Weights kept in files beside the model's (ONNX external data): what the model cache reads
    # to refuse an entry whose key would not cover every byte processing read.
    external_data: bool = False

    @property
    def layers(self) -> list[Layer]:
        return [n.layer for n in self.nodes]

    @property
    def macs(self) -> int:
        return sum(n.layer.macs for n in self.nodes)

    @cached_property
    def producer(self) -> dict[str, int]:
        """Tensor name → the index of the node that writes it (computed once: a processed model's
        nodes are never replaced)."""
        return {t: n.index for n in self.nodes for t in n.outputs}

    def consumers(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {n.index: [] for n in self.nodes}
        for src, dst in self.edges:
            out[src].append(dst)
        return out

    def dag(self) -> Dag:
        """The layer DAG over node indices."""
        return Dag.of((n.index for n in self.nodes), self.edges)


@dataclass(frozen=True)
class Dag:
    """A directed acyclic graph over integer nodes: each node's predecessors and successors in
    the order their edges were given (an analysis breaks ties between equal paths by it), and
    one topological order.

    The analyses walk it a few hundred times per model; networkx's graph, views and generators
    cost more than the walks, and loading networkx a fifth of the ``analyze`` command."""

    nodes: tuple[int, ...]  # in the order given
    preds: dict[int, tuple[int, ...]]
    succs: dict[int, tuple[int, ...]]
    order: tuple[int, ...]  # topological

    @classmethod
    def of(cls, nodes: Iterable[int], edges: Iterable[tuple[int, int]]) -> Dag:
        """The graph of ``nodes`` (and any an edge names) and ``edges``, a repeated edge once."""
        preds: dict[int, dict[int, None]] = {v: {} for v in nodes}
        succs: dict[int, dict[int, None]] = {v: {} for v in preds}
        for u, v in edges:
            for w in (u, v):
                if w not in preds:
                    preds[w], succs[w] = {}, {}
            succs[u][v] = None
            preds[v][u] = None
        frozen_preds = {v: tuple(p) for v, p in preds.items()}
        frozen_succs = {v: tuple(s) for v, s in succs.items()}
        return cls(tuple(preds), frozen_preds, frozen_succs, _topological(frozen_preds, frozen_succs))

    def out_degree(self, v: int) -> int:
        return len(self.succs[v])

    def subgraph(self, nodes: Iterable[int]) -> Dag:
        """The subgraph ``nodes`` induce, each node's neighbours in this graph's order."""
        keep = set(nodes)
        kept = tuple(v for v in self.nodes if v in keep)
        return Dag(kept, {v: tuple(u for u in self.preds[v] if u in keep) for v in kept},
                   {v: tuple(w for w in self.succs[v] if w in keep) for v in kept},
                   tuple(v for v in self.order if v in keep))


def _topological(preds: dict[int, tuple[int, ...]], succs: dict[int, tuple[int, ...]]) -> tuple[int, ...]:
    waiting = {v: len(p) for v, p in preds.items()}
    ready = [v for v, n in waiting.items() if n == 0]
    order = []
    while ready:
        v = ready.pop()
        order.append(v)
        for w in succs[v]:
            waiting[w] -= 1
            if waiting[w] == 0:
                ready.append(w)
    if len(order) != len(preds):
        raise BenanzaError(f"the layer graph has a cycle through {len(preds) - len(order)} nodes")
    return tuple(order)


@dataclass(frozen=True)
class Occurrence:
    model: str
    node: str
    index: int


@dataclass
class UniqueLayer:
    layer: Layer
    occurrences: list[Occurrence] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        d = self.layer.to_json()
        d["occurrences"] = [
            {"model": o.model, "node": o.node, "index": o.index} for o in self.occurrences
        ]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> UniqueLayer:
        return cls(
            Layer.from_json(d),
            [Occurrence(o["model"], o["node"], o["index"]) for o in d.get("occurrences", [])],
        )


def unique_layers(models: Iterable[Model]) -> list[UniqueLayer]:
    """Dedup layers within and across models in one pass; order of first appearance. A folded
    node, or one that works in place, runs nothing, so nothing is benchmarked for it."""
    table: dict[str, UniqueLayer] = {}
    for m in models:
        for n in m.nodes:
            if n.folded or n.in_place:
                continue
            u = table.get(n.layer.key)
            if u is None:
                u = table[n.layer.key] = UniqueLayer(n.layer)
            u.occurrences.append(Occurrence(m.name, n.name, n.index))
    return list(table.values())
