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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..escape import c_string
from ..fusion import BY_NAME as FUSION_PATTERNS
from ..generator import GenOptions, copy_runtime, write_if_changed
from ..layers import FLOAT_DTYPES, Layer, Model, UniqueLayer
from ..manifest import Manifest
from ..ops.attention import AttentionProblem
from ..ops.base import OnednnLowering, cpp_literal, row_fields
from ..ops.quantized import QMatMulProblem
from ..ops.registry import FAMILIES as REGISTRY
from ..ops.registry import PATTERN_LOWERINGS
from ..problems import BinaryProblem, ConvProblem, DeconvProblem, EltwiseProblem, MatMulProblem, Problem, ReduceProblem
from ..records import Variant, variant_order
from .base import CMakeBackend, Device

if TYPE_CHECKING:
    import jinja2

    from ..runner import RunOptions

log = logging.getLogger(__name__)

NAME = "onednn"
DTYPES = ("f32", "bf16")
INT8_DTYPES = ("u8", "i8")  # the activations' type of a quantized layer
# layers computed in their own type only: quantized ones, and booleans (And, Or of a mask), which
# oneDNN holds as u8 0/1 (ONNX's bool is a byte)
OWN_DTYPES = (*INT8_DTYPES, "b")
_CPP_DTYPE = {"f32": "f32", "bf16": "bf16", "u8": "u8", "i8": "s8", "b": "boolean"}
SPATIAL_LAYOUTS = ("nchw", "nhwc", "any")
CONV_ALGOS = ("direct", "winograd", "auto")

_CPP_ALGO = {"direct": "direct", "winograd": "winograd", "auto": "automatic", "default": "none"}


# family name → how its layers reach their runtime function (the registry's lowerings)
FAMILIES: dict[str, OnednnLowering] = {f.name: f.onednn for f in REGISTRY if f.onednn is not None}


def _dtypes(layer: Layer, options: GenOptions) -> list[str]:
    if layer.dtype in OWN_DTYPES:  # a quantized or boolean layer computes in its own type only
        return [layer.dtype]
    asked = options.dtypes or DTYPES
    return [d for d in asked if d in DTYPES]


def _layouts(problem: Problem, family: OnednnLowering, options: GenOptions) -> list[str]:
    spatial = family.spatial or (family.spatial_if is not None and family.spatial_if(problem))
    if not spatial:
        return ["plain", *(family.layouts(problem) if family.layouts is not None else ())]
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
    # scale: an int8 GEMM's float result scaled (mmint_scale*)
    return Fused(bias=p.bias_of(problem), relu=p.activation == "relu", gelu=p.activation == "gelu", scale=p.scale)


class OneDNNBackend(CMakeBackend):
    name = NAME
    dtypes = DTYPES
    layouts = SPATIAL_LAYOUTS
    device = Device.CPU
    samples_adaptively = True
    context_versions = {"onednn": "onednn_version"}

    def bench_env(self, threads: int, options: RunOptions) -> dict[str, str]:
        return {"OMP_NUM_THREADS": str(threads)}

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
        # MatMuls, which oneDNN runs as one GEMM), a LayerNorm or RMSNorm decomposition from its
        # ReduceMean, an int8 GEMM's scale and bias, a tanh GELU decomposition from its Tanh, an
        # attention pattern through repeat_kv as the attention it computes
        fused = conv or isinstance(problem, (MatMulProblem, ReduceProblem, BinaryProblem, QMatMulProblem,
                                             EltwiseProblem, AttentionProblem))
        # a pattern oneDNN has no fused form of (a float8 GEMM) keeps its pieces only
        runnable = tuple(f for f in fusions if f not in PATTERN_LOWERINGS or PATTERN_LOWERINGS[f].gap(problem, NAME)
                         is None)
        fusion_names = ("none",) + runnable if fused else ("none",)
        out = []
        for fusion in fusion_names:
            for algo in algos:
                for dtype in _dtypes(layer, options):
                    for layout in _layouts(problem, family, options):
                        out.append(Variant(problem, NAME, layer.onednn_primitive, algo, dtype, layout,
                                           "default", fusion))
        return out

    def render(self, manifest: Manifest, variants: list[Variant], env: jinja2.Environment,
               out_dir: Path, options: GenOptions, models: Sequence[Model] = ()) -> list[Path]:
        tables: dict[str, _Table] = {}
        for v in variants:
            # a pattern's fused form is benchmarked in another family's table (the LayerNorm
            # decomposition as one layer_normalization), keyed by its anchor's problem and the
            # fusion; so is a primitive of another family (an outer-product Mul as a matmul)
            fused = PATTERN_LOWERINGS.get(v.fusion)
            family, row = fused.onednn if fused is not None and fused.onednn is not None else (
                FAMILIES[v.problem.family].table(v.problem.family, v.api))
            table = tables.setdefault(family, _Table(family, FAMILIES[family]))
            table.add(v, row)
        # sorted by family, then problem text: the same models give the same file in any order
        rendered = [t.rendered() for _, t in sorted(tables.items())]
        source = env.get_template("benchmarks.cpp.j2").render(tables=rendered, count=len(variants))
        files = [write_if_changed(out_dir / "benchmarks.cpp", source),
                 write_if_changed(out_dir / "CMakeLists.txt", env.get_template("CMakeLists.txt.j2").render())]
        # the project carries its runtime, so it builds without a Benanza checkout
        files += copy_runtime(out_dir / "runtime", ("common", NAME))
        return files


@dataclass
class _Table:
    family: str
    spec: OnednnLowering
    # one params row per problem, whatever the dtype; and per pattern lowered into this table,
    # whose row may hold what the anchor's problem does not (a QDQ Conv's per-channel scales)
    params: dict[tuple[Problem, str], Any] = field(default_factory=dict)
    variants: list[Variant] = field(default_factory=list)

    def add(self, v: Variant, row: Callable[[Any, str], Any]) -> None:
        if _row_key(v) not in self.params:
            self.params[_row_key(v)] = row(v.problem, v.api)
        self.variants.append(v)

    def rendered(self) -> dict[str, Any]:
        """The template's view: params rows as (designated initializer, problem key), sorted by
        key; variant rows in the generator's order (by problem, then name)."""
        order = sorted(self.params, key=lambda k: (k[0].text(), k[1]))
        index = {k: i for i, k in enumerate(order)}
        rows = [_row(v, index[_row_key(v)], fused_config(v.problem, v.fusion))
                for v in sorted(self.variants, key=variant_order)]
        params = [(initializer(self.params[k]), k[0].text() + (f" ({k[1]})" if k[1] else "")) for k in order]
        struct = type(self.params[order[0]]).__name__
        return {"family": self.family, "params_type": struct, "bench": self.spec.bench, "params": params, "rows": rows}


def _row_key(v: Variant) -> tuple[Problem, str]:
    """A variant's params row: its problem's, or its problem's under the pattern lowered into
    another family's table (the same Conv as qdq_conv and qdq_conv_per_channel: two rows)."""
    return v.problem, v.fusion if v.fusion in PATTERN_LOWERINGS else ""


def _row(v: Variant, index: int, f: Fused) -> str:
    layout = v.layout if v.layout in ("plain", "nchw", "nhwc", "any", "axis_inner") else "plain"
    flags = ", ".join(f".{name} = {_cbool(getattr(f, name))}" for name in ("bias", "relu", "gelu", "attention",
                                                                        "scale", "mask"))
    cfg = (f"{{.dtype = bo::DType::{_CPP_DTYPE[v.dtype]}, .layout = bo::Layout::{layout}, "
           f".algo = bo::ConvAlgo::{_CPP_ALGO[v.algo]}, {flags}}}")
    return f"{{.name = {c_string(v.name)}, .index = {index}, .config = {cfg}}}"


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


def initializer(row: Any) -> str:
    """A params row as a C++ designated initializer."""
    fields = row_fields(row, lambda kind, value: cpp_literal(kind, value, c_string, _cfloat))
    return "{" + ", ".join(f".{name} = {value}" for name, value in fields) + "}"


def covers(layer: Layer) -> bool:
    """Whether this backend benchmarks the layer: a oneDNN primitive on float (or a quantized
    family's int8, or a boolean family's u8 0/1) data that the runtime has a family for.
    Everything else is "not covered" by oneDNN, never "missing"."""
    return (layer.onednn_primitive is not None and layer.family in FAMILIES
            and (layer.dtype in FLOAT_DTYPES or layer.dtype in OWN_DTYPES))


BACKEND = OneDNNBackend()
