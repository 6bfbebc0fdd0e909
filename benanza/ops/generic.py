"""The fallback for ops no family models (a generic key of the op word and descriptive tokens;
no library call runs it), and a Cast to the type it already has (computes nothing)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .base import Family, NodeView, required, word
from .grammar import Problem, format_dims, format_number, key_hash

if TYPE_CHECKING:
    import numpy as np

# Ops whose output is their input's data under another shape: views in every framework.
VIEW_OPS = ("reshape", "squeeze", "unsqueeze", "flatten", "identity")


@dataclass(frozen=True)
class GenericProblem(Problem):
    """An op no family models: its key is the op word and descriptive tokens (input shapes,
    small constant values, outputs, attributes), built by ``ops``; no library call runs it."""

    op: str
    tokens: tuple[str, ...]

    @property
    def family(self) -> str:
        return self.op

    @property
    def view(self) -> bool:
        return self.op in VIEW_OPS

    def flops(self) -> int | None:
        return 0 if self.view else None  # an op no family models: the layer counts one per output element

    def text(self) -> str:
        return self.op + ":" + "_".join(self.tokens)

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "tokens": list(self.tokens)}



_VALUE_INPUT_MAX = 64


def _attr_token(name: str, value: object) -> str:
    import numpy as np

    n = word(name)
    if isinstance(value, (bytes, str)):
        return n + word(value)
    if isinstance(value, (list, tuple)):
        if value and isinstance(value[0], (bytes, str)):
            return n + "".join(word(v) for v in value)
        return n + "x".join(format_number(v) for v in value) if value else n
    if isinstance(value, (int, float, np.integer, np.floating)):
        return n + format_number(value.item() if hasattr(value, "item") else value)
    # tensors and graphs: identify by content digest, digits only so the grammar holds
    return n + str(int(key_hash(repr(value)), 16) % 10**12)


def _values_token(arr: np.ndarray) -> str:
    import numpy as np

    flat = arr.reshape(-1)
    # the key grammar has no inf/nan (a causal mask's -inf): such values are identified by digest
    if flat.size > _VALUE_INPUT_MAX or (flat.dtype.kind == "f" and not np.all(np.isfinite(flat))):
        return "vh" + str(int(key_hash(flat.tobytes().hex()), 16) % 10**12)
    if flat.size == 0:
        return "v"
    items = [format_number(x.item()) for x in flat]
    return "v" + "x".join(items)


def generic_build(view: NodeView, typed: Collection[str]) -> GenericProblem:
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
    op = word(view.op)
    if op in typed:  # e.g. a 3-D Conv: not the 2-D family of the same name
        op += f"{len(view.inputs[0].shape) - 2 if view.inputs and view.inputs[0] else 0}d"
    return GenericProblem(op, tuple(tokens) or ("none",))


def same_cast(view: NodeView) -> bool:
    """A Cast to the type it already has (the TorchScript exporter writes them) computes nothing."""
    return bool(view.outputs) and view.outputs[0].dtype == required(view, 0).dtype


def generic_family(typed: Collection[str]) -> Family:
    """The fallback family; ``typed``: the family names a generic op word must not take."""
    return Family("generic", GenericProblem, (), lambda view: generic_build(view, typed))


def identity_family(typed: Collection[str]) -> Family:
    return Family("identity", GenericProblem, ("Cast",),
                  lambda view: GenericProblem("identity", generic_build(view, typed).tokens), same_cast)
