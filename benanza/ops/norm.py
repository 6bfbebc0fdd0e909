"""Normalisations: batch normalization, LRN, layer normalization and RMS normalization (ONNX
BatchNormalization, LRN, LayerNormalization, RMSNormalization; ONNX Runtime's
SimplifiedLayerNormalization), and the fused forms of the LayerNorm and RMSNorm decompositions
(``layernorm`` and ``rmsnorm`` patterns of ``benanza.fusion``: benchmarked as one layer or RMS
normalization on their ReduceMean's problem)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from .base import (
    CudnnLowering,
    CudnnTable,
    Dims,
    Family,
    NodeView,
    OnednnLowering,
    PatternLowering,
    const,
    nchw,
    present,
    required,
)
from .binary import BinaryProblem
from .grammar import F, Problem, f32
from .reduce import ReduceProblem
from .reference import Fills, Gen, Site, Spec, external_slot, fill, last_output

if TYPE_CHECKING:
    from ..fusion import FusionPattern
    from ..layers import Model
    from ..records import Variant

# the cuDNN graph API's layer norm (runtime_cpp/cudnn/graph.cpp)
CUDNN_LAYERNORM = "cudnn_frontend.layernorm"
CUDNN_RMSNORM = "cudnn_frontend.rmsnorm"


@dataclass(frozen=True)
class BnormProblem(Problem):
    """Batch normalization over an (N, C, H, W) view. ``per_activation``: ONNX ``spatial=0``
    (statistics per C×H×W element); ``training``: ``training_mode=1`` (batch statistics)."""

    FAMILY: ClassVar[str] = "bnorm"
    KEY: ClassVar[tuple[tuple[F, ...], ...]] = (
        (F("mb", "mb"), F("ic", "ic"), F("ih", "ih"), F("iw", "iw")), (F("eps", "eps", "float"),),
        (F("peract", "per_activation", "flag", False),), (F("train", "training", "flag", False),))

    mb: int
    ic: int
    ih: int
    iw: int
    eps: float
    per_activation: bool = False
    training: bool = False

    def flops(self) -> int:
        """(x − mean) / √(var + ε) · γ + β: 4 per element, plus the statistics in training
        (sum, subtract, square, sum: 4 more)."""
        return (8 if self.training else 4) * self.mb * self.ic * self.ih * self.iw


@dataclass(frozen=True)
class LrnProblem(Problem):
    FAMILY: ClassVar[str] = "lrn"
    KEY: ClassVar[tuple[tuple[F, ...], ...]] = (
        (F("mb", "mb"), F("ic", "ic"), F("ih", "ih"), F("iw", "iw")), (F("ls", "size"),),
        (F("alpha", "alpha", "float"), F("beta", "beta", "float"), F("k", "k", "float")))

    mb: int
    ic: int
    ih: int
    iw: int
    size: int
    alpha: float
    beta: float
    k: float

    def flops(self) -> int:
        """Per element: the window's squares and their sum (2·size), then k + α/size·Σ, its
        power and the division."""
        return (2 * self.size + 3) * self.mb * self.ic * self.ih * self.iw



@dataclass(frozen=True)
class LnormProblem(Problem):
    """ONNX LayerNormalization (opset 17): normalise over the dims from ``axis`` on, then scale
    and (``bias``) shift. Those dims are contiguous, so a library sees one normalised axis."""

    FAMILY: ClassVar[str] = "lnorm"
    KEY: ClassVar[tuple[tuple[F, ...], ...]] = (
        (F("in", "shape", "dims"),), (F("axis", "axis"),), (F("eps", "eps", "float"),),
        (F("bias", "bias", "bool"),))

    shape: tuple[int, ...]
    axis: int
    eps: float
    bias: bool

    def flops(self) -> int:
        """Per element: the mean's sum, the subtraction, the square, the variance's sum, the
        normalising multiply and the scale (6), the shift (1 more with a bias); per normalised
        row: the two divisions by its length, + ε and the reciprocal square root (4)."""
        rows = math.prod(self.shape[:self.axis])
        return (7 if self.bias else 6) * math.prod(self.shape) + 4 * rows


@dataclass(frozen=True)
class RmsnormProblem(Problem):
    """RMS normalization: x / √(mean(x²) + ε) · scale over the dims from ``axis`` on (opset 23's
    RMSNormalization, ONNX Runtime's SimplifiedLayerNormalization, the ``rmsnorm`` pattern of
    Llama-style exports)."""

    FAMILY: ClassVar[str] = "rmsnorm"
    KEY: ClassVar[tuple[tuple[F, ...], ...]] = (
        (F("in", "shape", "dims"),), (F("axis", "axis"),), (F("eps", "eps", "float"),))

    shape: tuple[int, ...]
    axis: int
    eps: float

    def flops(self) -> int:
        """Per element: the square, the mean's sum, the normalising multiply and the scale (4);
        per normalised row: the division by its length, + ε and the reciprocal square root (3)."""
        return 4 * math.prod(self.shape) + 3 * math.prod(self.shape[:self.axis])


# --- recognition ---------------------------------------------------------------------------

def _bnorm_build(view: NodeView) -> Problem:
    mb, ic, ih, iw = nchw(required(view, 0).shape)
    a = view.attrs
    # spatial (opsets < 9): 0 keeps statistics per C×H×W element; training_mode (opset 14+)
    # normalises with the batch's own statistics.
    return BnormProblem(mb=mb, ic=ic, ih=ih, iw=iw, eps=f32(a.get("epsilon", 1e-5)),
                        per_activation=view.opset < 9 and not int(a.get("spatial", 1)),
                        training=bool(int(a.get("training_mode", 0))))


def _inference_bnorm(api: str) -> Callable[[Problem], str | None]:
    def pick(p: Problem) -> str | None:
        assert isinstance(p, BnormProblem)
        return None if p.per_activation or p.training else api  # the benchmarks run spatial inference
    return pick


def _lrn_build(view: NodeView) -> Problem:
    mb, ic, ih, iw = nchw(required(view, 0).shape)
    a = view.attrs
    return LrnProblem(mb=mb, ic=ic, ih=ih, iw=iw, size=int(a["size"]), alpha=f32(a.get("alpha", 1e-4)),
                      beta=f32(a.get("beta", 0.75)), k=f32(a.get("bias", 1.0)))



def _rmsnorm_build(view: NodeView) -> Problem:
    shape = tuple(required(view, 0).shape)
    axis = int(view.attrs.get("axis", -1))
    return RmsnormProblem(shape, axis + len(shape) if axis < 0 else axis, f32(view.attrs.get("epsilon", 1e-5)))


def _lnorm_build(view: NodeView) -> Problem:
    shape = tuple(required(view, 0).shape)
    axis = int(view.attrs.get("axis", -1))
    return LnormProblem(shape, axis + len(shape) if axis < 0 else axis, f32(view.attrs.get("epsilon", 1e-5)),
                        present(view, 2))



# --- lowerings -----------------------------------------------------------------------------

@dataclass(frozen=True)
class BnormParams:
    """oneDNN BnormParams."""

    mb: int
    ic: int
    ih: int
    iw: int
    eps: float


@dataclass(frozen=True)
class BnormLayer:
    """cuDNN BnormLayer."""

    n: int
    c: int
    h: int
    w: int
    eps: float


@dataclass(frozen=True)
class LrnParams:
    """oneDNN LrnParams."""

    mb: int
    ic: int
    ih: int
    iw: int
    size: int
    alpha: float
    beta: float
    k: float


@dataclass(frozen=True)
class LrnLayer:
    """cuDNN LrnLayer."""

    n: int
    c: int
    h: int
    w: int
    size: int
    alpha: float
    beta: float
    k: float


@dataclass(frozen=True)
class LnormParams:
    """oneDNN LnormParams (``rms``: RMS normalization, the RMS mode of a layer normalization)."""

    shape: Dims
    axis: int
    eps: float
    bias: bool
    rms: bool


@dataclass(frozen=True)
class LnormLayer:
    """cuDNN LnormLayer (graph API): rows × cols, normalised over cols (``rms``: the RMS norm node)."""

    rows: int
    cols: int
    eps: float
    bias: bool
    rms: bool


def _lnorm_onednn(p: LnormProblem | RmsnormProblem, api: str) -> LnormParams:
    if isinstance(p, RmsnormProblem):
        return LnormParams(shape=p.shape, axis=p.axis, eps=p.eps, bias=False, rms=True)
    return LnormParams(shape=p.shape, axis=p.axis, eps=p.eps, bias=p.bias, rms=False)


def _lnorm_cudnn(p: LnormProblem | RmsnormProblem, api: str) -> LnormLayer:
    rms = isinstance(p, RmsnormProblem)
    return LnormLayer(rows=math.prod(p.shape[:p.axis]), cols=math.prod(p.shape[p.axis:]), eps=p.eps,
                      bias=isinstance(p, LnormProblem) and p.bias, rms=rms)


def _decomposition(p: ReduceProblem) -> LnormProblem:
    """The layer normalization the LayerNorm decomposition computes, from its first ReduceMean
    (over trailing axes), with scale and shift; its epsilon, an Add of a constant, changes no
    work: the ONNX default stands in."""
    return LnormProblem(p.shape, p.axes[0], 1e-5, True)


CUDNN_LNORM = CudnnTable("lnorm", "add_lnorm", False, False)

BNORM = Family("bnorm", BnormProblem, ("BatchNormalization",), _bnorm_build,
               lambda v: 2 <= len(required(v, 0).shape) <= 4 and len(v.outputs) == 1,
               cudnn_api=_inference_bnorm("cudnnBatchNormalizationForwardInference"),
               onednn_api=_inference_bnorm("batch_normalization"),
               cudnn={"cudnnBatchNormalizationForwardInference": CudnnLowering(
                   CudnnTable("bnorm", "add_bnorm", True, False),
                   lambda p, api: BnormLayer(n=p.mb, c=p.ic, h=p.ih, w=p.iw, eps=p.eps))},
               # the runtime fills src, mean, variance, scale, shift
               onednn=OnednnLowering("bnorm", True,
                                     lambda p, api: BnormParams(mb=p.mb, ic=p.ic, ih=p.ih, iw=p.iw, eps=p.eps),
                                     reference=Fills(lambda p: (0, 3, 4, 1, 2))))
LRN = Family("lrn", LrnProblem, ("LRN",), _lrn_build, lambda v: 2 <= len(required(v, 0).shape) <= 4,
             cudnn_api=const("cudnnLRNCrossChannelForward"), onednn_api=const("lrn"),
             cudnn={"cudnnLRNCrossChannelForward": CudnnLowering(
                 CudnnTable("lrn", "add_lrn", True, False),
                 lambda p, api: LrnLayer(n=p.mb, c=p.ic, h=p.ih, w=p.iw, size=p.size, alpha=p.alpha, beta=p.beta,
                                         k=p.k))},
             onednn=OnednnLowering("lrn", True, lambda p, api: LrnParams(mb=p.mb, ic=p.ic, ih=p.ih, iw=p.iw,
                                                                          size=p.size, alpha=p.alpha, beta=p.beta,
                                                                          k=p.k),
                                   reference=Fills(lambda p: (0,))))
# The optional Mean/InvStdDev outputs are training statistics: only the inference form is a layer.
LNORM = Family("lnorm", LnormProblem, ("LayerNormalization",), _lnorm_build, lambda v: len(v.outputs) == 1,
               cudnn_api=const(CUDNN_LAYERNORM), onednn_api=const("layer_normalization"),
               cudnn={CUDNN_LAYERNORM: CudnnLowering(CUDNN_LNORM, _lnorm_cudnn)},
               onednn=OnednnLowering("lnorm", False, _lnorm_onednn,
                                     reference=Fills(lambda p: (0, 1, 2) if p.bias else (0, 1))))
# oneDNN runs it as its layer normalization's RMS mode where the version has one (the runtime
# decides); cuDNN as the graph API's RMS norm node
RMSNORM = Family("rmsnorm", RmsnormProblem, ("RMSNormalization", "SimplifiedLayerNormalization"), _rmsnorm_build,
                 lambda v: len(v.outputs) == 1, cudnn_api=const(CUDNN_RMSNORM),
                 onednn_api=const("layer_normalization"),
                 cudnn={CUDNN_RMSNORM: CudnnLowering(CUDNN_LNORM, _lnorm_cudnn)},
                 onednn=OnednnLowering("lnorm", False, _lnorm_onednn, reference=Fills(lambda p: (0, 1))))
FAMILIES = (BNORM, LRN, LNORM, RMSNORM)


def _rms_decomposition(p: ReduceProblem) -> RmsnormProblem:
    """The RMS normalization the ``rmsnorm`` pattern computes, from its ReduceMean (over
    trailing axes); its epsilon, an Add of a constant, changes no work: the ONNX default stands in."""
    return RmsnormProblem(p.shape, p.axes[0], 1e-5)


PATTERNS = (PatternLowering("layernorm", onednn=("lnorm", lambda p, api: _lnorm_onednn(_decomposition(p), api)),
                            cudnn=CudnnLowering(CUDNN_LNORM, lambda p, api: _lnorm_cudnn(_decomposition(p), api))),
            PatternLowering("rmsnorm", onednn=("lnorm", lambda p, api: _lnorm_onednn(_rms_decomposition(p), api)),
                            cudnn=CudnnLowering(CUDNN_LNORM, lambda p, api: _lnorm_cudnn(_rms_decomposition(p), api))))


def layernorm_reference(site: Site, v: Variant, gen: Gen, pattern: FusionPattern) -> Spec:
    """x, then the Mul's scale and the last Add's shift."""
    last = len(site.nodes) - 1
    slots = [(0, 0), external_slot(site, last - 1, last - 2), external_slot(site, last, last - 1)]
    return Spec(site.nodes, fill(site, gen, slots), last_output(site))


def rmsnorm_reference(site: Site, v: Variant, gen: Gen, pattern: FusionPattern) -> Spec:
    """x (the Pow's input, second in the match), then the last Mul's scale."""
    last = len(site.nodes) - 1
    return Spec(site.nodes, fill(site, gen, [(1, 0), external_slot(site, last, last - 1)]), last_output(site))


# --- fusion: the nodes of the LayerNorm and RMSNorm decompositions in a model ----------------

def layernorm_nodes(model: Model, consumers: dict[int, list[int]], start: int) -> list[int] | None:
    """The nodes of x → ReduceMean → Sub(x, mean) → Pow(·, 2) → ReduceMean → Add(eps) → Sqrt →
    Div(Sub, ·) → Mul(scale) → Add(bias) from its first ReduceMean (over x's trailing axes), or
    None. Every intermediate is read only inside the pattern."""
    nodes = model.nodes
    first = nodes[start]
    mean = first.layer.problem
    if not isinstance(mean, ReduceProblem) or mean.alg != "mean" or len(first.inputs) != 1:
        return None
    rank = len(mean.shape)
    if mean.axes != tuple(range(rank - len(mean.axes), rank)):
        return None  # a library's layer norm normalises trailing axes
    x = first.inputs[0]

    def only(i: int, op: str) -> int | None:
        nxt = consumers[i]
        return nxt[0] if len(nxt) == 1 and nodes[nxt[0]].layer.op == op else None

    sub = only(start, "Sub")
    if sub is None or nodes[sub].inputs != (x, first.outputs[0]):
        return None
    pair = sorted(consumers[sub], key=lambda i: nodes[i].layer.op)
    if [nodes[i].layer.op for i in pair] != ["Div", "Pow"]:
        return None
    div, pow_ = pair
    power = nodes[pow_].layer.problem
    if not isinstance(power, BinaryProblem) or power.exponent != 2.0:
        return None
    second = only(pow_, "ReduceMean")
    var = nodes[second].layer.problem if second is not None else None
    if second is None or not isinstance(var, ReduceProblem) or var.axes != mean.axes:
        return None
    eps = only(second, "Add")
    sqrt = only(eps, "Sqrt") if eps is not None and nodes[eps].constant_inputs else None
    if sqrt is None or consumers[sqrt] != [div] or nodes[div].inputs != (nodes[sub].outputs[0], nodes[sqrt].outputs[0]):
        return None
    scale = only(div, "Mul")
    shift = only(scale, "Add") if scale is not None and nodes[scale].constant_inputs else None
    if eps is None or scale is None or shift is None or not nodes[shift].constant_inputs:
        return None
    return sorted([start, sub, pow_, second, eps, sqrt, div, scale, shift])


def rmsnorm_nodes(model: Model, consumers: dict[int, list[int]], start: int) -> list[int] | None:
    """The nodes of x → Pow(x, 2) → ReduceMean (over trailing axes) → Add(ε) → Sqrt → then
    Reciprocal or Div(1, ·) → Mul(x, ·), or Div(x, ·) → Mul(scale), from its ReduceMean (the
    anchor, first; the Pow that feeds it next), or None. A Cast to the type it already has
    between the last two Muls (TorchScript writes Hugging Face's ``.to(dtype)``) is part of it.
    Every intermediate is read only inside the pattern."""
    nodes, producer = model.nodes, model.producer
    mean = nodes[start].layer.problem
    if not isinstance(mean, ReduceProblem) or mean.alg != "mean" or len(nodes[start].inputs) != 1:
        return None
    rank = len(mean.shape)
    if mean.axes != tuple(range(rank - len(mean.axes), rank)):
        return None
    pow_ = producer.get(nodes[start].inputs[0])
    power = nodes[pow_].layer.problem if pow_ is not None else None
    if pow_ is None or not isinstance(power, BinaryProblem) or power.alg != "pow" or power.exponent != 2.0 \
            or consumers[pow_] != [start] or len(nodes[pow_].inputs) != 1:
        return None
    x = nodes[pow_].inputs[0]

    def only(i: int | None, ops: tuple[str, ...]) -> int | None:
        if i is None:
            return None
        nxt = consumers[i]
        return nxt[0] if len(nxt) == 1 and nodes[nxt[0]].layer.op in ops else None

    eps = only(start, ("Add",))
    sqrt = only(eps, ("Sqrt",)) if eps is not None and nodes[eps].constant_inputs else None
    inv = only(sqrt, ("Reciprocal", "Div"))
    if eps is None or sqrt is None or inv is None:
        return None
    chain = [start, pow_, eps, sqrt, inv]
    div = nodes[inv]
    last: int | None = inv
    if not (div.layer.op == "Div" and div.inputs == (x, nodes[sqrt].outputs[0])):  # not Div(x, rms)
        if div.layer.op == "Div" and (div.inputs != (nodes[sqrt].outputs[0],) or not div.constant_inputs):
            return None  # neither Div(1, rms), the reciprocal
        last = only(inv, ("Mul",))
        if last is None or set(nodes[last].inputs) != {x, div.outputs[0]}:
            return None
        chain.append(last)
    cast = only(last, ("Cast",))
    if cast is not None and nodes[cast].layer.free:
        chain.append(cast)
        last = cast
    scale = only(last, ("Mul",))
    if scale is None or not nodes[scale].constant_inputs:
        return None
    return chain + [scale]
