"""ONNX Runtime's graph fusions: which of a model's nodes each fused ORT op computes.

Two readers share it. The profile matcher (``analysis.matching``) walks from the node a fused op
is named after (or, for an op ORT names by its type alone, from each candidate node) to the nodes
the op replaced (``COVERS``). The generator predicts the same groups from the model alone
(``match_ort_fusions``), so the ``onnxruntime`` backend benchmarks each fused op ORT will run as
a fusion variant whose nodes are exactly the ones a profile's op maps back to: SkipLayerNorm,
FusedMatMul, Gemm from a MatMul and its bias, a Split from Gathers, BiasGelu, FastGelu with its
bias. Those variants are the framework's own fusions, benchmarked by its backend alone
(``FusionPattern.framework``); the library patterns of ``benanza.fusion`` stay every backend's.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from functools import cached_property

from .fusion import BY_NAME as LIBRARY_PATTERNS
from .fusion import NODE_FINDERS, FusionMatch, FusionPattern, match_fusions
from .layers import Model, Node
from .problems import BinaryProblem, CopyProblem, TransposeProblem

FRAMEWORK = "onnxruntime"


class NodeGraph:
    """The model's nodes by the tensors they read and write, and the decompositions ORT fuses,
    found once."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.producer = {t: n for n in model.nodes for t in n.outputs}
        self.readers: defaultdict[str, list[Node]] = defaultdict(list)
        for n in model.nodes:
            for t in n.inputs:
                self.readers[t].append(n)

    @cached_property
    def decompositions(self) -> dict[str, list[tuple[int, ...]]]:
        consumers = self.model.consumers()
        out: dict[str, list[tuple[int, ...]]] = {"layernorm": [], "gelu": [], "fastgelu": []}
        for n in self.model.nodes:
            for kind, pattern in (("layernorm", "layernorm"), ("gelu", "gelu_erf"), ("fastgelu", "gelu_tanh")):
                find = NODE_FINDERS[pattern]
                nodes = find(self.model, consumers, n.index) if n.layer.op == LIBRARY_PATTERNS[pattern].anchor else None
                if nodes:
                    out[kind].append(tuple(sorted(nodes)))
        return out

    def only_read_by(self, node: Node, group: set[int]) -> bool:
        """Whether every reader of ``node``'s outputs is in ``group`` (so fusing it loses nothing);
        a Shape reads no data, and with static shapes ORT folds it away."""
        return all(r.index in group or r.layer.op == "Shape" for t in node.outputs for r in self.readers[t])




def _scalar_operand(graph: NodeGraph, node: Node) -> bool:
    """A Mul/Div by one value (a constant, or a scalar ORT folds from static shapes)."""
    p = node.layer.problem
    if not isinstance(p, BinaryProblem) or p.alg not in ("mul", "div") or len(node.layer.inputs) != 2:
        return False
    return any(math.prod(s.shape) == 1 for s in node.layer.inputs)


def _matmul_transpose(node: Node) -> str | None:
    """How FusedMatMul runs a Transpose through its attributes: "trans" for the last two axes
    swapped (transA/transB), "batch" for the first axis moved before the last (transBatch),
    "both"; None when it cannot."""
    p = node.layer.problem
    if not isinstance(p, TransposeProblem) or len(p.perm) < 2:
        return None
    n = len(p.perm)
    if n == 2:
        return "trans" if p.perm == (1, 0) else None
    middle = tuple(range(1, n - 1))
    kinds = {tuple(range(n - 2)) + (n - 1, n - 2): "trans", middle + (0, n - 1): "batch", middle + (n - 1, 0): "both"}
    return kinds.get(p.perm)


def _gemm_cover(graph: NodeGraph, anchor: Node) -> tuple[int, ...] | None:
    """MatMulAddFusion: a MatMul and the Add of a constant bias that alone reads it."""
    if anchor.layer.op != "MatMul":
        return None
    readers = [r for t in anchor.outputs for r in graph.readers[t]]
    if len(readers) == 1 and readers[0].layer.op == "Add" and readers[0].constant_inputs:
        return tuple(sorted((anchor.index, readers[0].index)))
    return (anchor.index,)


def _fused_matmul_cover(graph: NodeGraph, anchor: Node) -> tuple[int, ...] | None:
    """MatMulScaleFusion / MatmulTransposeFusion: a MatMul with the scalar scaling of an input
    or of its output and the Transposes of each input it runs through its attributes (views
    between them are free), each read by the fused op alone."""
    if anchor.layer.op != "MatMul":
        return None
    group = {anchor.index}
    for t in anchor.inputs:
        used: set[str] = set()  # each attribute absorbs one Transpose per input
        p = graph.producer.get(t)
        while p is not None and p.index not in group and graph.only_read_by(p, group):
            kind = _matmul_transpose(p)
            parts = {"trans", "batch"} if kind == "both" else {kind} if kind else set()
            if parts and not parts & used:
                used |= parts
            elif not (p.layer.view or _scalar_operand(graph, p)):
                break
            group.add(p.index)
            p = next((graph.producer[i] for i in p.inputs if i in graph.producer
                      and math.prod(graph.producer[i].layer.outputs[0].shape) > 1), None)
    readers = [r for t in anchor.outputs for r in graph.readers[t]]
    if len(readers) == 1 and _scalar_operand(graph, readers[0]):
        group.add(readers[0].index)
    # views at the edge of the walk are not part of what ORT fused
    while True:
        edge = [i for i in group if graph.model.nodes[i].layer.view
                and not any(graph.producer.get(t) and graph.producer[t].index in group
                            for t in graph.model.nodes[i].inputs)]
        if not edge:
            return tuple(sorted(group))
        group -= set(edge)


def _containing(graph: NodeGraph, kind: str, anchor: Node, op: str) -> tuple[int, ...] | None:
    if anchor.layer.op == op:
        return (anchor.index,)
    return next((d for d in graph.decompositions[kind] if anchor.index in d), None)


def _layernorm_cover(graph: NodeGraph, anchor: Node) -> tuple[int, ...] | None:
    """LayerNormFusion: the ReduceMean…Add decomposition (or an opset-17 LayerNormalization)."""
    return _containing(graph, "layernorm", anchor, "LayerNormalization")


def _gelu_cover(graph: NodeGraph, anchor: Node) -> tuple[int, ...] | None:
    """GeluFusion: the erf decomposition Div→Erf→Add→Mul→Mul (or an opset-20 Gelu)."""
    return _containing(graph, "gelu", anchor, "Gelu")


def _entry(graph: NodeGraph, nodes: tuple[int, ...]) -> list[Node]:
    """Producers of the tensors a node group reads from outside itself."""
    inside = set(nodes)
    out = []
    for i in nodes:
        for t in graph.model.nodes[i].inputs:
            p = graph.producer.get(t)
            if p is not None and p.index not in inside and p not in out:
                out.append(p)
    return out


def _bias_add(graph: NodeGraph, node: Node, group: set[int]) -> bool:
    return node.layer.op == "Add" and bool(node.constant_inputs) and len(node.inputs) == 1 \
        and graph.only_read_by(node, group)


def _bias_gelu_cover(graph: NodeGraph, anchor: Node) -> tuple[int, ...] | None:
    """BiasGeluFusion: the Add of a constant bias and the GELU that alone reads it."""
    gelu = _gelu_cover(graph, anchor)
    biased = _with_bias(graph, gelu) if gelu is not None else None
    return biased if biased != gelu else None


def _with_bias(graph: NodeGraph, nodes: tuple[int, ...]) -> tuple[int, ...]:
    """A group and the one constant-bias Add before it that only the group reads, if there is one."""
    bias = [p for p in _entry(graph, nodes) if _bias_add(graph, p, set(nodes))]
    return tuple(sorted(nodes + (bias[0].index,))) if len(bias) == 1 else nodes


def _skip_layernorm_cover(graph: NodeGraph, anchor: Node) -> tuple[int, ...] | None:
    """SkipLayerNormFusion: the residual Add of two activations feeding a layer norm, and the
    constant-bias Add of one of them, each read by the fused op alone (the sum itself may be
    read elsewhere: SkipLayerNormalization can output it)."""
    norm = _layernorm_cover(graph, anchor)
    if norm is None:
        return None
    residual = [p for p in _entry(graph, norm) if p.layer.op == "Add" and len(p.inputs) == 2]
    if len(residual) != 1:
        return None
    group = set(norm) | {residual[0].index}
    for p in _entry(graph, (residual[0].index,)):
        if _bias_add(graph, p, group):
            group.add(p.index)
            break
    return tuple(sorted(group))


def _split_cover(graph: NodeGraph, anchor: Node) -> tuple[int, ...] | None:
    """GatherSliceToSplitFusion: the Gathers/Slices of one tensor that a Split replaced."""
    if anchor.layer.op not in ("Gather", "Slice") or not anchor.inputs:
        return None
    return tuple(sorted(r.index for r in graph.readers[anchor.inputs[0]] if r.layer.op in ("Gather", "Slice")))


def _fast_gelu_cover(graph: NodeGraph, anchor: Node) -> tuple[int, ...] | None:
    """FastGeluFusion: the tanh GELU decomposition (the ``gelu_tanh`` pattern's nodes, in any of
    the exporters' orders), and the constant-bias Add before x (FastGelu with a bias input) when
    only the group reads it."""
    gelu = _containing(graph, "fastgelu", anchor, "FastGelu")
    return _with_bias(graph, gelu) if gelu is not None else None


def _attention_cover(graph: NodeGraph, anchor: Node) -> tuple[int, ...] | None:
    """AttentionFusion (Attention, MultiHeadAttention): softmax(Q·Kᵀ [scaled] [+ mask])·V from its
    Softmax, with what makes Q, K and V of the projections (the MatMul with a constant weight,
    its bias Add, the Reshapes and Transposes that split the heads, a scalar scale) and the
    Transpose (and Reshape) that merge the heads after it; each read by the group alone. A
    MultiHeadAttention leaves the projection MatMuls to their own named ops, which claim them
    first."""
    if anchor.layer.op != "Softmax" or len(anchor.inputs) != 1:
        return None
    group = {anchor.index}
    scores = graph.producer.get(anchor.inputs[0])
    while scores is not None and scores.layer.op in ("Add", "Mul", "Div", "Where"):
        group.add(scores.index)  # the scale and the mask
        scores = next((graph.producer[t] for t in scores.inputs if t in graph.producer
                       and reaches(graph.producer[t], "MatMul", graph.producer, 2)), None)
    readers = graph.readers[anchor.outputs[0]]
    if scores is None or scores.layer.op != "MatMul" or len(readers) != 1 or readers[0].layer.op != "MatMul":
        return None
    pv = readers[0]
    group |= {scores.index, pv.index}
    for t in scores.inputs + tuple(t for t in pv.inputs if t != anchor.outputs[0]):
        p = graph.producer.get(t)
        while p is not None and p.index not in group and graph.only_read_by(p, group):
            if p.layer.op == "MatMul":
                if p.constant_inputs:
                    group.add(p.index)  # the projection: where Q, K or V begin
                break
            if not (p.layer.view or p.layer.op == "Transpose" or _scalar_operand(graph, p)
                    or (p.layer.op == "Add" and p.constant_inputs and len(p.inputs) == 1)):
                break
            group.add(p.index)
            p = graph.producer.get(p.inputs[0]) if p.inputs else None
    node = pv
    while True:
        after = [r for t in node.outputs for r in graph.readers[t]]
        if len(after) != 1 or not (after[0].layer.view or after[0].layer.op == "Transpose"):
            break
        node = after[0]
        group.add(node.index)
    return tuple(sorted(group))


COVERS: dict[str, Callable[[NodeGraph, Node], tuple[int, ...] | None]] = {
    "Gemm": _gemm_cover, "FusedMatMul": _fused_matmul_cover, "LayerNormalization": _layernorm_cover,
    "SkipLayerNormalization": _skip_layernorm_cover, "Gelu": _gelu_cover, "BiasGelu": _bias_gelu_cover,
    "Split": _split_cover, "FastGelu": _fast_gelu_cover, "Attention": _attention_cover,
    "MultiHeadAttention": _attention_cover,
}
# the ops ORT names by type alone (or after a node the optimizer renamed), and the node types a
# walk to their pattern may start from
CANDIDATES = {"Gemm": ("MatMul",), "FusedMatMul": ("MatMul",),
               "LayerNormalization": ("LayerNormalization", "ReduceMean"),
               "SkipLayerNormalization": ("LayerNormalization", "ReduceMean"),
               "Gelu": ("Gelu", "Div"), "BiasGelu": ("Gelu", "Div"), "FastGelu": ("Tanh",),
               "Attention": ("Softmax",), "MultiHeadAttention": ("Softmax",)}


def reaches(node: Node, op: str, producer: dict[str, Node], depth: int = 6) -> bool:
    if node.layer.op == op:
        return True
    if depth == 0:
        return False
    return any(reaches(producer[t], op, producer, depth - 1) for t in node.inputs if t in producer)


def _split_group(graph: NodeGraph, anchor: Node) -> tuple[int, ...] | None:
    """What GatherSliceToSplitFusion turns into one Split, predicted from the model: the Gathers
    of one tensor by constant scalar indices that take each index of their axis once (the
    profile's Split names one of them; ``_split_cover`` then takes every Gather of the tensor)."""
    nodes = [n for n in graph.readers[anchor.inputs[0]] if n.layer.op == "Gather"] if anchor.inputs else []
    problems = [n.layer.problem for n in nodes]
    boxes = [p for p in problems if isinstance(p, CopyProblem) and p.how == "region" and len(p.outs) == 1
             and p.src is not None and p.src == getattr(problems[0], "src", None)]
    if len(nodes) < 2 or len(boxes) != len(nodes):
        return None
    src = boxes[0].src or ()
    starts = [p.offsets[0] for p in boxes]
    axes = {i for s in starts for i, x in enumerate(s) if x != starts[0][i]}
    if len(axes) != 1:
        return None
    (axis,) = axes
    whole = all(p.outs[0] == tuple(1 if i == axis else d for i, d in enumerate(src)) for p in boxes)
    if not whole or sorted(s[axis] for s in starts) != list(range(src[axis])):
        return None
    return tuple(sorted(n.index for n in nodes))


def _skip_layernorm_group(graph: NodeGraph, anchor: Node) -> tuple[int, ...] | None:
    """What SkipLayerNormFusion makes one op, predicted from the model: its cover where the
    residual Add's two inputs are 3-D of one shape and the layer norm alone reads the sum (the
    profile's op may output the sum too, the transformer optimizer's form; the session's own
    fusion requires one reader: a pre-norm block's residual, read again by the next Add, stays
    unfused)."""
    nodes = COVERS["SkipLayerNormalization"](graph, anchor)
    residual = [graph.model.nodes[i] for i in nodes or () if graph.model.nodes[i].layer.op == "Add"
                and len(graph.model.nodes[i].inputs) == 2]
    if nodes is None or len(residual) != 1:
        return None
    shapes = {s.shape for s in residual[0].layer.inputs}
    one = len(shapes) == 1 and len(next(iter(shapes))) == 3 and graph.only_read_by(residual[0], set(nodes))
    return nodes if one else None


# --- ORT's NCHWc convolutions: BatchNormalization folded in, an activation, a residual Add ------

# what ORT's NCHWc transform fuses into a convolution after an Add it took as the conv's sum input
SUM_ACTIVATIONS = ("Relu", "Sigmoid", "Tanh")
# what its NCHWc transform runs in the blocked layout, so an Add of two of them stays blocked
_BLOCKED = frozenset({"Conv", "BatchNormalization", "Add", "MaxPool", "AveragePool", "Concat", *SUM_ACTIVATIONS})


def conv_chain(graph: NodeGraph, conv: Node) -> list[Node]:
    """A Conv and the BatchNormalization that alone reads it (ORT folds it into the weights)."""
    chain = [conv]
    readers = [r for t in conv.outputs for r in graph.readers[t]]
    if len(readers) == 1 and readers[0].layer.op == "BatchNormalization":
        chain.append(readers[0])
    return chain


def takes_sum(graph: NodeGraph, last: Node, add: Node) -> bool:
    """Whether ORT's NCHWc convolution ending in ``last`` takes ``add`` as its sum input: the Add
    alone reads it, and no activation is fused into it yet (``TransformBinary``)."""
    readers = [r for t in last.outputs for r in graph.readers[t]]
    return readers == [add] and last.layer.op not in SUM_ACTIVATIONS


def sum_tail(graph: NodeGraph, add: Node) -> list[Node]:
    """The Add a convolution took as its sum, and the activation that alone reads the sum (fused
    after it, ``TransformActivation``)."""
    readers = [r for t in add.outputs for r in graph.readers[t]]
    act = readers[0] if len(readers) == 1 and readers[0].layer.op in SUM_ACTIVATIONS else None
    return [add] if act is None else [add, act]


def _conv_group(graph: NodeGraph, conv: Node) -> tuple[int, ...] | None:
    """What ORT runs as one convolution, predicted from the model: the Conv, the BatchNormalization
    it folds, and either the activation after them (FusedConv) or, for a 2-D f32 convolution its
    NCHWc transform takes, a residual Add of two blocked tensors whose first eligible operand it is
    (the Add's inputs are tried in order) with the activation after the sum."""
    chain = conv_chain(graph, conv)
    last = chain[-1]
    readers = [r for t in last.outputs for r in graph.readers[t]]
    if len(readers) == 1 and readers[0].layer.op in SUM_ACTIVATIONS:
        return tuple(n.index for n in (*chain, readers[0]))
    add = readers[0] if len(readers) == 1 and readers[0].layer.op == "Add" else None
    blocked = conv.layer.dtype == "f32" and len(conv.layer.inputs[0].shape) == 4
    if add is None or not blocked or len(add.inputs) != 2 or len({s.shape for s in add.layer.inputs}) != 1:
        return tuple(n.index for n in chain)
    producers = [graph.producer.get(t) for t in add.inputs]
    if any(p is None or p.layer.op not in _BLOCKED for p in producers):
        return tuple(n.index for n in chain)
    for p in producers:  # ORT's order: the first operand a convolution can take
        source = graph.producer.get(p.inputs[0]) if p is not None and p.inputs else None
        ends_conv = p is not None and (p.layer.op == "Conv" or (
            source is not None and source.layer.op == "Conv" and conv_chain(graph, source)[-1] is p))
        if p is not None and ends_conv and takes_sum(graph, p, add):
            if p is last:
                return tuple(n.index for n in (*chain, *sum_tail(graph, add)))
            break
    return tuple(n.index for n in chain)


def _cover(op: str) -> Callable[[NodeGraph, Node], tuple[int, ...] | None]:
    predicted = {"Split": _split_group, "SkipLayerNormalization": _skip_layernorm_group, "Conv": _conv_group}
    return predicted.get(op) or COVERS[op]


def _pattern(name: str, op: str, tail: tuple[str, ...], note: str, anchor: str) -> FusionPattern:
    return FusionPattern(name, tail, False, "identity", f"ONNX Runtime's {op}: {note}", anchor=anchor,
                         framework=FRAMEWORK)


# ORT's convolution by what it runs besides the Conv: a folded BatchNormalization, a residual Add
# as its sum input, an activation; each shape a name of its own, as the library's patterns (a
# variant is one subgraph per layer and name). Those a library pattern names exactly (Conv→BN→Relu
# without a bias: bn_relu) are never matched as ORT's.
CONV_PATTERNS = {
    (bn, add, act): _pattern(f"ort_conv{'_bn' * bn}{'_sum' * add}{'_act' * act}", "Conv",
                             ("BatchNormalization",) * bn + ("Add",) * add + ("Relu",) * act,
                             "a Conv" + " with the BatchNormalization it folds" * bn
                             + ", a residual Add of two blocked tensors as its sum input (NCHWc)" * add
                             + ", the activation after them" * act, "Conv")
    for bn in (False, True) for add in (False, True) for act in (False, True) if bn or add or act}


# the convolutions that take a residual Add as their sum input
SUM_PATTERNS = frozenset(p.name for (_, add, _), p in CONV_PATTERNS.items() if add)


def _conv_pattern(model: Model, nodes: tuple[int, ...]) -> FusionPattern:
    ops = {model.nodes[i].layer.op for i in nodes}
    return CONV_PATTERNS["BatchNormalization" in ops, "Add" in ops, bool(ops & set(SUM_ACTIVATIONS))]


# (pattern, the ORT op it predicts), in the order a node is tried: a MatMul with its bias Add is
# a Gemm before its inputs' Transposes make it a FusedMatMul. The LayerNormalization and Gelu ORT
# makes of a decomposition are the library's ``layernorm`` and ``gelu_erf`` patterns already.
PREDICTED: tuple[tuple[FusionPattern, str], ...] = (
    (_pattern("ort_gemm", "Gemm", ("Add",), "MatMul→Add(bias) where no library pattern runs exactly "
              "those two (a ReLU after them stays a node of its own)", "MatMul"), "Gemm"),
    (_pattern("ort_fused_matmul", "FusedMatMul", ("Transpose", "Mul"), "a MatMul with the Transposes of "
              "its inputs it runs through its attributes and the scaling by one value of an input or "
              "its output", "MatMul"), "FusedMatMul"),
    (_pattern("ort_skip_layernorm", "SkipLayerNormalization", ("Add", "LayerNormalization"),
              "the residual Add of two activations and the layer norm of the sum (with the bias Add "
              "of one of them that no Gemm took)", "LayerNormalization"), "SkipLayerNormalization"),
    (_pattern("ort_bias_gelu", "BiasGelu", ("Add", "Gelu"), "the Add of a constant bias and the "
              "GELU (erf) of the sum", "Gelu"), "BiasGelu"),
    (_pattern("ort_fast_gelu", "FastGelu", ("Add", "Tanh"), "the Add of a constant bias and the "
              "tanh GELU decomposition of the sum", "Tanh"), "FastGelu"),
    (CONV_PATTERNS[True, True, True], "Conv"),
    (_pattern("ort_split", "Split", ("Gather",), "the Gathers of one tensor by constant indices "
              "that take each index of an axis once, as one Split", "Gather"), "Split"),
)
PATTERNS = tuple(p for p, op in PREDICTED if op != "Conv") + tuple(CONV_PATTERNS.values())
BY_NAME = {p.name: p for p in PATTERNS}


def match_ort_fusions(model: Model, library: list[FusionMatch]) -> list[FusionMatch]:
    """The fused ops ORT's CPU provider will run for ``model``, predicted as the profile matcher
    maps them back (the same covers, nodes tried in the model's order, a node another fused op
    took not taken again), where such an op groups nodes no ``library`` match groups exactly: a
    match each, its anchor the node it was found from."""
    graph = NodeGraph(model)
    same = {tuple(sorted(m.nodes)) for m in library}
    claimed: set[int] = set()
    out = []
    for seed in model.nodes:
        if seed.index in claimed:
            continue
        for pattern, op in PREDICTED:
            if seed.layer.op != pattern.anchor and seed.layer.op not in CANDIDATES.get(op, ()):
                continue
            nodes = tuple(i for i in _cover(op)(graph, seed) or () if i not in claimed)
            if seed.index not in nodes or len(nodes) < 2:
                continue
            claimed.update(nodes)
            if tuple(sorted(nodes)) not in same:
                named = _conv_pattern(model, nodes) if op == "Conv" else pattern
                out.append(FusionMatch(named, (seed.index, *(i for i in nodes if i != seed.index)), seed.layer))
            break
    return out


def all_fusions(model: Model) -> list[FusionMatch]:
    """The library patterns' matches and, beside them (they may share nodes), ORT's own."""
    library = match_fusions(model)
    return library + match_ort_fusions(model, library)


def benchmarked_by(pattern: str, backend: str) -> bool:
    """Whether ``backend`` benchmarks the fusion ``pattern``: a library pattern every backend, a
    framework's own fusion only that framework's."""
    own = BY_NAME.get(pattern)
    return own is None or own.framework == backend
