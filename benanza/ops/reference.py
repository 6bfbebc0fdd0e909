"""What ``benanza check`` needs from an op family to recompute what its oneDNN benchmark computes.

The benchmark fills its tensors from the runtime's seedable generator (``generated``, typed by
``as_filled`` and ``as_scales``); the reference is the model's own nodes, run by ONNX Runtime on
the same values. Which of the nodes' inputs the benchmark fills, in which stream order and as
which type, and what the reference changes about the nodes, is the family's knowledge: its
oneDNN lowering's ``reference`` (``OnednnLowering``) and a fusion pattern's ``reference``
(``FusionPattern``), both building a ``Spec`` for one site (an occurrence in a real model).
``benanza.check`` finds the site, runs the spec and compares; it knows no family.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .base import Dims, DimsList

if TYPE_CHECKING:
    import numpy as np
    import onnx

    from ..fusion import FusionPattern
    from ..records import Variant

# (the node's position in the site, its input index)
Slot = tuple[int, int]
# stream k's values for a tensor of the given dims, as f32 (``generated`` at the check's seed)
Gen = Callable[[int, Dims], "np.ndarray"]


class NoReference(Exception):
    """This benchmark has no reference here (the reason is the message)."""


# --- the input generator (runtime_cpp/common/benanza/runtime.hpp: fill_value) ----------------

_GOLDEN = 0x9E3779B97F4A7C15


def generated(stream: int, shape: Dims, seed: int = 0) -> np.ndarray:
    """The values the runtime fills its ``stream``-th tensor with, as f32 of ``shape``
    (row-major order of the dims the benchmark gives its library): splitmix64's mix of
    ``((seed·256 + stream) << 32) + i``, top byte, as a multiple of 1/128 in [−1, 1)."""
    import numpy as np  # loaded by the checks that fill tensors, not by every reader of a key

    n = math.prod(shape)
    with np.errstate(over="ignore"):
        z = np.uint64((seed * 256 + stream) << 32) + np.arange(n, dtype=np.uint64) + np.uint64(_GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    top = (z >> np.uint64(56)).astype(np.int64) - 128
    values: np.ndarray = top.astype(np.float32).reshape(shape) / np.float32(128)
    return values


def as_filled(values: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    """A stream's values as the runtime fills a tensor of ``dtype`` (onednn.cpp: fill_as):
    floats as they are, signed integers 128·v, unsigned ones floor(64·v + 64) in [0, 127]
    (7-bit, so no int8 kernel's u8·s8 pair sum saturates at int16, VNNI or not), booleans
    v ≥ 0 (0/1, a mask's both values in about equal shares)."""
    import numpy as np

    if dtype.kind == "b":
        return np.asarray(values >= 0)
    if dtype.kind == "f":
        return np.asarray(values, dtype)
    if dtype.kind == "u":
        return np.asarray(np.floor(values * 64 + 64), dtype)
    return np.asarray(np.rint(values * 128), dtype)


def as_scales(values: np.ndarray) -> np.ndarray:
    """A stream's values as the runtime fills quantization scales: 2^floor(4·v)."""
    import numpy as np

    return np.asarray(np.exp2(np.floor(4 * values)), np.float32)


_NUMPY_TYPES = {"f32": "float32", "f16": "float16", "i32": "int32", "i8": "int8", "u8": "uint8"}


def np_type(short: str) -> np.dtype[Any]:
    """The NumPy type of a short dtype name the reference is fed in."""
    import numpy as np

    if short not in _NUMPY_TYPES:
        raise NoReference(f"no NumPy type to feed {short} data to the reference")
    return np.dtype(_NUMPY_TYPES[short])


# --- one occurrence of a benchmark in a model, and the reference of it -----------------------

class Site(Protocol):
    """One model's occurrence of a benchmark: its nodes (a fusion pattern's anchor first) and
    their tensors' real shapes (``benanza.check`` has the model)."""

    @property
    def nodes(self) -> tuple[int, ...]: ...

    def proto(self, pos: int) -> onnx.NodeProto: ...

    def shape(self, name: str) -> Dims: ...

    def in_shape(self, pos: int, i: int) -> Dims: ...

    def external(self, pos: int, inside: str) -> int:
        """The input index of node ``pos`` that is not the tensor ``inside`` (a bias, a mask)."""

    def with_producer(self, pos: int, i: int) -> Site:
        """This site and, last, the node producing input ``i`` of node ``pos``."""


@dataclass(frozen=True)
class Spec:
    """A reference for one benchmark: the model's nodes, the generated value of every input the
    benchmark fills (by slot), the outputs it writes, in its order. ``constants``: generated
    values of inputs the model holds as constants, which stay constants in the reference (ONNX
    Runtime picks its kernel from them: its QDQ fusions need constant weights)."""

    nodes: tuple[int, ...]
    feeds: Mapping[Slot, np.ndarray]
    outputs: tuple[str, ...]
    note: str = ""  # what the comparison does beyond running the nodes as they are
    # a copy standing in for an op it does not compute: its outputs' dims, each compared with
    # the generated source it moves and in size with the op's real output
    dense: DimsList | None = None
    attrs: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)  # per node position: attributes to set
    extra_inputs: Mapping[int, tuple[str, ...]] = field(default_factory=dict)  # per node position: inputs to append
    constants: Mapping[Slot, np.ndarray] = field(default_factory=dict)


# A family's reference for one site of an unfused benchmark of it (``OnednnLowering.reference``),
# and a fusion pattern's for one of its matches (``FusionPattern.reference``).
Reference = Callable[["Site", "Variant", Gen], Spec]
PatternReference = Callable[["Site", "Variant", Gen, "FusionPattern"], Spec]


def fill(site: Site, gen: Gen, order: Sequence[Slot]) -> dict[Slot, np.ndarray]:
    """Stream k fills slot ``order[k]``: where the benchmark's dims are the ONNX input's up to a
    reshape (unit dims, a broadcast weight's folded rows), the same row-major values."""
    return {(pos, i): gen(k, site.in_shape(pos, i)) for k, (pos, i) in enumerate(order)}


def last_output(site: Site) -> tuple[str]:
    """A fusion pattern's result: its last node's first output."""
    return (site.proto(len(site.nodes) - 1).output[0],)


def external_slot(site: Site, pos: int, inside: int) -> Slot:
    """The slot of node ``pos``'s input that is not node ``inside``'s first output (a pattern's
    bias, scale or shift)."""
    return pos, site.external(pos, site.proto(inside).output[0])


@dataclass(frozen=True)
class Fills:
    """The reference of a benchmark that fills some of its node's inputs as they are: stream k
    fills input ``order(problem)[k]``; the node's first output is compared."""

    order: Callable[[Any], tuple[int, ...]]

    def __call__(self, site: Site, v: Variant, gen: Gen) -> Spec:
        return Spec(site.nodes, fill(site, gen, [(0, i) for i in self.order(v.problem)]), (site.proto(0).output[0],))
