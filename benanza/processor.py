"""Model processor (paper §III-A): ONNX file → layers with concrete shapes → unique layers.

Weights are never loaded: a layer depends on weight *shapes*, which the TensorProto dims
carry, so external-data and >2 GB models are processed from their small graph proto.
Only small constant inputs whose *values* change the computation (a Reshape target, Clip
bounds, Unsqueeze axes) are materialised.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import math
import os
import signal
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from .control_flow import Inlined, inline_control_flow
from .errors import BenanzaError, ModelError, NodeError, ShapeError, UsageError
from .layers import DTYPE_NAMES, Layer, Model, Node, TensorSpec, Uncosted
from .limits import MAX_DIM, MAX_RANK
from .ops.base import NodeView
from .ops.registry import build_layer
from .scopes import node_scope, scope_source
from .shapes_by_execution import complete_by_execution

log = logging.getLogger(__name__)

# Nodes that only materialise a constant: what another exporter stores as an initializer.
_CONSTANT_MAKERS = {"ConstantOfShape", "Identity", "Cast"}


# Wall-clock budget of ONNX Runtime's symbolic shape inference (the fallback; it is pure
# Python and its cost grows with what a file claims, not with the work it describes).
SYMBOLIC_SECONDS = 60.0
# Ops whose input at this index is a shape (one element per output dim).
_SHAPE_INPUTS = {"Reshape": 1, "Expand": 1, "ConstantOfShape": 0, "Tile": 1}


def input_shapes_of(source: str | Path, batch_size: int = 1,
                    input_shapes: dict[str, tuple[int, ...]] | None = None) -> dict[str, tuple[int, ...]]:
    """The concrete shape of each real graph input by the rule ``load_model`` applies (the batch
    on its batch axis, ``input_shapes`` for the rest), without processing the graph: what a
    framework run feeds."""
    p = Path(source)
    model = read_onnx(p)
    opts = ProcessOptions(batch_size, tuple(sorted((input_shapes or {}).items())))
    return _fix_input_shapes(_shape_proxy(model), {t.name for t in model.graph.initializer}, p, opts)


@dataclass(frozen=True)
class ProcessOptions:
    batch_size: int = 1
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    # What a run for the shapes static inference leaves unknown feeds (shapes_by_execution).
    input_values: tuple[tuple[str, tuple[float, ...]], ...] = ()
    input_data: tuple[tuple[str, np.ndarray], ...] = ()
    # Replace each If by the branch taken and unroll clean Loops and Scans (control_flow); off for
    # consumers that map the Model's nodes back onto the file's own graph (check, the torch executor).
    take_branches: bool = True


def read_onnx(path: str | Path) -> onnx.ModelProto:
    """Parse the graph proto, leaving external weight data on disk."""
    p = Path(path)
    if not p.exists():
        raise ModelError(p, "no such file")
    if p.is_dir():
        raise ModelError(p, "is a directory, not an ONNX file")
    try:
        model = onnx.load(str(p), load_external_data=False)
    except Exception as exc:  # protobuf raises DecodeError, or others on truncation
        raise ModelError(p, f"not a readable ONNX model ({type(exc).__name__}: {exc})") from None
    if model.ir_version < 3 or not model.opset_import or not model.graph.node:
        raise ModelError(p, "not an ONNX model (no IR version ≥ 3, opset or graph nodes)")
    return model


def default_opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    return 0


def _fix_input_shapes(model: onnx.ModelProto, inits: set[str], path: Path,
                      opts: ProcessOptions) -> dict[str, tuple[int, ...]]:
    """Make every real graph input concrete: the batch size on its batch axis, user shapes elsewhere.

    ``inits`` are the original model's initializer names: IR < 4 lists weights as inputs too.
    """
    graph = model.graph
    given = dict(opts.input_shapes)
    real_inputs = {i.name for i in graph.input} - inits
    stray = sorted(set(given) - real_inputs)
    if stray:
        raise ShapeError(path, f"--input-shape names no graph input: {', '.join(stray)} "
                               f"(inputs: {', '.join(sorted(real_inputs)) or 'none'})")
    shapes: dict[str, tuple[int, ...]] = {}
    for inp in graph.input:
        if inp.name in inits:
            continue
        tt = inp.type.tensor_type
        if not inp.type.HasField("tensor_type"):
            raise ShapeError(path, f"input '{inp.name}' is not a tensor")
        dims = tt.shape.dim
        if inp.name in given:
            shape = given.pop(inp.name)
            if tt.HasField("shape") and len(dims) != len(shape):
                raise ShapeError(path, f"--input-shape {inp.name} has rank {len(shape)}, "
                                       f"the model's input has rank {len(dims)}")
        else:
            if not tt.HasField("shape"):
                raise ShapeError(path, f"input '{inp.name}' has no shape: give --input-shape "
                                       f"{inp.name}=D1xD2x...")
            shape_list = []
            unknown = []
            axis = batch_axis(graph, inp.name, dims, path, opts.batch_size)
            for i, d in enumerate(dims):
                if i == axis:
                    shape_list.append(opts.batch_size)
                elif d.HasField("dim_value") and d.dim_value > 0:
                    shape_list.append(d.dim_value)
                else:
                    unknown.append(d.dim_param or "?")
                    shape_list.append(-1)
            if unknown:
                shown = "x".join(
                    (d.dim_param or "?") if not d.HasField("dim_value") or d.dim_value <= 0
                    else str(d.dim_value) for d in dims)
                raise ShapeError(path, f"input '{inp.name}' has symbolic dims {shown} "
                                       f"({', '.join(unknown)} unknown): give --input-shape "
                                       f"{inp.name}=" + "x".join(
                                           str(s) if s > 0 else "N" for s in shape_list))
            shape = tuple(shape_list)
        tt.shape.ClearField("dim")
        for s in shape:
            tt.shape.dim.add().dim_value = s
        shapes[inp.name] = shape
    # Inferred shapes stored in the file may contradict the new batch: infer afresh.
    del graph.value_info[:]
    for out in graph.output:
        out.type.tensor_type.ClearField("shape")
    return shapes


# Ops whose documented layout names the batch axis of their first input: N of NCHW, or the
# batch of an RNN's sequence-first (layout 0) / batch-first (layout 1) input.
_BATCH_FIRST = {"Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool", "GlobalAveragePool",
                "GlobalMaxPool", "BatchNormalization", "InstanceNormalization", "LRN", "MaxRoiPool"}
_RNNS = {"LSTM", "GRU", "RNN"}


def batch_axis(graph: onnx.GraphProto, name: str, dims: Sequence[Any], path: Path, batch_size: int) -> int | None:
    """The axis ``--batch-size`` sets on a graph input: the one its consumers document as the
    batch (dim 0 of a Conv input, dim 1 of a sequence-first LSTM input and of its initial
    states, dim 0 of its sequence_lens), else dim 0 when that is symbolic. A concrete dim 0
    nothing documents as a batch is the model's own and stays."""
    documented = set()
    for node in graph.node:
        if node.input and node.input[0] == name and node.op_type in _BATCH_FIRST:
            documented.add(0)
        elif node.op_type in _RNNS:
            layout = next((a.i for a in node.attribute if a.name == "layout"), 0)
            # X [T, N, I] and initial_h/initial_c [D, N, H], batch first with layout 1
            documented.update(0 if layout or i == 4 else 1 for i, inp in enumerate(node.input)
                              if inp == name and i in (0, 4, 5, 6))
    if len(documented) == 1:
        return documented.pop()
    if documented:
        log.warning("%s: input '%s' is a batch on different axes for its consumers; --batch-size sets dim 0",
                    path, name)
        return 0
    if not dims:
        return None
    first = dims[0]
    if not first.HasField("dim_value") or first.dim_value <= 0:
        return 0
    if first.dim_value != batch_size:
        log.warning("%s: input '%s' has a fixed dim 0 (%d) no op documents as its batch; --batch-size %d "
                    "leaves it (give --input-shape to change it)", path, name, first.dim_value, batch_size)
    return None


# Initializers up to this many elements keep their values for shape inference: shape
# tensors, axes and scalars that data propagation needs. Larger ones are weights.
_PROXY_KEEP_ELEMENTS = 1024


def _shape_proxy(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with weights replaced by typed graph inputs of the same shape.

    Shape inference serialises the whole proto into C++ and back; for a 500 MB VGG that
    copying, not inference, is the cost. Weights only contribute their dims, so inference
    runs on this light proxy instead.
    """
    proxy = onnx.ModelProto()
    for name in ("ir_version", "producer_name", "producer_version", "domain", "model_version"):
        setattr(proxy, name, getattr(model, name))
    proxy.opset_import.extend(model.opset_import)
    proxy.functions.extend(model.functions)
    src, dst = model.graph, proxy.graph
    dst.name = src.name
    dst.node.extend(src.node)
    dst.input.extend(src.input)
    dst.output.extend(src.output)
    dst.sparse_initializer.extend(src.sparse_initializer)
    listed = {i.name for i in src.input}
    for t in src.initializer:
        numel = 1
        for d in t.dims:
            numel *= d
        if numel <= _PROXY_KEEP_ELEMENTS:
            dst.initializer.append(t)
        elif t.name not in listed:
            dst.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    if proxy.ir_version < 4:
        proxy.ir_version = 4  # IR 4 lets the kept initializers stand without a graph input
    return proxy


def _check_claimed_sizes(model: onnx.ModelProto, path: Path) -> None:
    """Refuses shape inputs and tensors whose rank no library takes, before inference
    spends minutes and gigabytes on them."""
    sizes = {t.name: math.prod(t.dims) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value":
                    sizes[node.output[0]] = math.prod(a.t.dims)
    for node in model.graph.node:
        at = _SHAPE_INPUTS.get(node.op_type)
        if at is not None and at < len(node.input) and sizes.get(node.input[at], 0) > MAX_RANK:
            raise ShapeError(path, f"node {node.name or node.op_type!r} ({node.op_type}): its shape input "
                                   f"'{node.input[at]}' has {sizes[node.input[at]]} elements, a tensor of that "
                                   f"many dims (Benanza takes at most {MAX_RANK})")
    _check_ranks(model, path)


def _check_ranks(model: onnx.ModelProto, path: Path) -> None:
    graph = model.graph
    for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
        dims = vi.type.tensor_type.shape.dim
        if len(dims) > MAX_RANK:
            raise ShapeError(path, f"tensor '{vi.name}' has {len(dims)} dims (Benanza takes at most {MAX_RANK})")
        big = [d.dim_value for d in dims if d.dim_value > MAX_DIM]
        if big:
            raise ShapeError(path, f"tensor '{vi.name}' has a dim of {big[0]} (Benanza takes at most {MAX_DIM})")


class _Expired(BaseException):
    """Raised by the alarm: a BaseException, so no ``except Exception`` inside the timed
    library code can swallow it."""


@contextlib.contextmanager
def _time_limit(seconds: float, path: Path, what: str) -> Iterator[None]:
    """Raises ShapeError when the block runs past ``seconds`` (main thread only: elsewhere
    Python offers no way to interrupt it, and the block runs unbounded)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: object) -> None:
        raise _Expired()

    previous = signal.signal(signal.SIGALRM, expire)
    started = time.monotonic()
    try:
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        if time.monotonic() - started > seconds:  # the alarm landed in a bare ``except:`` that swallowed it
            raise _Expired()
    except _Expired:  # also an alarm landing between the block's end and the timer's reset
        raise ShapeError(path, f"{what} took longer than {seconds:g}s; the model's shapes are too "
                               f"irregular to resolve (give concrete shapes with --input-shape)") from None
    finally:
        signal.signal(signal.SIGALRM, previous)


def _needed(graph: onnx.GraphProto) -> set[str]:
    """Tensors whose shape matters: those a node consumes and the graph outputs. An optional
    output nothing reads (an old Dropout's mask) may stay unknown."""
    return {i for n in graph.node for i in n.input if i} | {o.name for o in graph.output}


def _unknown_outputs(model: onnx.ModelProto) -> int:
    graph = model.graph
    known = {vi.name for vi in list(graph.input) + list(graph.value_info) + list(graph.output)
             if _tensor_spec(vi) is not None} | {t.name for t in graph.initializer}
    needed = _needed(graph)
    return sum(1 for n in graph.node for o in n.output if o and o in needed and o not in known)


def inferred_shapes(model: onnx.ModelProto, path: Path, input_shapes: dict[str, tuple[int, ...]]
                    ) -> dict[str, tuple[int, ...]]:
    """The concrete shapes ONNX shape inference gives ``model``'s tensors at these input shapes ({}
    where it refuses the graph): what a Scan's trip count needs before its body is inlined, so that
    a run is made, and its deciding inputs asked for, only where shapes depend on values. The full
    inference (folding, symbolic) runs once, on the inlined graph."""
    proxy = _shape_proxy(model)
    _fix_input_shapes(proxy, {t.name for t in model.graph.initializer}, path,
                      ProcessOptions(input_shapes=tuple(sorted(input_shapes.items()))))
    try:
        graph = _onnx_infer(proxy).graph
    except Exception:  # noqa: BLE001 - ONNX's inference errors have no common type; the run decides instead
        return {}
    specs = ((vi.name, _tensor_spec(vi)) for vi in list(graph.value_info) + list(graph.output))
    return {name: spec.shape for name, spec in specs if spec is not None}


def _onnx_infer(model: onnx.ModelProto) -> onnx.ModelProto:
    return onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=True, data_prop=True)


def _infer_shapes(model: onnx.ModelProto, path: Path) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """ONNX shape inference with data propagation, then folding of the static subgraphs (shape
    arithmetic on concrete shapes and constants) that data propagation does not evaluate, then
    ONNX Runtime's symbolic inference where shapes are still unknown (ops ONNX does not know,
    e.g. com.microsoft contrib ops). Returns the inferred model and the folded values."""
    problem = ""
    folded: dict[str, np.ndarray] = {}
    inferred: onnx.ModelProto | None
    try:
        inferred = _onnx_infer(model)
        _check_ranks(inferred, path)
    except ShapeError:
        raise
    except Exception as exc:
        inferred = None
        problem = _first_line(exc)
        log.info("%s: ONNX shape inference failed (%s); trying symbolic inference", path, problem)
    if inferred is not None:
        unknown = _unknown_outputs(inferred)
        while unknown:
            values = _static_values(model, inferred, folded, path)
            if len(values) == len(folded):
                break
            candidate = _with_values(model, values)
            try:
                again = _onnx_infer(candidate)
            except Exception as exc:  # keep what the previous round found
                log.info("%s: shape inference after folding failed (%s)", path, _first_line(exc))
                break
            if _unknown_outputs(again) >= unknown:
                break
            model, inferred, folded, unknown = candidate, again, values, _unknown_outputs(again)
        if unknown == 0:
            return inferred, folded
    symbolic = None
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

        # On incomplete inference it dumps a model into the working directory: give it a
        # scratch one so the user's folder is never littered.
        # It logs and prints (not raises) why it gives up, and returns None, for opsets before 7:
        # the reason goes into Benanza's one error line instead.
        # Its shape arithmetic on numpy scalars wraps around on overflow (a Tile by 2^62 gave a dim
        # of 0), with only a RuntimeWarning on the user's terminal: numpy raises instead, which
        # fails this round like any of its errors; its other warnings are no business of the user's.
        with tempfile.TemporaryDirectory() as scratch, _working_dir(scratch), \
                contextlib.redirect_stdout(io.StringIO()), _quiet("onnxruntime.tools.symbolic_shape_infer"), \
                warnings.catch_warnings(), np.errstate(over="raise", divide="raise", invalid="raise"), \
                _time_limit(SYMBOLIC_SECONDS, path, "symbolic shape inference"):
            warnings.simplefilter("ignore")
            symbolic = SymbolicShapeInference.infer_shapes(model, auto_merge=True)
        if symbolic is not None:
            _check_ranks(symbolic, path)
        problem_sym = "" if symbolic is not None else \
            f"it needs opset ≥ 7, the model has {default_opset(model)}"
    except ShapeError:
        raise
    except Exception as exc:
        problem_sym = _first_line(exc)
    if symbolic is None:
        if inferred is None:
            raise ShapeError(path, f"shape inference failed: {problem}; symbolic inference also "
                                   f"failed: {problem_sym}") from None
        return inferred, folded  # the unknown shapes are reported node by node
    if inferred is None or _unknown_outputs(symbolic) < _unknown_outputs(inferred):
        return symbolic, folded
    return inferred, folded


# Folded values are shape arithmetic: small tensors. Anything bigger is data and stays a layer
# input whose value nobody needs.
_STATIC_MAX_ELEMENTS = 4096
# Ops whose output is not a function of their inputs, or that hold subgraphs: never folded.
_UNFOLDABLE = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
               "Bernoulli", "If", "Loop", "Scan", "SequenceMap"}


def _static_values(model: onnx.ModelProto, inferred: onnx.ModelProto,
                   known: dict[str, np.ndarray], path: Path) -> dict[str, np.ndarray]:
    """Values of every tensor computable without the model's inputs' data: small initializers,
    Constant nodes, Shape/Size of tensors whose shape inference made concrete, and every node
    over those (evaluated with ONNX's reference evaluator, node by node)."""
    from onnx.reference import ReferenceEvaluator

    graph = model.graph
    opset = default_opset(model)
    shapes = {}
    for vi in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output):
        spec = _tensor_spec(vi)
        if spec is not None:
            shapes[vi.name] = spec.shape
    values = dict(known)
    for t in graph.initializer:
        if math.prod(t.dims) <= _STATIC_MAX_ELEMENTS and t.data_location != onnx.TensorProto.EXTERNAL:
            with contextlib.suppress(*_DECODE_ERRORS):  # unreadable: not folded; refused if an op reads it
                values.setdefault(t.name, numpy_helper.to_array(t))
    order = _topological(list(graph.node), {i.name for i in graph.input} | {t.name for t in graph.initializer},
                         path)
    for node in order:
        outs = [o for o in node.output if o]
        if not outs or all(o in values for o in outs):
            continue
        if node.domain not in ("", "ai.onnx") or node.op_type in _UNFOLDABLE:
            continue
        ins = [i for i in node.input if i]
        result: list[np.ndarray] | None = None
        if node.op_type in ("Shape", "Size") and ins and ins[0] in shapes:
            dims = shapes[ins[0]]
            if node.op_type == "Size":
                result = [np.array(math.prod(dims), np.int64)]
            else:
                attrs = attrs_with_defaults(node, opset)
                start, end = int(attrs.get("start", 0)), attrs.get("end")
                result = [np.array(dims[start:None if end is None else int(end)], np.int64)]
        elif all(i in values for i in ins) and all(values[i].size <= _STATIC_MAX_ELEMENTS for i in ins):
            try:
                run = ReferenceEvaluator(node, opsets={"": opset}).run(
                    None, {i: values[i] for i in ins})
                result = [np.asarray(r) for r in run]
            except Exception as exc:  # an op the evaluator lacks: its shape stays for inference to find
                log.debug("cannot fold %s (%s): %s", node.name or node.op_type, node.op_type, exc)
        if result is None or any(r.size > _STATIC_MAX_ELEMENTS or r.dtype == object for r in result):
            continue
        for name, r in zip(node.output, result):
            if name:
                values[name] = r
    return values


def _with_values(model: onnx.ModelProto, values: dict[str, np.ndarray]) -> onnx.ModelProto:
    """The proxy with every node whose outputs are all folded replaced by initializers."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    have = {t.name for t in model.graph.initializer}
    added = set()
    for node in model.graph.node:
        outs = [o for o in node.output if o]
        if outs and all(o in values for o in outs):
            for o in outs:
                if o not in have and o not in added:
                    out.graph.initializer.append(numpy_helper.from_array(values[o], o))
                    added.add(o)
        else:
            out.graph.node.append(node)
    del out.graph.value_info[:]
    return out


@contextlib.contextmanager
def _quiet(logger_name: str) -> Iterator[None]:
    logger = logging.getLogger(logger_name)
    old = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(old)


@contextlib.contextmanager
def _working_dir(path: str) -> Iterator[None]:
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _tensor_spec(vi: onnx.ValueInfoProto) -> TensorSpec | None:
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
        return None
    dims = []
    for d in tt.shape.dim:
        if not d.HasField("dim_value") or d.dim_value < 0:
            return None
        dims.append(d.dim_value)
    return TensorSpec(tuple(dims), DTYPE_NAMES.get(tt.elem_type, str(tt.elem_type)))


# What numpy_helper.to_array raises on a tensor whose bytes disagree with its dims or type
# (ValueError), whose type is undefined (TypeError) or unknown (KeyError), or whose external
# data file is missing (OSError).
_DECODE_ERRORS = (ValueError, TypeError, KeyError, OSError)


class _Constants:
    """Constant tensors of a graph: their specs, and their values on demand."""

    def __init__(self, graph: onnx.GraphProto, base_dir: str, path: Path):
        self.base_dir = base_dir
        self.path = path
        self.specs: dict[str, TensorSpec] = {}
        self._thunks: dict[str, Callable[[], np.ndarray]] = {}
        self._cache: dict[str, np.ndarray] = {}
        for t in graph.initializer:
            self._add_tensor(t.name, t)
        for t in graph.sparse_initializer:
            self.specs[t.values.name] = TensorSpec(tuple(t.dims), DTYPE_NAMES.get(t.values.data_type, "f32"))

    def _add_tensor(self, name: str, t: onnx.TensorProto) -> None:
        self.specs[name] = TensorSpec(tuple(t.dims), DTYPE_NAMES.get(t.data_type, str(t.data_type)))
        self._thunks[name] = lambda: self._read(name, t)

    def _read(self, name: str, t: onnx.TensorProto) -> np.ndarray:
        try:
            return numpy_helper.to_array(t, self.base_dir)
        except _DECODE_ERRORS as exc:
            raise ModelError(self.path, f"tensor '{name}' ({_dims(t.dims)}): its data cannot "
                                        f"be read ({type(exc).__name__}: {_first_line(exc)})") from None

    def __contains__(self, name: str) -> bool:
        return name in self.specs

    def value(self, name: str) -> np.ndarray:
        if name not in self._cache:
            self._cache[name] = self._thunks[name]()
        return self._cache[name]

    def thunk(self, name: str) -> Callable[[], np.ndarray] | None:
        return (lambda: self.value(name)) if name in self._thunks else None

    def fold(self, node: onnx.NodeProto) -> bool:
        """Record the node's output as a constant if it only materialises one."""
        if node.op_type == "Constant":
            attr = node.attribute[0] if node.attribute else None
            if attr is None:
                return False
            if attr.name == "value":
                self._add_tensor(node.output[0], attr.t)
            elif attr.name == "sparse_value":
                v = attr.sparse_tensor.values
                self.specs[node.output[0]] = TensorSpec(tuple(attr.sparse_tensor.dims),
                                                        DTYPE_NAMES.get(v.data_type, "f32"))
            else:
                arr = np.array(onnx.helper.get_attribute_value(attr))
                if attr.name.endswith("_string") or attr.name.endswith("_strings"):
                    arr = arr.astype(object)
                elif attr.name.startswith("value_float"):
                    arr = arr.astype(np.float32)
                else:
                    arr = arr.astype(np.int64)
                self._set(node.output[0], arr)
            return True
        if node.op_type not in _CONSTANT_MAKERS:
            return False
        ins = [i for i in node.input if i]
        if not ins or not all(i in self for i in ins):
            return False
        out = node.output[0]
        src = ins[0]
        if node.op_type == "Identity":
            self.specs[out] = self.specs[src]
            self._thunks[out] = lambda: self.value(src)
        elif node.op_type == "Cast":
            to = next(a.i for a in node.attribute if a.name == "to")
            np_type = onnx.helper.tensor_dtype_to_np_dtype(to)
            self.specs[out] = TensorSpec(self.specs[src].shape, DTYPE_NAMES.get(to, str(to)))
            self._thunks[out] = lambda: self.value(src).astype(np_type)
        else:  # ConstantOfShape: the shape is a constant, so the result is too
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            fill = numpy_helper.to_array(value) if value is not None else np.zeros(1, np.float32)
            shape = tuple(int(d) for d in self.value(src).reshape(-1))
            if len(shape) > MAX_RANK or any(d < 0 or d > MAX_DIM for d in shape):
                raise ModelError(self.path, f"node {node.name or node.op_type!r} (ConstantOfShape): shape {shape[:8]} "
                                     f"is not a tensor Benanza takes (at most {MAX_RANK} dims of at most {MAX_DIM})")
            # Only the spec is needed unless an op reads the values: a huge fill is never built.
            dtype = onnx.helper.np_dtype_to_tensor_dtype(fill.dtype)
            self.specs[out] = TensorSpec(shape, DTYPE_NAMES.get(dtype, str(dtype)))
            self._thunks[out] = lambda: np.full(shape, fill.reshape(-1)[0], dtype=fill.dtype)
        return True

    def _set(self, name: str, arr: np.ndarray) -> None:
        dtype = onnx.helper.np_dtype_to_tensor_dtype(arr.dtype) if arr.dtype != object else 8
        self.specs[name] = TensorSpec(tuple(arr.shape), DTYPE_NAMES.get(dtype, str(dtype)))
        self._cache[name] = arr
        self._thunks[name] = lambda: arr


_SCHEMA_DEFAULTS: dict[tuple[str, str, int], dict[str, Any]] = {}


def attrs_with_defaults(node: onnx.NodeProto, opset: int) -> dict[str, Any]:
    """Node attributes with ONNX's defaults filled in, so omitted == explicit default."""
    key = (node.domain, node.op_type, opset)
    defaults = _SCHEMA_DEFAULTS.get(key)
    if defaults is None:
        defaults = {}
        try:
            schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
            for name, a in schema.attributes.items():
                if a.default_value is not None and a.default_value.type != 0:
                    defaults[name] = onnx.helper.get_attribute_value(a.default_value)
        except onnx.defs.SchemaError:
            pass  # ops of custom domains have no schema: their attributes stand as written
        _SCHEMA_DEFAULTS[key] = defaults
    attrs = dict(defaults)
    for a in node.attribute:
        attrs[a.name] = onnx.helper.get_attribute_value(a)
    return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in attrs.items()}


def _topological(nodes: list[onnx.NodeProto], available: set[str], path: Path) -> list[onnx.NodeProto]:
    """ONNX requires topological order, but not every exporter delivers it."""
    produced = set(available)
    ordered_ok = True
    for n in nodes:
        if any(i and i not in produced for i in n.input):
            ordered_ok = False
            break
        produced.update(n.output)
    if ordered_ok:
        return nodes
    pending = list(nodes)
    produced = set(available)
    out: list[onnx.NodeProto] = []
    while pending:
        rest = [n for n in pending if any(i and i not in produced for i in n.input)]
        ready = [n for n in pending if n not in rest]
        if not ready:
            missing = sorted({i for n in rest for i in n.input if i and i not in produced})
            raise ModelError(path, f"graph has a cycle or undefined tensors: {', '.join(missing[:5])}")
        for n in ready:
            produced.update(n.output)
        out.extend(ready)
        pending = rest
    return out


def load_model(source: str | Path | onnx.ModelProto, batch_size: int = 1,
               input_shapes: dict[str, tuple[int, ...]] | None = None,
               name: str | None = None, input_values: dict[str, tuple[float, ...]] | None = None,
               input_data: dict[str, np.ndarray] | None = None, take_branches: bool = True) -> Model:
    """Process one ONNX file (or an in-memory ModelProto, left unchanged) into a Model whose
    every layer has concrete shapes. ``input_values`` and ``input_data`` (whose arrays also give
    their inputs' shapes, unless ``input_shapes`` does) feed the run made when static inference
    leaves shapes unknown; a node still without shapes is left uncosted, with the reason."""
    if isinstance(source, onnx.ModelProto):
        p = Path(name or "<in-memory model>")
        model = source
    else:
        p = Path(source)
        model = read_onnx(p)
    if not 1 <= batch_size <= MAX_DIM:
        raise UsageError(f"--batch-size must be between 1 and {MAX_DIM}, got {batch_size}")
    data = input_data or {}
    if data:
        real = {i.name for i in model.graph.input} - {t.name for t in model.graph.initializer}
        input_shapes = {**{n: tuple(a.shape) for n, a in data.items() if n in real}, **(input_shapes or {})}
    opts = ProcessOptions(batch_size, tuple(sorted((input_shapes or {}).items())),
                          tuple(sorted((input_values or {}).items())), tuple(sorted(data.items())),
                          take_branches)
    try:
        return _process(model, p, opts, name)
    except UnicodeDecodeError:  # protobuf decodes a string field on first access
        raise ModelError(p, "a name or string in the model is not valid UTF-8 (corrupt file?)") from None


def _check_utf8(graph: onnx.GraphProto, p: Path) -> None:
    """protobuf hands a string field that is not UTF-8 over as bytes, which would travel into
    the manifest, the database and the terminal as something else than a name."""
    named = [(f"node {i}", n.name, n.op_type, n.domain, *n.input, *n.output) for i, n in enumerate(graph.node)]
    named += [("a graph input, output or weight", t.name)
              for t in [*graph.input, *graph.output, *graph.initializer, *graph.value_info]]
    for where, *strings in named:
        bad = next((s for s in strings if isinstance(s, bytes)), None)
        if bad is not None:
            raise ModelError(p, f"{where} has a name that is not valid UTF-8: {bad!r}")


def _process(model: onnx.ModelProto, p: Path, opts: ProcessOptions, name: str | None) -> Model:
    batch_size = opts.batch_size
    _check_utf8(model.graph, p)
    opset = default_opset(model)
    if opset < 1:
        raise ModelError(p, "model imports no default-domain opset")
    # Newer than the installed ONNX knows: its operators' meaning (and shapes) are unknown here.
    if opset > onnx.defs.onnx_opset_version():
        raise ModelError(p, f"opset {opset} is newer than the installed ONNX {onnx.__version__} knows "
                            f"(at most {onnx.defs.onnx_opset_version()})")
    if model.ir_version > onnx.IR_VERSION:
        raise ModelError(p, f"IR version {model.ir_version} is newer than the installed ONNX {onnx.__version__} "
                            f"reads (at most {onnx.IR_VERSION})")
    _check_claimed_sizes(model, p)
    proxy = _shape_proxy(model)
    in_shapes = _fix_input_shapes(proxy, {t.name for t in model.graph.initializer}, p, opts)
    inlined = Inlined(model, (), "", frozenset())
    if opts.take_branches:
        inlined = inline_control_flow(model, p, in_shapes, dict(opts.input_values), dict(opts.input_data),
                                      inferred_shapes)
    model, taken = inlined.model, inlined.taken
    if taken:  # the taken branches' nodes are now the graph's own
        _check_claimed_sizes(model, p)
        proxy = _shape_proxy(model)
        _fix_input_shapes(proxy, {t.name for t in model.graph.initializer}, p, opts)
    inferred_model, folded = _infer_shapes(proxy, p)
    inferred = inferred_model.graph
    specs: dict[str, TensorSpec] = {}
    for tensor_name, arr in folded.items():
        dtype = onnx.helper.np_dtype_to_tensor_dtype(arr.dtype)
        specs[tensor_name] = TensorSpec(tuple(arr.shape), DTYPE_NAMES.get(dtype, str(dtype)))
    for vi in list(inferred.input) + list(inferred.value_info) + list(inferred.output):
        s = _tensor_spec(vi)
        if s is not None:
            specs[vi.name] = s

    needed = _needed(model.graph)
    executed = complete_by_execution(model, p, in_shapes, specs, needed, dict(opts.input_values),
                                     dict(opts.input_data))
    specs.update(executed.specs)
    consts = _Constants(model.graph, os.path.dirname(os.path.abspath(p)), p)
    order = _topological(list(model.graph.node), set(in_shapes) | set(consts.specs), p)
    uncosted: list[Uncosted] = []
    unshaped: dict[str, str] = {}  # tensor without a shape → the uncosted node that writes it
    nodes: list[Node] = []
    edges: list[tuple[int, int]] = []
    producer: dict[str, int] = {}
    interned: dict[str, Layer] = {}
    static: set[str] = set()  # outputs that are constants given the input shapes
    scopes = scope_source(order, model.functions)
    for proto in order:
        if consts.fold(proto):
            continue
        index = len(nodes)
        node_name = proto.name or f"{proto.op_type}_{index}"
        try:
            view = _node_view(proto, opset, specs, consts, needed)
        except _NoShape as exc:  # the rest of the model is still costed
            upstream = next((unshaped[t] for t in proto.input if t in unshaped), None)
            reason = f"it reads the output of uncosted node {upstream!r}" if upstream else \
                "; ".join(filter(None, (str(exc), executed.failure)))
            uncosted.append(Uncosted(node_name, proto.op_type, reason))
            unshaped.update((t, node_name) for t in proto.output if t and t not in specs)
            continue
        _check_input_types(proto, view.inputs, opset, p, node_name)
        try:
            layer = build_layer(view)
        except NodeError as exc:
            raise ModelError(p, f"node {node_name!r} ({proto.op_type}): {exc}") from None
        except BenanzaError:
            raise
        except Exception:
            _blame_node(proto, lambda t: consts.specs.get(t) or specs.get(t), opset, p, node_name)
            raise  # ONNX accepts the node: the op code that failed on it is at fault
        layer = interned.setdefault(layer.key, layer)
        constant = _constant_given_shapes(proto, lambda t: t in consts or t in static)
        if constant:  # a free view of a constant is one too
            static.update(o for o in proto.output if o)
        data_in = tuple(i for i in proto.input if i and i not in consts)
        for t in data_in:
            if t in producer and producer[t] != index:
                edges.append((producer[t], index))
        for t in proto.output:
            if t:
                producer[t] = index
        in_place = proto.name in inlined.in_place
        nodes.append(Node(index, node_name, layer, data_in, tuple(o for o in proto.output if o),
                          tuple(i for i in proto.input if i and i in consts),
                          tuple(s for s, c in zip(view.inputs, view.constant) if c and s is not None),
                          constant and not (layer.free or in_place), node_scope(proto, scopes, model.functions),
                          in_place))
    if uncosted and not nodes:
        first = uncosted[0]
        raise ShapeError(p, f"no node can be costed: node {first.name!r} ({first.op}): {first.reason}")
    data_dependent = {t: s.shape for t, s in executed.specs if t in executed.data_dependent}
    return Model(name=name or p.stem, path=str(p), nodes=nodes, edges=sorted(set(edges)),
                 input_shapes=in_shapes, batch_size=batch_size, opset=opset, scope_source=scopes, uncosted=uncosted,
                 executed_shapes=len(executed.specs), data_dependent=data_dependent,
                 control_flow={b.node: b.branch for b in taken}, control_flow_ops={b.node: b.op for b in taken},
                 branch_failure=inlined.failure,
                 external_data=any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer))


def _dims(shape: Sequence[int]) -> str:
    return "x".join(map(str, shape)) or "scalar"


_ELEM_TYPES = {name: elem for elem, name in DTYPE_NAMES.items()}


@functools.cache
def _formal_inputs(op_type: str, opset: int) -> tuple[tuple[frozenset[str], bool], ...]:
    """The element types each formal input of a standard op takes, and whether it is variadic;
    () when ONNX does not define the op. Read from the schema once per op: a model repeats its
    ops hundreds of times, and ONNX builds the schema's Python objects anew on every call."""
    if not onnx.defs.has(op_type, opset):
        return ()
    schema = onnx.defs.get_schema(op_type, opset)
    allowed = {c.type_param_str: frozenset(c.allowed_type_strs) for c in schema.type_constraints}
    variadic = onnx.defs.OpSchema.FormalParameterOption.Variadic
    return tuple((allowed.get(f.type_str, frozenset({f.type_str})), f.option == variadic) for f in schema.inputs)


def _check_input_types(proto: onnx.NodeProto, inputs: Sequence[TensorSpec | None], opset: int, path: Path,
                       name: str) -> None:
    """Refuses an input of an element type the op's schema does not allow (a Conv on strings or
    booleans): shape inference runs without type checks, which real exporters' value_info fails,
    so nothing else stops such a node before its benchmark fails at run time."""
    if proto.domain not in ("", "ai.onnx"):
        return
    formals = _formal_inputs(proto.op_type, opset)
    if not formals:
        return
    for i, spec in enumerate(inputs):
        types, variadic = formals[min(i, len(formals) - 1)]
        if i >= len(formals) and not variadic:
            return  # more inputs than the op has: ONNX's checker words that (_blame_node)
        if spec is None or spec.dtype not in _ELEM_TYPES:
            continue
        elem = onnx.TensorProto.DataType.Name(_ELEM_TYPES[spec.dtype]).lower()
        if f"tensor({elem})" not in types:
            takes = ", ".join(t[len("tensor("):-1] for t in sorted(types) if t.startswith("tensor("))
            raise ModelError(path, f"node {name!r} ({proto.op_type}): input {i} '{proto.input[i]}' is {elem}, "
                                   f"which {proto.op_type} does not take (it takes {takes})")


def _blame_node(proto: onnx.NodeProto, spec_of: Callable[[str], TensorSpec | None], opset: int, path: Path,
                name: str) -> None:
    """Raises a ModelError when ONNX itself finds the node invalid: its checker (input counts,
    attribute types) or its shape inference of this one node on the concrete input shapes
    (weights whose rank does not fit the input, outputs of another shape than inferred).
    Returns when ONNX accepts the node, or does not define its op."""
    if proto.domain not in ("", "ai.onnx") or not onnx.defs.has(proto.op_type, opset):
        return
    ctx = onnx.checker.C.CheckerContext()
    ctx.ir_version = onnx.IR_VERSION
    ctx.opset_imports = {"": opset}
    types = {}
    for t in proto.input:
        spec = spec_of(t) if t else None
        if spec is not None and spec.dtype in _ELEM_TYPES:
            types[t] = onnx.helper.make_tensor_type_proto(_ELEM_TYPES[spec.dtype], spec.shape)
    try:
        onnx.checker.check_node(proto, ctx)
        inferred = onnx.shape_inference.infer_node_outputs(
            onnx.defs.get_schema(proto.op_type, opset), proto, types,
            opset_imports=[onnx.helper.make_opsetid("", opset)])
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise ModelError(path, f"node {name!r} ({proto.op_type}): {_first_line(exc)}") from None
    for t, tp in inferred.items():
        spec = _tensor_spec(onnx.helper.make_value_info(t, tp))
        had = spec_of(t)
        if spec is not None and had is not None and spec.shape != had.shape:
            raise ModelError(path, f"node {name!r} ({proto.op_type}): output '{t}' is "
                                   f"{_dims(had.shape)} in the graph, ONNX infers "
                                   f"{_dims(spec.shape)} from the node's inputs")


def _constant_given_shapes(proto: onnx.NodeProto, constant: Callable[[str], bool]) -> bool:
    """Whether the node's outputs are constants once the input shapes are fixed: a Shape or Size
    (every shape is concrete here), or a deterministic standard op over constants and such
    outputs. Whatever their size, a framework computes them once, at load time."""
    if proto.domain not in ("", "ai.onnx") or proto.op_type in _UNFOLDABLE:
        return False
    if proto.op_type in ("Shape", "Size"):
        return True
    ins = [i for i in proto.input if i]
    return bool(ins) and all(constant(i) for i in ins)


class _NoShape(Exception):
    """A tensor of the node has no concrete shape: the node is left uncosted, not the model refused."""


def _node_view(proto: onnx.NodeProto, opset: int, specs: dict[str, TensorSpec],
               consts: _Constants, needed: set[str]) -> NodeView:
    inputs: list[TensorSpec | None] = []
    constant: list[bool] = []
    values = {}
    for i, t in enumerate(proto.input):
        if not t:
            inputs.append(None)
            constant.append(False)
            continue
        spec = consts.specs.get(t) or specs.get(t)
        if spec is None:
            raise _NoShape(f"input '{t}' has no concrete shape (static inference and execution left it unknown, "
                           f"or its producer is uncosted)")
        inputs.append(spec)
        constant.append(t in consts)
        thunk = consts.thunk(t)
        if thunk is not None:
            values[i] = thunk
    outputs = []
    for t in proto.output:
        if not t:
            continue
        spec = specs.get(t)
        if spec is None and t not in needed:
            continue  # an optional output nothing reads: not computed, its shape does not matter
        if spec is None:
            raise _NoShape(f"output '{t}' has no concrete shape after static inference or execution")
        outputs.append(spec)
    opset_for_node = opset if proto.domain in ("", "ai.onnx") else 1
    return NodeView(op=proto.op_type, inputs=tuple(inputs), outputs=tuple(outputs),
                    attrs=attrs_with_defaults(proto, opset_for_node), values=values,
                    constant=tuple(constant), opset=opset)
