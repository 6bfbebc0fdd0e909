"""Control flow the processor can cost: each ``If`` is replaced by the branch its condition takes
for the given inputs, found by one ONNX Runtime run (``shapes_by_execution.run_once``).

The branch's nodes join the main graph under path names (``If_1/then/Conv_3``, nested:
``If_1/then/If_2/else/Relu``), its internal tensors and weights renamed the same way, so they get
shapes, keys and costs like any other layer and join the dedup. ``Loop`` and ``Scan`` are left as
they are (their bodies are not costed).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from .shapes_by_execution import run_once

log = logging.getLogger(__name__)

# Each round inlines the Ifs of the graph as it is then; a branch holding an If needs another.
MAX_NESTING = 16


@dataclass(frozen=True)
class TakenBranch:
    node: str  # the If's path name
    branch: str  # "then" or "else"


def inline_taken_branches(model: onnx.ModelProto, path: Path, input_shapes: dict[str, tuple[int, ...]],
                          values: dict[str, tuple[float, ...]], data: dict[str, np.ndarray]
                          ) -> tuple[onnx.ModelProto, tuple[TakenBranch, ...], str]:
    """``model`` with every default-domain If replaced by the branch taken (a copy when any is),
    the branches taken, and why a condition could not be found ("" when none failed)."""
    taken: list[TakenBranch] = []
    for _ in range(MAX_NESTING):
        ifs = {i: n for i, n in enumerate(model.graph.node) if n.op_type == "If" and n.domain in ("", "ai.onnx")}
        if not ifs:
            return model, tuple(taken), ""
        conds, failure = run_once(model, path, input_shapes, {n.input[0] for n in ifs.values()}, values, data)
        if failure:
            log.warning("%s: the branch of its If nodes cannot be found (%s); their branches are not costed",
                        path, failure)
            return model, tuple(taken), failure
        out = onnx.ModelProto()
        out.CopyFrom(model)
        del out.graph.node[:]
        before = len(taken)
        for i, node in enumerate(model.graph.node):
            branch = "then" if i in ifs and node.input[0] in conds and conds[node.input[0]].size and \
                bool(conds[node.input[0]].reshape(-1)[0]) else "else"
            graph = next((a.g for a in node.attribute if a.name == f"{branch}_branch"), None)
            if i in ifs and node.input[0] in conds and graph is not None:
                name = node.name or f"If_{i}"
                out.graph.node.extend(_inlined(graph, f"{name}/{branch}/", list(node.output), out.graph))
                taken.append(TakenBranch(name, branch))
            else:
                out.graph.node.append(node)
        if len(taken) == before:  # the run gave no condition it can use: nothing more to inline
            return model, tuple(taken), ""
        model = out
    return model, tuple(taken), ""


def _inlined(branch: onnx.GraphProto, prefix: str, outputs: list[str],
             main: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The branch's nodes renamed into the main graph, writing the If's ``outputs``; its
    initializers are added to ``main``."""
    produced = {o for n in branch.node for o in n.output if o}
    internal = produced | {t.name for t in branch.initializer}
    rename: dict[str, str] = {}
    tail: list[onnx.NodeProto] = []
    for k, out in enumerate(branch.output):
        if out.name in produced and out.name not in rename:
            rename[out.name] = outputs[k]
        else:  # an outer tensor, a weight, or a tensor that is already another output: copy it
            tail.append(onnx.helper.make_node("Identity", [out.name], [outputs[k]], name=f"{prefix}output_{k}"))
    for t in sorted(internal - set(rename)):
        rename[t] = prefix + t
    for t in branch.initializer:
        w = onnx.TensorProto()
        w.CopyFrom(t)
        w.name = rename[t.name]
        main.initializer.append(w)
    nodes = []
    for i, n in enumerate(list(branch.node) + tail):
        copy = onnx.NodeProto()
        copy.CopyFrom(n)
        if i < len(branch.node):
            copy.name = prefix + (n.name or f"{n.op_type}_{i}")
        _rename(copy, rename)
        nodes.append(copy)
    return nodes


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
