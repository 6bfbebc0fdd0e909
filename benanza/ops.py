"""The op registry: how each ONNX op family becomes a layer.

Each family builds its typed problem (``benanza.problems``: key grammar, MACs) from an ONNX
node and names the library call that runs it (Table II of the paper for cuDNN/cuBLAS; the
oneDNN primitive for the CPU backend). An op with no library call is still a layer: it gets a
generic problem and ``None`` as its API, so coverage reports list it instead of dropping it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from .layers import FLOAT_DTYPES, Layer, TensorSpec
from .problems import (FLT_MAX, RNN_DEFAULT_ACTIVATIONS, TYPED, AttentionProblem, BinaryProblem, BnormProblem,
                       ConcatProblem, ConvProblem, CopyProblem, DeconvProblem, DropoutProblem, EltwiseProblem,
                       GemmProblem, GenericProblem, LnormProblem, LrnProblem, MatMulProblem, PoolProblem, PreluProblem,
                       Problem, ReduceProblem, ResampleProblem, RnnProblem, SoftmaxProblem, TransposeProblem,
                       canonical_operands, f32, format_dims, format_number, key_hash)

ELEMENT_SIZE = {
    "f32": 4, "f16": 2, "bf16": 2, "f64": 8, "i8": 1, "u8": 1, "i16": 2, "u16": 2,
    "i32": 4, "u32": 4, "i64": 8, "u64": 8, "b": 1, "str": 8,
}


@dataclass(frozen=True)
class NodeView:
    """What the registry sees of one ONNX node after shape inference.

    ``inputs`` holds ``None`` for omitted optional inputs. ``values`` has the numpy value of
    every constant input whose value can be known (initializers and folded constants);
    ``constant`` flags which inputs are constants at all.
    """

    op: str
    inputs: tuple[TensorSpec | None, ...]
    outputs: tuple[TensorSpec, ...]
    attrs: dict
    values: dict[int, Callable[[], np.ndarray]]
    constant: tuple[bool, ...]
    opset: int

    def value(self, i: int) -> np.ndarray | None:
        thunk = self.values.get(i)
        return None if thunk is None else thunk()

    @property
    def dtype(self) -> str:
        for t in self.inputs:
            if t is not None:
                return t.dtype
        return self.outputs[0].dtype if self.outputs else "f32"


@dataclass(frozen=True)
class Family:
    name: str
    build: Callable[[NodeView], Problem]
    cudnn: Callable[[Problem], str | None]
    onednn: Callable[[Problem], str | None]
    # the dtype the layer computes in: its first input's, unless the family says otherwise
    # (Where's first input is its boolean condition; the data it moves is its output's type)
    dtype: Callable[[NodeView], str] = lambda view: view.dtype


def _io_bytes(view: NodeView) -> int:
    tensors = [t for t in view.inputs if t is not None] + list(view.outputs)
    return sum(t.numel * ELEMENT_SIZE.get(t.dtype, 4) for t in tensors)


def _input(view: NodeView, i: int) -> TensorSpec:
    """An input the family cannot do without; ONNX lets only optional inputs be omitted."""
    t = view.inputs[i]
    if t is None:
        raise ValueError(f"required input {i} of {view.op} is omitted")
    return t


def _present(view: NodeView, i: int) -> bool:
    return len(view.inputs) > i and view.inputs[i] is not None


def _const(api: str | None) -> Callable[[Problem], str | None]:
    return lambda problem: api


# --- convolution -------------------------------------------------------------------------


AUTO_PAD_MODES = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def explicit_pads(attrs: dict, spatial: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
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


def _check_groups(op: str, ic: int, g: int, w_shape: tuple[int, ...], per_group_axis: int) -> None:
    """A model that splits channels into groups that do not divide them has no valid meaning;
    a benchmark of it would only fail when run."""
    if g < 1 or ic % g:
        raise ValueError(f"{op} group={g} does not divide its {ic} input channels")
    if per_group_axis == 1 and w_shape[1] * g != ic:
        raise ValueError(f"{op} weights of shape {list(w_shape)} take {w_shape[1] * g} input channels "
                         f"in {g} groups, the input has {ic}")
    if per_group_axis == 0 and w_shape[0] != ic:
        raise ValueError(f"{op} weights of shape {list(w_shape)} take {w_shape[0]} input channels, the input has {ic}")


def _conv_build(view: NodeView) -> Problem:
    x, w = _input(view, 0), _input(view, 1)
    y = view.outputs[0]
    a = view.attrs
    mb, ic, ih, iw = x.shape
    oc, _, kh, kw = w.shape
    _check_groups("Conv", ic, int(a.get("group", 1)), w.shape, 1)
    if oc % int(a.get("group", 1)):
        raise ValueError(f"Conv group={a.get('group')} does not divide its {oc} output channels")
    k = tuple(a.get("kernel_shape") or (kh, kw))
    s = tuple(a.get("strides") or (1, 1))
    d = tuple(a.get("dilations") or (1, 1))
    pt, pl, pb, pr = explicit_pads(a, (ih, iw), k, s, d)
    return ConvProblem(mb=mb, ic=ic, ih=ih, iw=iw, oc=oc, oh=y.shape[2], ow=y.shape[3], kh=k[0], kw=k[1],
                       sh=s[0], sw=s[1], pt=pt, pl=pl, pb=pb, pr=pr, dh=d[0], dw=d[1], g=int(a.get("group", 1)),
                       bias=_present(view, 2))


def _deconv_build(view: NodeView) -> Problem:
    """ONNX ConvTranspose. Its begin pads are the given ones (or auto_pad's/output_shape's
    split of the total); its end pads are what makes the inferred output come out, so
    output_padding and output_shape need no fields of their own."""
    x, w = _input(view, 0), _input(view, 1)
    y = view.outputs[0]
    a = view.attrs
    mb, ic, ih, iw = x.shape
    g = int(a.get("group", 1))
    _check_groups("ConvTranspose", ic, g, w.shape, 0)
    k = tuple(a.get("kernel_shape") or w.shape[2:])
    s = tuple(a.get("strides") or (1, 1))
    d = tuple(a.get("dilations") or (1, 1))
    out = y.shape[2:]
    total = [s[i] * ((ih, iw)[i] - 1) + (k[i] - 1) * d[i] + 1 - out[i] for i in range(2)]
    auto = a.get("auto_pad", "NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("SAME_UPPER", "SAME_LOWER") or (a.get("output_shape") and not a.get("pads")):
        begin = [t // 2 if auto == "SAME_UPPER" else t - t // 2 for t in total]
    elif auto == "VALID":
        begin = [0, 0]
    else:
        begin = [int(p) for p in (a.get("pads") or [0, 0, 0, 0])[:2]]
    return DeconvProblem(mb=mb, ic=ic, ih=ih, iw=iw, oc=w.shape[1] * g, oh=out[0], ow=out[1], kh=k[0], kw=k[1],
                         sh=s[0], sw=s[1], pt=begin[0], pl=begin[1], pb=total[0] - begin[0], pr=total[1] - begin[1],
                         dh=d[0], dw=d[1], g=g, bias=_present(view, 2))


def _is_4d(view: NodeView) -> bool:
    return view.inputs[0] is not None and len(view.inputs[0].shape) == 4


# --- pooling -----------------------------------------------------------------------------

_POOL_ALG = {"MaxPool": "max", "GlobalMaxPool": "gmax", "GlobalAveragePool": "gavg"}


def _pool_build(view: NodeView) -> Problem:
    x, y = _input(view, 0), view.outputs[0]
    a = view.attrs
    mb, ic, ih, iw = x.shape
    if view.op.startswith("Global"):
        k, s, d, pads = (ih, iw), (1, 1), (1, 1), [0, 0, 0, 0]
    else:
        k = tuple(a["kernel_shape"])
        s = tuple(a.get("strides") or (1, 1))
        d = tuple(a.get("dilations") or (1, 1))
        pads = explicit_pads(a, (ih, iw), k, s, d)
    if view.op == "AveragePool":
        alg = "avgi" if a.get("count_include_pad", 0) else "avgx"
    else:
        alg = _POOL_ALG[view.op]
    pt, pl, pb, pr = pads
    return PoolProblem(alg=alg, mb=mb, ic=ic, ih=ih, iw=iw, oh=y.shape[2], ow=y.shape[3], kh=k[0], kw=k[1],
                       sh=s[0], sw=s[1], pt=pt, pl=pl, pb=pb, pr=pr, dh=d[0], dw=d[1])


# --- shape helpers for per-channel ops ---------------------------------------------------


def _nchw(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """Fold a rank 2..4 tensor into (N, C, H, W) as cuDNN's 4-d descriptors see it."""
    dims = list(shape) + [1] * (4 - len(shape))
    return dims[0], dims[1], dims[2], dims[3]


def _bnorm_build(view: NodeView) -> Problem:
    mb, ic, ih, iw = _nchw(_input(view, 0).shape)
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
    mb, ic, ih, iw = _nchw(_input(view, 0).shape)
    a = view.attrs
    return LrnProblem(mb=mb, ic=ic, ih=ih, iw=iw, size=int(a["size"]), alpha=f32(a.get("alpha", 1e-4)),
                      beta=f32(a.get("beta", 0.75)), k=f32(a.get("bias", 1.0)))


# --- element-wise activations ------------------------------------------------------------

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
        if _present(view, i):
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
    shape = tuple(_input(view, 0).shape)
    if view.op == "Clip":
        lo, hi = _clip_bounds(view)
        return EltwiseProblem(alg, shape, min=lo, max=hi)
    if view.op == "Gelu" and view.attrs.get("approximate", "none") == "tanh":
        alg = "gelutanh"
    defaults = _ELTWISE_DEFAULTS.get(view.op, {})
    coef = {n: f32(view.attrs.get(n, defaults[n])) for n in names}
    return EltwiseProblem(alg, shape, alpha=coef.get("alpha"), beta=coef.get("beta"))


# The cuDNN graph API's calls (the cudnn_frontend families of runtime_cpp/cudnn/graph.cpp).
CUDNN_POINTWISE, CUDNN_LAYERNORM, CUDNN_SDPA = "cudnn_frontend.pointwise", "cudnn_frontend.layernorm", \
    "cudnn_frontend.sdpa"
# element-wise ops the legacy API lacks, each one pointwise node of the graph API
CUDNN_POINTWISE_UNARY = ("erf", "gelu", "gelutanh", "exp", "log", "abs", "neg", "softplus")
CUDNN_POINTWISE_BINARY = ("div", "pow", "eq", "gt", "lt")


def _eltwise_cudnn(p: Problem) -> str | None:
    assert isinstance(p, EltwiseProblem)
    if p.alg == "clip" and not (p.min == 0.0 and p.max is not None and p.max < FLT_MAX):
        return None  # cuDNN's CLIPPED_RELU is clip(x, 0, ceiling) only
    if p.alg == "sqrt":
        return "cudnnOpTensor"  # its one unary op besides NOT: CUDNN_OP_TENSOR_SQRT
    if p.alg in CUDNN_POINTWISE_UNARY and 1 <= len(p.shape) <= 8:
        return CUDNN_POINTWISE
    return "cudnnActivationForward" if _CUDNN_ACTIVATION.get(p.alg) else None


def _eltwise_onednn(p: Problem) -> str | None:
    assert isinstance(p, EltwiseProblem)
    return None if p.alg in _NO_ONEDNN_ALG else "eltwise"


_NO_ONEDNN_ALG = {alg for alg, _, _, dnnl in _ELTWISE.values() if dnnl is None}


def _prelu_build(view: NodeView) -> Problem:
    return PreluProblem(tuple(_input(view, 0).shape), tuple(_input(view, 1).shape))


# --- binary / n-ary element-wise ---------------------------------------------------------

_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Min": "min", "Max": "max",
           "Sum": "sum", "Pow": "pow", "Equal": "eq", "Greater": "gt", "Less": "lt"}


def _binary_build(view: NodeView) -> Problem:
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


def _binary_cudnn(p: Problem) -> str | None:
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


def _binary_onednn(p: Problem) -> str | None:
    assert isinstance(p, BinaryProblem)
    if p.alg == "sum":
        return "sum" if all(s == p.out for s in p.shapes) else "binary"
    if p.alg == "pow":
        # x^c with a constant uniform exponent is oneDNN's eltwise pow; a tensor of exponents
        # has no oneDNN call
        return "eltwise" if p.exponent is not None and tuple(p.shapes[0]) == p.out else None
    return "binary"


# --- GEMM / MatMul -----------------------------------------------------------------------


def _gemm_build(view: NodeView) -> Problem:
    a_, b_ = _input(view, 0).shape, _input(view, 1).shape
    at = view.attrs
    ta, tb = bool(int(at.get("transA", 0))), bool(int(at.get("transB", 0)))
    m, k = (a_[1], a_[0]) if ta else (a_[0], a_[1])
    n = b_[0] if tb else b_[1]
    c = tuple(_input(view, 2).shape) if _present(view, 2) else None
    # Without C, beta multiplies nothing: Gemm(beta=0) and Gemm(beta=1) are one computation.
    beta = f32(at.get("beta", 1.0)) if c is not None else 0.0
    return GemmProblem(m=m, n=n, k=k, ta=ta, tb=tb, alpha=f32(at.get("alpha", 1.0)), beta=beta, c=c)


def _gemm_cudnn(p: Problem) -> str:
    assert isinstance(p, GemmProblem)
    return "cublasSgemv" if p.m == 1 or p.n == 1 else "cublasGemmEx"


def _gemm_onednn(p: Problem) -> str:
    assert isinstance(p, GemmProblem)
    fc = not p.ta and p.tb and (p.c is None or len(p.c) == 1)
    return "inner_product" if fc else "matmul"


def _matmul_build(view: NodeView) -> Problem:
    a, b = tuple(_input(view, 0).shape), tuple(_input(view, 1).shape)
    # A weight without a batch of its own ([K, N], or [1, K, N]) broadcast over A's leading dims
    # is one GEMM with M = their product: A's rows lie contiguous, and that is what frameworks
    # run ([128, 1, 256]×[256, 768] is 128×256×768, not 128 GEMMs with m=1). Only a B with its
    # own batch makes a batched GEMM.
    if len(a) >= 2 and len(b) >= 2 and math.prod(b[:-2]) == 1 and (len(a) > 2 or len(b) > 2):
        a, b = (math.prod(a[:-1]), a[-1]), b[-2:]
    return MatMulProblem(a, b)


def _matmul_cudnn(p: Problem) -> str:
    assert isinstance(p, MatMulProblem)
    if p.batch > 1:
        return "cublasGemmStridedBatchedEx"
    return "cublasSgemv" if p.m == 1 or p.n == 1 else "cublasGemmEx"


# --- softmax, dropout, RNN ---------------------------------------------------------------


def _softmax_build(view: NodeView) -> Problem:
    shape = tuple(_input(view, 0).shape)
    rank = len(shape)
    legacy = view.opset < 13
    axis = int(view.attrs.get("axis", 1 if legacy else -1))
    axis = axis + rank if axis < 0 else axis
    # Before opset 13 the input is coerced to 2-D at `axis`; that only differs from a
    # one-axis softmax when the axis is not the last one.
    flat = legacy and axis != rank - 1
    return SoftmaxProblem("logsoftmax" if view.op == "LogSoftmax" else "softmax", shape, axis, flat)


def _dropout_build(view: NodeView) -> Problem:
    """Dropout drops only in training: opset 12+'s training_mode input (a run-time tensor counts
    as training, since it may be), opsets ≤ 6's is_test=0; opsets 7–11 have no training mode."""
    shape = tuple(_input(view, 0).shape)
    if view.opset >= 12:
        training = False
        if _present(view, 2):
            mode = view.value(2)
            training = mode is None or bool(mode.reshape(-1)[0])
        v = view.value(1) if _present(view, 1) else None
        ratio = float(v.reshape(-1)[0]) if v is not None else 0.5
    else:
        training = view.opset < 7 and not int(view.attrs.get("is_test", 0))
        ratio = float(view.attrs.get("ratio", 0.5))
    return DropoutProblem(shape, f32(ratio), True) if training else DropoutProblem(shape)


def _dropout_cudnn(p: Problem) -> str | None:
    assert isinstance(p, DropoutProblem)
    return "cudnnDropoutForward" if p.training else None  # inference: the identity, nothing to run


def _rnn_build(view: NodeView) -> Problem:
    x, w = _input(view, 0), _input(view, 1)
    a = view.attrs
    layout = int(a.get("layout", 0))
    seq, mb = (x.shape[1], x.shape[0]) if layout else (x.shape[0], x.shape[1])
    dirs = w.shape[0]
    cell = view.op.lower()
    acts = tuple(_word(s) for s in a.get("activations") or ())
    if acts == RNN_DEFAULT_ACTIVATIONS[cell] * dirs:
        acts = ()  # spelled-out defaults compute what omitted ones do
    clip = a.get("clip")
    return RnnProblem(cell=cell, seq=seq, mb=mb, ic=x.shape[2], hidden=int(a["hidden_size"]), dirs=dirs,
                      bias=_present(view, 3), lbr=bool(int(a.get("linear_before_reset", 0))),
                      clip=f32(clip) if clip is not None else None,
                      input_forget=bool(int(a.get("input_forget", 0))),
                      peephole=cell == "lstm" and _present(view, 7), activations=acts,
                      act_alpha=tuple(f32(v) for v in a.get("activation_alpha") or ()) if acts else (),
                      act_beta=tuple(f32(v) for v in a.get("activation_beta") or ()) if acts else ())


def _rnn_cudnn(p: Problem) -> str | None:
    assert isinstance(p, RnnProblem)
    # cuDNN's cells have the default activations, no coupled input-forget gate and no
    # peepholes; a cell clip the benchmarks do not set is a different computation.
    plain = not (p.activations or p.input_forget or p.peephole or p.clip is not None)
    return "cudnnRNNForward" if plain else None


def _concat_build(view: NodeView) -> Problem:
    rank = len(view.outputs[0].shape)
    axis = int(view.attrs["axis"])
    axis = axis + rank if axis < 0 else axis
    return ConcatProblem(axis, tuple(tuple(t.shape) for t in view.inputs if t is not None))


# --- layer normalization, reductions, transpose -----------------------------------------


def _lnorm_build(view: NodeView) -> Problem:
    shape = tuple(_input(view, 0).shape)
    axis = int(view.attrs.get("axis", -1))
    return LnormProblem(shape, axis + len(shape) if axis < 0 else axis, f32(view.attrs.get("epsilon", 1e-5)),
                        _present(view, 2))


_REDUCE = {"ReduceMean": "mean", "ReduceSum": "sum", "ReduceMax": "max", "ReduceMin": "min",
           "ReduceProd": "prod", "ReduceL1": "sumabs", "ReduceL2": "sqrtsumsq"}
# ReduceSum takes its axes as an input from opset 13 on, the others from opset 18 on.
_AXES_INPUT_FROM = {"ReduceSum": 13}


def _reduce_axes(view: NodeView) -> tuple[int, ...] | None:
    """Sorted non-negative axes; all of them when none are given. None: the axes are a run-time
    tensor, or an empty list with noop_with_empty_axes (the identity)."""
    rank = len(_input(view, 0).shape)
    if view.opset >= _AXES_INPUT_FROM.get(view.op, 18):
        if _present(view, 1):
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
    return ReduceProblem(_REDUCE[view.op], tuple(_input(view, 0).shape), axes)


def _reduce_onednn(p: Problem) -> str | None:
    assert isinstance(p, ReduceProblem)
    return "reduction" if 1 <= len(p.shape) <= 5 else None  # oneDNN reductions take ranks 1-5


def _reduce_cudnn(p: Problem) -> str | None:
    assert isinstance(p, ReduceProblem)
    return "cudnnReduceTensor" if 1 <= len(p.shape) <= 8 else None  # cuDNN tensors take ranks up to 8


def _transpose_build(view: NodeView) -> Problem:
    shape = tuple(_input(view, 0).shape)
    perm = tuple(int(a) for a in view.attrs.get("perm") or reversed(range(len(shape))))
    return TransposeProblem(shape, perm)


# --- data movement: copies of the same bytes ------------------------------------------------

# Gather/Slice/Split index values beyond this many regions are copied as dense outputs.
_MAX_REGIONS = 64


def _float_data(view: NodeView) -> bool:
    return bool(view.outputs) and all(o.dtype in FLOAT_DTYPES for o in view.outputs)


def _slice_window(view: NodeView) -> tuple[tuple[int, ...], tuple[int, ...], bool] | None:
    """(box, start) of a Slice in its input's rank, and whether every step is 1; None when a
    start, end, axis or step is a run-time tensor."""
    shape = _input(view, 0).shape
    rank = len(shape)
    if view.opset < 10:
        starts, ends = view.attrs.get("starts"), view.attrs.get("ends")
        axes, steps = view.attrs.get("axes"), None
    else:
        got = [view.value(i) if _present(view, i) else None for i in range(1, 5)]
        if got[0] is None or got[1] is None or any(_present(view, i) and got[i - 1] is None for i in (3, 4)):
            return None
        starts, ends, axes, steps = (None if g is None else [int(x) for x in g.reshape(-1)] for g in got)
    if starts is None or ends is None:
        return None
    axes = list(axes) if axes is not None else list(range(len(starts)))
    steps = list(steps) if steps is not None else [1] * len(starts)
    box, start = list(shape), [0] * rank
    for a, b, e, st in zip(axes, starts, ends, steps):
        a = a + rank if a < 0 else a
        first, _, step = slice(b, e, st).indices(shape[a])
        box[a] = len(range(*slice(b, e, st).indices(shape[a])))
        start[a] = first
        if step != 1:
            return tuple(box), tuple(start), False
    return tuple(box), tuple(start), True


def _copy_build(view: NodeView) -> Problem:
    op = _word(view.op)
    outs = tuple(tuple(o.shape) for o in view.outputs)
    dense = CopyProblem(op, "dense", None, outs)
    src = tuple(_input(view, 0).shape)
    rank = len(src)
    if view.op == "Slice":
        window = _slice_window(view)
        if window is None or not window[2]:
            return dense
        return CopyProblem(op, "region", src, (window[0],), (window[1],))
    if view.op == "Split":
        axis = int(view.attrs.get("axis", 0))
        axis = axis + rank if axis < 0 else axis
        at, boxes, offsets = 0, [], []
        for o in outs:
            offsets.append(tuple(at if i == axis else 0 for i in range(rank)))
            boxes.append(o)
            at += o[axis]
        return CopyProblem(op, "region", src, tuple(boxes), tuple(offsets))
    if view.op == "Gather":
        idx = view.value(1)
        axis = int(view.attrs.get("axis", 0))
        axis = axis + rank if axis < 0 else axis
        if idx is None or idx.size > _MAX_REGIONS:
            return dense
        box = tuple(1 if i == axis else d for i, d in enumerate(src))
        starts = tuple(tuple((int(j) + src[axis] if j < 0 else int(j)) if i == axis else 0 for i in range(rank))
                       for j in idx.reshape(-1))
        return CopyProblem(op, "region", src, (box,) * len(starts), starts)
    return dense  # Expand, Where, Trilu


def _copy_cudnn(p: Problem) -> str | None:
    assert isinstance(p, CopyProblem)
    # one cudnnTransformTensor per output (the runtime's table holds up to 8 of rank up to 8)
    ranks = [len(o) for o in p.outs] + [len(p.src or ())]
    return "cudnnTransformTensor" if 1 <= len(p.outs) <= 8 and max(ranks) <= 8 and min(ranks[:-1]) >= 1 else None


def _transpose_cudnn(p: Problem) -> str | None:
    assert isinstance(p, TransposeProblem)
    # the copy family's cudnnTransformTensor, its source read through permuted strides
    return "cudnnTransformTensor" if 1 <= len(p.shape) <= 8 else None


def _concat_cudnn(p: Problem) -> str | None:
    assert isinstance(p, ConcatProblem)
    # the copy family's cudnnTransformTensor, one per input, each written into its box of the output
    return "cudnnTransformTensor" if 1 <= len(p.shapes) <= 8 and 1 <= len(p.shapes[0]) <= 8 else None


def _copy_onednn(p: Problem) -> str | None:
    assert isinstance(p, CopyProblem)
    # a reorder per output, labelled: no oneDNN primitive computes these ops themselves
    return "reorder_copy" if all(1 <= len(o) <= 6 for o in p.outs) else None


# --- resampling -----------------------------------------------------------------------------

_RESAMPLE = {"nearest": "nearest", "linear": "linear", "bilinear": "linear"}


def _resample_plain(view: NodeView) -> bool:
    """Nearest or linear resizing of 3- to 5-d data over its spatial dims only (oneDNN resamples
    those; an ROI crop, antialiasing or a resized channel dim is another computation)."""
    x, y = _input(view, 0), view.outputs[0]
    mode = view.attrs.get("mode", "nearest")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    ctm = view.attrs.get("coordinate_transformation_mode", "half_pixel")
    ctm = ctm.decode() if isinstance(ctm, bytes) else ctm
    return (mode in _RESAMPLE and 3 <= len(x.shape) <= 5 and tuple(x.shape[:2]) == tuple(y.shape[:2])
            and ctm != "tf_crop_and_resize" and not int(view.attrs.get("antialias", 0)))


def _resample_build(view: NodeView) -> Problem:
    mode = view.attrs.get("mode", "nearest")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    return ResampleProblem(_RESAMPLE[mode], tuple(_input(view, 0).shape), tuple(view.outputs[0].shape))


# --- the ONNX Attention op ------------------------------------------------------------------


def _attention_plain(view: NodeView) -> bool:
    """The form the runtime's chain runs: 4-d Q/K/V with as many K/V heads as Q's, no KV cache,
    no softcap or extra outputs, a float mask (or none) that broadcasts as one [S, Skv]."""
    a = view.attrs
    shapes = [view.inputs[i].shape if _present(view, i) else () for i in range(3)]  # type: ignore[union-attr]
    if any(len(s) != 4 for s in shapes) or shapes[1][1] != shapes[0][1] or len(view.outputs) != 1:
        return False
    if any(_present(view, i) for i in range(4, len(view.inputs))):
        return False
    if float(a.get("softcap", 0.0)) != 0.0 or int(a.get("qk_matmul_output_mode", 0)) != 0:
        return False
    if _present(view, 3):
        mask = _input(view, 3)
        lead = (1,) * (4 - len(mask.shape)) + tuple(mask.shape)
        return mask.dtype in FLOAT_DTYPES and lead[:2] == (1, 1)
    return True


def _attention_build(view: NodeView) -> Problem:
    q, k, v = (tuple(_input(view, i).shape) for i in range(3))
    mask = tuple(_input(view, 3).shape) if _present(view, 3) else None
    scale = view.attrs.get("scale")
    return AttentionProblem(q, k, v, mask, bool(int(view.attrs.get("is_causal", 0))),
                            None if scale is None else f32(scale))


# --- generic fallback --------------------------------------------------------------------

_VALUE_INPUT_MAX = 64


def _word(s: object) -> str:
    text = s.decode() if isinstance(s, bytes) else str(s)
    return "".join(ch for ch in text.lower() if ch.isalpha()) or "x"


def _attr_token(name: str, value: object) -> str:
    n = _word(name)
    if isinstance(value, (bytes, str)):
        return n + _word(value)
    if isinstance(value, (list, tuple)):
        if value and isinstance(value[0], (bytes, str)):
            return n + "".join(_word(v) for v in value)
        return n + "x".join(format_number(v) for v in value) if value else n
    if isinstance(value, (int, float, np.integer, np.floating)):
        return n + format_number(value.item() if hasattr(value, "item") else value)
    # tensors and graphs: identify by content digest, digits only so the grammar holds
    return n + str(int(key_hash(repr(value)), 16) % 10**12)


def _values_token(arr: np.ndarray) -> str:
    flat = arr.reshape(-1)
    # the key grammar has no inf/nan (a causal mask's -inf): such values are identified by digest
    if flat.size > _VALUE_INPUT_MAX or (flat.dtype.kind == "f" and not np.all(np.isfinite(flat))):
        return "vh" + str(int(key_hash(flat.tobytes().hex()), 16) % 10**12)
    if flat.size == 0:
        return "v"
    items = [format_number(x.item()) for x in flat]
    return "v" + "x".join(items)


def _generic_build(view: NodeView) -> Problem:
    tokens = []
    for i, t in enumerate(view.inputs):
        if t is None:
            tokens.append("none")
            continue
        tokens.append(f"in{format_dims(t.shape)}")
        if view.constant[i]:
            v = view.value(i)
            if v is not None and (v.dtype.kind in "iub" or v.size <= 16):
                tokens.append(_values_token(v))
    for o in view.outputs:
        tokens.append(f"out{format_dims(o.shape)}")
        if o.dtype != view.dtype:
            tokens.append(f"to{o.dtype}")
    for name in sorted(view.attrs):
        tokens.append(_attr_token(name, view.attrs[name]))
    word = _word(view.op)
    if word in TYPED:  # e.g. a 3-D Conv: not the 2-D family of the same name
        word += f"{len(view.inputs[0].shape) - 2 if view.inputs and view.inputs[0] else 0}d"
    return GenericProblem(word, tuple(tokens) or ("none",))


def _same_cast_build(view: NodeView) -> Problem:
    generic = _generic_build(view)
    assert isinstance(generic, GenericProblem)
    return GenericProblem("identity", generic.tokens)


# --- the registry ------------------------------------------------------------------------

CONV = Family("conv", _conv_build, _const("cudnnConvolutionForward"), _const("convolution"))
POOL = Family("pool", _pool_build, _const("cudnnPoolingForward"), _const("pooling"))
BNORM = Family("bnorm", _bnorm_build, _inference_bnorm("cudnnBatchNormalizationForwardInference"),
               _inference_bnorm("batch_normalization"))
LRN = Family("lrn", _lrn_build, _const("cudnnLRNCrossChannelForward"), _const("lrn"))
ELTWISE = Family("eltwise", _eltwise_build, _eltwise_cudnn, _eltwise_onednn)
PRELU = Family("prelu", _prelu_build, _const(None), _const("prelu"))
BINARY = Family("binary", _binary_build, _binary_cudnn, _binary_onednn)
GEMM = Family("gemm", _gemm_build, _gemm_cudnn, _gemm_onednn)
MATMUL = Family("matmul", _matmul_build, _matmul_cudnn, _const("matmul"))
SOFTMAX = Family("softmax", _softmax_build, _const("cudnnSoftmaxForward"), _const("softmax"))
DROPOUT = Family("dropout", _dropout_build, _dropout_cudnn, _const(None))
# oneDNN has an RNN primitive, but Benanza's oneDNN benchmarks do not run it (no runtime family):
# such layers are not covered there rather than missing forever.
RNN = Family("rnn", _rnn_build, _rnn_cudnn, _const(None))
CONCAT = Family("concat", _concat_build, _concat_cudnn, _const("concat"))
LNORM = Family("lnorm", _lnorm_build, _const(CUDNN_LAYERNORM), _const("layer_normalization"))
REDUCE = Family("reduce", _reduce_build, _reduce_cudnn, _reduce_onednn)
TRANSPOSE = Family("transpose", _transpose_build, _transpose_cudnn, _const("reorder"))
DECONV = Family("deconv", _deconv_build, _const(None), _const("deconvolution"))
RESAMPLE = Family("resample", _resample_build, _const(None), _const("resampling"))
# oneDNN's primitive chain (matmul with post-ops, softmax, matmul), the attention patterns' too
ATTENTION = Family("attention", _attention_build, _const(CUDNN_SDPA), _const("matmul_softmax_matmul"))
COPY = Family("copy", _copy_build, _copy_cudnn, _copy_onednn, lambda v: v.outputs[0].dtype)
GENERIC = Family("generic", _generic_build, _const(None), _const(None))
SAME_CAST = Family("identity", _same_cast_build, _const(None), _const(None))

_BY_OP: dict[str, tuple[Family, Callable[[NodeView], bool]]] = {}


def _register(family: Family, ops, when: Callable[[NodeView], bool] = lambda v: True) -> None:
    for op in ops:
        _BY_OP[op] = (family, when)


_register(CONV, ["Conv"], _is_4d)
_register(POOL, ["MaxPool", "AveragePool", "GlobalMaxPool", "GlobalAveragePool"],
          lambda v: _is_4d(v) and len(v.outputs) == 1)
_register(BNORM, ["BatchNormalization"],
          lambda v: 2 <= len(_input(v, 0).shape) <= 4 and len(v.outputs) == 1)
_register(LRN, ["LRN"], lambda v: 2 <= len(_input(v, 0).shape) <= 4)
_register(ELTWISE, list(_ELTWISE))
_register(PRELU, ["PRelu"])
_register(BINARY, list(_BINARY))
_register(GEMM, ["Gemm"])
_register(MATMUL, ["MatMul"])
_register(SOFTMAX, ["Softmax", "LogSoftmax"])
_register(DROPOUT, ["Dropout"])
_register(RNN, ["LSTM", "GRU", "RNN"])
_register(CONCAT, ["Concat"])
# The optional Mean/InvStdDev outputs are training statistics: only the inference form is a layer.
_register(LNORM, ["LayerNormalization"], lambda v: len(v.outputs) == 1)
_register(REDUCE, list(_REDUCE), lambda v: _reduce_axes(v) is not None)
_register(TRANSPOSE, ["Transpose"])
# Data movement on float data; on integers and booleans it is shape arithmetic or a mask, which
# no library computes on (and, with static shapes, frameworks fold at load time).
_register(COPY, ["Slice", "Split", "Gather", "Expand", "Trilu"],
          lambda v: _float_data(v) and _input(v, 0).dtype in FLOAT_DTYPES)
_register(COPY, ["Where"], _float_data)
_register(ATTENTION, ["Attention"], _attention_plain)
_register(DECONV, ["ConvTranspose"], _is_4d)
_register(RESAMPLE, ["Resize", "Upsample"], _resample_plain)
# A Cast to the type it already has (the TorchScript exporter writes them) computes nothing.
_register(SAME_CAST, ["Cast"], lambda v: bool(v.outputs) and v.outputs[0].dtype == _input(v, 0).dtype)


def family_of(view: NodeView) -> Family:
    entry = _BY_OP.get(view.op)
    if entry is not None and entry[1](view):
        return entry[0]
    return GENERIC


def build_layer(view: NodeView) -> Layer:
    """The Layer record of one node: its problem, work and library coverage.

    The benchmarks compute in float types only (cuDNN has no int64 tensors, oneDNN no s64), so
    integer and boolean layers (shape arithmetic, masks) are covered by neither library.
    """
    family = family_of(view)
    problem = family.build(view)
    macs = problem.macs()
    flops = problem.flops()
    elementwise = view.outputs[0].numel if view.outputs else 0
    dtype = family.dtype(view)
    numeric = dtype in FLOAT_DTYPES
    return Layer(
        op=view.op,
        problem=problem,
        dtype=dtype,
        inputs=tuple(t for t in view.inputs if t is not None),
        outputs=tuple(view.outputs),
        macs=macs,
        flops=elementwise if flops is None else flops,
        bytes=_io_bytes(view),
        cudnn_api=family.cudnn(problem) if numeric else None,
        onednn_primitive=family.onednn(problem) if numeric else None,
    )
