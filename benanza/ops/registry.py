"""The op registry: every op family, in one table that the processor, the backends, the fusion
matcher and the key parser iterate.

A family (``benanza.ops.<module>``) recognises ONNX nodes, builds its typed problem (key
grammar, FLOPs) and names the library call that runs it on each backend (Table II of the paper
for cuDNN/cuBLAS; the oneDNN primitive for the CPU backend), with the lowering of each call. An
op with no family is still a layer: it gets a generic problem and no API, so coverage reports
list it instead of dropping it.
"""

from __future__ import annotations

import functools

from ..errors import LayerKeyError
from ..fusion import PATTERNS as FUSION_PATTERNS
from ..layers import FLOAT_DTYPES, Layer
from . import (
    attention,
    binary,
    cast,
    conv,
    copy,
    eltwise,
    gemm,
    norm,
    pool,
    quantized,
    reduce,
    resample,
    rnn,
    rope,
    softmax,
)
from .base import ELEMENT_SIZE, Family, NodeView, PatternLowering
from .generic import GenericProblem, generic_family, identity_family
from .grammar import DTYPE_RE, Problem, parse_key

MODULES = (conv, pool, norm, eltwise, binary, gemm, softmax, reduce, copy, rnn, resample, attention, cast, quantized,
           rope)
FAMILIES: tuple[Family, ...] = tuple(f for m in MODULES for f in m.FAMILIES)
PROBLEM_TYPES: dict[str, type[Problem]] = {f.problem.FAMILY: f.problem for f in FAMILIES}
GENERIC = generic_family(PROBLEM_TYPES)
SAME_CAST = identity_family(PROBLEM_TYPES)


def _by_op() -> dict[str, tuple[Family, ...]]:
    """op → the families claiming it, tried in order; an op two families claim is split by
    their ``when`` (a Cast to its own type is the identity, one into a float type a cast)."""
    table: dict[str, tuple[Family, ...]] = {}
    for family in (SAME_CAST,) + FAMILIES:
        for op in family.ops:
            table[op] = table.get(op, ()) + (family,)
    return table


_BY_OP = _by_op()

# fusion pattern name → its fused form's lowering (patterns without one run unfused only)
PATTERN_LOWERINGS: dict[str, PatternLowering] = {
    p.pattern: p for p in norm.PATTERNS + eltwise.PATTERNS + quantized.PATTERNS + rope.PATTERNS + tuple(
        attention.pattern_lowering(f.name, f.scale, f.mask) for f in FUSION_PATTERNS if f.attention)}


def family_of(view: NodeView) -> Family:
    for family in _BY_OP.get(view.op, ()):
        if family.when(view):
            return family
    return GENERIC


def family_named(name: str) -> Family:
    for family in FAMILIES:
        if family.name == name:
            return family
    raise KeyError(name)


def _io_bytes(view: NodeView) -> int:
    tensors = [t for t in view.inputs if t is not None] + list(view.outputs)
    return sum(t.numel * ELEMENT_SIZE.get(t.dtype, 4) for t in tensors)


def build_layer(view: NodeView) -> Layer:
    """The Layer record of one node: its problem, work and library coverage.

    The benchmarks compute in float types, in int8 where a quantized family says so and in
    booleans where the binary family does (And, Or, Equal of a mask); the runtimes have no int64
    tensors (oneDNN no s64 at all), so other integer and boolean layers (shape arithmetic, a
    mask's Cast, Gather, Expand) are covered by neither library.
    """
    family = family_of(view)
    problem = family.build(view)
    macs = problem.macs()
    flops = problem.flops()
    elementwise = view.outputs[0].numel if view.outputs else 0
    dtype = family.dtype(view)
    numeric = dtype in FLOAT_DTYPES or dtype in family.int_dtypes
    return Layer(
        op=view.op,
        problem=problem,
        dtype=dtype,
        inputs=tuple(t for t in view.inputs if t is not None),
        outputs=tuple(view.outputs),
        macs=macs,
        flops=elementwise if flops is None else flops,
        bytes=_io_bytes(view),
        cudnn_api=family.cudnn_api(problem) if numeric else None,
        onednn_primitive=family.onednn_api(problem) if numeric else None,
    )


def uncovered_reason(layer: Layer, backend: str) -> str | None:
    """Why ``backend`` has no call for ``layer``, where its family says (None otherwise)."""
    family = next((f for f in FAMILIES if f.name == layer.family), None)
    return None if family is None else family.uncovered(layer.problem, backend)


# --- keys ----------------------------------------------------------------------------------

def format_problem(p: Problem) -> str:
    return p.text()


@functools.lru_cache(maxsize=65536)
def parse_problem(text: str) -> Problem:
    """The problem a key (without dtype) names; a family Benanza does not model is generic."""
    key = parse_key(text)
    cls = PROBLEM_TYPES.get(key.family)
    if cls is None:
        rest = text.partition(":")[2]
        return GenericProblem(key.family, tuple(rest.split("_")))
    problem = cls.parse_tokens(key, text)
    if problem.text() != text:
        raise LayerKeyError(f"layer key {text!r} is not in canonical form (it reads as {problem.text()!r})")
    return problem


@functools.lru_cache(maxsize=65536)
def parse_layer_key(text: str) -> tuple[Problem, str]:
    """(problem, dtype) of a layer key: the inverse of ``layer_key``."""
    head, sep, dtype = text.rpartition("_")
    if not sep or not DTYPE_RE.match(dtype):
        raise LayerKeyError(f"layer key {text!r} does not end in a dtype")
    return parse_problem(head), dtype
