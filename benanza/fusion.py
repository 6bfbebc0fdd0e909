"""Layer-fusion patterns: one registry used by every backend generator and the analyzer.

A pattern is an anchor layer (a Conv, or a MatMul that is one GEMM) followed by a chain of
single-consumer layers that a fused library call runs at once (cuDNN's
ConvolutionBiasActivationForward, oneDNN post-ops and matmul bias). Adding a pattern is one
entry in ``PATTERNS``; what its match needs beyond op types (a decomposition's node finder, the
rule an epilogue must satisfy) lives in the module of the op family the pattern fuses into
(``benanza.ops``), named by the entry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .layers import Layer, Model, Node
from .ops.attention import attention_nodes, grouped_layer
from .ops.attention import pattern_reference as attention_reference
from .ops.base import NodeFinder
from .ops.binary import BinaryProblem
from .ops.conv import ConvProblem
from .ops.conv import fused_reference as conv_reference
from .ops.eltwise import EltwiseProblem, gelu_nodes, gelu_reference, gelu_tanh_nodes, gelu_tanh_reference
from .ops.gemm import MatMulProblem, epilogue_reference, gemm_epilogue
from .ops.norm import layernorm_nodes, layernorm_reference, rmsnorm_nodes, rmsnorm_reference
from .ops.quantized import (
    QMatMulProblem,
    int_gemm_epilogue,
    int_gemm_reference,
    qdq_conv_nodes,
    qdq_conv_reference,
    qdq_fp8_matmul_nodes,
    qdq_matmul_nodes,
    qdq_matmul_reference,
)
from .ops.reduce import ReduceProblem
from .ops.reference import PatternReference
from .ops.rope import pattern_reference as rope_reference
from .ops.rope import rope_nodes


@dataclass(frozen=True)
class FusionPattern:
    name: str  # the Variant.fusion tag
    tail: tuple[str, ...]  # op types after the anchor, in order
    conv_bias: bool  # whether the Conv itself has a bias input (False for a MatMul anchor)
    activation: str  # "relu" | "gelu" (erf) | "identity": the fused call's activation
    note: str
    anchor: str = "Conv"
    # The tail is not a chain of single consumers but a decomposition's DAG, whose nodes this
    # function of the anchor family's module finds (the op types of ``tail`` only describe it).
    find: NodeFinder | None = None
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
    # how ``benanza check`` recomputes the fused benchmark from a match's nodes (which inputs
    # the runtime fills, in stream order): the anchor family's; None is a registry error
    # (tests/ops/test_registry.py)
    reference: PatternReference | None = None
    # the layer a match is benchmarked as where it is not its anchor's: given the model and the
    # match's nodes, that layer (an attention through repeat_kv: the attention with K/V's own
    # heads), or None for the anchor's
    fused_layer: Callable[[Model, Sequence[int], FusionPattern], Layer | None] | None = None
    # the Conv anchor's own bias, where it has one, is part of the fused call, with or without
    # one (a QDQ Conv's int32 bias, added to the int8 convolution's accumulator); ``conv_bias``
    # then does not decide the match
    any_bias: bool = False
    # the framework whose own graph optimizer makes this fusion (``benanza.ort_fusions``): only that
    # framework's backend benchmarks it; "" for a library pattern, which every backend benchmarks
    framework: str = ""

    @property
    def dag(self) -> bool:
        return self.find is not None

    @property
    def length(self) -> int:
        return 1 + len(self.tail)

    @property
    def adds_bias(self) -> bool:
        """Whether the fused call adds a bias: the conv's own, a BatchNorm folded into one, or a
        MatMul's bias Add."""
        return self.conv_bias or "BatchNormalization" in self.tail or "Add" in self.tail

    def bias_of(self, problem: object) -> bool:
        """Whether the fused call on ``problem`` (the anchor's) adds a bias: ``adds_bias``, or the
        Conv's own where the pattern takes it as it is (``any_bias``)."""
        return self.adds_bias or (self.any_bias and isinstance(problem, ConvProblem) and problem.bias)


# Longest first: matching is greedy.
PATTERNS: tuple[FusionPattern, ...] = (
    # before the float Conv patterns: the "bias" pattern (a Conv with its bias) would take the
    # QDQ Conv whose bias is the dequantized int32 one. ORT's QDQ quantizer folds a Conv's Relu
    # into the output's quantization range (it writes no Relu), so there is no Relu to match.
    FusionPattern("qdq_conv", ("DequantizeLinear", "QuantizeLinear"), False, "identity",
                  "DequantizeLinear(u8)→Conv(·, dequantized s8 weights, per-tensor scale[, dequantized int32 bias])"
                  "→QuantizeLinear(u8), ONNX Runtime's QDQ format: one int8 convolution requantized into u8 (what "
                  "ONNX Runtime runs as QLinearConv)",
                  find=qdq_conv_nodes(False), reference=qdq_conv_reference, any_bias=True),
    FusionPattern("qdq_conv_per_channel", ("DequantizeLinear", "QuantizeLinear"), False, "identity",
                  "qdq_conv with the weights' scales per output channel (quantize_static(per_channel=True)): one "
                  "int8 convolution requantized with a scale per output channel",
                  find=qdq_conv_nodes(True), reference=qdq_conv_reference, any_bias=True),
    FusionPattern("bn_relu", ("BatchNormalization", "Relu"), False, "relu",
                  "Conv→BatchNorm→Relu, BN folded into the conv bias (what inference frameworks do)",
                  reference=conv_reference),
    FusionPattern("bias_relu", ("Relu",), True, "relu", "Conv→Bias→Activation (paper §III-B4)",
                  reference=conv_reference),
    FusionPattern("bn", ("BatchNormalization",), False, "identity",
                  "Conv→BatchNorm, BN folded into the conv bias", reference=conv_reference),
    FusionPattern("relu", ("Relu",), False, "relu", "Conv→Relu through the fused call with zero bias",
                  reference=conv_reference),
    FusionPattern("bias", (), True, "identity",
                  "Conv→Bias through the fused call with the identity activation (paper §III-B4)",
                  reference=conv_reference),
    FusionPattern("mm_bias_gelu", ("Add", "Gelu"), False, "gelu",
                  "MatMul→Add(bias)→Gelu: one GEMM with a bias and a GELU epilogue (a transformer MLP)",
                  anchor="MatMul", epilogue=gemm_epilogue, reference=epilogue_reference),
    FusionPattern("mm_bias_relu", ("Add", "Relu"), False, "relu",
                  "MatMul→Add(bias)→Relu: one GEMM with a bias and a ReLU epilogue (a ReLU MLP's first Linear)",
                  anchor="MatMul", epilogue=gemm_epilogue, reference=epilogue_reference),
    FusionPattern("mm_bias", ("Add",), False, "identity", "MatMul→Add(bias): one GEMM with a bias (a Linear)",
                  anchor="MatMul", epilogue=gemm_epilogue, reference=epilogue_reference),
    FusionPattern("mmint_scale_bias", ("Cast", "Mul", "Add"), False,
                  "identity", "MatMulInteger→Cast(float)→Mul(scale)→Add(bias), ONNX Runtime's dynamic quantization: "
                  "one int8 GEMM with a float result, its scale and bias (ORT's MatMulIntegerToFloat)",
                  anchor="MatMulInteger", scale=True, epilogue=int_gemm_epilogue,
                  reference=int_gemm_reference),
    FusionPattern("mmint_scale", ("Cast", "Mul"), False, "identity",
                  "MatMulInteger→Cast(float)→Mul(scale): one int8 GEMM with a float result and its scale",
                  anchor="MatMulInteger", scale=True, epilogue=int_gemm_epilogue,
                  reference=int_gemm_reference),
    FusionPattern("qdq_matmul", ("DequantizeLinear", "QuantizeLinear"), False, "identity",
                  "DequantizeLinear(u8)→MatMul(·, dequantized s8 weights)→QuantizeLinear(u8), ONNX Runtime's QDQ "
                  "format: one int8 GEMM requantized into u8 (what ONNX Runtime runs as QLinearMatMul)",
                  anchor="MatMul", find=qdq_matmul_nodes, reference=qdq_matmul_reference),
    # no reference: `check` compares oneDNN's benchmarks, and oneDNN has no fused form of it
    FusionPattern("qdq_fp8_matmul", ("DequantizeLinear", "QuantizeLinear"), False, "identity",
                  "DequantizeLinear(float8 e4m3)→MatMul(·, dequantized float8 weights)→QuantizeLinear(float8 "
                  "e4m3), ONNX Runtime's QDQ format with QFLOAT8E4M3FN types: one FP8 GEMM with per-tensor scales "
                  "(cuBLASLt's, on sm_89 and later)", anchor="MatMul", find=qdq_fp8_matmul_nodes),
    FusionPattern("layernorm", ("Sub", "Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul", "Add"), False,
                  "identity", "the LayerNorm decomposition of opsets < 17: one layer normalization",
                  anchor="ReduceMean", find=layernorm_nodes, reference=layernorm_reference),
    FusionPattern("rmsnorm", ("Pow", "Add", "Sqrt", "Reciprocal", "Mul", "Mul"), False, "identity",
                  "the RMSNorm decomposition of Llama-style exports (x → Pow(2) → ReduceMean → +ε → Sqrt → "
                  "Reciprocal or Div(1, ·) → Mul(x) → Mul(scale), or Div(x, ·) → Mul(scale)): one RMS normalization",
                  anchor="ReduceMean", find=rmsnorm_nodes, reference=rmsnorm_reference),
    FusionPattern("gelu_erf", ("Erf", "Add", "Mul", "Mul"), False, "gelu",
                  "the erf GELU decomposition of opsets < 20 (x/√2 → Erf → +1 → ·x → ·½): one GELU", anchor="Div",
                  find=gelu_nodes, reference=gelu_reference),
    # anchored on its Tanh: the nodes before it (x³, …) come first in topological order, in any
    # of the exporters' orders, and no pattern anchors on them
    FusionPattern("gelu_tanh", ("Pow", "Mul", "Add", "Mul", "Add", "Mul", "Mul"), False, "identity",
                  "the tanh GELU decomposition (x³ as Pow(x, 3) or x·x·x → ·0.044715 → +x → ·√(2/π) → Tanh → +1 "
                  "→ ·x and ·½ in either order): one tanh-approximation GELU (ONNX Runtime's FastGelu)",
                  anchor="Tanh", find=gelu_tanh_nodes, reference=gelu_tanh_reference),
    # anchored on its Mul by sin: the Slices, Neg and Concat before it are no pattern's anchor, and
    # the Mul by cos, the same problem, finds no Concat among its inputs
    FusionPattern("rope", ("Slice", "Slice", "Neg", "Concat", "Mul", "Add"), False, "identity",
                  "the rotate-half rotary embedding of Llama/Qwen2/Phi exports (x·cos + Concat(−x[½:], x[:½])·sin "
                  "over the last axis): one RoPE", anchor="Mul", find=rope_nodes, reference=rope_reference),
)


def _attention(scale: bool, mask: bool, prescaled: bool = False) -> FusionPattern:
    name = "sdpa" + "_qk" * prescaled + "_scale" * (scale or prescaled) + "_mask" * mask
    tail = ("Mul", "Mul") * prescaled + ("Mul",) * scale + ("Add",) * mask + ("Softmax", "MatMul")
    steps = "→".join(("MatMul",) + ("Mul|Div(scale)",) * scale + ("Add(mask)",) * mask + ("Softmax", "MatMul"))
    if prescaled:
        steps = f"Mul(Q, scale)·Mul(Kᵀ, scale)→{steps}"
    return FusionPattern(name, tail, False, "identity",
                         f"attention {steps}: one oneDNN chain (scores' matmul with post-ops, softmax, matmul)",
                         anchor="MatMul", find=attention_nodes(scale or prescaled, mask, prescaled),
                         attention=True, scale=scale or prescaled, mask=mask, prescaled=prescaled,
                         reference=attention_reference, fused_layer=grouped_layer)


# the longest first: Q and K scaled before the MatMul, then a scale after it, then neither
PATTERNS += tuple(_attention(False, mask, True) for mask in (True, False))
PATTERNS += tuple(_attention(scale, mask) for scale, mask in ((True, True), (True, False), (False, True),
                                                               (False, False)))

BY_NAME = {p.name: p for p in PATTERNS}

# the public face of the DAG patterns: name → node finder. The profile matcher
# (analysis/matching.py) finds fused framework ops with them.
NODE_FINDERS: dict[str, NodeFinder] = {p.name: p.find for p in PATTERNS if p.find is not None}


@dataclass(frozen=True)
class FusionMatch:
    pattern: FusionPattern
    nodes: tuple[int, ...]  # model node indices, the anchor first
    # the layer whose problem the fused variant is benchmarked on: the anchor's (Conv, MatMul, …),
    # or the pattern's ``fused_layer``, which no node of the model is (build_manifest lists it)
    conv: Layer

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
                                                          QMatMulProblem, EltwiseProblem)):
            continue
        # a GEMM epilogue fuses into a plain GEMM; a batched MatMul only anchors attention
        plain = not isinstance(anchor, MatMulProblem) or (len(anchor.a) == 2 and len(anchor.b) == 2)
        has_bias = isinstance(anchor, ConvProblem) and anchor.bias
        for pattern in PATTERNS:
            if pattern.anchor != node.layer.op or (pattern.conv_bias != has_bias and not pattern.any_bias) \
                    or plain == pattern.attention:
                continue
            if pattern.find is not None:
                nodes = pattern.find(model, consumers, node.index)
                if nodes is not None and not used & set(nodes):
                    used.update(nodes)
                    fused = pattern.fused_layer(model, nodes, pattern) if pattern.fused_layer is not None else None
                    matches.append(FusionMatch(pattern, tuple(nodes), fused or node.layer))
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
