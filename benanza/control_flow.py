"""Control flow the processor can cost, found by ONNX Runtime runs (``shapes_by_execution.run_once``):

- each ``If`` is replaced by the branch its condition takes for the given inputs;
- each ``Loop`` is unrolled: its body once per iteration, with the iteration's number, the
  condition each iteration computes fed to the next (and otherwise ignored), and its scan outputs
  stacked as ONNX Runtime's Loop stacks them (a Concat of the iterations' outputs, a copy). Its trip
  count is its M input where the condition starts true and the body passes it through unchanged;
  else (a while or generation loop, which stops on a condition it computes) the count the run saw:
  the run's copy of the model gives the Loop one more scan output, the body's iteration number,
  whose length is the number of iterations ONNX Runtime ran. A Loop of more than ``MAX_TRIPS``
  iterations stays one node, and says why;
- each ``Scan`` (opset 9 and later) is unrolled the same way, its trip count the length of its
  scan inputs (from static shape inference, else from the run): iteration i reads slice i of each
  scan input (from the end when that input's direction is reverse) with a ``Gather`` of a scalar
  index, and its scan outputs are stacked on their axes (prepended when reverse) by a Concat.
  Where the slice is one block of memory (axis 0, or every axis before it of size 1) the Gather
  and the Concat are marked ``in_place``: they move no data, as ONNX Runtime's Scan reads axis-0
  slices of its inputs and writes its body's outputs into axis-0 slices of its outputs in place.
  Other slices are copies, as ONNX Runtime transposes such an input (or output) whole. Opset 8's
  batched Scan stays one node.

The inlined nodes join the main graph under path names (``If_1/then/Conv_3``,
``Loop_0/iter2/Add_1``, ``Scan_0/iter2/Add_1``, nested: ``If_28/else/If_4/else/Div_0``), their
internal tensors and weights renamed the same way, so they get shapes, keys and costs like any
other layer and join the dedup.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .shapes_by_execution import run_once

log = logging.getLogger(__name__)

# Each round inlines the If, Loop and Scan nodes of the graph as it is then; a body holding one needs another.
MAX_NESTING = 16
# Past this many iterations a Loop or Scan is left as one node: unrolled, its graph would grow past what
# is worth processing for a lower bound (and a generation loop of that length is not "clean").
MAX_TRIPS = 256


@dataclass(frozen=True)
class TakenBranch:
    node: str  # the If's, Loop's or Scan's path name
    branch: str  # "then" or "else"; for a Loop or Scan: "N iterations", or why it stays one node
    op: str  # "If", "Loop" or "Scan": what the report calls the node


@dataclass(frozen=True)
class Inlined:
    """What ``inline_control_flow`` made of a model."""

    model: onnx.ModelProto  # the input model itself when nothing was inlined
    taken: tuple[TakenBranch, ...]  # what each If, Loop and Scan became
    failure: str  # why the run deciding them could not be made; "" when it could
    # Names of the nodes the unrolling made that move no data although their op copies in general:
    # a Scan's Gather of a contiguous slice of a scan input, its Concat of contiguous slices of a
    # scan output. The processor costs them as free views.
    in_place: frozenset[str]


@dataclass(frozen=True)
class _Stacking:
    """How one scan output of a Loop or Scan stacks its iterations' values."""

    axis: int  # the new axis, of the stacked rank
    prepend: bool  # last iteration first (a Scan's reverse scan_output_directions)
    in_place: bool  # each iteration writes its value into its slice of the output: the Concat moves nothing


_LOOPS = ("Loop", "Scan")


Shapes = dict[str, tuple[int, ...]]


def inline_control_flow(model: onnx.ModelProto, path: Path, input_shapes: Shapes,
                        values: dict[str, tuple[float, ...]], data: dict[str, np.ndarray],
                        inferred: Callable[[onnx.ModelProto, Path, Shapes], Shapes]) -> Inlined:
    """``model`` with every default-domain If replaced by the branch taken and every clean Loop
    and Scan unrolled (a copy when any is), what each became, why the run that decides them could
    not be made, and which of the nodes made move no data. ``inferred`` gives the static shapes of
    a graph's tensors at the input shapes (the processor's ``inferred_shapes``)."""
    taken: list[TakenBranch] = []
    in_place: set[str] = set()
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    left: set[str] = set()  # Loops and Scans already found not clean: not asked about again
    for _ in range(MAX_NESTING):
        nodes = list(model.graph.node)
        flow = {i: n for i, n in enumerate(nodes) if n.domain in ("", "ai.onnx")
                and (n.op_type == "If" or n.op_type in _LOOPS and _name(n, i) not in left)}
        if not flow:
            break
        # Shapes known without a run: a Scan's trip count needs a run only where its length depends
        # on values (a run would also ask for every small integer input upstream, token ids too).
        static = {**input_shapes, **{t.name: tuple(int(d) for d in t.dims) for t in model.graph.initializer}}
        if any(t not in static for i, n in flow.items() if n.op_type == "Scan"
               for t in _deciding(n, _name(n, i), static, opset)):
            static = {**inferred(model, path, input_shapes), **static}
        wanted = {t for i, n in flow.items() for t in _deciding(n, _name(n, i), static, opset) if t}
        found: dict[str, np.ndarray] = {}
        if wanted:
            found, failure = run_once(_counted(model, flow), path, input_shapes, wanted, values, data)
            if failure:
                log.warning("%s: the branches and trip counts of its control flow cannot be found (%s); "
                            "their bodies are not costed", path, failure)
                return Inlined(model, tuple(taken), failure, frozenset(in_place))
        out = onnx.ModelProto()
        out.CopyFrom(model)
        del out.graph.node[:]
        before = len(taken)
        for i, node in enumerate(nodes):
            inlined = None
            if i in flow and node.op_type == "If":
                inlined = _taken_branch(node, _name(node, i), found, out.graph, taken)
            elif i in flow:
                inlined = _unrolled(node, _name(node, i), found, static, out.graph, taken, left, opset, in_place)
            out.graph.node.extend(inlined if inlined is not None else [node])
        if len(taken) == before:  # the run gave nothing to inline
            break
        model = out
    return Inlined(model, tuple(taken), "", frozenset(in_place))


def _name(node: onnx.NodeProto, index: int) -> str:
    return node.name or f"{node.op_type}_{index}"


def _deciding(node: onnx.NodeProto, name: str, static: Shapes, opset: int) -> list[str]:
    """The tensors whose values the run must give to decide the node: an If's condition, a
    Loop's trip count and condition (where the body passes the condition through; else its count of
    iterations, ``_counted``), the scan inputs of a Scan whose length is not static (none for opset
    8's Scan, which stays one node)."""
    if node.op_type == "If":
        return list(node.input[:1])
    if node.op_type == "Loop":
        return list(node.input[:2]) if _counts_m(node) else [_count_name(name)]
    return [t for t in _scan_inputs(node) if t not in static] if opset >= 9 else []


def _body(node: onnx.NodeProto) -> onnx.GraphProto | None:
    return next((a.g for a in node.attribute if a.name == "body"), None)


def _counts_m(node: onnx.NodeProto) -> bool:
    """Whether the Loop's trip count is its M input alone: M and a starting condition are given and
    the body passes the condition through unchanged."""
    body = _body(node)
    if body is None or len(node.input) < 2 or not node.input[0] or not node.input[1] or len(body.input) < 2 \
            or not body.output:
        return False
    cond_in, cond_out = body.input[1].name, body.output[0].name
    return cond_out == cond_in or any(n.op_type == "Identity" and list(n.input) == [cond_in]
                                      and list(n.output) == [cond_out] for n in body.node)


def _has_counter(node: onnx.NodeProto) -> bool:
    body = _body(node)
    return body is not None and len(body.input) >= 2


def _count_name(name: str) -> str:
    """The extra scan output of the Loop ``name`` in the run's copy: one element per iteration run."""
    return f"{name}/iterations_seen"


def _counted(model: onnx.ModelProto, flow: dict[int, onnx.NodeProto]) -> onnx.ModelProto:
    """The model to run (``model`` itself where no Loop needs counting): each Loop of ``flow`` that
    stops on a condition it computes gets one more scan output, its body's iteration number, whose
    length is then exactly the number of iterations ONNX Runtime ran for these inputs."""
    counting = [i for i, n in flow.items() if n.op_type == "Loop" and not _counts_m(n) and _has_counter(n)]
    if not counting:
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for i in counting:
        node = copy.graph.node[i]
        body = _body(node)
        assert body is not None  # _has_counter held for it
        counter = body.input[0].name
        # a fresh name of the body's scope; the Identity makes it a node's output, as ONNX Runtime
        # wants of a scan output
        seen = f"{counter}/benanza_seen"
        body.node.append(helper.make_node("Identity", [counter], [seen]))
        body.output.append(helper.make_tensor_value_info(seen, onnx.TensorProto.INT64, []))
        node.output.append(_count_name(_name(node, i)))
    return copy


def _scan_inputs(node: onnx.NodeProto) -> list[str]:
    count = int(_attr(node, "num_scan_inputs", 0))
    return list(node.input[len(node.input) - count:]) if count else []


def _attr(node: onnx.NodeProto, name: str, default):
    a = next((a for a in node.attribute if a.name == name), None)
    return default if a is None else helper.get_attribute_value(a)


def _taken_branch(node: onnx.NodeProto, name: str, found: dict[str, np.ndarray], main: onnx.GraphProto,
                  taken: list[TakenBranch]) -> list[onnx.NodeProto] | None:
    cond = found.get(node.input[0])
    if cond is None or not cond.size:
        return None
    branch = "then" if bool(cond.reshape(-1)[0]) else "else"
    graph = next((a.g for a in node.attribute if a.name == f"{branch}_branch"), None)
    if graph is None:
        return None
    taken.append(TakenBranch(name, branch, "If"))
    body, outs = _inlined(graph, f"{name}/{branch}/", {}, main, list(node.output))
    return body + [_copy(src, dst, f"{name}/{branch}/output_{k}") for k, (src, dst) in enumerate(zip(outs, node.output))
                   if dst and src != dst]


def _unrolled(node: onnx.NodeProto, name: str, found: dict[str, np.ndarray], static: Shapes,
              main: onnx.GraphProto, taken: list[TakenBranch], left: set[str], opset: int, in_place: set[str]
              ) -> list[onnx.NodeProto] | None:
    """The Loop or Scan as its body once per iteration (None, said in ``taken``, when it stays one
    node); the names of the nodes made that move no data join ``in_place``."""
    body = _body(node)
    how = ""
    if node.op_type == "Loop":
        trips, why = _loop_trips(node, name, body, found)
        how = "" if _counts_m(node) else " (condition computed by the body)"
    else:
        trips, why = _scan_trips(node, body, found, static, opset)
    if not why and trips > MAX_TRIPS:
        why = f"{trips} iterations, more than the {MAX_TRIPS} Benanza unrolls"
    if not why and trips == 0 and len(node.output) > _state_count(node):
        why = "no iteration, so its scan outputs have no shape to stack"
    if why:
        left.add(name)
        taken.append(TakenBranch(name, f"stays one node: {why}", node.op_type))
        return None
    assert body is not None
    if node.op_type == "Loop":
        nodes = _loop(node, body, name, trips, main, opset)
    else:
        shapes = [_shape(t, static, found) for t in _scan_inputs(node)]
        nodes = _scan(node, body, name, trips, main, opset, shapes, in_place)
    taken.append(TakenBranch(name, f"{trips} iterations{how}", node.op_type))
    return nodes


def _state_count(node: onnx.NodeProto) -> int:
    """How many of the node's outputs are its final state variables (the rest are scan outputs)."""
    if node.op_type == "Loop":
        return len(node.input) - 2
    return len(node.input) - len(_scan_inputs(node))


def _loop_trips(node: onnx.NodeProto, name: str, body: onnx.GraphProto | None,
                found: dict[str, np.ndarray]) -> tuple[int, str]:
    """The Loop's trip count: its M input where that alone decides it, else the number of
    iterations the run counted (``_counted``); or why it is not known."""
    if body is None or len(body.input) < 2:
        return 0, "no body with an iteration number and a condition"
    if not _counts_m(node):
        seen = found.get(_count_name(name))
        return (0, "its iterations were not counted in the run") if seen is None else (int(seen.shape[0]), "")
    if node.input[0] not in found or node.input[1] not in found:
        return 0, "its trip count or condition was not seen"
    return (int(found[node.input[0]].reshape(-1)[0]) if bool(found[node.input[1]].reshape(-1)[0]) else 0), ""


def _scan_trips(node: onnx.NodeProto, body: onnx.GraphProto | None, found: dict[str, np.ndarray],
                static: Shapes, opset: int) -> tuple[int, str]:
    """The Scan's trip count, the length of its scan inputs on their axes, else why it is not known."""
    if opset < 9:
        return 0, "opset 8's batched Scan (with sequence_lens) is not unrolled"
    inputs = _scan_inputs(node)
    if body is None or not inputs:
        return 0, "no body or no scan input"
    shape = _shape(inputs[0], static, found)
    if shape is None:
        return 0, "its scan inputs' length was not seen"
    axis = int((_attr(node, "scan_input_axes", []) or [0])[0])
    if not -len(shape) <= axis < len(shape):
        return 0, f"scan_input_axes {axis} is outside its first scan input's rank {len(shape)}"
    return shape[axis], ""


def _shape(tensor: str, static: Shapes, found: dict[str, np.ndarray]) -> tuple[int, ...] | None:
    if tensor in static:
        return static[tensor]
    return tuple(found[tensor].shape) if tensor in found else None


def _loop(node: onnx.NodeProto, body: onnx.GraphProto, name: str, trips: int, main: onnx.GraphProto,
          opset: int) -> list[onnx.NodeProto]:
    """A Loop unrolled: each iteration gets its number as a constant and the condition the one
    before computed (the first: the Loop's, true where it has none, as ONNX Runtime's Loop starts);
    scan outputs stack on a new axis 0, in order."""
    counter, cond_in = body.input[0].name, body.input[1].name
    first = node.input[1]
    if not first:
        first = f"{name}/condition"
        main.initializer.append(numpy_helper.from_array(np.array(True), first))

    def start(i: int, prefix: str, before: list[str]) -> tuple[list[onnx.NodeProto], dict[str, str]]:
        number = helper.make_node("Constant", [], [prefix + counter], name=prefix + "iteration",
                                  value=numpy_helper.from_array(np.array(i, np.int64)))
        return [number], {counter: prefix + counter, cond_in: before[0] if before else first}

    carried = _state_count(node)
    # ONNX Runtime's Loop keeps each iteration's scan outputs apart and copies them into the output
    # at the end (loop.cc, ConcatenateLoopOutput): the Concat is a copy there, not in place.
    stacking = [_Stacking(0, False, False)] * (len(node.output) - carried)
    return _iterations(node, body, name, trips, main, opset, list(node.input[2:]), body.input[2:2 + carried],
                       1, start, stacking, set())


def _scan(node: onnx.NodeProto, body: onnx.GraphProto, name: str, trips: int, main: onnx.GraphProto,
          opset: int, shapes: list[tuple[int, ...] | None], in_place: set[str]) -> list[onnx.NodeProto]:
    """A Scan unrolled: iteration i reads element i of each scan input (of shape ``shapes``, None
    when unknown; element trips-1-i when its direction is reverse), a Gather of a scalar index on
    the input's axis, which drops that axis as the body's input does; scan outputs stack on their
    axes, prepended when reverse. Gathers and Concats of contiguous slices join ``in_place``: ONNX
    Runtime's Scan feeds the body axis-0 slices of its inputs and lets the body write into axis-0
    slices of its outputs (scan_9.cc: an input on axis 0 needs no transpose; scan_utils.cc,
    OutputIterator: "we can write directly to the Scan output"); on another axis it transposes the
    whole input before, or output after, the loop, a copy as large as the slices'. A slice with
    only 1s before its axis is as contiguous as an axis-0 one: a lower bound takes it in place too."""
    carried = _state_count(node)
    inputs = _scan_inputs(node)
    in_axes = [int(a) for a in _attr(node, "scan_input_axes", [0] * len(inputs))]
    backward = [bool(d) for d in _attr(node, "scan_input_directions", [0] * len(inputs))]
    contiguous = [_contiguous(shape, axis, 0) for shape, axis in zip(shapes, in_axes)]
    outputs = body.output[carried:]
    out_axes = [int(a) for a in _attr(node, "scan_output_axes", [0] * len(outputs))]
    prepend = [bool(d) for d in _attr(node, "scan_output_directions", [0] * len(outputs))]
    # a stacked output's dims before its axis are the body output's, its rank one more
    stacking = [_Stacking(axis, first, _contiguous(_dims(out), axis, 1))
                for out, axis, first in zip(outputs, out_axes, prepend)]
    positions: dict[int, str] = {}  # element index → its scalar initializer, shared by all inputs

    def position(p: int) -> str:
        if p not in positions:
            positions[p] = f"{name}/position/{p}"
            main.initializer.append(numpy_helper.from_array(np.array(p, np.int64), positions[p]))
        return positions[p]

    def start(i: int, prefix: str, before: list[str]) -> tuple[list[onnx.NodeProto], dict[str, str]]:
        slices, bound = [], {}
        for k, (src, slot) in enumerate(zip(inputs, body.input[carried:])):
            element = prefix + slot.name
            slices.append(helper.make_node("Gather", [src, position(trips - 1 - i if backward[k] else i)], [element],
                                           name=f"{prefix}scan_input_{k}", axis=in_axes[k]))
            if contiguous[k]:
                in_place.add(slices[-1].name)
            bound[slot.name] = element
        return slices, bound

    return _iterations(node, body, name, trips, main, opset, list(node.input[:carried]), body.input[:carried],
                       0, start, stacking, in_place)


def _contiguous(dims: Sequence[int | None] | None, axis: int, added: int) -> bool:
    """Whether one index on ``axis`` of a row-major tensor selects one block of memory: every dim
    before the axis is 1. ``dims``: the tensor's dims (None for one not known), or, with ``added``
    1, those of a tensor the axis is inserted into (None: its rank is not known either)."""
    if axis == 0:
        return True
    if dims is None:
        return False
    axis = axis + len(dims) + added if axis < 0 else axis
    return 0 <= axis < len(dims) + added and all(d == 1 for d in dims[:axis])


def _dims(value: onnx.ValueInfoProto) -> list[int | None] | None:
    """A graph output's declared dims (None for a symbolic one), None when its rank is not declared."""
    t = value.type.tensor_type
    if not t.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]


def _iterations(node: onnx.NodeProto, body: onnx.GraphProto, name: str, trips: int, main: onnx.GraphProto,
                opset: int, state: list[str], state_in: Sequence[onnx.ValueInfoProto], first_out: int,
                start: Callable[[int, str, list[str]], tuple[list[onnx.NodeProto], dict[str, str]]],
                stacking: list[_Stacking], in_place: set[str]) -> list[onnx.NodeProto]:
    """The body inlined once per iteration under ``name/iterI/``: ``state`` (outer tensors) feeds
    the body inputs ``state_in`` and each iteration's state outputs (the body's outputs from
    ``first_out`` on) the next; ``start`` gives an iteration's own nodes and the bindings of its
    other body inputs, from its number, prefix and the previous iteration's outputs ([] for the
    first). The node's outputs: the final state, then the scan outputs stacked (the Concats of those
    stacked in place join ``in_place``)."""
    carried = len(state)
    scanned: list[list[str]] = [[] for _ in stacking]
    nodes: list[onnx.NodeProto] = []
    outs: list[str] = []
    weights = {}  # the body's weights, once for all iterations
    for t in body.initializer:
        w = onnx.TensorProto()
        w.CopyFrom(t)
        w.name = weights[t.name] = f"{name}/{t.name}"
        main.initializer.append(w)
    for i in range(trips):
        prefix = f"{name}/iter{i}/"
        own, bound = start(i, prefix, outs)
        nodes.extend(own)
        bound.update(weights)
        bound.update((slot.name, state[j]) for j, slot in enumerate(state_in))
        inlined, outs = _inlined(body, prefix, bound, main)
        nodes.extend(inlined)
        state = outs[first_out:first_out + carried]
        for k, part in enumerate(outs[first_out + carried:]):
            scanned[k].append(part)
    for j, dst in enumerate(node.output[:carried]):
        if dst:
            nodes.append(_copy(state[j], dst, f"{name}/output_{j}"))
    for k, dst in enumerate(node.output[carried:]):
        if dst:
            parts = scanned[k][::-1] if stacking[k].prepend else scanned[k]
            nodes.extend(_stacked(parts, dst, f"{name}/scan_{k}/", stacking[k].axis, main, opset))
            if stacking[k].in_place:
                in_place.add(nodes[-1].name)
    return nodes


def _inlined(graph: onnx.GraphProto, prefix: str, bound: dict[str, str], main: onnx.GraphProto,
             results: list[str] | None = None) -> tuple[list[onnx.NodeProto], list[str]]:
    """The graph's nodes renamed into the main graph (its inputs to ``bound``'s tensors, its own
    tensors and weights under ``prefix``; weights added to ``main``), and the names its outputs
    then have: an output a node of the graph writes is written under its name in ``results``
    directly (the caller copies the others: outer tensors, weights, repeated outputs)."""
    produced = {o for n in graph.node for o in n.output if o}
    rename = dict(bound)
    for k, out in enumerate(graph.output):
        if results and k < len(results) and results[k] and out.name in produced and out.name not in rename:
            rename[out.name] = results[k]
    internal = produced | {t.name for t in graph.initializer}
    rename.update((t, prefix + t) for t in internal if t not in rename)
    for t in graph.initializer:
        if t.name in bound:
            continue  # the caller added it once (a loop body's weights, shared by its iterations)
        w = onnx.TensorProto()
        w.CopyFrom(t)
        w.name = rename[t.name]
        main.initializer.append(w)
    nodes = []
    index = 0  # ONNX Runtime's index of the node in its subgraph: its Constants are initializers there
    for n in graph.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(n)
        # an unnamed node gets the name ONNX Runtime's profile gives it (OpType_index), so its
        # trace maps to the inlined layer (analysis.matching)
        copy.name = prefix + (n.name or f"{n.op_type}_{index}")
        index += n.op_type != "Constant"
        _rename(copy, rename)
        nodes.append(copy)
    return nodes, [rename.get(o.name, o.name) for o in graph.output]


def _copy(src: str, dst: str, name: str) -> onnx.NodeProto:
    """A graph output under the outer node's output name: an Identity, a free view."""
    return helper.make_node("Identity", [src], [dst], name=name)


def _stacked(parts: list[str], dst: str, prefix: str, axis: int, main: onnx.GraphProto, opset: int
             ) -> list[onnx.NodeProto]:
    """The iterations' scan outputs stacked on a new ``axis`` (of the stacked rank, as Loop's 0 and
    Scan's scan_output_axes are), as the node returns them: each gets the axis (a free view), then
    one Concat, the last node, puts them together."""
    if opset >= 13:  # axes became an input in opset 13
        axes = prefix + "axes"
        main.initializer.append(numpy_helper.from_array(np.array([axis], np.int64), axes))
        views = [helper.make_node("Unsqueeze", [p, axes], [f"{prefix}{i}"], name=f"{prefix}unsqueeze_{i}")
                 for i, p in enumerate(parts)]
    else:
        views = [helper.make_node("Unsqueeze", [p], [f"{prefix}{i}"], name=f"{prefix}unsqueeze_{i}", axes=[axis])
                 for i, p in enumerate(parts)]
    return views + [helper.make_node("Concat", [v.output[0] for v in views], [dst], name=f"{prefix}concat",
                                     axis=axis)]


def _rename(node: onnx.NodeProto, rename: dict[str, str]) -> None:
    """Tensor names in a node and in the subgraphs it holds (ONNX names are unique across scopes,
    so a nested graph's own names are never in ``rename``)."""
    for i, t in enumerate(node.input):
        node.input[i] = rename.get(t, t)
    for i, t in enumerate(node.output):
        node.output[i] = rename.get(t, t)
    for a in node.attribute:
        for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
            for n in g.node:
                _rename(n, rename)
            for o in g.output:
                o.name = rename.get(o.name, o.name)
