"""ONNX Runtime backend: every unique layer, and every fusion pattern, through ORT's own kernels.

A framework's bound, not a vendor library's: each layer is its model's own ONNX node (a fusion
pattern: its subgraph), cut out of the model with the model's constants, and run in an
``InferenceSession`` on the CPU execution provider. Variants are the choices an ORT user has
(docs/backends.md):

- ``algo`` is the graph optimization level: ``basic`` for the node alone, ``extended`` for a
  pattern's subgraph (where ORT fuses Conv+Relu, MatMul+Add, LayerNorm, GELU ... into one
  kernel when it can; what it does not fuse runs as its nodes), ``all`` for layer plus
  NCHWc layout transformation of MLAS (convolutions and 2-D f32 poolings);
- ``layout``: ``any`` for level ``all`` (ORT picks its blocked NCHWc layout), else the model's
  own (``nchw`` for 4-D data, ``plain`` otherwise);
- ``dtype``: the model's; the EP's refusal (no kernel for it) is stored as unsupported;
- ``fusion``: a library pattern of ``benanza.fusion``, or one of ORT's own fusions
  (``benanza.ort_fusions``: SkipLayerNorm, FusedMatMul, Gemm, Split ...), predicted from the
  model as the node groups its fused ops compute.

Time is ONNX Runtime's own: its profiler's per-node kernel time (``<node>_kernel_time`` events,
whole microseconds) summed over the kernels of one ``run()``, never ``run()``'s wall time, which
holds the session's own overhead (kept beside it as the ``run_overhead_ms`` counter). The reorders
the NCHWc transform puts at the subgraph's edges are not the layer's work inside a model whose
neighbours share the layout; their time is the ``reorder_ms`` counter. So are the view kernels
(Reshape, Squeeze ...) ORT puts around a fused kernel, which in a whole model are ops of their
own and cost 0 in the bound: the ``view_ms`` counter.

ORT's profiler has a cost of its own inside each kernel's event: it formats every input's and
output's type and shape into strings between the kernel's start and end times (onnxruntime's
``session_scope.cc``), about 2 µs a kernel here, more than a small kernel's own time (an Add on a
16×32 tensor: 2.3 µs profiled, 0.4 µs without the profiler). Where that matters (a profiled
time under ``REPLICATE_BELOW_MS`` per call, warm, no NCHWc reorders among its kernels) the
stored time is the profiler-free clock of replicas: ``REPLICAS`` copies of the subgraph in one
session, each copy its own input names bound to the same arrays (so ORT cannot merge them), timed
by ``run()``'s wall time against one copy in calls that alternate, the difference per copy being
the kernels' time and ORT's per-node dispatch without the session's fixed cost of a ``run()``.
The profiler's own reading stays beside it as the ``profiled_ms`` counter (its 10th percentile,
the clock a framework's traced profile compares with) and ``replicas`` says which clock the
result is.

Building is writing the subgraphs (``models/*.onnx``) and their index (``benchmarks.json``);
measuring is this module run as a child (``python -m benanza.backends.ort``) that speaks the
runtime's line protocol, so the runner isolates, times out, resumes and re-measures it as it
does a C++ binary.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import BenanzaError, ModelError
from ..layers import DTYPE_NAMES, Layer, Model, UniqueLayer
from ..measurement import LOW_PERCENTILE
from ..ort_fusions import SUM_PATTERNS
from ..outputs import make_folder, write_text
from ..parsers.base import FrameworkTrace
from ..parsers.ort import NCHWC_SUFFIX, parse_ort_profile
from ..problems import VIEW_OPS, ConvProblem, PoolProblem
from ..records import REPLICAS_METRIC, TRACED_METRIC, Variant
from .base import Device, SubgraphBackend
from .inprocess import INDEX_NAME, Evictor, Refused, result_line, serve, timed_calls

if TYPE_CHECKING:
    import jinja2
    import onnx

    from ..generator import GenOptions
    from ..manifest import Manifest
    from ..model_values import ModelValues

log = logging.getLogger(__name__)

NAME = "onnxruntime"
DTYPES = ("f32", "f16", "bf16")
LAYOUTS = ("nchw", "any")  # the model's own layout (nchw, or plain below 4-D), or ORT's NCHWc
PROVIDER = "CPUExecutionProvider"
# the optimization level each variant's algo names (onnxruntime.GraphOptimizationLevel members)
# ("none": no graph optimization at all, the reference `benanza check` compares them with)
LEVELS = {"none": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
          "all": "ORT_ENABLE_ALL"}
# kernels the NCHWc transform adds at a subgraph's edges: layout changes, not the layer's work
REORDER_OPS = ("ReorderInput", "ReorderOutput")
# the name of a node that hands a residual to a convolution's sum in ORT's blocked layout
# (``_fed_blocked``), and of the kernels ORT makes of it
FEED = "benanza_blocked_feed__"
THREADS_ENV = "BENANZA_ORT_THREADS"
WARMUP_CALLS = 3
MAX_CALLS = 20000  # per repetition: the profile of one benchmark stays a few MB
OPTIMIZED = "optimized.onnx"  # the graph ORT made of a subgraph, in the measurement's own folder
# Below this profiled time per call, the profiler's ~2 µs per kernel is more than 2 % of the
# reading: the replicas' clock replaces it.
REPLICATE_BELOW_MS = 0.1
REPLICAS = 8  # copies of the subgraph in the replicas' clock: its per-copy noise is 1/(REPLICAS-1) of one call's
REPLICATED = "replicated.onnx"


def _own_layout(layer: Layer) -> str:
    return "nchw" if any(len(t.shape) >= 4 for t in layer.inputs) else "plain"


class OnnxRuntimeBackend(SubgraphBackend):
    name = NAME
    dtypes = DTYPES
    layouts = LAYOUTS
    device = Device.CPU
    vendor = "onednn"
    package = "onnxruntime"
    threads_env = THREADS_ENV
    profiler_resolution_ms = 0.001  # its profile's durations are whole microseconds

    def covers(self, layer: Layer) -> bool:
        """ORT runs every node of the model: every layer that computes something is covered."""
        return not layer.free

    def variants(self, unique: UniqueLayer, fusions: tuple[str, ...], options: GenOptions) -> list[Variant]:
        layer = unique.layer
        if not self.covers(layer) or (options.dtypes and layer.dtype not in options.dtypes):
            return []
        layouts = options.layouts or LAYOUTS
        own = _own_layout(layer)
        # MLAS's NCHWc kernels: convolutions, and 2-D f32 poolings (a pooling alone is transformed
        # too, its reorders at its edges as a convolution's)
        nchwc = "any" in layouts and (isinstance(layer.problem, ConvProblem) or (
            isinstance(layer.problem, PoolProblem) and layer.dtype == "f32" and len(layer.inputs[0].shape) == 4))
        out = []
        for fusion in ("none", *fusions):
            if "nchw" in layouts:
                level = "basic" if fusion == "none" else "extended"
                out.append(Variant(layer.problem, NAME, layer.op, level, layer.dtype, own, "default", fusion))
            if nchwc:
                out.append(Variant(layer.problem, NAME, layer.op, "all", layer.dtype, "any", "default", fusion))
        return out

    def render(self, manifest: Manifest, variants: list[Variant], env: jinja2.Environment,
               out_dir: Path, options: GenOptions, models: Sequence[Model] = ()) -> list[Path]:
        return write_subgraphs(NAME, variants, models, out_dir, lambda v: {"level": v.algo}, finish=_fed_blocked)

    def outputs(self, path: Path, entry: dict[str, str], feeds: dict[str, Any], threads: int) -> list[Any]:
        return run_once(path, entry["level"], threads, feeds)

    def ran(self, variant: Variant, op: str) -> bool:
        # ORT renames a node its NCHWc transform rewrote; the others ran in the model's layout
        return (variant.layout == "any") == op.endswith(NCHWC_SUFFIX)

    def stack_overrides(self, context: dict | None) -> dict[str, str]:
        # the child runs this interpreter's onnxruntime: a dry run knows its version too
        custom = context["custom"] if context is not None else _context(0)["custom"]
        return {k: str(custom[v]) for k, v in (("onnxruntime", "onnxruntime_version"),
                                                 ("execution_provider", "execution_provider")) if custom.get(v)}


# --- cutting a layer out of its model -------------------------------------------------------

_ELEM_TYPES = {short: code for code, short in DTYPE_NAMES.items()}


class _NoSubgraph(Exception):
    """This layer cannot be cut out of its model (the reason is the message)."""


def _source(model: Model, backend: str) -> ModelValues:
    from ..model_values import ModelValues

    try:
        return ModelValues(model)
    except ModelError as exc:
        raise BenanzaError(f"{model.path}: the {backend} backend reads each layer's node from its model "
                           f"file, which does not load ({exc.problem})") from None


def _subgraph(source: ModelValues, nodes: tuple[int, ...]) -> onnx.ModelProto:
    """The model's nodes as a model of their own: what they read from outside is a graph input
    of its real shape, or the model's constant (an initializer, its Constant node, or the value
    the model computes from shapes), its data read from the model's files (only these nodes')."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    from ..model_values import NoValue

    protos = []
    for i in sorted(nodes):  # the model's order: a match lists its anchor first
        node = source.model.nodes[i]
        proto = source.by_output.get(node.outputs[0]) if node.outputs else None
        if proto is None:
            raise _NoSubgraph(f"node {node.name!r} is not in the model's main graph (a control-flow body)")
        protos.append(proto)
    produced = {o for p in protos for o in p.output}
    constant = {c for i in nodes for c in source.model.nodes[i].constant_inputs}
    declared = {i.name: i.type.tensor_type.elem_type for i in source.proto.graph.input}
    inputs, inits, const_nodes, computed = [], [], [], []
    seen: set[str] = set()
    for p in protos:
        for name in p.input:
            if not name or name in produced or name in seen:
                continue
            seen.add(name)
            if name in source.inits:
                inits.append(source.inits[name])
            elif name in constant and source.computed(name) or name in source.folded:
                # a value computed from shapes is the layer's constant, not an input fed zeros
                computed.append(name)
            elif name in constant:
                const_nodes.append(source.by_output[name])
            else:
                shape, short = source.specs.get(name, ((), ""))
                elem = declared.get(name) or _ELEM_TYPES.get(short)
                if not elem or name not in source.specs:
                    raise _NoSubgraph(f"input {name!r} has no known shape and type")
                inputs.append(helper.make_tensor_value_info(name, elem, list(shape)))
    try:
        values = source.values(computed) if computed else {}
    except NoValue as exc:
        raise _NoSubgraph(f"a constant it reads has no value: {exc}") from None
    inits += [numpy_helper.from_array(np.asarray(values[n]), n) for n in computed]
    # what the nodes compute: the outputs of those no other of them reads (a chain's last, each of
    # the Gathers a Split replaces), so none of it is dead code to ORT's optimizer
    read = {name for p in protos for name in p.input}
    sinks = [p for p in protos if not read & set(p.output)]
    outputs = [helper.make_empty_tensor_value_info(o) for p in sinks for o in p.output if o]
    graph = helper.make_graph([*const_nodes, *protos], "layer", inputs, outputs, inits)
    m = helper.make_model(graph, opset_imports=list(source.proto.opset_import))
    m.ir_version = source.proto.ir_version
    # shapes first, on the graph without its external weights: inference never copies them
    return source.with_weights(onnx.shape_inference.infer_shapes(m))


def _fed_blocked(v: Variant, m: onnx.ModelProto) -> onnx.ModelProto:
    """A subgraph of ORT's convolution with a sum (``SUM_PATTERNS``) whose residual Add reads a
    graph input: that input through a 1×1 MaxPool (an identity ORT's NCHWc transform runs
    blocked), so the Add's operands are both blocked as in the model and ORT takes it as the
    convolution's sum input, which it does not for an operand in the plain layout. The feeder's
    kernels (``FEED``) are timed apart, as the reorders are."""
    from onnx import helper

    if v.fusion not in SUM_PATTERNS:
        return m
    inputs = {i.name for i in m.graph.input}
    fed = []
    for n in m.graph.node:
        for k, name in enumerate(n.input):
            if n.op_type == "Add" and name in inputs:
                fed.append(helper.make_node("MaxPool", [name], [FEED + name], kernel_shape=[1, 1], name=FEED + name))
                n.input[k] = FEED + name
    nodes = [*fed, *m.graph.node]
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    return m


def _subgraph_entry(sources: list[ModelValues], candidates: tuple[Variant, ...], folder: Path,
                    backend: str, finish: Callable[[Variant, onnx.ModelProto], onnx.ModelProto]
                    ) -> tuple[dict[str, str], list[Path]]:
    """The index entry of a (layer, fusion): its subgraph file, or why there is none; and the
    files that make the subgraph."""
    from ..model_values import write_model

    v = candidates[-1]
    for source in sources:
        nodes = next((n for n in (source.find(c, same_dtype=True) for c in candidates) if n is not None), None)
        if nodes is None:
            continue
        try:
            m = finish(v, _subgraph(source, nodes))
        except _NoSubgraph as exc:
            log.warning("%s: %s%s: %s", backend, v.layer_key, f" ({v.fusion})" if v.fusion != "none" else "", exc)
            return {"unsupported": f"not cut out of {source.model.name}: {exc}"}, []
        digest = hashlib.sha256(f"{v.layer_key}/{v.fusion}".encode()).hexdigest()[:16]
        path = folder / f"{digest}.onnx"
        return ({"model": f"models/{path.name}", "nodes": ", ".join(source.model.nodes[i].name for i in nodes),
                 "source": source.model.name}, write_model(m, path))
    return {"unsupported": "no model holds this layer" + (f" in pattern {v.fusion}" if v.fusion != "none" else "")}, []


def write_subgraphs(backend: str, variants: list[Variant], models: Sequence[Model], out_dir: Path,
                    fields: Callable[[Variant], dict[str, str]],
                    sites: Callable[[Variant], tuple[Variant, ...]] = lambda v: (v,),
                    finish: Callable[[Variant, onnx.ModelProto], onnx.ModelProto] = lambda v, m: m) -> list[Path]:
    """The project of a backend that runs each layer as its model's own subgraph (this one, and
    ``torch``): one ``models/*.onnx`` per (layer, fusion), holding its weights (beside it in
    ``*.onnx.data`` where it would pass protobuf's 2 GB), and the index ``benchmarks.json``
    mapping each variant name to its subgraph (or why there is none) plus ``fields(variant)``.
    ``sites(variant)``: the variants whose layer to look for in the models, in order (a dtype
    variant of a layer is found as the model's layer in its own dtype)."""
    if variants and not models:
        raise BenanzaError(f"the {backend} backend cuts each layer out of its model: generate it from the "
                           f"models (`benanza generate MODELS --backend {backend}`)")
    # a layer several models hold is cut from the first of them by name, not by the order the
    # models were given in: `generate a b` and `generate b a` write the same subgraphs
    sources = [_source(m, backend) for m in sorted(models, key=lambda m: (m.name, m.path))]
    folder = make_folder(out_dir / "models")
    index: dict[str, dict[str, str]] = {}
    written: dict[tuple[str, str], dict[str, str]] = {}
    files: list[Path] = []
    for v in sorted(variants, key=lambda v: v.name):
        candidates = sites(v)
        site = (candidates[-1].layer_key, v.fusion)
        if site not in written:
            written[site], made = _subgraph_entry(sources, candidates, folder, backend, finish)
            files += made
        index[v.name] = {**written[site], **fields(v)}
    # a subgraph (or its data) no variant uses any more is stale
    for stale in {*folder.glob("*.onnx"), *folder.glob("*.onnx.data")} - set(files):
        stale.unlink()
    files.append(write_text(out_dir / INDEX_NAME, json.dumps(index, indent=1, sort_keys=True) + "\n"))
    return files


BACKEND = OnnxRuntimeBackend()


# --- the measuring child ---------------------------------------------------------------------

@dataclass(frozen=True)
class _Timed:
    """The per-call kernel times of one benchmark, in ms, by repetition."""

    reps: list[list[float]]
    reorder_ms: list[float]
    view_ms: list[float]  # ORT's view kernels (Reshape, Squeeze ...) among them, per call
    overhead_ms: list[float]  # run() beyond its kernels (the session's own work), per call
    kernels: str  # what ran, e.g. "CPUExecutionProvider:FusedConv"


def _context(threads: int) -> dict[str, Any]:
    import onnxruntime as ort

    from ..system import cpu_model

    return {"cpu_model": cpu_model(), "num_cpus": os.cpu_count(),
            "custom": {"backend": NAME, "onnxruntime_version": ort.__version__, "execution_provider": PROVIDER,
                       "intra_op_threads": threads}}


def _feeds(sess: Any) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(0)
    out = {}
    for i in sess.get_inputs():
        kind = i.type.removeprefix("tensor(").removesuffix(")")  # ORT's names: float, float16, int64 ...
        if kind == "bfloat16":
            raise Refused("numpy has no bf16 to feed this subgraph's inputs with")
        dtype = np.dtype({"float": "float32", "double": "float64"}.get(kind, kind))
        shape = [d if isinstance(d, int) else 1 for d in i.shape]
        # integers and booleans get zeros: valid indices, sizes and masks
        out[i.name] = rng.standard_normal(shape).astype(dtype) if dtype.kind == "f" else np.zeros(shape, dtype)
    return out


def _session(path: Path, level: str, threads: int, tmp: str | None) -> Any:
    """The variant's session; ``tmp``: profile it there (its kernel times, its optimized graph)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[level])
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if tmp is not None:
        opts.enable_profiling = True
        opts.profile_file_prefix = os.path.join(tmp, "profile")
        # the graph ORT made of it: its nodes' domains tell an NCHWc kernel from the plain one
        opts.optimized_model_filepath = os.path.join(tmp, OPTIMIZED)
        # its weights in a file beside it: a layer's may pass protobuf's 2 GB, and only the
        # graph is read back
        opts.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                      OPTIMIZED + ".data")
        opts.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    opts.log_severity_level = 3
    try:
        return ort.InferenceSession(str(path), opts, providers=[PROVIDER])
    except Exception as exc:  # noqa: BLE001 - ORT's Python errors share no base class
        text = str(exc)
        if "NOT_IMPLEMENTED" in text or "Could not find an implementation" in text:
            raise Refused(text.strip().splitlines()[0][:500]) from None
        raise


def run_once(path: Path, level: str, threads: int, feeds: dict[str, Any]) -> list[Any]:
    """The subgraph's outputs as ORT computes them at ``level`` (``benanza check``); ``Refused``
    when the EP has no kernel for it."""
    return list(_session(path, level, threads, None).run(None, feeds))


def _measure(path: Path, level: str, threads: int, min_time: float, repetitions: int, tmp: str,
             evict: Evictor | None) -> _Timed:
    import onnx

    sess = _session(path, level, threads, tmp)
    optimized = onnx.load(os.path.join(tmp, OPTIMIZED), load_external_data=False)
    domains = {n.name: n.domain for n in optimized.graph.node}
    feeds = _feeds(sess)
    for _ in range(WARMUP_CALLS):
        sess.run(None, feeds)
    counts = timed_calls(lambda: sess.run(None, feeds), min_time, repetitions, MAX_CALLS, evict, feeds.values())
    profile = Path(sess.end_profiling())
    try:
        trace = parse_ort_profile(profile)
    finally:
        profile.unlink(missing_ok=True)
    return _per_call(trace, counts, domains)


def _replicable(model: onnx.ModelProto) -> bool:
    """Whether copies of this subgraph run as copies: each reads an input of its own (a subgraph
    of constants alone is folded by ORT, and copies of it merged), no node holds a graph body
    (whose outer-scope names a copy would have to rename inside it), and none is a feeder the
    samples leave out."""
    import onnx

    inits = {i.name for i in model.graph.initializer}
    return (any(i.name not in inits for i in model.graph.input)
            and not any(n.name.startswith(FEED) for n in model.graph.node)  # each copy would run it
            and not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                        for n in model.graph.node for a in n.attribute))


def _replicated(model: onnx.ModelProto, copies: int) -> onnx.ModelProto:
    """``copies`` copies of the subgraph side by side: every input, value and node renamed per
    copy (``<name>__<copy>``), the constants shared (one copy of the weights, as the layer has)."""
    from onnx import helper

    g = model.graph
    shared = {i.name for i in g.initializer}
    inputs, nodes, outputs = [], [], []
    for c in range(copies):
        def own(name: str, c: int = c) -> str:
            return name if not name or name in shared else f"{name}__{c}"
        for i in g.input:
            if i.name not in shared:
                inputs.append(helper.make_value_info(own(i.name), i.type))
        for n in g.node:
            copy = type(n)()
            copy.CopyFrom(n)
            copy.name = f"{n.name}__{c}"
            copy.input[:] = [own(x) for x in n.input]
            copy.output[:] = [own(x) for x in n.output]
            nodes.append(copy)
        outputs += [helper.make_value_info(own(o.name), o.type) for o in g.output]
    m = helper.make_model(helper.make_graph(nodes, "replicas", inputs, outputs, list(g.initializer)),
                          opset_imports=list(model.opset_import))
    m.ir_version = model.ir_version
    return m


def _replicas_clock(path: Path, level: str, threads: int, min_time: float, repetitions: int,
                    tmp: str) -> list[list[float]] | None:
    """Per-call times in ms by repetition, without the profiler: ``REPLICAS`` copies' ``run()``
    less the subgraph's own in the same repetition (the calls alternate, so both see the same
    machine), per copy (``per_copy_ms``); None where the subgraph's copies would not run as copies."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(path))
    if not _replicable(model):
        return None
    file = os.path.join(tmp, REPLICATED)
    # the weights beside it: a subgraph's may pass protobuf's 2 GB in one message
    onnx.save_model(_replicated(model, REPLICAS), file, save_as_external_data=True,
                    location=f"{REPLICATED}.data", size_threshold=1024)
    single, copies = _session(path, level, threads, None), _session(Path(file), level, threads, None)
    feeds = {k: ort.OrtValue.ortvalue_from_numpy(v) for k, v in _feeds(single).items()}
    bindings = []
    for sess, names in ((single, lambda n: [n]), (copies, lambda n: [f"{n}__{c}" for c in range(REPLICAS)])):
        b = sess.io_binding()
        for name, value in feeds.items():
            for own in names(name):
                b.bind_ortvalue_input(own, value)
        for o in sess.get_outputs():
            b.bind_output(o.name, "cpu")
        bindings.append(b)
    one, many = (lambda s=s, b=b: s.run_with_iobinding(b) for s, b in zip((single, copies), bindings))
    for _ in range(WARMUP_CALLS):
        one(), many()
    times: tuple[list[float], list[float]] = ([], [])

    def pair() -> None:
        for call, out in ((one, times[0]), (many, times[1])):
            started = time.perf_counter()
            call()
            out.append(time.perf_counter() - started)

    reps, at = [], 0
    for n in timed_calls(pair, min_time, repetitions, MAX_CALLS, None):
        reps.append(per_copy_ms(times[0][at:at + n], times[1][at:at + n], REPLICAS))
        at += n
    return reps


def per_copy_ms(single: list[float], copies: list[float], replicas: int) -> list[float]:
    """Per-copy times in ms from one repetition's alternating calls (seconds) of the subgraph and
    of its ``replicas`` copies, the calls paired by rank, the fastest of one with the fastest of
    the other: a low percentile is then clean calls less clean calls (less the single clock's
    median, it also took in that clock's spread, and fell below 0 for a kernel under a
    microsecond). Where two slow outliers pair the other way, the difference is 0: no call takes
    less than no time."""
    import numpy as np

    by_rank = np.sort(copies) - np.sort(single)
    return [float(x) for x in np.maximum(by_rank, 0) * 1e3 / (replicas - 1)]


def _per_call(trace: FrameworkTrace, counts: list[int], domains: dict[str, str]) -> _Timed:
    """Each timed run()'s kernel time from ORT's profile (the parser puts each kernel in the
    ``model_run`` it lies in); the warm-up runs come first and are left out."""
    if len(trace.runs) != WARMUP_CALLS + sum(counts):
        raise RuntimeError(f"the profile holds {len(trace.runs)} runs, {WARMUP_CALLS + sum(counts)} were made")
    kernel = [0.0] * len(trace.runs)
    reorder = [0.0] * len(trace.runs)
    views = [0.0] * len(trace.runs)
    ran: dict[str, None] = {}
    for e in trace.ops:
        if e.run < 0:
            continue
        if e.op in REORDER_OPS or e.name.startswith(FEED):
            reorder[e.run] += e.span.dur_us
        elif e.op.lower() in VIEW_OPS:
            # the Reshapes/Squeezes ORT puts around a fused kernel (a 3-D MatMul+Add as
            # Reshape→Gemm→Reshape, three Gathers as Split→Squeeze×3): in the whole model they
            # are ops of their own, not the fused op's time, and a view costs 0 in the bound
            views[e.run] += e.span.dur_us
        else:
            kernel[e.run] += e.span.dur_us
            domain = domains.get(e.name, "")
            ran.setdefault(f"{e.provider or PROVIDER}:{domain + '.' if domain else ''}{e.op}")
    timed, at = [], WARMUP_CALLS
    for n in counts:
        timed.append([kernel[i] / 1e3 for i in range(at, at + n)])
        at += n
    tail = range(WARMUP_CALLS, len(trace.runs))
    return _Timed(timed, [reorder[i] / 1e3 for i in tail], [views[i] / 1e3 for i in tail],
                  [(trace.runs[i].dur_us - kernel[i] - reorder[i] - views[i]) / 1e3 for i in tail], "+".join(ran))


def _measure_entry(project: Path, name: str, entry: dict[str, str], threads: int, min_time: float,
                   repetitions: int, evict: Evictor | None) -> dict[str, Any]:
    import numpy as np

    path = project / entry["model"]
    replicas = None
    with tempfile.TemporaryDirectory(prefix="benanza-ort-") as tmp:
        t = _measure(path, entry["level"], threads, min_time, repetitions, tmp, evict)
        profiled = [x for r in t.reps for x in r]
        # the cold readings keep the profiler's clock: a replica after the first finds the
        # weights the first one read
        if (evict is None and not any(t.reorder_ms) and profiled
                and float(np.median(profiled)) < REPLICATE_BELOW_MS):
            replicas = _replicas_clock(path, entry["level"], threads, min_time, repetitions, tmp)
    counters = {"reorder_ms": float(np.median(t.reorder_ms)), "view_ms": float(np.median(t.view_ms)),
                "run_overhead_ms": float(np.median(t.overhead_ms))}
    if replicas is None:
        return result_line(name, t.reps, t.kernels, counters,
                           "its kernels ran below the profiler's 1 us resolution in most calls: no time to store")
    counters |= {TRACED_METRIC: float(np.percentile(profiled, LOW_PERCENTILE)), REPLICAS_METRIC: REPLICAS}
    return result_line(name, replicas, t.kernels, counters,
                       f"{REPLICAS} copies of it took no longer than one in most calls: no time to store")


def main(argv: list[str]) -> int:
    return serve(argv, THREADS_ENV, _context, _measure_entry)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
