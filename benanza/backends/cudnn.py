"""cuDNN/cuBLAS backend (paper §III-B, Table II): unique layers → variants → C++ tables.

Each layer's ``cudnn_api`` (set by the op registry) picks a runtime family in
``runtime_cpp/cudnn``; the generator writes one table of layer parameters plus one table of
variants per family (split into parts so the compile runs in parallel), a ``registry.cpp`` that
registers them, and a CMake project that links them with the runtime, cuDNN and cuBLAS.

Expansion (every combination the library can run; the library itself rejects the rest at run
time, recorded as "unsupported" with its status string):

- Convolution: the 8 forward algorithms × dtypes × layouts (NCHW, NHWC) × math modes, plus one
  fused ``cudnnConvolutionBiasActivationForward`` set per fusion pattern the models use on the
  layer (``benanza.fusion``): RELU with every algorithm, IDENTITY (Conv→Bias, Conv→BN) with
  IMPLICIT_PRECOMP_GEMM only, the one algorithm cuDNN allows with it. A convolution with a bias
  input is timed unfused as cudnnConvolutionForward followed by cudnnAddTensor, as a framework
  runs it.
- Asymmetric padding (which cuDNN's legacy API cannot express) is benchmarked with the larger pad
  on both sides; the result reports the added padding in its ``pad_added`` counter and a warning
  is logged here. The measured work is then a slight superset of the layer's.
- Pooling, batch norm and LRN get both layouts; element-wise families, softmax, dropout and RNNs
  one (``nchw``, meaning plain row-major). Dropout is benchmarked only when it drops (training
  mode); at inference it is the identity and no call runs it.
- Math (``MATHS``; one vocabulary for cuDNN and cuBLAS, so a bound names what it
  assumed): ``fma`` = no Tensor Cores, no TF32 (true fp32/fp16 arithmetic); ``tf32_allowed`` =
  fp32 data, the library may use TF32 Tensor Cores (PyTorch's default for cuDNN convolutions,
  not for its matmuls); ``tensor_op`` = 16-bit data on Tensor Cores. Defaults: f32→fma,
  f16→tensor_op, bf16→tensor_op; ask for ``--math fma --math tf32_allowed`` to get both f32
  bounds. Math applies to convolutions, GEMMs and RNNs; the other families have no math
  setting and are named ``default``. ``cublasSgemv`` has none either: it is ``fma`` whatever
  was asked, generated once.
- Reductions (ReduceSum/Mean/Max/Min/Prod/L1/L2) are one cudnnReduceTensor with fp32 accumulation
  and no indices (ONNX's reductions return none), with the workspace cuDNN asks for; a dtype
  cuDNN cannot reduce is refused by the library and stored as unsupported. Transpose is the copy
  family's cudnnTransformTensor reading its source through permuted strides, Concat one such
  copy per input writing into its box of the output through strides (``into``); Sqrt is
  cudnnOpTensor's unary CUDNN_OP_TENSOR_SQRT in the binary family.
- RNNs run one layer of cudnnRNNForward (v8 API, inference) in cuDNN's packed sequence-major
  layout (ONNX layout 0; a batch-major layout=1 layer is timed sequence-major too). cuDNN's GRU
  is ONNX's linear_before_reset=1 form, which its ``implementation`` string says.
- GEMV layers (m or n = 1) use ``cublasSgemv`` in fp32 and ``cublasGemmEx`` for 16-bit types,
  which have no GEMV in cuBLAS. A MatMul whose weight has no batch of its own is already one 2-D
  GEMM (the processor folds A's leading dims into M); only a B with its own batch makes a
  ``cublasGemmStridedBatchedEx``.
- GEMM epilogues: a 2-D MatMul anchoring ``mm_bias``, ``mm_bias_relu`` or ``mm_bias_gelu`` also
  runs as one ``cublasLtMatmul`` with ``CUBLASLT_EPILOGUE_BIAS``, ``RELU_BIAS`` or ``GELU_BIAS``
  (cuBLASLt's GELU is the tanh approximation), one variant per rank of
  cublasLtMatmulAlgoGetHeuristic's answer (``LT_ALGOS``), with that algorithm's workspace; a rank
  the heuristic does not offer is stored as unsupported. Same dtypes and math modes as cuBLAS.
- The graph API through the header-only cuDNN frontend (runtime_cpp/cudnn/graph.cpp) runs what
  the legacy API lacks: LayerNormalization (inference), the ONNX Attention op as SDPA (flash
  attention forward, inference), and single pointwise nodes (Div, Pow, comparisons, Erf, GELU
  erf/tanh, Exp, Log, Abs, Neg, Softplus); and, as fused variants, the ``layernorm``, ``gelu_erf``
  and attention patterns of ``benanza.fusion`` (on their anchors' problems, the pattern in the
  variant's call). Each graph variant is a plan slot (``PLAN_ALGOS``): the i-th distinct engine
  config of the heuristics (mode A, then fallback), built and timed as its own plan with its
  workspace; its name is the implementation, the config count the ``engine_configs`` counter.
  SDPA is generated in fp16/bf16 only: cuDNN's flash attention takes no fp32, and an fp32
  request gets a warning per layer instead of a variant.

Run-time counters of every benchmark: ``flops``, ``bytes``, ``workspace_bytes``; convolutions
add ``algo``, ``heuristic_algo`` and ``find_algo`` (indexes into ``CONV_ALGOS``: what
cudnnGetConvolutionForwardAlgorithm_v7 and cudnnFindConvolutionForwardAlgorithm pick) and
``find_ms``, and the math type and workspace each of them chose: ``heuristic_math``,
``find_math`` (indexes into ``CUDNN_MATH_TYPES``), ``heuristic_workspace_bytes``,
``find_workspace_bytes``; ``cublasLtMatmul`` adds ``algo`` (the heuristic rank),
``heuristic_algos`` (how many it offered), ``lt_algo_id``, ``lt_tile_id``, ``lt_stages_id``,
``lt_splitk`` (the algorithm's configuration) and ``waves``. Timing counters
(runtime_cpp/cudnn/harness.cpp): ``calls`` per repetition, ``l2_flushed`` (1: the L2 cache was
flushed before every call, 0: hot-cache timing, ``BENANZA_L2=hot``), ``host_bound_reps``. In CUPTI mode each benchmark also prints a ``BENANZA_METRICS`` line with its kernels.
"""

from __future__ import annotations

import functools
import logging
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

import jinja2

from ..errors import BenanzaError
from ..escape import c_string
from ..fusion import BY_NAME as FUSION_PATTERNS
from ..generator import GenOptions, copy_runtime, write_if_changed
from ..layers import FLOAT_DTYPES, Layer, UniqueLayer
from ..manifest import Manifest
from ..ops import CUDNN_LAYERNORM, CUDNN_POINTWISE, CUDNN_SDPA, ELEMENT_SIZE
from ..problems import (AttentionProblem, BinaryProblem, BnormProblem, ConcatProblem, ConvProblem,
                        CopyProblem, DropoutProblem, EltwiseProblem, GemmProblem, LnormProblem, LrnProblem,
                        MatMulProblem, PoolProblem, Problem, ReduceProblem, RnnProblem, SoftmaxProblem,
                        TransposeProblem)
from ..records import Variant

log = logging.getLogger(__name__)

NAME = "cudnn"
# cudnnConvolutionFwdAlgo_t, in enum order: the runtime's algo counters index this tuple.
CONV_ALGOS = ("IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT", "FFT", "FFT_TILING",
              "WINOGRAD", "WINOGRAD_NONFUSED")
FUSED_API = "cudnnConvolutionBiasActivationForward"
# cuDNN runs the IDENTITY activation in the fused call with this algorithm only.
IDENTITY_ALGOS = ("IMPLICIT_PRECOMP_GEMM",)
# A MatMul's bias epilogue: one cublasLtMatmul per rank of cublasLtMatmulAlgoGetHeuristic's answer
# (runtime_cpp/cudnn/blas.cpp kLtAlgos asks for as many), each with the workspace it reports.
LT_API = "cublasLtMatmul"
LT_ALGOS = tuple(f"heuristic{i}" for i in range(8))
# the pattern's activation → the runtime's call (its CUBLASLT_EPILOGUE_*_BIAS)
_LT_CALLS = {"identity": "kLtBias", "gelu": "kLtBiasGelu", "relu": "kLtBiasRelu"}

DTYPES = ("f32", "f16", "bf16")
DEFAULT_DTYPES = ("f32", "f16")
LAYOUTS = ("nchw", "nhwc")
# Math modes, named for what they allow (runtime_cpp/cudnn/benanza_cudnn/tables.hpp maps each to
# a cudnnMathType_t and a cublasComputeType_t).
TF32_MATH = "tf32_allowed"  # the only mode that lets f32 data lose precision (analyzer.admits_math)
MATHS = ("fma", TF32_MATH, "tensor_op")
NO_MATH = "default"  # the name of families whose call has no math setting
DEFAULT_MATH = {"f32": "fma", "f16": "tensor_op", "bf16": "tensor_op"}
# Math modes per dtype where the call has a math setting (conv, GEMM, RNN).
TENSOR_MATH = {"f32": ("fma", "tf32_allowed"), "f16": ("tensor_op", "fma"), "bf16": ("tensor_op",)}
# cudnnMathType_t, in enum order: the heuristic_math and find_math counters index this tuple.
CUDNN_MATH_TYPES = ("CUDNN_DEFAULT_MATH", "CUDNN_TENSOR_OP_MATH", "CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION",
                    "CUDNN_FMA_MATH")

# Variants per C++ table file: keeps each generated translation unit small enough that the
# parts compile in parallel and a rebuild after regeneration recompiles only what changed.
PART_SIZE = 2500

_CPP = {"dtype": {"f32": "DType::F32", "f16": "DType::F16", "bf16": "DType::BF16"},
        "layout": {"nchw": "Layout::NCHW", "nhwc": "Layout::NHWC"},
        "math": {NO_MATH: "Math::Default", "fma": "Math::Fma", "tf32_allowed": "Math::Tf32Allowed",
                 "tensor_op": "Math::TensorOp"}}

Fields = list[tuple[str, str]]


@dataclass(frozen=True)
class Family:
    """How layers reach one runtime family: its C++ layer struct and registration function."""

    name: str
    struct: str
    add: str  # runtime registration function (tables.hpp)
    fields: Callable[[Layer], Fields]
    spatial: bool  # NCHW and NHWC both generated
    math: bool  # the call takes a math mode


# --- C++ literals --------------------------------------------------------------------------

def _int(x: object) -> str:
    return str(int(x))  # type: ignore[call-overload]


def _bool(x: object) -> str:
    return "true" if x else "false"


def _float(x: object) -> str:
    value = float(x)  # type: ignore[arg-type]
    if not math.isfinite(value):
        raise BenanzaError(f"non-finite layer parameter {value!r} cannot be benchmarked")
    return repr(value)


def _dims(dims: tuple[int, ...]) -> str:
    return "{" + ", ".join(str(int(d)) for d in dims) + "}"


def _work(layer: Layer) -> str:
    elements = layer.bytes // ELEMENT_SIZE.get(layer.dtype, 4)
    return f"{{.flops = {float(layer.flops)!r}, .elements = {float(elements)!r}}}"


def _p(problem: Problem, *names: str) -> list[Any]:
    return [getattr(problem, n) for n in names]


P = TypeVar("P", bound=Problem)


def _problem(layer: Layer, cls: type[P]) -> P:
    if not isinstance(layer.problem, cls):
        raise BenanzaError(f"layer {layer.key}: expected a {cls.__name__}")
    return layer.problem


def _fold4(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """N, C, H, W view of an element-wise tensor (trailing 1s; extra dims folded into W)."""
    dims = list(shape) + [1] * (4 - len(shape))
    return dims[0], dims[1], dims[2], math.prod(dims[3:])


def _align(shape: tuple[int, ...], rank: int) -> tuple[int, ...]:
    """Right-aligned to ``rank`` dims with leading 1s: NumPy/ONNX broadcasting."""
    return (1,) * (rank - len(shape)) + tuple(shape)


# --- per-family layer rows -----------------------------------------------------------------

def _conv_fields(layer: Layer) -> Fields:
    names = ("n", "c", "h", "w", "k", "r", "s", "pad_t", "pad_l", "pad_b", "pad_r", "stride_h",
             "stride_w", "dil_h", "dil_w", "groups", "out_h", "out_w")
    params = ("mb", "ic", "ih", "iw", "oc", "kh", "kw", "pt", "pl", "pb", "pr", "sh", "sw", "dh",
              "dw", "g", "oh", "ow")
    p = _problem(layer, ConvProblem)
    return ([(n, _int(v)) for n, v in zip(names, _p(p, *params))]
            + [("bias", _bool(p.bias)), ("work", _work(layer))])


_POOL_MODE = {"max": "Max", "gmax": "Max", "avgi": "AvgIncludePad", "avgx": "AvgExcludePad",
              "gavg": "AvgExcludePad"}


def _pool_fields(layer: Layer) -> Fields:
    names = ("n", "c", "h", "w", "out_h", "out_w", "kh", "kw", "stride_h", "stride_w", "pad_t",
             "pad_l", "pad_b", "pad_r", "dil_h", "dil_w")
    params = ("mb", "ic", "ih", "iw", "oh", "ow", "kh", "kw", "sh", "sw", "pt", "pl", "pb", "pr",
              "dh", "dw")
    p = _problem(layer, PoolProblem)
    return ([("mode", "PoolMode::" + _POOL_MODE[p.alg])]
            + [(n, _int(v)) for n, v in zip(names, _p(p, *params))]
            + [("work", _work(layer))])


def _bnorm_fields(layer: Layer) -> Fields:
    p = _problem(layer, BnormProblem)
    dims = [(n, _int(v)) for n, v in zip("nchw", _p(p, "mb", "ic", "ih", "iw"))]
    return dims + [("eps", _float(p.eps)), ("work", _work(layer))]


def _lrn_fields(layer: Layer) -> Fields:
    p = _problem(layer, LrnProblem)
    dims = [(n, _int(v)) for n, v in zip("nchw", _p(p, "mb", "ic", "ih", "iw"))]
    return dims + [("size", _int(p.size)), ("alpha", _float(p.alpha)), ("beta", _float(p.beta)),
                   ("k", _float(p.k)), ("work", _work(layer))]


# eltwise alg → (runtime mode, the parameter cuDNN's coefficient takes)
_ACTIVATIONS = {"relu": ("Relu", None), "sigmoid": ("Sigmoid", None), "tanh": ("Tanh", None),
                "elu": ("Elu", "alpha"), "clip": ("ClippedRelu", "max"), "swish": ("Swish", "alpha")}


def _activation_fields(layer: Layer) -> Fields:
    p = _problem(layer, EltwiseProblem)
    mode, coef = _ACTIVATIONS[p.alg]
    n, c, h, w = _fold4(p.shape)
    return [("mode", "ActMode::" + mode), ("n", _int(n)), ("c", _int(c)), ("h", _int(h)),
            ("w", _int(w)), ("coef", _float(getattr(p, coef) if coef else 0.0)),
            ("work", _work(layer))]


def _softmax_fields(layer: Layer) -> Fields:
    p = _problem(layer, SoftmaxProblem)
    shape, axis = p.shape, p.axis
    n = math.prod(shape[:axis])
    if p.flat:  # opset < 13: one softmax over the flattened trailing dims
        c, h = math.prod(shape[axis:]), 1
    else:
        c, h = shape[axis], math.prod(shape[axis + 1:])
    return [("log", _bool(p.alg == "logsoftmax")), ("n", _int(n)), ("c", _int(c)),
            ("h", _int(h)), ("work", _work(layer))]


def _dropout_fields(layer: Layer) -> Fields:
    p = _problem(layer, DropoutProblem)  # training dropout only: at inference it is the identity
    n, c, h, w = _fold4(p.shape)
    return [("n", _int(n)), ("c", _int(c)), ("h", _int(h)), ("w", _int(w)),
            ("ratio", _float(p.ratio)), ("work", _work(layer))]


_BINARY_OPS = {"add": "Add", "sum": "Add", "sub": "Sub", "mul": "Mul", "min": "Min", "max": "Max"}


def _binary_fields(layer: Layer) -> Fields:
    if isinstance(layer.problem, EltwiseProblem):  # Sqrt: cudnnOpTensor's unary op, B ignored
        dims = _dims(_fold4(layer.problem.shape) + (0,))
        return [("op", "BinaryOp::Sqrt"), ("swapped", "false"), ("rank", "4"), ("a", dims), ("b", dims),
                ("out", dims), ("work", _work(layer))]
    p = _problem(layer, BinaryProblem)
    shapes, out = p.shapes, p.out
    rank = max(4, len(out))
    a, b, o = _align(shapes[0], rank), _align(shapes[1], rank), _align(out, rank)
    if layer.cudnn_api == "cudnnAddTensor":
        op = "AddTensor"
    elif layer.cudnn_api == "cudnnScaleTensor":
        op = "Scale"
    else:
        op = _BINARY_OPS[p.alg]
    # cuDNN scales / adds into the operand that has the output's shape: put it first.
    swapped = a != o and b == o if op != "Scale" else math.prod(a) == 1
    if swapped:
        a, b = b, a
    pad = (0,) * (5 - rank)
    return [("op", "BinaryOp::" + op), ("swapped", _bool(swapped)), ("rank", _int(rank)),
            ("a", _dims(a + pad)), ("b", _dims(b + pad)), ("out", _dims(o + pad)),
            ("work", _work(layer))]


_CELLS = {"lstm": "Lstm", "gru": "Gru", "rnn": "RnnTanh"}


def _rnn_fields(layer: Layer) -> Fields:
    p = _problem(layer, RnnProblem)
    return [("cell", "Cell::" + _CELLS[p.cell]), ("seq", _int(p.seq)),
            ("batch", _int(p.mb)), ("input", _int(p.ic)), ("hidden", _int(p.hidden)),
            ("dirs", _int(p.dirs)), ("bias", _bool(p.bias)), ("work", _work(layer))]


def _blas_fields(layer: Layer) -> Fields:
    p = layer.problem
    if isinstance(p, GemmProblem):  # without C its beta is 0: nothing to accumulate
        m, n, k, ta, tb, alpha, beta = _p(p, "m", "n", "k", "ta", "tb", "alpha", "beta")
        batch = a_count = b_count = 1
    else:  # MatMul: batched over the leading dims, either operand possibly broadcast
        mm = _problem(layer, MatMulProblem)
        m, n, k, batch = mm.m, mm.n, mm.k, mm.batch
        ta, tb, alpha, beta = 0, 0, 1.0, 0.0
        a_count, b_count = math.prod(mm.a[:-2]), math.prod(mm.b[:-2])
    return [("m", _int(m)), ("n", _int(n)), ("k", _int(k)), ("trans_a", _bool(ta)),
            ("trans_b", _bool(tb)), ("batch", _int(batch)), ("a_count", _int(a_count)),
            ("b_count", _int(b_count)), ("alpha", _float(alpha)), ("beta", _float(beta)),
            ("work", _work(layer))]


def _dims8(dims: tuple[int, ...], rank: int, fill: int) -> str:
    """Right-aligned to ``rank`` dims with leading ``fill``s, padded with 0s to the runtime's 8."""
    return _dims((fill,) * (rank - len(dims)) + tuple(dims) + (0,) * (8 - rank))


def _copy_fields(layer: Layer) -> Fields:
    p = layer.problem
    outs: tuple[tuple[int, ...], ...]
    offsets: tuple[tuple[int, ...], ...]
    into = False
    if isinstance(p, TransposeProblem):  # one box, the whole input, read in the permuted order
        src, outs, offsets, perm = p.shape, (tuple(p.shape[a] for a in p.perm),), ((0,) * len(p.shape),), p.perm
        region = True
    elif isinstance(p, ConcatProblem):  # each input written into its box of the output
        at_axis = [sum(s[p.axis] for s in p.shapes[:i]) for i in range(len(p.shapes))]
        src = p.shapes[0][:p.axis] + (at_axis[-1] + p.shapes[-1][p.axis],) + p.shapes[0][p.axis + 1:]
        outs = p.shapes
        offsets = tuple(tuple(at if d == p.axis else 0 for d in range(len(src))) for at in at_axis)
        region, into, perm = True, True, tuple(range(len(src)))
    else:
        c = _problem(layer, CopyProblem)
        src, outs, offsets, region = c.src or (), c.outs, c.offsets, c.how == "region"
        perm = tuple(range(len(src)))
    rank = max([4, len(src)] + [len(o) for o in outs])
    lead = rank - len(src)  # the leading 1s keep their places; the permuted dims shift past them
    boxes = [_dims8(o, rank, 1) for o in outs] + [_dims8((), 0, 0)] * (8 - len(outs))
    starts = [_dims8(a, rank, 0) for a in offsets] + [_dims8((), 0, 0)] * (8 - len(offsets))
    order = tuple(range(lead)) + tuple(a + lead for a in perm)
    return [("region", _bool(region)), ("into", _bool(into)), ("rank", _int(rank)), ("count", _int(len(outs))),
            ("src", _dims8(src, rank, 1)), ("outs", "{" + ", ".join(boxes) + "}"),
            ("at", "{" + ", ".join(starts) + "}"), ("perm", _dims(order + (0,) * (8 - rank))),
            ("work", _work(layer))]


_REDUCE_OPS = {"sum": "Add", "mean": "Avg", "max": "Max", "min": "Min", "prod": "Mul",
               "sumabs": "Norm1", "sqrtsumsq": "Norm2"}


def _reduce_fields(layer: Layer) -> Fields:
    p = _problem(layer, ReduceProblem)
    rank = max(4, len(p.shape))
    # keepdims only relabels the output: cuDNN's C keeps every reduced axis as 1
    out = tuple(1 if i in p.axes else d for i, d in enumerate(p.shape))
    return [("op", "ReduceOp::" + _REDUCE_OPS[p.alg]), ("rank", _int(rank)), ("src", _dims8(p.shape, rank, 1)),
            ("dst", _dims8(out, rank, 1)), ("work", _work(layer))]


# --- the graph API (cudnn_frontend) families ------------------------------------------------

def _lnorm_fields(layer: Layer) -> Fields:
    p = layer.problem
    if isinstance(p, ReduceProblem):  # the LayerNorm decomposition from its first ReduceMean (trailing axes)
        # with scale and shift; its epsilon, an Add of a constant, changes no work: the ONNX default stands in
        axis, eps, bias = p.axes[0], 1e-5, True
        shape = p.shape
    else:
        ln = _problem(layer, LnormProblem)
        shape, axis, eps, bias = ln.shape, ln.axis, ln.eps, ln.bias
    return [("rows", _int(math.prod(shape[:axis]))), ("cols", _int(math.prod(shape[axis:]))),
            ("eps", _float(eps)), ("bias", _bool(bias)), ("work", _work(layer))]


def _sdpa_fields(layer: Layer) -> Fields:
    p = layer.problem
    if isinstance(p, MatMulProblem):  # an attention pattern from its scores' MatMul: Q [.., S, D] · Kᵀ [.., D, Skv]
        lead = p.a[:-2]
        b, h = (math.prod(lead[:-1]), lead[-1]) if lead else (1, 1)
        sq, d, skv = p.a[-2], p.a[-1], p.b[-1]
        dims, scale, mask, causal = (b, h, sq, skv, d, d), 1 / math.sqrt(d), False, False
    else:
        at = _problem(layer, AttentionProblem)  # the ONNX Attention op: 4-d [B, heads, S, D]
        dims = (at.q[0], at.q[1], at.q[2], at.k[2], at.q[3], at.v[3])
        scale = at.scale if at.scale is not None else 1 / math.sqrt(at.q[3])
        mask, causal = at.mask is not None, at.causal
    names = ("b", "h", "s_q", "s_kv", "d_qk", "d_v")
    return ([(n, _int(v)) for n, v in zip(names, dims)]
            + [("scale", _float(scale)), ("mask", _bool(mask)), ("causal", _bool(causal)), ("work", _work(layer))])


_POINTWISE_OPS = {"div": "Div", "pow": "Pow", "eq": "CmpEq", "gt": "CmpGt", "lt": "CmpLt", "erf": "Erf",
                  "gelu": "Gelu", "gelutanh": "GeluTanh", "exp": "Exp", "log": "Log", "abs": "Abs", "neg": "Neg",
                  "softplus": "Softplus"}


def _pointwise_fields(layer: Layer) -> Fields:
    p = layer.problem
    binary = isinstance(p, BinaryProblem)
    if binary:
        bp = _problem(layer, BinaryProblem)
        alg, (a, b), out = bp.alg, bp.shapes, bp.out
    else:
        e = _problem(layer, EltwiseProblem)
        alg, a, b, out = e.alg, e.shape, (), e.shape
    rank = max(4, len(out))  # the frontend broadcasts either operand into the output
    return [("op", "PointwiseOp::" + _POINTWISE_OPS[alg]), ("binary", _bool(binary)), ("rank", _int(rank)),
            ("a", _dims8(a, rank, 1)), ("b", _dims8(b, rank, 1) if binary else _dims8((), 0, 0)),
            ("out", _dims8(out, rank, 1)), ("work", _work(layer))]

CONV = Family("conv", "ConvLayer", "add_conv", _conv_fields, spatial=True, math=True)
BLAS = Family("blas", "BlasLayer", "add_blas", _blas_fields, spatial=False, math=True)
FAMILIES = {
    "cudnnConvolutionForward": CONV,
    "cudnnPoolingForward": Family("pool", "PoolLayer", "add_pool", _pool_fields, True, False),
    "cudnnBatchNormalizationForwardInference":
        Family("bnorm", "BnormLayer", "add_bnorm", _bnorm_fields, True, False),
    "cudnnLRNCrossChannelForward": Family("lrn", "LrnLayer", "add_lrn", _lrn_fields, True, False),
    "cudnnActivationForward":
        Family("activation", "ActLayer", "add_activation", _activation_fields, False, False),
    "cudnnSoftmaxForward":
        Family("softmax", "SoftmaxLayer", "add_softmax", _softmax_fields, False, False),
    "cudnnDropoutForward":
        Family("dropout", "DropoutLayer", "add_dropout", _dropout_fields, False, False),
    "cudnnRNNForward": Family("rnn", "RnnLayer", "add_rnn", _rnn_fields, False, True),
    "cublasGemmEx": BLAS,
    "cublasGemmStridedBatchedEx": BLAS,
    "cublasSgemv": BLAS,
    "cudnnTransformTensor": Family("copy", "CopyLayer", "add_copy", _copy_fields, False, False),
    "cudnnReduceTensor": Family("reduce", "ReduceLayer", "add_reduce", _reduce_fields, False, False),
}
_BINARY = Family("binary", "BinaryLayer", "add_binary", _binary_fields, False, False)
FAMILIES.update({api: _BINARY for api in ("cudnnAddTensor", "cudnnOpTensor", "cudnnScaleTensor")})
LNORM = Family("lnorm", "LnormLayer", "add_lnorm", _lnorm_fields, False, False)
SDPA = Family("sdpa", "SdpaLayer", "add_sdpa", _sdpa_fields, False, False)
POINTWISE = Family("pointwise", "PointwiseLayer", "add_pointwise", _pointwise_fields, False, False)
FAMILIES.update({CUDNN_LAYERNORM: LNORM, CUDNN_SDPA: SDPA, CUDNN_POINTWISE: POINTWISE})
GRAPH_FAMILIES = (LNORM, SDPA, POINTWISE)
# A graph family's variants are plan slots: the i-th distinct engine config the heuristics
# (mode A, then fallback) return for the layer's graph, each built and timed as its own plan.
# The count is known only on the GPU: a slot past it is stored as unsupported, and every result
# carries it (counter engine_configs), so configs beyond the slots would show there.
GRAPH_PLANS = 8
PLAN_ALGOS = tuple(f"plan{i}" for i in range(GRAPH_PLANS))
# cuDNN's flash attention takes fp16/bf16 Q/K/V: an fp32 attention gets no SDPA variant
SDPA_DTYPES = ("f16", "bf16")
# fusion pattern → (graph family, the variant's call: runtime_cpp/cudnn/benanza_cudnn/tables.hpp)
# (an attention pattern by its scale and mask: every scaled one, Q and Kᵀ prescaled included, is
# scaled by 1/√d in all)
_SDPA_CALLS = {(False, False): "kSdpaUnscaled", (False, True): "kSdpaUnscaledMasked",
               (True, False): "kCall", (True, True): "kSdpaMasked"}
_GRAPH_FUSIONS = {"layernorm": (LNORM, "kCall"), "gelu_erf": (POINTWISE, "kGeluOfA"),
                  **{p.name: (SDPA, _SDPA_CALLS[p.scale, p.mask]) for p in FUSION_PATTERNS.values() if p.attention}}

# Variant.api → the runtime's call constant (tables.hpp)
_CALLS = {"cudnnConvolutionForward": "kConvForward", "cublasGemmEx": "kGemmEx",
          "cublasGemmStridedBatchedEx": "kGemmStridedBatchedEx", "cublasSgemv": "kSgemv"}


def family_of(layer: Layer) -> Family | None:
    """The runtime family that benchmarks a layer; None when no cuDNN/cuBLAS call covers it."""
    if not covers(layer) or layer.cudnn_api is None:
        return None
    family = FAMILIES.get(layer.cudnn_api)
    if family is None:
        raise BenanzaError(f"layer {layer.key}: the cuDNN backend has no runtime for {layer.cudnn_api}")
    return family


# --- option resolution ---------------------------------------------------------------------

def _pick(requested: tuple[str, ...], known: tuple[str, ...], default: tuple[str, ...],
          what: str) -> tuple[str, ...]:
    if not requested:
        return default
    unknown = [r for r in requested if r not in known]
    if unknown:
        log.warning("cudnn backend ignores %s %s (it knows %s)", what, ", ".join(unknown), ", ".join(known))
    picked = tuple(dict.fromkeys(r for r in requested if r in known))
    if not picked:
        raise BenanzaError(f"no {what} the cuDNN backend can run among {', '.join(requested)}; "
                           f"choose from {', '.join(known)}")
    return picked


@dataclass(frozen=True)
class Expansion:
    """The resolved dtype/layout/math lists one generation expands every layer over."""

    dtypes: tuple[str, ...]
    layouts: tuple[str, ...]
    maths: tuple[str, ...]

    def math_for(self, dtype: str, family: Family) -> tuple[str, ...]:
        """Requested math modes valid for the dtype, else the dtype's default."""
        if not family.math:
            return (NO_MATH,)
        valid = TENSOR_MATH[dtype]
        chosen = tuple(m for m in self.maths if m in valid) if self.maths else ()
        return chosen or (DEFAULT_MATH[dtype],)

    def combos(self, family: Family) -> list[tuple[str, str, str]]:
        layouts = self.layouts if family.spatial else ("nchw",)
        return [(d, lay, m) for d in self.dtypes for lay in layouts for m in self.math_for(d, family)]


@functools.lru_cache(maxsize=8)
def expansion(options: GenOptions) -> Expansion:
    maths = _pick(options.math, MATHS, (), "math modes") if options.math else ()
    return Expansion(_pick(options.dtypes, DTYPES, DEFAULT_DTYPES, "dtypes"),
                     _pick(options.layouts, LAYOUTS, LAYOUTS, "layouts"), maths)


# --- the backend ---------------------------------------------------------------------------

@dataclass(frozen=True)
class _Part:
    """One generated table file: a slice of one family's layers and their variants."""

    family: Family
    index: int
    layers: list[Layer]
    variants: list[tuple[Variant, int]]  # variant, index into ``layers``

    @property
    def function(self) -> str:
        return f"{self.family.name}_{self.index}"

    @property
    def filename(self) -> str:
        return f"tables_{self.function}.cpp"


class CudnnBackend:
    name = NAME
    dtypes = DTYPES

    def covers(self, layer: Layer) -> bool:
        return covers(layer)

    def variants(self, unique: UniqueLayer, fusions: tuple[str, ...], options: GenOptions) -> list[Variant]:
        layer = unique.layer
        family = family_of(layer)
        if family is None or layer.cudnn_api is None:  # the second test repeats family_of's, for api below
            return []
        exp = expansion(options)
        problem, api = layer.problem, layer.cudnn_api
        out: list[Variant] = []
        if family is CONV:
            _warn_asymmetric(layer)
            combos = exp.combos(family)
            out += [Variant(problem, NAME, api, algo, d, lay, m) for algo in CONV_ALGOS for d, lay, m in combos]
            for fusion in fusions:
                pattern = FUSION_PATTERNS[fusion]
                algos = CONV_ALGOS if pattern.activation == "relu" else IDENTITY_ALGOS
                out += [Variant(problem, NAME, FUSED_API, algo, d, lay, m, fusion)
                        for algo in algos for d, lay, m in combos]
            return out
        if family in GRAPH_FAMILIES:
            return _graph_variants(layer, family, api, "none", exp) + _graph_fusion_variants(layer, fusions, exp)
        if family is BLAS:  # the GEMM epilogues (attention patterns are graph-API SDPA variants, below)
            epilogues = [f for f in fusions
                         if FUSION_PATTERNS[f].anchor == "MatMul" and not FUSION_PATTERNS[f].attention]
            out += [Variant(problem, NAME, LT_API, algo, d, lay, m, fusion)
                    for fusion in epilogues for algo in LT_ALGOS for d, lay, m in exp.combos(family)]
        for d, lay, m in exp.combos(family):
            # cuBLAS has no 16-bit GEMV: those run as a GEMM with one row or column.
            call = "cublasGemmEx" if api == "cublasSgemv" and d != "f32" else api
            variant = Variant(problem, NAME, call, "default", d, lay, "fma" if call == "cublasSgemv" else m)
            if variant not in out:  # Sgemv has no math setting: one variant, whatever was asked
                out.append(variant)
        return out + _graph_fusion_variants(layer, fusions, exp)

    def render(self, manifest: Manifest, variants: list[Variant], env: jinja2.Environment,
               out_dir: Path, options: GenOptions) -> list[Path]:
        layers: dict[Problem, Layer] = {}
        for u in manifest.layers:  # one table row per problem, whatever dtypes its layers have
            layers.setdefault(u.layer.problem, u.layer)
        parts = _partition(variants, layers)
        table = env.get_template("table.cpp.j2")
        files = []
        for part in parts:
            text = table.render(
                family=part.family.name, part=part.index, struct=part.family.struct, add=part.family.add,
                function=part.function,
                layers=[{"key": layer.problem.text(), "fields": part.family.fields(layer)}
                        for layer in part.layers],
                variants=[_variant_fields(v, i) for v, i in part.variants])
            files.append(write_if_changed(out_dir / part.filename, text))
        common = dict(variant_count=len(variants), layer_count=len({v.problem for v in variants}))
        files.append(write_if_changed(out_dir / "registry.cpp", env.get_template("registry.cpp.j2").render(
            functions=[p.function for p in parts], cupti_metrics=list(options.cupti_metrics), **common)))
        files.append(write_if_changed(out_dir / "CMakeLists.txt", env.get_template("CMakeLists.txt.j2").render(
            sources=[p.filename for p in parts], python=sys.executable, cupti=options.cupti, **common)))
        _remove_stale_tables(out_dir, {p.filename for p in parts})
        return files + copy_runtime(out_dir / "runtime", ("common", "cudnn", "cmake"))


def _graph_variants(layer: Layer, family: Family, api: str, fusion: str, exp: Expansion) -> list[Variant]:
    """One variant per plan slot and dtype (graph families have no layout or math setting)."""
    dtypes = exp.dtypes
    if family is SDPA:
        dtypes = tuple(d for d in exp.dtypes if d in SDPA_DTYPES)
        skipped = [d for d in exp.dtypes if d not in SDPA_DTYPES]
        if skipped:
            log.warning("%s%s: no cuDNN SDPA variant in %s: cuDNN's flash attention takes fp16/bf16 Q/K/V only "
                        "(ask for --dtype f16 or bf16)", layer.key, "" if fusion == "none" else f" ({fusion})",
                        ", ".join(skipped))
    return [Variant(layer.problem, NAME, api, algo, d, "nchw", NO_MATH, fusion) for d in dtypes for algo in PLAN_ALGOS]


def _graph_fusion_variants(layer: Layer, fusions: tuple[str, ...], exp: Expansion) -> list[Variant]:
    """The graph-API fused forms of the patterns anchored on this layer: the LayerNorm
    decomposition as one layernorm node, the erf GELU decomposition as one GELU node, and the
    attention chains as one SDPA (their scale and mask from the pattern)."""
    out: list[Variant] = []
    for fusion in fusions:
        if fusion in _GRAPH_FUSIONS:
            family = _GRAPH_FUSIONS[fusion][0]
            out += _graph_variants(layer, family, _API_OF[family.name], fusion, exp)
    return out


_API_OF = {LNORM.name: CUDNN_LAYERNORM, SDPA.name: CUDNN_SDPA, POINTWISE.name: CUDNN_POINTWISE}


def _warn_asymmetric(layer: Layer) -> None:
    pt, pl, pb, pr = _p(layer.problem, "pt", "pl", "pb", "pr")
    if (pt, pl) != (pb, pr):
        log.warning("%s: asymmetric pads (top %s, left %s, bottom %s, right %s); cuDNN's API pads "
                    "symmetrically, so it is benchmarked with %sx%s (counter pad_added)",
                    layer.key, pt, pl, pb, pr, max(pt, pb), max(pl, pr))


def _variant_fields(v: Variant, layer_index: int) -> Fields:
    if v.api == FUSED_API:
        call = "kConvBiasRelu" if FUSION_PATTERNS[v.fusion].activation == "relu" else "kConvBiasIdentity"
    elif v.api == LT_API:
        call = _LT_CALLS[FUSION_PATTERNS[v.fusion].activation]
    elif v.fusion in _GRAPH_FUSIONS:
        call = _GRAPH_FUSIONS[v.fusion][1]
    else:
        call = _CALLS.get(v.api, "kCall")
    order = LT_ALGOS if v.api == LT_API else PLAN_ALGOS if v.algo in PLAN_ALGOS else CONV_ALGOS
    algo = order.index(v.algo) if v.algo in order else 0
    return [("name", c_string(v.name)), ("layer", str(layer_index)), ("call", call), ("algo", str(algo)),
            ("dtype", _CPP["dtype"][v.dtype]), ("layout", _CPP["layout"][v.layout]),
            ("math", _CPP["math"][v.math])]


def _partition(variants: list[Variant], layers: dict[Problem, Layer]) -> list[_Part]:
    """Group variants by family (first-seen order), then cut each family into parts of about
    PART_SIZE variants without splitting a layer's variants across parts."""
    by_family: dict[str, list[tuple[Layer, list[Variant]]]] = {}
    families: dict[str, Family] = {}
    per_layer: dict[tuple[Problem, str], list[Variant]] = {}
    for v in variants:  # a graph-API fusion is benchmarked in its graph family's table
        per_layer.setdefault((v.problem, _GRAPH_FUSIONS[v.fusion][0].name if v.fusion in _GRAPH_FUSIONS else ""),
                             []).append(v)
    for (problem, fused_family), vs in per_layer.items():
        layer = layers.get(problem)
        if layer is None:
            raise BenanzaError(f"variant {vs[0].name} names a layer missing from the manifest")
        family = FAMILIES[_API_OF[fused_family]] if fused_family else family_of(layer)
        assert family is not None  # layers without a cuDNN API produce no variants
        families[family.name] = family
        by_family.setdefault(family.name, []).append((layer, vs))
    parts: list[_Part] = []
    for name, entries in by_family.items():
        index = 0
        current_layers: list[Layer] = []
        current: list[tuple[Variant, int]] = []
        for layer, vs in entries:
            if current and len(current) + len(vs) > PART_SIZE:
                parts.append(_Part(families[name], index, current_layers, current))
                index, current_layers, current = index + 1, [], []
            current += [(v, len(current_layers)) for v in vs]
            current_layers.append(layer)
        if current:
            parts.append(_Part(families[name], index, current_layers, current))
    return parts


def _remove_stale_tables(out_dir: Path, keep: set[str]) -> None:
    for path in out_dir.glob("tables_*.cpp"):
        if path.name not in keep:
            path.unlink()


def covers(layer: Layer) -> bool:
    """Whether this backend benchmarks the layer: a cuDNN/cuBLAS call on float data."""
    return layer.cudnn_api is not None and layer.dtype in FLOAT_DTYPES


BACKEND = CudnnBackend()
