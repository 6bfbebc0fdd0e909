"""Reductions (ONNX ReduceMean/Sum/Max/Min/Prod/L1/L2) over constant axes."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from .base import Cpp, CudnnLowering, CudnnTable, Dims, Family, NodeView, OnednnLowering, dims8, present, required
from .grammar import F, Problem
from .reference import Fills


@dataclass(frozen=True)
class ReduceProblem(Problem):
    """A reduction (``alg``: mean, sum, max, min, prod, sumabs = ReduceL1, sqrtsumsq = ReduceL2;
    words without digits, which keys cannot hold) over sorted non-negative ``axes``;
    keepdims only relabels the output's shape and is not part of the problem."""

    FAMILY: ClassVar[str] = "reduce"
    KEY: ClassVar[tuple[tuple[F, ...], ...]] = (
        (F("", "alg", "word"),), (F("in", "shape", "dims"),), (F("axes", "axes", "dims"),))

    alg: str
    shape: tuple[int, ...]
    axes: tuple[int, ...]

    def flops(self) -> int:
        """Every input element is read once: one add (compare, multiply) each, two for the
        norms (|x| or x² before the add); per output, the mean's division or L2's square root."""
        out = math.prod(d for i, d in enumerate(self.shape) if i not in self.axes)
        per_input = 2 if self.alg in ("sumabs", "sqrtsumsq") else 1
        return per_input * math.prod(self.shape) + (out if self.alg in ("mean", "sqrtsumsq") else 0)



def _axes_inner(p: ReduceProblem) -> tuple[str, ...]:
    """oneDNN's optimized reductions take the reduced axes innermost; over others of a row-major
    tensor only its reference code runs (a mean over axis 1 of 1×16×4×2100: 2.8 ms ``ref:any``).
    ``axis_inner``: reordered with the axes innermost and reduced there, the reorder timed."""
    rank = len(p.shape)
    return ("axis_inner",) if p.axes != tuple(range(rank - len(p.axes), rank)) else ()


# --- recognition ---------------------------------------------------------------------------

_REDUCE = {"ReduceMean": "mean", "ReduceSum": "sum", "ReduceMax": "max", "ReduceMin": "min",
           "ReduceProd": "prod", "ReduceL1": "sumabs", "ReduceL2": "sqrtsumsq"}
# ReduceSum takes its axes as an input from opset 13 on, the others from opset 18 on.
_AXES_INPUT_FROM = {"ReduceSum": 13}


def _reduce_axes(view: NodeView) -> tuple[int, ...] | None:
    """Sorted non-negative axes; all of them when none are given. None: the axes are a run-time
    tensor, or an empty list with noop_with_empty_axes (the identity)."""
    rank = len(required(view, 0).shape)
    if view.opset >= _AXES_INPUT_FROM.get(view.op, 18):
        if present(view, 1):
            v = view.value(1)
            if v is None:
                return None
            axes = [int(a) for a in v.reshape(-1)]
        else:
            axes = []
        if not axes and int(view.attrs.get("noop_with_empty_axes", 0)):
            return None
    else:
        axes = [int(a) for a in view.attrs.get("axes") or []]
    return tuple(sorted({a + rank if a < 0 else a for a in axes} or range(rank)))


def _reduce_build(view: NodeView) -> Problem:
    axes = _reduce_axes(view)
    assert axes is not None  # registered only where the axes are known
    return ReduceProblem(_REDUCE[view.op], tuple(required(view, 0).shape), axes)


def _onednn_api(p: Problem) -> str | None:
    assert isinstance(p, ReduceProblem)
    return "reduction" if 1 <= len(p.shape) <= 5 else None  # oneDNN reductions take ranks 1-5


def _cudnn_api(p: Problem) -> str | None:
    assert isinstance(p, ReduceProblem)
    return "cudnnReduceTensor" if 1 <= len(p.shape) <= 8 else None  # cuDNN tensors take ranks up to 8


# --- lowerings -----------------------------------------------------------------------------

@dataclass(frozen=True)
class ReduceParams:
    """oneDNN ReduceParams."""

    alg: str
    shape: Dims
    axes: Dims


_REDUCE_OPS = {"sum": "Add", "mean": "Avg", "max": "Max", "min": "Min", "prod": "Mul",
               "sumabs": "Norm1", "sqrtsumsq": "Norm2"}


@dataclass(frozen=True)
class ReduceLayer:
    """cuDNN ReduceLayer: src and dst of ``rank`` dims, padded to 8."""

    op: Cpp
    rank: int
    src: Dims
    dst: Dims


def _cudnn_row(p: ReduceProblem, api: str) -> ReduceLayer:
    rank = max(4, len(p.shape))
    # keepdims only relabels the output: cuDNN's C keeps every reduced axis as 1
    out = tuple(1 if i in p.axes else d for i, d in enumerate(p.shape))
    return ReduceLayer(op=Cpp("ReduceOp::" + _REDUCE_OPS[p.alg]), rank=rank, src=dims8(p.shape, rank, 1),
                       dst=dims8(out, rank, 1))


REDUCE = Family("reduce", ReduceProblem, tuple(_REDUCE), _reduce_build, lambda v: _reduce_axes(v) is not None,
                cudnn_api=_cudnn_api, onednn_api=_onednn_api,
                cudnn={"cudnnReduceTensor": CudnnLowering(CudnnTable("reduce", "add_reduce", False, False),
                                                          _cudnn_row)},
                onednn=OnednnLowering("reduce", False,
                                      lambda p, api: ReduceParams(alg=p.alg, shape=p.shape, axes=p.axes),
                                      reference=Fills(lambda p: (0,)), layouts=_axes_inner))
FAMILIES = (REDUCE,)
