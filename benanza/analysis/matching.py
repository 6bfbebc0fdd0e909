"""Match what a profile recorded back to the model's layers, so analyses speak in layer names.

* Framework ops (ORT nodes, torch ops) → groups of model nodes. A framework may rename a
  fused node after the tensor it produces (ORT: ``r1_nchwc`` for Conv+Relu writing ``r1``);
  the group is then the chain from that tensor's producer back to a node of the framework
  op's type. Ops matching no node are insertions (ORT's ReorderInput/ReorderOutput).
* Library calls → conv / GEMM nodes by shape signature, in model order, pass after pass
  (a log holds every iteration).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from ..layers import Layer, Model, Node
from ..problems import ConvProblem, GemmProblem, MatMulProblem
from ..parsers import ConvSignature, FrameworkTrace, GemmSignature, LibraryCall, OpEvent

# ORT's names for a node after its graph transformers rewrote it
_ORT_SUFFIXES = re.compile(r"(_nchwc|_token_\d+|_fused|/fused)+$")
_FUSED_OPS = {"FusedConv": "Conv", "FusedGemm": "Gemm", "FusedMatMul": "MatMul", "NchwcConv": "Conv",
              "QLinearConv": "Conv", "ConvTranspose": "ConvTranspose"}


@dataclass
class OpGroup:
    """One framework op, with the model nodes it executes (empty for inserted ops)."""

    name: str
    op: str
    nodes: tuple[int, ...]
    time_ms: float  # mean per run
    calls_per_run: float


@dataclass
class TraceMatch:
    groups: list[OpGroup]
    eliminated: tuple[int, ...]  # model nodes the framework never ran (folded away or removed)
    runs: int
    run_ms: float  # mean run time in the trace
    op_ms: float  # mean time inside ops per run
    gaps: list[tuple[str, str, float]] = field(default_factory=list)  # (after op, before op, mean µs)

    @property
    def inserted(self) -> list[OpGroup]:
        return [g for g in self.groups if not g.nodes]

    @property
    def fused(self) -> list[OpGroup]:
        return [g for g in self.groups if len(g.nodes) > 1]

    def node_group(self) -> dict[int, OpGroup]:
        return {i: g for g in self.groups for i in g.nodes}


def _steady_runs(trace: FrameworkTrace) -> list[int]:
    """Runs to average over: all but the first (cold caches, lazy init) when there are several."""
    runs = sorted({o.run for o in trace.ops if o.run >= 0})
    return runs[1:] if len(runs) > 1 else runs or [-1]


def match_trace(model: Model, trace: FrameworkTrace) -> TraceMatch:
    by_name = {n.name: n for n in model.nodes}
    producer = {t: n for n in model.nodes for t in n.outputs}
    runs = _steady_runs(trace)
    ops = [o for o in trace.ops if o.run in runs]
    nruns = max(1, len(runs))
    acc: dict[tuple[str, str], list] = {}
    for o in ops:
        entry = acc.setdefault((o.name, o.op), [0.0, 0, o])
        entry[0] += o.span.dur_us
        entry[1] += 1
    groups = []
    claimed: set[int] = set()
    for (name, op), (total, count, first) in acc.items():
        nodes = _nodes_of(first, by_name, producer, model)
        nodes = tuple(i for i in nodes if i not in claimed)
        claimed.update(nodes)
        groups.append(OpGroup(name, op, nodes, total / nruns / 1000.0, count / nruns))
    groups.sort(key=lambda g: min(g.nodes) if g.nodes else 10**9)
    eliminated = tuple(n.index for n in model.nodes if n.index not in claimed) if groups else ()
    run_spans = [trace.runs[r] for r in runs if 0 <= r < len(trace.runs)]
    run_ms = sum(s.dur_us for s in run_spans) / max(1, len(run_spans)) / 1000.0
    op_ms = sum(o.span.dur_us for o in ops) / nruns / 1000.0
    return TraceMatch(groups, eliminated, len(runs), run_ms, op_ms, _gaps(ops, nruns))


def _nodes_of(o: OpEvent, by_name: dict[str, Node], producer: dict[str, Node], model: Model) -> tuple[int, ...]:
    base = _ORT_SUFFIXES.sub("", o.name)
    anchor = by_name.get(o.name) or by_name.get(base) or producer.get(base)
    if anchor is None:
        return ()
    want = _FUSED_OPS.get(o.op, o.op)
    # a namespaced op (aten::conv2d inside a torch layer range) is the framework's kernel, not an
    # ONNX op type: the range's name alone identifies the node
    if not want or "::" in want or anchor.layer.op == want:
        return (anchor.index,)
    # walk producers back to the node of the framework op's type: the fused chain
    chain = [anchor]
    while chain[-1].layer.op != want:
        preds = [producer[t] for t in chain[-1].inputs if t in producer]
        nxt = next((p for p in preds if _reaches(p, want, producer)), None)
        if nxt is None or len(chain) > 6:
            return (anchor.index,)
        chain.append(nxt)
    return tuple(sorted(n.index for n in chain))


def _reaches(node: Node, op: str, producer: dict[str, Node], depth: int = 6) -> bool:
    if node.layer.op == op:
        return True
    if depth == 0:
        return False
    return any(_reaches(producer[t], op, producer, depth - 1) for t in node.inputs if t in producer)


def _gaps(ops: list[OpEvent], nruns: int, top: int = 5) -> list[tuple[str, str, float]]:
    """Largest idle gaps between consecutive ops of a run (same thread), mean per run in µs."""
    by_pair: defaultdict[tuple[str, str], float] = defaultdict(float)  # a Counter counts ints
    ordered = sorted(ops, key=lambda o: (o.run, o.thread, o.span.start_us))
    for a, b in zip(ordered, ordered[1:]):
        if a.run == b.run and a.thread == b.thread:
            gap = b.span.start_us - a.span.end_us
            if gap > 0:
                by_pair[(a.name, b.name)] += gap
    # a stable sort, as Counter.most_common: equal gaps keep first-seen order
    largest = sorted(by_pair.items(), key=lambda e: e[1], reverse=True)[:top]
    return [(a, b, g / nruns) for (a, b), g in largest]


# --- library calls ---------------------------------------------------------------------------


def conv_signature(layer: Layer) -> ConvSignature | None:
    p = layer.problem
    if not isinstance(p, ConvProblem):
        return None
    return ConvSignature(p.mb, p.ic, p.ih, p.iw, p.oc, p.kh, p.kw, p.sh, p.sw, p.pt, p.pl, p.dh, p.dw, p.g)


def gemm_signature(layer: Layer) -> GemmSignature | None:
    p = layer.problem
    if isinstance(p, GemmProblem):
        return GemmSignature(p.m, p.n, p.k, 1)
    if isinstance(p, MatMulProblem):
        return GemmSignature(p.m, p.n, p.k, p.batch)
    return None


def _same_gemm(a: GemmSignature, b: GemmSignature) -> bool:
    # column-major libraries see Y^T = W X^T: m and n swap; batch may be folded into m
    return a.k == b.k and ({a.m * a.batch, a.n} == {b.m * b.batch, b.n} or {a.m, a.n} == {b.m, b.n})


def _signature_matches(node: Node, call: LibraryCall) -> bool:
    conv = conv_signature(node.layer)
    if conv is not None:
        return call.conv == conv
    gemm = gemm_signature(node.layer)
    return gemm is not None and call.gemm is not None and _same_gemm(gemm, call.gemm)


def _near_conv(node: Node, call: LibraryCall) -> list[str]:
    """Fields that differ when a call is the same conv up to parameters (e.g. pads moved out)."""
    conv = conv_signature(node.layer)
    if conv is None or call.conv is None:
        return []
    if (conv.oc, conv.kh, conv.kw, conv.g) != (call.conv.oc, call.conv.kh, call.conv.kw, call.conv.g):
        return []
    return [f"{f}: expected {getattr(conv, f)}, called {getattr(call.conv, f)}"
            for f in conv.__dataclass_fields__ if getattr(conv, f) != getattr(call.conv, f)]


@dataclass
class CallMatch:
    node: int
    call: LibraryCall
    deviations: tuple[str, ...] = ()


@dataclass
class CallAlignment:
    """Expected library calls vs a log: per layer, which call ran it in each pass."""

    expected: tuple[int, ...]  # node indices with a conv/GEMM signature, in model order
    passes: list[list[CallMatch]]
    missing: list[int]  # expected nodes never seen in the first pass
    extra: list[LibraryCall]  # signature calls of the first pass that match no expected layer
    out_of_order: list[int]  # nodes whose first-pass call came after a later layer's call
    api_counts: dict[str, tuple[int, int]]  # api → (expected per pass, logged per pass)


def _early(order: list[int]) -> list[int]:
    """Nodes whose call came before that of a layer earlier in the model. A layer the library
    never ran (torch sends small 3x3 convs to its own kernels) leaves no call, so it is not
    compared: it is missing, and does not put every later layer out of order."""
    out = []
    smallest_after = 10**9
    for n in reversed(order):
        if n > smallest_after:
            out.append(n)
        smallest_after = min(smallest_after, n)
    return sorted(out)


# which layers a library's log can show: cuDNN runs the convs, cuBLAS the GEMMs, oneDNN both
_LOGGED = {"cudnn": (conv_signature,), "cublas": (gemm_signature,), "cublaslt": (gemm_signature,),
           "onednn": (conv_signature, gemm_signature)}


def align_calls(model: Model, calls: list[LibraryCall], backend: str, library: str,
                window: int = 8) -> CallAlignment:
    signatures = _LOGGED.get(library, (conv_signature, gemm_signature))
    expected = [n for n in model.nodes if any(sig(n.layer) for sig in signatures)]
    sig_calls = [c for c in calls if c.conv is not None or c.gemm is not None]
    passes: list[list[CallMatch]] = []
    extra: list[LibraryCall] = []
    out_of_order: list[int] = []
    missing: list[int] = []
    j = 0
    while j < len(sig_calls) and expected:
        matches: list[CallMatch] = []
        start = j
        pending = list(expected)
        while pending and j < len(sig_calls):
            call = sig_calls[j]
            # an exact match may be any pending layer: the earliest with the call's signature (a
            # framework that runs some layers with its own kernels leaves them pending for good, and
            # a window over the pending list would fill with them)
            hit = next((k for k, n in enumerate(pending) if _signature_matches(n, call)), None)
            dev: list[str] = []
            if hit is None:
                if any(_signature_matches(n, call) for n in expected if n not in pending):
                    break  # a layer of this pass runs again: the next inference has begun
                hit, dev = next(((k, d) for k, n in enumerate(pending[:window]) if (d := _near_conv(n, call))),
                                (None, []))
            if hit is None:
                if not passes:
                    extra.append(call)
                j += 1
                continue
            matches.append(CallMatch(pending[hit].index, call, tuple(dev)))
            pending.pop(hit)
            j += 1
        if not passes:
            missing = [n.index for n in pending]
            out_of_order = _early([m.node for m in matches])
        passes.append(matches)
        if j == start:
            break
    want: Counter[str] = Counter()
    for n in model.nodes:
        api = n.layer.onednn_primitive if backend == "onednn" else n.layer.cudnn_api
        if api:
            want[api] += 1
    got = Counter(c.api for c in calls)
    npass = max(1, len(passes))
    apis = sorted(set(want) | set(got))
    return CallAlignment(tuple(n.index for n in expected), passes, missing, extra, out_of_order,
                         {a: (want[a], round(got[a] / npass)) for a in apis})
