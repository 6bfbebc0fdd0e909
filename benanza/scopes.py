"""The module each ONNX node came from, as its exporter recorded it (read by the processor).

Three records exist in the wild, tried in this order for a whole model:

* torch's dynamo exporter writes ``pkg.torch.onnx.name_scopes`` (``['', 'layers.0',
  'layers.0.qkv', 'linear_1']``: the root, each enclosing module's qualified name, then the FX
  node) and ``pkg.torch.onnx.class_hierarchy`` (the modules' classes, then the aten op) into
  each node's ``metadata_props``;
* the TorchScript exporter and most converters name nodes by ``/``-separated scopes
  (``/layers.0/qkv/MatMul``, ``/blocks/blocks.0/body/body.0/Conv``);
* a call to a model-local ONNX function is that function's instance.

Paths are normalised to qualified module names (``layers.0.qkv``), so both torch exporters give
one tree. A model with none of them is grouped by op type by the analysis.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the analyses read the module names below without loading ONNX
    import onnx

NAME_SCOPES = "pkg.torch.onnx.name_scopes"
CLASS_HIERARCHY = "pkg.torch.onnx.class_hierarchy"

TORCH_METADATA = "torch exporter metadata"
NODE_NAMES = "node names"
LOCAL_FUNCTIONS = "local functions"
OP_TYPES = "op types"

# (qualified module name, its class or ""), outermost first; () is the model itself
Scope = tuple[tuple[str, str], ...]


def scope_source(nodes: Sequence[onnx.NodeProto], functions: Sequence[onnx.FunctionProto]) -> str:
    """Which record the model carries (the first of the module docstring's list)."""
    if any(p.key == NAME_SCOPES for n in nodes for p in n.metadata_props):
        return TORCH_METADATA
    if any("/" in n.name for n in nodes):
        return NODE_NAMES
    local = {(f.domain, f.name) for f in functions}
    if any((n.domain, n.op_type) in local for n in nodes):
        return LOCAL_FUNCTIONS
    return OP_TYPES


def _literal_list(text: str) -> list[str] | None:
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else None


def qualify(segments: Sequence[str]) -> tuple[str, ...]:
    """Scope segments as qualified names. TorchScript names a child of a called container by the
    container's own name plus the index (``blocks/blocks.0``, ``body/body.2/body.2.0``) and any
    other child by its attribute (``layers.0/qkv``); attribute names hold no dot, so a segment
    that starts with its parent's segment and a dot extends the parent's qualified name."""
    out: list[str] = []
    parent_seg = ""
    for seg in segments:
        if not out:
            out.append(seg)
        elif seg.startswith(parent_seg + "."):
            out.append(out[-1] + seg[len(parent_seg):])
        elif seg.startswith(out[-1] + "."):  # already qualified (the dynamo exporter's scopes)
            out.append(seg)
        else:
            out.append(out[-1] + "." + seg)
        parent_seg = seg
    return tuple(out)


def node_scope(node: onnx.NodeProto, source: str, functions: Sequence[onnx.FunctionProto]) -> Scope | None:
    """The node's module path under the model's ``source``; None when the node has no record
    (the analysis places it with its neighbours)."""
    if source == TORCH_METADATA:
        props = {p.key: p.value for p in node.metadata_props}
        names = _literal_list(props.get(NAME_SCOPES, ""))
        if not names:
            return None
        classes = _literal_list(props.get(CLASS_HIERARCHY, "")) or []
        # entry 0 is the model itself, the last the FX node the op came from: neither is a module
        modules = names[1:-1]
        kinds = classes[1:-1] if len(classes) == len(names) else [""] * len(modules)
        return tuple(zip(qualify([m for m in modules if m]), (k for m, k in zip(modules, kinds) if m)))
    if source == NODE_NAMES:
        if "/" not in node.name:
            return None
        segments = [s for s in node.name.split("/")[:-1] if s]
        return tuple((name, "") for name in qualify(segments))
    if source == LOCAL_FUNCTIONS:
        if not any((f.domain, f.name) == (node.domain, node.op_type) for f in functions):
            return None
        return ((node.name or node.op_type, f"{node.domain}.{node.op_type}" if node.domain else node.op_type),)
    return None
