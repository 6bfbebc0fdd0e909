"""Match what a profile recorded back to the model's layers, so analyses speak in layer names.

* Framework ops (ORT nodes, torch ops) → groups of model nodes. A framework may rename a
  fused node after the tensor it produces (ORT: ``r1_nchwc`` for Conv+Relu writing ``r1``)
  or after a node it replaced plus the fusion's name (``/fc/MatMul/MatMulAddFusion``); the
  group is then what that fused op computes, walked from the named node (``COVERS``). ORT
  names other fused ops only by their type (``Gelu``, ``SkipLayerNormalization_token_3``):
  those take, in execution order, the model's next unclaimed occurrence of the pattern they
  replace whose output shape is theirs. Ops matching no node are insertions (ORT's
  ReorderInput/ReorderOutput, the Reshapes it puts around a Gemm).
* Ops inside an If branch or a Loop/Scan body → the layers the processor inlined for them.
  ORT names such a node by its own name in the subgraph (``/decoder/rnn/Slice``), once per
  execution; the model holds it under its path (``/decoder/If_1/then//decoder/rnn/Slice``,
  ``Loop_0/iter2/Add_5``): the k-th execution in a run is the k-th inlined node of that name.
  The If/Loop/Scan kernel's own event spans its body's ops: it keeps only the time outside them.
* Library calls → conv / GEMM nodes by shape signature, in model order, pass after pass
  (a log holds every iteration).
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace

from ..layers import Layer, Model, Node
from ..ort_fusions import CANDIDATES, COVERS, NodeGraph, reaches, sum_tail, takes_sum
from ..parsers import ConvSignature, FrameworkTrace, GemmSignature, LibraryCall, OpEvent
from ..parsers.ort import NCHWC_SUFFIX
from ..problems import ConvProblem, GemmProblem, MatMulProblem

# ORT's names for a node after its graph transformers rewrote it: the original node's (or
# output's) name plus what the transformer appends; "_token_N" makes a generated name unique
_ORT_SUFFIXES = re.compile(r"(_nchwc|_token_\d+|_fused|/fused|/\w+Fusion/?|_new_reshape)+$")
# ops that are one of the model's ops plus what ORT fused into it: the chain back to that op
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
    def unmapped(self) -> list[OpGroup]:
        """Inserted ONNX-level ops that compute rather than move data: fused kernels whose pattern
        was not found in the model, so the layers they replace count 0 in the framework's bound. A
        namespaced op (``aten::empty`` between a torch run's layer ranges) is the framework's own
        work, not a node of any graph."""
        return [g for g in self.inserted if g.op and g.op not in _GLUE and "::" not in g.op]

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
    graph = _Graph(model)
    runs = _steady_runs(trace)
    ops = _into_inlined([o for o in trace.ops if o.run in runs], graph)
    own = _own_us(ops, graph)
    nruns = max(1, len(runs))
    acc: dict[tuple[str, str], list] = {}
    for o in ops:
        entry = acc.setdefault((o.name, o.op), [0.0, 0, o])
        entry[0] += own.get(id(o), o.span.dur_us)
        entry[1] += 1
    claimed: set[int] = set()
    found: dict[tuple[str, str], tuple[int, ...]] = {}
    # named ops first: an op known only by its type must not take a named op's nodes
    for key, (_, _, first) in acc.items():
        nodes = tuple(i for i in _nodes_of(first, graph) if i not in claimed)
        claimed.update(nodes)
        found[key] = nodes
    for key, (_, _, first) in acc.items():
        if not found[key] and first.op in CANDIDATES:
            found[key] = _unnamed(first, graph, claimed)
            claimed.update(found[key])
    # then a model op under a name the model lacks (the transformer optimizer's
    # ``FullyConnect_MatMul_1``): the next unclaimed node of its type and output shape
    for key, (_, _, first) in acc.items():
        if not found[key] and first.op not in _GLUE and first.op not in COVERS:
            found[key] = _renamed(first, graph, claimed)
            claimed.update(found[key])
    _sums_into_convs(graph, found, claimed)
    groups = [OpGroup(name, op, found[(name, op)], total / nruns / 1000.0, count / nruns)
              for (name, op), (total, count, _) in acc.items()]
    groups.sort(key=lambda g: min(g.nodes) if g.nodes else 10**9)
    eliminated = tuple(n.index for n in model.nodes if n.index not in claimed) if groups else ()
    run_spans = [trace.runs[r] for r in runs if 0 <= r < len(trace.runs)]
    run_ms = sum(s.dur_us for s in run_spans) / max(1, len(run_spans)) / 1000.0
    op_ms = sum(own.get(id(o), o.span.dur_us) for o in ops) / nruns / 1000.0
    return TraceMatch(groups, eliminated, len(runs), run_ms, op_ms, _gaps(ops, nruns))


def _sums_into_convs(graph: _Graph, found: dict[tuple[str, str], tuple[int, ...]], claimed: set[int]) -> None:
    """A residual Add that ORT's NCHWc transform gave a convolution as its sum input, and the
    activation after the sum, run inside that convolution's kernel and are no ops of their own:
    their nodes join the convolution's group. Both operands come from blocked ops; the conv is
    the first operand that can take the sum (ORT's order)."""
    blocked = {i: key for key, nodes in found.items() if key[0].endswith(NCHWC_SUFFIX) for i in nodes}
    for add in graph.model.nodes:
        producers = [graph.producer.get(t) for t in add.inputs]
        if add.index in claimed or add.layer.op != "Add" or len(producers) != 2 \
                or any(p is None or p.index not in blocked for p in producers):
            continue
        key = next((blocked[p.index] for p in producers if p is not None and blocked[p.index][1] == "Conv"
                    and takes_sum(graph, p, add)), None)
        if key is not None:
            tail = tuple(n.index for n in sum_tail(graph, add) if n.index not in claimed)
            found[key] = tuple(sorted(found[key] + tail))
            claimed.update(tail)
            blocked.update(dict.fromkeys(tail, key))


# an inlined node's name: the path of its If branch or loop iteration, then its own name there
# (the last marker: a nested one's path holds the outer ones)
_INLINED = re.compile(r".*/(?:then|else|iter\d+)/(.+)$")
_CONTROL_FLOW = frozenset({"If", "Loop", "Scan"})


def _into_inlined(ops: list[OpEvent], graph: _Graph) -> list[OpEvent]:
    """``ops`` with each subgraph node's execution named after the inlined node it is: the k-th
    execution of a name in a run (a Loop's body runs once per iteration) is the k-th inlined node
    of that own name, in model order, which is the order ORT runs them."""
    seen: Counter[tuple[int, str]] = Counter()
    out = []
    for o in sorted(ops, key=lambda o: (o.run, o.span.start_us)):
        inlined = graph.inlined.get(o.name) if o.name not in graph.by_name else None
        if inlined:
            k = seen[(o.run, o.name)]
            seen[(o.run, o.name)] += 1
            if k < len(inlined):
                o = replace(o, name=inlined[k])
        out.append(o)
    return out


def _own_us(ops: list[OpEvent], graph: _Graph) -> dict[int, float]:
    """The time of each If/Loop/Scan kernel the processor inlined (``id`` of its event → µs)
    outside the ops it ran, which ORT records inside its span on the same thread: the framework's
    control-flow overhead, not its body's work twice."""
    out: dict[int, float] = {}
    for c in ops:
        if c.op not in _CONTROL_FLOW or c.name in graph.by_name:
            continue
        inner = sorted((o.span.start_us, o.span.end_us) for o in ops if o is not c and o.run == c.run
                       and o.thread == c.thread and c.span.start_us <= o.span.start_us
                       and o.span.end_us <= c.span.end_us)
        covered, reach = 0.0, c.span.start_us
        for start, end in inner:  # nested spans: count each instant once
            covered += max(0.0, end - max(start, reach))
            reach = max(reach, end)
        out[id(c)] = max(0.0, c.span.dur_us - covered)
    return out


class _Graph(NodeGraph):
    """The model's nodes by name too, and an inlined subgraph node's names by its own name."""

    def __init__(self, model: Model) -> None:
        super().__init__(model)
        self.by_name = {n.name: n for n in model.nodes}
        self.inlined: defaultdict[str, list[str]] = defaultdict(list)  # own name in its subgraph → inlined names
        for n in model.nodes:
            m = _INLINED.match(n.name)
            if m:
                self.inlined[m.group(1)].append(n.name)


def _nodes_of(o: OpEvent, graph: _Graph) -> tuple[int, ...]:
    base = _ORT_SUFFIXES.sub("", o.name)
    anchor = graph.by_name.get(o.name) or graph.by_name.get(base) or graph.producer.get(base)
    if anchor is None:
        return ()
    if o.op in COVERS and anchor.layer.op != o.op:
        nodes = COVERS[o.op](graph, anchor)
        if nodes:
            return nodes
    want = _FUSED_OPS.get(o.op, o.op)
    # a namespaced op (aten::conv2d inside a torch layer range) is the framework's kernel, not an
    # ONNX op type: the range's name alone identifies the node
    if not want or "::" in want or anchor.layer.op == want:
        return (anchor.index,)
    # walk producers back to the node of the framework op's type: the fused chain
    producer = graph.producer
    chain = [anchor]
    while chain[-1].layer.op != want:
        preds = [producer[t] for t in chain[-1].inputs if t in producer]
        nxt = next((p for p in preds if reaches(p, want, producer)), None)
        if nxt is None or len(chain) > 6:
            return (anchor.index,)
        chain.append(nxt)
    return tuple(sorted(n.index for n in chain))


def _unnamed(o: OpEvent, graph: _Graph, claimed: set[int]) -> tuple[int, ...]:
    """A fused op ORT named only by its type: the first unclaimed occurrence (model order) of
    the pattern it replaces whose output has the op's output shape. ORT's sequential executor
    runs nodes in the model's topological order, so the k-th such op is the k-th occurrence.
    A part of the pattern another op already runs (a bias Add in ORT's Gemm) stays with it. A
    fused op the transformer optimizer renamed (``FullyConnect_MatMul_0/MatMulAddFusion``) is
    found the same way."""
    want = o.output_shapes[0] if o.output_shapes else None
    seen: set[tuple[int, ...]] = set()
    for seed in graph.model.nodes:
        if seed.layer.op not in CANDIDATES[o.op] or seed.index in claimed:
            continue
        nodes = tuple(i for i in COVERS[o.op](graph, seed) or () if i not in claimed)
        if seed.index not in nodes or nodes in seen:
            continue
        seen.add(nodes)
        shapes = {s.shape for i in nodes for s in graph.model.nodes[i].layer.outputs}
        if want is None or any(_same_data(want, s) for s in shapes):
            return nodes
    return ()


def _same_data(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """The same tensor, or one ORT flattened to 2-D around a Gemm (rows folded, last axis kept)."""
    return a == b or (bool(a) and bool(b) and a[-1] == b[-1] and math.prod(a) == math.prod(b))


def _renamed(o: OpEvent, graph: _Graph, claimed: set[int]) -> tuple[int, ...]:
    want = o.output_shapes[0] if o.output_shapes else None
    return next(((n.index,) for n in graph.model.nodes if n.layer.op == o.op and n.index not in claimed
                 and not n.layer.view and want is not None and n.layer.outputs
                 and _same_data(n.layer.outputs[0].shape, want)), ())


# ops ORT inserts that move data or change layout: no layer of the model computes them
# (and an inlined If/Loop/Scan's own time: its body's ops are matched to the inlined layers)
_GLUE = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Transpose", "ReorderInput",
                   "ReorderOutput", "MemcpyToHost", "MemcpyFromHost"} | _CONTROL_FLOW)


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


# cuDNN's graph API: PyTorch runs a convolution as one execute of a conv_fprop plan
GRAPH_EXECUTE = "cudnnBackendExecute"


def _expected_api(layer: Layer, backend: str) -> str | None:
    return layer.onednn_primitive if backend == "onednn" else layer.cudnn_api


def _logged_api(call: LibraryCall, node: int | None, model: Model, backend: str) -> str:
    """The API a logged call counts as: a graph-API execute that ran layer ``node``'s convolution
    exactly counts as the layer's expected call (a convolution run, not an unexpected execute)."""
    if call.api != GRAPH_EXECUTE or call.conv is None or node is None:
        return call.api
    return _expected_api(model.nodes[node].layer, backend) or call.api


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
    want = Counter(api for n in model.nodes if (api := _expected_api(n.layer, backend)))
    ran = {m.call.index: m.node for p in passes for m in p if not m.deviations}  # call → the layer it ran exactly
    got = Counter(_logged_api(c, ran.get(c.index), model, backend) for c in calls)
    npass = max(1, len(passes))
    apis = sorted(set(want) | set(got))
    return CallAlignment(tuple(n.index for n in expected), passes, missing, extra, out_of_order,
                         {a: (want[a], round(got[a] / npass)) for a in apis})
