"""The resource floors under the parallel bound: what the machine's shared resources allow
however the layers are scheduled.

The critical path lets independent branches run side by side, each at the speed its benchmark
measured alone, while each benchmark already had the whole machine: its cores, its memory bus.
Branches that share those cannot all run at their solo speed, so the parallel bound is never
below any of these floors (each a lower bound of every schedule):

- **memory**: the weights that cannot stay in the last-level cache between runs stream from
  main memory once per run at least: (weight bytes − LLC capacity) / the memory bandwidth;
- **compute**: the FLOPs at the compute peak of their dtype (the cores' FMA peak, else the GEMM's);
- **work**: a layer's work is the least core time it was measured to take: its single-thread
  time, or threads × its time at the stack's threads where that is less (a memory-bound layer
  can run more than threads× faster on more cores: more of the memory bus, more cache), and the
  stack's threads do it all at most that many at once: Σ work / threads, never above the
  sequential bound.

A floor's rate is the stored peak (``benanza peaks``, ``Peaks.trusted`` only), raised to the
fastest rate a layer of the bound demonstrably reached where one beat it: a floor must never
exceed what the machine was seen to do.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from ..layers import Model
from ..ops.copy import CopyProblem
from ..peaks import Peaks
from ..records import Result
from .bounds import LayerRow, LayerStatus, best, candidates, index_results, layer_results
from .roofline import computes_fewer, spec_bytes

MEMORY, COMPUTE, WORK = "memory", "compute", "work"
CRITICAL_PATH = "critical path"


@dataclass(frozen=True)
class Floor:
    """One resource floor: ``amount`` of work (bytes, FLOPs or single-thread milliseconds) at
    ``rate`` (bytes/s, FLOP/s, or threads working at once) takes at least ``ms``."""

    name: str  # MEMORY | COMPUTE | WORK
    ms: float
    amount: float
    rate: float
    detail: str  # the figures it rests on, for a reader
    layers: int  # layers of the bound it counts


@dataclass(frozen=True)
class Floors:
    critical_path_ms: float
    floors: tuple[Floor, ...]
    absent: tuple[str, ...]  # why a floor is not computed (one line each)

    @property
    def parallel_ms(self) -> float:
        return max([self.critical_path_ms, *(f.ms for f in self.floors)])

    @property
    def binding(self) -> Floor | None:
        """The floor the parallel bound rests on; None where the critical path is longer."""
        top = max(self.floors, key=lambda f: f.ms, default=None)
        return top if top is not None and top.ms > self.critical_path_ms else None

    @property
    def binds(self) -> str:
        b = self.binding
        return b.name if b is not None else CRITICAL_PATH


def weights(model: Model, rows: list[LayerRow], dtype: str) -> dict[int, dict[str, int]]:
    """Per layer of the bound (status ok), the constant tensors it must read whole each run and
    their bytes in ``dtype``: its weights, and what folded layers computed from them at load
    time. A copy (Gather, Slice, Expand, …) reads only the part of its constant it writes, and
    which part this analysis cannot say: its constants are left out (the floor stays a floor)."""
    folded = {t: (n, k) for n in model.nodes if n.folded and len(n.layer.outputs) == len(n.outputs)
              for k, t in enumerate(n.outputs)}
    out: dict[int, dict[str, int]] = {}
    for row in rows:
        if row.status != LayerStatus.OK:
            continue
        node = model.nodes[row.index]
        if isinstance(node.layer.problem, CopyProblem):
            continue
        read = {name: spec_bytes(spec, dtype) for name, spec in zip(node.constant_inputs, node.constant_specs)}
        for t in node.inputs:
            if t in folded:
                producer, k = folded[t]
                read[t] = spec_bytes(producer.layer.outputs[k], dtype)
        if read:
            out[row.index] = read
    return out


def memory_floor(model: Model, rows: list[LayerRow], dtype: str, peaks: Peaks) -> Floor | str:
    if not peaks.levels:
        return "memory floor: the stored peaks name no cache sizes (measured by an older version; `benanza peaks` " \
               "measures them again)"
    llc_name, llc = peaks.levels[-1]
    per_layer = weights(model, rows, dtype)
    unique: dict[str, int] = {}
    for read in per_layer.values():
        unique.update(read)
    total = sum(unique.values())
    if total <= llc:
        return (f"memory floor: the weights ({_bytes(total)}) fit in the {_bytes(llc)} last-level cache ({llc_name}): "
                f"none must stream from main memory each run")
    dram = peaks.dram
    if dram is None:
        return "memory floor: the stored peaks have no memory bandwidth"
    latency = {r.index: r.latency_ms for r in rows}
    # a layer whose own weights exceed the cache streamed at least the excess per run of its benchmark
    seen = [(sum(read.values()) - llc) / (latency[i] / 1e3) for i, read in per_layer.items()
            if sum(read.values()) > llc and latency[i] > 0]
    rate = max([dram.value, *seen])
    raised = f", raised to {_rate(rate, 'B/s')} that a layer streamed" if rate > dram.value else ""
    streamed = total - llc
    return Floor(MEMORY, 1e3 * streamed / rate, streamed, rate,
                 f"{_bytes(total)} of weights, {_bytes(streamed)} beyond the {_bytes(llc)} last-level cache "
                 f"({llc_name}), at the memory bandwidth {_rate(dram.value, 'B/s')}{raised}", len(per_layer))


def compute_floor(model: Model, rows: list[LayerRow], dtype: str, peaks: Peaks) -> Floor | str:
    """FLOPs at the compute peak each layer's kernel can reach (its dtype and math: the cores'
    FMA peak where measured, fp32 allowed TF32 held to the faster of f32 and tf32), grouped by
    that peak; the group that takes longest (kernels of different peaks may run on different
    units at once; integer layers without an int8 peak are left out)."""
    groups: dict[str, tuple[float, list[LayerRow]]] = {}
    without: set[str] = set()
    for row in rows:
        layer = model.nodes[row.index].layer
        if row.status != LayerStatus.OK or not layer.flops or computes_fewer(row.algo, row.implementation):
            continue
        dt = layer.in_dtype(dtype)
        peak = peaks.compute_peak(dt, row.math)
        if peak is None:
            without.add(dt)
            continue
        groups.setdefault(peak.label, (peak.value, []))[1].append(row)
    floors = []
    for name, (value, members) in sorted(groups.items()):
        flops = [model.nodes[r.index].layer.flops for r in members]
        seen = [f / (r.latency_ms / 1e3) for f, r in zip(flops, members) if r.latency_ms > 0]
        rate = max([value, *seen])
        raised = f", raised to {_rate(rate, 'FLOP/s')} that a layer reached" if rate > value else ""
        total = sum(flops)
        floors.append(Floor(COMPUTE, 1e3 * total / rate, total, rate,
                            f"{total / 1e9:.4g} GFLOP at the {name} peak {_rate(value, 'FLOP/s')}{raised}",
                            len(members)))
    if not floors:
        return (f"compute floor: no compute peak measured in the dtypes of the bound's layers with FLOPs "
                f"({', '.join(sorted(without)) or 'none'})")
    return max(floors, key=lambda f: f.ms)


def work_floor(model: Model, rows: list[LayerRow], dtype: str, threads: int | None,
               one_thread: Iterable[Result] | None) -> Floor | str:
    """Σ work / threads over the layers with uncontended results at one thread and at the
    stack's threads (a contended one may be inflated, and the floor with it). The other layers
    add work, never less."""
    if not threads:
        return "work floor: the stack names no CPU threads (a GPU stack: this version measures no SM floor)"
    if one_thread is None:
        return ("work floor: no single-thread results of this stack (a layer's single-thread time is its work; "
                "`benanza run --threads 1` under the same system name measures them)")
    index = index_results(one_thread)
    work: list[float] = []
    scaled = 0  # layers whose core time at the stack's threads was below their single-thread time
    counted = sum(1 for r in rows if r.status == LayerStatus.OK)
    for row in rows:
        if row.status != LayerStatus.OK or row.contended:
            continue
        layer = model.nodes[row.index].layer
        results = layer_results(index, layer, dtype)
        dt = layer.in_dtype(dtype)
        if any(r.contended for r in candidates(results, dt)):
            continue
        chosen = best(results, dt)
        if chosen is not None:
            single, spread = float(chosen.latency_ms), threads * row.latency_ms  # type: ignore[arg-type]
            scaled += spread < single
            work.append(min(single, spread))
    if not work:
        return "work floor: none of the bound's layers has an uncontended single-thread result"
    total = math.fsum(work)
    faster = (f"; {scaled} ran more than {threads}× faster on {threads} threads, counted at {threads} × that time"
              if scaled else "")
    return Floor(WORK, total / threads, total, float(threads),
                 f"{total:.4g} ms of single-thread work ({len(work)} of {counted} layers{faster}) on {threads} thread"
                 + ("s" if threads > 1 else ""), len(work))


def resource_floors(model: Model, rows: list[LayerRow], dtype: str, critical_path_ms: float, peaks: Peaks | None,
                    peaks_absent: str, threads: int | None, one_thread: Iterable[Result] | None) -> Floors:
    """The floors of the bound's layers; ``peaks_absent`` says why there are no trusted peaks."""
    found: list[Floor | str] = []
    if peaks is None:
        found.append(f"memory and compute floors: {peaks_absent}")
    else:
        found += [memory_floor(model, rows, dtype, peaks), compute_floor(model, rows, dtype, peaks)]
    found.append(work_floor(model, rows, dtype, threads, one_thread))
    return Floors(critical_path_ms, tuple(f for f in found if isinstance(f, Floor)),
                  tuple(f for f in found if isinstance(f, str)))


def _bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def _rate(v: float, unit: str) -> str:
    return f"{v / 1e9:.4g} G{unit}"


__all__ = ["COMPUTE", "CRITICAL_PATH", "MEMORY", "WORK", "Floor", "Floors", "compute_floor", "memory_floor",
           "resource_floors", "weights", "work_floor"]
