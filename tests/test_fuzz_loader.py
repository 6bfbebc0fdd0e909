"""Bounded, seeded, structure-aware fuzzing of the model loader.

Real ONNX protos (reference models from `benanza.zoo`) are mutated where a hostile or broken
exporter would break them (dims, attributes, op types, wiring, initializers, opsets, the
serialised bytes) and handed to the processor. Every outcome must be a processed model or a
BenanzaError: any other exception is a traceback a user would have seen.
"""

from __future__ import annotations

import random
import time
import traceback
import warnings
from pathlib import Path

import onnx
import pytest
from onnx import helper

from benanza import processor
from benanza.errors import BenanzaError
from benanza.processor import load_model
from benanza.zoo import get as zoo_model

SEED = 20261123
BUDGET_SECONDS = 30.0
MAX_CASES = 1000
SEEDS = ("lenet", "squeezenet-v1.1", "shufflenet")

DIMS = (0, -1, -7, 1, 3, 2**31, 2**40, 2**62, 2**63 - 1)
OPS = ("Conv", "Relu", "Gemm", "MatMul", "Reshape", "Concat", "MaxPool", "BatchNormalization", "Softmax",
       "Transpose", "Flatten", "Add", "Loop", "If", "NoSuchOp", "", "Resize", "Split", "Slice", "Expand")


def _tensors(graph: onnx.GraphProto) -> list[str]:
    return [o for n in graph.node for o in n.output] + [i.name for i in graph.input] + \
        [t.name for t in graph.initializer]


def mutate_dims(m: onnx.ModelProto, rng: random.Random) -> str:
    holders = [vi.type.tensor_type.shape for vi in list(m.graph.input) + list(m.graph.output)
               + list(m.graph.value_info) if vi.type.tensor_type.HasField("shape")]
    shape = rng.choice(holders) if holders else None
    if shape is None or not shape.dim:
        return "dims: none"
    d = rng.choice(shape.dim)
    if rng.random() < 0.3:
        d.dim_param = rng.choice(("N", "", "batch", "[/]"))
        return f"dim_param {d.dim_param!r}"
    d.dim_value = rng.choice(DIMS) if rng.random() < 0.8 else rng.randint(-5, 5000)
    return f"dim {d.dim_value}"


def mutate_init_dims(m: onnx.ModelProto, rng: random.Random) -> str:
    if not m.graph.initializer:
        return "init: none"
    t = rng.choice(m.graph.initializer)
    if t.dims and rng.random() < 0.5:
        t.dims[rng.randrange(len(t.dims))] = rng.choice(DIMS[:6])
    else:
        t.dims.append(rng.choice((1, 2, 0)))
    return f"initializer {t.name} dims {list(t.dims)}"


def mutate_attribute(m: onnx.ModelProto, rng: random.Random) -> str:
    nodes = [n for n in m.graph.node if n.attribute]
    if not nodes:
        return "attr: none"
    n = rng.choice(nodes)
    a = rng.choice(n.attribute)
    choice = rng.random()
    if choice < 0.25:
        n.attribute.remove(a)
        return f"{n.name}: drop {a.name}"
    if choice < 0.45:
        new = helper.make_attribute(a.name, rng.choice(("same", 1.5, [1.0, 2.0], b"\xff")))
    elif a.ints:
        new = helper.make_attribute(a.name, [rng.choice(DIMS) for _ in range(rng.randint(0, 6))],
                                    attr_type=onnx.AttributeProto.INTS)
    else:
        new = helper.make_attribute(a.name, rng.choice(DIMS))
    n.attribute.remove(a)
    n.attribute.append(new)
    return f"{n.name}: {a.name} -> {helper.get_attribute_value(new)!r}"


def mutate_op(m: onnx.ModelProto, rng: random.Random) -> str:
    n = rng.choice(m.graph.node)
    n.op_type = rng.choice(OPS)
    return f"{n.name}: op {n.op_type!r}"


def mutate_wiring(m: onnx.ModelProto, rng: random.Random) -> str:
    n = rng.choice(m.graph.node)
    names = _tensors(m.graph) + ["", "nowhere", n.output[0] if n.output else "x"]
    if n.input and rng.random() < 0.7:
        i = rng.randrange(len(n.input))
        n.input[i] = rng.choice(names)
        return f"{n.name}: input {i} -> {n.input[i]!r}"
    n.input.append(rng.choice(names))
    return f"{n.name}: extra input"


def mutate_graph(m: onnx.ModelProto, rng: random.Random) -> str:
    g = m.graph
    choice = rng.random()
    if choice < 0.3 and len(g.node) > 1:
        n = g.node[rng.randrange(len(g.node))]
        g.node.remove(n)
        return f"drop node {n.name}"
    if choice < 0.5 and g.node:
        n = rng.choice(g.node)
        g.node.append(n)
        return f"duplicate node {n.name}"
    if choice < 0.7 and g.initializer:
        t = rng.choice(g.initializer)
        g.initializer.remove(t)
        return f"drop initializer {t.name}"
    if choice < 0.85:
        m.opset_import[0].version = rng.choice((1, 5, 7, 11, 13, 17, 99, -1))
        return f"opset {m.opset_import[0].version}"
    t = rng.choice(g.initializer) if g.initializer else None
    if t is not None:
        t.data_type = rng.choice((0, 2, 7, 8, 10, 16, 99))
        return f"initializer {t.name} dtype {t.data_type}"
    return "graph: none"


# categories Python's default filters keep off a user's terminal
_UNSHOWN = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)

MUTATORS = (mutate_dims, mutate_init_dims, mutate_attribute, mutate_op, mutate_wiring, mutate_graph)


def mutate_bytes(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    if rng.random() < 0.5:
        cut = rng.randrange(len(data))
        return data[:cut], f"truncated at {cut}"
    buf = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        buf[rng.randrange(len(buf))] = rng.randrange(256)
    return bytes(buf), "bytes flipped"


@pytest.fixture(scope="module")
def seeds() -> list[onnx.ModelProto]:
    out = []
    for name in SEEDS:
        m = zoo_model(name).build()
        # Weights only contribute dims: drop their payload so copies are cheap.
        for t in m.graph.initializer:
            if len(t.raw_data) > 4096:
                t.ClearField("raw_data")
        out.append(m)
    return out


@pytest.mark.slow
def test_loader_raises_only_benanza_errors_under_mutation(seeds, tmp_path, monkeypatch):
    monkeypatch.setattr(processor, "SYMBOLIC_SECONDS", 5.0)
    rng = random.Random(SEED)
    surprises: list[str] = []
    outcomes = {"processed": 0, "refused": 0}
    deadline = time.monotonic() + BUDGET_SECONDS
    case = 0
    while case < MAX_CASES and time.monotonic() < deadline:
        case += 1
        base = rng.choice(seeds)
        m = onnx.ModelProto()
        m.CopyFrom(base)
        steps = [rng.choice(MUTATORS)(m, rng) for _ in range(rng.randint(1, 3))]
        source: object = m
        if rng.random() < 0.15:
            data, how = mutate_bytes(m.SerializeToString(), rng)
            path = tmp_path / f"case{case}.onnx"
            path.write_bytes(data)
            source, steps = path, steps + [how]
        try:
            with warnings.catch_warnings(record=True) as shown:
                warnings.simplefilter("always")
                if isinstance(source, Path):
                    load_model(source)
                else:
                    load_model(m, name=f"case{case}")
            outcomes["processed"] += 1
        except BenanzaError as exc:
            assert str(exc).strip(), f"case {case}: an empty error message"
            outcomes["refused"] += 1
        except Exception as exc:  # noqa: BLE001 - the point: nothing else may escape
            tb = traceback.extract_tb(exc.__traceback__)[-1]
            surprises.append(f"case {case} ({base.graph.name}: {'; '.join(steps)}): {type(exc).__name__}: "
                             f"{str(exc)[:200]} at {tb.filename}:{tb.lineno}")
        # a library's warning would print before Benanza's one line (symbolic inference's overflows did)
        surprises += [f"case {case} ({base.graph.name}: {'; '.join(steps)}): {w.category.__name__}: {w.message} "
                      f"at {w.filename}:{w.lineno}" for w in shown if not issubclass(w.category, _UNSHOWN)]
    assert case >= 50, f"only {case} cases ran in {BUDGET_SECONDS}s"
    assert not surprises, f"{len(surprises)} of {case} cases escaped as non-Benanza exceptions or warnings:\n" + \
        "\n".join(surprises[:15])
    assert outcomes["processed"] and outcomes["refused"]
