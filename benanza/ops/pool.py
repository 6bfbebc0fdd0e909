"""Pooling (ONNX MaxPool, AveragePool, GlobalMaxPool, GlobalAveragePool), 2-D NCHW; a 1-D one
(NCW, an audio model's) is the 2-D pooling of height 1 it computes. A global pooling is the
pooling whose window is the whole spatial size."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import Cpp, CudnnLowering, CudnnTable, Family, NodeView, OnednnLowering, const, required
from .conv import explicit_pads, height_one, pads, spatial_1d_or_2d
from .grammar import F, Problem, windowed
from .reference import Fills


@dataclass(frozen=True)
class PoolProblem(Problem):
    """2-D pooling; ``alg``: max, gmax, avgi (count pads), avgx (exclude pads), gavg."""

    FAMILY: ClassVar[str] = "pool"
    KEY: ClassVar[tuple[tuple[F, ...], ...]] = (
        (F("", "alg", "word"),), (F("mb", "mb"), F("ic", "ic"), F("ih", "ih"), F("iw", "iw")),
        (F("oh", "oh"), F("ow", "ow")), (F("kh", "kh"), F("kw", "kw")), (F("sh", "sh"), F("sw", "sw")),
        pads(), (F("dh", "dh", default=1), F("dw", "dw", default=1)))

    alg: str
    mb: int
    ic: int
    ih: int
    iw: int
    oh: int
    ow: int
    kh: int
    kw: int
    sh: int
    sw: int
    pt: int
    pl: int
    pb: int
    pr: int
    dh: int = 1
    dw: int = 1

    def flops(self) -> int:
        """Every output reads its window (a compare or an add each, padding included); an
        average divides once more per output."""
        out = self.mb * self.ic * self.oh * self.ow
        return out * self.kh * self.kw + (out if self.alg in ("avgi", "avgx", "gavg") else 0)

    def compulsory_bytes(self, inputs: int, outputs: int) -> int:
        return windowed(inputs, (self.kh, self.kw), (self.sh, self.sw)) + outputs



_POOL_ALG = {"MaxPool": "max", "GlobalMaxPool": "gmax", "GlobalAveragePool": "gavg"}


def _pool_build(view: NodeView) -> Problem:
    x, y = required(view, 0), view.outputs[0]
    a = view.attrs
    spatial = tuple(x.shape[2:])
    n = len(spatial)
    if view.op.startswith("Global"):
        k, s, d, pads = spatial, (1,) * n, (1,) * n, [0] * 2 * n
    else:
        k = tuple(a["kernel_shape"])
        s = tuple(a.get("strides") or (1,) * n)
        d = tuple(a.get("dilations") or (1,) * n)
        pads = explicit_pads(a, spatial, k, s, d)
    if view.op == "AveragePool":
        alg = "avgi" if a.get("count_include_pad", 0) else "avgx"
    else:
        alg = _POOL_ALG[view.op]
    (ih, iw), (oh, ow), (kh, kw) = height_one(spatial), height_one(y.shape[2:]), height_one(k)
    (sh, sw), (dh, dw) = height_one(s), height_one(d)
    (pt, pl), (pb, pr) = height_one(pads[:n], 0), height_one(pads[n:], 0)
    return PoolProblem(alg=alg, mb=x.shape[0], ic=x.shape[1], ih=ih, iw=iw, oh=oh, ow=ow, kh=kh, kw=kw, sh=sh, sw=sw,
                       pt=pt, pl=pl, pb=pb, pr=pr, dh=dh, dw=dw)


@dataclass(frozen=True)
class PoolParams:
    """oneDNN PoolParams."""

    alg: str
    mb: int
    ic: int
    ih: int
    iw: int
    oh: int
    ow: int
    kh: int
    kw: int
    sh: int
    sw: int
    pt: int
    pl: int
    dh: int
    dw: int


def _onednn_row(p: PoolProblem, api: str) -> PoolParams:
    return PoolParams(alg=p.alg, mb=p.mb, ic=p.ic, ih=p.ih, iw=p.iw, oh=p.oh, ow=p.ow, kh=p.kh, kw=p.kw, sh=p.sh,
                      sw=p.sw, pt=p.pt, pl=p.pl, dh=p.dh, dw=p.dw)


_POOL_MODE = {"max": "Max", "gmax": "Max", "avgi": "AvgIncludePad", "avgx": "AvgExcludePad",
              "gavg": "AvgExcludePad"}


@dataclass(frozen=True)
class PoolLayer:
    """cuDNN PoolLayer."""

    mode: Cpp
    n: int
    c: int
    h: int
    w: int
    out_h: int
    out_w: int
    kh: int
    kw: int
    stride_h: int
    stride_w: int
    pad_t: int
    pad_l: int
    pad_b: int
    pad_r: int
    dil_h: int
    dil_w: int


def _cudnn_row(p: PoolProblem, api: str) -> PoolLayer:
    return PoolLayer(mode=Cpp("PoolMode::" + _POOL_MODE[p.alg]), n=p.mb, c=p.ic, h=p.ih, w=p.iw, out_h=p.oh,
                     out_w=p.ow, kh=p.kh, kw=p.kw, stride_h=p.sh, stride_w=p.sw, pad_t=p.pt, pad_l=p.pl, pad_b=p.pb,
                     pad_r=p.pr, dil_h=p.dh, dil_w=p.dw)


POOL = Family("pool", PoolProblem, ("MaxPool", "AveragePool", "GlobalMaxPool", "GlobalAveragePool"), _pool_build,
              lambda v: spatial_1d_or_2d(v) and len(v.outputs) == 1,
              cudnn_api=const("cudnnPoolingForward"), onednn_api=const("pooling"),
              cudnn={"cudnnPoolingForward": CudnnLowering(CudnnTable("pool", "add_pool", True, False), _cudnn_row)},
              onednn=OnednnLowering("pool", True, _onednn_row, reference=Fills(lambda p: (0,))), exact=True)
FAMILIES = (POOL,)
