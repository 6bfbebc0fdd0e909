"""The op registry: how each ONNX op family becomes a layer.

Each family knows its key grammar, its canonical parameters, its MACs/FLOPs/bytes, and
which library call runs it (Table II of the paper for cuDNN/cuBLAS; the oneDNN primitive
for the CPU backend). An op with no library call is still a layer: it gets a generic key
and ``None`` as its API, so coverage reports list it instead of dropping it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from .layers import Layer, TensorSpec, format_dims, format_number, key_hash

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
    build: Callable[[NodeView], tuple[str, dict]]  # → (key, params)
    macs: Callable[[NodeView, dict], int]
    cudnn: Callable[[NodeView, dict], str | None]
    onednn: Callable[[NodeView, dict], str | None]


def _io_bytes(view: NodeView) -> int:
    tensors = [t for t in view.inputs if t is not None] + list(view.outputs)
    return sum(t.numel * ELEMENT_SIZE.get(t.dtype, 4) for t in tensors)


def _input(view: NodeView, i: int) -> TensorSpec:
    """An input the family cannot do without; ONNX lets only optional inputs be omitted."""
    t = view.inputs[i]
    if t is None:
        raise ValueError(f"required input {i} of {view.op} is omitted")
    return t


def _zero(view: NodeView, p: dict) -> int:
    return 0


def _const(api: str | None) -> Callable[[NodeView, dict], str | None]:
    return lambda view, p: api


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


def _pad_token(pt: int, pl: int, pb: int, pr: int) -> str:
    tok = f"ph{pt}pw{pl}"
    return tok if (pb, pr) == (pt, pl) else tok + f"pb{pb}pr{pr}"


def _conv_build(view: NodeView) -> tuple[str, dict]:
    x, w = _input(view, 0), _input(view, 1)
    y = view.outputs[0]
    a = view.attrs
    mb, ic, ih, iw = x.shape
    oc, _, kh, kw = w.shape
    k = tuple(a.get("kernel_shape") or (kh, kw))
    s = tuple(a.get("strides") or (1, 1))
    d = tuple(a.get("dilations") or (1, 1))
    pt, pl, pb, pr = explicit_pads(a, (ih, iw), k, s, d)
    bias = int(len(view.inputs) > 2 and view.inputs[2] is not None)
    g = int(a.get("group", 1))
    p = dict(mb=mb, ic=ic, ih=ih, iw=iw, oc=oc, oh=y.shape[2], ow=y.shape[3], kh=k[0], kw=k[1],
             sh=s[0], sw=s[1], pt=pt, pl=pl, pb=pb, pr=pr, dh=d[0], dw=d[1], g=g, bias=bias)
    key = (f"conv:mb{mb}_ic{ic}ih{ih}iw{iw}_oc{oc}oh{p['oh']}ow{p['ow']}_kh{k[0]}kw{k[1]}"
           f"_sh{s[0]}sw{s[1]}_{_pad_token(pt, pl, pb, pr)}_dh{d[0]}dw{d[1]}_g{g}_bias{bias}"
           f"_{view.dtype}")
    return key, p


def _conv_macs(view: NodeView, p: dict) -> int:
    return p["mb"] * p["oc"] * p["oh"] * p["ow"] * (p["ic"] // p["g"]) * p["kh"] * p["kw"]


def _is_4d(view: NodeView) -> bool:
    return view.inputs[0] is not None and len(view.inputs[0].shape) == 4


# --- pooling -----------------------------------------------------------------------------

_POOL_ALG = {"MaxPool": "max", "GlobalMaxPool": "gmax", "GlobalAveragePool": "gavg"}


def _pool_build(view: NodeView) -> tuple[str, dict]:
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
    p = dict(alg=alg, mb=mb, ic=ic, ih=ih, iw=iw, oh=y.shape[2], ow=y.shape[3], kh=k[0], kw=k[1],
             sh=s[0], sw=s[1], pt=pt, pl=pl, pb=pb, pr=pr, dh=d[0], dw=d[1])
    dil = f"_dh{d[0]}dw{d[1]}" if d != (1, 1) else ""
    key = (f"pool:{alg}_mb{mb}ic{ic}ih{ih}iw{iw}_oh{p['oh']}ow{p['ow']}_kh{k[0]}kw{k[1]}"
           f"_sh{s[0]}sw{s[1]}_{_pad_token(pt, pl, pb, pr)}{dil}_{view.dtype}")
    return key, p


# --- shape helpers for per-channel ops ---------------------------------------------------


def _nchw(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """Fold a rank 2..4 tensor into (N, C, H, W) as cuDNN's 4-d descriptors see it."""
    dims = list(shape) + [1] * (4 - len(shape))
    return dims[0], dims[1], dims[2], dims[3]


def _bnorm_build(view: NodeView) -> tuple[str, dict]:
    mb, ic, ih, iw = _nchw(_input(view, 0).shape)
    eps = float(view.attrs.get("epsilon", 1e-5))
    p = dict(mb=mb, ic=ic, ih=ih, iw=iw, eps=eps)
    return f"bnorm:mb{mb}ic{ic}ih{ih}iw{iw}_eps{format_number(eps)}_{view.dtype}", p


def _lrn_build(view: NodeView) -> tuple[str, dict]:
    mb, ic, ih, iw = _nchw(_input(view, 0).shape)
    a = view.attrs
    size, alpha, beta, bias = int(a["size"]), a.get("alpha", 1e-4), a.get("beta", 0.75), a.get("bias", 1.0)
    p = dict(mb=mb, ic=ic, ih=ih, iw=iw, size=size, alpha=alpha, beta=beta, k=bias)
    key = (f"lrn:mb{mb}ic{ic}ih{ih}iw{iw}_ls{size}_alpha{format_number(alpha)}"
           f"beta{format_number(beta)}k{format_number(bias)}_{view.dtype}")
    return key, p


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
}

_ELTWISE_DEFAULTS = {"LeakyRelu": {"alpha": 0.01}, "Elu": {"alpha": 1.0},
                     "HardSigmoid": {"alpha": 0.2, "beta": 0.5}, "Swish": {"alpha": 1.0}}


def _clip_bounds(view: NodeView) -> tuple[float, float]:
    if view.opset < 11:
        return float(view.attrs.get("min", -3.4028234663852886e38)), float(
            view.attrs.get("max", 3.4028234663852886e38))
    bounds = []
    for i, default in ((1, -3.4028234663852886e38), (2, 3.4028234663852886e38)):
        if i < len(view.inputs) and view.inputs[i] is not None:
            v = view.value(i)
            bounds.append(float(v.reshape(-1)[0]) if v is not None else float("nan"))
        else:
            bounds.append(default)
    return bounds[0], bounds[1]


def _eltwise_build(view: NodeView) -> tuple[str, dict]:
    alg, names, _, _ = _ELTWISE[view.op]
    p: dict = dict(alg=alg, shape=tuple(_input(view, 0).shape))
    if view.op == "Clip":
        lo, hi = _clip_bounds(view)
        p.update(min=lo, max=hi)
    else:
        defaults = _ELTWISE_DEFAULTS.get(view.op, {})
        for n in names:
            p[n] = float(view.attrs.get(n, defaults[n]))
    attrs = "".join(_bound_token(n, p[n]) for n in names)
    key = f"eltwise:{alg}_in{format_dims(p['shape'])}" + (f"_{attrs}" if attrs else "")
    return key + f"_{view.dtype}", p


def _bound_token(name: str, x: float) -> str:
    """Clip bounds: omitted when unbounded (±FLT_MAX), ``dyn`` when a run-time tensor."""
    if math.isnan(x):
        return name + "dyn"
    if abs(x) >= 3.4e38:
        return ""
    return name + format_number(x)


def _eltwise_cudnn(view: NodeView, p: dict) -> str | None:
    mode = _ELTWISE[view.op][2]
    if view.op == "Clip" and not (p["min"] == 0.0 and not math.isnan(p["max"]) and abs(p["max"]) < 3.4e38):
        return None  # cuDNN's CLIPPED_RELU is clip(x, 0, ceiling) only
    return "cudnnActivationForward" if mode else None


def _eltwise_onednn(view: NodeView, p: dict) -> str | None:
    return "eltwise"


def _prelu_build(view: NodeView) -> tuple[str, dict]:
    x, slope = _input(view, 0), _input(view, 1)
    p = dict(shape=tuple(x.shape), slope=tuple(slope.shape))
    return f"prelu:in{format_dims(x.shape)}_slope{format_dims(slope.shape)}_{view.dtype}", p


# --- binary / n-ary element-wise ---------------------------------------------------------

_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Min": "min", "Max": "max",
           "Sum": "sum", "Pow": "pow"}


def _binary_build(view: NodeView) -> tuple[str, dict]:
    alg = _BINARY[view.op]
    shapes = tuple(tuple(t.shape) for t in view.inputs if t is not None)
    consts = tuple(int(c) for c, t in zip(view.constant, view.inputs) if t is not None)
    p = dict(alg=alg, shapes=shapes, out=tuple(view.outputs[0].shape), const=consts)
    ins = "_".join(f"in{format_dims(s)}" for s in shapes)
    return f"binary:{alg}_{ins}_{view.dtype}", p


def _binary_cudnn(view: NodeView, p: dict) -> str | None:
    shapes, out = p["shapes"], p["out"]
    if len(shapes) != 2 or len(out) > 5:
        return None
    if p["alg"] == "mul" and any(math.prod(s) == 1 for s in shapes):
        return "cudnnScaleTensor"
    if p["alg"] in ("add", "sum") and tuple(shapes[0]) == out and _broadcasts_into(shapes[1], out):
        return "cudnnAddTensor"
    if p["alg"] in ("add", "sum", "sub", "mul", "min", "max"):
        return "cudnnOpTensor"
    return None


def _broadcasts_into(small: tuple[int, ...], big: tuple[int, ...]) -> bool:
    small = (1,) * (len(big) - len(small)) + tuple(small)
    return len(small) == len(big) and all(s in (1, b) for s, b in zip(small, big))


def _binary_onednn(view: NodeView, p: dict) -> str | None:
    if p["alg"] == "sum":
        return "sum" if all(s == p["out"] for s in p["shapes"]) else "binary"
    return None if p["alg"] == "pow" else "binary"


# --- GEMM / MatMul -----------------------------------------------------------------------


def _gemm_build(view: NodeView) -> tuple[str, dict]:
    a_, b_ = _input(view, 0).shape, _input(view, 1).shape
    at = view.attrs
    ta, tb = int(at.get("transA", 0)), int(at.get("transB", 0))
    m, k = (a_[1], a_[0]) if ta else (a_[0], a_[1])
    n = b_[0] if tb else b_[1]
    alpha, beta = float(at.get("alpha", 1.0)), float(at.get("beta", 1.0))
    c = tuple(view.inputs[2].shape) if len(view.inputs) > 2 and view.inputs[2] is not None else None
    p = dict(m=m, n=n, k=k, ta=ta, tb=tb, alpha=alpha, beta=beta, c=c)
    ctok = f"_c{format_dims(c)}" if c is not None else ""
    key = (f"gemm:m{m}n{n}k{k}_ta{ta}tb{tb}_alpha{format_number(alpha)}beta{format_number(beta)}"
           f"{ctok}_{view.dtype}")
    return key, p


def _gemm_macs(view: NodeView, p: dict) -> int:
    return p["m"] * p["n"] * p["k"] * p.get("batch", 1)


def _gemm_cudnn(view: NodeView, p: dict) -> str:
    return "cublasSgemv" if p["m"] == 1 or p["n"] == 1 else "cublasGemmEx"


def _gemm_onednn(view: NodeView, p: dict) -> str:
    fc = p["ta"] == 0 and p["tb"] == 1 and (p["c"] is None or len(p["c"]) == 1)
    return "inner_product" if fc else "matmul"


def _matmul_build(view: NodeView) -> tuple[str, dict]:
    a_, b_ = tuple(_input(view, 0).shape), tuple(_input(view, 1).shape)
    a2 = (1,) + a_ if len(a_) == 1 else a_
    b2 = b_ + (1,) if len(b_) == 1 else b_
    m, k, n = a2[-2], a2[-1], b2[-1]
    batch = math.prod(view.outputs[0].shape) // max(1, m * n) if view.outputs[0].shape else 1
    p = dict(a=a_, b=b_, m=m, n=n, k=k, batch=batch)
    return f"matmul:a{format_dims(a_)}_b{format_dims(b_)}_{view.dtype}", p


def _matmul_cudnn(view: NodeView, p: dict) -> str:
    if p["batch"] > 1:
        return "cublasGemmStridedBatchedEx"
    return "cublasSgemv" if p["m"] == 1 or p["n"] == 1 else "cublasGemmEx"


# --- softmax, dropout, RNN ---------------------------------------------------------------


def _softmax_build(view: NodeView) -> tuple[str, dict]:
    shape = tuple(_input(view, 0).shape)
    rank = len(shape)
    legacy = view.opset < 13
    axis = int(view.attrs.get("axis", 1 if legacy else -1))
    axis = axis + rank if axis < 0 else axis
    # Before opset 13 the input is coerced to 2-D at `axis`; that only differs from a
    # one-axis softmax when the axis is not the last one.
    flat = legacy and axis != rank - 1
    alg = "logsoftmax" if view.op == "LogSoftmax" else "softmax"
    p = dict(alg=alg, shape=shape, axis=axis, flat=int(flat))
    key = f"softmax:{alg}_in{format_dims(shape)}_axis{axis}" + ("_flat" if flat else "")
    return key + f"_{view.dtype}", p


def _dropout_build(view: NodeView) -> tuple[str, dict]:
    shape = tuple(_input(view, 0).shape)
    if view.opset >= 12:
        v = view.value(1) if len(view.inputs) > 1 and view.inputs[1] is not None else None
        ratio = float(v.reshape(-1)[0]) if v is not None else 0.5
    else:
        ratio = float(view.attrs.get("ratio", 0.5))
    p = dict(shape=shape, ratio=ratio)
    return f"dropout:in{format_dims(shape)}_ratio{format_number(ratio)}_{view.dtype}", p


def _rnn_build(view: NodeView) -> tuple[str, dict]:
    x, w = _input(view, 0), _input(view, 1)
    a = view.attrs
    layout = int(a.get("layout", 0))
    seq, mb = (x.shape[1], x.shape[0]) if layout else (x.shape[0], x.shape[1])
    dirs = w.shape[0]
    hidden = int(a["hidden_size"])
    cell = view.op.lower()
    bias = int(len(view.inputs) > 3 and view.inputs[3] is not None)
    acts = a.get("activations")
    p: dict = dict(cell=cell, seq=seq, mb=mb, ic=x.shape[2], hidden=hidden, dirs=dirs, bias=bias,
                   layout=layout, lbr=int(a.get("linear_before_reset", 0)))
    key = f"rnn:{cell}_t{seq}mb{mb}_ic{x.shape[2]}_sic{hidden}_dir{dirs}_bias{bias}"
    if p["lbr"]:
        key += "_lbr1"
    if acts:
        p["activations"] = tuple(s.decode() if isinstance(s, bytes) else s for s in acts)
        key += "_" + "".join(_word(s) for s in p["activations"])
    return key + f"_{view.dtype}", p


_GATES = {"lstm": 4, "gru": 3, "rnn": 1}


def _rnn_macs(view: NodeView, p: dict) -> int:
    per_step = _GATES[p["cell"]] * (p["ic"] + p["hidden"]) * p["hidden"]
    return per_step * p["seq"] * p["mb"] * p["dirs"]


def _rnn_cudnn(view: NodeView, p: dict) -> str | None:
    return None if "activations" in p else "cudnnRNNForward"


def _concat_build(view: NodeView) -> tuple[str, dict]:
    rank = len(view.outputs[0].shape)
    axis = int(view.attrs["axis"])
    axis = axis + rank if axis < 0 else axis
    shapes = tuple(tuple(t.shape) for t in view.inputs if t is not None)
    p = dict(axis=axis, shapes=shapes)
    ins = "_".join(f"in{format_dims(s)}" for s in shapes)
    return f"concat:axis{axis}_{ins}_{view.dtype}", p


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
    if flat.size > _VALUE_INPUT_MAX:
        return "vh" + str(int(key_hash(flat.tobytes().hex()), 16) % 10**12)
    if flat.size == 0:
        return "v"
    items = [format_number(x.item()) for x in flat]
    return "v" + "x".join(items)


def _generic_build(view: NodeView) -> tuple[str, dict]:
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
    family = _word(view.op)
    p = dict(shapes=tuple(tuple(t.shape) if t else () for t in view.inputs))
    return f"{family}:" + "_".join(tokens) + f"_{view.dtype}", p


# --- the registry ------------------------------------------------------------------------

CONV = Family("conv", _conv_build, _conv_macs, _const("cudnnConvolutionForward"), _const("convolution"))
POOL = Family("pool", _pool_build, _zero, _const("cudnnPoolingForward"), _const("pooling"))
BNORM = Family("bnorm", _bnorm_build, _zero, _const("cudnnBatchNormalizationForwardInference"),
               _const("batch_normalization"))
LRN = Family("lrn", _lrn_build, _zero, _const("cudnnLRNCrossChannelForward"), _const("lrn"))
ELTWISE = Family("eltwise", _eltwise_build, _zero, _eltwise_cudnn, _eltwise_onednn)
PRELU = Family("prelu", _prelu_build, _zero, _const(None), _const("prelu"))
BINARY = Family("binary", _binary_build, _zero, _binary_cudnn, _binary_onednn)
GEMM = Family("gemm", _gemm_build, _gemm_macs, _gemm_cudnn, _gemm_onednn)
MATMUL = Family("matmul", _matmul_build, _gemm_macs, _matmul_cudnn, _const("matmul"))
SOFTMAX = Family("softmax", _softmax_build, _zero, _const("cudnnSoftmaxForward"), _const("softmax"))
DROPOUT = Family("dropout", _dropout_build, _zero, _const("cudnnDropoutForward"), _const(None))
RNN = Family("rnn", _rnn_build, _rnn_macs, _rnn_cudnn, _const("rnn"))
CONCAT = Family("concat", _concat_build, _zero, _const(None), _const("concat"))
GENERIC = Family("generic", _generic_build, _zero, _const(None), _const(None))

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


def family_of(view: NodeView) -> Family:
    entry = _BY_OP.get(view.op)
    if entry is not None and entry[1](view):
        return entry[0]
    return GENERIC


def build_layer(view: NodeView) -> Layer:
    """The Layer record of one node: its key, parameters, work and library coverage."""
    family = family_of(view)
    key, params = family.build(view)
    macs = family.macs(view, params)
    elementwise = view.outputs[0].numel if view.outputs else 0
    return Layer(
        op=view.op,
        family=family.name if family is not GENERIC else key.split(":", 1)[0],
        key=key,
        inputs=tuple(t for t in view.inputs if t is not None),
        outputs=tuple(view.outputs),
        params=tuple(sorted((k, v) for k, v in params.items())),
        macs=macs,
        flops=2 * macs if macs else elementwise,
        bytes=_io_bytes(view),
        cudnn_api=family.cudnn(view, params),
        onednn_primitive=family.onednn(view, params),
    )
