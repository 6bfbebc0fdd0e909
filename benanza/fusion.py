"""Layer-fusion patterns: one registry used by every backend generator and the analyzer.

A pattern is a Conv followed by a chain of single-consumer layers that a fused library call
runs at once (cuDNN's ConvolutionBiasActivationForward, oneDNN post-ops). Adding a pattern
is one entry in ``PATTERNS``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .layers import Layer, Model
from .problems import ConvProblem


@dataclass(frozen=True)
class FusionPattern:
    name: str  # the Variant.fusion tag
    tail: tuple[str, ...]  # op types after the Conv, in order
    conv_bias: bool  # whether the Conv itself has a bias input
    activation: str  # "relu" | "identity": the fused call's activation
    note: str

    @property
    def length(self) -> int:
        return 1 + len(self.tail)


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
)

BY_NAME = {p.name: p for p in PATTERNS}


@dataclass(frozen=True)
class FusionMatch:
    pattern: FusionPattern
    nodes: tuple[int, ...]  # model node indices, the Conv first
    conv: Layer  # the layer whose problem the fused variant is benchmarked on

    @property
    def conv_key(self) -> str:
        return self.conv.key


def match_fusions(model: Model) -> list[FusionMatch]:
    """Non-overlapping pattern matches in topological order (greedy, longest pattern first)."""
    consumers = model.consumers()
    used: set[int] = set()
    matches: list[FusionMatch] = []
    for node in model.nodes:
        conv = node.layer.problem
        if not isinstance(conv, ConvProblem) or node.index in used:
            continue
        has_bias = conv.bias
        for pattern in PATTERNS:
            if pattern.conv_bias != has_bias:
                continue
            chain = [node.index]
            ok = True
            for op in pattern.tail:
                nxt = consumers[chain[-1]]
                if len(nxt) != 1 or model.nodes[nxt[0]].layer.op != op or nxt[0] in used:
                    ok = False
                    break
                chain.append(nxt[0])
            if ok:
                used.update(chain)
                matches.append(FusionMatch(pattern, tuple(chain), node.layer))
                break
    return matches
