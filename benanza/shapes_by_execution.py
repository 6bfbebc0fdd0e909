"""Shapes by execution: the processor's fallback when static shape inference leaves tensors
without a concrete shape.

ONNX shape inference (with data propagation and folding) and ONNX Runtime's symbolic inference
both stop at shapes that only values decide: an ``Expand`` or ``Reshape`` whose target is a graph
input, ``NonZero``, ``NonMaxSuppression``, a ``TopK`` with a computed k. One ONNX Runtime run on
inputs of the requested shapes does not stop there: the tensors still unknown are added as graph
outputs of a copy of the model and their shapes are read off the run.

Inputs are fed from ``--input-data FILE.npz``, else ``--input-value NAME=V1,V2..``, else seeded
random floats or integer zeros. A small input upstream of an unknown shape
(a shape tensor, a sample rate, a branch condition) has no safe default: it must be given.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import ModelError, ShapeError, UsageError
from .layers import DTYPE_NAMES, Model, TensorSpec

if TYPE_CHECKING:  # ONNX and NumPy load where a model is run: an analysis of a processed model reads only its notes
    import numpy as np
    import onnx

log = logging.getLogger(__name__)

# Ops whose output size is decided by the values they read, not by their input shapes.
DATA_DEPENDENT_OPS = frozenset({"NonZero", "NonMaxSuppression", "TopK", "Unique", "Compress"})
# An integer or boolean input of at most this many elements, or a float scalar, upstream of an
# unknown shape is taken as one whose value decides shapes or branches (a shape tensor, a k, a
# sample rate, Range bounds, a condition): zeros or noise would cost a different network, so its
# value must be given. Other inputs are data: floats run as seeded noise, integers (token ids,
# masks) as zeros.
DECIDING_MAX_ELEMENTS = 64
# Protobuf cannot serialise a message past 2 GiB; the copy handed to ONNX Runtime must fit.
PROTOBUF_LIMIT = 2**31 - 1
SEED = 0
# A run whose inputs alone would take more memory than this is not made: what a file claims is
# no reason to allocate it (a hostile or mistaken --input-shape), and the user hears why.
MAX_FEED_BYTES = 4 * 2**30
# Wall-clock budget of the run: a Loop whose trip count a file sets to 2**62 must not hang the
# command. ONNX Runtime checks its terminate flag between kernels, inside loops too.
RUN_SECONDS = 120.0


@dataclass(frozen=True)
class ExecutedShapes:
    """What one run recorded: the shape of each tensor static inference left unknown, which of
    them the data sized (with the size this run saw), and why the run could not be made."""

    specs: tuple[tuple[str, TensorSpec], ...] = ()
    data_dependent: tuple[str, ...] = ()
    failure: str = ""  # empty when the run succeeded or was not needed


def parse_input_value(spec: str) -> tuple[str, tuple[float, ...]]:
    name, sep, text = spec.rpartition("=")
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        values = ()
    if not sep or not name or not values or not all(math.isfinite(v) for v in values):
        raise UsageError(f"--input-value {spec!r}: want NAME=V1,V2,... with numbers (one per element)")
    return name, values


def load_input_data(path: str | Path) -> dict[str, np.ndarray]:
    """``--input-data FILE.npz``: one array per graph input, by input name."""
    import numpy as np

    p = Path(path)
    try:
        with np.load(p, allow_pickle=False) as npz:
            return {name: np.asarray(npz[name]) for name in npz.files}
    except FileNotFoundError:
        raise UsageError(f"--input-data {p}: no such file") from None
    except Exception as exc:  # noqa: BLE001 - zipfile, pickle refusal and format errors alike
        raise UsageError(f"--input-data {p}: not a readable .npz of input arrays "
                         f"({type(exc).__name__}: {exc})") from None


def unknown_tensors(graph: onnx.GraphProto, known: Iterable[str], needed: set[str]) -> set[str]:
    """Node outputs whose shape matters (``needed``) and that static inference left unknown.
    A Constant's output is known from its attribute, whatever inference said."""
    have = set(known) | {t.name for t in graph.initializer}
    return {o for n in graph.node if n.op_type != "Constant" for o in n.output
            if o and o in needed and o not in have}


def complete_by_execution(model: onnx.ModelProto, path: Path, input_shapes: dict[str, tuple[int, ...]],
                          specs: dict[str, TensorSpec], needed: set[str], values: dict[str, tuple[float, ...]],
                          data: dict[str, np.ndarray]) -> ExecutedShapes:
    """The processor's hook: runs the model only when static inference left a needed tensor unknown."""
    wanted = unknown_tensors(model.graph, specs, needed)
    if not wanted:
        return ExecutedShapes()
    log.info("%s: %d tensors without a static shape; running the model once for them", path, len(wanted))
    return execute_for_shapes(model, path, input_shapes, wanted, values, data)


def execute_for_shapes(model: onnx.ModelProto, path: Path, input_shapes: dict[str, tuple[int, ...]],
                       wanted: set[str], values: dict[str, tuple[float, ...]],
                       data: dict[str, np.ndarray]) -> ExecutedShapes:
    """The shapes of the ``wanted`` tensors in one run of ``model``; which of them the data sized."""
    import onnx

    results, failure = run_once(model, path, input_shapes, wanted, values, data)
    if failure:
        log.info("%s: %s; tensors static inference left unknown stay uncosted", path, failure)
        return ExecutedShapes(failure=failure)
    specs: list[tuple[str, TensorSpec]] = []
    for name, arr in sorted(results.items()):
        dtype = onnx.helper.np_dtype_to_tensor_dtype(arr.dtype) if arr.dtype != object else 8
        specs.append((name, TensorSpec(tuple(int(d) for d in arr.shape), DTYPE_NAMES.get(dtype, str(dtype)))))
    seen = {name for name, _ in specs}
    sized_by_data = _downstream_of_data_dependent(model.graph, seen)
    return ExecutedShapes(specs=tuple(specs), data_dependent=tuple(sorted(seen & sized_by_data)))


def run_once(model: onnx.ModelProto, path: Path, input_shapes: dict[str, tuple[int, ...]], wanted: set[str],
             values: dict[str, tuple[float, ...]], data: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], str]:
    """Run ``model`` (weights not loaded: ONNX Runtime reads external data from beside ``path``)
    once in ONNX Runtime; the values of the ``wanted`` tensors, and why the run failed ("" if not).

    A missing value for a deciding input, or a value or array that does not fit its input, is a
    ShapeError naming the input; a run ONNX Runtime refuses (a custom op, a dtype without a
    kernel) is the returned reason, which the caller reports on what it could not cost."""
    import numpy as np
    import onnx

    graph = model.graph
    inits = {t.name for t in graph.initializer}
    inputs = [i for i in graph.input if i.name not in inits]
    deciding = _upstream_inputs(graph, wanted, {i.name for i in inputs})
    feed_bytes = sum(math.prod(input_shapes[i.name]) * _itemsize(i.type.tensor_type.elem_type) for i in inputs)
    if feed_bytes > MAX_FEED_BYTES:
        return {}, (f"its inputs at the requested shapes take {feed_bytes / 2**30:.1f} GiB, more than the "
                    f"{MAX_FEED_BYTES / 2**30:.0f} GiB Benanza allocates for a run")
    feed = {i.name: _feed(i, input_shapes[i.name], i.name in deciding, values, data, path) for i in inputs}
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for inp in copy.graph.input:
        if inp.name in input_shapes:
            inp.type.tensor_type.shape.ClearField("dim")
            for d in input_shapes[inp.name]:
                inp.type.tensor_type.shape.dim.add().dim_value = d
    del copy.graph.value_info[:]  # shapes stored in the file may contradict the requested ones
    for out in copy.graph.output:
        out.type.tensor_type.ClearField("shape")
    outputs = {o.name for o in copy.graph.output}
    for name in sorted(wanted - outputs):
        copy.graph.output.append(onnx.ValueInfoProto(name=name))
    if copy.ByteSize() > PROTOBUF_LIMIT:
        raise ShapeError(path, "its graph proto with weights inside is too close to protobuf's 2 GB limit to "
                               "run it for what static inference cannot tell; save its weights as external "
                               "data (onnx.save(..., save_as_external_data=True))")
    run = None
    try:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        # Optimizations would fuse away the very tensors being recorded, and only cost time here.
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        opts.log_severity_level = 4  # its failure is reported to the user once, by the caller
        opts.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                      os.path.dirname(os.path.abspath(path)))
        session = ort.InferenceSession(copy.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs() if o.name in wanted]
        run = ort.RunOptions()
        run.log_severity_level = 4
        timer = threading.Timer(RUN_SECONDS, lambda: setattr(run, "terminate", True))
        timer.start()
        try:
            results = session.run(names, feed, run)
        finally:
            timer.cancel()
    except Exception as exc:  # noqa: BLE001 - ORT raises its own Fail/InvalidGraph/RuntimeException types
        if run is not None and run.terminate:
            return {}, f"ONNX Runtime did not finish the run within {RUN_SECONDS:g} s"
        text = str(exc).strip().splitlines()
        return {}, f"ONNX Runtime could not run it ({type(exc).__name__}: {text[0] if text else ''})"
    return {n: a for n, a in zip(names, results) if isinstance(a, np.ndarray)}, ""


def _itemsize(elem: int) -> int:
    import numpy as np
    import onnx

    try:
        return int(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem)).itemsize)
    except Exception:  # noqa: BLE001 - no numpy match: _feed names the input
        return 1


def _feed(inp: onnx.ValueInfoProto, shape: tuple[int, ...], deciding: bool, values: dict[str, tuple[float, ...]],
          data: dict[str, np.ndarray], path: Path) -> np.ndarray:
    import numpy as np
    import onnx

    elem = inp.type.tensor_type.elem_type
    try:
        np_type = onnx.helper.tensor_dtype_to_np_dtype(elem)
    except Exception:  # noqa: BLE001 - an element type numpy has no match for
        raise ModelError(path, f"input '{inp.name}' has element type {elem}, which cannot be fed") from None
    shown = "x".join(map(str, shape)) or "scalar"
    if inp.name in data:
        arr = data[inp.name]
        if tuple(arr.shape) != tuple(shape):
            raise ShapeError(path, f"--input-data array '{inp.name}' has shape "
                                   f"{'x'.join(map(str, arr.shape)) or 'scalar'}, the input is {shown} "
                                   f"(give --input-shape {inp.name}=… to match)")
        return arr.astype(np_type, copy=False)
    if inp.name in values:
        given = values[inp.name]
        if len(given) != math.prod(shape):
            raise ShapeError(path, f"--input-value {inp.name}: {len(given)} values for an input of shape {shown} "
                                   f"({math.prod(shape)} elements)")
        return np.array(given).astype(np_type).reshape(shape)
    numel = math.prod(shape)
    floating = np.issubdtype(np_type, np.floating)
    if deciding and not np.issubdtype(np_type, np.number) and np_type != np.bool_:
        # --input-value reads numbers: text has only --input-data to come from
        raise ShapeError(path, f"input '{inp.name}' ({DTYPE_NAMES.get(elem, elem)}, {shown}) decides shapes "
                               f"static inference cannot resolve: give real inputs with --input-data FILE.npz")
    if deciding and (not shape if floating else numel <= DECIDING_MAX_ELEMENTS):
        example = ",".join(["V"] * numel) if numel <= 4 else "V1,V2,…"
        raise ShapeError(path, f"input '{inp.name}' ({DTYPE_NAMES.get(elem, elem)}, {shown}) decides shapes or "
                               f"branches static inference cannot resolve: give its value with "
                               f"--input-value {inp.name}={example} (or real inputs with --input-data FILE.npz)")
    if floating:
        return np.random.default_rng(SEED).standard_normal(shape).astype(np_type)
    return np.zeros(shape, np_type)


# Ops whose output depends on their input's shape only, never on its values.
_SHAPE_ONLY = frozenset({"Shape", "Size"})


def _upstream_inputs(graph: onnx.GraphProto, wanted: set[str], inputs: set[str]) -> set[str]:
    """The graph inputs whose values some wanted tensor is computed from (subgraphs' captured
    tensors included; what reaches it through a Shape or Size only is its shape, which is given)."""
    producer = {o: n for n in graph.node for o in n.output if o}
    seen: set[str] = set()
    stack = list(wanted)
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        node = producer.get(t)
        if node is not None and node.op_type not in _SHAPE_ONLY:
            stack.extend(i for i in node_reads(node) if i)
    return seen & inputs


def node_reads(node: onnx.NodeProto) -> list[str]:
    """A node's inputs plus what its subgraphs (If branches, Loop bodies) read from outside."""
    import onnx

    reads = list(node.input)
    for a in node.attribute:
        for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
            produced = {i.name for i in g.input} | {t.name for t in g.initializer} | \
                       {o for n in g.node for o in n.output}
            reads.extend(i for n in g.node for i in node_reads(n) if i not in produced)
    return reads


def _downstream_of_data_dependent(graph: onnx.GraphProto, executed: set[str]) -> set[str]:
    """Tensors computed from an output of an op whose output size the data decided in this run
    (a TopK whose k is a constant has a static shape, and taints nothing)."""
    tainted = {o for n in graph.node if n.op_type in DATA_DEPENDENT_OPS for o in n.output if o in executed}
    grew = True
    while grew:  # to a fixpoint: not every exporter writes its nodes in topological order
        before = len(tainted)
        for node in graph.node:
            if any(i in tainted for i in node_reads(node)):
                tainted.update(o for o in node.output if o)
        grew = len(tainted) > before
    return tainted


def shape_notes(model: Model) -> list[str]:
    """What static inference could not give, in lines for the user: the shapes a run found, the
    sizes the data decided in it, the branch each If took and the iterations each Loop and Scan ran."""
    notes = []
    if model.executed_shapes:
        notes.append(f"{model.executed_shapes} tensor shapes found by running the model once in ONNX Runtime "
                     f"(static inference left them unknown)")
    if model.data_dependent:
        seen = ", ".join(f"{t} {'x'.join(map(str, s)) or 'scalar'}" for t, s in sorted(model.data_dependent.items()))
        notes.append(f"sizes decided by the data, as seen in this run: {seen}")
    for node, became in model.control_flow.items():
        if became in ("then", "else"):
            notes.append(f"If {node!r} took its {became} branch for these inputs (its layers are costed under "
                         f"'{node}/{became}/')")
        elif not became.startswith("stays one node"):  # "N iterations", with how they were found in brackets
            count, _, how = became.partition(" (")
            how = f"{how.rstrip(')')}; " if how else ""
            notes.append(f"{model.control_flow_ops[node]} {node!r} ran {count} for these inputs "
                         f"({how}unrolled: its layers are costed under '{node}/iter0/', '{node}/iter1/', …)")
    return notes


def execution_json(model: Model) -> dict:
    """The same for ``generate --json``: shapes found by the run, data-decided sizes, what each If,
    Loop and Scan became, and the uncosted nodes with their reasons."""
    return {"executed_shapes": model.executed_shapes,
            "data_dependent": {t: list(s) for t, s in sorted(model.data_dependent.items())},
            "control_flow": dict(model.control_flow), "control_flow_ops": dict(model.control_flow_ops),
            "control_flow_failure": model.branch_failure,
            "uncosted_nodes": [u.to_json() for u in model.uncosted]}


def uncosted_notes(model: Model) -> list[str]:
    """What is missing from the costs, and why: each node left without shapes, the bodies of If,
    Loop and Scan nodes the run could not decide, and of those that stay one node."""
    notes = []
    if model.branch_failure:
        notes.append(f"uncosted: the bodies of its If, Loop and Scan nodes, whose branches and trip counts "
                     f"cannot be found: {model.branch_failure}")
    notes.extend(f"uncosted: the body of {node!r}, which {became}"
                 for node, became in model.control_flow.items() if became.startswith("stays one node"))
    notes.extend(f"uncosted: node {u.name!r} ({u.op}): {u.reason}" for u in model.uncosted)
    return notes
