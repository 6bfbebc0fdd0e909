"""Speed of light: each layer's roofline time from its work and the stack's measured peaks, a
model bound over those times, and the results no kernel can have produced.

A layer's roofline time is max(FLOPs / compute peak of its dtype, compulsory bytes / bandwidth),
where the compute peak is the cores' FMA loop where measured (f32 on a CPU), else the library's
GEMM (``Peaks.compute_peak``), and the bandwidth is that of the largest measured working set
not above the layer's bytes (a layer that fits in a cache is held to that cache). Algorithms
that compute fewer multiplications than the direct count (Winograd, FFT) are held to the memory
roof only, in the speed-of-light bound as in the check below.

A result more than 10% faster than what no kernel can beat is a measurement defect, not a lower
bound: it is flagged ``impossible`` and kept out of the bound. That floor counts the essential
FLOPs (``Problem.essential_flops``: no work on zero padding) and takes the FMA roof
itself, or half a GEMM roof (``COMPUTE_SLACK``), and the fastest bandwidth measured anywhere
(the smallest working set's): the ladder's streaming copies read and write, while a kernel that
mostly reads (a GEMM's weights) can stream faster than a copy of its size, and a defect (an
empty timed region) is far below either.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..layers import FLOAT_DTYPES, Dag, Layer, Model, TensorSpec
from ..ops.base import ELEMENT_SIZE
from ..peaks import Peak, Peaks
from ..records import Result, Variant
from .bounds import LayerRow, LayerStatus, critical_path

# A result faster than this share of its roofline time cannot be true (the margin absorbs the
# peaks' own noise: they are the best batches of a few seconds on a possibly busy machine).
IMPOSSIBLE_BELOW = 0.9
# The defect check's compute floor is a GEMM peak over this: the peak is what one GEMM shape
# reaches, and other kernels beat it (seen in a clean room: Inception-v1's 5×5 convolutions, 5
# real results past 1.11× a trusted 462 GFLOP/s). A defect (an empty timed region) is orders of
# magnitude below either. The cores' FMA peak is a ceiling, so a roof that is one takes no slack;
# bf16 and int8 have no FMA/VNNI/AMX loop yet and keep their GEMM roof and this slack.
COMPUTE_SLACK = 2.0
# Words in an algorithm or implementation name of kernels that do fewer multiplications than
# the direct method, whose FLOP count the roof assumes.
_FEWER_MULTIPLIES = ("wino", "fft")


@dataclass(frozen=True)
class Roof:
    """The roofline of one problem in one dtype."""

    flops: int
    bytes: int
    compute_ms: float | None  # None: no measured compute peak in this dtype
    memory_ms: float
    level: str  # the cache level (or DRAM) whose bandwidth is the memory roof
    fastest_memory_ms: float  # the bytes at the fastest bandwidth measured (the defect check's floor)
    compute_peak: Peak | None  # the peak behind compute_ms: the cores' FMA loop or the library's GEMM
    # the essential FLOPs (no work on zero padding) at that peak: the defect check's compute floor
    # (None: no measured compute peak in this dtype)
    essential_compute_ms: float | None = None

    @property
    def compute_slack(self) -> float:
        """How far a real kernel may beat the compute roof: not at all past the cores' FMA peak,
        up to ``COMPUTE_SLACK`` past a GEMM's."""
        return 1.0 if self.compute_peak is not None and self.compute_peak.kind == "fma" else COMPUTE_SLACK

    @property
    def ms(self) -> float:
        return max(self.compute_ms or 0.0, self.memory_ms)

    @property
    def bound_by(self) -> str:
        return "compute" if (self.compute_ms or 0.0) > self.memory_ms else "memory"

    @property
    def intensity(self) -> float | None:
        """FLOPs per compulsory byte."""
        return self.flops / self.bytes if self.bytes else None

    def sol_ms(self, algo: str, implementation: str) -> float:
        """The speed of light of a kernel of this algorithm and implementation."""
        return self.memory_ms if computes_fewer(algo, implementation) else self.ms

    def floor_ms(self, variant: Variant, implementation: str) -> float:
        """What a result of ``variant`` cannot beat, whatever cache holds its data."""
        compute = 0.0 if computes_fewer(variant.algo, implementation) else (self.essential_compute_ms or 0.0)
        return max(compute / self.compute_slack, self.fastest_memory_ms)


@dataclass(frozen=True)
class LayerRoof:
    index: int
    roof: Roof
    latency_ms: float | None  # the bound's latency for the layer (its best possible kernel)
    impossible: tuple[str, ...]  # variants of the layer flagged impossible
    sol_ms: float  # the roofline time of the best kernel's algorithm (Roof.sol_ms)

    @property
    def sol_fraction(self) -> float | None:
        """The share of speed of light the best kernel reaches (its roofline time / its latency)."""
        return self.sol_ms / self.latency_ms if self.latency_ms else None

    @property
    def left_ms(self) -> float:
        """Milliseconds between the best kernel and speed of light."""
        return max(0.0, (self.latency_ms or 0.0) - self.sol_ms)


@dataclass(frozen=True)
class ImpossibleResult:
    variant: str
    layer_key: str
    median_ms: float
    latency_ms: float  # the figure a bound would use (Result.latency_ms), the one judged
    floor_ms: float


@dataclass(frozen=True)
class SpeedOfLight:
    peaks: Peaks
    layers: tuple[LayerRoof, ...]  # the layers in the bound (status ok), by node index
    sequential_ms: float
    parallel_ms: float
    critical_path: tuple[int, ...]
    impossible: tuple[ImpossibleResult, ...]
    no_compute_roof: tuple[str, ...]  # dtypes of layers with no compute peak: held to memory only

    def memory_bound_ms(self) -> float:
        """Of the bound (sum of the layers' latencies), the part in memory-bound layers."""
        return sum(r.latency_ms or 0.0 for r in self.layers if r.roof.bound_by == "memory")


def computes_fewer(algo: str, implementation: str) -> bool:
    """Whether a kernel of this algorithm and implementation does fewer multiplications than the
    layer's FLOP count (Winograd, FFT)."""
    text = f"{algo} {implementation}".lower()
    return any(w in text for w in _FEWER_MULTIPLIES)


def spec_bytes(t: TensorSpec, dtype: str) -> int:
    """A tensor's bytes computed in ``dtype``: a float tensor in its size, others in their own."""
    return t.numel * ELEMENT_SIZE.get(dtype if t.dtype in FLOAT_DTYPES else t.dtype, 4)


def tensor_bytes(layer: Layer, dtype: str) -> tuple[int, int]:
    """The layer's (input, output) bytes computed in ``dtype``."""
    return sum(spec_bytes(t, dtype) for t in layer.inputs), sum(spec_bytes(t, dtype) for t in layer.outputs)


def roof(layer: Layer, dtype: str, peaks: Peaks, math: str = "default") -> Roof | None:
    """The layer's roofline computed in ``dtype`` under ``math`` (the variant's math mode: it
    decides whether fp32 data may use TF32 Tensor Cores); None without any bandwidth peak."""
    inputs, outputs = tensor_bytes(layer, dtype)
    nbytes = layer.problem.compulsory_bytes(inputs, outputs)
    bandwidth = peaks.bandwidth_for(nbytes)
    if bandwidth is None:
        return None
    peak = peaks.compute_peak(dtype, math)
    compute = 1e3 * layer.flops / peak.value if peak is not None else None
    essential = layer.problem.essential_flops()
    essential = layer.flops if essential is None else essential
    fastest = max(p.value for p in peaks.ladder)
    return Roof(layer.flops, nbytes, compute, 1e3 * nbytes / bandwidth.value, bandwidth.level, 1e3 * nbytes / fastest,
                peak, 1e3 * essential / peak.value if peak is not None else None)


def screen(results: Iterable[Result], model: Model, peaks: Peaks) -> tuple[list[Result], list[ImpossibleResult]]:
    """Splits OK results faster than ``IMPOSSIBLE_BELOW`` × their roofline time from the rest."""
    # a float layer may be benchmarked in any float type; an integer one (quantized) in its own only
    layers = {(n.layer.problem, dt): n.layer for n in model.nodes
              for dt in (FLOAT_DTYPES if n.layer.dtype in FLOAT_DTYPES else (n.layer.dtype,))}
    kept, flagged = [], []
    roofs: dict[tuple, Roof | None] = {}
    for r in results:
        layer = layers.get((r.variant.problem, r.variant.dtype))
        if r.ok and layer is not None:
            key = (r.variant.problem, r.variant.dtype, r.variant.math)
            if key not in roofs:
                roofs[key] = roof(layer, r.variant.dtype, peaks, r.variant.math)
            rf = roofs[key]
            if rf is not None:
                # judged by what a bound would take from it: the samples' low percentile where
                # the runtime timed each call (a bound resting on one below its floor was seen:
                # 0.062 ms against a 0.27 ms median and a 0.14 ms floor), else the median
                latency = float(r.latency_ms)  # type: ignore[arg-type]
                floor = rf.floor_ms(r.variant, r.implementation)
                if latency < IMPOSSIBLE_BELOW * floor:
                    flagged.append(ImpossibleResult(r.variant.name, r.variant.layer_key, float(r.median_ms),  # type: ignore[arg-type]
                                                    latency, floor))
                    continue
        kept.append(r)
    return kept, flagged


def speed_of_light(model: Model, rows: list[LayerRow], graph: Dag, dtype: str, peaks: Peaks,
                   impossible: list[ImpossibleResult]) -> SpeedOfLight:
    """Roofline times of the layers the bound counts (status ok), and the model's bounds over
    them: the sum, and the critical path of the same DAG with those times as node weights."""
    by_key: dict[str, list[str]] = {}
    for f in impossible:
        by_key.setdefault(f.layer_key, []).append(f.variant)
    out: list[LayerRoof] = []
    unroofed: set[str] = set()
    for row in rows:
        if row.status != LayerStatus.OK:
            continue
        layer = model.nodes[row.index].layer
        dt = layer.in_dtype(dtype)
        rf = roof(layer, dt, peaks, row.math)
        if rf is None:
            continue
        if rf.compute_ms is None and layer.flops:
            unroofed.add(dt)
        flagged = tuple(v for key, vs in by_key.items() if _same_problem(key, layer) for v in vs)
        out.append(LayerRoof(row.index, rf, row.latency_ms, flagged, rf.sol_ms(row.algo, row.implementation)))
    weight: Mapping[int, float] = {r.index: r.sol_ms for r in out}
    length, path = critical_path(graph, weight)
    return SpeedOfLight(peaks, tuple(out), math.fsum(weight.values()), length, tuple(path), tuple(impossible),
                        tuple(sorted(unroofed)))


def _same_problem(layer_key: str, layer: Layer) -> bool:
    from ..problems import parse_layer_key

    return parse_layer_key(layer_key)[0] == layer.problem
