"""Attention: the ONNX Attention op (opset 23), and the fused form of the attention patterns of
``benanza.fusion`` (MatMul → [scale] → [mask] → Softmax → MatMul, benchmarked on the scores'
MatMul: one cuDNN SDPA; on oneDNN a primitive chain in the matmul table)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from .base import (
    CudnnLowering,
    CudnnTable,
    Dims,
    Family,
    NodeView,
    OnednnLowering,
    PatternLowering,
    const,
    present,
    required,
)
from .gemm import MatMulProblem
from .grammar import FLOAT_DTYPES, F, Problem, f32

# the cuDNN graph API's scaled dot-product attention (runtime_cpp/cudnn/graph.cpp)
CUDNN_SDPA = "cudnn_frontend.sdpa"

@dataclass(frozen=True)
class AttentionProblem(Problem):
    """The ONNX Attention op (opset 23) over 4-d Q [B, H, S, D], K [B, H, Skv, D] and V
    [B, H, Skv, Dv]: softmax(scale·Q·Kᵀ + mask)·V. ``mask``: the float attn_mask's shape (None:
    none); ``causal``: is_causal; ``scale`` None is ONNX's default 1/√D."""

    FAMILY: ClassVar[str] = "attention"
    KEY: ClassVar[tuple[tuple[F, ...], ...]] = (
        (F("q", "q", "dims"),), (F("k", "k", "dims"),), (F("v", "v", "dims"),), (F("mask", "mask", "dims", None),),
        (F("causal", "causal", "flag", False),), (F("scale", "scale", "float", None),))

    q: tuple[int, ...]
    k: tuple[int, ...]
    v: tuple[int, ...]
    mask: tuple[int, ...] | None = None
    causal: bool = False
    scale: float | None = None

    def macs(self) -> int:
        b, h, s, d = self.q
        return b * h * s * self.k[2] * (d + self.v[3])

    def flops(self) -> int:
        """The two GEMMs, and per score: the scale, the mask's add (a causal one too) and the
        softmax's 5."""
        b, h, s, _ = self.q
        per_score = 6 + (self.mask is not None or self.causal)
        return 2 * self.macs() + per_score * b * h * s * self.k[2]



def _attention_plain(view: NodeView) -> bool:
    """The form the runtime's chain runs: 4-d Q/K/V with as many K/V heads as Q's, no KV cache,
    no softcap or extra outputs, a float mask (or none) that broadcasts as one [S, Skv]."""
    a = view.attrs
    shapes = [view.inputs[i].shape if present(view, i) else () for i in range(3)]  # type: ignore[union-attr]
    if any(len(s) != 4 for s in shapes) or shapes[1][1] != shapes[0][1] or len(view.outputs) != 1:
        return False
    if any(present(view, i) for i in range(4, len(view.inputs))):
        return False
    if float(a.get("softcap", 0.0)) != 0.0 or int(a.get("qk_matmul_output_mode", 0)) != 0:
        return False
    if present(view, 3):
        mask = required(view, 3)
        lead = (1,) * (4 - len(mask.shape)) + tuple(mask.shape)
        return mask.dtype in FLOAT_DTYPES and lead[:2] == (1, 1)
    return True


def _attention_build(view: NodeView) -> Problem:
    q, k, v = (tuple(required(view, i).shape) for i in range(3))
    mask = tuple(required(view, 3).shape) if present(view, 3) else None
    scale = view.attrs.get("scale")
    return AttentionProblem(q, k, v, mask, bool(int(view.attrs.get("is_causal", 0))),
                            None if scale is None else f32(scale))


# --- lowerings -----------------------------------------------------------------------------

@dataclass(frozen=True)
class AttentionParams:
    """oneDNN AttentionParams (the chain: matmul with post-ops, softmax, matmul)."""

    q: Dims
    k: Dims
    v: Dims
    mask: Dims
    causal: bool
    scale: float


def _onednn_row(p: AttentionProblem, api: str) -> AttentionParams:
    scale = p.scale if p.scale is not None else 1.0 / math.sqrt(p.q[-1])
    return AttentionParams(q=p.q, k=p.k, v=p.v, mask=p.mask or (), causal=p.causal, scale=scale)


@dataclass(frozen=True)
class SdpaLayer:
    """cuDNN SdpaLayer (graph API flash attention)."""

    b: int
    h: int
    s_q: int
    s_kv: int
    d_qk: int
    d_v: int
    scale: float
    mask: bool
    causal: bool


def _cudnn_row(p: AttentionProblem, api: str) -> SdpaLayer:
    # 4-d [B, heads, S, D]
    scale = p.scale if p.scale is not None else 1 / math.sqrt(p.q[3])
    return SdpaLayer(b=p.q[0], h=p.q[1], s_q=p.q[2], s_kv=p.k[2], d_qk=p.q[3], d_v=p.v[3], scale=scale,
                     mask=p.mask is not None, causal=p.causal)


def _pattern_row(p: MatMulProblem, api: str) -> SdpaLayer:
    """An attention pattern from its scores' MatMul: Q [.., S, D] · Kᵀ [.., D, Skv]; the pattern's
    scale and mask are in the variant's call."""
    lead = p.a[:-2]
    b, h = (math.prod(lead[:-1]), lead[-1]) if lead else (1, 1)
    sq, d, skv = p.a[-2], p.a[-1], p.b[-1]
    return SdpaLayer(b=b, h=h, s_q=sq, s_kv=skv, d_qk=d, d_v=d, scale=1 / math.sqrt(d), mask=False, causal=False)


CUDNN_SDPA_TABLE = CudnnTable("sdpa", "add_sdpa", False, False)

# oneDNN's primitive chain (matmul with post-ops, softmax, matmul), the attention patterns' too
ATTENTION = Family("attention", AttentionProblem, ("Attention",), _attention_build, _attention_plain,
                   cudnn_api=const(CUDNN_SDPA), onednn_api=const("matmul_softmax_matmul"),
                   cudnn={CUDNN_SDPA: CudnnLowering(CUDNN_SDPA_TABLE, _cudnn_row)},
                   onednn=OnednnLowering("attention", False, _onednn_row))
FAMILIES = (ATTENTION,)

# the attention patterns' cuDNN call, by (scale, mask) (every scaled one, Q and Kᵀ prescaled
# included, is scaled by 1/√d in all)
_SDPA_CALLS = {(False, False): "kSdpaUnscaled", (False, True): "kSdpaUnscaledMasked",
               (True, False): "kCall", (True, True): "kSdpaMasked"}


def pattern_lowering(name: str, scale: bool, mask: bool) -> PatternLowering:
    """An attention pattern's fused form on cuDNN (on oneDNN it stays a matmul variant whose
    configuration runs the chain)."""
    return PatternLowering(name, cudnn=CudnnLowering(CUDNN_SDPA_TABLE, _pattern_row, _SDPA_CALLS[scale, mask]))
