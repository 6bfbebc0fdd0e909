"""GEMMs: ONNX Gemm and MatMul (cuBLAS GEMM/GEMV, oneDNN matmul and inner product)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from .base import CudnnLowering, CudnnTable, Dims, Family, NodeView, OnednnLowering, const, present, required
from .binary import BinaryProblem, broadcast
from .eltwise import EltwiseProblem
from .grammar import F, Problem, f32
from .reference import Fills, Gen, Site, Slot, Spec, external_slot, fill, last_output

if TYPE_CHECKING:
    from ..fusion import FusionPattern
    from ..layers import Node
    from ..records import Variant


@dataclass(frozen=True)
class GemmProblem(Problem):
    """ONNX Gemm: ``alpha·op(A)·op(B) + beta·C``; ``c`` is C's shape (None: no C, beta is 0)."""

    FAMILY: ClassVar[str] = "gemm"
    KEY: ClassVar[tuple[tuple[F, ...], ...]] = (
        (F("m", "m"), F("n", "n"), F("k", "k")), (F("ta", "ta", "bool"), F("tb", "tb", "bool")),
        (F("alpha", "alpha", "float"), F("beta", "beta", "float")), (F("c", "c", "dims", None),))

    m: int
    n: int
    k: int
    ta: bool
    tb: bool
    alpha: float
    beta: float
    c: tuple[int, ...] | None = None

    def macs(self) -> int:
        return self.m * self.n * self.k

    def flops(self) -> int:
        """2·m·n·k, the addition of C, and a multiply per output for alpha and beta ≠ 1."""
        out = self.m * self.n
        extra = (self.alpha != 1.0) + (self.c is not None) + (self.c is not None and self.beta not in (0.0, 1.0))
        return 2 * self.macs() + extra * out


@dataclass(frozen=True)
class MatMulProblem(Problem):
    """NumPy matmul of A and B (batched over leading dims, 1-D operands promoted)."""

    FAMILY: ClassVar[str] = "matmul"
    KEY: ClassVar[tuple[tuple[F, ...], ...]] = ((F("a", "a", "dims"),), (F("b", "b", "dims"),))

    a: tuple[int, ...]
    b: tuple[int, ...]

    @property
    def m(self) -> int:
        return self.a[-2] if len(self.a) > 1 else 1

    @property
    def k(self) -> int:
        return self.a[-1]

    @property
    def n(self) -> int:
        return self.b[-1] if len(self.b) > 1 else 1

    @property
    def batch(self) -> int:
        lead = broadcast((self.a[:-2], self.b[:-2]))
        return math.prod(lead)

    def macs(self) -> int:
        return self.m * self.n * self.k * self.batch



# --- recognition ---------------------------------------------------------------------------

def _gemm_build(view: NodeView) -> Problem:
    a_, b_ = required(view, 0).shape, required(view, 1).shape
    at = view.attrs
    ta, tb = bool(int(at.get("transA", 0))), bool(int(at.get("transB", 0)))
    m, k = (a_[1], a_[0]) if ta else (a_[0], a_[1])
    n = b_[0] if tb else b_[1]
    c = tuple(required(view, 2).shape) if present(view, 2) else None
    # Without C, beta multiplies nothing: Gemm(beta=0) and Gemm(beta=1) are one computation.
    beta = f32(at.get("beta", 1.0)) if c is not None else 0.0
    return GemmProblem(m=m, n=n, k=k, ta=ta, tb=tb, alpha=f32(at.get("alpha", 1.0)), beta=beta, c=c)


def _gemm_cudnn_api(p: Problem) -> str:
    assert isinstance(p, GemmProblem)
    return "cublasSgemv" if p.m == 1 or p.n == 1 else "cublasGemmEx"


def _gemm_onednn_api(p: Problem) -> str:
    assert isinstance(p, GemmProblem)
    fc = not p.ta and p.tb and (p.c is None or len(p.c) == 1)
    return "inner_product" if fc else "matmul"


def matmul_operands(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A MatMul's operands as the GEMM frameworks run. A weight without a batch of its own
    ([K, N], or [1, K, N]) broadcast over A's leading dims is one GEMM with M = their product:
    A's rows lie contiguous, and that is what frameworks run ([128, 1, 256]×[256, 768] is
    128×256×768, not 128 GEMMs with m=1). Only a B with its own batch makes a batched GEMM."""
    if len(a) >= 2 and len(b) >= 2 and math.prod(b[:-2]) == 1 and (len(a) > 2 or len(b) > 2):
        return (math.prod(a[:-1]), a[-1]), b[-2:]
    return a, b


def _matmul_build(view: NodeView) -> Problem:
    return MatMulProblem(*matmul_operands(tuple(required(view, 0).shape), tuple(required(view, 1).shape)))


def _matmul_cudnn_api(p: Problem) -> str:
    assert isinstance(p, MatMulProblem)
    if p.batch > 1:
        return "cublasGemmStridedBatchedEx"
    return "cublasSgemv" if p.m == 1 or p.n == 1 else "cublasGemmEx"


# --- lowerings -----------------------------------------------------------------------------

@dataclass(frozen=True)
class GemmParams:
    """oneDNN GemmParams (``inner_product``: run as oneDNN's inner product, a fully connected layer)."""

    m: int
    n: int
    k: int
    ta: bool
    tb: bool
    alpha: float
    beta: float
    has_c: bool
    c: Dims
    inner_product: bool


@dataclass(frozen=True)
class MatmulParams:
    """oneDNN MatmulParams."""

    a: Dims
    b: Dims


@dataclass(frozen=True)
class BlasLayer:
    """cuBLAS BlasLayer: ``batch`` GEMMs of which A and B have ``a_count``/``b_count`` (1: broadcast)."""

    m: int
    n: int
    k: int
    trans_a: bool
    trans_b: bool
    batch: int
    a_count: int
    b_count: int
    alpha: float
    beta: float


def _gemm_blas(p: GemmProblem, api: str) -> BlasLayer:
    # without C its beta is 0: nothing to accumulate
    return BlasLayer(m=p.m, n=p.n, k=p.k, trans_a=p.ta, trans_b=p.tb, batch=1, a_count=1, b_count=1, alpha=p.alpha,
                     beta=p.beta)


def _matmul_blas(p: MatMulProblem, api: str) -> BlasLayer:
    # batched over the leading dims, either operand possibly broadcast
    return BlasLayer(m=p.m, n=p.n, k=p.k, trans_a=False, trans_b=False, batch=p.batch, a_count=math.prod(p.a[:-2]),
                     b_count=math.prod(p.b[:-2]), alpha=1.0, beta=0.0)


CUDNN_BLAS = CudnnTable("blas", "add_blas", spatial=False, math=True)
_BLAS_CALLS = {"cublasGemmEx": "kGemmEx", "cublasGemmStridedBatchedEx": "kGemmStridedBatchedEx",
               "cublasSgemv": "kSgemv"}

def _gemm_reference(site: Site, v: Variant, gen: Gen) -> Spec:
    """A and B as the runtime fills them (logical m×k and k×n — n×k for an inner product — read
    through strides where transposed), C (the bias) unscaled: the runtime folds beta into C."""
    import numpy as np

    p = v.problem
    assert isinstance(p, GemmProblem)
    a = gen(0, (p.m, p.k))
    if v.api == "inner_product":
        b = gen(1, (p.n, p.k))
    else:
        b = gen(1, (p.k, p.n))
        b = b.T if p.tb else b
    feeds = {(0, 0): np.ascontiguousarray(a.T if p.ta else a), (0, 1): np.ascontiguousarray(b)}
    if p.c is not None and p.beta != 0.0:
        feeds[(0, 2)] = (gen(2, p.c) / np.float32(p.beta)).reshape(site.in_shape(0, 2))
    return Spec(site.nodes, feeds, (site.proto(0).output[0],))


GEMM = Family("gemm", GemmProblem, ("Gemm",), _gemm_build, cudnn_api=_gemm_cudnn_api, onednn_api=_gemm_onednn_api,
              cudnn={api: CudnnLowering(CUDNN_BLAS, _gemm_blas, call) for api, call in _BLAS_CALLS.items()},
              onednn=OnednnLowering("gemm", False, lambda p, api: GemmParams(
                  m=p.m, n=p.n, k=p.k, ta=p.ta, tb=p.tb, alpha=p.alpha, beta=p.beta, has_c=p.c is not None,
                  c=p.c or (), inner_product=api == "inner_product"), reference=_gemm_reference), exact=True)
MATMUL = Family("matmul", MatMulProblem, ("MatMul",), _matmul_build, cudnn_api=_matmul_cudnn_api,
                onednn_api=const("matmul"),
                cudnn={api: CudnnLowering(CUDNN_BLAS, _matmul_blas, call) for api, call in _BLAS_CALLS.items()},
                onednn=OnednnLowering("matmul", False, lambda p, api: MatmulParams(a=p.a, b=p.b),
                                      reference=Fills(lambda p: (0, 1))), exact=True)
FAMILIES = (GEMM, MATMUL)


# --- fusion: what a GEMM's epilogue computes -------------------------------------------------

def gemm_epilogue(anchor: Node, tail: Sequence[Node], activation: str) -> bool:
    """Whether a MatMul's tail is what a GEMM epilogue computes: an Add of a constant bias along
    the output's last axis (shape [N] or [1, N]), then the pattern's activation (GELU in its erf
    form, or ReLU)."""
    gemm = anchor.layer.problem
    assert isinstance(gemm, MatMulProblem)
    add = tail[0].layer.problem
    if not isinstance(add, BinaryProblem) or len(add.shapes) != 2 or not tail[0].constant_inputs:
        return False
    # the GEMM's output is [M, N] or, for a broadcast weight, [..., N] with M rows in all
    data, bias = add.shapes
    if add.out != tuple(data) or math.prod(data) != gemm.m * gemm.n or not data or data[-1] != gemm.n:
        return False
    if math.prod(bias) != gemm.n or not bias or bias[-1] != gemm.n:
        return False
    return all(isinstance(n.layer.problem, EltwiseProblem) and n.layer.problem.alg == activation for n in tail[1:])


def epilogue_reference(site: Site, v: Variant, gen: Gen, pattern: FusionPattern) -> Spec:
    """A GEMM with a bias epilogue (mm_bias, its activations): A, B, then the Add's bias."""
    slots: list[Slot] = [(0, 0), (0, 1), external_slot(site, 1, 0)]
    return Spec(site.nodes, fill(site, gen, slots), last_output(site))
