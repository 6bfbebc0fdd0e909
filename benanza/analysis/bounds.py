"""Q1/Q2: per-layer latencies from the performance database, sequential and parallel bounds.

The parallel bound is the critical path of the layer DAG with the layers' latencies as NODE
weights. (The paper puts each layer's latency on its out-edges, which drops the last
layer's own latency; node weights do not.)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import cast

from ..fusion import FusionMatch
from ..generator import get_backend
from ..layers import Dag, Layer, Model, Node
from ..problems import Problem, layer_key
from ..records import Result, Status, StrEnum

# Results of one problem in one dtype: what a layer analysed in that dtype can use.
ResultIndex = Mapping[tuple[Problem, str], list[Result]]


@dataclass(frozen=True)
class Choice:
    """The database result a layer's bound uses."""

    result: Result

    @property
    def latency_ms(self) -> float:
        return float(self.result.latency_ms)  # type: ignore[arg-type]


class LayerStatus(StrEnum):
    OK = "ok"
    MISSING = "missing"  # the library covers it, the database has no OK result
    NOT_COVERED = "not_covered"  # no library call runs this layer type
    IDENTITY = "identity"  # inference computes nothing here (Dropout): 0 ms by definition
    VIEW = "free_view"  # only relabels the input's shape (Reshape, Flatten, ...): 0 ms by definition
    FOLDED = "folded"  # a constant once the input shapes are fixed: computed at load time, 0 ms


@dataclass(frozen=True)
class LayerRow:
    index: int
    name: str
    op: str
    key: str
    status: LayerStatus
    latency_ms: float  # 0 unless status is OK
    variant: str = ""  # the benchmark name chosen
    algo: str = ""
    implementation: str = ""
    critical: bool = False
    failed_variants: int = 0  # variants of this layer that failed or were unsupported
    # some variant the best was chosen from was measured under contention: its true latency may
    # be below the chosen one's, so the row's latency is no floor (docs/measurement.md)
    contended: bool = False
    math: str = "default"  # the chosen variant's math mode (its roof: fp32 on TF32 Tensor Cores or not)


def covered(layer: Layer, backend: str) -> bool:
    """Whether the backend's benchmarks run this layer (else it is not covered, never missing)."""
    return get_backend(backend).covers(layer)


def index_results(results: Iterable[Result]) -> dict[tuple[Problem, str], list[Result]]:
    by_problem: dict[tuple[Problem, str], list[Result]] = {}
    for r in results:
        by_problem.setdefault((r.variant.problem, r.variant.dtype), []).append(r)
    return by_problem


def layer_results(by_problem: ResultIndex, layer: Layer, dtype: str) -> list[Result]:
    """The results of a layer's problem in the dtype the model is analysed in."""
    return list(by_problem.get((layer.problem, layer.in_dtype(dtype)), []))


def candidates(results: Iterable[Result], dtype: str, fusion: str = "none",
               layouts: tuple[str, ...] = ()) -> list[Result]:
    """The OK results of a layer a bound chooses from for the dtype (and layouts, when given)."""
    return [r for r in results if r.ok and r.variant.dtype == dtype and r.variant.fusion == fusion
            and (not layouts or r.variant.layout in layouts)]


def best(results: Iterable[Result], dtype: str, fusion: str = "none",
         layouts: tuple[str, ...] = ()) -> Result | None:
    """Fastest OK result of a layer for the dtype (and layouts, when given), by the latency a
    bound uses (Result.latency_ms)."""
    ok = candidates(results, dtype, fusion, layouts)
    if not ok:
        return None
    # by latency, then by name among the equally fast: the choice keying every candidate on
    # (latency, name) makes, without making every candidate's name (`is`: a tuple compares so)
    lowest = min(ok, key=lambda r: cast(float, r.latency_ms)).latency_ms
    tied = [r for r in ok if r.latency_ms is lowest or r.latency_ms == lowest]
    return tied[0] if len(tied) == 1 else min(tied, key=lambda r: r.variant.name)


class LayerTable:
    """One model's layer rows against one backend's results, per analysed dtype and layouts.

    An analysis asks for the rows of its dtype, then of each dtype and layout Q6 compares, then of
    the joint bound's: each table is built once, and a layer's static status (free, folded, not
    covered) and each problem's choice once per table, as a model repeats its problems."""

    def __init__(self, model: Model, by_problem: ResultIndex, backend: str):
        self.model = model
        self.by_problem = by_problem
        self.static = [_static_status(node, backend) for node in model.nodes]
        # each node's problem as a number: a problem hashes all its fields, every time
        numbers: dict[Problem, int] = {}
        self._problem = [numbers.setdefault(node.layer.problem, len(numbers)) for node in model.nodes]
        self._tables: dict[tuple[str, tuple[str, ...]], list[LayerRow]] = {}

    def rows(self, dtype: str, layouts: tuple[str, ...] = ()) -> list[LayerRow]:
        """One row per model node: each layer's problem looked up in the analysed dtype."""
        table = self._tables.get((dtype, layouts))
        if table is None:
            table = self._tables[dtype, layouts] = self._build(dtype, layouts)
        return list(table)

    def _build(self, dtype: str, layouts: tuple[str, ...]) -> list[LayerRow]:
        keys: dict[tuple[int, str], str] = {}
        chosen_of: dict[tuple[int, str], tuple[Result | None, bool, int]] = {}
        rows = []
        for node, status, problem in zip(self.model.nodes, self.static, self._problem):
            layer = node.layer
            dt = layer.in_dtype(dtype)
            key = keys.get((problem, dt))
            if key is None:
                key = keys[problem, dt] = layer_key(layer.problem, dt)
            if status is not None:
                rows.append(LayerRow(node.index, node.name, layer.op, key, status, 0.0))
                continue
            choice = chosen_of.get((problem, dt))
            if choice is None:
                results = layer_results(self.by_problem, layer, dtype)
                choice = chosen_of[problem, dt] = (
                    best(results, dt, layouts=layouts),
                    any(r.contended for r in candidates(results, dt, layouts=layouts)),
                    sum(1 for r in results if r.status is not Status.OK))
            chosen, contended, failed = choice
            if chosen is None:
                rows.append(LayerRow(node.index, node.name, layer.op, key, LayerStatus.MISSING, 0.0,
                                     failed_variants=failed))
            else:
                latency = cast(float, chosen.latency_ms)  # best() picks OK results only: they have one
                rows.append(LayerRow(node.index, node.name, layer.op, key, LayerStatus.OK,
                                     float(latency), chosen.variant.name, chosen.variant.algo,
                                     chosen.implementation, failed_variants=failed, contended=contended,
                                     math=chosen.variant.math))
        return rows


def _static_status(node: Node, backend: str) -> LayerStatus | None:
    """A node's status whatever the dtype and the results: None for one the results decide."""
    layer = node.layer
    if layer.identity:
        return LayerStatus.IDENTITY
    if layer.view or node.in_place:
        return LayerStatus.VIEW
    if node.folded:
        return LayerStatus.FOLDED
    if not covered(layer, backend):
        return LayerStatus.NOT_COVERED
    return None


def layer_rows(model: Model, by_problem: ResultIndex, backend: str, dtype: str,
               layouts: tuple[str, ...] = ()) -> list[LayerRow]:
    """One row per model node: each layer's problem looked up in the analysed dtype."""
    return LayerTable(model, by_problem, backend).rows(dtype, layouts)


def contended_variants(model: Model, rows: Iterable[LayerRow], by_problem: ResultIndex, dtype: str,
                       layouts: tuple[str, ...] = (), matches: Iterable[FusionMatch] = ()) -> frozenset[str]:
    """Names of the contended results a bound in ``dtype`` (and ``layouts``) chooses from: every
    candidate of each measured layer of ``rows`` and, with ``matches``, each matched pattern's fused
    candidates. Contention only adds time, so a contended candidate that lost may truly be the
    fastest: every one of them, not only the chosen, can change the bound. Results of other
    dtypes, layouts, fusion patterns or problems (another batch size) cannot, and are not named."""
    nodes = {n.index: n.layer for n in model.nodes}
    names = set()
    seen = set()  # a model repeats its layers: each key's candidates once
    for row in rows:
        if row.status == LayerStatus.OK:
            layer = nodes[row.index]
            dt = layer.in_dtype(dtype)
            if (row.key, dt) in seen:
                continue
            seen.add((row.key, dt))
            names |= {r.variant.name for r in candidates(layer_results(by_problem, layer, dtype), dt,
                                                         layouts=layouts) if r.contended}
    for m in matches:
        names |= {r.variant.name for r in candidates(layer_results(by_problem, m.conv, dtype), m.conv.in_dtype(dtype),
                                                     fusion=m.pattern.name, layouts=layouts) if r.contended}
    return frozenset(names)


def critical_path(graph: Dag, weight: Mapping[int, float]) -> tuple[float, list[int]]:
    """Heaviest source-to-sink path by node weight, in O(V + E)."""
    dist: dict[int, float] = {}
    prev: dict[int, int | None] = {}
    for v in graph.order:
        best_u, best_d = None, 0.0
        for u in graph.preds[v]:
            if best_u is None or dist[u] > best_d:
                best_u, best_d = u, dist[u]
        dist[v] = best_d + weight.get(v, 0.0)
        prev[v] = best_u
    if not dist:
        return 0.0, []
    end = max(dist, key=lambda v: (dist[v], -v))
    path = [end]
    while prev[path[-1]] is not None:
        path.append(prev[path[-1]])  # type: ignore[arg-type]
    return dist[end], path[::-1]


@dataclass(frozen=True)
class Bounds:
    sequential_ms: float
    parallel_ms: float
    critical_path: tuple[int, ...]
    partial: bool  # some covered layers had no result: the bound is a lower bound of the bound

    def ratio(self, measured_ms: float | None) -> tuple[float | None, float | None]:
        if not measured_ms:
            return None, None
        return self.sequential_ms / measured_ms, self.parallel_ms / measured_ms


def bounds_from_weights(graph: Dag, weight: Mapping[int, float], partial: bool) -> Bounds:
    length, path = critical_path(graph, weight)
    return Bounds(sum(weight.values()), length, tuple(path), partial)


def fused_weights(rows: list[LayerRow], matches: Iterable[FusionMatch], by_problem: ResultIndex, dtype: str,
                  layouts: tuple[str, ...] = ()) -> tuple[dict[int, float], list[tuple[FusionMatch, Result]]]:
    """Node weights with each matched pattern's fused latency on its conv, 0 on the fused tail.

    A pattern whose fused benchmark is missing or failed keeps the unfused latencies (§III-D4).
    """
    weight = {r.index: r.latency_ms for r in rows}
    applied = []
    for m in matches:
        fused = best(layer_results(by_problem, m.conv, dtype), m.conv.in_dtype(dtype), fusion=m.pattern.name,
                     layouts=layouts)
        if fused is None:
            continue
        weight[m.nodes[0]] = float(fused.latency_ms)  # type: ignore[arg-type]
        for i in m.nodes[1:]:
            weight[i] = 0.0
        applied.append((m, fused))
    return weight, applied


@dataclass(frozen=True)
class ParallelModule:
    """A fork/join subgraph: independent branches between a fork layer and its join."""

    fork: int
    join: int
    branches: int
    nodes: tuple[int, ...]  # strictly between fork and join
    sequential_ms: float
    parallel_ms: float


def parallel_modules(graph: Dag, weight: Mapping[int, float]) -> list[ParallelModule]:
    """Forks (out-degree ≥ 2) paired with their immediate post-dominator."""
    ipdom = post_dominators(graph)
    modules = []
    for fork in sorted(v for v in graph.nodes if graph.out_degree(v) >= 2):
        join = ipdom[fork]
        if join is None:
            continue
        inside = between(graph, fork, join)
        par, _ = critical_path(graph.subgraph(inside), weight)
        modules.append(ParallelModule(fork, join, graph.out_degree(fork), tuple(sorted(inside)),
                                      sum(weight.get(v, 0.0) for v in inside), par))
    return modules


def post_dominators(graph: Dag) -> dict[int, int | None]:
    """Each node's immediate post-dominator: the first node every path from it to a sink passes
    through (None: the paths end in different sinks, or it is a sink).

    In a DAG, one pass from the sinks up suffices: a node's immediate post-dominator is the
    nearest common one of its successors (each successor counting as its own), so each node
    needs only its successors', already known."""
    ipdom: dict[int, int | None] = {}
    depth: dict[int | None, int] = {None: 0}  # None: the virtual sink every sink leads to

    def common(a: int | None, b: int | None) -> int | None:
        while a != b:
            if depth[a] < depth[b]:
                a, b = b, a
            a = ipdom[a]  # type: ignore[index]  # a is deeper than the root, so a node
        return a

    for v in reversed(graph.order):
        succs = graph.succs[v]
        join: int | None = succs[0] if succs else None
        for w in succs[1:]:
            join = common(join, w)
        ipdom[v] = join
        depth[v] = depth[join] + 1
    return ipdom


def between(graph: Dag, fork: int, join: int) -> set[int]:
    """The nodes strictly between a fork and its immediate post-dominator ``join``: those reached
    from the fork without passing the join (every path from the fork passes it, so these are also
    exactly the fork's descendants that are ancestors of the join)."""
    inside: set[int] = set()
    todo = [w for w in graph.succs[fork] if w != join]
    while todo:
        v = todo.pop()
        if v in inside:
            continue
        inside.add(v)
        todo.extend(w for w in graph.succs[v] if w != join and w not in inside)
    return inside
