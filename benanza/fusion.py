"""Layer-fusion patterns: one registry used by every backend generator and the analyzer.

A pattern is an anchor layer (a Conv, or a MatMul that is one GEMM) followed by a chain of
single-consumer layers that a fused library call runs at once (cuDNN's
ConvolutionBiasActivationForward, oneDNN post-ops and matmul bias). Adding a pattern is one
entry in ``PATTERNS``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .layers import Layer, Model, Node
from .ops.binary import BinaryProblem
from .ops.conv import ConvProblem
from .ops.gemm import MatMulProblem, gemm_epilogue
from .ops.quantized import DequantProblem, QMatMulProblem, QuantProblem, int_gemm_epilogue
from .ops.reduce import ReduceProblem
from .ops.softmax import SoftmaxProblem


@dataclass(frozen=True)
class FusionPattern:
    name: str  # the Variant.fusion tag
    tail: tuple[str, ...]  # op types after the anchor, in order
    conv_bias: bool  # whether the Conv itself has a bias input (False for a MatMul anchor)
    activation: str  # "relu" | "gelu" (erf) | "identity": the fused call's activation
    note: str
    anchor: str = "Conv"
    # The tail is not a chain of single consumers but a decomposition's DAG, matched by the
    # pattern's function in NODE_FINDERS.
    dag: bool = False
    # Attention from its scores' MatMul: one primitive chain, with the scale (Mul or Div by a
    # constant) and the mask Add as the scores' post-ops where the pattern has them.
    attention: bool = False
    scale: bool = False
    mask: bool = False
    # the scale applied before the scores' MatMul, to Q and to Kᵀ each (both exporters multiply
    # each by the square root of 1/√d): the two Muls are part of the pattern, the chain scales once
    prescaled: bool = False
    # what the tail must compute, beyond its op types, for the fused call to run it: the anchor
    # family's rule, given the anchor, the tail's nodes and the activation; None: the op types
    # alone decide
    epilogue: Callable[[Node, Sequence[Node], str], bool] | None = None

    @property
    def length(self) -> int:
        return 1 + len(self.tail)

    @property
    def adds_bias(self) -> bool:
        """Whether the fused call adds a bias: the conv's own, a BatchNorm folded into one, or a
        MatMul's bias Add."""
        return self.conv_bias or "BatchNormalization" in self.tail or "Add" in self.tail


# Longest first: matching is greedy.
PATTERNS: tuple[FusionPattern, ...] = (
    FusionPattern("bn_relu", ("BatchNormalization", "Relu"), False, "relu",
                  "Conv→BatchNorm→Relu, BN folded into the conv bias (what inference frameworks do)"),
    FusionPattern("bias_relu", ("Relu",), True, "relu", "Conv→Bias→Activation (paper §III-B4)"),
    FusionPattern("bn", ("BatchNormalization",), False, "identity",
                  "Conv→BatchNorm, BN folded into the conv bias"),
    FusionPattern("relu", ("Relu",), False, "relu", "Conv→Relu through the fused call with zero bias"),
    FusionPattern("bias", (), True, "identity",
                  "Conv→Bias through the fused call with the identity activation (paper §III-B4)"),
    FusionPattern("mm_bias_gelu", ("Add", "Gelu"), False, "gelu",
                  "MatMul→Add(bias)→Gelu: one GEMM with a bias and a GELU epilogue (a transformer MLP)",
                  anchor="MatMul", epilogue=gemm_epilogue),
    FusionPattern("mm_bias_relu", ("Add", "Relu"), False, "relu",
                  "MatMul→Add(bias)→Relu: one GEMM with a bias and a ReLU epilogue (a ReLU MLP's first Linear)",
                  anchor="MatMul", epilogue=gemm_epilogue),
    FusionPattern("mm_bias", ("Add",), False, "identity", "MatMul→Add(bias): one GEMM with a bias (a Linear)",
                  anchor="MatMul", epilogue=gemm_epilogue),
    FusionPattern("mmint_scale_bias", ("Cast", "Mul", "Add"), False,
                  "identity", "MatMulInteger→Cast(float)→Mul(scale)→Add(bias), ONNX Runtime's dynamic quantization: "
                  "one int8 GEMM with a float result, its scale and bias (ORT's MatMulIntegerToFloat)",
                  anchor="MatMulInteger", scale=True, epilogue=int_gemm_epilogue),
    FusionPattern("mmint_scale", ("Cast", "Mul"), False, "identity",
                  "MatMulInteger→Cast(float)→Mul(scale): one int8 GEMM with a float result and its scale",
                  anchor="MatMulInteger", scale=True, epilogue=int_gemm_epilogue),
    FusionPattern("qdq_matmul", ("DequantizeLinear", "QuantizeLinear"), False, "identity",
                  "DequantizeLinear(u8)→MatMul(·, dequantized s8 weights)→QuantizeLinear(u8), ONNX Runtime's QDQ "
                  "format: one int8 GEMM requantized into u8 (what ONNX Runtime runs as QLinearMatMul)",
                  anchor="MatMul", dag=True),
    FusionPattern("layernorm", ("Sub", "Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul", "Add"), False,
                  "identity", "the LayerNorm decomposition of opsets < 17: one layer normalization",
                  anchor="ReduceMean", dag=True),
    FusionPattern("rmsnorm", ("Pow", "Add", "Sqrt", "Reciprocal", "Mul", "Mul"), False, "identity",
                  "the RMSNorm decomposition of Llama-style exports (x → Pow(2) → ReduceMean → +ε → Sqrt → "
                  "Reciprocal or Div(1, ·) → Mul(x) → Mul(scale), or Div(x, ·) → Mul(scale)): one RMS normalization",
                  anchor="ReduceMean", dag=True),
    FusionPattern("gelu_erf", ("Erf", "Add", "Mul", "Mul"), False, "gelu",
                  "the erf GELU decomposition of opsets < 20 (x/√2 → Erf → +1 → ·x → ·½): one GELU", anchor="Div",
                  dag=True),
)


def _attention(scale: bool, mask: bool, prescaled: bool = False) -> FusionPattern:
    name = "sdpa" + "_qk" * prescaled + "_scale" * (scale or prescaled) + "_mask" * mask
    tail = ("Mul", "Mul") * prescaled + ("Mul",) * scale + ("Add",) * mask + ("Softmax", "MatMul")
    steps = "→".join(("MatMul",) + ("Mul|Div(scale)",) * scale + ("Add(mask)",) * mask + ("Softmax", "MatMul"))
    if prescaled:
        steps = f"Mul(Q, scale)·Mul(Kᵀ, scale)→{steps}"
    return FusionPattern(name, tail, False, "identity",
                         f"attention {steps}: one oneDNN chain (scores' matmul with post-ops, softmax, matmul)",
                         anchor="MatMul", dag=True, attention=True, scale=scale or prescaled, mask=mask,
                         prescaled=prescaled)


# the longest first: Q and K scaled before the MatMul, then a scale after it, then neither
PATTERNS += tuple(_attention(False, mask, True) for mask in (True, False))
PATTERNS += tuple(_attention(scale, mask) for scale, mask in ((True, True), (True, False), (False, True),
                                                               (False, False)))

BY_NAME = {p.name: p for p in PATTERNS}

# A DAG pattern's node finder: (model, consumers, anchor index) → the pattern's nodes, the anchor
# first, or None. The profile matcher (analysis/matching.py) finds fused framework ops with them.
NodeFinder = Callable[[Model, dict[int, list[int]], int], "list[int] | None"]


@dataclass(frozen=True)
class FusionMatch:
    pattern: FusionPattern
    nodes: tuple[int, ...]  # model node indices, the anchor first
    conv: Layer  # the anchor layer (Conv or MatMul) whose problem the fused variant is benchmarked on

    @property
    def conv_key(self) -> str:
        return self.conv.key


def match_fusions(model: Model) -> list[FusionMatch]:
    """Non-overlapping pattern matches in topological order (greedy, longest pattern first)."""
    consumers = model.consumers()
    used: set[int] = set()
    matches: list[FusionMatch] = []
    for node in model.nodes:
        anchor = node.layer.problem
        if node.index in used or not isinstance(anchor, (ConvProblem, MatMulProblem, ReduceProblem, BinaryProblem,
                                                          QMatMulProblem)):
            continue
        # a GEMM epilogue fuses into a plain GEMM; a batched MatMul only anchors attention
        plain = not isinstance(anchor, MatMulProblem) or (len(anchor.a) == 2 and len(anchor.b) == 2)
        has_bias = isinstance(anchor, ConvProblem) and anchor.bias
        for pattern in PATTERNS:
            if pattern.anchor != node.layer.op or pattern.conv_bias != has_bias or plain == pattern.attention:
                continue
            if pattern.dag:
                nodes = NODE_FINDERS[pattern.name](model, consumers, node.index)
                if nodes is not None and not used & set(nodes):
                    used.update(nodes)
                    matches.append(FusionMatch(pattern, tuple(nodes), node.layer))
                    break
                continue
            chain = [node.index]
            ok = True
            for op in pattern.tail:
                nxt = consumers[chain[-1]]
                if len(nxt) != 1 or model.nodes[nxt[0]].layer.op != op or nxt[0] in used:
                    ok = False
                    break
                chain.append(nxt[0])
            if ok and pattern.epilogue is not None:
                ok = pattern.epilogue(node, [model.nodes[i] for i in chain[1:]], pattern.activation)
            if ok:
                used.update(chain)
                matches.append(FusionMatch(pattern, tuple(chain), node.layer))
                break
    return matches


def layernorm_nodes(model: Model, consumers: dict[int, list[int]], start: int) -> list[int] | None:
    """The nodes of x → ReduceMean → Sub(x, mean) → Pow(·, 2) → ReduceMean → Add(eps) → Sqrt →
    Div(Sub, ·) → Mul(scale) → Add(bias) from its first ReduceMean (over x's trailing axes), or
    None. Every intermediate is read only inside the pattern."""
    nodes = model.nodes
    first = nodes[start]
    mean = first.layer.problem
    if not isinstance(mean, ReduceProblem) or mean.alg != "mean" or len(first.inputs) != 1:
        return None
    rank = len(mean.shape)
    if mean.axes != tuple(range(rank - len(mean.axes), rank)):
        return None  # a library's layer norm normalises trailing axes
    x = first.inputs[0]

    def only(i: int, op: str) -> int | None:
        nxt = consumers[i]
        return nxt[0] if len(nxt) == 1 and nodes[nxt[0]].layer.op == op else None

    sub = only(start, "Sub")
    if sub is None or nodes[sub].inputs != (x, first.outputs[0]):
        return None
    pair = sorted(consumers[sub], key=lambda i: nodes[i].layer.op)
    if [nodes[i].layer.op for i in pair] != ["Div", "Pow"]:
        return None
    div, pow_ = pair
    power = nodes[pow_].layer.problem
    if not isinstance(power, BinaryProblem) or power.exponent != 2.0:
        return None
    second = only(pow_, "ReduceMean")
    var = nodes[second].layer.problem if second is not None else None
    if second is None or not isinstance(var, ReduceProblem) or var.axes != mean.axes:
        return None
    eps = only(second, "Add")
    sqrt = only(eps, "Sqrt") if eps is not None and nodes[eps].constant_inputs else None
    if sqrt is None or consumers[sqrt] != [div] or nodes[div].inputs != (nodes[sub].outputs[0], nodes[sqrt].outputs[0]):
        return None
    scale = only(div, "Mul")
    shift = only(scale, "Add") if scale is not None and nodes[scale].constant_inputs else None
    if eps is None or scale is None or shift is None or not nodes[shift].constant_inputs:
        return None
    return sorted([start, sub, pow_, second, eps, sqrt, div, scale, shift])


def rmsnorm_nodes(model: Model, consumers: dict[int, list[int]], start: int) -> list[int] | None:
    """The nodes of x → Pow(x, 2) → ReduceMean (over trailing axes) → Add(ε) → Sqrt → then
    Reciprocal or Div(1, ·) → Mul(x, ·), or Div(x, ·) → Mul(scale), from its ReduceMean (the
    anchor, first; the Pow that feeds it next), or None. A Cast to the type it already has
    between the last two Muls (TorchScript writes Hugging Face's ``.to(dtype)``) is part of it.
    Every intermediate is read only inside the pattern."""
    nodes, producer = model.nodes, model.producer
    mean = nodes[start].layer.problem
    if not isinstance(mean, ReduceProblem) or mean.alg != "mean" or len(nodes[start].inputs) != 1:
        return None
    rank = len(mean.shape)
    if mean.axes != tuple(range(rank - len(mean.axes), rank)):
        return None
    pow_ = producer.get(nodes[start].inputs[0])
    power = nodes[pow_].layer.problem if pow_ is not None else None
    if pow_ is None or not isinstance(power, BinaryProblem) or power.alg != "pow" or power.exponent != 2.0 \
            or consumers[pow_] != [start] or len(nodes[pow_].inputs) != 1:
        return None
    x = nodes[pow_].inputs[0]

    def only(i: int | None, ops: tuple[str, ...]) -> int | None:
        if i is None:
            return None
        nxt = consumers[i]
        return nxt[0] if len(nxt) == 1 and nodes[nxt[0]].layer.op in ops else None

    eps = only(start, ("Add",))
    sqrt = only(eps, ("Sqrt",)) if eps is not None and nodes[eps].constant_inputs else None
    inv = only(sqrt, ("Reciprocal", "Div"))
    if eps is None or sqrt is None or inv is None:
        return None
    chain = [start, pow_, eps, sqrt, inv]
    div = nodes[inv]
    last: int | None = inv
    if not (div.layer.op == "Div" and div.inputs == (x, nodes[sqrt].outputs[0])):  # not Div(x, rms)
        if div.layer.op == "Div" and (div.inputs != (nodes[sqrt].outputs[0],) or not div.constant_inputs):
            return None  # neither Div(1, rms), the reciprocal
        last = only(inv, ("Mul",))
        if last is None or set(nodes[last].inputs) != {x, div.outputs[0]}:
            return None
        chain.append(last)
    cast = only(last, ("Cast",))
    if cast is not None and nodes[cast].layer.free:
        chain.append(cast)
        last = cast
    scale = only(last, ("Mul",))
    if scale is None or not nodes[scale].constant_inputs:
        return None
    return chain + [scale]


def qdq_matmul_nodes(model: Model, consumers: dict[int, list[int]], start: int) -> list[int] | None:
    """The nodes of DequantizeLinear(u8 x) → MatMul(·, W) → QuantizeLinear(u8) from the MatMul
    (first, then the two), where W is the dequantization of constant s8 weights without a zero
    point (folded: computed once, at load time) and every scale is per tensor; or None. The
    MatMul's result is read only by the QuantizeLinear."""
    nodes, producer = model.nodes, model.producer
    mm = nodes[start]
    if not isinstance(mm.layer.problem, MatMulProblem) or len(mm.inputs) != 2:
        return None
    x, w = (producer.get(t) for t in mm.inputs)
    if x is None or w is None or consumers[start] == [] or len(consumers[start]) != 1:
        return None
    q = consumers[start][0]
    quant = nodes[q].layer.problem
    dqx, dqw = nodes[x].layer.problem, nodes[w].layer.problem
    if not (isinstance(dqx, DequantProblem) and isinstance(dqw, DequantProblem) and isinstance(quant, QuantProblem)):
        return None
    if not nodes[w].folded or nodes[x].folded or consumers[x] != [start]:
        return None
    if (dqx.qtype, dqx.axis, dqw.qtype, dqw.axis, dqw.zp, quant.qtype, quant.axis) != \
            ("byte", None, "sbyte", None, False, "byte", None):
        return None
    return [start, x, q]


def gelu_nodes(model: Model, consumers: dict[int, list[int]], start: int) -> list[int] | None:
    """The nodes of x → Div(x, c) → Erf → Add(·, c) → Mul(x, ·) → Mul(·, c) from its Div (the
    constants are √2, 1 and ½ in every exporter that writes this form; the dynamo exporter
    multiplies by ½ before x), or None."""
    nodes = model.nodes
    div = nodes[start]
    if not isinstance(div.layer.problem, BinaryProblem) or div.layer.problem.alg != "div" \
            or len(div.inputs) != 1 or not div.constant_inputs:
        return None
    x = div.inputs[0]

    def only(i: int | None, op: str, constant: bool | None) -> int | None:
        if i is None:
            return None
        nxt = consumers[i]
        if len(nxt) != 1 or nodes[nxt[0]].layer.op != op:
            return None
        return nxt[0] if constant in (None, bool(nodes[nxt[0]].constant_inputs)) else None

    erf = only(start, "Erf", False)
    plus = only(erf, "Add", True)
    first = only(plus, "Mul", None)
    if erf is None or plus is None or first is None:
        return None
    half_first = bool(nodes[first].constant_inputs)
    second = only(first, "Mul", not half_first)
    if second is None:
        return None
    # x times what reaches it: Erf(x/√2) + 1, or its half
    times_x, reaching = (second, first) if half_first else (first, plus)
    if set(nodes[times_x].inputs) != {x, nodes[reaching].outputs[0]}:
        return None
    return [start, erf, plus, first, second]


def _attention_nodes(pattern: FusionPattern) -> NodeFinder:
    def match(model: Model, consumers: dict[int, list[int]], start: int) -> list[int] | None:
        """The nodes of scores = MatMul(Q, Kᵀ) [→ Mul|Div(constant scalar)] [→ Add(mask [S, Skv])]
        → Softmax(last axis) → MatMul(·, V) with V's head size Q's, every intermediate read only
        by the next, and where the pattern is prescaled the Muls scaling Q and Kᵀ; or None."""
        nodes = model.nodes
        first = nodes[start]
        qk = first.layer.problem
        if not isinstance(qk, MatMulProblem) or len(first.inputs) != 2 or not first.layer.outputs:
            return None
        scores = first.layer.outputs[0].shape
        rank = len(scores)
        if rank < 3 or len(qk.a) != rank:
            return None

        def only(i: int, ops: tuple[str, ...]) -> int | None:
            nxt = consumers[i]
            return nxt[0] if len(nxt) == 1 and nodes[nxt[0]].layer.op in ops else None

        chain = [start]
        prescales: list[int] = []
        if pattern.prescaled:
            found = _operand_scales(model, consumers, first)
            if found is None:
                return None
            prescales = found
        elif pattern.scale:
            nxt = only(chain[-1], ("Mul", "Div"))
            p = nodes[nxt].layer.problem if nxt is not None else None
            if nxt is None or not isinstance(p, BinaryProblem) or not nodes[nxt].constant_inputs \
                    or p.out != scores or min(math.prod(s) for s in p.shapes) != 1:
                return None
            chain.append(nxt)
        if pattern.mask:
            nxt = only(chain[-1], ("Add",))
            p = nodes[nxt].layer.problem if nxt is not None else None
            if nxt is None or not isinstance(p, BinaryProblem) or p.out != scores or len(p.shapes) != 2:
                return None
            mask = p.shapes[1] if tuple(p.shapes[0]) == scores else p.shapes[0]
            if (1,) * (rank - len(mask)) + tuple(mask) != (1,) * (rank - 2) + scores[-2:]:
                return None  # the chain adds one [S, Skv] mask to every batch and head
            chain.append(nxt)
        sm = only(chain[-1], ("Softmax",))
        soft = nodes[sm].layer.problem if sm is not None else None
        if sm is None or not isinstance(soft, SoftmaxProblem) or soft.axis != rank - 1 or soft.flat \
                or soft.alg != "softmax":
            return None
        pv = only(sm, ("MatMul",))
        if pv is None or nodes[pv].inputs[:1] != nodes[sm].outputs[:1] or len(nodes[pv].inputs) != 2:
            return None
        v = nodes[pv].layer.problem
        if not isinstance(v, MatMulProblem) or tuple(v.b) != scores[:-2] + (scores[-1], qk.k):
            return None
        return chain[:1] + prescales + chain[1:] + [sm, pv]  # the anchor first, as every match has it
    return match


def _operand_scales(model: Model, consumers: dict[int, list[int]], matmul: Node) -> list[int] | None:
    """The Muls by a constant scalar that produce both operands of ``matmul`` and feed nothing
    else, or None. The scalar is an initializer or a folded layer's output (TorchScript computes
    it from a Shape)."""
    nodes, producer = model.nodes, model.producer
    out = []
    for t in matmul.inputs:
        i = producer.get(t)
        mul = nodes[i] if i is not None else None
        if mul is None or mul.layer.op != "Mul" or consumers[mul.index] != [matmul.index]:
            return None
        p = mul.layer.problem
        if not isinstance(p, BinaryProblem) or len(p.shapes) != 2 or min(math.prod(s) for s in p.shapes) != 1:
            return None
        data = [x for x in mul.inputs if not (x in producer and nodes[producer[x]].folded)]
        # one data operand, scaled by the other (a scalar) into its own shape
        if len(data) != 1 or len(mul.inputs) + len(mul.constant_inputs) != 2 \
                or math.prod(p.out) != max(math.prod(s) for s in p.shapes):
            return None
        out.append(mul.index)
    return out


# the public face of the DAG patterns: name → node finder
NODE_FINDERS: dict[str, NodeFinder] = {"layernorm": layernorm_nodes, "gelu_erf": gelu_nodes,
                                       "rmsnorm": rmsnorm_nodes, "qdq_matmul": qdq_matmul_nodes}
NODE_FINDERS.update({p.name: _attention_nodes(p) for p in PATTERNS if p.attention})
