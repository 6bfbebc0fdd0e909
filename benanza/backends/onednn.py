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
from ..layers import Layer, UniqueLayer
from ..manifest import Manifest
from ..records import Variant

log = logging.getLogger(__name__)

NAME = "onednn"
DTYPES = ("f32", "bf16")
SPATIAL_LAYOUTS = ("nchw", "nhwc", "any")
CONV_ALGOS = ("direct", "winograd", "auto")
FLOAT_DTYPES = ("f32", "f16", "bf16")  # layers computing on anything else are not benchmarked

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
}


def _dtypes(options: GenOptions) -> list[str]:
    asked = options.dtypes or DTYPES
    return [d for d in asked if d in DTYPES]


def _layouts(layer: Layer, family: Family, options: GenOptions) -> list[str]:
    spatial = family.spatial or (layer.family == "concat" and all(len(t.shape) == 4 for t in layer.inputs))
    if not spatial:
        return ["plain"]
    return [lay for lay in (options.layouts or SPATIAL_LAYOUTS) if lay in SPATIAL_LAYOUTS]


def fused_config(layer: Layer, fusion: str) -> tuple[bool, bool]:
    """(bias, relu) of a conv variant: its own bias unfused; a pattern's bias/BN fold and ReLU."""
    if fusion == "none":
        return bool(layer.param("bias")), False
    p = FUSION_PATTERNS[fusion]
    return p.conv_bias or "BatchNormalization" in p.tail, p.activation == "relu"


class OneDNNBackend:
    name = NAME

    def variants(self, unique: UniqueLayer, fusions: tuple[str, ...], options: GenOptions) -> list[Variant]:
        layer = unique.layer
        family = FAMILIES.get(layer.family)
        if family is None or layer.onednn_primitive is None or layer.dtype not in FLOAT_DTYPES:
            return []
        algos = CONV_ALGOS if layer.family == "conv" else ("default",)
        fusion_names = ("none",) + tuple(fusions) if layer.family == "conv" else ("none",)
        out = []
        for fusion in fusion_names:
            for algo in algos:
                for dtype in _dtypes(options):
                    for layout in _layouts(layer, family, options):
                        out.append(Variant(layer.key, NAME, layer.onednn_primitive, algo, dtype, layout,
                                           "default", fusion))
        return out

    def render(self, manifest: Manifest, variants: list[Variant], env: jinja2.Environment,
               out_dir: Path, options: GenOptions) -> list[Path]:
        layers = {u.layer.key: u.layer for u in manifest.layers}
        tables: dict[str, _Table] = {}
        for v in variants:
            layer = layers[v.layer_key]
            family = FAMILIES[layer.family]
            table = tables.setdefault(layer.family, _Table(layer.family, family))
            index = table.index_of(layer)
            bias, relu = fused_config(layer, v.fusion) if layer.family == "conv" else (False, False)
            table.rows.append(_row(v, index, bias, relu))
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
    params: list[tuple[str, str]] = field(default_factory=list)  # (C++ initializer, layer key)
    rows: list[str] = field(default_factory=list)  # C++ initializers, one per variant
    _index: dict[str, int] = field(default_factory=dict)

    def index_of(self, layer: Layer) -> int:
        if layer.key not in self._index:
            self._index[layer.key] = len(self.params)
            self.params.append((PARAMS[layer.family](layer), layer.key))
        return self._index[layer.key]


def _row(v: Variant, index: int, bias: bool, relu: bool) -> str:
    layout = v.layout if v.layout in ("plain", "nchw", "nhwc", "any") else "plain"
    cfg = (f"{{bo::DType::{v.dtype}, bo::Layout::{layout}, bo::ConvAlgo::{_CPP_ALGO[v.algo]}, "
           f"{_cbool(bias)}, {_cbool(relu)}}}")
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


def _ints(layer: Layer, names: str) -> str:
    return ", ".join(str(int(layer.param(n))) for n in names.split())


def _conv(layer: Layer) -> str:
    return "{" + _ints(layer, "mb ic ih iw oc oh ow kh kw sh sw pt pl dh dw g") + "}"


def _pool(layer: Layer) -> str:
    return "{" + f"{c_string(layer.param('alg'))}, " + _ints(layer, "mb ic ih iw oh ow kh kw sh sw pt pl dh dw") + "}"


def _bnorm(layer: Layer) -> str:
    return "{" + _ints(layer, "mb ic ih iw") + f", {_cfloat(layer.param('eps'))}}}"


def _lrn(layer: Layer) -> str:
    floats = ", ".join(_cfloat(layer.param(n)) for n in ("alpha", "beta", "k"))
    return "{" + _ints(layer, "mb ic ih iw size") + f", {floats}}}"


def _eltwise(layer: Layer) -> str:
    alg = layer.param("alg")
    alpha, beta = ("min", "max") if alg == "clip" else ("alpha", "beta")
    return (f"{{{c_string(alg)}, {_cdims(layer.param('shape'))}, {_cfloat(layer.param(alpha, 0.0))}, "
            f"{_cfloat(layer.param(beta, 0.0))}}}")


def _prelu(layer: Layer) -> str:
    return f"{{{_cdims(layer.param('shape'))}, {_cdims(layer.param('slope'))}}}"


def _binary(layer: Layer) -> str:
    return (f"{{{c_string(layer.param('alg'))}, {_cdims_list(layer.param('shapes'))}, "
            f"{_cdims(layer.param('out'))}}}")


def _gemm(layer: Layer) -> str:
    c = layer.param("c")
    return ("{" + _ints(layer, "m n k ta tb") + f", {_cfloat(layer.param('alpha'))}, "
            f"{_cfloat(layer.param('beta'))}, {_cbool(c is not None)}, {_cdims(c or ())}, "
            f"{_cbool(layer.onednn_primitive == 'inner_product')}}}")


def _matmul(layer: Layer) -> str:
    return f"{{{_cdims(layer.param('a'))}, {_cdims(layer.param('b'))}}}"


def _softmax(layer: Layer) -> str:
    return (f"{{{c_string(layer.param('alg'))}, {_cdims(layer.param('shape'))}, {int(layer.param('axis'))}, "
            f"{_cbool(layer.param('flat'))}}}")


def _concat(layer: Layer) -> str:
    return f"{{{int(layer.param('axis'))}, {_cdims_list(layer.param('shapes'))}}}"


PARAMS = {"conv": _conv, "pool": _pool, "bnorm": _bnorm, "lrn": _lrn, "eltwise": _eltwise,
          "prelu": _prelu, "binary": _binary, "gemm": _gemm, "matmul": _matmul,
          "softmax": _softmax, "concat": _concat}


BACKEND = OneDNNBackend()
