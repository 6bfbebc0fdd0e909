"""The values of a model's tensors, read from its file without loading all its weights.

A model past protobuf's 2 GB (an LLM's f32 weights) keeps them in external data files, and
``onnx.load`` of the whole model fails on it. Whoever needs a few of its tensors (``check``'s
references, the framework backends' per-layer subgraphs) reads the graph without weights here,
reads one initializer at a time from its file, and gets a tensor the model computes (a Reshape's
shape from Shape→Gather→Concat, a folded layer's output) from a run of only the nodes upstream of
it, with only their weights. ``write_model`` writes a model made of such parts, its weights
beside it as external data when it would pass protobuf's limit itself.
"""

from __future__ import annotations

import logging
import os
import tempfile
from functools import cached_property, partial
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.checker import ValidationError
from onnx.external_data_helper import load_external_data_for_model

from .errors import ModelError
from .fusion import FusionMatch
from .layers import Layer, Model, Node
from .ops.reference import generated
from .ort_fusions import all_fusions
from .outputs import OutputError, write_with
from .processor import read_onnx
from .records import Variant
from .shapes_by_execution import node_reads

log = logging.getLogger(__name__)

# protobuf serializes no message of 2 GiB or more
PROTOBUF_LIMIT = 2**31 - 1
# ops that read only their input's shape: a run for their outputs feeds a stand-in of that shape
# instead of computing the input (a Shape of the last layer's activations would run the model)
_SHAPE_READERS = ("Shape", "Size")
# ORT reads a serialized model's external initializers from this folder
_ORT_EXTERNAL_FOLDER = "session.model_external_initializers_file_folder_path"


class NoValue(Exception):
    """A tensor whose value the model neither stores nor computes here (the reason is the message)."""


class ModelValues:
    """A processed model's graph without its weights: node protos, the real shapes (and dtypes)
    of their tensors, and the values of its constants, read or computed on demand."""

    def __init__(self, model: Model):
        self.model = model
        self.proto = read_onnx(model.path)  # weightless: several GB of an LLM are never held here
        self.base_dir = str(Path(model.path).resolve().parent)
        graph = self.proto.graph
        self.by_output = {o: n for n in graph.node for o in n.output}
        self.inits = {t.name: t for t in graph.initializer}
        # from producers' outputs: a deduplicated layer's inputs may be another occurrence's order
        self.specs: dict[str, tuple[tuple[int, ...], str]] = {
            name: (tuple(shape), "") for name, shape in model.input_shapes.items()}
        for n in model.nodes:
            for name, spec in zip(n.outputs, n.layer.outputs):
                self.specs.setdefault(name, (spec.shape, spec.dtype))
        # outputs of layers that are constants once the input shapes are fixed (a Slice's bounds
        # from Shape→Gather→Concat): a consumer reads them as data, the model computes one value
        self.folded = {o for n in model.nodes if n.folded for o in n.outputs}
        self._values: dict[str, np.ndarray] | None = None
        self._outputs: dict[str, np.ndarray] = {}

    @cached_property
    def fusions(self) -> list[FusionMatch]:
        return all_fusions(self.model)

    def proto_of(self, node: Node) -> onnx.NodeProto:
        return self.by_output[node.outputs[0]]

    def shape(self, name: str) -> tuple[int, ...]:
        if name in self.specs:
            return self.specs[name][0]
        if name in self.inits:
            return tuple(self.inits[name].dims)
        return tuple(self.values([name])[name].shape)  # a Constant node's, or a folded constant's

    def find(self, v: Variant, same_dtype: bool) -> tuple[int, ...] | None:
        """The nodes of the model's first occurrence of the variant's layer (and fusion pattern):
        of its problem in any dtype (a bf16 benchmark of an f32 layer), or, ``same_dtype``, of
        its layer key."""
        def matches(layer: Layer) -> bool:
            return layer.key == v.layer_key if same_dtype else layer.problem == v.problem

        if v.fusion == "none":
            return next(((n.index,) for n in self.model.nodes if matches(n.layer)), None)
        return next((m.nodes for m in self.fusions if m.pattern.name == v.fusion and matches(m.conv)), None)

    def computed(self, name: str) -> bool:
        """Whether a constant input is computed by the model (a Cast of a weight), not stored in it."""
        return name not in self.inits and not (name in self.by_output and self.by_output[name].op_type == "Constant")

    def weight(self, name: str) -> np.ndarray:
        """An initializer's value, its external data read from its file into a copy (the graph's
        proto stays without weights)."""
        try:
            return numpy_helper.to_array(self.inits[name], self.base_dir)
        except (OSError, ValidationError) as exc:
            raise self._unreadable(exc) from None

    def with_weights(self, m: onnx.ModelProto) -> onnx.ModelProto:
        """``m``, made of this graph's parts, with its tensors' external data (initializers',
        Constant values') read in from the model's files."""
        try:
            load_external_data_for_model(m, self.base_dir)
        except (OSError, ValidationError) as exc:
            raise self._unreadable(exc) from None
        return m

    def _unreadable(self, exc: Exception) -> ModelError:
        return ModelError(self.model.path, f"its external data does not read ({str(exc).strip().splitlines()[0]})")

    def values(self, names: list[str]) -> dict[str, np.ndarray]:
        """The real values of tensors: initializers, and the rest from one run of the part of the
        model they depend on (its constant inputs are computed once: Slice bounds from shape
        arithmetic, the outputs of folded layers such as a scale computed from a Shape ...)."""
        if self._values is None:
            self._values = {}
            wanted = sorted({c for n in self.model.nodes for c in n.constant_inputs if c not in self.inits}
                            | self.folded)
            if wanted:
                self._values = dict(zip(wanted, self.run(wanted)))
        out = {}
        for name in names:
            if name in self.inits:
                out[name] = self.weight(name)
            elif name in self._values:
                out[name] = self._values[name]
            else:
                raise NoValue(f"tensor {name!r} is neither a constant nor computed by a run of the model")
        return out

    def outputs(self, names: tuple[str, ...]) -> dict[str, np.ndarray]:
        """Nodes' real outputs, from one more run of the part of the model upstream of them;
        remembered."""
        missing = [n for n in names if n not in self._outputs]
        if missing:
            self._outputs.update(zip(missing, self.run(missing)))
        return {n: self._outputs[n] for n in names}

    def run(self, names: list[str]) -> list[np.ndarray]:
        """The tensors ``names`` from one run of the part of the model they depend on: its nodes
        upstream of them, with only their weights (ONNX Runtime reads them from the model's
        external files), so a value near the inputs, or one computed from shapes alone, never
        loads the model's other weights."""
        graph = self.proto.graph
        producer = {o: k for k, n in enumerate(graph.node) for o in n.output if o}
        needed, todo, kept, shaped = set(names), list(names), set(), set()
        while todo:
            k = producer.get(todo.pop())
            if k is None or k in kept:
                continue
            kept.add(k)
            node = graph.node[k]
            if node.op_type in _SHAPE_READERS and node.input[0] in self.specs:
                shaped.add(node.input[0])
                continue
            fresh = {i for i in node_reads(node) if i} - needed
            needed |= fresh
            todo.extend(fresh)
        stand_ins = {s for s in shaped - needed if s in producer}
        needed |= shaped
        m = onnx.ModelProto()
        m.CopyFrom(self.proto)  # weightless: the graph, opsets, functions and metadata
        # only the part upstream of ``names``: the model's own outputs elsewhere have no producer here
        del m.graph.node[:], m.graph.initializer[:], m.graph.input[:], m.graph.value_info[:], m.graph.output[:]
        m.graph.node.extend(graph.node[k] for k in sorted(kept))
        m.graph.initializer.extend(t for t in graph.initializer if t.name in needed)
        m.graph.input.extend(i for i in graph.input if i.name in needed)
        m.graph.input.extend(helper.make_tensor_value_info(s, onnx.TensorProto.FLOAT, self.shape(s))
                             for s in sorted(stand_ins))
        m.graph.value_info.extend(v for v in graph.value_info if v.name in needed and v.name not in stand_ins)
        declared = {o.name: o for o in graph.output}
        m.graph.output.extend(declared[n] if n in declared else helper.make_empty_tensor_value_info(n)
                              for n in dict.fromkeys(names))
        feeds = {s: np.zeros(self.shape(s), np.float32) for s in stand_ins}
        # the stream of each input is its place among all the model's inputs, whichever this part reads
        for k, inp in enumerate(i for i in graph.input if i.name not in self.inits):
            if inp.name not in needed:
                continue
            shape = self.model.input_shapes[inp.name]
            np_type = helper.tensor_dtype_to_np_dtype(inp.type.tensor_type.elem_type)
            feeds[inp.name] = generated(k, tuple(shape)).astype(np_type) if np_type.kind == "f" else \
                np.zeros(shape, np_type)
        return evaluate(m, feeds, names, self.base_dir)


def evaluate(m: onnx.ModelProto, feeds: dict[str, np.ndarray], outputs: list[str],
             base_dir: str | None = None) -> list[np.ndarray]:
    """ONNX Runtime's answer; onnx's reference evaluator where ONNX Runtime cannot run the graph
    (ops it lacks in the default domain, such as opset 23's Attention). ``base_dir``: where the
    graph's external weights lie."""
    import onnxruntime as ort

    try:
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        if base_dir is not None:
            opts.add_session_config_entry(_ORT_EXTERNAL_FOLDER, base_dir)
        sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        return sess.run(outputs, feeds)
    except Exception as exc:  # noqa: BLE001 - ORT raises many kinds for an op it lacks
        log.info("ONNX Runtime cannot run the graph (%s); onnx's reference evaluator does", exc)
    from onnx.reference import ReferenceEvaluator

    if base_dir is not None:
        load_external_data_for_model(m, base_dir)
    try:
        return list(ReferenceEvaluator(m).run(outputs, feeds))
    except Exception as exc:  # noqa: BLE001 - an op neither implements: no value, said so
        raise NoValue(f"neither ONNX Runtime nor onnx's reference evaluator runs it "
                      f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None


def write_model(m: onnx.ModelProto, path: Path) -> list[Path]:
    """``m`` as the file ``path``: whole, or, where it would pass protobuf's limit, with its
    weights in ``<path>.data`` beside it (ONNX Runtime reads external data only from the model's
    own folder). A file already holding the same model is left as it is. Returns the files that
    make the model. ``m`` may be emptied of its weights."""
    if m.ByteSize() <= PROTOBUF_LIMIT:
        data = m.SerializeToString()
        if not path.exists() or path.read_bytes() != data:
            write_with(path, partial(Path.write_bytes, data=data))
        return [path]
    beside = path.with_name(path.name + ".data")
    try:
        # both files are made in a folder beside them, then moved: never a model without its data
        with tempfile.TemporaryDirectory(prefix=f".{path.name}.", dir=path.parent) as tmp:
            made = Path(tmp) / path.name
            onnx.save_model(m, made, save_as_external_data=True, all_tensors_to_one_file=True,
                            location=beside.name, size_threshold=1024)
            os.replace(Path(tmp) / beside.name, beside)
            os.replace(made, path)
    except OSError as exc:
        raise OutputError(path, f"cannot write ({exc.strerror or exc})") from None
    return [path, beside]
