"""Rotary position embeddings (RoPE): ONNX RotaryEmbedding (opset 23), ONNX Runtime's
com.microsoft RotaryEmbedding, and the fused form of the rotate-half decomposition that
Hugging Face's Llama/Qwen2/Phi code exports (the ``rope`` pattern of ``benanza.fusion``:
x·cos + Concat(−x[½:], x[:½])·sin, benchmarked on its Mul by sin).

One problem for all three: x's first ``rot`` features of its last dim rotate in pairs (a, b) ↦
(a·cos − b·sin, b·cos + a·sin), with a, b the two halves of those features (the rotate-half
form) or adjacent features (``interleaved``); features past ``rot`` are copied. ``cs`` is the
shape of the cos (and of the sin) values one call reads, right-aligned to x's rank: last dim
``rot`` where each half has its own (the decomposition's Concat(freqs, freqs)), ``rot``/2 where
both halves share them (the ops' caches, gathered by position). No library has a rotary
primitive: oneDNN runs four binary primitives over the halves (runtime_cpp/onednn: make_rope),
cuDNN one graph of pointwise nodes (runtime_cpp/cudnn/graph.cpp).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from ..errors import NodeError
from .base import (
    CudnnLowering,
    CudnnTable,
    Dims,
    Family,
    NodeView,
    OnednnLowering,
    PatternLowering,
    align,
    const,
    dims8,
    present,
    required,
)
from .binary import BinaryProblem
from .copy import ConcatProblem, CopyProblem
from .eltwise import EltwiseProblem
from .grammar import F, Problem
from .reference import Gen, NoReference, Site, Spec, fill, last_output

if TYPE_CHECKING:
    from ..fusion import FusionPattern
    from ..layers import Model
    from ..records import Variant

# the cuDNN graph API's pointwise nodes of one rotation (runtime_cpp/cudnn/graph.cpp)
CUDNN_ROPE = "cudnn_frontend.rope"


@dataclass(frozen=True)
class RopeProblem(Problem):
    """x (rank 4: [B, heads, S, D] or [B, S, heads, D]) rotated over its first ``rot`` features by
    cos and sin of shape ``cs`` each."""

    FAMILY: ClassVar[str] = "rope"
    KEY: ClassVar[tuple[tuple[F, ...], ...]] = (
        (F("x", "x", "dims"),), (F("cs", "cs", "dims"),), (F("rot", "rot"),),
        (F("interleaved", "interleaved", "flag", False),))

    x: tuple[int, ...]
    cs: tuple[int, ...]
    rot: int
    interleaved: bool = False

    def flops(self) -> int:
        """Per rotated feature two products and one sum (the rotation's sign is the sum's)."""
        return 3 * math.prod(self.x[:-1]) * self.rot

    def compulsory_bytes(self, inputs: int, outputs: int) -> int:
        """x read and written once, and the cos and sin values the call uses once each: not the
        whole cache an op gathers them from, nor the position ids (a few integers per token)."""
        size = outputs // max(math.prod(self.x), 1)
        return size * (2 * math.prod(self.x) + 2 * math.prod(self.cs))


# --- recognition ---------------------------------------------------------------------------

def _caches(view: NodeView) -> tuple[int, int | None]:
    """(cos cache's input index, position ids' or None): ONNX Runtime's op takes (input,
    position_ids, cos_cache, sin_cache), opset 23's (X, cos_cache, sin_cache[, position_ids]);
    the integer position ids tell them apart."""
    second = view.inputs[1] if present(view, 1) else None
    if second is not None and second.dtype.startswith(("i", "u")):
        return 2, 1
    return 1, 3 if present(view, 3) else None


def _rope_build(view: NodeView) -> Problem:
    x = required(view, 0)
    ci, pi = _caches(view)
    cos = required(view, ci)
    half = cos.shape[-1]
    rot = int(view.attrs.get("rotary_embedding_dim", 0)) or 2 * half
    if rot != 2 * half:
        raise NodeError(f"rotary_embedding_dim {rot} is not twice the cos cache's last dim {half}")
    pos = view.inputs[pi] if pi is not None else None
    # the rows of cos/sin one call reads: one per (batch, token) of 2-d position ids or of a
    # [B, S, rot/2] cache; one per token when ONNX Runtime's ids are a single offset
    rows = pos.shape[0] if pos is not None and len(pos.shape) == 2 else 1 if pos is not None else cos.shape[0]
    interleaved = bool(int(view.attrs.get("interleaved", 0)))
    if len(x.shape) == 4:
        b, n, s, _ = x.shape
        return RopeProblem(tuple(x.shape), (rows, 1, s, half), rot, interleaved)
    if len(x.shape) != 3:
        raise NodeError(f"input 0 has {len(x.shape)} dims, RotaryEmbedding takes 3 or 4")
    b, s, hidden = x.shape
    heads = int(view.attrs.get("num_heads", 0))
    head = hidden // heads if heads else rot
    if head * (hidden // head) != hidden:
        raise NodeError(f"hidden size {hidden} is no multiple of the head size {head}")
    return RopeProblem((b, s, hidden // head, head), (rows, s, 1, half), rot, interleaved)


# --- lowerings -----------------------------------------------------------------------------

@dataclass(frozen=True)
class RopeParams:
    """oneDNN RopeParams."""

    x: Dims
    cs: Dims
    rot: int
    interleaved: bool


def _onednn_row(p: RopeProblem, api: str) -> RopeParams:
    return RopeParams(x=p.x, cs=align(p.cs, len(p.x)), rot=p.rot, interleaved=p.interleaved)


@dataclass(frozen=True)
class RopeLayer:
    """cuDNN RopeLayer (graph API pointwise nodes); dims padded to 8 as the runtime's."""

    rank: int
    x: Dims
    cs: Dims
    rot: int
    interleaved: bool


def _cudnn_row(p: RopeProblem, api: str) -> RopeLayer:
    rank = len(p.x)
    return RopeLayer(rank=rank, x=dims8(p.x, rank, 1), cs=dims8(align(p.cs, rank), rank, 1), rot=p.rot,
                     interleaved=p.interleaved)


CUDNN_ROPE_TABLE = CudnnTable("rope", "add_rope", False, False)


def _reference(site: Site, v: Variant, gen: Gen) -> Spec:
    """x, then cos and sin as the benchmark fills them (``cs``, one row per (batch, token)),
    written into the op's caches at the rows that ids 0, 1, … pick; the ids are those."""
    import numpy as np

    p = v.problem
    assert isinstance(p, RopeProblem)
    proto = site.proto(0)
    ci, pi = (2, 1) if proto.domain == "com.microsoft" else (1, 3 if len(proto.input) > 3 and proto.input[3] else None)
    tokens = math.prod(p.cs) // p.cs[-1]
    feeds = {(0, 0): gen(0, site.in_shape(0, 0))}
    for k, i in ((1, ci), (2, ci + 1)):
        values = gen(k, p.cs).reshape(tokens, p.cs[-1])
        shape = site.in_shape(0, i)
        if pi is None:
            feeds[(0, i)] = values.reshape(shape)
            continue
        if shape[0] < tokens:
            raise NoReference(f"the cache holds {shape[0]} positions, the benchmark reads {tokens}")
        cache = np.zeros(shape, np.float32)
        cache[:tokens] = values
        feeds[(0, i)] = cache
    if pi is not None:
        ids = site.in_shape(0, pi)
        feeds[(0, pi)] = np.arange(math.prod(ids), dtype=np.int64).reshape(ids)
    return Spec(site.nodes, feeds, (proto.output[0],))


# the ops: opset 23's RotaryEmbedding and ONNX Runtime's (its own input order)
ROPE = Family("rope", RopeProblem, ("RotaryEmbedding",), _rope_build, lambda v: len(v.outputs) == 1,
              cudnn_api=const(CUDNN_ROPE), onednn_api=const("binary"),
              cudnn={CUDNN_ROPE: CudnnLowering(CUDNN_ROPE_TABLE, _cudnn_row)},
              onednn=OnednnLowering("rope", False, _onednn_row, reference=_reference))
FAMILIES = (ROPE,)


def _decomposition(p: BinaryProblem) -> RopeProblem:
    """The rotation the ``rope`` pattern computes, from its Mul of the rotated halves by sin
    (operands in canonical order: x's shape first, then sin's)."""
    x, sin = p.shapes[0], p.shapes[-1]
    return RopeProblem(tuple(x), align(sin, len(x)), x[-1])


PATTERNS = (PatternLowering("rope", onednn=("rope", lambda p, api: _onednn_row(_decomposition(p), api)),
                            cudnn=CudnnLowering(CUDNN_ROPE_TABLE, lambda p, api: _cudnn_row(_decomposition(p), api))),)


def pattern_reference(site: Site, v: Variant, gen: Gen, pattern: FusionPattern) -> Spec:
    """x (the Mul by cos's data input, sixth in the match), cos (that Mul's other input), sin (the
    anchor's input that is not the Concat)."""
    cat = site.proto(4).output[0]
    x = site.proto(1).input[0]
    m1 = site.proto(5)
    slots = [(5, list(m1.input).index(x)), (5, 1 - list(m1.input).index(x)), (0, site.external(0, cat))]
    return Spec(site.nodes, fill(site, gen, slots), last_output(site))


# --- fusion: the nodes of the rotate-half decomposition in a model --------------------------

def rope_nodes(model: Model, consumers: dict[int, list[int]], start: int) -> list[int] | None:
    """The nodes of x·cos + Concat(Neg(x[½:]), x[:½])·sin (last axis, one Slice per half) from its
    Mul by sin, in the order [that Mul, Slice(first half), Slice(second half), Neg, Concat,
    Mul(x, cos), Add]; or None. Every intermediate is read only inside the pattern; cos and sin
    have one shape."""
    nodes, producer = model.nodes, model.producer
    anchor = nodes[start]
    p = anchor.layer.problem
    if not isinstance(p, BinaryProblem) or p.alg != "mul" or len(p.shapes) != 2:
        return None

    def made(t: str, op: str, reader: int) -> int | None:
        i = producer.get(t)
        return i if i is not None and nodes[i].layer.op == op and consumers[i] == [reader] else None

    cat = next((i for i in (made(t, "Concat", start) for t in anchor.inputs) if i is not None), None)
    if cat is None or len(nodes[cat].inputs) != 2:
        return None
    joined = nodes[cat].layer.problem
    rank = len(p.shapes[0])
    if not isinstance(joined, ConcatProblem) or joined.axis not in (-1, rank - 1):
        return None
    neg = made(nodes[cat].inputs[0], "Neg", cat)
    low = made(nodes[cat].inputs[1], "Slice", cat)
    high = made(nodes[neg].inputs[0], "Slice", neg) if neg is not None else None
    if neg is None or low is None or high is None or not isinstance(nodes[neg].layer.problem, EltwiseProblem):
        return None
    x = nodes[low].inputs[0] if nodes[low].inputs else None
    d = p.shapes[0][-1]
    for i, at in ((low, 0), (high, d // 2)):
        box = nodes[i].layer.problem
        if not isinstance(box, CopyProblem) or box.how != "region" or box.src is None \
                or nodes[i].inputs[:1] != (x,) or len(box.outs) != 1 or box.src[-1] != d or box.outs[0][-1] != d // 2 \
                or box.offsets[0][-1] != at or any(box.offsets[0][:-1]) or box.outs[0][:-1] != box.src[:-1]:
            return None
    add = consumers[start]
    if d % 2 or len(add) != 1 or nodes[add[0]].layer.op != "Add" or len(nodes[add[0]].inputs) != 2:
        return None
    other = next((t for t in nodes[add[0]].inputs if t not in anchor.outputs), None)
    m1 = made(other, "Mul", add[0]) if other is not None else None
    if m1 is None or x not in nodes[m1].inputs or nodes[m1].layer.problem != p:
        return None
    return [start, low, high, neg, cat, m1, add[0]]
