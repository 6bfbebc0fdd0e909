"""Counts and library coverage of processed models (the paper's Table I): how many layers, how
many unique, which a backend's benchmarks cost and which ops it leaves out.

Over the processor's records, not its work: the manifest and the reports read these without
loading ONNX or shape inference.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .fusion import match_fusions
from .layers import Model, Node
from .ops.registry import PATTERN_LOWERINGS, uncovered_reason

# The library call each backend runs a layer with (None: it cannot), as Layer records it.
BACKEND_CALLS = {"cudnn": "cudnn_api", "onednn": "onednn_primitive"}


@dataclass(frozen=True)
class BackendCoverage:
    """How many of the layers that run one backend's benchmarks cost, and the ops it leaves out."""

    backend: str
    covered: int
    running: int
    not_covered: tuple[tuple[str, int], ...]

    @property
    def covered_pct(self) -> float:
        return 100.0 * self.covered / self.running if self.running else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"covered_layers": self.covered, "covered_pct": round(self.covered_pct, 2),
                "not_covered": dict(self.not_covered)}


@dataclass(frozen=True)
class ModelStats:
    model: str
    layers: int
    unique_layers: int
    covered_layers: int  # by cuDNN/cuBLAS, as the paper counts; per backend in ``backends``
    free_layers: int  # views and inference identities: nothing to run, so never "not covered"
    folded_layers: int  # constants given the input shapes: computed at load time, never "not covered"
    macs: int
    ops: tuple[tuple[str, int], ...]
    not_covered: tuple[tuple[str, int], ...]
    running_layers: int = 0  # neither free nor folded: what coverage divides by
    backends: tuple[BackendCoverage, ...] = ()
    uncosted: int = 0  # nodes left without shapes (Model.uncosted), not among the layers

    @property
    def unique_pct(self) -> float:
        return 100.0 * self.unique_layers / self.layers if self.layers else 0.0

    @property
    def covered_pct(self) -> float:
        """cuDNN/cuBLAS's share of the layers that run."""
        return 100.0 * self.covered_layers / self.running_layers if self.running_layers else 0.0

    def backend(self, name: str) -> BackendCoverage:
        return next(b for b in self.backends if b.backend == name)

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model, "layers": self.layers, "unique_layers": self.unique_layers,
            "unique_pct": round(self.unique_pct, 2), "running_layers": self.running_layers,
            "covered_layers": self.covered_layers, "covered_pct": round(self.covered_pct, 2),
            "free_layers": self.free_layers, "folded_layers": self.folded_layers, "macs": self.macs,
            "ops": dict(self.ops), "not_covered": dict(self.not_covered),
            "backends": {b.backend: b.to_json() for b in self.backends}, "uncosted": self.uncosted,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ModelStats:
        """Inverse of ``to_json``; the percentages are derived, so not read back."""
        return cls(model=d["model"], layers=int(d["layers"]), unique_layers=int(d["unique_layers"]),
                   covered_layers=int(d["covered_layers"]), free_layers=int(d["free_layers"]),
                   folded_layers=int(d["folded_layers"]), macs=int(d["macs"]),
                   ops=tuple(sorted((str(k), int(v)) for k, v in d["ops"].items())),
                   not_covered=tuple(sorted((str(k), int(v)) for k, v in d["not_covered"].items())),
                   running_layers=int(d.get("running_layers", 0)), uncosted=int(d.get("uncosted", 0)),
                   backends=tuple(BackendCoverage(name, int(b["covered_layers"]), int(d.get("running_layers", 0)),
                                                  tuple((str(k), int(v)) for k, v in b["not_covered"].items()))
                                  for name, b in d.get("backends", {}).items()))


def node_stats(name: str, nodes: list[Node], uncosted: int = 0) -> ModelStats:
    """Counts, coverage and MACs of a list of layer occurrences (one model, or several): a layer
    is covered, free, folded or not covered; coverage and MACs count the layers that run."""
    layers = [n.layer for n in nodes]
    running = [n.layer for n in nodes if n.runs]
    ops = Counter(la.op for la in layers)
    uncovered = Counter(la.op for la in running if not la.covered)
    backends = []
    for backend, call in BACKEND_CALLS.items():
        missing = Counter(la.op for la in running if getattr(la, call) is None)
        backends.append(BackendCoverage(backend, len(running) - sum(missing.values()), len(running),
                                        tuple(sorted(missing.items()))))
    return ModelStats(
        model=name, layers=len(layers), unique_layers=len({la.key for la in layers}),
        covered_layers=sum(1 for la in running if la.covered), free_layers=sum(1 for n in nodes if n.free),
        folded_layers=sum(1 for n in nodes if n.folded), macs=sum(la.macs for la in running),
        ops=tuple(sorted(ops.items())), not_covered=tuple(sorted(uncovered.items())),
        running_layers=len(running), backends=tuple(backends), uncosted=uncosted)


def coverage_notes(model: Model, backends: Iterable[str]) -> list[str]:
    """One line per running layer a backend leaves out for a reason its family gives (an LSTM's
    cell clip), so "not covered by onednn: LSTM×1" says why; and one per fusion match whose fused
    form a backend lacks (a float8 GEMM on oneDNN), whose pieces are then all it costs."""
    notes = []
    matches = match_fusions(model)
    for backend in backends:
        call = BACKEND_CALLS[backend]
        for n in model.nodes:
            reason = uncovered_reason(n.layer, backend) if n.runs and getattr(n.layer, call) is None else None
            if reason is not None:
                notes.append(f"not covered by {backend}: {n.layer.op} {n.name!r}: {reason}")
        for m in matches:
            lowering = PATTERN_LOWERINGS.get(m.pattern.name)
            gap = lowering.gap(m.conv.problem, backend) if lowering is not None else None
            if gap is not None:
                anchor = model.nodes[m.nodes[0]]
                notes.append(f"not covered by {backend}: the fused {m.pattern.name} at {anchor.layer.op} "
                             f"{anchor.name!r} (its pieces are costed): {gap}")
    return notes


def model_stats(model: Model) -> ModelStats:
    return node_stats(model.name, model.nodes, len(model.uncosted))


def total_stats(models: list[Model]) -> ModelStats:
    """The union across models: unique layers are deduplicated across them too."""
    return node_stats("total", [n for m in models for n in m.nodes], sum(len(m.uncosted) for m in models))
