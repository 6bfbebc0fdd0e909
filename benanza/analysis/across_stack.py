"""The across-stack split (the layering of XSP, papers/xsp.md): where a framework's time goes.

Given one model analysed twice on one system, against the framework's own backend (its kernels
benchmarked alone) and against the vendor library's (oneDNN on a CPU), the measured latency
splits into

- *framework overhead* = measured − the framework-native bound: what the framework adds around
  its kernels (scheduling, allocation, copies, layout changes between them);
- *kernel headroom* = the framework-native bound − the vendor-library bound: how much faster the
  best vendor kernels run the same layers than the framework's own.

Per layer, the headroom compares the two bounds' latencies of the layer; the overhead compares
the layer's own time in the framework's profile (where the framework ran it as one op of its
own) with its framework-native latency. A pure function over two analyses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .bounds import LayerStatus

if TYPE_CHECKING:
    from ..analyzer import Analysis


@dataclass(frozen=True)
class StackLayer:
    index: int
    name: str
    op: str
    native_ms: float | None  # the layer's latency in the framework-native bound (None: not measured)
    vendor_ms: float | None  # in the vendor-library bound (None: the library does not run it, or not measured)
    framework_ms: float | None  # its time in the framework's profile, where one op of the framework ran it alone

    @property
    def kernel_headroom_ms(self) -> float | None:
        return None if self.native_ms is None or self.vendor_ms is None else self.native_ms - self.vendor_ms

    @property
    def framework_overhead_ms(self) -> float | None:
        return None if self.framework_ms is None or self.native_ms is None else self.framework_ms - self.native_ms


@dataclass(frozen=True)
class AcrossStack:
    framework: str  # the framework-native backend (onnxruntime)
    vendor: str  # the vendor library's backend (onednn)
    vendor_stack: str  # the vendor results' stack id
    measured_ms: float | None
    native_bound_ms: float  # sequential bounds: a CPU framework runs one op at a time
    vendor_bound_ms: float
    layers: tuple[StackLayer, ...]
    partial: bool  # a bound lacks layers (missing results): the split is no floor either
    # the vendor results its bound chooses from that were measured while other processes took the
    # CPU: its share would read as kernel headroom (shown only with --allow-contended, labelled)
    contended: frozenset[str] = frozenset()

    @property
    def framework_overhead_ms(self) -> float | None:
        return None if self.measured_ms is None else self.measured_ms - self.native_bound_ms

    @property
    def kernel_headroom_ms(self) -> float:
        return self.native_bound_ms - self.vendor_bound_ms


# layers that cost 0 in every bound: nothing to split
_COST_NOTHING = (LayerStatus.IDENTITY, LayerStatus.VIEW, LayerStatus.FOLDED)


def _latency(a: Analysis, index: int) -> float | None:
    row = a.rows[index]
    return row.latency_ms if row.status == LayerStatus.OK else None


def across_stack(native: Analysis, vendor: Analysis) -> AcrossStack:
    """The split of ``native`` (an analysis against the framework's own backend, with its
    profile) against ``vendor`` (the same model and system against the vendor library)."""
    alone: dict[int, float] = {}
    if native.framework is not None:
        for o in native.framework.overheads:
            if len(o.nodes) == 1:
                alone[o.nodes[0]] = o.framework_ms
    layers = tuple(StackLayer(r.index, r.name, r.op, _latency(native, r.index), _latency(vendor, r.index),
                              alone.get(r.index))
                   for r in native.rows if r.status not in _COST_NOTHING)
    return AcrossStack(native.backend, vendor.backend, vendor.stack.stack_id if vendor.stack is not None else "",
                       native.measured_ms, native.bounds.sequential_ms, vendor.bounds.sequential_ms, layers,
                       bool(native.missing or vendor.missing), vendor.contended)
