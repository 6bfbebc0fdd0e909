"""Self-check helpers: layer count and MACs of a ModelProto (independent of benanza.processor).

Layer rule (the paper's, as implemented by the model processor): every graph node is a
layer except nodes that only materialise a constant -- ``Constant`` nodes, and
``ConstantOfShape``/``Identity``/``Cast`` nodes whose inputs are all constant (initializers
or outputs of such constant nodes).

MACs: Conv = N*OC*OH*OW*(IC/group)*KH*KW; Gemm/MatMul = M*N*K (times any leading batch
dims of MatMul); all other layers count zero.  Shapes come from ``onnx.shape_inference``
with every symbolic dimension bound to ``batch``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import shape_inference

_CONST_MAKERS = {"ConstantOfShape", "Identity", "Cast"}


def constant_nodes(graph: onnx.GraphProto) -> set[int]:
    """Indices of the nodes that only materialise constants."""
    consts = {t.name for t in graph.initializer}
    graph_inputs = {i.name for i in graph.input} - consts
    idx: set[int] = set()
    changed = True
    while changed:
        changed = False
        for i, n in enumerate(graph.node):
            if i in idx:
                continue
            if n.op_type == "Constant" or (
                n.op_type in _CONST_MAKERS
                and all(x == "" or (x in consts and x not in graph_inputs) for x in n.input)
            ):
                idx.add(i)
                consts.update(o for o in n.output if o)
                changed = True
    return idx


def layer_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    skip = constant_nodes(model.graph)
    return [n for i, n in enumerate(model.graph.node) if i not in skip]


def count_layers(model: onnx.ModelProto) -> int:
    return len(layer_nodes(model))


def _light(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose large initializers are replaced by same-shape graph inputs.

    Keeps small integer initializers (Reshape shapes, Unsqueeze axes, ...) because shape
    inference needs their values.
    """
    m = onnx.ModelProto()
    m.ir_version = model.ir_version
    m.opset_import.extend(model.opset_import)
    g = m.graph
    g.name = model.graph.name
    g.node.extend(model.graph.node)
    g.input.extend(model.graph.input)
    g.output.extend(model.graph.output)
    existing = {i.name for i in model.graph.input}
    for t in model.graph.initializer:
        if t.data_type == onnx.TensorProto.FLOAT and int(np.prod(t.dims)) > 16:
            if t.name not in existing:
                g.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
        else:
            g.initializer.append(t)
    return m


def infer_shapes(model: onnx.ModelProto, batch: int = 1) -> dict[str, tuple[int, ...]]:
    m = _light(model)
    for vi in list(m.graph.input) + list(m.graph.output):
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_param"):
                d.Clear()
                d.dim_value = batch
    inferred = shape_inference.infer_shapes(m, strict_mode=True)
    shapes: dict[str, tuple[int, ...]] = {}
    for vi in (list(inferred.graph.value_info) + list(inferred.graph.input)
               + list(inferred.graph.output)):
        t = vi.type.tensor_type
        if t.HasField("shape"):
            shapes[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim)
    for t in model.graph.initializer:
        shapes[t.name] = tuple(t.dims)
    return shapes


def node_macs(node: onnx.NodeProto, shapes: dict[str, tuple[int, ...]]) -> int:
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "Conv":
        w = shapes[node.input[1]]
        y = shapes[node.output[0]]
        return int(np.prod(y)) * int(np.prod(w[1:]))  # N*OC*OH*OW * (IC/g)*KH*KW
    if node.op_type == "Gemm":
        a, b = shapes[node.input[0]], shapes[node.input[1]]
        m, k = (a[1], a[0]) if attrs.get("transA", 0) else (a[0], a[1])
        n = b[0] if attrs.get("transB", 0) else b[1]
        return int(m * n * k)
    if node.op_type == "MatMul":
        a, b = shapes[node.input[0]], shapes[node.input[1]]
        y = shapes[node.output[0]]
        k = a[-1]
        return int(np.prod(y)) * int(k)
    return 0


def count_macs(model: onnx.ModelProto, batch: int = 1) -> int:
    shapes = infer_shapes(model, batch)
    return sum(node_macs(n, shapes) for n in layer_nodes(model))


@dataclass
class Summary:
    layers: int
    macs: int
    ops: Counter = field(default_factory=Counter)

    def __str__(self) -> str:
        ops = ", ".join(f"{k}:{v}" for k, v in sorted(self.ops.items(), key=lambda kv: -kv[1]))
        return f"{self.layers} layers, {self.macs / 1e9:.4g} GMACs ({ops})"


def summarize(model: onnx.ModelProto, batch: int = 1) -> Summary:
    layers = layer_nodes(model)
    shapes = infer_shapes(model, batch)
    return Summary(
        layers=len(layers),
        macs=sum(node_macs(n, shapes) for n in layers),
        ops=Counter(n.op_type for n in layers),
    )
