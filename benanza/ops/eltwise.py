"""Element-wise unary ops: activations (ONNX Relu, Sigmoid, Tanh, Elu, Clip, LeakyRelu, Softplus,
HardSigmoid, Exp, Log, Abs, Sqrt, Neg, Swish, HardSwish, Gelu, Erf, Reciprocal, Cos, Sin, IsNaN), PRelu and
Dropout; and the
fused forms of the GELU decompositions (patterns of ``benanza.fusion``): the erf one
(``gelu_erf``: one GELU of its Div's input) and the tanh approximation (``gelu_tanh``: one
tanh-GELU of the x its Tanh's argument is computed from)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from .base import (
    Cpp,
    CudnnLowering,
    CudnnTable,
    Dims,
    Family,
    NodeView,
    OnednnLowering,
    PatternLowering,
    const,
    fold4,
    present,
    required,
)
from .binary import CUDNN_BINARY, CUDNN_POINTWISE, CUDNN_POINTWISE_TABLE, BinaryLayer, BinaryProblem, pointwise_row
from .grammar import FLT_MAX, F, Problem, f32
from .reference import Fills, Gen, Site, Spec, fill, last_output

if TYPE_CHECKING:
    from ..fusion import FusionPattern
    from ..layers import Model
    from ..records import Variant


@dataclass(frozen=True)
class EltwiseProblem(Problem):
    """An element-wise activation. ``alpha``/``beta`` where the op has them (else None);
    ``min``/``max`` for Clip (±FLT_MAX: unbounded; None: a run-time tensor)."""

    FAMILY: ClassVar[str] = "eltwise"
    KEY: ClassVar[tuple[tuple[F, ...], ...]] = (
        (F("", "alg", "word"),), (F("in", "shape", "dims"),),
        (F("alpha", "alpha", "float", None), F("beta", "beta", "float", None),
         F("min", "min", "bound", -FLT_MAX), F("max", "max", "bound", FLT_MAX)))

    alg: str
    shape: tuple[int, ...]
    alpha: float | None = None
    beta: float | None = None
    min: float | None = -FLT_MAX
    max: float | None = FLT_MAX

    def flops(self) -> int:
        return math.prod(self.shape)  # one function evaluation per element


@dataclass(frozen=True)
class PreluProblem(Problem):
    FAMILY: ClassVar[str] = "prelu"
    KEY: ClassVar[tuple[tuple[F, ...], ...]] = ((F("in", "shape", "dims"),), (F("slope", "slope", "dims"),))

    shape: tuple[int, ...]
    slope: tuple[int, ...]

    def flops(self) -> int:
        return math.prod(self.shape)



@dataclass(frozen=True)
class DropoutProblem(Problem):
    """Dropout. At inference (``training`` false) it is the identity: the ratio changes nothing
    and is not part of the problem."""

    FAMILY: ClassVar[str] = "dropout"
    KEY: ClassVar[tuple[tuple[F, ...], ...]] = (
        (F("in", "shape", "dims"),), (F("ratio", "ratio", "float", None),), (F("train", "training", "flag", False),))

    shape: tuple[int, ...]
    ratio: float | None = None
    training: bool = False

    @property
    def identity(self) -> bool:
        return not self.training

    def flops(self) -> int:
        return math.prod(self.shape) if self.training else 0  # training: the mask's multiply




# --- recognition ---------------------------------------------------------------------------

# alg word, attributes in the key, cuDNN activation mode (None: no cuDNN call), oneDNN alg
_ELTWISE = {
    "Relu": ("relu", (), "CUDNN_ACTIVATION_RELU", "eltwise_relu"),
    "Sigmoid": ("sigmoid", (), "CUDNN_ACTIVATION_SIGMOID", "eltwise_logistic"),
    "Tanh": ("tanh", (), "CUDNN_ACTIVATION_TANH", "eltwise_tanh"),
    "Elu": ("elu", ("alpha",), "CUDNN_ACTIVATION_ELU", "eltwise_elu"),
    "Clip": ("clip", ("min", "max"), "CUDNN_ACTIVATION_CLIPPED_RELU", "eltwise_clip"),
    "LeakyRelu": ("leakyrelu", ("alpha",), None, "eltwise_relu"),
    "Softplus": ("softplus", (), None, "eltwise_soft_relu"),
    "HardSigmoid": ("hardsigmoid", ("alpha", "beta"), None, "eltwise_hardsigmoid"),
    "Exp": ("exp", (), None, "eltwise_exp"),
    "Log": ("log", (), None, "eltwise_log"),
    "Abs": ("abs", (), None, "eltwise_abs"),
    "Sqrt": ("sqrt", (), None, "eltwise_sqrt"),
    "Neg": ("neg", (), None, "eltwise_linear"),
    "Swish": ("swish", ("alpha",), "CUDNN_ACTIVATION_SWISH", "eltwise_swish"),
    "HardSwish": ("hardswish", (), None, "eltwise_hardswish"),
    "Gelu": ("gelu", (), None, "eltwise_gelu_erf"),  # approximate="tanh" is alg gelutanh
    "Erf": ("erf", (), None, None),  # oneDNN has no erf alone (its GELU is the erf form)
    "Reciprocal": ("reciprocal", (), None, "eltwise_pow"),  # oneDNN: 1·x^-1
    # rotary embeddings' cos/sin of the positions: cuDNN pointwise nodes; oneDNN (2.x and 3.x)
    # has no trigonometric eltwise algorithm
    "Cos": ("cos", (), None, None),
    "Sin": ("sin", (), None, None),
    # the masked softmax's NaN guard: x ≠ x holds exactly for NaN. oneDNN: binary_ne of x with
    # itself (runtime_cpp make_isnan); cuDNN has no isnan pointwise mode: a CMP_NEQ node reading
    # one tensor as both operands (graph.cpp)
    "IsNaN": ("isnan", (), None, "binary_ne"),
}
_CUDNN_ACTIVATION = {alg: mode for alg, _, mode, _ in _ELTWISE.values()}

_ELTWISE_DEFAULTS = {"LeakyRelu": {"alpha": 0.01}, "Elu": {"alpha": 1.0},
                     "HardSigmoid": {"alpha": 0.2, "beta": 0.5}, "Swish": {"alpha": 1.0}}


def _clip_bounds(view: NodeView) -> tuple[float | None, float | None]:
    """Clip's (min, max): ±FLT_MAX when unbounded, None when a run-time tensor."""
    if view.opset < 11:
        return _bound(view.attrs.get("min", -FLT_MAX)), _bound(view.attrs.get("max", FLT_MAX))
    bounds: list[float | None] = []
    for i, default in ((1, -FLT_MAX), (2, FLT_MAX)):
        if present(view, i):
            v = view.value(i)
            bounds.append(_bound(v.reshape(-1)[0]) if v is not None else None)
        else:
            bounds.append(default)
    return bounds[0], bounds[1]


def _bound(x: float) -> float:
    x = float(x)
    return math.copysign(FLT_MAX, x) if abs(x) >= FLT_MAX else f32(x)


def _eltwise_build(view: NodeView) -> Problem:
    alg, names, _, _ = _ELTWISE[view.op]
    shape = tuple(required(view, 0).shape)
    if view.op == "Clip":
        lo, hi = _clip_bounds(view)
        return EltwiseProblem(alg, shape, min=lo, max=hi)
    if view.op == "Gelu" and view.attrs.get("approximate", "none") == "tanh":
        alg = "gelutanh"
    defaults = _ELTWISE_DEFAULTS.get(view.op, {})
    coef = {n: f32(view.attrs.get(n, defaults[n])) for n in names}
    return EltwiseProblem(alg, shape, alpha=coef.get("alpha"), beta=coef.get("beta"))




# element-wise ops the cuDNN legacy API lacks, each one pointwise node of the graph API
# (HardSigmoid a chain of three: alpha·x, + beta, a ReLU clipped to [0, 1]; IsNaN a CMP_NEQ of x
# with itself)
CUDNN_POINTWISE_UNARY = ("erf", "gelu", "gelutanh", "exp", "log", "abs", "neg", "softplus", "reciprocal", "cos",
                         "sin", "hardsigmoid", "isnan")


def _cudnn_api(p: Problem) -> str | None:
    assert isinstance(p, EltwiseProblem)
    if p.alg == "clip" and not (p.min == 0.0 and p.max is not None and p.max < FLT_MAX):
        return None  # cuDNN's CLIPPED_RELU is clip(x, 0, ceiling) only
    if p.alg == "sqrt":
        return "cudnnOpTensor"  # its one unary op besides NOT: CUDNN_OP_TENSOR_SQRT
    if p.alg in CUDNN_POINTWISE_UNARY and 1 <= len(p.shape) <= 8:
        return CUDNN_POINTWISE
    return "cudnnActivationForward" if _CUDNN_ACTIVATION.get(p.alg) else None


def _onednn_api(p: Problem) -> str | None:
    assert isinstance(p, EltwiseProblem)
    return None if p.alg in _NO_ONEDNN_ALG else "eltwise"


_NO_ONEDNN_ALG = {alg for alg, _, _, dnnl in _ELTWISE.values() if dnnl is None}


def _prelu_build(view: NodeView) -> Problem:
    return PreluProblem(tuple(required(view, 0).shape), tuple(required(view, 1).shape))



def _dropout_build(view: NodeView) -> Problem:
    """Dropout drops only in training: opset 12+'s training_mode input (a run-time tensor counts
    as training, since it may be), opsets ≤ 6's is_test=0; opsets 7–11 have no training mode."""
    shape = tuple(required(view, 0).shape)
    if view.opset >= 12:
        training = False
        if present(view, 2):
            mode = view.value(2)
            training = mode is None or bool(mode.reshape(-1)[0])
        v = view.value(1) if present(view, 1) else None
        ratio = float(v.reshape(-1)[0]) if v is not None else 0.5
    else:
        training = view.opset < 7 and not int(view.attrs.get("is_test", 0))
        ratio = float(view.attrs.get("ratio", 0.5))
    return DropoutProblem(shape, f32(ratio), True) if training else DropoutProblem(shape)


def _dropout_cudnn(p: Problem) -> str | None:
    assert isinstance(p, DropoutProblem)
    return "cudnnDropoutForward" if p.training else None  # inference: the identity, nothing to run


# --- lowerings -----------------------------------------------------------------------------

@dataclass(frozen=True)
class EltwiseParams:
    """oneDNN EltwiseParams."""

    alg: str
    shape: Dims
    alpha: float
    beta: float


def _onednn_row(p: EltwiseProblem, api: str) -> EltwiseParams:
    if p.alg == "clip":  # a run-time bound (None) is NaN in the runtime's tables
        alpha, beta = (float("nan") if b is None else b for b in (p.min, p.max))
    else:
        alpha, beta = p.alpha or 0.0, p.beta or 0.0
    return EltwiseParams(alg=p.alg, shape=p.shape, alpha=alpha, beta=beta)


# eltwise alg → (runtime mode, the parameter cuDNN's coefficient takes)
_ACTIVATIONS = {"relu": ("Relu", None), "sigmoid": ("Sigmoid", None), "tanh": ("Tanh", None),
                "elu": ("Elu", "alpha"), "clip": ("ClippedRelu", "max"), "swish": ("Swish", "alpha")}


@dataclass(frozen=True)
class ActLayer:
    """cuDNN ActLayer (cudnnActivationForward) over an N, C, H, W view."""

    mode: Cpp
    n: int
    c: int
    h: int
    w: int
    coef: float


def _activation_row(p: EltwiseProblem, api: str) -> ActLayer:
    mode, coef = _ACTIVATIONS[p.alg]
    n, c, h, w = fold4(p.shape)
    return ActLayer(mode=Cpp("ActMode::" + mode), n=n, c=c, h=h, w=w, coef=getattr(p, coef) if coef else 0.0)


def _sqrt_row(p: EltwiseProblem, api: str) -> BinaryLayer:
    """Sqrt: cudnnOpTensor's unary op, B ignored."""
    dims = fold4(p.shape) + (0,)
    return BinaryLayer(op=Cpp("BinaryOp::Sqrt"), swapped=False, rank=4, a=dims, b=dims, out=dims)


@dataclass(frozen=True)
class PreluParams:
    """oneDNN PreluParams."""

    shape: Dims
    slope: Dims


@dataclass(frozen=True)
class DropoutLayer:
    """cuDNN DropoutLayer (training dropout only: at inference it is the identity)."""

    n: int
    c: int
    h: int
    w: int
    ratio: float


def _dropout_row(p: DropoutProblem, api: str) -> DropoutLayer:
    n, c, h, w = fold4(p.shape)
    assert p.ratio is not None  # a training dropout keeps its ratio (inference is not benchmarked)
    return DropoutLayer(n=n, c=c, h=h, w=w, ratio=p.ratio)


ELTWISE = Family("eltwise", EltwiseProblem, tuple(_ELTWISE), _eltwise_build,
                 cudnn_api=_cudnn_api, onednn_api=_onednn_api,
                 cudnn={"cudnnActivationForward": CudnnLowering(CudnnTable("activation", "add_activation", False,
                                                                           False),
                                                                _activation_row),
                        "cudnnOpTensor": CudnnLowering(CUDNN_BINARY, _sqrt_row),
                        CUDNN_POINTWISE: CudnnLowering(CUDNN_POINTWISE_TABLE,
                                                       lambda p, api: pointwise_row(p.alg, p.shape, None, p.shape,
                                                                                    p.alpha or 0.0, p.beta or 0.0))},
                 onednn=OnednnLowering("eltwise", False, _onednn_row, reference=Fills(lambda p: (0,))))
PRELU = Family("prelu", PreluProblem, ("PRelu",), _prelu_build, onednn_api=const("prelu"),
               onednn=OnednnLowering("prelu", False, lambda p, api: PreluParams(shape=p.shape, slope=p.slope),
                                     reference=Fills(lambda p: (0, 1))))
DROPOUT = Family("dropout", DropoutProblem, ("Dropout",), _dropout_build, cudnn_api=_dropout_cudnn,
                 cudnn={"cudnnDropoutForward": CudnnLowering(CudnnTable("dropout", "add_dropout", False, False),
                                                             _dropout_row)})
FAMILIES = (ELTWISE, PRELU, DROPOUT)


def _gelu_of(p: BinaryProblem, api: str) -> EltwiseParams:
    """The erf GELU decomposition, from its Div: one GELU of its input."""
    return EltwiseParams(alg="gelu", shape=p.out, alpha=0.0, beta=0.0)


def _gelu_pointwise(p: BinaryProblem, api: str) -> object:
    """cuDNN runs it as its Div's pointwise node with the call that applies GELU to A."""
    a, b = p.shapes
    return pointwise_row(p.alg, a, b, p.out)


def _gelu_tanh_of(p: EltwiseProblem, api: str) -> EltwiseParams:
    """The tanh GELU decomposition, from its Tanh (whose shape is x's: every other operand is a
    scalar): one oneDNN eltwise_gelu_tanh of x."""
    return EltwiseParams(alg="gelutanh", shape=p.shape, alpha=0.0, beta=0.0)


def _gelu_tanh_pointwise(p: EltwiseProblem, api: str) -> object:
    """cuDNN: one GELU_APPROX_TANH_FWD pointwise node of x."""
    return pointwise_row("gelutanh", p.shape, None, p.shape)


PATTERNS = (PatternLowering("gelu_erf", onednn=("eltwise", _gelu_of),
                            cudnn=CudnnLowering(CUDNN_POINTWISE_TABLE, _gelu_pointwise, "kGeluOfA")),
            PatternLowering("gelu_tanh", onednn=("eltwise", _gelu_tanh_of),
                            cudnn=CudnnLowering(CUDNN_POINTWISE_TABLE, _gelu_tanh_pointwise)))


def gelu_reference(site: Site, v: Variant, gen: Gen, pattern: FusionPattern) -> Spec:
    """x, the Div's input (the decomposition reads it again in its Mul)."""
    return Spec(site.nodes, fill(site, gen, [(0, 0)]), last_output(site))


def gelu_tanh_reference(site: Site, v: Variant, gen: Gen, pattern: FusionPattern) -> Spec:
    """x, which the node after the Tanh in ``gelu_tanh_nodes``' order (Pow(x, 3) or Mul(x, x))
    reads as its first input (every other reader of x in the pattern shares the tensor)."""
    return Spec(site.nodes, fill(site, gen, [(1, 0)]), last_output(site))


# --- fusion: the nodes of the GELU decompositions in a model ---------------------------------

def gelu_nodes(model: Model, consumers: dict[int, list[int]], start: int) -> list[int] | None:
    """The nodes of x → Div(x, c) → Erf → Add(·, c) → Mul(x, ·) → Mul(·, c) from its Div (the
    constants are √2, 1 and ½ in every exporter that writes this form; the dynamo exporter
    multiplies by ½ before x), or None."""
    nodes = model.nodes
    div = nodes[start]
    if not isinstance(div.layer.problem, BinaryProblem) or div.layer.problem.alg != "div" \
            or len(div.inputs) != 1 or not div.constant_inputs:
        return None
    x = div.inputs[0]

    def only(i: int | None, op: str, constant: bool | None) -> int | None:
        if i is None:
            return None
        nxt = consumers[i]
        if len(nxt) != 1 or nodes[nxt[0]].layer.op != op:
            return None
        return nxt[0] if constant in (None, bool(nodes[nxt[0]].constant_inputs)) else None

    erf = only(start, "Erf", False)
    plus = only(erf, "Add", True)
    first = only(plus, "Mul", None)
    if erf is None or plus is None or first is None:
        return None
    half_first = bool(nodes[first].constant_inputs)
    second = only(first, "Mul", not half_first)
    if second is None:
        return None
    # x times what reaches it: Erf(x/√2) + 1, or its half
    times_x, reaching = (second, first) if half_first else (first, plus)
    if set(nodes[times_x].inputs) != {x, nodes[reaching].outputs[0]}:
        return None
    return [start, erf, plus, first, second]


def gelu_tanh_nodes(model: Model, consumers: dict[int, list[int]], start: int) -> list[int] | None:
    """The nodes of the tanh GELU ½·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) from its Tanh, or None:
    x³ as Pow(x, 3) (dynamo, transformers' ``gelu_new``) or x·(x·x) (TorchScript's decomposition of
    ``gelu(approximate="tanh")``), its product with a scalar constant, the Add of x, the product
    with a scalar constant, the Tanh, the Add of a scalar constant, then the products with x and a
    scalar constant in any order, ½·x possibly computed apart (``0.5 * x * (…)``). Each step is
    read by the next alone. The model keeps no constant's value (only Pow's exponent), so, as
    ``gelu_nodes``, the constants are recognised by their place: scalars where 0.044715, √(2/π),
    1 and ½ stand. The Tanh first, then the node reading x first (``gelu_tanh_reference``), the
    node writing the GELU last."""
    nodes = model.nodes

    def alone(i: int | None, reader: int) -> bool:
        return i is not None and consumers[i] == [reader]

    def by_scalar(i: int | None, op: str) -> bool:
        """Node ``i`` is ``op`` of one tensor and one scalar constant."""
        if i is None:
            return False
        n = nodes[i]
        return n.layer.op == op and len(n.inputs) == 1 and len(n.constant_specs) == 1 \
            and math.prod(n.constant_specs[0].shape) == 1

    def producer(i: int, k: int = 0) -> int | None:
        return model.producer.get(nodes[i].inputs[k]) if len(nodes[i].inputs) > k else None

    def cube(i: int | None, x: str, reader: int) -> list[int] | None:
        """x³ computed at node ``i``: Pow(x, 3), or x·(x·x) in either order of the outer product."""
        if not alone(i, reader):
            return None
        assert i is not None
        n = nodes[i]
        if isinstance(n.layer.problem, BinaryProblem) and n.layer.problem.alg == "pow" \
                and n.layer.problem.exponent == 3.0 and n.inputs == (x,):
            return [i]
        if n.layer.op != "Mul" or n.constant_inputs or x not in n.inputs or len(n.inputs) != 2:
            return None
        square = model.producer.get(n.inputs[1] if n.inputs[0] == x else n.inputs[0])
        if square is None or nodes[square].layer.op != "Mul" or nodes[square].inputs != (x, x) \
                or not alone(square, i):
            return None
        return [square, i]

    tanh = nodes[start]
    if tanh.layer.op != "Tanh" or len(tanh.inputs) != 1:
        return None
    scaled = producer(start)  # √(2/π)·(x + 0.044715·x³)
    if scaled is None or not by_scalar(scaled, "Mul") or not alone(scaled, start):
        return None
    add = producer(scaled)
    if add is None or nodes[add].layer.op != "Add" or len(nodes[add].inputs) != 2 or not alone(add, scaled):
        return None
    head = None
    for k in (0, 1):
        kappa, x = producer(add, k), nodes[add].inputs[1 - k]
        if by_scalar(kappa, "Mul") and alone(kappa, add):
            assert kappa is not None
            cubed = cube(producer(kappa), x, kappa)
            if cubed is not None:
                head = cubed + [kappa, add, scaled, start]
                break
    if head is None:
        return None
    # forward: + 1, then ·x and ·½ in either order, or (½·x) computed apart times (1 + tanh)
    plus = consumers[start][0] if len(consumers[start]) == 1 else None
    if plus is None or not by_scalar(plus, "Add") or len(consumers[plus]) != 1:
        return None
    first = consumers[plus][0]
    one_plus = nodes[plus].outputs[0]
    tail: list[int] | None = None
    if by_scalar(first, "Mul") and len(consumers[first]) == 1:  # (1 + tanh)·½, then ·x
        second = consumers[first][0]
        if nodes[second].layer.op == "Mul" and set(nodes[second].inputs) == {x, nodes[first].outputs[0]}:
            tail = [plus, first, second]
    elif nodes[first].layer.op == "Mul" and len(nodes[first].inputs) == 2 and one_plus in nodes[first].inputs:
        other = nodes[first].inputs[1] if nodes[first].inputs[0] == one_plus else nodes[first].inputs[0]
        half = model.producer.get(other)
        if other == x and len(consumers[first]) == 1 and by_scalar(consumers[first][0], "Mul"):
            tail = [plus, first, consumers[first][0]]  # x·(1 + tanh), then ·½
        elif half is not None and by_scalar(half, "Mul") and nodes[half].inputs == (x,) and alone(half, first):
            tail = [plus, half, first]  # (½·x)·(1 + tanh)
    if tail is None:
        return None
    return [start] + head[:-1] + tail
