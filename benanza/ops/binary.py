"""Element-wise binary and n-ary ops with broadcasting (ONNX Add, Sub, Mul, Div, Min, Max, Sum,
Pow, Equal, Greater, Less, And, Or).

And and Or take booleans only (a padding mask's And with the causal mask). ONNX stores a bool
as one byte, 0 or 1, as frameworks do, so on oneDNN they are its binary primitive on u8:
``binary_min`` for And and ``binary_max`` for Or, which equal them exactly on 0/1 (min(a, b) is
1 only where both are 1; max where either is), writing u8 0/1. cuDNN: its graph API's pointwise
``LOGICAL_AND`` / ``LOGICAL_OR`` with a boolean compute type, as the cuDNN frontend's own SDPA
builds its padding mask (``scaled_dot_product_flash_attention.h``), on ``BYTE_BOOLEAN`` tensors:
the one-byte boolean of cuDNN 9.25+ (the frontend's ``BOOLEAN`` is one bit per element, not
ONNX's byte), in the variant type ``b``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from .base import Cpp, CudnnLowering, CudnnTable, Dims, DimsList, Family, NodeView, OnednnLowering, align, dims8
from .grammar import F, Problem, f32
from .reference import Gen, NoReference, Site, Spec, as_filled, fill

if TYPE_CHECKING:
    from ..records import Variant
    from .gemm import MatmulParams

# the cuDNN graph API's single pointwise node (runtime_cpp/cudnn/graph.cpp), for the element-wise
# ops the legacy API lacks
CUDNN_POINTWISE = "cudnn_frontend.pointwise"
CUDNN_POINTWISE_BINARY = ("div", "pow", "eq", "gt", "lt", "and", "or")

COMMUTATIVE = ("add", "mul", "min", "max", "sum", "eq", "and", "or")


def broadcast(shapes: tuple[tuple[int, ...], ...]) -> tuple[int, ...]:
    """NumPy/ONNX multidirectional broadcasting of the shapes."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for axis in range(rank):
        dims = {s[axis - rank + len(s)] for s in shapes if axis - rank + len(s) >= 0}
        big = dims - {1}
        out.append(max(big) if big else 1)
    return tuple(out)


@dataclass(frozen=True)
class BinaryProblem(Problem):
    """Element-wise binary (n-ary for Sum) with broadcasting. Operands of commutative ops are in
    canonical order (``canonical_operands``); ``exponent`` is Pow's constant uniform exponent.
    The comparisons (``eq``, ``gt``, ``lt``) write booleans; ``and``, ``or`` read and write them."""

    FAMILY: ClassVar[str] = "binary"
    KEY: ClassVar[tuple[tuple[F, ...], ...]] = (
        (F("", "alg", "word"),), (F("in", "shapes", "shapes"),), (F("exp", "exponent", "float", None),))

    alg: str
    shapes: tuple[tuple[int, ...], ...]
    exponent: float | None = None

    @property
    def out(self) -> tuple[int, ...]:
        return broadcast(self.shapes)

    def flops(self) -> int:
        return max(len(self.shapes) - 1, 1) * math.prod(self.out)  # n inputs: n − 1 ops per output


def canonical_operands(alg: str, shapes: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
    """Operands of a commutative op in one order: those with the output's shape first, then by
    rank and dims; ``Add(x, b)`` and ``Add(b, x)`` are one problem."""
    if alg not in COMMUTATIVE:
        return shapes
    out = broadcast(shapes)
    return tuple(sorted(shapes, key=lambda s: (tuple(s) != out, -len(s), tuple(s))))



# --- recognition ---------------------------------------------------------------------------

_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Min": "min", "Max": "max",
           "Sum": "sum", "Pow": "pow", "Equal": "eq", "Greater": "gt", "Less": "lt", "And": "and", "Or": "or"}


def _binary_build(view: NodeView) -> Problem:
    import numpy as np

    alg = _BINARY[view.op]
    shapes = tuple(tuple(t.shape) for t in view.inputs if t is not None)
    exponent = None
    if alg == "pow":
        # x^2 and x^0.5 are different computations (a library may square instead of exp/log);
        # a constant uniform exponent is part of the problem, a tensor of exponents is data.
        v = view.value(1)
        if v is not None and v.size and np.all(v == v.reshape(-1)[0]):
            exponent = f32(v.reshape(-1)[0])
    return BinaryProblem(alg, canonical_operands(alg, shapes), exponent)


def _cudnn_api(p: Problem) -> str | None:
    assert isinstance(p, BinaryProblem)
    shapes, out = p.shapes, p.out
    if len(shapes) != 2 or len(out) > 5:
        return None
    if p.alg == "mul" and any(math.prod(s) == 1 for s in shapes):
        return "cudnnScaleTensor"
    if p.alg in ("add", "sum") and tuple(shapes[0]) == out and _broadcasts_into(shapes[1], out):
        return "cudnnAddTensor"
    if p.alg in ("add", "sum", "sub", "mul", "min", "max"):
        return "cudnnOpTensor"
    if p.alg in CUDNN_POINTWISE_BINARY:
        return CUDNN_POINTWISE
    return None


def _broadcasts_into(small: tuple[int, ...], big: tuple[int, ...]) -> bool:
    small = (1,) * (len(big) - len(small)) + tuple(small)
    return len(small) == len(big) and all(s in (1, b) for s, b in zip(small, big))


def _onednn_api(p: Problem) -> str | None:
    assert isinstance(p, BinaryProblem)
    if p.alg == "sum":
        return "sum" if all(s == p.out for s in p.shapes) else "binary"
    if p.alg == "pow":
        # x^c with a constant uniform exponent is oneDNN's eltwise pow; a tensor of exponents
        # has no oneDNN call
        return "eltwise" if p.exponent is not None and tuple(p.shapes[0]) == p.out else None
    return "matmul" if outer_product(p) is not None else "binary"


def outer_product(p: BinaryProblem) -> tuple[int, int] | None:
    """A Mul whose operands both broadcast into the output, one [..., M, 1] and the other
    [..., 1, N] (right-aligned to the output's rank, at least 2; batch dims equal or 1): the
    outer products oneDNN's matmul computes with K = 1 (it broadcasts the batch dims of either
    operand), one product per output and no sum, so exactly ONNX's. The operands' order as the
    matmul's source and weights; None for any other problem (oneDNN's binary primitive
    broadcasts only its second source, so no binary call computes a layer whose operands both
    broadcast)."""
    if p.alg != "mul" or len(p.shapes) != 2 or len(p.out) < 2:
        return None
    a, b = (align(s, len(p.out)) for s in p.shapes)
    if p.out in (a, b):
        return None
    if a[-1] == 1 and b[-2] == 1:
        return 0, 1
    if b[-1] == 1 and a[-2] == 1:
        return 1, 0
    return None



# --- lowerings -----------------------------------------------------------------------------

@dataclass(frozen=True)
class BinaryParams:
    """oneDNN BinaryParams (a constant Pow is oneDNN's eltwise pow, in this table too): the
    operands in the order of the primitive's sources; ``swapped``: the problem's are the other
    way round, and the runtime mirrors the operation (onednn.cpp: ``mirrored``)."""

    alg: str
    inputs: DimsList
    out: Dims
    exponent: float
    swapped: bool


def onednn_swapped(p: BinaryProblem) -> bool:
    """Whether oneDNN runs a two-operand problem with its operands swapped: its binary primitive
    broadcasts only its second source, so a first operand that broadcasts into the output goes
    second when the other operand has the output's shape; an outer product's matmul takes its
    [..., M, 1] operand first. Not a part of the key: ``Sub(1, x)`` stays ``binary:sub_in1_in…``
    on every backend."""
    if p.alg == "pow" or len(p.shapes) != 2:
        return False
    outer = outer_product(p)
    if outer is not None:
        return outer == (1, 0)
    rank = max(len(p.out), 1)
    out = align(p.out, rank)
    return align(p.shapes[0], rank) != out and align(p.shapes[1], rank) == out


def _onednn_row(p: BinaryProblem, api: str) -> BinaryParams:
    exponent = float("nan") if p.exponent is None else p.exponent
    swapped = onednn_swapped(p)
    return BinaryParams(alg=p.alg, inputs=p.shapes[::-1] if swapped else p.shapes, out=p.out, exponent=exponent,
                        swapped=swapped)


def _outer_product_row(p: BinaryProblem, api: str) -> MatmulParams:
    """The matmul family's row of an outer product: [..., M, 1] times [..., 1, N], both at the
    output's rank (the runtime reads a 1-d operand as a vector)."""
    from .gemm import MatmulParams  # at call time: gemm.py imports this module

    outer = outer_product(p)
    assert outer is not None
    src, weights = (align(p.shapes[i], len(p.out)) for i in outer)
    return MatmulParams(a=src, b=weights)


_BINARY_OPS = {"add": "Add", "sum": "Add", "sub": "Sub", "mul": "Mul", "min": "Min", "max": "Max"}


@dataclass(frozen=True)
class BinaryLayer:
    """cuDNN BinaryLayer (cudnnAddTensor, cudnnOpTensor, cudnnScaleTensor): operands and output
    of ``rank`` dims, padded to 5."""

    op: Cpp
    swapped: bool
    rank: int
    a: Dims
    b: Dims
    out: Dims


def _cudnn_row(p: BinaryProblem, api: str) -> BinaryLayer:
    shapes, out = p.shapes, p.out
    rank = max(4, len(out))
    a, b, o = align(shapes[0], rank), align(shapes[1], rank), align(out, rank)
    if api == "cudnnAddTensor":
        op = "AddTensor"
    elif api == "cudnnScaleTensor":
        op = "Scale"
    else:
        op = _BINARY_OPS[p.alg]
    # cuDNN scales / adds into the operand that has the output's shape: put it first.
    swapped = a != o and b == o if op != "Scale" else math.prod(a) == 1
    if swapped:
        a, b = b, a
    pad = (0,) * (5 - rank)
    return BinaryLayer(op=Cpp("BinaryOp::" + op), swapped=swapped, rank=rank, a=a + pad, b=b + pad, out=o + pad)


_POINTWISE_OPS = {"div": "Div", "pow": "Pow", "eq": "CmpEq", "gt": "CmpGt", "lt": "CmpLt", "erf": "Erf",
                  "gelu": "Gelu", "gelutanh": "GeluTanh", "exp": "Exp", "log": "Log", "abs": "Abs", "neg": "Neg",
                  "softplus": "Softplus", "reciprocal": "Reciprocal", "cos": "Cos", "sin": "Sin",
                  "hardsigmoid": "HardSigmoid", "and": "And", "or": "Or", "isnan": "IsNan"}


@dataclass(frozen=True)
class PointwiseLayer:
    """cuDNN PointwiseLayer (graph API): one pointwise node (HardSigmoid: its short chain),
    operands broadcast into ``out``; ``alpha``, ``beta``: HardSigmoid's, 0 for the others."""

    op: Cpp
    binary: bool
    rank: int
    a: Dims
    b: Dims
    out: Dims
    alpha: float
    beta: float


def pointwise_row(alg: str, a: Dims, b: Dims | None, out: Dims, alpha: float = 0.0,
                  beta: float = 0.0) -> PointwiseLayer:
    """A pointwise node of ``alg`` over A (and B for a binary op)."""
    rank = max(4, len(out))  # the frontend broadcasts either operand into the output
    return PointwiseLayer(op=Cpp("PointwiseOp::" + _POINTWISE_OPS[alg]), binary=b is not None, rank=rank,
                          a=dims8(a, rank, 1), b=dims8(b, rank, 1) if b is not None else dims8((), 0, 0),
                          out=dims8(out, rank, 1), alpha=alpha, beta=beta)


def _pointwise_cudnn(p: BinaryProblem, api: str) -> PointwiseLayer:
    a, b = p.shapes
    return pointwise_row(p.alg, a, b, p.out)


def _operand_order(p: BinaryProblem, shapes: list[Dims]) -> list[int]:
    """The ONNX input of each of the benchmark's operands: the problem's canonical order, then
    the lowering's swap (``onednn_swapped``)."""
    order = list(range(len(shapes)))
    out = broadcast(tuple(shapes))
    if p.alg in COMMUTATIVE:
        order.sort(key=lambda i: (tuple(shapes[i]) != out, -len(shapes[i]), tuple(shapes[i])))
    if [tuple(shapes[i]) for i in order] != [tuple(s) for s in p.shapes]:
        raise NoReference("the node's operands do not give the problem's")
    return order[::-1] if onednn_swapped(p) else order


def _reference(site: Site, v: Variant, gen: Gen) -> Spec:
    """The operands in the benchmark's order (booleans where the layer's are); Pow's exponent
    stays the model's constant."""
    p = v.problem
    assert isinstance(p, BinaryProblem)
    if p.alg == "pow":
        feeds = fill(site, gen, [(0, 0)])
    else:
        shapes = [site.in_shape(0, i) for i in range(len(site.proto(0).input))]
        feeds = fill(site, gen, [(0, i) for i in _operand_order(p, shapes)])
    if v.dtype == "b":  # booleans as the runtime fills them
        import numpy as np

        feeds = {slot: as_filled(x, np.dtype(np.bool_)) for slot, x in feeds.items()}
    return Spec(site.nodes, feeds, (site.proto(0).output[0],))


CUDNN_BINARY = CudnnTable("binary", "add_binary", False, False)
CUDNN_POINTWISE_TABLE = CudnnTable("pointwise", "add_pointwise", False, False)

BINARY = Family("binary", BinaryProblem, tuple(_BINARY), _binary_build,
                cudnn_api=_cudnn_api, onednn_api=_onednn_api,
                cudnn={**{api: CudnnLowering(CUDNN_BINARY, _cudnn_row)
                          for api in ("cudnnAddTensor", "cudnnOpTensor", "cudnnScaleTensor")},
                       CUDNN_POINTWISE: CudnnLowering(CUDNN_POINTWISE_TABLE, _pointwise_cudnn)},
                onednn=OnednnLowering("binary", False, _onednn_row, reference=_reference,
                                      via={"matmul": ("matmul", _outer_product_row)}),
                int_dtypes=("b",), exact=True)
FAMILIES = (BINARY,)
