"""What every op family module is made of: the node view it recognises, the family record the
registry holds, and the typed lowering rows the backends' templates render.

A lowering row is a frozen dataclass whose fields are, in order, the fields of one C++ struct of
the backend's runtime (``runtime_cpp/onednn/benanza/onednn.hpp``, ``runtime_cpp/cudnn/
benanza_cudnn/tables.hpp``); a backend renders it as a designated initializer
(``{.mb = 1, .ic = 64, ...}``), so a field the C++ side renamed or reordered fails to compile
instead of landing in the wrong slot. Field types name the C++ literal: ``int``, ``bool``,
``float``, ``str`` (a C string), ``Cpp`` (an enumerator, verbatim), ``Dims`` and ``DimsList``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from ..errors import NodeError
from .grammar import Problem

if TYPE_CHECKING:
    import numpy as np

    from ..layers import Model, TensorSpec
    from .reference import Reference

ELEMENT_SIZE = {
    "f32": 4, "f16": 2, "bf16": 2, "f64": 8, "i8": 1, "u8": 1, "i16": 2, "u16": 2,
    "i32": 4, "u32": 4, "i64": 8, "u64": 8, "b": 1, "str": 8,
    "f8e4m3fn": 1, "f8e4m3fnuz": 1, "f8e5m2": 1, "f8e5m2fnuz": 1,
}

Dims = tuple[int, ...]
DimsList = tuple[tuple[int, ...], ...]


class Cpp(str):
    """A C++ expression written as is (an enumerator such as ``PoolMode::Max``)."""


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
    attrs: dict[str, Any]
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


# A fusion pattern's node finder (``benanza.fusion``), which lives with the family of the
# pattern's fused form: (model, consumers, anchor index) → the pattern's nodes, the anchor
# first, or None.
NodeFinder = Callable[["Model", dict[int, list[int]], int], "list[int] | None"]


# --- lowerings -----------------------------------------------------------------------------

@dataclass(frozen=True)
class OnednnLowering:
    """How a family's layers reach one oneDNN runtime function: ``row`` makes the params row
    (a dataclass named for its C++ struct) of a problem and the layer's primitive."""

    bench: str  # runtime function suffix (bench_<name>)
    spatial: bool  # 4-d activations: expands over layouts
    row: Callable[[Any, str], Any]
    # a family whose layers are spatial only when every input is 4-d (Concat)
    spatial_if: Callable[[Any], bool] | None = None
    # how ``benanza check`` recomputes what the benchmark computes (``reference.Fills``: the
    # node's inputs the runtime fills, in the order of its generated streams); None is a
    # registry error (tests/ops/test_registry.py)
    reference: Reference | None = None
    # a non-spatial family's layouts besides ``plain`` for a problem (the softmax axis innermost)
    layouts: Callable[[Any], tuple[str, ...]] | None = None
    # primitives run by another family's runtime function: primitive → (that family, the row of
    # a problem of this one for it), as a fusion pattern's fused form (``PatternLowering``)
    via: Mapping[str, tuple[str, Callable[[Any, str], Any]]] = field(default_factory=dict)

    def table(self, family: str, api: str) -> tuple[str, Callable[[Any, str], Any]]:
        """The runtime family whose function runs ``family``'s primitive ``api``, and the row."""
        return self.via.get(api, (family, self.row))


@dataclass(frozen=True)
class CudnnTable:
    """One runtime family of ``runtime_cpp/cudnn``: its C++ layer struct and registration."""

    name: str
    add: str  # registration function (tables.hpp)
    spatial: bool  # NCHW and NHWC both generated
    math: bool  # the call takes a math mode


@dataclass(frozen=True)
class CudnnLowering:
    """A cuDNN/cuBLAS call's table and the row (a dataclass named for the table's C++ struct)
    of a problem; ``call``: the variant's call constant in tables.hpp, or a function of the
    problem giving it where the problem's fields pick the call (a per-column scale's alpha vector)."""

    table: CudnnTable
    row: Callable[[Any, str], Any]
    call: str | Callable[[Any], str] = "kCall"

    def call_for(self, problem: Any) -> str:
        return self.call if isinstance(self.call, str) else self.call(problem)


@dataclass(frozen=True)
class PatternLowering:
    """A fusion pattern's fused form, benchmarked on its anchor's problem in another family's
    table: oneDNN's (family name, row) and cuDNN's (lowering, call) where the backend has one."""

    pattern: str
    onednn: tuple[str, Callable[[Any, str], Any]] | None = None
    cudnn: CudnnLowering | None = None
    # backend → why it has no fused form of the pattern (its pieces stay costed one by one there)
    gaps: Mapping[str, str] = field(default_factory=dict)
    # backend → why it has no fused form for this anchor problem, or None where it has (cuDNN's
    # int8 convolution takes channel counts that are multiples of 4 only): a rule of the
    # problem, where ``gaps`` is one of the backend
    problem_gaps: Mapping[str, Callable[[Any], str | None]] = field(default_factory=dict)

    def gap(self, problem: Any, backend: str) -> str | None:
        """Why ``backend`` has no fused form of the pattern for the anchor's ``problem``, or None."""
        if backend in self.gaps:
            return self.gaps[backend]
        rule = self.problem_gaps.get(backend)
        return rule(problem) if rule is not None else None


# --- the family record ---------------------------------------------------------------------

def _always(view: NodeView) -> bool:
    return True


def _none(problem: Problem) -> str | None:
    return None


def _no_reason(problem: Problem, backend: str) -> str | None:
    return None


def const(api: str | None) -> Callable[[Problem], str | None]:
    return lambda problem: api


@dataclass(frozen=True)
class Family:
    """One op family: the ONNX ops it recognises (``when`` narrows them), its problem record and
    builder, which library call runs a problem on each backend (None: not covered there), and
    the lowering of each call. A backend API without a lowering is a registry error
    (tests/ops/test_registry.py walks every family)."""

    name: str
    problem: type[Problem]
    ops: tuple[str, ...]
    build: Callable[[NodeView], Problem]
    when: Callable[[NodeView], bool] = _always
    cudnn_api: Callable[[Problem], str | None] = _none
    onednn_api: Callable[[Problem], str | None] = _none
    cudnn: Mapping[str, CudnnLowering] = field(default_factory=dict)  # cudnn_api → lowering
    onednn: OnednnLowering | None = None
    # the dtype the layer computes in: its first input's, unless the family says otherwise
    # (Where's first input is its boolean condition; the data it moves is its output's type)
    dtype: Callable[[NodeView], str] = lambda view: view.dtype
    # non-float dtypes the family's library calls compute in (quantized layers' int8, the binary
    # family's booleans); a layer in any other non-float dtype is covered by no library
    int_dtypes: tuple[str, ...] = ()
    # why a backend has no call for a problem of the family, in one line, where the family knows
    # (an attribute no library cell computes); None: no reason to give beyond "no call"
    uncovered: Callable[[Problem, str], str | None] = _no_reason
    # f32 results equal the reference's: the family moves data or only multiplies and adds (the
    # check's generated inputs make those exact), where others approximate exp/erf/rsqrt or sum
    # in another order than the reference
    exact: bool = False


# --- helpers the builders share ------------------------------------------------------------

def required(view: NodeView, i: int, rank: int | None = None) -> TensorSpec:
    """An input the family cannot do without; ONNX lets only optional inputs be omitted.
    ``rank``: the dims the family needs where ONNX's own checks do not hold it to them (a
    Conv weight once ``kernel_shape`` is given)."""
    t = view.inputs[i]
    if t is None:
        raise NodeError(f"required input {i} is omitted")
    if rank is not None and len(t.shape) != rank:
        raise NodeError(f"input {i} has {len(t.shape)} dims, {view.op} here needs {rank}")
    return t


def present(view: NodeView, i: int) -> bool:
    return len(view.inputs) > i and view.inputs[i] is not None


def word(s: object) -> str:
    text = s.decode() if isinstance(s, bytes) else str(s)
    return "".join(ch for ch in text.lower() if ch.isalpha()) or "x"


def is_4d(view: NodeView) -> bool:
    return view.inputs[0] is not None and len(view.inputs[0].shape) == 4


def nchw(shape: Sequence[int]) -> tuple[int, int, int, int]:
    """Fold a rank 2..4 tensor into (N, C, H, W) as cuDNN's 4-d descriptors see it."""
    dims = list(shape) + [1] * (4 - len(shape))
    return dims[0], dims[1], dims[2], dims[3]


def fold4(shape: Sequence[int]) -> tuple[int, int, int, int]:
    """N, C, H, W view of an element-wise tensor (trailing 1s; extra dims folded into W)."""
    dims = list(shape) + [1] * (4 - len(shape))
    return dims[0], dims[1], dims[2], math.prod(dims[3:])


def align(shape: Sequence[int], rank: int) -> Dims:
    """Right-aligned to ``rank`` dims with leading 1s: NumPy/ONNX broadcasting."""
    return (1,) * (rank - len(shape)) + tuple(shape)


def dims8(dims: Sequence[int], rank: int, fill: int) -> Dims:
    """Right-aligned to ``rank`` dims with leading ``fill``s, padded with 0s to the cuDNN
    runtime's 8."""
    return (fill,) * (rank - len(dims)) + tuple(dims) + (0,) * (8 - rank)


# --- rendering a row -----------------------------------------------------------------------

def row_fields(row: Any, literal: Callable[[str, Any], str]) -> list[tuple[str, str]]:
    """(field name, C++ literal) of a lowering row, in declaration order; ``literal`` maps a
    field's declared type and value to C++."""
    # a trailing underscore keeps a C++ name that is a Python keyword (``in``)
    return [(f.name.rstrip("_"), literal(str(f.type), getattr(row, f.name))) for f in fields(row)]


def cpp_dims(dims: Sequence[int]) -> str:
    return "{" + ", ".join(str(int(d)) for d in dims) + "}"


def cpp_literal(kind: str, value: Any, c_string: Callable[[str], str], cpp_float: Callable[[Any], str]) -> str:
    """The C++ literal of one row field, by its declared type."""
    if kind == "bool":
        return "true" if value else "false"
    if kind == "int":
        return str(int(value))
    if kind == "float":
        return cpp_float(value)
    if kind == "Cpp":
        return str(value)
    if kind == "str":
        return c_string(value)
    if kind == "Dims":
        return cpp_dims(value)
    if kind == "DimsList":
        return "{" + ", ".join(cpp_dims(d) for d in value) + "}"
    raise AssertionError(f"no C++ literal for a field of type {kind}")
