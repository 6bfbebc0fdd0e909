"""LLM inference phases: the bound of a prefill (S tokens, empty KV cache) or a decode step (one
token after a KV cache of length L), tokens/s at the bound, and what each layer's time is spent on.

A phase is a set of input shapes: the KV-cache inputs (``past…``/``…cache…``, float, rank ≥ 3)
get the cache length on their one symbolic axis, every other symbolic non-batch axis the new
tokens (S, or 1 in a decode step), except an axis named as a sum (``past + seq``, dynamo's
``s0 + s1``) or as a total (``total``, ``total_sequence_length``), which gets cache + new tokens.
The model is then processed and analysed at those shapes as ``--input-shape`` would.

Per layer of the bound, the shares of its time (docs/analyze.md, "Phases"): the layer's roofline
times from the stack's peaks, compute c = FLOPs / compute peak and memory m (its compulsory bytes at
the bandwidth of the cache level they fit in); compute gets c / (c + m), and m / (c + m) is split
over the bytes it reads and writes by where they come from: weights (initializers, and constants
folded from them; a copy such as the embedding Gather reads at most what it writes of its
table), the KV cache (the past inputs and what data movement — views, copies, Concat with the new
token's K/V, transposes, casts — makes of them: the present K/V that attention reads), and
activations (the rest). The shares say which resource's demand the layer's time follows; they are
an attribution from the roofline, not a measurement. Without trusted peaks only the byte shares
are given.

Those layers are the unfused bound's: each node's own tensors, so under grouped-query attention
repeat_kv's copies (G times K's and V's bytes written, then read by the scores' and PV MatMuls)
count as KV-cache bytes wherever they are moved. ``fused_bytes`` splits the bytes of the same
layers with every fusion pattern the matcher finds run as one call (reading the tensors its
nodes take from outside it, writing those read outside it): what a runtime that fuses moves,
whether or not the fused benchmark measured faster here (the bytes are the fusion plan's, not
the bound's). A fused attention reads K and V once per KV head; the copies it never makes count
nothing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import ModelError, UsageError
from ..fusion import match_fusions
from ..layers import DTYPE_NAMES, FLOAT_DTYPES, Model, TensorSpec
from ..ops.copy import CopyProblem
from .bounds import LayerStatus
from .roofline import spec_bytes

if TYPE_CHECKING:
    from ..analyzer import Analysis

PREFILL, DECODE = "prefill", "decode"
_SPEC = re.compile(r"^(prefill|decode):([1-9][0-9]*|0)$")
_KV_NAME = re.compile(r"past|cache", re.IGNORECASE)
_TOTAL_NAME = re.compile(r"total", re.IGNORECASE)
# families that move data without computing on it: a KV tensor stays KV through them
_MOVEMENT = frozenset({"copy", "concat", "transpose", "convert"})
SHARES = ("compute", "weights", "kv_cache", "activations")


@dataclass(frozen=True)
class Phase:
    kind: str  # PREFILL | DECODE
    length: int  # prefill: the tokens S; decode: the KV-cache length L

    @property
    def new_tokens(self) -> int:
        return self.length if self.kind == PREFILL else 1

    @property
    def past(self) -> int:
        return 0 if self.kind == PREFILL else self.length

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.length}"


def parse_phase(spec: str) -> Phase:
    m = _SPEC.match(spec.strip())
    if m is None:
        raise UsageError(f"--phase {spec!r}: expected prefill:S (S tokens, empty KV cache) or decode:L (one token "
                         f"after a KV cache of length L), S ≥ 1, L ≥ 0")
    phase = Phase(m.group(1), int(m.group(2)))
    if phase.kind == PREFILL and phase.length == 0:
        raise UsageError(f"--phase {spec!r}: a prefill has at least one token")
    return phase


@dataclass(frozen=True)
class GraphInput:
    """One input of the ONNX graph as declared: its dims (ints, or the symbols' names)."""

    name: str
    dims: tuple[int | str, ...]
    dtype: str  # short name (benanza.layers.DTYPE_NAMES)

    @property
    def kv(self) -> bool:
        """A KV-cache input: named past/cache, float, with a head and a length axis at least."""
        return bool(_KV_NAME.search(self.name)) and self.dtype in FLOAT_DTYPES and len(self.dims) >= 3


@dataclass(frozen=True)
class PhaseInputs:
    """A phase applied to one model: the shapes it gives the inputs, and which are the KV cache."""

    phase: Phase
    batch_size: int
    shapes: tuple[tuple[str, tuple[int, ...]], ...]  # sorted, as SweepRequest.input_shapes
    inputs: tuple[GraphInput, ...]
    kv_inputs: frozenset[str]


def phase_shapes(path: str, inputs: Sequence[GraphInput], phase: Phase, batch: int,
                 given: Mapping[str, tuple[int, ...]]) -> PhaseInputs:
    """The concrete shape of every input with a symbolic axis in ``phase`` (an input in ``given``,
    the user's ``--input-shape``, keeps that). Raises ModelError naming ``path`` where the model
    has no sequence axis, or no variable KV cache for a decode step."""
    kv = [i for i in inputs if i.kv]
    past_syms = {d for i in kv for d in i.dims[1:] if isinstance(d, str)}
    if phase.kind == DECODE and not kv:
        raise ModelError(path, f"--phase {phase.label}: no KV-cache inputs (float inputs named past…/…cache… of "
                               f"rank ≥ 3; inputs: {_listing(inputs)}): a decode step needs its cache as inputs")
    if kv and len(past_syms) != 1:
        what = "a fixed length" if not past_syms else f"{len(past_syms)} symbolic axes ({', '.join(sorted(past_syms))})"
        raise ModelError(path, f"--phase {phase.label}: the KV-cache inputs have {what} ({_listing(kv)}): "
                               f"export them with one dynamic past-length axis")
    past = next(iter(past_syms), None)
    seq_axes = 0
    shapes: dict[str, tuple[int, ...]] = {}
    for i in inputs:  # an input whose every axis is fixed needs no shape
        if i.name in given or not any(isinstance(d, str) for d in i.dims):
            continue
        dims = []
        for axis, d in enumerate(i.dims):
            if isinstance(d, int):
                dims.append(d)
            elif axis == 0:
                dims.append(batch)
            else:
                value, is_seq = _dim(d, past, phase)
                seq_axes += is_seq
                dims.append(value)
        shapes[i.name] = tuple(dims)
    if not seq_axes:
        raise ModelError(path, f"--phase {phase.label}: no input has a symbolic sequence axis (inputs: "
                               f"{_listing(inputs)}): export the model with a dynamic sequence length")
    return PhaseInputs(phase, batch, tuple(sorted({**given, **shapes}.items())), tuple(inputs),
                       frozenset(i.name for i in kv))


def _dim(symbol: str, past: str | None, phase: Phase) -> tuple[int, bool]:
    """A symbolic axis's length in ``phase``, and whether it counts the new tokens."""
    if symbol == past:
        return phase.past, False
    terms = [t.strip() for t in symbol.split("+")]
    if len(terms) > 1:  # past + seq, s0 + s1, past_sequence_length + 1
        return sum(int(t) if t.isdigit() else phase.past if t == past else phase.new_tokens for t in terms), True
    if _TOTAL_NAME.search(symbol):
        return phase.past + phase.new_tokens, True
    return phase.new_tokens, True


def _listing(inputs: Iterable[GraphInput]) -> str:
    return ", ".join(f"{i.name} [{', '.join(map(str, i.dims))}]" for i in inputs) or "none"


@dataclass(frozen=True)
class LayerShare:
    """What one layer of the bound spends its time on (see the module's docstring)."""

    index: int
    name: str
    op: str
    latency_ms: float
    flops: int
    weight_bytes: int
    kv_bytes: int
    activation_bytes: int
    compute_ms: float | None  # the roofline's compute time (None: no roofline, or no compute peak in its dtype)
    memory_ms: float | None  # the roofline's memory time (None: no roofline)

    @property
    def bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes + self.activation_bytes

    def byte_shares(self) -> dict[str, float]:
        total = self.bytes or 1
        return {"weights": self.weight_bytes / total, "kv_cache": self.kv_bytes / total,
                "activations": self.activation_bytes / total}

    def time_shares(self) -> dict[str, float] | None:
        """Shares of the layer's time: compute, then memory split by bytes (sum 1); None without a roofline."""
        if self.memory_ms is None or (self.compute_ms is None and self.flops):
            return None
        c, m = self.compute_ms or 0.0, self.memory_ms
        if c + m <= 0:
            return None
        memory = m / (c + m)
        return {"compute": c / (c + m), **{k: memory * v for k, v in self.byte_shares().items()}}


@dataclass(frozen=True)
class ByteSplit:
    """Bytes moved, by where they come from (see the module's docstring)."""

    weights: int
    kv_cache: int
    activations: int

    def as_dict(self) -> dict[str, int]:
        return {"weights": self.weights, "kv_cache": self.kv_cache, "activations": self.activations}


@dataclass(frozen=True)
class PhaseAnalysis:
    phase: Phase
    sequential_ms: float
    parallel_ms: float
    partial: bool  # some layer has no result: the bound is lower still
    layers: tuple[LayerShare, ...]  # the layers of the bound (status ok), by node index
    roofline: bool  # time shares computed (trusted peaks stored for the stack)
    fused_bytes: ByteSplit  # the layers' bytes with every matched fusion pattern one call

    @property
    def tokens_per_s_sequential(self) -> float | None:
        return self.phase.new_tokens / (self.sequential_ms / 1e3) if self.sequential_ms > 0 else None

    @property
    def tokens_per_s_parallel(self) -> float | None:
        return self.phase.new_tokens / (self.parallel_ms / 1e3) if self.parallel_ms > 0 else None

    def attributed_ms(self) -> dict[str, float] | None:
        """The sequential bound split by the layers' time shares (None without a roofline, or when
        a layer has none: then no split would add up to the bound)."""
        shares = [(la.latency_ms, la.time_shares()) for la in self.layers]
        if not self.roofline or any(s is None for _, s in shares):
            return None
        return {k: math.fsum(ms * s[k] for ms, s in shares if s is not None) for k in SHARES}

    def bytes_by_source(self) -> dict[str, int]:
        return {"weights": sum(la.weight_bytes for la in self.layers),
                "kv_cache": sum(la.kv_bytes for la in self.layers),
                "activations": sum(la.activation_bytes for la in self.layers)}


@dataclass(frozen=True)
class _Sources:
    """Where a model's tensors come from at the phase's shapes: their specs, the KV-cache ones
    (the cache inputs and what data movement makes of them) and the folded constants."""

    spec: dict[str, TensorSpec]
    kv: frozenset[str]
    folded: frozenset[str]
    dtype: str

    def split(self, reads: Sequence[str], writes: Sequence[str], constants: Iterable[TensorSpec], copy: bool
              ) -> tuple[int, int, int]:
        """(weight, KV-cache, activation) bytes of a call reading ``reads`` and the constants and
        writing ``writes``; a copy reads at most what it writes of a constant."""
        nbytes = {t: spec_bytes(self.spec[t], self.dtype) for t in (*reads, *writes) if t in self.spec}
        constant = sum(spec_bytes(s, self.dtype) for s in constants)
        constant += sum(nbytes.get(t, 0) for t in reads if t in self.folded)
        written = sum(nbytes.get(t, 0) for t in writes)
        weights = min(constant, written) if copy else constant
        kv_bytes = sum(b for t, b in nbytes.items() if t in self.kv)
        activations = sum(b for t, b in nbytes.items() if t not in self.kv and t not in self.folded)
        return weights, kv_bytes, activations


def _sources(applied: PhaseInputs, model: Model, dtype: str) -> _Sources:
    declared = {i.name: i.dtype for i in applied.inputs}
    spec: dict[str, TensorSpec] = {n: TensorSpec(s, declared.get(n, "f32")) for n, s in model.input_shapes.items()}
    for node in model.nodes:
        if len(node.outputs) == len(node.layer.outputs):
            spec.update(zip(node.outputs, node.layer.outputs))
    kv = set(applied.kv_inputs)
    folded: set[str] = set()
    for node in model.nodes:  # topological: a KV tensor's producer comes first
        if node.folded:
            folded.update(node.outputs)
        elif (node.free or node.layer.family in _MOVEMENT) and any(t in kv for t in node.inputs):
            kv.update(node.outputs)
    return _Sources(spec, frozenset(kv), frozenset(folded), dtype)


def _fused_bytes(model: Model, src: _Sources, layers: Sequence[LayerShare]) -> ByteSplit:
    """The bytes of ``layers`` with each fusion pattern the matcher finds one call: reading the
    tensors its nodes read from outside it (and their constants) and writing the tensors it
    makes that a node outside it reads or that none reads (the graph's outputs), each once."""
    readers: dict[str, set[int]] = {}
    for node in model.nodes:
        for t in node.inputs:
            readers.setdefault(t, set()).add(node.index)
    matches = match_fusions(model)
    fused = {i for m in matches for i in m.nodes}
    rest = [la for la in layers if la.index not in fused]
    split = [(la.weight_bytes, la.kv_bytes, la.activation_bytes) for la in rest]
    for m in matches:
        inside = set(m.nodes)
        made = dict.fromkeys(t for i in m.nodes for t in model.nodes[i].outputs)
        reads = list(dict.fromkeys(t for i in m.nodes for t in model.nodes[i].inputs if t not in made))
        writes = [t for t in made if not readers.get(t) or readers[t] - inside]
        split.append(src.split(reads, writes, [s for i in m.nodes for s in model.nodes[i].constant_specs], False))
    return ByteSplit(*(sum(col) for col in zip(*split))) if split else ByteSplit(0, 0, 0)


def phase_analysis(applied: PhaseInputs, analysis: Analysis, model: Model) -> PhaseAnalysis:
    """``analysis``: the analysis of ``model`` processed at the phase's shapes."""
    src = _sources(applied, model, analysis.dtype)
    roofs = {r.index: r.roof for r in analysis.speed_of_light.layers} if analysis.speed_of_light else {}
    out = []
    for row in analysis.rows:
        if row.status != LayerStatus.OK:
            continue
        node = model.nodes[row.index]
        weights, kv_bytes, activations = src.split(node.inputs, node.outputs, node.constant_specs,
                                                   isinstance(node.layer.problem, CopyProblem))
        rf = roofs.get(row.index)
        out.append(LayerShare(row.index, row.name, row.op, row.latency_ms, node.layer.flops, weights, kv_bytes,
                              activations, None if rf is None else rf.compute_ms, None if rf is None else rf.memory_ms))
    b = analysis.bounds
    return PhaseAnalysis(applied.phase, b.sequential_ms, b.parallel_ms, b.partial, tuple(out), bool(roofs),
                         _fused_bytes(model, src, out))


def graph_inputs(graph) -> list[GraphInput]:
    """The declared inputs of an ONNX ``GraphProto`` that are not initializers."""
    weights = {t.name for t in graph.initializer}
    out = []
    for vi in graph.input:
        if vi.name in weights:
            continue
        t = vi.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim)
        out.append(GraphInput(vi.name, dims, DTYPE_NAMES.get(t.elem_type, str(t.elem_type))))
    return out


__all__: Sequence[str] = ("DECODE", "PREFILL", "ByteSplit", "GraphInput", "LayerShare", "Phase", "PhaseAnalysis",
                          "PhaseInputs", "graph_inputs", "parse_phase", "phase_analysis", "phase_shapes")
