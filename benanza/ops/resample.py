"""Resizing (ONNX Resize, Upsample): nearest or linear over the spatial dims, on oneDNN (its
resampling primitive) and on cuDNN where its graph API's resample node has a configuration for it.

That node defines an output by a window, strides and pads (as pooling does), not by ONNX's
coordinate_transformation_mode. The one upsampling configuration cuDNN's engines are reported to
take is by 2 (window 2, strides 1/2, pre-padding 1/2, post-padding 1, NHWC): output i samples the
input at i/2. So a 2-D Resize by exactly 2 on both spatial dims (YOLO's and the OCR detectors'
nearest upsampling, a decoder's bilinear one) is benchmarked there; which input pixels an output
reads (ONNX's half_pixel samples at i/2 − 1/4, asymmetric at i/2) changes its weights, not its
work: the same taps per output, the same bytes. Any other scale is not covered on cuDNN, with
that reason."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from .base import CudnnLowering, CudnnTable, Dims, Family, NodeView, OnednnLowering, const, required
from .grammar import F, Problem
from .reference import Fills


@dataclass(frozen=True)
class ResampleProblem(Problem):
    """ONNX Resize/Upsample of the spatial dims (``alg``: nearest or linear), the batch and
    channel dims unchanged."""

    FAMILY: ClassVar[str] = "resample"
    KEY: ClassVar[tuple[tuple[F, ...], ...]] = (
        (F("", "alg", "word"),), (F("in", "shape", "dims"),), (F("out", "out", "dims"),))

    alg: str
    shape: tuple[int, ...]
    out: tuple[int, ...]

    def flops(self) -> int:
        """Nearest copies (0); linear weighs the 2^s neighbours over s spatial dims per output
        (2^s multiplies, 2^s − 1 adds)."""
        corners = 2 ** (len(self.shape) - 2)
        return 0 if self.alg == "nearest" else (2 * corners - 1) * math.prod(self.out)

    def compulsory_bytes(self, inputs: int, outputs: int) -> int:
        """A downsample reads only the neighbours of its outputs (1 per spatial dim nearest, 2
        linear)."""
        taps = 1 if self.alg == "nearest" else 2
        share = math.prod(min(1.0, taps * o / i) for i, o in zip(self.shape[2:], self.out[2:]))
        return math.ceil(inputs * share) + outputs



_RESAMPLE = {"nearest": "nearest", "linear": "linear", "bilinear": "linear"}


def _resample_plain(view: NodeView) -> bool:
    """Nearest or linear resizing of 3- to 5-d data over its spatial dims only (oneDNN resamples
    those; an ROI crop, antialiasing or a resized channel dim is another computation)."""
    x, y = required(view, 0), view.outputs[0]
    mode = view.attrs.get("mode", "nearest")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    ctm = view.attrs.get("coordinate_transformation_mode", "half_pixel")
    ctm = ctm.decode() if isinstance(ctm, bytes) else ctm
    return (mode in _RESAMPLE and 3 <= len(x.shape) <= 5 and tuple(x.shape[:2]) == tuple(y.shape[:2])
            and ctm != "tf_crop_and_resize" and not int(view.attrs.get("antialias", 0)))


def _resample_build(view: NodeView) -> Problem:
    mode = view.attrs.get("mode", "nearest")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    return ResampleProblem(_RESAMPLE[mode], tuple(required(view, 0).shape), tuple(view.outputs[0].shape))


@dataclass(frozen=True)
class ResampleParams:
    """oneDNN ResampleParams."""

    alg: str
    in_: Dims
    out: Dims


CUDNN_RESAMPLE = "cudnn_frontend.resample"
CUDNN_RESAMPLE_TABLE = CudnnTable("resample", "add_resample", False, False)


def _cudnn_refused(p: Problem) -> str | None:
    """Why cuDNN's resample node does not run the layer, in one line; None: it does."""
    assert isinstance(p, ResampleProblem)
    if len(p.shape) != 4:
        return (f"{len(p.shape) - 2}-D resizing (the resample node's one upsampling configuration benchmarked "
                f"here is 2-D)")
    if any(o != 2 * i for i, o in zip(p.shape[2:], p.out[2:])):
        scales = "×".join(f"{o / i:g}" for i, o in zip(p.shape[2:], p.out[2:]))
        return (f"scale {scales} (cuDNN's resample engines upsample by 2 on both spatial dims only: window 2, "
                f"strides 1/2)")
    return None


def _cudnn_api(p: Problem) -> str | None:
    return CUDNN_RESAMPLE if _cudnn_refused(p) is None else None


def _uncovered(p: Problem, backend: str) -> str | None:
    return _cudnn_refused(p) if backend == "cudnn" else None


@dataclass(frozen=True)
class ResampleLayer:
    """cuDNN ResampleLayer: N, C, H, W in, the output's H, W."""

    linear: bool
    n: int
    c: int
    h: int
    w: int
    out_h: int
    out_w: int


def _cudnn_row(p: ResampleProblem, api: str) -> ResampleLayer:
    n, c, h, w = p.shape
    return ResampleLayer(linear=p.alg == "linear", n=n, c=c, h=h, w=w, out_h=p.out[2], out_w=p.out[3])


RESAMPLE = Family("resample", ResampleProblem, ("Resize", "Upsample"), _resample_build, _resample_plain,
                  cudnn_api=_cudnn_api, onednn_api=const("resampling"), uncovered=_uncovered,
                  cudnn={CUDNN_RESAMPLE: CudnnLowering(CUDNN_RESAMPLE_TABLE, _cudnn_row)},
                  onednn=OnednnLowering("resample", False,
                                        lambda p, api: ResampleParams(alg=p.alg, in_=p.shape, out=p.out),
                                        reference=Fills(lambda p: (0,))))
FAMILIES = (RESAMPLE,)
