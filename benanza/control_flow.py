"""Control flow the processor can cost, found by ONNX Runtime runs (``shapes_by_execution.run_once``):

- each ``If`` is replaced by the branch its condition takes for the given inputs;
- each ``Loop`` whose trip count is its M input alone (the condition starts true and the body
  passes it through unchanged) is unrolled: its body once per iteration, with the iteration's
  number, and its scan outputs stacked as ONNX Runtime's Loop stacks them (a Concat of the
  iterations' outputs). A Loop that stops on a value it computes (a generation loop), or runs more
  than ``MAX_TRIPS`` iterations, stays one node, and says why.

The inlined nodes join the main graph under path names (``If_1/then/Conv_3``,
``Loop_0/iter2/Add_1``, nested: ``If_28/else/If_4/else/Div_0``), their internal tensors and weights
renamed the same way, so they get shapes, keys and costs like any other layer and join the dedup.
``Scan`` is left as one node.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .shapes_by_execution import run_once

log = logging.getLogger(__name__)

# Each round inlines the If and Loop nodes of the graph as it is then; a body holding one needs another.
MAX_NESTING = 16
# Past this many iterations a Loop is left as one node: unrolled, its graph would grow past what
# is worth processing for a lower bound (and a generation loop of that length is not "clean").
MAX_TRIPS = 256


@dataclass(frozen=True)
class TakenBranch:
    node: str  # the If's or Loop's path name
    branch: str  # "then" or "else"; for a Loop: "N iterations", or why it stays one node


def inline_control_flow(model: onnx.ModelProto, path: Path, input_shapes: dict[str, tuple[int, ...]],
                        values: dict[str, tuple[float, ...]], data: dict[str, np.ndarray]
                        ) -> tuple[onnx.ModelProto, tuple[TakenBranch, ...], str]:
    """``model`` with every default-domain If replaced by the branch taken and every clean Loop
    unrolled (a copy when any is), what each became, and why the run that decides them could
    not be made ("" when it could)."""
    taken: list[TakenBranch] = []
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    left: set[str] = set()  # Loops already found not clean: not asked about again
    for _ in range(MAX_NESTING):
        nodes = list(model.graph.node)
        for i, n in enumerate(nodes):
            if n.op_type == "Scan" and n.domain in ("", "ai.onnx") and _name(n, i) not in left:
                left.add(_name(n, i))
                taken.append(TakenBranch(_name(n, i), "stays one node: Benanza does not unroll Scan yet"))
        flow = {i: n for i, n in enumerate(nodes) if n.domain in ("", "ai.onnx")
                and (n.op_type == "If" or n.op_type == "Loop" and _name(n, i) not in left)}
        if not flow:
            break
        wanted = {t for n in flow.values() for t in (n.input[:1] if n.op_type == "If" else n.input[:2]) if t}
        found, failure = run_once(model, path, input_shapes, wanted, values, data)
        if failure:
            log.warning("%s: the branches and trip counts of its control flow cannot be found (%s); "
                        "their bodies are not costed", path, failure)
            return model, tuple(taken), failure
        out = onnx.ModelProto()
        out.CopyFrom(model)
        del out.graph.node[:]
        before = len(taken)
        for i, node in enumerate(nodes):
            inlined = None
            if i in flow and node.op_type == "If":
                inlined = _taken_branch(node, _name(node, i), found, out.graph, taken)
            elif i in flow:
                inlined = _unrolled(node, _name(node, i), found, out.graph, taken, left, opset)
            out.graph.node.extend(inlined if inlined is not None else [node])
        if len(taken) == before:  # the run gave nothing to inline
            break
        model = out
    return model, tuple(taken), ""


def _name(node: onnx.NodeProto, index: int) -> str:
    return node.name or f"{node.op_type}_{index}"


def _taken_branch(node: onnx.NodeProto, name: str, found: dict[str, np.ndarray], main: onnx.GraphProto,
                  taken: list[TakenBranch]) -> list[onnx.NodeProto] | None:
    cond = found.get(node.input[0])
    if cond is None or not cond.size:
        return None
    branch = "then" if bool(cond.reshape(-1)[0]) else "else"
    graph = next((a.g for a in node.attribute if a.name == f"{branch}_branch"), None)
    if graph is None:
        return None
    taken.append(TakenBranch(name, branch))
    body, outs = _inlined(graph, f"{name}/{branch}/", {}, main, list(node.output))
    return body + [_copy(src, dst, f"{name}/{branch}/output_{k}") for k, (src, dst) in enumerate(zip(outs, node.output))
                   if dst and src != dst]


def _unrolled(node: onnx.NodeProto, name: str, found: dict[str, np.ndarray], main: onnx.GraphProto,
              taken: list[TakenBranch], left: set[str], opset: int) -> list[onnx.NodeProto] | None:
    body = next((a.g for a in node.attribute if a.name == "body"), None)
    why = _not_clean(node, body, found)
    if why:
        left.add(name)
        taken.append(TakenBranch(name, f"stays one node: {why}"))
        return None
    assert body is not None
    trips = int(found[node.input[0]].reshape(-1)[0]) if bool(found[node.input[1]].reshape(-1)[0]) else 0
    carried = len(node.input) - 2
    scans = len(body.output) - 1 - carried
    cond_in = body.input[1].name
    state = list(node.input[2:])
    scanned: list[list[str]] = [[] for _ in range(scans)]
    nodes: list[onnx.NodeProto] = []
    weights = {}  # the body's weights, once for all iterations
    for t in body.initializer:
        w = onnx.TensorProto()
        w.CopyFrom(t)
        w.name = weights[t.name] = f"{name}/{t.name}"
        main.initializer.append(w)
    for i in range(trips):
        prefix = f"{name}/iter{i}/"
        counter = prefix + body.input[0].name
        nodes.append(helper.make_node("Constant", [], [counter], name=prefix + "iteration",
                                      value=numpy_helper.from_array(np.array(i, np.int64))))
        bound = {**weights, body.input[0].name: counter, cond_in: node.input[1]}
        bound.update((body.input[2 + j].name, state[j]) for j in range(carried))
        inlined, outs = _inlined(body, prefix, bound, main)
        nodes.extend(inlined)
        state = outs[1:1 + carried]
        for k in range(scans):
            scanned[k].append(outs[1 + carried + k])
    for j, dst in enumerate(node.output[:carried]):
        if dst:
            nodes.append(_copy(state[j], dst, f"{name}/output_{j}"))
    for k, dst in enumerate(node.output[carried:]):
        if dst:
            nodes.extend(_stacked(scanned[k], dst, f"{name}/scan_{k}/", main, opset))
    taken.append(TakenBranch(name, f"{trips} iterations"))
    return nodes


def _not_clean(node: onnx.NodeProto, body: onnx.GraphProto | None, found: dict[str, np.ndarray]) -> str:
    """Why the Loop's trip count is not its M input alone ("" when it is)."""
    if body is None or len(node.input) < 2 or not node.input[0] or not node.input[1]:
        return "no trip count M or no initial condition"
    if node.input[0] not in found or node.input[1] not in found:
        return "its trip count or condition was not seen"
    cond_in, cond_out = body.input[1].name, body.output[0].name
    passes = cond_out == cond_in or any(n.op_type == "Identity" and list(n.input) == [cond_in]
                                        and list(n.output) == [cond_out] for n in body.node)
    if not passes:
        return "it stops on a condition it computes"
    trips = int(found[node.input[0]].reshape(-1)[0])
    if trips > MAX_TRIPS:
        return f"{trips} iterations, more than the {MAX_TRIPS} Benanza unrolls"
    scans = len(body.output) - 1 - (len(node.input) - 2)
    if scans and (trips == 0 or not bool(found[node.input[1]].reshape(-1)[0])):
        return "no iteration, so its scan outputs have no shape to stack"
    return ""


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
    for i, n in enumerate(graph.node):
        copy = onnx.NodeProto()
        copy.CopyFrom(n)
        copy.name = prefix + (n.name or f"{n.op_type}_{i}")
        _rename(copy, rename)
        nodes.append(copy)
    return nodes, [rename.get(o.name, o.name) for o in graph.output]


def _copy(src: str, dst: str, name: str) -> onnx.NodeProto:
    """A graph output under the outer node's output name: an Identity, a free view."""
    return helper.make_node("Identity", [src], [dst], name=name)


def _stacked(parts: list[str], dst: str, prefix: str, main: onnx.GraphProto, opset: int) -> list[onnx.NodeProto]:
    """The iterations' scan outputs stacked on a new axis 0, as the Loop returns them: each gets
    the axis (a free view), then one Concat copies them together."""
    if opset >= 13:  # axes became an input in opset 13
        axes = prefix + "axes"
        main.initializer.append(numpy_helper.from_array(np.array([0], np.int64), axes))
        views = [helper.make_node("Unsqueeze", [p, axes], [f"{prefix}{i}"], name=f"{prefix}unsqueeze_{i}")
                 for i, p in enumerate(parts)]
    else:
        views = [helper.make_node("Unsqueeze", [p], [f"{prefix}{i}"], name=f"{prefix}unsqueeze_{i}", axes=[0])
                 for i, p in enumerate(parts)]
    return views + [helper.make_node("Concat", [v.output[0] for v in views], [dst], name=f"{prefix}concat",
                                     axis=0)]


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
