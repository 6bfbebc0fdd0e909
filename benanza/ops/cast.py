"""ONNX Cast into a float type, family ``convert`` (the generic layers of other Casts keep
their ``cast:`` keys; a Cast to the type it already has is the generic module's identity): the
conversion a model writes around mixed-precision islands (an f32 RMSNorm in an f16 model), the
position ids turned into floats for rotary embeddings, and the int32 accumulators of an integer
MatMul turned into floats before their scale.

The layer computes in its output's type (that is the data it writes); the source type is part of
the problem. oneDNN runs it as a reorder between the two types; it has no 64-bit integers, f64 or
booleans, so a Cast from those is not covered. cuDNN: the graph API's pointwise IDENTITY node
reading the source's type and writing the variant's (``QuantLayer``, shared with the quantized
family's DequantizeLinear and DynamicQuantizeLinear: runtime_cpp/cudnn/graph.cpp), from the
types the graph API has (float, half, bfloat16, int64, int32, int8, uint8); f64 and booleans as
sources: not covered.

A Cast into bool is its own family, ``tobool`` (``tobool:long_in1x1x1x9_b``, a padding mask's
int64 turned into booleans): x ≠ 0, written as ONNX's one-byte bool. cuDNN: a CMP_NEQ node of x
with 0 (``QuantOp::NonZero``); oneDNN has no call for it (a u8 reorder saturates instead of
writing 0/1, and it has no int64): not covered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from .base import Cpp, CudnnLowering, CudnnTable, Dims, Family, NodeView, OnednnLowering, dims8, required
from .generic import same_cast
from .grammar import FLOAT_DTYPES, F, Problem
from .reference import Gen, Site, Spec, as_filled, np_type

if TYPE_CHECKING:
    from ..records import Variant

# source types a oneDNN reorder reads (oneDNN's data types, in ONNX's short names)
ONEDNN_SOURCES = ("f32", "bf16", "f16", "i32", "i8", "u8")

# a type as a key word (the grammar's words are letters only): C#'s names of the types
TYPE_WORDS = {"f32": "float", "f16": "half", "bf16": "bfloat", "f64": "double", "i8": "sbyte", "u8": "byte",
              "i16": "short", "u16": "ushort", "i32": "int", "u32": "uint", "i64": "long", "u64": "ulong",
              "b": "bool", "str": "string"}
WORD_TYPES = {w: t for t, w in TYPE_WORDS.items()}


@dataclass(frozen=True)
class CastProblem(Problem):
    """A conversion of ``shape`` elements from ``source`` (a type word, ``TYPE_WORDS``) into the
    layer's type: ``convert:int_in1x1x64_f32``."""

    FAMILY: ClassVar[str] = "convert"
    KEY: ClassVar[tuple[tuple[F, ...], ...]] = ((F("", "source", "word"),), (F("in", "shape", "dims"),))

    source: str
    shape: tuple[int, ...]

    def flops(self) -> int:
        return math.prod(self.shape)  # one conversion per element


def _converts(view: NodeView) -> bool:
    """A Cast into a float type from another type (the same type is the identity family's)."""
    # a type ONNX has and Benanza has no name for (float8) stays generic: named by its op
    return (bool(view.outputs) and view.outputs[0].dtype in FLOAT_DTYPES and not same_cast(view)
            and required(view, 0).dtype in TYPE_WORDS)


def _build(view: NodeView) -> Problem:
    source = required(view, 0)
    return CastProblem(TYPE_WORDS[source.dtype], tuple(source.shape))


@dataclass(frozen=True)
class ToBoolProblem(CastProblem):
    """A Cast into bool: x ≠ 0 for ``shape`` elements of ``source``, one byte each written."""

    FAMILY: ClassVar[str] = "tobool"


def _to_bool(view: NodeView) -> bool:
    return (bool(view.outputs) and view.outputs[0].dtype == "b" and not same_cast(view)
            and required(view, 0).dtype in TYPE_WORDS)


def _build_to_bool(view: NodeView) -> Problem:
    source = required(view, 0)
    return ToBoolProblem(TYPE_WORDS[source.dtype], tuple(source.shape))


def _onednn_api(p: Problem) -> str | None:
    assert isinstance(p, CastProblem)
    return "reorder" if WORD_TYPES[p.source] in ONEDNN_SOURCES else None


# --- cuDNN: quantization's element-wise layers on the graph API -----------------------------

CUDNN_QUANT = "cudnn_frontend.quant"
CUDNN_QUANT_TABLE = CudnnTable("quant", "add_quant", False, False)
# source types the graph API's tensors take (cudnn_frontend DataType_t), as tables.hpp DType
CUDNN_SOURCES = {"f32": "F32", "f16": "F16", "bf16": "BF16", "i8": "I8", "u8": "U8", "i32": "I32", "i64": "I64"}


@dataclass(frozen=True)
class QuantLayer:
    """cuDNN QuantLayer (graph API): ``op`` (QuantOp) on ``source``-typed ``in_`` (right-aligned to
    ``rank``); a dequantization's scale (and zero point where ``zp``) of shape ``scale`` broadcast
    into it."""

    op: Cpp
    source: Cpp
    zp: bool
    rank: int
    in_: Dims
    scale: Dims


def quant_row(op: str, source: str, shape: Dims, scale: Dims = (), zp: bool = False) -> QuantLayer:
    """The row of ``op`` (Convert, NonZero, Quantize, Dequantize, DynamicQuantize) of ``source``
    (a short type name, CUDNN_SOURCES: the type read, or the integer type Quantize writes)."""
    rank = max(4, len(shape))
    return QuantLayer(op=Cpp("QuantOp::" + op), source=Cpp("DType::" + CUDNN_SOURCES[source]), zp=zp, rank=rank,
                      in_=dims8(shape, rank, 1), scale=dims8(scale, rank, 1))


def _cudnn_api(p: Problem) -> str | None:
    assert isinstance(p, CastProblem)
    return CUDNN_QUANT if WORD_TYPES[p.source] in CUDNN_SOURCES else None


@dataclass(frozen=True)
class CastParams:
    """oneDNN CastParams: a reorder from ``from`` (a type word) into the variant's type."""

    from_: str
    shape: Dims


def _reference(site: Site, v: Variant, gen: Gen) -> Spec:
    """The source, typed as the node reads it (onednn.cpp: make_cast)."""
    p = v.problem
    assert isinstance(p, CastProblem)
    x = as_filled(gen(0, site.in_shape(0, 0)), np_type(WORD_TYPES[p.source]))
    return Spec(site.nodes, {(0, 0): x}, (site.proto(0).output[0],))


CAST = Family("convert", CastProblem, ("Cast",), _build, when=_converts, onednn_api=_onednn_api, cudnn_api=_cudnn_api,
              cudnn={CUDNN_QUANT: CudnnLowering(CUDNN_QUANT_TABLE,
                                                lambda p, api: quant_row("Convert", WORD_TYPES[p.source], p.shape))},
              onednn=OnednnLowering("cast", False, lambda p, api: CastParams(from_=p.source, shape=p.shape),
                                    reference=_reference),
              dtype=lambda view: view.outputs[0].dtype)
TO_BOOL = Family("tobool", ToBoolProblem, ("Cast",), _build_to_bool, when=_to_bool, cudnn_api=_cudnn_api,
                 cudnn={CUDNN_QUANT: CudnnLowering(CUDNN_QUANT_TABLE,
                                                   lambda p, api: quant_row("NonZero", WORD_TYPES[p.source], p.shape))},
                 dtype=lambda view: "b", int_dtypes=("b",))
FAMILIES = (CAST, TO_BOOL)
