"""Attention: the ONNX Attention op (opset 23), and the fused form of the attention patterns of
``benanza.fusion`` (MatMul → [scale] → [mask] → Softmax → MatMul, benchmarked on the scores'
MatMul: one cuDNN SDPA; on oneDNN a primitive chain in the matmul table)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from .base import (
    CudnnLowering,
    CudnnTable,
    Dims,
    Family,
    NodeFinder,
    NodeView,
    OnednnLowering,
    PatternLowering,
    const,
    present,
    required,
)
from .binary import BinaryProblem
from .gemm import MatMulProblem
from .grammar import FLOAT_DTYPES, F, Problem, f32
from .reference import Gen, NoReference, Site, Slot, Spec, fill, last_output
from .softmax import SoftmaxProblem

if TYPE_CHECKING:
    from ..fusion import FusionPattern
    from ..layers import Model, Node
    from ..records import Variant

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


def _reference(site: Site, v: Variant, gen: Gen) -> Spec:
    """Q, Kᵀ (K's last two dims swapped, read through strides), the mask, V. A causal op is run
    as one more additive [S, Skv] mask: the reference is the op with is_causal 0 and that mask."""
    import numpy as np

    p = v.problem
    assert isinstance(p, AttentionProblem)
    kt = p.k[:-2] + (p.k[-1], p.k[-2])
    feeds = {(0, 0): gen(0, p.q), (0, 1): np.ascontiguousarray(np.swapaxes(gen(1, kt), -1, -2))}
    masked = p.mask is not None or p.causal
    extra: dict[int, tuple[str, ...]] = {}
    attrs: dict[int, dict[str, Any]] = {}
    note = ""
    if masked:
        shape = p.mask if p.mask is not None else (p.q[2], p.k[2])
        mask = gen(2, shape)
        if p.mask is None:
            if len(site.proto(0).input) != 3:
                raise NoReference("a causal Attention with optional inputs after V")
            extra[0] = ("__mask",)
            feeds[(0, 3)] = mask
        else:
            feeds[(0, 3)] = mask.reshape(site.in_shape(0, 3))
        if p.causal:
            attrs[0] = {"is_causal": 0}
            note = (" with its causal mask as the benchmark runs it: one more additive [S, Skv] mask "
                    "(generated), so the reference is Attention(is_causal=0, attn_mask=that mask)")
    feeds[(0, 2)] = gen(3 if masked else 2, p.v)
    return Spec(site.nodes, feeds, (site.proto(0).output[0],), note, attrs=attrs, extra_inputs=extra)


def _qk_slot(site: Site, i: int) -> Slot:
    """The slot of the tensor the pattern's Mul scales into input ``i`` of the scores' MatMul."""
    anchor = site.proto(0)
    pos = next(j for j in range(1, len(site.nodes)) if site.proto(j).output[0] == anchor.input[i])
    want = site.in_shape(0, i)
    return pos, next(k for k, name in enumerate(site.proto(pos).input) if site.shape(name) == want)


def pattern_reference(site: Site, v: Variant, gen: Gen, pattern: FusionPattern) -> Spec:
    """Q and Kᵀ: the scores' MatMul inputs, or where the pattern scales them first, the scaling
    Muls' data inputs (the model's own two scales then make the chain's one); the mask; V."""
    p = v.problem
    assert isinstance(p, MatMulProblem)
    last = len(site.nodes) - 1
    feeds = fill(site, gen, [_qk_slot(site, i) if pattern.prescaled else (0, i) for i in (0, 1)])
    k = 2
    if pattern.mask:
        add = 1 + pattern.tail.index("Add")
        scores = next(o for q in range(add) for o in site.proto(q).output if o in site.proto(add).input)
        mask_slot = (add, site.external(add, scores))
        feeds[mask_slot] = gen(k, p.a[-2:-1] + p.b[-1:]).reshape(site.in_shape(*mask_slot))
        k += 1
    feeds[(last, 1)] = gen(k, site.in_shape(last, 1))
    return Spec(site.nodes, feeds, last_output(site))

# oneDNN's primitive chain (matmul with post-ops, softmax, matmul), the attention patterns' too
ATTENTION = Family("attention", AttentionProblem, ("Attention",), _attention_build, _attention_plain,
                   cudnn_api=const(CUDNN_SDPA), onednn_api=const("matmul_softmax_matmul"),
                   cudnn={CUDNN_SDPA: CudnnLowering(CUDNN_SDPA_TABLE, _cudnn_row)},
                   onednn=OnednnLowering("attention", False, _onednn_row, reference=_reference))
FAMILIES = (ATTENTION,)

# the attention patterns' cuDNN call, by (scale, mask) (every scaled one, Q and Kᵀ prescaled
# included, is scaled by 1/√d in all)
_SDPA_CALLS = {(False, False): "kSdpaUnscaled", (False, True): "kSdpaUnscaledMasked",
               (True, False): "kCall", (True, True): "kSdpaMasked"}


def pattern_lowering(name: str, scale: bool, mask: bool) -> PatternLowering:
    """An attention pattern's fused form on cuDNN (on oneDNN it stays a matmul variant whose
    configuration runs the chain)."""
    return PatternLowering(name, cudnn=CudnnLowering(CUDNN_SDPA_TABLE, _pattern_row, _SDPA_CALLS[scale, mask]))


# --- fusion: the nodes of attention from its scores' MatMul in a model -----------------------

def attention_nodes(scaled: bool, masked: bool, prescaled: bool) -> NodeFinder:
    """The node finder of an attention pattern (``benanza.fusion``'s ``sdpa*``): with a scale
    after the scores' MatMul, a mask, or Q and Kᵀ scaled before it."""

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
        if prescaled:
            found = _operand_scales(model, consumers, first)
            if found is None:
                return None
            prescales = found
        elif scaled:
            nxt = only(chain[-1], ("Mul", "Div"))
            p = nodes[nxt].layer.problem if nxt is not None else None
            if nxt is None or not isinstance(p, BinaryProblem) or not nodes[nxt].constant_inputs \
                    or p.out != scores or min(math.prod(s) for s in p.shapes) != 1:
                return None
            chain.append(nxt)
        if masked:
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
