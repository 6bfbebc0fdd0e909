"""Attention: the ONNX Attention op (opset 23), and the fused form of the attention patterns of
``benanza.fusion`` (MatMul → [scale] → [mask] → Softmax → MatMul, benchmarked on the scores'
MatMul: one cuDNN SDPA; on oneDNN a primitive chain in the matmul table)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import NodeError
from .base import (
    ELEMENT_SIZE,
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
    from ..layers import Layer, Model, Node, TensorSpec
    from ..records import Variant

# the cuDNN graph API's scaled dot-product attention (runtime_cpp/cudnn/graph.cpp)
CUDNN_SDPA = "cudnn_frontend.sdpa"

@dataclass(frozen=True)
class AttentionProblem(Problem):
    """The ONNX Attention op (opset 23) over 4-d Q [B, H, S, D], K [B, Hkv, Skv, D] and V
    [B, Hkv, Skv, Dv]: softmax(scale·Q·Kᵀ + mask)·V, query head h reading KV head h // (H/Hkv)
    (grouped-query attention where Hkv < H: K's and V's dims in the key carry their head count).
    ``mask``: the float attn_mask's shape (None: none); ``causal``: is_causal; ``scale`` None is
    ONNX's default 1/√D."""

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

    @property
    def group(self) -> int:
        """Query heads per KV head (1: multi-head attention)."""
        return self.q[1] // self.k[1]

    def macs(self) -> int:
        """Every query head's scores and weighting of V, whichever KV head it shares."""
        b, h, s, d = self.q
        return b * h * s * self.k[2] * (d + self.v[3])

    def flops(self) -> int:
        """The two GEMMs, and per score: the scale, the mask's add (a causal one too) and the
        softmax's 5."""
        b, h, s, _ = self.q
        per_score = 6 + (self.mask is not None or self.causal)
        return 2 * self.macs() + per_score * b * h * s * self.k[2]



def _grouped_heads(q_heads: int, k_heads: int, v_heads: int) -> bool:
    """K and V with one head count that divides Q's (multi-head attention, or grouped-query)."""
    return k_heads == v_heads and k_heads > 0 and q_heads % k_heads == 0


def _attention_plain(view: NodeView) -> bool:
    """The form the runtime's chain runs: 4-d Q/K/V with K/V heads dividing Q's, no KV cache,
    no softcap or extra outputs, a float mask (or none) that broadcasts as one [S, Skv]."""
    a = view.attrs
    shapes = [view.inputs[i].shape if present(view, i) else () for i in range(3)]  # type: ignore[union-attr]
    if any(len(s) != 4 for s in shapes) or not _grouped_heads(shapes[0][1], shapes[1][1], shapes[2][1]) \
            or len(view.outputs) != 1:
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
    if view.op == "GroupQueryAttention":
        return _gqa_build(view)
    q, k, v = (tuple(required(view, i).shape) for i in range(3))
    mask = tuple(required(view, 3).shape) if present(view, 3) else None
    scale = view.attrs.get("scale")
    return AttentionProblem(q, k, v, mask, bool(int(view.attrs.get("is_causal", 0))),
                            None if scale is None else f32(scale))


def _gqa_plain(view: NodeView) -> bool:
    """ONNX Runtime's com.microsoft GroupQueryAttention in the form the chain runs: query, key
    and value apart ([B, S, heads·D], not packed), no rotation, softcap, local window, smooth
    softmax, attention bias, sinks, quantized cache or scores output (the inputs from the cos
    cache on absent)."""
    a = view.attrs
    if not all(present(view, i) for i in range(3)) or any(len(required(view, i).shape) != 3 for i in range(3)):
        return False
    if int(a.get("do_rotary", 0)) or float(a.get("softcap", 0.0)) or int(a.get("local_window_size", -1)) != -1 \
            or int(a.get("smooth_softmax", 0)) or int(a.get("qk_output", 0)):
        return False
    return not any(present(view, i) for i in range(7, len(view.inputs)))


def _gqa_build(view: NodeView) -> Problem:
    """Q [B, S, H·D] as [B, H, S, D]; K and V as [B, Hkv, T, D] over the T keys the op attends
    (total_sequence_length where it is a constant, else the past's length plus S: the present
    K/V it writes). The op's causal mask (its default) ends at the last key, where the ONNX
    Attention's and cuDNN's causal mask start at the first: the two agree when the queries are all
    the keys, one new token sees every key (no mask), and between the op's mask is an explicit
    [1, 1, S, T] one (a top-left causal mask would skip keys the op attends: a cuDNN time of it
    would undercount the op's work)."""
    heads, kv_heads = int(view.attrs.get("num_heads", 0)), int(view.attrs.get("kv_num_heads", 0))
    b, s, hidden = required(view, 0).shape
    if heads <= 0 or kv_heads <= 0 or hidden % heads or heads % kv_heads:
        raise NodeError(f"num_heads {heads} and kv_num_heads {kv_heads} do not divide the query's {hidden} features")
    d = hidden // heads
    if required(view, 1).shape[-1] != kv_heads * d or required(view, 2).shape[-1] != kv_heads * d:
        raise NodeError(f"key and value are not [B, S, kv_num_heads·{d}]")
    total = view.value(6) if present(view, 6) else None
    past = required(view, 3).shape[2] if present(view, 3) else 0
    keys = int(total.reshape(-1)[0]) if total is not None and total.size == 1 else past + s
    scale = float(view.attrs.get("scale", 0.0))
    causal = bool(int(view.attrs.get("causal", 1))) and s > 1
    mask = (1, 1, s, keys) if causal and s < keys else None
    return AttentionProblem((b, heads, s, d), (b, kv_heads, keys, d), (b, kv_heads, keys, d), mask,
                            causal and mask is None, f32(scale) if scale else None)


def _attention_when(view: NodeView) -> bool:
    return _gqa_plain(view) if view.op == "GroupQueryAttention" else _attention_plain(view)


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
    h_kv: int
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
    return SdpaLayer(b=p.q[0], h=p.q[1], h_kv=p.k[1], s_q=p.q[2], s_kv=p.k[2], d_qk=p.q[3], d_v=p.v[3],
                     scale=scale, mask=p.mask is not None, causal=p.causal)


def _pattern_row(p: MatMulProblem | AttentionProblem, api: str) -> SdpaLayer:
    """An attention pattern from its scores' MatMul: Q [.., S, D] · Kᵀ [.., D, Skv]; the pattern's
    scale and mask are in the variant's call. A pattern through repeat_kv is keyed as the
    attention it computes (``grouped_layer``), K and V with their own heads."""
    if isinstance(p, AttentionProblem):
        return _cudnn_row(p, api)
    lead = p.a[:-2]
    b, h = (math.prod(lead[:-1]), lead[-1]) if lead else (1, 1)
    sq, d, skv = p.a[-2], p.a[-1], p.b[-1]
    return SdpaLayer(b=b, h=h, h_kv=h, s_q=sq, s_kv=skv, d_qk=d, d_v=d, scale=1 / math.sqrt(d), mask=False,
                     causal=False)


CUDNN_SDPA_TABLE = CudnnTable("sdpa", "add_sdpa", False, False)


def _reference(site: Site, v: Variant, gen: Gen) -> Spec:
    """Q, Kᵀ (K's last two dims swapped, read through strides), the mask, V. A causal op is run
    as one more additive [S, Skv] mask: the reference is the op with is_causal 0 and that mask."""
    import numpy as np

    p = v.problem
    assert isinstance(p, AttentionProblem)
    if site.proto(0).op_type == "GroupQueryAttention":
        raise NoReference("ONNX Runtime's GroupQueryAttention masks causally from its seqlens_k and splits K/V "
                          "into past and new tokens; the benchmark adds a generated [S, Skv] mask, which the op "
                          "has no input for")
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


def _mask_slot(site: Site, pattern: FusionPattern) -> Slot:
    """The slot of the mask the pattern's Add adds to the scores."""
    add = 1 + pattern.tail.index("Add")
    scores = next(o for q in range(add) for o in site.proto(q).output if o in site.proto(add).input)
    return add, site.external(add, scores)


def pattern_reference(site: Site, v: Variant, gen: Gen, pattern: FusionPattern) -> Spec:
    """Q and Kᵀ: the scores' MatMul inputs, or where the pattern scales them first, the scaling
    Muls' data inputs (the model's own two scales then make the chain's one); the mask; V."""
    p = v.problem
    if isinstance(p, AttentionProblem):
        return _grouped_reference(site, p, gen, pattern)
    assert isinstance(p, MatMulProblem)
    last = len(site.nodes) - 1
    feeds = fill(site, gen, [_qk_slot(site, i) if pattern.prescaled else (0, i) for i in (0, 1)])
    k = 2
    if pattern.mask:
        mask_slot = _mask_slot(site, pattern)
        feeds[mask_slot] = gen(k, p.a[-2:-1] + p.b[-1:]).reshape(site.in_shape(*mask_slot))
        k += 1
    feeds[(last, 1)] = gen(k, site.in_shape(last, 1))
    return Spec(site.nodes, feeds, last_output(site))


def _grouped_reference(site: Site, p: AttentionProblem, gen: Gen, pattern: FusionPattern) -> Spec:
    """A pattern with fewer KV heads than query heads (``grouped_layer``): through repeat_kv, Q
    where the pattern reads it and K and V unrepeated, at their Unsqueezes (the match's K repeat
    comes first); folded, Q before its fold, K before its Transpose and V as the PV MatMul reads
    it (the benchmark's Q and output are the folded ones' memory). K's values as the benchmark's
    Kᵀ view holds them (as the op's reference); the mask; the PV MatMul's output."""
    import numpy as np

    ops = [site.proto(pos).op_type for pos in range(len(site.nodes))]
    pv = next(pos for pos in range(1, len(ops)) if ops[pos] == "MatMul")
    if "Unsqueeze" in ops:
        q = _qk_slot(site, 0) if pattern.prescaled else (0, 0)
        k, v = ((pos, 0) for pos in range(len(ops)) if ops[pos] == "Unsqueeze")
    else:
        q, k, v = (ops.index("Reshape"), 0), (ops.index("Transpose"), 0), (pv, 1)
    kt = p.k[:-2] + (p.k[-1], p.k[-2])
    feeds = {q: gen(0, site.in_shape(*q)), k: np.ascontiguousarray(np.swapaxes(gen(1, kt), -1, -2))}
    n = 2
    if p.mask is not None:
        slot = _mask_slot(site, pattern)
        feeds[slot] = gen(n, p.mask).reshape(site.in_shape(*slot))
        n += 1
    feeds[v] = gen(n, p.v)
    return Spec(site.nodes, feeds, (site.proto(pv).output[0],))

# oneDNN's primitive chain (matmul with post-ops, softmax, matmul), the attention patterns' too
ATTENTION = Family("attention", AttentionProblem, ("Attention", "GroupQueryAttention"), _attention_build,
                   _attention_when,
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
        mask: tuple[int, ...] = ()
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
            mask = tuple(p.shapes[1] if tuple(p.shapes[0]) == scores else p.shapes[0])
            chain.append(nxt)
        sm = only(chain[-1], ("Softmax",))
        soft = nodes[sm].layer.problem if sm is not None else None
        if sm is None or not isinstance(soft, SoftmaxProblem) or soft.axis != rank - 1 or soft.flat \
                or soft.alg != "softmax":
            return None
        # TorchScript casts the probabilities to the type they have (softmax(·, dtype=float32));
        # the exported SDPA guards them with Where(IsNaN(p), 0, p)
        cast = only(sm, ("Cast",))
        probs = [sm] + ([cast] if cast is not None and nodes[cast].layer.free else [])
        probs += _nan_guard(model, consumers, probs[-1])
        pv = only(probs[-1], ("MatMul",))
        if pv is None or nodes[pv].inputs[:1] != nodes[probs[-1]].outputs[:1] or len(nodes[pv].inputs) != 2:
            return None
        v = nodes[pv].layer.problem
        if not isinstance(v, MatMulProblem) or tuple(v.b) != scores[:-2] + (scores[-1], qk.k):
            return None
        found = chain[:1] + prescales + chain[1:] + probs + [pv]  # the anchor first, as every match has it
        # through repeat_kv, or Q's heads folded into rows, the pattern takes in the nodes that
        # regroup the heads (grouped_layer)
        grouped = grouped_operands(model, consumers, found, prescaled)
        if masked and not _mask_fits(mask, scores, grouped is not None and grouped.folded):
            return None
        return found + list(grouped.nodes if grouped is not None else ())
    return match


def _mask_fits(mask: tuple[int, ...], scores: tuple[int, ...], folded: bool) -> bool:
    """Whether the chain's one [S, Skv] mask, added to every batch and head, is the pattern's
    mask. Where Q's heads are folded into the rows (``_fold``) a row is a (query head, token)
    pair: only a mask broadcast over the rows ([1, Skv]) is the same for every head, so it is
    that mask of the attention the match computes; a mask per row would differ between a KV
    head's query heads, which the Attention problem's mask cannot say."""
    rows = 1 if folded else scores[-2]
    return (1,) * (len(scores) - len(mask)) + mask == (1,) * (len(scores) - 2) + (rows, scores[-1])


def _nan_guard(model: Model, consumers: dict[int, list[int]], probs: int) -> list[int]:
    """[IsNaN, Where] of ``Where(IsNaN(p), c, p)`` on node ``probs``'s output p, the guard both
    exporters write after SDPA's softmax (a fully masked row is NaN; the guard replaces it by a
    constant), read by nothing else; or []. A fused kernel meets no NaN row unless a row is
    masked whole, so the guard is part of the attention it runs."""
    nodes = model.nodes
    readers = consumers[probs]
    isnan = next((i for i in readers if nodes[i].layer.op == "IsNaN"), None)
    where = next((i for i in readers if nodes[i].layer.op == "Where"), None)
    if len(readers) != 2 or isnan is None or where is None or consumers[isnan] != [where]:
        return []
    guarded = nodes[where].inputs == (nodes[isnan].outputs[0], nodes[probs].outputs[0]) \
        and len(nodes[where].constant_inputs) == 1
    return [isnan, where] if guarded else []


def _data_input(model: Model, mul: Node) -> str:
    """The scaled operand of a prescaling Mul (``_operand_scales`` made sure it has one)."""
    return next(x for x in mul.inputs if not (x in model.producer and model.nodes[model.producer[x]].folded))


def _unrepeat(model: Model, consumers: dict[int, list[int]], tensor: str, reader: int, transposed: bool
              ) -> tuple[TensorSpec, list[int]] | None:
    """The K or V that transformers' ``repeat_kv`` (``x[:, :, None].expand(B, Hkv, G, Skv, D)
    .reshape(B, H, Skv, D)``) expanded into ``tensor`` (read by node ``reader``), walking back
    through Reshapes, K's one Transpose of the last two axes (``transposed``), the Expand of
    the group axis and its Unsqueeze, each read only by the next: (the unrepeated [B, Hkv, Skv,
    D] tensor's spec, those nodes), or None. The Reshapes keep the last two axes, so they only
    merge B, Hkv and G in order: query head h reads KV head h // G, as repeat_kv's copies do."""
    nodes, producer = model.nodes, model.producer
    walked: list[int] = []
    swaps = 0
    t = tensor
    while True:
        i = producer.get(t)
        if i is None or consumers[i] != [reader] or not nodes[i].inputs or not nodes[i].layer.outputs:
            return None
        layer = nodes[i].layer
        src, out = tuple(layer.inputs[0].shape), tuple(layer.outputs[0].shape)
        if layer.op == "Unsqueeze":
            expanded = tuple(nodes[walked[-1]].layer.outputs[0].shape) if walked else ()
            ok = (len(src) == 4 and swaps == transposed and out == (*src[:2], 1, *src[2:])
                  and nodes[walked[-1]].layer.op == "Expand" and len(expanded) == 5 and expanded[2] > 1
                  and expanded == (*src[:2], expanded[2], *src[2:]))
            return (layer.inputs[0], walked + [i]) if ok else None
        if layer.op == "Transpose":
            perm = tuple(getattr(layer.problem, "perm", ()))
            swaps += 1
            if len(perm) < 2 or perm != (*range(len(perm) - 2), len(perm) - 1, len(perm) - 2):
                return None
        elif layer.op != "Expand" and (layer.op != "Reshape" or len(src) < 2 or out[-2:] != src[-2:]):
            return None
        walked.append(i)
        reader, t = i, nodes[i].inputs[0]


def _fold(model: Model, consumers: dict[int, list[int]], tensor: str, reader: int
          ) -> tuple[TensorSpec, int] | None:
    """Q [B, H, S, D] that a Reshape read only by node ``reader`` folds into [B, Hkv, G·S, D],
    G = H/Hkv > 1 (transformers' ``pack_gqa`` of a one-token step, which the TorchScript
    exporter keeps): (Q's spec, the Reshape), or None. Row-major, row g·S + s of KV head j is
    query head j·G + g's token s: each KV head's rows are its G query heads, as repeat_kv's
    copies pair them (query head h reads KV head h // G)."""
    i = model.producer.get(tensor)
    node = model.nodes[i] if i is not None else None
    if node is None or node.layer.op != "Reshape" or consumers[node.index] != [reader] or not node.layer.outputs:
        return None
    src, out = tuple(node.layer.inputs[0].shape), tuple(node.layer.outputs[0].shape)
    if len(src) != 4 or len(out) != 4 or out[0] != src[0] or out[3] != src[3] or out[1] <= 0:
        return None
    heads, tokens = src[1], src[2]
    group = heads // out[1]
    fits = group > 1 and heads % out[1] == 0 and out[2] == group * tokens
    return (node.layer.inputs[0], node.index) if fits else None


def _transposed(model: Model, consumers: dict[int, list[int]], tensor: str, reader: int
                ) -> tuple[TensorSpec, int] | None:
    """K [.., Skv, D] under the Transpose of its last two axes that makes ``tensor`` (read only by
    node ``reader``): (K's spec, the Transpose), or None."""
    i = model.producer.get(tensor)
    node = model.nodes[i] if i is not None else None
    if node is None or node.layer.op != "Transpose" or consumers[node.index] != [reader]:
        return None
    perm = tuple(getattr(node.layer.problem, "perm", ()))
    if len(perm) < 2 or perm != (*range(len(perm) - 2), len(perm) - 1, len(perm) - 2):
        return None
    return node.layer.inputs[0], node.index


@dataclass(frozen=True)
class Grouped:
    """The operands of an attention match with fewer KV heads than query heads, as the
    Attention problem takes them: Q [B, H, S, D], K [B, Hkv, Skv, D], V [B, Hkv, Skv, Dv], and
    the nodes between them and the match's MatMuls that regroup the heads: repeat_kv's copies
    of K and V, or (``folded``) the Reshape folding Q's heads into rows and K's Transpose."""

    q: TensorSpec
    k: TensorSpec
    v: TensorSpec
    nodes: tuple[int, ...]
    folded: bool


def grouped_operands(model: Model, consumers: dict[int, list[int]], found: Sequence[int], prescaled: bool
                     ) -> Grouped | None:
    """The grouped operands of an attention match (``found``: its nodes, the anchor first and,
    where ``prescaled``, the Muls scaling Q and Kᵀ next), or None where K and V have Q's heads.
    Through repeat_kv Q is the scores' operand as it is; folded, Q is unfolded and K and V are
    read as they are (K through its Transpose), with the KV heads Q was folded to."""
    nodes = model.nodes
    anchor = nodes[found[0]]
    pv = next(nodes[i] for i in found[1:] if nodes[i].layer.op == "MatMul")
    q, k = ((_data_input(model, nodes[found[j]]), found[j]) if prescaled else (anchor.inputs[j - 1], found[0])
            for j in (1, 2))
    v = (pv.inputs[1], pv.index)
    kr = _unrepeat(model, consumers, *k, True)
    vr = _unrepeat(model, consumers, *v, False)
    if kr is not None and vr is not None and kr[0].shape[1] == vr[0].shape[1]:
        return Grouped(anchor.layer.inputs[0], kr[0], vr[0], tuple(kr[1] + vr[1]), False)
    fold, kt = _fold(model, consumers, *q), _transposed(model, consumers, *k)
    if fold is None or kt is None or len(pv.layer.inputs) != 2:
        return None
    v_spec = pv.layer.inputs[1]
    heads = anchor.layer.outputs[0].shape[1]
    if len(kt[0].shape) != 4 or len(v_spec.shape) != 4 or kt[0].shape[1] != heads or v_spec.shape[1] != heads:
        return None
    return Grouped(fold[0], kt[0], v_spec, (fold[1], kt[1]), True)


def grouped_layer(model: Model, nodes: Sequence[int], pattern: FusionPattern) -> Layer | None:
    """The attention an ``sdpa*`` match computes where its K and V have fewer heads than Q
    (through repeat_kv, or with Q's heads folded into rows): the ONNX Attention problem of Q and
    of K and V with their own heads (K/V read once per KV head, every query head's scores
    computed), the pattern's mask and scale (1/√D where it scales, as every attention pattern is
    taken to); None where K and V have Q's heads (the match stays keyed by its scores' MatMul)."""
    from ..layers import Layer, TensorSpec

    ns = model.nodes
    anchor = ns[nodes[0]]
    pv = next(ns[i] for i in nodes[1:] if ns[i].layer.op == "MatMul")
    found = grouped_operands(model, model.consumers(), nodes, pattern.prescaled)
    if found is None or len(found.q.shape) != 4:
        return None
    add = next((ns[i].layer for i in nodes if ns[i].layer.op == "Add"), None) if pattern.mask else None
    mask = None if add is None else next(s for s in add.inputs if s.shape != add.outputs[0].shape)
    problem = AttentionProblem(tuple(found.q.shape), tuple(found.k.shape), tuple(found.v.shape),
                               None if mask is None else tuple(mask.shape), scale=None if pattern.scale else 1.0)
    tensors = (found.q, found.k, found.v) + (() if mask is None else (mask,))
    # folded, the output's rows are Q's (head, token) pairs: the same memory as [B, H, S, Dv]
    outputs = (TensorSpec(problem.q[:3] + problem.v[3:], anchor.layer.dtype),) if found.folded else pv.layer.outputs[:1]
    return Layer("Attention", problem, anchor.layer.dtype, tensors, outputs, problem.macs(), problem.flops(),
                 sum(t.numel * ELEMENT_SIZE.get(t.dtype, 4) for t in tensors + outputs),
                 ATTENTION.cudnn_api(problem), ATTENTION.onednn_api(problem))


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
