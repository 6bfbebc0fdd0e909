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
  runs it. And the same convolution through the graph API (``cudnn_frontend.conv``), as PyTorch
  runs it: one conv_fprop node on the qconv table (exact pads), the bias by cudnnAddTensor after
  the graph, a plan slot (``PLAN_ALGOS``) per dtype × layout × math; ``fma`` deselects the engines
  with Tensor Core or down-converted-input notes. Each result's ``engine_id`` counter is the
  engine a framework's cuDNN log names (Q3). Not yet run on a GPU.
- Transposed convolution (ConvTranspose): cudnnConvolutionBackwardData, the 6 backward-data
  algorithms (``DECONV_ALGOS``) × dtypes × layouts × math modes, a bias added by cudnnAddTensor;
  covered only where the descriptor's symmetric padding computes the layer exactly (the family
  says why not, per layer), with the same heuristic and Find counters as a convolution, indexing
  ``DECONV_ALGOS``.
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
- 1x1 convolutions as GEMMs: a convolution that is a matrix product per image
  (``ops.conv.matrix_product``) also runs as one ``cublasLtMatmul`` on its NCHW data, a strided
  batch over the images with the weights broadcast, on a row of the blas table
  (``ops.conv.gemm_row``, whose docstring has the geometry), one variant per rank of ``LT_ALGOS``
  in the convolution's dtypes and math modes, NCHW only (NHWC's would be another GEMM), unfused
  and once per fusion pattern of the layer: a ReLU as ``CUBLASLT_EPILOGUE_RELU`` (call
  ``kLtRelu``, else ``kLtGemm``), a bias (the conv's own or a folded BatchNorm's) as C with beta 1,
  since cuBLASLt's bias epilogue adds along the other axis. Not yet run on a GPU.
- The graph API through the header-only cuDNN frontend (runtime_cpp/cudnn/graph.cpp) runs what
  the legacy API lacks: LayerNormalization (inference), the ONNX Attention op as SDPA (flash
  attention forward, inference), and single pointwise nodes (Div, Pow, comparisons, Erf, GELU
  erf/tanh, Exp, Log, Abs, Neg, Softplus; And and Or of booleans, in the variant type ``b``:
  ONNX's one-byte bool as the graph API's BYTE_BOOLEAN, cuDNN 9.25+); and, as fused variants,
  the ``layernorm``, ``gelu_erf`` and attention patterns of ``benanza.fusion`` (on their
  anchors' problems, the pattern in the variant's call). Each graph variant is a plan slot
  (``PLAN_ALGOS``): the i-th distinct engine config of the heuristics (mode A, then fallback),
  built and timed as its own plan with its workspace; its name is the implementation, the
  config count the ``engine_configs`` counter. A Resize by 2 on both spatial dims is one resample
  node (NEAREST or BILINEAR) in NHWC, in the configuration benanza.ops.resample describes.
  SDPA is generated in fp16/bf16 only: cuDNN's flash attention takes no fp32, and an fp32
  request gets a warning per layer instead of a variant.
- Quantized layers (ONNX Runtime's ``quantize_dynamic`` exports, ``benanza.ops.quantized``):
  MatMulInteger as cuBLASLt's int8 GEMM (``cublasLtMatmul``, s8 operands, CUBLAS_COMPUTE_32I,
  s32 result; call ``kLtInt8``) in the layer's own type (``u8``/``i8``, whatever ``--dtype``
  asks, math ``default``), one variant per heuristic rank (``LT_ALGOS``); QLinearMatMul (ONNX
  Runtime's ``quantize_static``) as that GEMM with an fp32 alpha and an s8 result (call
  ``kLtInt8Requant``), or with per-column weights' scales a device vector of alphas
  (``kLtInt8RequantPerColumn``); the ``qdq_fp8_matmul`` pattern of float8 QDQ exports as
  cuBLASLt's FP8 GEMM (``kLtFp8``: e4m3 operands and result, CUBLAS_COMPUTE_32F, per-tensor scale
  pointers), on the float MatMul's key, once per dtype asked for, math ``default``; the runtime
  stores it as unsupported on a GPU below compute capability 8.9, which the generator cannot
  know; Cast into a float type or bool, QuantizeLinear,
  DequantizeLinear and DynamicQuantizeLinear as graph nodes of the ``quant`` table (plan slots;
  DynamicQuantizeLinear is three graphs timed back to back); ConvInteger and QLinearConv as a
  graph-API int8 convolution (the ``qconv`` table: INT8 data and weights with channels-last
  strides, INT32 compute; ConvInteger's s32 result through an IDENTITY node, QLinearConv's
  scale and per-channel offset into s8 as the graph's epilogue), plan slots in the layer's own
  type and layout ``nhwc``, where the channels per group are multiples of 4 (not covered
  otherwise, with that reason). None of the int8 or FP8 cuBLASLt variants or the int8
  convolution graphs has run on a GPU: they are compiled and linked here, where there is none
  (the graphs validated for sm_90).

Run-time counters of every benchmark: ``flops``, ``bytes``, ``workspace_bytes``; convolutions
add ``algo``, ``heuristic_algo`` and ``find_algo`` (indexes into ``CONV_ALGOS``: what
cudnnGetConvolutionForwardAlgorithm_v7 and cudnnFindConvolutionForwardAlgorithm pick) and
``find_ms``, and the math type and workspace each of them chose: ``heuristic_math``,
``find_math`` (indexes into ``CUDNN_MATH_TYPES``), ``heuristic_workspace_bytes``,
``find_workspace_bytes``; graph-API variants add ``engine_configs`` and ``engine_id`` (the
engine's global index); ``cublasLtMatmul`` adds ``algo`` (the heuristic rank),
``heuristic_algos`` (how many it offered), ``lt_algo_id``, ``lt_tile_id``, ``lt_stages_id``,
``lt_splitk`` (the algorithm's configuration) and ``waves``. Timing counters
(runtime_cpp/cudnn/harness.cpp): ``calls`` per repetition, ``l2_flushed`` (1: the L2 cache was
flushed before every call, 0: hot-cache timing, ``BENANZA_L2=hot``), ``host_bound_reps``. In
CUPTI mode each benchmark also prints a ``BENANZA_METRICS`` line with its kernels.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import BenanzaError
from ..escape import c_string
from ..fusion import BY_NAME as FUSION_PATTERNS
from ..generator import GenOptions, copy_runtime, write_if_changed
from ..layers import FLOAT_DTYPES, Layer, Model, UniqueLayer
from ..manifest import Manifest
from ..ops.attention import CUDNN_SDPA, CUDNN_SDPA_TABLE
from ..ops.base import ELEMENT_SIZE, CudnnLowering, CudnnTable, cpp_literal, row_fields
from ..ops.binary import CUDNN_POINTWISE, CUDNN_POINTWISE_TABLE
from ..ops.cast import CUDNN_QUANT, CUDNN_QUANT_TABLE
from ..ops.conv import (
    CUDNN_CONV,
    CUDNN_CONV_GRAPH,
    CUDNN_DECONV,
    CUDNN_QCONV_TABLE,
    DECONV_API,
    conv_graph_call,
    gemm_row,
    matrix_product,
)
from ..ops.gemm import CUDNN_BLAS, gemm_epilogue
from ..ops.norm import CUDNN_LAYERNORM, CUDNN_LNORM
from ..ops.quantized import CUDNN_QCONV
from ..ops.registry import FAMILIES as REGISTRY
from ..ops.registry import PATTERN_LOWERINGS
from ..ops.resample import CUDNN_RESAMPLE_TABLE
from ..ops.rope import CUDNN_ROPE, CUDNN_ROPE_TABLE
from ..problems import ConvProblem, Problem
from ..records import Variant, variant_order
from .base import CMakeBackend, Device

if TYPE_CHECKING:
    import jinja2

    from ..runner import RunOptions

log = logging.getLogger(__name__)

NAME = "cudnn"
# cudnnConvolutionFwdAlgo_t, in enum order: the runtime's algo counters index this tuple.
CONV_ALGOS = ("IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT", "FFT", "FFT_TILING",
              "WINOGRAD", "WINOGRAD_NONFUSED")
# cudnnConvolutionBwdDataAlgo_t, in enum order (a transposed convolution's algo counters)
DECONV_ALGOS = ("ALGO_0", "ALGO_1", "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED")
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
BOOL = "b"  # a boolean layer (a mask's And, Or) computes in its own type only
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

# an int8 layer (MatMulInteger) is benchmarked in its own type only, as on oneDNN
INT8_DTYPES = ("u8", "i8")
_CPP = {"dtype": {"f32": "DType::F32", "f16": "DType::F16", "bf16": "DType::BF16", "u8": "DType::U8",
                  "i8": "DType::I8", BOOL: "DType::Bool"},
        "layout": {"nchw": "Layout::NCHW", "nhwc": "Layout::NHWC"},
        "math": {NO_MATH: "Math::Default", "fma": "Math::Fma", "tf32_allowed": "Math::Tf32Allowed",
                 "tensor_op": "Math::TensorOp"}}

Fields = list[tuple[str, str]]


# --- C++ literals --------------------------------------------------------------------------

def _float(x: object) -> str:
    value = float(x)  # type: ignore[arg-type]
    if not math.isfinite(value):
        raise BenanzaError(f"non-finite layer parameter {value!r} cannot be benchmarked")
    return repr(value)


def _work(layer: Layer) -> str:
    elements = layer.bytes // ELEMENT_SIZE.get(layer.dtype, 4)
    return f"{{.flops = {float(layer.flops)!r}, .elements = {float(elements)!r}}}"


def fields_of(row: Any, layer: Layer) -> Fields:
    """A lowering row's named C++ fields, and the layer's work (every table's last field)."""
    return row_fields(row, lambda kind, value: cpp_literal(kind, value, c_string, _float)) + [("work", _work(layer))]


# --- the runtime families (tables), from the registry's lowerings ---------------------------

CONV, BLAS, LNORM, SDPA, POINTWISE = CUDNN_CONV, CUDNN_BLAS, CUDNN_LNORM, CUDNN_SDPA_TABLE, CUDNN_POINTWISE_TABLE
GRAPH_FAMILIES = (LNORM, SDPA, POINTWISE, CUDNN_QUANT_TABLE, CUDNN_ROPE_TABLE, CUDNN_RESAMPLE_TABLE)
# A graph family's variants are plan slots: the i-th distinct engine config the heuristics
# (mode A, then fallback) return for the layer's graph, each built and timed as its own plan.
# The count is known only on the GPU: a slot past it is stored as unsupported, and every result
# carries it (counter engine_configs), so configs beyond the slots would show there.
GRAPH_PLANS = 8
PLAN_ALGOS = tuple(f"plan{i}" for i in range(GRAPH_PLANS))
# cuDNN's flash attention takes fp16/bf16 Q/K/V: an fp32 attention gets no SDPA variant
SDPA_DTYPES = ("f16", "bf16")
# fusion pattern → its fused form (the table, the variant's call and the row): a graph of the
# graph API, or a cublasLtMatmul of the blas table (an FP8 GEMM)
_FUSED_FORMS: dict[str, CudnnLowering] = {name: p.cudnn for name, p in PATTERN_LOWERINGS.items()
                                          if p.cudnn is not None}
_API_OF = {LNORM.name: CUDNN_LAYERNORM, SDPA.name: CUDNN_SDPA, POINTWISE.name: CUDNN_POINTWISE,
           CUDNN_ROPE_TABLE.name: CUDNN_ROPE}
_BY_NAME = {f.name: f for f in REGISTRY}


def _conv_gemm(bias: bool) -> CudnnLowering:
    return CudnnLowering(BLAS, lambda p, api: gemm_row(p, bias))


# A convolution that is a matrix product (ops.conv.matrix_product) also runs as one cublasLtMatmul
# on its NCHW data, on a row of the blas table: whether it adds a bias (as C, beta 1) picks the
# row, its activation the call (CUBLASLT_EPILOGUE_DEFAULT or _RELU)
_CONV_GEMM = {bias: _conv_gemm(bias) for bias in (False, True)}
_CONV_GEMM_CALLS = {"identity": "kLtGemm", "relu": "kLtRelu"}


def lowering(layer: Layer) -> CudnnLowering | None:
    """The lowering of the layer's cuDNN/cuBLAS call; None when no call covers it."""
    if not covers(layer) or layer.cudnn_api is None:
        return None
    family = _BY_NAME.get(layer.problem.family)
    found = family.cudnn.get(layer.cudnn_api) if family is not None else None
    if found is None:
        raise BenanzaError(f"layer {layer.key}: the cuDNN backend has no runtime for {layer.cudnn_api}")
    return found


def family_of(layer: Layer) -> CudnnTable | None:
    """The runtime family that benchmarks a layer; None when no cuDNN/cuBLAS call covers it."""
    found = lowering(layer)
    return found.table if found is not None else None


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

    def math_for(self, dtype: str, family: CudnnTable) -> tuple[str, ...]:
        """Requested math modes valid for the dtype, else the dtype's default."""
        if not family.math:
            return (NO_MATH,)
        valid = TENSOR_MATH[dtype]
        chosen = tuple(m for m in self.maths if m in valid) if self.maths else ()
        return chosen or (DEFAULT_MATH[dtype],)

    def combos(self, family: CudnnTable) -> list[tuple[str, str, str]]:
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

    family: CudnnTable
    index: int
    layers: list[tuple[Layer, Any]]  # the layer and its lowering row
    variants: list[tuple[Variant, int]]  # variant, index into ``layers``

    @property
    def function(self) -> str:
        return f"{self.family.name}_{self.index}"

    @property
    def filename(self) -> str:
        return f"tables_{self.function}.cpp"


class CudnnBackend(CMakeBackend):
    name = NAME
    dtypes = DTYPES
    layouts = LAYOUTS
    maths = MATHS
    device = Device.GPU
    context_versions = {"cudnn": "cudnn_version", "cublas": "cublas_version"}

    def unavailable(self) -> str | None:
        from ..system import probe_gpu

        gpu = probe_gpu()
        return None if gpu.present else (f"no CUDA device found ({gpu.reason}); the cudnn backend needs one. "
                                          f"On this machine `--backend auto` runs onednn.")

    def bench_env(self, threads: int, options: RunOptions) -> dict[str, str]:
        return {"BENANZA_L2": options.l2}

    def covers(self, layer: Layer) -> bool:
        return covers(layer)

    def variants(self, unique: UniqueLayer, fusions: tuple[str, ...], options: GenOptions) -> list[Variant]:
        layer = unique.layer
        family = family_of(layer)
        if family is None or layer.cudnn_api is None:  # the second test repeats family_of's, for api below
            return []
        exp = expansion(options)
        if layer.dtype == BOOL:
            exp = dataclasses.replace(exp, dtypes=(BOOL,))
        problem, api = layer.problem, layer.cudnn_api
        out: list[Variant] = []
        if family is CONV:
            _warn_asymmetric(layer)
            combos = exp.combos(family)
            out += [Variant(problem, NAME, api, algo, d, lay, m) for algo in CONV_ALGOS for d, lay, m in combos]
            out += _conv_graph_variants(layer, combos)
            for fusion in fusions:
                if fusion in _FUSED_FORMS:  # a QDQ Conv: the int8 convolution graph, below
                    continue
                pattern = FUSION_PATTERNS[fusion]
                algos = CONV_ALGOS if pattern.activation == "relu" else IDENTITY_ALGOS
                out += [Variant(problem, NAME, FUSED_API, algo, d, lay, m, fusion)
                        for algo in algos for d, lay, m in combos]
            # the qdq_conv patterns as QLinearConv's int8 convolution graph (the qconv table), in
            # NHWC, its plan slots, where its channel rule allows (model_stats names the gap
            # otherwise); once per float type asked for, as the pattern's anchor is analysed in each
            out += [Variant(problem, NAME, CUDNN_QCONV, algo, d, "nhwc", NO_MATH, fusion) for fusion in fusions
                    if fusion in _FUSED_FORMS and _FUSED_FORMS[fusion].table is CUDNN_QCONV_TABLE
                    and PATTERN_LOWERINGS[fusion].gap(problem, NAME) is None
                    for d in exp.dtypes for algo in PLAN_ALGOS]
            if isinstance(problem, ConvProblem) and matrix_product(problem):  # as cuBLASLt GEMMs, NCHW only
                out += [Variant(problem, NAME, LT_API, algo, d, lay, m, fusion)
                        for fusion in ("none", *(f for f in fusions if f not in _FUSED_FORMS))
                        for algo in LT_ALGOS for d, lay, m in combos if lay == "nchw"]
            return out
        if family is CUDNN_DECONV:
            return [Variant(problem, NAME, api, algo, d, lay, m) for algo in DECONV_ALGOS
                    for d, lay, m in exp.combos(family)]
        if family is CUDNN_QCONV_TABLE:  # the int8 convolution graph: its plan slots, in NHWC, the one layout it takes
            return [Variant(problem, NAME, api, algo, layer.dtype, "nhwc", NO_MATH) for algo in PLAN_ALGOS]
        if layer.dtype in INT8_DTYPES:  # cuBLASLt's int8 GEMM: no math mode, one variant per heuristic rank
            return [Variant(problem, NAME, api, algo, layer.dtype, "nchw", NO_MATH) for algo in LT_ALGOS]
        if family in GRAPH_FAMILIES:
            return _graph_variants(layer, family, api, "none", exp) + _graph_fusion_variants(layer, fusions, exp)
        if family is BLAS:  # the GEMM epilogues (attention patterns are graph-API SDPA variants, below)
            # cuBLASLt's bias epilogues run the MatMul→Add(bias)→activation patterns alone; a QDQ
            # MatMul anchored here is an int8 GEMM, which no float epilogue call measures
            epilogues = [f for f in fusions if FUSION_PATTERNS[f].epilogue is gemm_epilogue]
            out += [Variant(problem, NAME, LT_API, algo, d, lay, m, fusion)
                    for fusion in epilogues for algo in LT_ALGOS for d, lay, m in exp.combos(family)]
            # a cublasLtMatmul of its own types (the QDQ float8 MatMul's FP8 GEMM): its compute type
            # is the call's, so no math mode; once per float type asked for, as the pattern's anchor is
            # analysed in each
            out += [Variant(problem, NAME, LT_API, algo, d, "nchw", NO_MATH, fusion) for fusion in fusions
                    if fusion in _FUSED_FORMS and _FUSED_FORMS[fusion].table is BLAS
                    for d in exp.dtypes for algo in LT_ALGOS]
        for d, lay, m in exp.combos(family):
            # cuBLAS has no 16-bit GEMV: those run as a GEMM with one row or column.
            call = "cublasGemmEx" if api == "cublasSgemv" and d != "f32" else api
            variant = Variant(problem, NAME, call, "default", d, lay, "fma" if call == "cublasSgemv" else m)
            if variant not in out:  # Sgemv has no math setting: one variant, whatever was asked
                out.append(variant)
        return out + _graph_fusion_variants(layer, fusions, exp)

    def render(self, manifest: Manifest, variants: list[Variant], env: jinja2.Environment,
               out_dir: Path, options: GenOptions, models: Sequence[Model] = ()) -> list[Path]:
        layers: dict[Problem, Layer] = {}
        for u in manifest.layers:  # one table row per problem, whatever dtypes its layers have
            layers.setdefault(u.layer.problem, u.layer)
        parts = _partition(variants, layers)
        table = env.get_template("table.cpp.j2")
        files = []
        for part in parts:
            text = table.render(
                family=part.family.name, part=part.index, struct=type(part.layers[0][1]).__name__,
                add=part.family.add, function=part.function,
                layers=[{"key": layer.problem.text(), "fields": fields_of(row, layer)} for layer, row in part.layers],
                variants=[_variant_fields(v, i) for v, i in part.variants])
            files.append(write_if_changed(out_dir / part.filename, text))
        common = dict(variant_count=len(variants), layer_count=len({v.problem for v in variants}))
        files.append(write_if_changed(out_dir / "registry.cpp", env.get_template("registry.cpp.j2").render(
            functions=[p.function for p in parts], cupti_metrics=list(options.cupti_metrics), **common)))
        files.append(write_if_changed(out_dir / "CMakeLists.txt", env.get_template("CMakeLists.txt.j2").render(
            sources=[p.filename for p in parts], python=sys.executable, cupti=options.cupti, **common)))
        _remove_stale_tables(out_dir, {p.filename for p in parts})
        return files + copy_runtime(out_dir / "runtime", ("common", "cudnn", "cmake"))


def _graph_variants(layer: Layer, family: CudnnTable, api: str, fusion: str, exp: Expansion) -> list[Variant]:
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
    decomposition as one layernorm node, the erf GELU decomposition as one GELU node, the
    attention chains as one SDPA (their scale and mask from the pattern), and the rotate-half
    RoPE as one graph of pointwise nodes."""
    out: list[Variant] = []
    for fusion in fusions:
        if fusion in _FUSED_FORMS and _FUSED_FORMS[fusion].table in GRAPH_FAMILIES:
            family = _FUSED_FORMS[fusion].table
            out += _graph_variants(layer, family, _API_OF[family.name], fusion, exp)
    return out



def _conv_graph_variants(layer: Layer, combos: list[tuple[str, str, str]]) -> list[Variant]:
    """A float convolution through the graph API, as PyTorch runs it: a plan slot per dtype,
    layout and math of the legacy variants. Its result's ``engine_id`` counter is the engine a
    framework's cuDNN log names (Q3). cuDNN's graph pads asymmetrically, so no padding is added."""
    if layer.dtype not in FLOAT_DTYPES:
        return []
    return [Variant(layer.problem, NAME, CUDNN_CONV_GRAPH, algo, d, lay, m)
            for d, lay, m in combos for algo in PLAN_ALGOS]


def _warn_asymmetric(layer: Layer) -> None:
    p = layer.problem
    assert isinstance(p, ConvProblem)
    pt, pl, pb, pr = p.pt, p.pl, p.pb, p.pr
    if (pt, pl) != (pb, pr):
        log.warning("%s: asymmetric pads (top %s, left %s, bottom %s, right %s); cuDNN's API pads "
                    "symmetrically, so it is benchmarked with %sx%s (counter pad_added)",
                    layer.key, pt, pl, pb, pr, max(pt, pb), max(pl, pr))


def _conv_gemm_form(v: Variant) -> tuple[bool, str] | None:
    """A convolution's cublasLtMatmul variant: whether it adds a bias, and its activation; None
    for any other variant."""
    if v.api != LT_API or not isinstance(v.problem, ConvProblem):
        return None
    if v.fusion == "none":
        return v.problem.bias, "identity"
    pattern = FUSION_PATTERNS[v.fusion]
    return pattern.bias_of(v.problem), pattern.activation


def _row_form(v: Variant) -> tuple[str, CudnnLowering] | None:
    """The row a variant runs on where it is not its layer's (a tag naming it among the problem's
    rows, and its lowering): a fusion pattern's fused form, keyed by the pattern (its row may hold
    what the problem does not), a convolution's GEMM, keyed by whether it adds a bias, or a
    convolution's graph-API row (the qconv table's, keyed by the api)."""
    if v.fusion in _FUSED_FORMS:
        return v.fusion, _FUSED_FORMS[v.fusion]
    if v.api == CUDNN_CONV_GRAPH:
        return v.api, _BY_NAME[v.problem.family].cudnn[v.api]
    gemm = _conv_gemm_form(v)
    if gemm is not None:
        return "gemm_bias" if gemm[0] else "gemm", _CONV_GEMM[gemm[0]]
    return None


def _variant_fields(v: Variant, layer_index: int) -> Fields:
    gemm = _conv_gemm_form(v)
    if gemm is not None:
        call = _CONV_GEMM_CALLS[gemm[1]]
    elif v.api == FUSED_API:
        call = "kConvBiasRelu" if FUSION_PATTERNS[v.fusion].activation == "relu" else "kConvBiasIdentity"
    elif v.fusion in _FUSED_FORMS:
        call = _FUSED_FORMS[v.fusion].call_for(v.problem)
    elif v.api == CUDNN_CONV_GRAPH:
        call = conv_graph_call(v.layout, v.math)
    elif v.api == LT_API and v.fusion in FUSION_PATTERNS:
        call = _LT_CALLS[FUSION_PATTERNS[v.fusion].activation]
    else:
        family = _BY_NAME.get(v.problem.family)
        found = family.cudnn.get(v.api) if family is not None else None
        call = found.call_for(v.problem) if found is not None else "kCall"
    # FFT, WINOGRAD … are in both convolution enums, at other values
    order = (LT_ALGOS if v.api == LT_API else PLAN_ALGOS if v.algo in PLAN_ALGOS
             else DECONV_ALGOS if v.api == DECONV_API else CONV_ALGOS)
    algo = order.index(v.algo) if v.algo in order else 0
    return [("name", c_string(v.name)), ("layer", str(layer_index)), ("call", call), ("algo", str(algo)),
            ("dtype", _CPP["dtype"][v.dtype]), ("layout", _CPP["layout"][v.layout]),
            ("math", _CPP["math"][v.math])]


def _partition(variants: list[Variant], layers: dict[Problem, Layer]) -> list[_Part]:
    """Group variants by family, then cut each family into parts of about PART_SIZE variants
    without splitting a layer's variants across parts. Families, layers (by problem text) and
    variants (by name) are sorted: the same models give the same files in any order."""
    by_family: dict[str, list[tuple[str, Layer, Any, list[Variant]]]] = {}
    families: dict[str, CudnnTable] = {}
    per_layer: dict[tuple[Problem, str], list[Variant]] = {}
    for v in variants:  # a fused form or a conv's GEMM is benchmarked on its own row of another table
        form = _row_form(v)
        per_layer.setdefault((v.problem, form[0] if form is not None else ""), []).append(v)
    for (problem, tag), vs in per_layer.items():
        layer = layers.get(problem)
        if layer is None:
            raise BenanzaError(f"variant {vs[0].name} names a layer missing from the manifest")
        form = _row_form(vs[0])
        found = form[1] if form is not None else lowering(layer)
        assert found is not None  # layers without a cuDNN API produce no variants
        families[found.table.name] = found.table
        row = found.row(problem, layer.cudnn_api or "")
        by_family.setdefault(found.table.name, []).append((tag, layer, row, sorted(vs, key=variant_order)))
    parts: list[_Part] = []
    for name, entries in sorted(by_family.items()):
        index = 0
        current_layers: list[tuple[Layer, Any]] = []
        current: list[tuple[Variant, int]] = []
        for _, layer, row, vs in sorted(entries, key=lambda e: (e[1].problem.text(), e[0])):
            if current and len(current) + len(vs) > PART_SIZE:
                parts.append(_Part(families[name], index, current_layers, current))
                index, current_layers, current = index + 1, [], []
            current += [(v, len(current_layers)) for v in vs]
            current_layers.append((layer, row))
        if current:
            parts.append(_Part(families[name], index, current_layers, current))
    return parts


def _remove_stale_tables(out_dir: Path, keep: set[str]) -> None:
    for path in out_dir.glob("tables_*.cpp"):
        if path.name not in keep:
            path.unlink()


def covers(layer: Layer) -> bool:
    """Whether this backend benchmarks the layer: a cuDNN/cuBLAS call on float data,
    cuBLASLt's int8 GEMM on int8 data, or a graph-API node writing booleans (a pointwise node,
    a Cast into bool)."""
    return layer.cudnn_api is not None and (layer.dtype in FLOAT_DTYPES or layer.dtype in INT8_DTYPES or (
        layer.dtype == BOOL and layer.cudnn_api in (CUDNN_POINTWISE, CUDNN_QUANT)))


BACKEND = CudnnBackend()
