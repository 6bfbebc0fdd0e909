"""Softmax and LogSoftmax (ONNX Softmax, LogSoftmax)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from .base import CudnnLowering, CudnnTable, Dims, Family, NodeView, OnednnLowering, const, required
from .grammar import F, Problem
from .reference import Fills


@dataclass(frozen=True)
class SoftmaxProblem(Problem):
    """Softmax/LogSoftmax over ``axis``; ``flat``: opset < 13 coerces to 2-D at a non-last axis."""

    FAMILY: ClassVar[str] = "softmax"
    KEY: ClassVar[tuple[tuple[F, ...], ...]] = (
        (F("", "alg", "word"),), (F("in", "shape", "dims"),), (F("axis", "axis"),),
        (F("flat", "flat", "flag", False),))

    alg: str
    shape: tuple[int, ...]
    axis: int
    flat: bool = False

    def flops(self) -> int:
        """Per element: the running max, the subtraction, exp, the sum and the division (for
        LogSoftmax the log-sum subtraction): 5."""
        return 5 * math.prod(self.shape)



def _axis_inner(p: SoftmaxProblem) -> tuple[str, ...]:
    """oneDNN's optimized softmax kernels take the axis innermost in memory; over another axis of
    a row-major tensor only its reference code runs (YOLOv8n's DFL head: axis 1 of 1×16×4×2100,
    ten times ONNX Runtime's time). ``axis_inner``: reordered so the axis is innermost, the
    optimized kernel, and reordered back, all three timed."""
    return ("axis_inner",) if not p.flat and p.axis != len(p.shape) - 1 else ()


def _softmax_build(view: NodeView) -> Problem:
    shape = tuple(required(view, 0).shape)
    rank = len(shape)
    legacy = view.opset < 13
    axis = int(view.attrs.get("axis", 1 if legacy else -1))
    axis = axis + rank if axis < 0 else axis
    # Before opset 13 the input is coerced to 2-D at `axis`; that only differs from a
    # one-axis softmax when the axis is not the last one.
    flat = legacy and axis != rank - 1
    return SoftmaxProblem("logsoftmax" if view.op == "LogSoftmax" else "softmax", shape, axis, flat)


@dataclass(frozen=True)
class SoftmaxParams:
    """oneDNN SoftmaxParams."""

    alg: str
    shape: Dims
    axis: int
    flat: bool


@dataclass(frozen=True)
class SoftmaxLayer:
    """cuDNN SoftmaxLayer: softmax over C of an N, C, H view."""

    log: bool
    n: int
    c: int
    h: int


def _cudnn_row(p: SoftmaxProblem, api: str) -> SoftmaxLayer:
    shape, axis = p.shape, p.axis
    n = math.prod(shape[:axis])
    if p.flat:  # opset < 13: one softmax over the flattened trailing dims
        c, h = math.prod(shape[axis:]), 1
    else:
        c, h = shape[axis], math.prod(shape[axis + 1:])
    return SoftmaxLayer(log=p.alg == "logsoftmax", n=n, c=c, h=h)


SOFTMAX = Family("softmax", SoftmaxProblem, ("Softmax", "LogSoftmax"), _softmax_build,
                 cudnn_api=const("cudnnSoftmaxForward"), onednn_api=const("softmax"),
                 cudnn={"cudnnSoftmaxForward": CudnnLowering(CudnnTable("softmax", "add_softmax", False, False),
                                                             _cudnn_row)},
                 onednn=OnednnLowering("softmax", False, lambda p, api: SoftmaxParams(alg=p.alg, shape=p.shape,
                                                                                      axis=p.axis, flat=p.flat),
                                        reference=Fills(lambda p: (0,)), layouts=_axis_inner))
FAMILIES = (SOFTMAX,)
