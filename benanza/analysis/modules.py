"""The model as its modules: each layer placed in the module its exporter recorded
(``benanza.scopes``), bounds and measured time rolled up per module, and repeated siblings with
the same layers folded into one entry (16 decoder blocks read as one block ×16).

A layer the file gives no module (an exporter's optimiser inserts a Split, the TorchScript
exporter's unnamed Identity) sits in the innermost module that holds all of its data neighbours.
A model without module records is grouped by op type; in one whose only records are calls of
local functions, the layers between the calls belong to the model itself.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..layers import Dag, Model
from ..scopes import LOCAL_FUNCTIONS, OP_TYPES
from .bounds import LayerRow, LayerStatus, critical_path

Path = tuple[str, ...]  # qualified module names, outermost first; () is the model


@dataclass(frozen=True)
class MeasuredGroup:
    """One framework op: the model layers it ran and its mean time per run."""

    nodes: tuple[int, ...]
    time_ms: float


@dataclass(frozen=True)
class ModuleStats:
    path: Path
    kind: str  # the module's class where the exporter records it ("" otherwise)
    layers: tuple[int, ...]  # every layer under the module, in model order
    keys: tuple[str, ...]  # their layer keys, in order: siblings with equal keys are repeats
    sequential_ms: float
    parallel_ms: float  # critical path of the module's own subgraph
    share: float  # of the model's sequential bound
    partial: bool  # a layer under it has no result
    # framework time of the ops wholly inside the module; None without a per-op profile, or when
    # an op the framework ran fuses a layer of the module with one outside it (not separable)
    measured_ms: float | None
    children: tuple[ModuleStats, ...]

    @property
    def name(self) -> str:
        return self.path[-1] if self.path else "(model)"

    @property
    def local_name(self) -> str:
        """The name under its parent: ``qkv`` under ``layers.0``; an index keeps its container
        (``blocks.0`` under ``blocks``)."""
        if len(self.path) < 2 or not self.path[-1].startswith(self.path[-2] + "."):
            return self.name
        rel = self.path[-1][len(self.path[-2]) + 1:]
        return self.path[-2].rsplit(".", 1)[-1] + "." + rel if rel.split(".")[0].isdigit() else rel

    @property
    def ratio(self) -> float | None:
        """Benanza ratio of the module: its sequential bound over its measured time."""
        return self.sequential_ms / self.measured_ms if self.measured_ms else None


@dataclass(frozen=True)
class Fold:
    """Consecutive siblings with the same layer keys: one entry, ``members`` long."""

    members: tuple[ModuleStats, ...]

    @property
    def first(self) -> ModuleStats:
        return self.members[0]

    @property
    def count(self) -> int:
        return len(self.members)

    @property
    def label(self) -> str:
        """``layers.0–15 ×16``; a single module's own local name."""
        first, last = self.members[0].local_name, self.members[-1].local_name
        if self.count == 1:
            return first
        a, b = re.fullmatch(r"(.*?)(\d+)", first), re.fullmatch(r"(.*?)(\d+)", last)
        span = (f"{a.group(1)}{a.group(2)}–{b.group(2)}" if a and b and a.group(1) == b.group(1)
                else f"{first} … {last}")
        return f"{span} ×{self.count}"

    @property
    def sequential_ms(self) -> float:
        """The bound of all members (each member's is ``first.sequential_ms``)."""
        return sum(m.sequential_ms for m in self.members)

    @property
    def measured_ms(self) -> float | None:
        """Framework time of all members; None when one of them has none."""
        times = [m.measured_ms for m in self.members]
        return None if any(t is None for t in times) else sum(t for t in times if t is not None)


def fold(children: Sequence[ModuleStats]) -> list[Fold]:
    """Runs of consecutive siblings with equal layer keys (model order), each one Fold."""
    out: list[list[ModuleStats]] = []
    for c in children:
        if out and out[-1][0].keys == c.keys:
            out[-1].append(c)
        else:
            out.append([c])
    return [Fold(tuple(ms)) for ms in out]


def layer_paths(model: Model) -> tuple[dict[int, Path], dict[Path, str]]:
    """Each layer's module path, and each module's class where recorded."""
    if model.scope_source == OP_TYPES:
        return {n.index: (n.layer.op,) for n in model.nodes}, {}
    kinds: dict[Path, str] = {}
    paths: dict[int, Path] = {}
    for n in model.nodes:
        if n.scope is None:
            continue
        path = tuple(name for name, _ in n.scope)
        paths[n.index] = path
        for k, (_, kind) in enumerate(n.scope):
            if kind:
                kinds.setdefault(path[:k + 1], kind)
    neighbours: dict[int, list[int]] = {n.index: [] for n in model.nodes}
    for s, d in model.edges:
        neighbours[s].append(d)
        neighbours[d].append(s)
    # an unrecorded layer joins the innermost module holding its placed neighbours; repeated, so a
    # run of unrecorded layers is placed from its ends. A function call is one layer, not a scope
    # that layers between calls belong to: those stay in the model.
    todo = [n.index for n in model.nodes if n.index not in paths]
    while todo and model.scope_source != LOCAL_FUNCTIONS:
        placed = {}
        for i in todo:
            known = [paths[j] for j in neighbours[i] if j in paths]
            if known:
                placed[i] = _common(known)
        if not placed:
            break
        paths.update(placed)
        todo = [i for i in todo if i not in placed]
    for i in todo:
        paths[i] = ()  # nothing around it is placed: the model itself
    return paths, kinds


def _common(paths: Sequence[Path]) -> Path:
    out = paths[0]
    for p in paths[1:]:
        k = 0
        while k < min(len(out), len(p)) and out[k] == p[k]:
            k += 1
        out = out[:k]
    return out


def module_tree(model: Model, rows: Sequence[LayerRow], graph: Dag,
                groups: Sequence[MeasuredGroup] | None = None) -> ModuleStats:
    """The model's module tree with bounds per module (from ``rows``' latencies) and, given the
    framework's ops (``groups``), measured time per module."""
    paths, kinds = layer_paths(model)
    weight: Mapping[int, float] = {r.index: r.latency_ms for r in rows}
    missing = {r.index for r in rows if r.status == LayerStatus.MISSING}
    members: dict[Path, list[int]] = {}
    for r in rows:
        p = paths[r.index]
        for k in range(len(p) + 1):
            members.setdefault(p[:k], []).append(r.index)
    measured: dict[Path, float] = {}
    cut: set[Path] = set()  # modules an op fuses across
    if groups is not None:
        for g in groups:
            if not g.nodes:
                continue  # an op the framework inserted: no module of the model holds it
            lca = _common([paths[i] for i in g.nodes])
            for k in range(len(lca) + 1):
                measured[lca[:k]] = measured.get(lca[:k], 0.0) + g.time_ms
            for i in g.nodes:
                for k in range(len(lca) + 1, len(paths[i]) + 1):
                    cut.add(paths[i][:k])
    children: dict[Path, list[Path]] = {}
    for p in members:
        if p:
            children.setdefault(p[:-1], []).append(p)
    total = sum(weight.values())

    def build(p: Path) -> ModuleStats:
        layers = tuple(sorted(members.get(p, [])))
        kids = tuple(build(c) for c in sorted(children.get(p, []), key=lambda c: min(members[c])))
        seq = sum(weight.get(i, 0.0) for i in layers)
        par, _ = critical_path(graph.subgraph(layers) if p else graph, weight)
        time = None if groups is None or p in cut else measured.get(p, 0.0)
        return ModuleStats(p, kinds.get(p, ""), layers, tuple(rows[i].key for i in layers), seq, par,
                           seq / total if total else 0.0, any(i in missing for i in layers), time, kids)

    return build(())


def repeats(root: ModuleStats) -> dict[int, tuple[int, int]]:
    """Layer → (the layer it repeats, how many modules repeat it), from the outermost folds:
    a layer of the k-th of N identical siblings maps to the same position in the first, which maps
    to itself with N. Layers outside any fold are absent."""
    out: dict[int, tuple[int, int]] = {}

    def walk(m: ModuleStats) -> None:
        for f in fold(m.children):
            if f.count == 1:
                walk(f.first)
                continue
            for member in f.members:
                for rep, i in zip(f.first.layers, member.layers):
                    out[i] = (rep, f.count)

    walk(root)
    return out


def module_of(root: ModuleStats) -> dict[int, ModuleStats]:
    """Each layer's innermost module."""
    out: dict[int, ModuleStats] = {}

    def walk(m: ModuleStats) -> None:
        for i in m.layers:
            out[i] = m
        for c in m.children:
            walk(c)

    walk(root)
    return out
