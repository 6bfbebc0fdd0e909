"""Convolution and transposed convolution (ONNX Conv, ConvTranspose), 2-D NCHW; a 1-D one (NCW,
an audio front end's) is the 2-D one of height 1 it computes, which the libraries run. cuDNN
runs a transposed convolution as the backward-data convolution it is, where its symmetric
padding computes the layer exactly."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import NodeError
from .base import CudnnLowering, CudnnTable, Family, NodeView, OnednnLowering, const, present, required
from .gemm import BlasLayer
from .grammar import F, Problem, windowed
from .reference import Fills, Gen, Site, Spec, fill, last_output

if TYPE_CHECKING:
    from ..fusion import FusionPattern
    from ..records import Variant

AUTO_PAD_MODES = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def explicit_pads(attrs: dict[str, Any], spatial: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
                  dilations: Sequence[int]) -> list[int]:
    """ONNX-ordered pads (all begins, then all ends), resolving auto_pad as ONNX defines it."""
    n = len(kernel)
    auto = attrs.get("auto_pad", "NOTSET")
    if isinstance(auto, bytes):
        auto = auto.decode()
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for i in range(n):
            out = math.ceil(spatial[i] / strides[i])
            total = max((out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - spatial[i], 0)
            small = total // 2
            begin.append(small if auto == "SAME_UPPER" else total - small)
            end.append(total - begin[-1])
        return begin + end
    if auto == "VALID":
        return [0] * 2 * n
    return [int(p) for p in (attrs.get("pads") or [0] * 2 * n)]


def height_one(dims: Sequence[int], fill: int = 1) -> tuple[int, int]:
    """A 1-D op's per-axis values (sizes, kernel, strides, pads) as those of the 2-D op of height
    1 it computes (``fill`` on H: 1 for sizes, 0 for pads); a 2-D op's as they are. A unit H axis
    leaves row-major data as it is."""
    h, w = (fill,) * (2 - len(dims)) + tuple(dims)
    return h, w


def conv_fields(view: NodeView, weight: int = 1, bias: int = 2) -> dict[str, int | bool]:
    """A 2-D convolution's fields from its node: input 0, the weights and the bias at the
    given inputs (a quantized conv has scales and zero points between them). A 1-D conv's
    are those of height 1."""
    x = required(view, 0)
    w = required(view, weight, rank=len(x.shape))
    a = view.attrs
    n = len(x.shape) - 2
    k = tuple(a.get("kernel_shape") or w.shape[2:])
    s = tuple(a.get("strides") or (1,) * n)
    d = tuple(a.get("dilations") or (1,) * n)
    pads = explicit_pads(a, x.shape[2:], k, s, d)
    ih, iw = height_one(x.shape[2:])
    oh, ow = height_one(view.outputs[0].shape[2:])
    kh, kw = height_one(k)
    sh, sw = height_one(s)
    dh, dw = height_one(d)
    pt, pl = height_one(pads[:n], 0)
    pb, pr = height_one(pads[n:], 0)
    return dict(mb=x.shape[0], ic=x.shape[1], ih=ih, iw=iw, oc=w.shape[0], oh=oh, ow=ow, kh=kh, kw=kw, sh=sh, sw=sw,
                pt=pt, pl=pl, pb=pb, pr=pr, dh=dh, dw=dw, g=group(a, x.shape[1], w.shape, 1), bias=present(view, bias))


def _conv_build(view: NodeView) -> Problem:
    return ConvProblem(**conv_fields(view))  # type: ignore[arg-type]


def _deconv_build(view: NodeView) -> Problem:
    """ONNX ConvTranspose. Its begin pads are the given ones (or auto_pad's/output_shape's
    split of the total); its end pads are what makes the inferred output come out, so
    output_padding and output_shape need no fields of their own. A 1-D one is that of height 1."""
    x = required(view, 0)
    w = required(view, 1, rank=len(x.shape))
    a = view.attrs
    n = len(x.shape) - 2
    g = group(a, x.shape[1], w.shape, 0)
    k = tuple(a.get("kernel_shape") or w.shape[2:])
    s = tuple(a.get("strides") or (1,) * n)
    d = tuple(a.get("dilations") or (1,) * n)
    spatial, out = x.shape[2:], view.outputs[0].shape[2:]
    total = [s[i] * (spatial[i] - 1) + (k[i] - 1) * d[i] + 1 - out[i] for i in range(n)]
    auto = a.get("auto_pad", "NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("SAME_UPPER", "SAME_LOWER") or (a.get("output_shape") and not a.get("pads")):
        begin = [t // 2 if auto == "SAME_UPPER" else t - t // 2 for t in total]
    elif auto == "VALID":
        begin = [0] * n
    else:
        begin = [int(p) for p in (a.get("pads") or [0] * 2 * n)[:n]]
    ih, iw = height_one(spatial)
    oh, ow = height_one(out)
    kh, kw = height_one(k)
    sh, sw = height_one(s)
    dh, dw = height_one(d)
    pt, pl = height_one(begin, 0)
    pb, pr = height_one([t - b for t, b in zip(total, begin)], 0)
    return DeconvProblem(mb=x.shape[0], ic=x.shape[1], ih=ih, iw=iw, oc=w.shape[1] * g, oh=oh, ow=ow, kh=kh, kw=kw,
                         sh=sh, sw=sw, pt=pt, pl=pl, pb=pb, pr=pr, dh=dh, dw=dw, g=g, bias=present(view, 2))


# --- the problem records -------------------------------------------------------------------

def pads() -> tuple[F, ...]:
    return (F("ph", "pt"), F("pw", "pl"), F("pb", "pb", same="pt"), F("pr", "pr", same="pl"))


@dataclass(frozen=True)
class _Conv2d(Problem):
    """The fields of a 2-D convolution (NCHW) and of its transpose; pads top/left/bottom/right."""

    KEY: ClassVar[tuple[tuple[F, ...], ...]] = (
        (F("mb", "mb"),), (F("ic", "ic"), F("ih", "ih"), F("iw", "iw")),
        (F("oc", "oc"), F("oh", "oh"), F("ow", "ow")), (F("kh", "kh"), F("kw", "kw")),
        (F("sh", "sh"), F("sw", "sw")), pads(), (F("dh", "dh"), F("dw", "dw")), (F("g", "g"),),
        (F("bias", "bias", "bool"),))

    mb: int
    ic: int
    ih: int
    iw: int
    oc: int
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
    dh: int
    dw: int
    g: int
    bias: bool

    def flops(self) -> int:
        """2 per multiply-add, and the bias's add per output element."""
        return 2 * self.macs() + (self.mb * self.oc * self.oh * self.ow if self.bias else 0)


@dataclass(frozen=True)
class ConvProblem(_Conv2d):
    """2-D convolution (NCHW), as cuDNN and oneDNN take it."""

    FAMILY: ClassVar[str] = "conv"

    def macs(self) -> int:
        return self.mb * self.oc * self.oh * self.ow * (self.ic // self.g) * self.kh * self.kw

    def essential_flops(self) -> int:
        """Only the taps that fall inside the input: oneDNN's direct kernels skip those on the zero
        padding (Inception-v1's 5×5 convolutions of 6×6 maps do 64% of the nominal multiply-adds,
        and real results beat the FMA roof reckoned from the nominal count by 14%)."""
        taps = (_taps(self.oh, self.ih, self.kh, self.sh, self.pt, self.dh)
                * _taps(self.ow, self.iw, self.kw, self.sw, self.pl, self.dw))
        bias = self.mb * self.oc * self.oh * self.ow if self.bias else 0
        return 2 * self.mb * self.oc * (self.ic // self.g) * taps + bias

    def compulsory_bytes(self, inputs: int, outputs: int) -> int:
        return windowed(inputs, (self.kh, self.kw), (self.sh, self.sw)) + outputs


def _taps(outputs: int, inputs: int, k: int, stride: int, pad: int, dilation: int) -> int:
    """Over one spatial dim, the (output position, kernel tap) pairs that read the input, not
    its padding."""
    return sum(1 for o in range(outputs) for j in range(k) if 0 <= o * stride - pad + j * dilation < inputs)


@dataclass(frozen=True)
class DeconvProblem(_Conv2d):
    """2-D transposed convolution (ONNX ConvTranspose, oneDNN deconvolution): the same fields
    as a convolution's, read from the output's side; the end pads are what makes the output
    size come out (ONNX's output_padding included)."""

    FAMILY: ClassVar[str] = "deconv"

    def macs(self) -> int:
        return self.mb * self.ic * self.ih * self.iw * (self.oc // self.g) * self.kh * self.kw



# --- lowerings -----------------------------------------------------------------------------

@dataclass(frozen=True)
class ConvParams:
    """oneDNN ConvParams (a deconvolution's too)."""

    mb: int
    ic: int
    ih: int
    iw: int
    oc: int
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
    g: int



def group(attrs: dict[str, Any], channels: int, weight: tuple[int, ...], in_axis: int) -> int:
    """The group count, checked against the input's channels and the weight's (their input
    channels per group on axis 1 for Conv, all of them on axis 0 for ConvTranspose): groups that
    do not divide the channels have no meaning, and a benchmark of them would only fail when run."""
    g = int(attrs.get("group", 1))
    if g < 1 or channels % g:
        raise NodeError(f"group {g} does not divide the {channels} input channels")
    taken = weight[1] * g if in_axis == 1 else weight[0]
    if taken != channels:
        raise NodeError(f"weights of shape {list(weight)} take {taken} input channels in {g} groups, "
                        f"the input has {channels}")
    if in_axis == 1 and weight[0] % g:
        raise NodeError(f"group {g} does not divide the {weight[0]} output channels")
    return g

def onednn_row(p: _Conv2d, api: str) -> ConvParams:
    return ConvParams(mb=p.mb, ic=p.ic, ih=p.ih, iw=p.iw, oc=p.oc, oh=p.oh, ow=p.ow, kh=p.kh, kw=p.kw, sh=p.sh,
                      sw=p.sw, pt=p.pt, pl=p.pl, dh=p.dh, dw=p.dw, g=p.g)


@dataclass(frozen=True)
class ConvLayer:
    """cuDNN ConvLayer."""

    n: int
    c: int
    h: int
    w: int
    k: int
    r: int
    s: int
    pad_t: int
    pad_l: int
    pad_b: int
    pad_r: int
    stride_h: int
    stride_w: int
    dil_h: int
    dil_w: int
    groups: int
    out_h: int
    out_w: int
    bias: bool


def cudnn_row(p: _Conv2d, api: str) -> ConvLayer:
    return ConvLayer(n=p.mb, c=p.ic, h=p.ih, w=p.iw, k=p.oc, r=p.kh, s=p.kw, pad_t=p.pt, pad_l=p.pl, pad_b=p.pb,
                     pad_r=p.pr, stride_h=p.sh, stride_w=p.sw, dil_h=p.dh, dil_w=p.dw, groups=p.g, out_h=p.oh,
                     out_w=p.ow, bias=p.bias)


def matrix_product(p: ConvProblem) -> bool:
    """Whether the convolution is one matrix product per image on its own NCHW data: a 1x1
    kernel, strides 1, no padding, one group (a dilation moves no tap of a 1x1 kernel)."""
    return (p.kh, p.kw, p.sh, p.sw, p.pt, p.pl, p.pb, p.pr, p.g) == (1, 1, 1, 1, 0, 0, 0, 0, 1)


def gemm_row(p: ConvProblem, bias: bool) -> BlasLayer:
    """A ``matrix_product`` convolution as the blas table's row-major GEMM, per image
    Y[oc, H·W] = W[oc, ic] · X[ic, H·W]: A the weights (m = oc, k = ic), stored once and
    broadcast over the batch; B the image (n = H·W), one per image, ic·H·W apart; Y oc·H·W
    apart, which is NCHW. cuBLASLt, column-major, reads the same memory as Yᵀ = Xᵀ·Wᵀ
    (runtime_cpp/cudnn/blas.cpp): Xᵀ is (H·W)×ic with ld H·W, Wᵀ ic×oc with ld ic, Yᵀ (H·W)×oc
    with ld H·W. With ``bias`` (the conv's own, or a folded BatchNorm's) beta is 1: the bias,
    per output channel, runs along Yᵀ's columns, where cuBLASLt's bias epilogue cannot add it
    (its vector runs along D's rows, here the H·W positions), so it is C, the bias broadcast
    over H·W, a constant of the model a framework would hold once, as it holds its weights."""
    return BlasLayer(m=p.oc, n=p.oh * p.ow, k=p.ic, trans_a=False, trans_b=False, batch=p.mb, a_count=1,
                     b_count=p.mb, alpha=1.0, beta=1.0 if bias else 0.0)


CUDNN_CONV = CudnnTable("conv", "add_conv", spatial=True, math=True)
# cuDNN's graph-API convolution (runtime_cpp/cudnn/graph.cpp): QLinearConv's and ConvInteger's int8
# graphs (benanza.ops.quantized), and a float Conv's conv_fprop node, which is what PyTorch executes
CUDNN_QCONV_TABLE = CudnnTable("qconv", "add_qconv", False, False)
CUDNN_CONV_GRAPH = "cudnn_frontend.conv"


@dataclass(frozen=True)
class QconvLayer(ConvLayer):
    """cuDNN QconvLayer (graph API): ConvLayer's fields, then ``requant``: QLinearConv's
    epilogue (a scale, then an offset, into s8) instead of ConvInteger's s32 result; ``bscales``:
    the weights' scales (1, or one per output channel). QLinearConv's int32 bias (``bias``) has no
    node of its own: it is part of the offset. A float Conv's row (its call kConvGraph*) adds its
    bias after the graph, as PyTorch does."""

    requant: bool
    bscales: int


def _conv_graph_row(p: _Conv2d, api: str) -> QconvLayer:
    return QconvLayer(**asdict(cudnn_row(p, api)), requant=False, bscales=1)


def conv_graph_call(layout: str, math: str) -> str:
    """The qconv table's call constant (tables.hpp) of a float convolution graph: channels-last
    tensors for ``nhwc``; for ``fma`` math the engines with Tensor Cores or down-converted inputs
    deselected, as PyTorch does when TF32 is off (the other modes allow them, as the legacy API's)."""
    return "kConvGraph" + ("Nhwc" if layout == "nhwc" else "") + ("Fma" if math == "fma" else "")
CUDNN_DECONV = CudnnTable("deconv", "add_deconv", spatial=True, math=True)
DECONV_API = "cudnnConvolutionBackwardData"


def _deconv_pads_refused(p: Problem) -> str | None:
    """Why cuDNN's backward-data convolution does not compute the transposed convolution, in
    one line; None: it does. Its descriptor pads both ends by the begin pad, and the output
    size is then what the forward convolution of it gives back the input from: an end pad
    short of the begin by less than the stride (ONNX's output_padding) comes out exact, any
    other asymmetry does not."""
    assert isinstance(p, DeconvProblem)
    if 0 <= p.pt - p.pb < p.sh and 0 <= p.pl - p.pr < p.sw:
        return None
    return (f"pads begin {p.pt},{p.pl} end {p.pb},{p.pr} (cuDNN's backward-data convolution pads both ends "
            f"alike; an end short of the begin by less than the stride, as output_padding makes, is exact)")


def _deconv_cudnn(p: Problem) -> str | None:
    return DECONV_API if _deconv_pads_refused(p) is None else None


def _deconv_uncovered(p: Problem, backend: str) -> str | None:
    return _deconv_pads_refused(p) if backend == "cudnn" else None


def spatial_1d_or_2d(view: NodeView) -> bool:
    return view.inputs[0] is not None and len(view.inputs[0].shape) in (3, 4)


def _deconv_reference(site: Site, v: Variant, gen: Gen) -> Spec:
    """The input and bias as the runtime fills them; the weights as it fills oneDNN's
    deconvolution weights, ((G,) OC/G, IC/G, kH, kW) row-major, laid out as ConvTranspose holds
    them, (IC, OC/G, kH, kW): the same weight w[g, o, i] multiplies input channel g·IC/G + i
    into output channel g·OC/G + o in both."""
    p = v.problem
    assert isinstance(p, DeconvProblem)
    w = gen(1, (p.g, p.oc // p.g, p.ic // p.g, p.kh, p.kw)).transpose(0, 2, 1, 3, 4)
    feeds = {(0, 0): gen(0, site.in_shape(0, 0)), (0, 1): w.reshape(site.in_shape(0, 1))}
    if p.bias:
        feeds[(0, 2)] = gen(2, site.in_shape(0, 2))
    return Spec(site.nodes, feeds, (site.proto(0).output[0],))


CONV = Family("conv", ConvProblem, ("Conv",), _conv_build, spatial_1d_or_2d,
              cudnn_api=const("cudnnConvolutionForward"), onednn_api=const("convolution"),
              cudnn={"cudnnConvolutionForward": CudnnLowering(CUDNN_CONV, cudnn_row, "kConvForward"),
                     CUDNN_CONV_GRAPH: CudnnLowering(CUDNN_QCONV_TABLE, _conv_graph_row)},
              onednn=OnednnLowering("conv", True, onednn_row,
                                    reference=Fills(lambda p: (0, 1, 2) if p.bias else (0, 1))),
              exact=True)
DECONV = Family("deconv", DeconvProblem, ("ConvTranspose",), _deconv_build, spatial_1d_or_2d,
                cudnn_api=_deconv_cudnn, onednn_api=const("deconvolution"),
                cudnn={DECONV_API: CudnnLowering(CUDNN_DECONV, cudnn_row)}, uncovered=_deconv_uncovered,
                onednn=OnednnLowering("deconv", True, onednn_row, reference=_deconv_reference))


def fused_reference(site: Site, v: Variant, gen: Gen, pattern: FusionPattern) -> Spec:
    """A conv pattern's: x, the weights, and the bias where the fused call adds one. A folded
    BatchNorm gets scale 1, mean 0 and variance 1 − ε, so it adds B, which is the benchmark's
    bias."""
    import numpy as np

    p = v.problem
    assert isinstance(p, ConvProblem)
    if "BatchNormalization" in pattern.tail:
        bn = site.proto(1)
        eps = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
        feeds = fill(site, gen, [(0, 0), (0, 1)])
        feeds[(1, 1)] = np.ones(p.oc, np.float32)
        feeds[(1, 2)] = gen(2, (p.oc,))
        feeds[(1, 3)] = np.zeros(p.oc, np.float32)
        feeds[(1, 4)] = np.full(p.oc, 1.0 - eps, np.float32)
        return Spec(site.nodes, feeds, last_output(site), " (BatchNorm as the folded bias it is benchmarked as)")
    slots = [(0, 0), (0, 1)] + ([(0, 2)] if pattern.adds_bias else [])
    return Spec(site.nodes, fill(site, gen, slots), last_output(site))
FAMILIES = (CONV, DECONV)
