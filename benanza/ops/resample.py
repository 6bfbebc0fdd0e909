"""Resizing (ONNX Resize, Upsample): nearest or linear over the spatial dims, on oneDNN. cuDNN's
graph API has a resample node, but it defines an output by a window, stride and pads, with no
documented mapping of output to input coordinates: which of ONNX's coordinate_transformation_modes
it computes is unknown, so it is not covered there (with that reason) rather than costed as one."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from .base import Dims, Family, NodeView, OnednnLowering, const, required
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


def _uncovered(p: Problem, backend: str) -> str | None:
    return ("cuDNN's resample node documents no output-to-input coordinate mapping to match ONNX's "
            "coordinate_transformation_mode with" if backend == "cudnn" else None)


RESAMPLE = Family("resample", ResampleProblem, ("Resize", "Upsample"), _resample_build, _resample_plain,
                  onednn_api=const("resampling"), uncovered=_uncovered,
                  onednn=OnednnLowering("resample", False,
                                        lambda p, api: ResampleParams(alg=p.alg, in_=p.shape, out=p.out),
                                        reference=Fills(lambda p: (0,))))
FAMILIES = (RESAMPLE,)
