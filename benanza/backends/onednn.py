"""oneDNN (CPU) backend: the unique layers as oneDNN primitive benchmarks.

Each layer family maps to one runtime function in ``runtime_cpp/onednn``; the generated
``benchmarks.cpp`` holds only tables (one params row per layer, one row per variant), so
thousands of variants compile quickly. Convolutions expand over every oneDNN algorithm
(direct, winograd, auto), dtypes (f32, bf16) and layouts (nchw, nhwc, any = blocked), plus
one fused variant (post-ops) per fusion pattern the models use on that layer. The runtime,
not the generator, decides what this CPU can run: refused combinations are stored as
unsupported with oneDNN's message.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from ..escape import c_string
from ..fusion import BY_NAME as FUSION_PATTERNS
from ..generator import GenOptions, copy_runtime, write_if_changed
from ..layers import FLOAT_DTYPES, Layer, UniqueLayer
from ..manifest import Manifest
from ..problems import (AttentionProblem, BinaryProblem, BnormProblem, ConcatProblem, ConvProblem, CopyProblem,
                        DeconvProblem, EltwiseProblem, GemmProblem, LnormProblem, LrnProblem, MatMulProblem,
                        PoolProblem, PreluProblem, Problem, ReduceProblem, ResampleProblem, SoftmaxProblem,
                        TransposeProblem)
from ..records import Variant

log = logging.getLogger(__name__)

NAME = "onednn"
DTYPES = ("f32", "bf16")
SPATIAL_LAYOUTS = ("nchw", "nhwc", "any")
CONV_ALGOS = ("direct", "winograd", "auto")

_CPP_ALGO = {"direct": "direct", "winograd": "winograd", "auto": "automatic", "default": "none"}


@dataclass(frozen=True)
class Family:
    """How one layer family reaches its runtime function."""

    params_type: str  # C++ struct in benanza/onednn.hpp
    bench: str  # runtime function suffix (bench_<name>)
    spatial: bool  # 4-d activations: expands over layouts


FAMILIES = {
    "conv": Family("ConvParams", "conv", True),
    "pool": Family("PoolParams", "pool", True),
    "bnorm": Family("BnormParams", "bnorm", True),
    "lrn": Family("LrnParams", "lrn", True),
    "eltwise": Family("EltwiseParams", "eltwise", False),
    "prelu": Family("PreluParams", "prelu", False),
    "binary": Family("BinaryParams", "binary", False),
    "gemm": Family("GemmParams", "gemm", False),
    "matmul": Family("MatmulParams", "matmul", False),
    "softmax": Family("SoftmaxParams", "softmax", False),
    "concat": Family("ConcatParams", "concat", False),
    "lnorm": Family("LnormParams", "lnorm", False),
    "reduce": Family("ReduceParams", "reduce", False),
    "transpose": Family("TransposeParams", "transpose", False),
    "copy": Family("CopyParams", "copy", False),
    "attention": Family("AttentionParams", "attention", False),
    "deconv": Family("ConvParams", "deconv", True),
    "resample": Family("ResampleParams", "resample", False),
}


def _dtypes(options: GenOptions) -> list[str]:
    asked = options.dtypes or DTYPES
    return [d for d in asked if d in DTYPES]


def _layouts(problem: Problem, family: Family, options: GenOptions) -> list[str]:
    spatial = family.spatial or (isinstance(problem, ConcatProblem) and all(len(s) == 4 for s in problem.shapes))
    if not spatial:
        return ["plain"]
    return [lay for lay in (options.layouts or SPATIAL_LAYOUTS) if lay in SPATIAL_LAYOUTS]


@dataclass(frozen=True)
class Fused:
    """What a variant's one call (or chain) computes beyond its layer, as the runtime's Config."""

    bias: bool = False  # a conv's own bias, a pattern's bias (a conv's bias or BN fold, a MatMul's bias Add)
    relu: bool = False
    gelu: bool = False
    attention: bool = False  # the scores' MatMul anchors the attention chain
    scale: bool = False
    mask: bool = False


def fused_config(problem: Problem, fusion: str) -> Fused:
    """The variant's configuration: a conv's own bias unfused; a pattern's extras fused."""
    if fusion == "none":
        return Fused(bias=isinstance(problem, (ConvProblem, DeconvProblem)) and problem.bias)
    p = FUSION_PATTERNS[fusion]
    if p.attention:
        return Fused(attention=True, scale=p.scale, mask=p.mask)
    return Fused(bias=p.adds_bias, relu=p.activation == "relu", gelu=p.activation == "gelu")


class OneDNNBackend:
    name = NAME
    dtypes = DTYPES

    def covers(self, layer: Layer) -> bool:
        return covers(layer)

    def variants(self, unique: UniqueLayer, fusions: tuple[str, ...], options: GenOptions) -> list[Variant]:
        layer = unique.layer
        family = FAMILIES.get(layer.family)
        if not covers(layer) or family is None or layer.onednn_primitive is None:
            return []
        problem = layer.problem
        conv = isinstance(problem, ConvProblem)
        algos = CONV_ALGOS if conv else ("default",)
        # conv post-ops, a MatMul's bias/GELU epilogue (fusion.match_fusions only names 2-D
        # MatMuls, which oneDNN runs as one GEMM), and a LayerNorm decomposition from its first
        # ReduceMean
        fused = conv or isinstance(problem, (MatMulProblem, ReduceProblem, BinaryProblem))
        fusion_names = ("none",) + tuple(fusions) if fused else ("none",)
        out = []
        for fusion in fusion_names:
            for algo in algos:
                for dtype in _dtypes(options):
                    for layout in _layouts(problem, family, options):
                        out.append(Variant(problem, NAME, layer.onednn_primitive, algo, dtype, layout,
                                           "default", fusion))
        return out

    def render(self, manifest: Manifest, variants: list[Variant], env: jinja2.Environment,
               out_dir: Path, options: GenOptions) -> list[Path]:
        tables: dict[str, _Table] = {}
        for v in variants:
            p = v.problem
            # the decomposition's fused form is one layer_normalization: benchmarked in that
            # family's table, keyed by its first ReduceMean's problem and the fusion tag
            family = {"layernorm": "lnorm", "gelu_erf": "eltwise"}.get(v.fusion, p.family)
            table = tables.setdefault(family, _Table(family, FAMILIES[family]))
            index = table.index_of(v)
            table.rows.append(_row(v, index, fused_config(p, v.fusion)))
        source = env.get_template("benchmarks.cpp.j2").render(tables=list(tables.values()),
                                                               count=len(variants))
        files = [write_if_changed(out_dir / "benchmarks.cpp", source),
                 write_if_changed(out_dir / "CMakeLists.txt", env.get_template("CMakeLists.txt.j2").render())]
        # the project carries its runtime, so it builds without a Benanza checkout
        files += copy_runtime(out_dir / "runtime", ("common", NAME))
        return files


@dataclass
class _Table:
    family: str
    spec: Family
    params: list[tuple[str, str]] = field(default_factory=list)  # (C++ initializer, problem key)
    rows: list[str] = field(default_factory=list)  # C++ initializers, one per variant
    _index: dict[Problem, int] = field(default_factory=dict)

    def index_of(self, v: Variant) -> int:
        """The params row of the variant's problem (one per problem, whatever the dtype)."""
        if v.problem not in self._index:
            self._index[v.problem] = len(self.params)
            self.params.append((PARAMS[self.family](v), v.problem.text()))
        return self._index[v.problem]


def _row(v: Variant, index: int, f: Fused) -> str:
    layout = v.layout if v.layout in ("plain", "nchw", "nhwc", "any") else "plain"
    flags = ", ".join(_cbool(b) for b in (f.bias, f.relu, f.gelu, f.attention, f.scale, f.mask))
    cfg = f"{{bo::DType::{v.dtype}, bo::Layout::{layout}, bo::ConvAlgo::{_CPP_ALGO[v.algo]}, {flags}}}"
    return f'{{{c_string(v.name)}, {index}, {cfg}}}'


# --- C++ literals ------------------------------------------------------------------------

def _cbool(b: object) -> str:
    return "true" if b else "false"


def _cfloat(x: object) -> str:
    f = float(x)  # type: ignore[arg-type]
    if math.isnan(f):
        return "std::numeric_limits<float>::quiet_NaN()"
    if math.isinf(f) or abs(f) >= 3.4028234663852886e38:
        return ("" if f > 0 else "-") + "FLT_MAX"
    return f"{f!r}f"


def _cdims(dims) -> str:
    return "{" + ", ".join(str(int(d)) for d in dims) + "}"


def _cdims_list(shapes) -> str:
    return "{" + ", ".join(_cdims(s) for s in shapes) + "}"


def _ints(p: Problem, names: str) -> str:
    return ", ".join(str(int(getattr(p, n))) for n in names.split())


def _conv(v: Variant) -> str:  # a ConvProblem's or a DeconvProblem's
    return "{" + _ints(v.problem, "mb ic ih iw oc oh ow kh kw sh sw pt pl dh dw g") + "}"


def _pool(v: Variant) -> str:
    p = v.problem
    assert isinstance(p, PoolProblem)
    return "{" + f"{c_string(p.alg)}, " + _ints(p, "mb ic ih iw oh ow kh kw sh sw pt pl dh dw") + "}"


def _bnorm(v: Variant) -> str:
    p = v.problem
    assert isinstance(p, BnormProblem)
    return "{" + _ints(p, "mb ic ih iw") + f", {_cfloat(p.eps)}}}"


def _lrn(v: Variant) -> str:
    p = v.problem
    assert isinstance(p, LrnProblem)
    return "{" + _ints(p, "mb ic ih iw size") + f", {_cfloat(p.alpha)}, {_cfloat(p.beta)}, {_cfloat(p.k)}}}"


def _eltwise(v: Variant) -> str:
    p = v.problem
    if isinstance(p, BinaryProblem):  # the erf GELU decomposition, from its Div: one GELU of its input
        return f"{{{c_string('gelu')}, {_cdims(p.out)}, 0.0f, 0.0f}}"
    assert isinstance(p, EltwiseProblem)
    if p.alg == "clip":  # a run-time bound (None) is NaN in the runtime's tables
        alpha, beta = (float("nan") if b is None else b for b in (p.min, p.max))
    else:
        alpha, beta = p.alpha or 0.0, p.beta or 0.0
    return f"{{{c_string(p.alg)}, {_cdims(p.shape)}, {_cfloat(alpha)}, {_cfloat(beta)}}}"


def _prelu(v: Variant) -> str:
    p = v.problem
    assert isinstance(p, PreluProblem)
    return f"{{{_cdims(p.shape)}, {_cdims(p.slope)}}}"


def _binary(v: Variant) -> str:
    p = v.problem
    assert isinstance(p, BinaryProblem)
    exponent = float("nan") if p.exponent is None else p.exponent
    return f"{{{c_string(p.alg)}, {_cdims_list(p.shapes)}, {_cdims(p.out)}, {_cfloat(exponent)}}}"


def _gemm(v: Variant) -> str:
    p = v.problem
    assert isinstance(p, GemmProblem)
    return ("{" + _ints(p, "m n k ta tb") + f", {_cfloat(p.alpha)}, {_cfloat(p.beta)}, "
            f"{_cbool(p.c is not None)}, {_cdims(p.c or ())}, {_cbool(v.api == 'inner_product')}}}")


def _matmul(v: Variant) -> str:
    p = v.problem
    assert isinstance(p, MatMulProblem)
    return f"{{{_cdims(p.a)}, {_cdims(p.b)}}}"


def _softmax(v: Variant) -> str:
    p = v.problem
    assert isinstance(p, SoftmaxProblem)
    return f"{{{c_string(p.alg)}, {_cdims(p.shape)}, {p.axis}, {_cbool(p.flat)}}}"


def _concat(v: Variant) -> str:
    p = v.problem
    assert isinstance(p, ConcatProblem)
    return f"{{{p.axis}, {_cdims_list(p.shapes)}}}"


def _lnorm(v: Variant) -> str:
    p = v.problem
    if isinstance(p, ReduceProblem):  # the LayerNorm decomposition: scale and shift, over the mean's axes
        # (its epsilon, an Add of a constant, changes no work: oneDNN's default stands in)
        return f"{{{_cdims(p.shape)}, {p.axes[0]}, {_cfloat(1e-5)}, true}}"
    assert isinstance(p, LnormProblem)
    return f"{{{_cdims(p.shape)}, {p.axis}, {_cfloat(p.eps)}, {_cbool(p.bias)}}}"


def _reduce(v: Variant) -> str:
    p = v.problem
    assert isinstance(p, ReduceProblem)
    return f"{{{c_string(p.alg)}, {_cdims(p.shape)}, {_cdims(p.axes)}}}"


def _transpose(v: Variant) -> str:
    p = v.problem
    assert isinstance(p, TransposeProblem)
    return f"{{{_cdims(p.shape)}, {_cdims(p.perm)}}}"


def _copy(v: Variant) -> str:
    p = v.problem
    assert isinstance(p, CopyProblem)
    return (f"{{{c_string(p.op)}, {_cbool(p.how == 'region')}, {_cdims(p.src or ())}, {_cdims_list(p.outs)}, "
            f"{_cdims_list(p.offsets)}}}")


def _attention(v: Variant) -> str:
    p = v.problem
    assert isinstance(p, AttentionProblem)
    scale = p.scale if p.scale is not None else 1.0 / math.sqrt(p.q[-1])
    return (f"{{{_cdims(p.q)}, {_cdims(p.k)}, {_cdims(p.v)}, {_cdims(p.mask or ())}, {_cbool(p.causal)}, "
            f"{_cfloat(scale)}}}")


def _resample(v: Variant) -> str:
    p = v.problem
    assert isinstance(p, ResampleProblem)
    return f"{{{c_string(p.alg)}, {_cdims(p.shape)}, {_cdims(p.out)}}}"


PARAMS = {"conv": _conv, "pool": _pool, "bnorm": _bnorm, "lrn": _lrn, "eltwise": _eltwise,
          "prelu": _prelu, "binary": _binary, "gemm": _gemm, "matmul": _matmul,
          "softmax": _softmax, "concat": _concat, "lnorm": _lnorm, "reduce": _reduce,
          "transpose": _transpose, "copy": _copy, "attention": _attention,
          "deconv": _conv, "resample": _resample}


def covers(layer: Layer) -> bool:
    """Whether this backend benchmarks the layer: a oneDNN primitive on float data that the
    runtime has a family for. Everything else is "not covered" by oneDNN, never "missing"."""
    return layer.onednn_primitive is not None and layer.family in FAMILIES and layer.dtype in FLOAT_DTYPES


BACKEND = OneDNNBackend()
