"""Quantized layers as oneDNN runs them: ONNX MatMulInteger (u8/s8 activations, s8 weights, zero
points as oneDNN attributes, s32 accumulators) and QLinearMatMul (the same, requantized to int8
with the scales and the output's zero point); ConvInteger and QLinearConv, their convolution
twins; DynamicQuantizeLinear (the activations' per-tensor u8 quantization ONNX Runtime's
``quantize_dynamic`` writes before every MatMulInteger: a max and a min reduction, then a reorder
with the scale and zero point they give); QuantizeLinear / DequantizeLinear (reorders between
float and int8 with per-tensor or per-axis scales, as oneDNN applies scales to a reorder); and ONNX
Runtime's 4-bit MatMulNBits, keyed and counted (its MACs and packed weight bytes) though no library
here runs it.

Scales and zero points are run-time values in every benchmark (oneDNN's run-time attributes), as a
framework passes them; they are not part of the problems.

ONNX Runtime's float8 QDQ exports (QFLOAT8E4M3FN): the ``qdq_fp8_matmul`` pattern, DequantizeLinear →
MatMul → QuantizeLinear on FLOAT8E4M3FN data, is cuBLASLt's FP8 GEMM on the cudnn backend
(``kLtFp8``) and has no fused form on oneDNN (no float8 there); its QuantizeLinear and
DequantizeLinear stay generic layers, not covered on either backend.

On the GPU (the ``cudnn`` backend): MatMulInteger as cuBLASLt's int8 GEMM (``cublasLtMatmul``,
s8 operands, CUBLAS_COMPUTE_32I, s32 result; runtime_cpp/cudnn/blas.cpp says what it refuses and
what of a u8 activation's zero point it does not time), without weights' zero points (cuBLASLt
has none); QLinearMatMul as the same GEMM requantized in the call (an fp32 alpha, s8 result:
``kLtInt8Requant``; per-column weights' scales as an alpha vector over the output's columns,
``kLtInt8RequantPerColumn``; the output's zero point not in it);
QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear as cuDNN graph-API nodes (the
``quant`` table shared with Cast: cast.QuantLayer); ConvInteger and QLinearConv as one graph-API
int8 convolution each (the ``qconv`` table: INT8 NHWC data and weights, INT32 compute; an s32
result, or QLinearConv's scale and per-channel offset into s8; runtime_cpp/cudnn/graph.cpp says
what of the u8 zero points it leaves out), where their channels per group are multiples of 4
and the weights s8 without zero points.

ONNX Runtime's QDQ format around a Conv (the ``qdq_conv`` patterns: DequantizeLinear(u8) → Conv(·,
dequantized s8 weights[, dequantized int32 bias]) → QuantizeLinear(u8)) is QLinearConv's int8
convolution, benchmarked on the float Conv's key: oneDNN's (the qconv table, ``a_type`` byte) and
cuDNN's graph (the qconv table) where its channel rule allows.

Family names are none of an ONNX op's words, so the generic keys earlier versions stored for
these ops still read: ``qmatmul`` is QLinearMatMul, ``qconv`` QLinearConv, ``nbitsmatmul``
MatMulNBits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar

from .base import (
    CudnnLowering,
    Dims,
    Family,
    NodeFinder,
    NodeView,
    OnednnLowering,
    PatternLowering,
    const,
    is_4d,
    present,
    required,
)
from .binary import BinaryProblem
from .cast import CUDNN_QUANT, CUDNN_QUANT_TABLE, CUDNN_SOURCES, TYPE_WORDS, WORD_TYPES, QuantLayer, quant_row
from .conv import CUDNN_QCONV_TABLE, ConvParams, ConvProblem, QconvLayer, conv_fields, cudnn_row, onednn_row
from .gemm import CUDNN_BLAS, BlasLayer, MatMulProblem, matmul_operands
from .grammar import F, Problem
from .reference import Gen, Site, Slot, Spec, as_filled, as_scales, external_slot, fill, last_output, np_type

if TYPE_CHECKING:
    import numpy as np

    from ..fusion import FusionPattern
    from ..layers import Model, Node
    from ..records import Variant

INT8 = ("i8", "u8")


def _zero_points(view: NodeView, i: int) -> int:
    """How many zero-point values input ``i`` holds: 0 when it is omitted or a constant 0 (the
    symmetric quantization of weights), which is the computation without one."""
    if not present(view, i):
        return 0
    v = view.value(i)
    if v is not None and not v.any():
        return 0
    return math.prod(required(view, i).shape)


# --- MatMulInteger -------------------------------------------------------------------------

@dataclass(frozen=True)
class QMatMulProblem(Problem):
    """ONNX MatMulInteger: A (the layer's type, u8 or i8) times B into int32; ``signed_b``: B is
    s8; ``azp``/``bzp``: the number of A's/B's zero points (0: none, 1: per tensor, else per
    row of A / column of B). ``matmulint:a1x64_b64x64_ws1_azp1_u8``."""

    FAMILY: ClassVar[str] = "matmulint"
    KEY: ClassVar[tuple[tuple[F, ...], ...]] = (
        (F("a", "a", "dims"),), (F("b", "b", "dims"),), (F("ws", "signed_b", "bool"),),
        (F("azp", "azp", "int", 0),), (F("bzp", "bzp", "int", 0),))

    a: tuple[int, ...]
    b: tuple[int, ...]
    signed_b: bool
    azp: int = 0
    bzp: int = 0

    def macs(self) -> int:
        return MatMulProblem(self.a, self.b).macs()  # the same shapes' multiply-adds, in integers


@dataclass(frozen=True)
class QLinearMatMulProblem(QMatMulProblem):
    """ONNX QLinearMatMul: MatMulInteger's product requantized into u8 (``signed_y`` false) or
    s8 with the output's scale and zero point; ``bscales``: B's scales (1 per tensor, else per
    column). ``qmatmul:a1x64_b64x64_ws1_azp1_ys0``."""

    FAMILY: ClassVar[str] = "qmatmul"
    KEY: ClassVar[tuple[tuple[F, ...], ...]] = QMatMulProblem.KEY + (
        (F("ys", "signed_y", "bool"),), (F("bsc", "bscales", "int", 1),))

    signed_y: bool = False
    bscales: int = 1


def _qlinear_matmul_build(view: NodeView) -> Problem:
    a, b = matmul_operands(tuple(required(view, 0).shape), tuple(required(view, 3).shape))
    return QLinearMatMulProblem(a, b, required(view, 3).dtype == "i8", _zero_points(view, 2), _zero_points(view, 5),
                                view.outputs[0].dtype == "i8", math.prod(required(view, 4).shape))


def _qmatmul_build(view: NodeView) -> Problem:
    a, b = matmul_operands(tuple(required(view, 0).shape), tuple(required(view, 1).shape))
    return QMatMulProblem(a, b, required(view, 1).dtype == "i8", _zero_points(view, 2), _zero_points(view, 3))


def _qmatmul_onednn(p: Problem) -> str | None:
    assert isinstance(p, QMatMulProblem)
    # oneDNN's zero points are per tensor (A) or per tensor/per output column (B); ONNX's per-row
    # A zero points have no oneDNN attribute
    return "matmul" if p.azp <= 1 else None


# cuBLASLt's int8 GEMM (runtime_cpp/cudnn/blas.cpp, call kLtInt8)
LT_INT8 = "cublasLtMatmul"


def _qmatmul_cudnn(p: Problem) -> str | None:
    assert isinstance(p, QMatMulProblem)
    return LT_INT8 if _qmatmul_cudnn_gap(p) is None else None


def _qmatmul_cudnn_gap(p: QMatMulProblem) -> str | None:
    """Why cuBLASLt's int8 GEMM cannot run a MatMulInteger or a QLinearMatMul, or None."""
    if p.bzp:
        return "cuBLASLt's int8 GEMM has no weights' zero points"
    if p.azp > 1:
        return "cuBLASLt's int8 GEMM has no per-row activation zero points"
    if MatMulProblem(p.a, p.b).batch > 1:
        return "a batched integer MatMul: cuBLASLt's int8 GEMM is generated 2-D only"
    return None


def _qmatmul_uncovered(p: Problem, backend: str) -> str | None:
    assert isinstance(p, QMatMulProblem)
    return _qmatmul_cudnn_gap(p) if backend == "cudnn" else None


def _qlinear_matmul_call(p: QLinearMatMulProblem) -> str:
    """Per-column weights' scales make the requantization scale s_a·s_b[n]/s_y a vector over the
    output's columns: cuBLASLt's alpha as a device vector (blas.cpp), the scalar alpha's otherwise."""
    return "kLtInt8RequantPerColumn" if p.bscales > 1 else "kLtInt8Requant"


def _qmatmul_blas(p: QMatMulProblem | MatMulProblem, api: str) -> BlasLayer:
    """The 8-bit GEMM of MatMulInteger's shape (QLinearMatMul's too, whose call requantizes;
    the ``qdq_fp8_matmul`` pattern's MatMul, whose call is the FP8 GEMM); a u8 A (and a u8
    output) runs as the s8 data of the same bytes."""
    mm = MatMulProblem(p.a, p.b)
    return BlasLayer(m=mm.m, n=mm.n, k=mm.k, trans_a=False, trans_b=False, batch=1, a_count=1, b_count=1, alpha=1.0,
                     beta=0.0)


def _qdq_cudnn(p: Problem) -> str | None:
    assert isinstance(p, QdqProblem)
    return CUDNN_QUANT if WORD_TYPES[p.qtype] in CUDNN_SOURCES else None


def _qdq_cudnn_row(p: QdqProblem, api: str) -> QuantLayer:
    """(De)quantization as graph-API pointwise nodes: the scale (and zero point) of ``axis``
    broadcast into the tensor; QuantizeLinear's integer type is the row's ``source``."""
    scale = tuple(n if i == p.axis else 1 for i, n in enumerate(p.shape))
    op = "Dequantize" if isinstance(p, DequantProblem) else "Quantize"
    return quant_row(op, WORD_TYPES[p.qtype], p.shape, scale, p.zp)


@dataclass(frozen=True)
class QmatmulParams:
    """oneDNN QmatmulParams: A in the variant's type, B s8 (``signed_b``) or u8; the result s32
    (``out`` "int") or, requantized with the scales of A, B (``bscales`` of them) and the
    output and the output's zero point, a type word ("byte", "sbyte"). ``a_type``: A's type word
    (the ``qdq_matmul`` pattern, benchmarked on its float MatMul's variant), "" for the variant's."""

    a: Dims
    b: Dims
    signed_b: bool
    azp: int
    bzp: int
    out: str
    bscales: int
    a_type: str


def _qmatmul_row(p: QMatMulProblem, api: str) -> QmatmulParams:
    if isinstance(p, QLinearMatMulProblem):
        return QmatmulParams(a=p.a, b=p.b, signed_b=p.signed_b, azp=p.azp, bzp=p.bzp,
                             out="sbyte" if p.signed_y else "byte", bscales=p.bscales, a_type="")
    return QmatmulParams(a=p.a, b=p.b, signed_b=p.signed_b, azp=p.azp, bzp=p.bzp, out="int", bscales=1, a_type="")


def _qdq_matmul_row(p: MatMulProblem, api: str) -> QmatmulParams:
    """The ``qdq_matmul`` pattern (fusion.qdq_matmul_nodes: u8 activations with a zero point, s8
    weights without one, per-tensor scales, u8 output) as the QLinearMatMul it is."""
    return QmatmulParams(a=p.a, b=p.b, signed_b=True, azp=1, bzp=0, out="byte", bscales=1, a_type="byte")


# --- ConvInteger, QLinearConv ----------------------------------------------------------------

@dataclass(frozen=True)
class ConvIntProblem(ConvProblem):
    """ONNX ConvInteger: a 2-D convolution of int8 data (the layer's type) with s8 (``signed_b``)
    or u8 weights into int32; ``azp``/``bzp``: the zero points' counts (0: none or a constant
    0). ``convint:mb1_ic8ih8iw8_oc16oh8ow8_kh3kw3_sh1sw1_ph1pw1_dh1dw1_g1_bias0_ws1_azp1_u8``."""

    FAMILY: ClassVar[str] = "convint"
    KEY: ClassVar[tuple[tuple[F, ...], ...]] = ConvProblem.KEY + (
        (F("ws", "signed_b", "bool"),), (F("azp", "azp", "int", 0),), (F("bzp", "bzp", "int", 0),))

    signed_b: bool = True
    azp: int = 0
    bzp: int = 0


@dataclass(frozen=True)
class QLinearConvProblem(ConvIntProblem):
    """ONNX QLinearConv: ConvInteger plus its int32 bias (``bias``), requantized into u8
    (``signed_y`` false) or s8 with the output's scale and zero point; ``bscales``: the
    weights' scales (1 per tensor, else per output channel)."""

    FAMILY: ClassVar[str] = "qconv"
    KEY: ClassVar[tuple[tuple[F, ...], ...]] = ConvIntProblem.KEY + (
        (F("ys", "signed_y", "bool"),), (F("bsc", "bscales", "int", 1),))

    signed_y: bool = False
    bscales: int = 1


def _convint_build(view: NodeView) -> Problem:
    fields = conv_fields(view, weight=1, bias=4)  # ConvInteger has no bias (no input 4)
    return ConvIntProblem(**fields, signed_b=required(view, 1).dtype == "i8",  # type: ignore[arg-type]
                          azp=_zero_points(view, 2), bzp=_zero_points(view, 3))


def _qlinearconv_build(view: NodeView) -> Problem:
    fields = conv_fields(view, weight=3, bias=8)
    return QLinearConvProblem(**fields, signed_b=required(view, 3).dtype == "i8",  # type: ignore[arg-type]
                              azp=_zero_points(view, 2), bzp=_zero_points(view, 5),
                              signed_y=view.outputs[0].dtype == "i8", bscales=math.prod(required(view, 4).shape))


def _qconv_onednn(p: Problem) -> str | None:
    assert isinstance(p, ConvIntProblem)
    # oneDNN's convolutions take source zero points only (per tensor); weights' zero points
    # (ONNX allows them) have no oneDNN attribute
    return "convolution" if p.azp <= 1 and p.bzp == 0 else None


@dataclass(frozen=True)
class QconvParams(ConvParams):
    """oneDNN QconvParams: ConvParams' fields, then the int8 weights' signedness, the source's
    zero point and the result (``out``: "int" s32, or "byte"/"sbyte" requantized with the scales
    of the source, the weights (``bscales``) and the output, and its zero point). The variant's
    bias flag says whether QLinearConv adds its int32 bias. ``a_type``: the source's type word
    (the ``qdq_conv`` patterns, benchmarked on their float Conv's variant), "" for the variant's."""

    signed_b: bool
    azp: int
    out: str
    bscales: int
    a_type: str = ""


def _qconv_row(p: ConvIntProblem, api: str) -> QconvParams:
    out, bscales = ("sbyte" if p.signed_y else "byte", p.bscales) if isinstance(p, QLinearConvProblem) else ("int", 1)
    return QconvParams(**asdict(onednn_row(p, api)), signed_b=p.signed_b, azp=p.azp, out=out, bscales=bscales)


# cuDNN's int8 convolution on the graph API (runtime_cpp/cudnn/graph.cpp, the qconv table)
CUDNN_QCONV = "cudnn_frontend.qconv"


def _qconv_cudnn_gap(p: ConvIntProblem) -> str | None:
    """Why cuDNN's int8 convolution cannot run a ConvInteger or a QLinearConv, or None."""
    if p.bzp:
        return "cuDNN's int8 convolution has no weights' zero points"
    if not p.signed_b:
        return ("u8 weights: cuDNN's int8 convolution takes s8 weights, and a u8 weight's offset (128 times each "
                "window's sum of the input) is a second convolution, not an epilogue")
    cin, cout = p.ic // p.g, p.oc // p.g
    if cin % 4 or cout % 4:
        return (f"{cin} input and {cout} output channels per group: cuDNN's int8 convolutions take NHWC data with "
                f"channel counts that are multiples of 4 (TensorRT zero-pads channels into its vectorized formats: "
                f"a larger problem, not generated)")
    return None


def _qconv_cudnn(p: Problem) -> str | None:
    assert isinstance(p, ConvIntProblem)
    return CUDNN_QCONV if _qconv_cudnn_gap(p) is None else None


def _qconv_uncovered(p: Problem, backend: str) -> str | None:
    assert isinstance(p, ConvIntProblem)
    return _qconv_cudnn_gap(p) if backend == "cudnn" else None


def _qconv_cudnn_row(p: ConvIntProblem, api: str) -> QconvLayer:
    qlinear = p if isinstance(p, QLinearConvProblem) else None
    return QconvLayer(**asdict(cudnn_row(p, api)), requant=qlinear is not None,
                      bscales=qlinear.bscales if qlinear is not None else 1)


def _qdq_conv_row(bscales: Callable[[ConvProblem], int]) -> Callable[[ConvProblem, str], QconvParams]:
    """The ``qdq_conv`` patterns (qdq_conv_nodes: u8 activations with a zero point, s8 weights
    without one, the int32 bias where the Conv has one, a u8 output) as the QLinearConv they
    are; ``bscales``: the weights' scales, which the float Conv's key does not hold (the pattern
    does)."""
    return lambda p, api: QconvParams(**asdict(onednn_row(p, api)), signed_b=True, azp=1, out="byte",
                                      bscales=bscales(p), a_type="byte")


def _qdq_conv_cudnn_row(bscales: Callable[[ConvProblem], int]) -> Callable[[ConvProblem, str], QconvLayer]:
    """The same int8 convolution as cuDNN's graph (the qconv table, QLinearConv's requantizing
    epilogue)."""
    return lambda p, api: QconvLayer(**asdict(cudnn_row(p, api)), requant=True, bscales=bscales(p))


def _qdq_conv_cudnn_gap(p: ConvProblem) -> str | None:
    """QLinearConv's rule for the pattern's int8 convolution (s8 weights, no weights' zero point,
    as the pattern matches): channels per group multiples of 4."""
    return _qconv_cudnn_gap(QLinearConvProblem(**{f.name: getattr(p, f.name) for f in fields(ConvProblem)}))


# --- DynamicQuantizeLinear -----------------------------------------------------------------

@dataclass(frozen=True)
class DynQuantProblem(Problem):
    """ONNX DynamicQuantizeLinear of a float tensor into u8 with the scale and zero point its
    range gives: ``dynquant:in1x1x64_f32``. FLOPs: 3 per element (its max, its min, and the
    quantization's scale-round-shift, counted as one evaluation as an activation is)."""

    FAMILY: ClassVar[str] = "dynquant"
    KEY: ClassVar[tuple[tuple[F, ...], ...]] = ((F("in", "shape", "dims"),),)

    shape: tuple[int, ...]

    def flops(self) -> int:
        return 3 * math.prod(self.shape)


@dataclass(frozen=True)
class DynquantParams:
    """oneDNN DynquantParams: reductions to the max and min, then a u8 reorder with their scale
    and zero point (computed on the host between the calls, as ONNX Runtime's kernel does)."""

    shape: Dims


# --- QuantizeLinear / DequantizeLinear ------------------------------------------------------

@dataclass(frozen=True)
class QdqProblem(Problem):
    """A reorder between float and an integer type (``qtype``, a type word: ``sbyte``, ``byte``,
    ``int``) with scales per tensor (``axis`` None) or per slice of ``axis``, and a zero point
    where ``zp``: ``dequant:sbyte_in64x64_axis1_zp_f32``. FLOPs: one per element."""

    KEY: ClassVar[tuple[tuple[F, ...], ...]] = (
        (F("", "qtype", "word"),), (F("in", "shape", "dims"),), (F("axis", "axis", "int", None),),
        (F("zp", "zp", "flag", False),))

    qtype: str
    shape: tuple[int, ...]
    axis: int | None = None
    zp: bool = False

    def flops(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class QuantProblem(QdqProblem):
    FAMILY: ClassVar[str] = "quant"


@dataclass(frozen=True)
class DequantProblem(QdqProblem):
    FAMILY: ClassVar[str] = "dequant"


def _qdq_fields(view: NodeView, qtype: str) -> tuple[str, tuple[int, ...], int | None, bool]:
    shape = tuple(required(view, 0).shape)
    scale = required(view, 1)
    axis = int(view.attrs.get("axis", 1)) % max(len(shape), 1) if math.prod(scale.shape) > 1 else None
    return TYPE_WORDS[qtype], shape, axis, _zero_points(view, 2) > 0


def _quant_build(view: NodeView) -> Problem:
    # the output's type is the zero point's (u8 without one) or opset 21's output_dtype
    return QuantProblem(*_qdq_fields(view, view.outputs[0].dtype))


def _dequant_build(view: NodeView) -> Problem:
    return DequantProblem(*_qdq_fields(view, required(view, 0).dtype))


def _qdq_modelled(view: NodeView) -> bool:
    """Opset 21's blocked quantization (``block_size``) is not modelled, nor a quantized type
    Benanza has no name for (float8, 4-bit): those stay generic, named by their op."""
    if not view.outputs or view.attrs.get("block_size", 0):
        return False
    quantized = view.outputs[0].dtype if view.op == "QuantizeLinear" else required(view, 0).dtype
    return quantized in TYPE_WORDS


def _qdq_onednn(p: Problem) -> str | None:
    assert isinstance(p, QdqProblem)
    return "reorder" if p.qtype in ("sbyte", "byte", "int") else None


@dataclass(frozen=True)
class QdqParams:
    """oneDNN QdqParams: a reorder between the variant's float type and ``qtype`` (a type word),
    scales per tensor (``axis`` −1) or per ``axis``; ``dequantize``: from ``qtype``."""

    qtype: str
    shape: Dims
    axis: int
    zp: bool
    dequantize: bool


def _qdq_row(p: QdqProblem, api: str) -> QdqParams:
    return QdqParams(qtype=p.qtype, shape=p.shape, axis=-1 if p.axis is None else p.axis, zp=p.zp,
                     dequantize=isinstance(p, DequantProblem))


# --- MatMulNBits (ONNX Runtime's com.microsoft 4-bit blocked weights) --------------------------

@dataclass(frozen=True)
class NbitsMatMulProblem(Problem):
    """ONNX Runtime's MatMulNBits: A [.., K] (float) times a K×N weight packed in ``bits``-bit
    blocks of ``block`` along K, each block with its float scale (and zero point where ``zp``),
    dequantized on the fly: ``nbitsmatmul:m1k2048n2048_bits4block32_f32``. No library in use
    runs it (oneDNN's s4/u4 weight decompression came in 3.5; the oneDNN versions here are 2.6
    and 3.2): a named gap, its work and its bytes (the packed weights, which a decode step is
    bound by) still counted."""

    FAMILY: ClassVar[str] = "nbitsmatmul"
    KEY: ClassVar[tuple[tuple[F, ...], ...]] = (
        (F("m", "m"), F("k", "k"), F("n", "n")), (F("bits", "bits"), F("block", "block")),
        (F("zp", "zp", "flag", False),))

    m: int
    k: int
    n: int
    bits: int
    block: int
    zp: bool = False

    def macs(self) -> int:
        return self.m * self.k * self.n


def _nbits_build(view: NodeView) -> Problem:
    a = required(view, 0).shape
    at = view.attrs
    return NbitsMatMulProblem(m=math.prod(a[:-1]), k=int(at["K"]), n=int(at["N"]), bits=int(at.get("bits", 4)),
                              block=int(at["block_size"]), zp=present(view, 3))


def _has_nbits_attrs(view: NodeView) -> bool:
    return all(name in view.attrs for name in ("K", "N", "block_size"))


def _integer_feeds(site: Site, v: Variant, gen: Gen) -> dict[Slot, np.ndarray]:
    """The inputs of a quantized benchmark, typed as the node reads them, in the runtime's stream
    order (onednn.cpp: make_qmatmul, make_qconv, make_qdq)."""
    import numpy as np

    p = v.problem

    def feed(k: int, i: int, dtype: np.dtype[Any]) -> np.ndarray:
        return as_filled(gen(k, site.in_shape(0, i)), dtype)

    if isinstance(p, (QLinearMatMulProblem, QLinearConvProblem)):
        # x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp[, bias]
        a, b = np_type(v.dtype), np.dtype(np.int8 if p.signed_b else np.uint8)
        slots = [(0, a), (3, b)] + [(2, a)] * bool(p.azp) + [(5, b)] * bool(p.bzp)
        feeds = {(0, i): feed(k, i, t) for k, (i, t) in enumerate(slots)}
        k = len(slots)
        for i in (1, 4, 6):
            feeds[(0, i)] = as_scales(gen(k, site.in_shape(0, i)))
            k += 1
        feeds[(0, 7)] = feed(k, 7, np.dtype(np.int8 if p.signed_y else np.uint8))
        if isinstance(p, QLinearConvProblem) and p.bias:
            feeds[(0, 8)] = feed(k + 1, 8, np.dtype(np.int32))
        return feeds
    if isinstance(p, ConvIntProblem):  # x, w, x_zp, w_zp
        a, b = np_type(v.dtype), np.dtype(np.int8 if p.signed_b else np.uint8)
        slots = [(0, a), (1, b)] + [(2, a)] * bool(p.azp) + [(3, b)] * bool(p.bzp)
        return {(0, i): feed(k, i, t) for k, (i, t) in enumerate(slots)}
    if isinstance(p, QMatMulProblem):
        feeds = {(0, 0): feed(0, 0, np_type(v.dtype)),
                 (0, 1): feed(1, 1, np.dtype(np.int8 if p.signed_b else np.uint8))}
        k = 2
        for i, count in ((2, p.azp), (3, p.bzp)):
            if count:
                feeds[(0, i)] = feed(k, i, feeds[(0, i - 2)].dtype)
                k += 1
        return feeds
    assert isinstance(p, QdqProblem)
    qtype = np_type(WORD_TYPES.get(p.qtype, p.qtype))
    dequantize = p.family == "dequant"
    feeds = {(0, 0): feed(0, 0, qtype if dequantize else np_type(v.dtype)),
             (0, 1): as_scales(gen(1, site.in_shape(0, 1)))}
    if p.zp:
        feeds[(0, 2)] = feed(2, 2, qtype)
    return feeds


def _reference(site: Site, v: Variant, gen: Gen) -> Spec:
    return Spec(site.nodes, _integer_feeds(site, v, gen), (site.proto(0).output[0],))


def _dynquant_reference(site: Site, v: Variant, gen: Gen) -> Spec:
    """x; y, its scale and its zero point compared."""
    return Spec(site.nodes, fill(site, gen, [(0, 0)]), tuple(site.proto(0).output))


# int8 GEMMs, convolutions and reorders: one lowering each for the families they run
_QMATMUL = OnednnLowering("qmatmul", False, _qmatmul_row, reference=_reference)
_QDQ = OnednnLowering("qdq", False, _qdq_row, reference=_reference)
_QCONV = OnednnLowering("qconv", True, _qconv_row, reference=_reference)
MATMULINT = Family("matmulint", QMatMulProblem, ("MatMulInteger",), _qmatmul_build, onednn_api=_qmatmul_onednn,
                   onednn=_QMATMUL, int_dtypes=INT8, cudnn_api=_qmatmul_cudnn,
                   cudnn={LT_INT8: CudnnLowering(CUDNN_BLAS, _qmatmul_blas, "kLtInt8")}, uncovered=_qmatmul_uncovered)
QLINEARMATMUL = Family("qmatmul", QLinearMatMulProblem, ("QLinearMatMul",), _qlinear_matmul_build,
                       onednn_api=_qmatmul_onednn, onednn=_QMATMUL, int_dtypes=INT8, cudnn_api=_qmatmul_cudnn,
                       cudnn={LT_INT8: CudnnLowering(CUDNN_BLAS, _qmatmul_blas, _qlinear_matmul_call)},
                       uncovered=_qmatmul_uncovered)
DYNQUANT = Family("dynquant", DynQuantProblem, ("DynamicQuantizeLinear",),
                  lambda view: DynQuantProblem(tuple(required(view, 0).shape)), onednn_api=const("reduction+reorder"),
                  cudnn_api=const(CUDNN_QUANT),
                  cudnn={CUDNN_QUANT: CudnnLowering(CUDNN_QUANT_TABLE,
                                                    lambda p, api: quant_row("DynamicQuantize", "f32", p.shape))},
                  onednn=OnednnLowering("dynquant", False, lambda p, api: DynquantParams(shape=p.shape),
                                        reference=_dynquant_reference))
QUANT = Family("quant", QuantProblem, ("QuantizeLinear",), _quant_build, when=_qdq_modelled, onednn_api=_qdq_onednn,
               onednn=_QDQ, cudnn_api=_qdq_cudnn, cudnn={CUDNN_QUANT: CudnnLowering(CUDNN_QUANT_TABLE, _qdq_cudnn_row)})
DEQUANT = Family("dequant", DequantProblem, ("DequantizeLinear",), _dequant_build, when=_qdq_modelled,
                 onednn_api=_qdq_onednn, onednn=_QDQ, dtype=lambda view: view.outputs[0].dtype, cudnn_api=_qdq_cudnn,
                 cudnn={CUDNN_QUANT: CudnnLowering(CUDNN_QUANT_TABLE, _qdq_cudnn_row)})
_QCONV_CUDNN = {CUDNN_QCONV: CudnnLowering(CUDNN_QCONV_TABLE, _qconv_cudnn_row)}
CONVINT = Family("convint", ConvIntProblem, ("ConvInteger",), _convint_build, is_4d, onednn_api=_qconv_onednn,
                 onednn=_QCONV, int_dtypes=INT8, cudnn_api=_qconv_cudnn, cudnn=_QCONV_CUDNN,
                 uncovered=_qconv_uncovered)
QLINEARCONV = Family("qconv", QLinearConvProblem, ("QLinearConv",), _qlinearconv_build, is_4d,
                     onednn_api=_qconv_onednn, onednn=_QCONV, int_dtypes=INT8, cudnn_api=_qconv_cudnn,
                     cudnn=_QCONV_CUDNN, uncovered=_qconv_uncovered)
NBITS = Family("nbitsmatmul", NbitsMatMulProblem, ("MatMulNBits",), _nbits_build, when=_has_nbits_attrs)
def int_gemm_epilogue(anchor: Node, tail: Sequence[Node], activation: str) -> bool:
    """Whether an integer MatMul's tail is what oneDNN's int8 GEMM computes at once: a Cast of
    its int32 result to f32, a Mul by one scale (per tensor: the activations' scale times the
    weights'), and where the pattern has it an Add of a constant bias along the last axis."""
    out = anchor.layer.outputs[0].shape if anchor.layer.outputs else ()
    cast, mul = tail[0], tail[1]
    if not cast.layer.outputs or cast.layer.outputs[0].dtype != "f32":
        return False
    scale = mul.layer.problem
    if not isinstance(scale, BinaryProblem) or len(scale.shapes) != 2 or scale.out != tuple(out) \
            or min(math.prod(s) for s in scale.shapes) != 1:
        return False
    if len(tail) == 2:
        return True
    add = tail[2].layer.problem
    if not isinstance(add, BinaryProblem) or len(add.shapes) != 2 or not tail[2].constant_inputs \
            or add.out != tuple(out) or not out:
        return False
    bias = min(add.shapes, key=math.prod)
    return math.prod(bias) == out[-1] and bias[-1] == out[-1]


# ONNX's FLOAT8E4M3FN: cuBLASLt's CUDA_R_8F_E4M3, what ONNX Runtime's QFLOAT8E4M3FN quantization writes
FP8 = "f8e4m3fn"
PATTERNS: tuple[PatternLowering, ...] = (
    PatternLowering("qdq_matmul", onednn=("qmatmul", _qdq_matmul_row)),
    # one cuBLASLt FP8 GEMM (blas.cpp kLtFp8), on the MatMul's row
    PatternLowering("qdq_fp8_matmul", cudnn=CudnnLowering(CUDNN_BLAS, _qmatmul_blas, "kLtFp8"),
                    gaps={"onednn": "oneDNN 2.6 has no float8 data type (its dnnl_types.h lists f16, bf16, "
                                    "f32, s32, s8 and u8): the FP8 GEMM is cuBLASLt's only"}))
# the QDQ Conv as QLinearConv's int8 convolution: per-tensor weights' scales, or one per output channel
_PER_TENSOR: Callable[[ConvProblem], int] = lambda p: 1  # noqa: E731
_PER_CHANNEL: Callable[[ConvProblem], int] = lambda p: p.oc  # noqa: E731
PATTERNS += tuple(PatternLowering(name, onednn=("qconv", _qdq_conv_row(scales)),
                                  cudnn=CudnnLowering(CUDNN_QCONV_TABLE, _qdq_conv_cudnn_row(scales)),
                                  problem_gaps={"cudnn": _qdq_conv_cudnn_gap})
                  for name, scales in (("qdq_conv", _PER_TENSOR), ("qdq_conv_per_channel", _PER_CHANNEL)))


def int_gemm_reference(site: Site, v: Variant, gen: Gen, pattern: FusionPattern) -> Spec:
    """A, B, their zero points, then the Mul's scale and, where the pattern has it, the Add's
    bias."""
    feeds = _integer_feeds(site, v, gen)
    k = len(feeds)
    scale = external_slot(site, 2, 1)
    feeds[scale] = as_scales(gen(k, site.in_shape(*scale)))
    if "Add" in pattern.tail:
        bias = external_slot(site, 3, 2)
        feeds[bias] = gen(k + 1, site.in_shape(*bias))
    return Spec(site.nodes, feeds, last_output(site))


def qdq_matmul_reference(site: Site, v: Variant, gen: Gen, pattern: FusionPattern) -> Spec:
    """The runtime's streams (make_qmatmul, a QLinearMatMul): A u8, B s8, A's zero point, A's,
    B's and the output's scales, the output's zero point. B is the weights' DequantizeLinear's
    input (a folded node, so not in the match) and, with the scales and zero points, a
    constant, as in the model: ONNX Runtime then runs the pattern as it runs the model,
    through its int8 QLinearMatMul kernel. Fed as float weights it would run a float MatMul,
    exact where an int8 kernel without VNNI saturates u8·s8 pair sums at int16 (docs/quantized.md)."""
    import numpy as np

    full = site.with_producer(0, 1)
    u8 = np.dtype(np.uint8)
    constants = {(3, 0): as_filled(gen(1, full.in_shape(3, 0)), np.dtype(np.int8)),
                 (1, 2): as_filled(gen(2, site.in_shape(1, 2)), u8), (1, 1): as_scales(gen(3, site.in_shape(1, 1))),
                 (3, 1): as_scales(gen(4, full.in_shape(3, 1))), (2, 1): as_scales(gen(5, site.in_shape(2, 1))),
                 (2, 2): as_filled(gen(6, site.in_shape(2, 2)), u8)}
    weights = full.proto(3)
    return Spec(full.nodes, {(1, 0): as_filled(gen(0, site.in_shape(1, 0)), u8)}, last_output(site),
                f" and the weights' DequantizeLinear {weights.name or weights.output[0]!r} (weights, scales and zero "
                f"points constants, as in the model)", constants=constants)
def qdq_conv_reference(site: Site, v: Variant, gen: Gen, pattern: FusionPattern) -> Spec:
    """The runtime's streams (make_qconv, a QLinearConv with a u8 source): x u8, W s8, x's zero
    point, x's, W's (one or one per output channel) and the output's scales, the output's zero
    point, the int32 bias. W, its scales, the bias and its scale are the inputs of the folded
    DequantizeLinears (not in the match): constants, as in the model, so that ONNX Runtime runs
    the pattern as it runs the model (its QDQ Conv as QLinearConv). The bias's scale is sa·sb,
    what ``quantize_static`` writes and what makes its dequantized sum the int32 bias that
    QLinearConv adds to the accumulator (the benchmark's)."""
    import numpy as np

    p = v.problem
    assert isinstance(p, ConvProblem)
    full = site.with_producer(0, 1)
    u8 = np.dtype(np.uint8)
    sa, sb = as_scales(gen(3, site.in_shape(1, 1))), as_scales(gen(4, full.in_shape(3, 1)))
    constants = {(3, 0): as_filled(gen(1, full.in_shape(3, 0)), np.dtype(np.int8)),
                 (1, 2): as_filled(gen(2, site.in_shape(1, 2)), u8), (1, 1): sa, (3, 1): sb,
                 (2, 1): as_scales(gen(5, site.in_shape(2, 1))), (2, 2): as_filled(gen(6, site.in_shape(2, 2)), u8)}
    if p.bias:
        full = full.with_producer(0, 2)
        constants[(4, 0)] = as_filled(gen(7, full.in_shape(4, 0)), np.dtype(np.int32))
        constants[(4, 1)] = (sa.reshape(-1) * sb.reshape(-1)).astype(np.float32).reshape(full.in_shape(4, 1))
    folded = " and ".join(repr(full.proto(pos).name or full.proto(pos).output[0]) for pos in range(3, len(full.nodes)))
    return Spec(full.nodes, {(1, 0): as_filled(gen(0, site.in_shape(1, 0)), u8)}, last_output(site),
                f" and the folded DequantizeLinears {folded} (weights, scales, zero points and the int32 bias "
                f"constants, as in the model; the bias's scale sa·sb)", constants=constants)


FAMILIES = (MATMULINT, QLINEARMATMUL, CONVINT, QLINEARCONV, DYNQUANT, QUANT, DEQUANT, NBITS)


# --- fusion: the nodes of a QDQ MatMul in a model --------------------------------------------

def _qdq_matmul_chain(model: Model, consumers: dict[int, list[int]], start: int) -> tuple[int, int, int] | None:
    """The DequantizeLinear of x, the DequantizeLinear of W and the QuantizeLinear of the result
    around the MatMul ``start``: DequantizeLinear(x) → MatMul(·, W) → QuantizeLinear, W the
    dequantization of constant weights (folded: computed once, at load time), the MatMul's
    result read only by the QuantizeLinear and x's dequantization only by the MatMul; or None."""
    nodes, producer = model.nodes, model.producer
    mm = nodes[start]
    if not isinstance(mm.layer.problem, MatMulProblem) or len(mm.inputs) != 2:
        return None
    x, w = (producer.get(t) for t in mm.inputs)
    if x is None or w is None or len(consumers[start]) != 1:
        return None
    q = consumers[start][0]
    if (nodes[x].layer.op, nodes[w].layer.op, nodes[q].layer.op) != \
            ("DequantizeLinear", "DequantizeLinear", "QuantizeLinear"):
        return None
    if not nodes[w].folded or nodes[x].folded or consumers[x] != [start]:
        return None
    return x, w, q


def qdq_matmul_nodes(model: Model, consumers: dict[int, list[int]], start: int) -> list[int] | None:
    """The nodes of DequantizeLinear(u8 x) → MatMul(·, W) → QuantizeLinear(u8) from the MatMul
    (first, then the two), W the dequantization of constant s8 weights without a zero point,
    every scale per tensor; or None."""
    chain = _qdq_matmul_chain(model, consumers, start)
    if chain is None:
        return None
    dqx, dqw, quant = (model.nodes[i].layer.problem for i in chain)
    if not (isinstance(dqx, DequantProblem) and isinstance(dqw, DequantProblem) and isinstance(quant, QuantProblem)):
        return None
    if (dqx.qtype, dqx.axis, dqw.qtype, dqw.axis, dqw.zp, quant.qtype, quant.axis) != \
            ("byte", None, "sbyte", None, False, "byte", None):
        return None
    return [start, chain[0], chain[2]]


def qdq_fp8_matmul_nodes(model: Model, consumers: dict[int, list[int]], start: int) -> list[int] | None:
    """The nodes of DequantizeLinear(FLOAT8E4M3FN x) → MatMul(·, W) → QuantizeLinear(FLOAT8E4M3FN)
    from the MatMul (first, then the two), W the dequantization of constant FLOAT8E4M3FN weights,
    every scale per tensor (what ``quantize_static`` writes with QFLOAT8E4M3FN types in its QDQ
    format); or None. A float8 zero point is 0 by ONNX's definition, so none is looked at. Per-
    channel weights' scales are not matched: cuBLASLt's B scale here is one value."""
    chain = _qdq_matmul_chain(model, consumers, start)
    if chain is None:
        return None
    dqx, dqw, quant = (model.nodes[i].layer for i in chain)
    # opset 21's blocked quantization has a scale per block: more than one value
    per_tensor = all(len(la.inputs) > 1 and la.inputs[1].numel == 1 for la in (dqx, dqw, quant))
    if not per_tensor or (dqx.inputs[0].dtype, dqw.inputs[0].dtype, quant.outputs[0].dtype) != (FP8, FP8, FP8):
        return None
    return [start, chain[0], chain[2]]


# --- fusion: the nodes of a QDQ Conv in a model ----------------------------------------------

def qdq_conv_nodes(per_channel: bool) -> NodeFinder:
    """The finder of DequantizeLinear(u8 x) → Conv(·, W[, B]) → QuantizeLinear(u8) from the Conv
    (first, then the two), W the dequantization of constant s8 weights without a zero point, its
    scales per tensor or, ``per_channel``, one per output channel (axis 0); B, where the Conv has
    one, the dequantization of a constant int32 bias without a zero point (what ``quantize_static``
    writes, in its QDQ format); x's and the output's scales per tensor. A float bias is not matched
    (QLinearConv's is int32)."""

    def find(model: Model, consumers: dict[int, list[int]], start: int) -> list[int] | None:
        nodes, producer = model.nodes, model.producer
        conv = nodes[start]
        problem = conv.layer.problem
        # every input a data edge (Node.inputs lists those): x's, W's and B's DequantizeLinears
        if not isinstance(problem, ConvProblem) or len(consumers[start]) != 1 or \
                len(conv.inputs) != 2 + problem.bias:
            return None
        x, w = (producer.get(t) for t in conv.inputs[:2])
        b = producer.get(conv.inputs[2]) if problem.bias else None
        q = consumers[start][0]
        if x is None or w is None or (problem.bias and b is None):
            return None
        if nodes[x].folded or consumers[x] != [start] or not nodes[w].folded or (b is not None and not nodes[b].folded):
            return None
        dqx, dqw, quant = (nodes[i].layer.problem for i in (x, w, q))
        if not (isinstance(dqx, DequantProblem) and isinstance(dqw, DequantProblem)
                and isinstance(quant, QuantProblem)):
            return None
        scales = nodes[w].layer.inputs[1].numel if len(nodes[w].layer.inputs) > 1 else 0
        if (dqx.qtype, dqx.axis, dqw.qtype, dqw.zp, quant.qtype, quant.axis) != \
                ("byte", None, "sbyte", False, "byte", None):
            return None
        if (dqw.axis, scales) != ((0, problem.oc) if per_channel else (None, 1)):
            return None
        if b is not None:
            dqb = nodes[b].layer.problem
            if not isinstance(dqb, DequantProblem) or dqb.qtype != "int" or dqb.zp:
                return None
        return [start, x, q]

    return find
