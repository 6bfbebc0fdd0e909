"""The op registry: every family has a FLOP formula, keys that print back to themselves and a
lowering for every call a backend claims; generated code does not depend on model order."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import onnx
import onnx.printer
import pytest
from click.testing import CliRunner
from helpers import FIXTURES, REPO
from onnx import TensorProto, helper

from benanza.cli import main
from benanza.fusion import BY_NAME as FUSION_PATTERNS
from benanza.fusion import NODE_FINDERS, FusionPattern
from benanza.layers import TensorSpec
from benanza.ops.base import Family, NodeView
from benanza.ops.grammar import Problem, parse_key
from benanza.ops.pool import PoolProblem
from benanza.ops.reference import Fills
from benanza.ops.registry import FAMILIES, PATTERN_LOWERINGS, PROBLEM_TYPES, build_layer, parse_problem

GOLDEN = FIXTURES / "golden"


def _t(*shape: int, dtype: str = "f32") -> TensorSpec:
    return TensorSpec(tuple(shape), dtype)


def _view(op: str, inputs, outputs, attrs=None, values=None, opset: int = 17) -> NodeView:
    values = values or {}
    return NodeView(op, tuple(inputs), tuple(outputs), attrs or {},
                    {i: (lambda v=v: v) for i, v in values.items()},
                    tuple(i in values for i in range(len(inputs))), opset)


# One node per family, as the processor would see it after shape inference; every family of
# the registry must appear (test_every_family_has_an_example).
EXAMPLES = {
    "conv": _view("Conv", [_t(1, 8, 9, 9), _t(16, 8, 3, 3), _t(16)], [_t(1, 16, 9, 9)],
                  {"pads": [1, 1, 1, 1]}),
    "deconv": _view("ConvTranspose", [_t(1, 8, 5, 5), _t(8, 4, 3, 3)], [_t(1, 4, 7, 7)]),
    "pool": _view("MaxPool", [_t(1, 8, 8, 8)], [_t(1, 8, 4, 4)], {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "bnorm": _view("BatchNormalization", [_t(2, 8, 4, 4), _t(8), _t(8), _t(8), _t(8)], [_t(2, 8, 4, 4)]),
    "lrn": _view("LRN", [_t(1, 8, 4, 4)], [_t(1, 8, 4, 4)], {"size": 5}),
    "lnorm": _view("LayerNormalization", [_t(2, 6, 32), _t(32), _t(32)], [_t(2, 6, 32)]),
    "eltwise": _view("Relu", [_t(2, 16)], [_t(2, 16)]),
    "prelu": _view("PRelu", [_t(1, 8, 4, 4), _t(8, 1, 1)], [_t(1, 8, 4, 4)]),
    "dropout": _view("Dropout", [_t(4, 16), _t(), _t(dtype="b")], [_t(4, 16)],
                     values={1: np.array(0.25, np.float32), 2: np.array(True)}),
    "binary": _view("Add", [_t(2, 16), _t(16)], [_t(2, 16)]),
    "gemm": _view("Gemm", [_t(4, 32), _t(16, 32), _t(16)], [_t(4, 16)], {"transB": 1}),
    "matmul": _view("MatMul", [_t(3, 4, 32), _t(3, 32, 8)], [_t(3, 4, 8)]),
    "softmax": _view("Softmax", [_t(2, 10)], [_t(2, 10)]),
    "reduce": _view("ReduceMean", [_t(2, 6, 32)], [_t(2, 6, 1)], {"axes": [-1]}, opset=17),
    "concat": _view("Concat", [_t(1, 4, 3, 3), _t(1, 2, 3, 3)], [_t(1, 6, 3, 3)], {"axis": 1}),
    "transpose": _view("Transpose", [_t(2, 3, 4)], [_t(4, 3, 2)]),
    "copy": _view("Expand", [_t(1, 16), _t(2, dtype="i64")], [_t(8, 16)], values={1: np.array([8, 16])}),
    "pad": _view("Pad", [_t(1, 3, 8, 8), _t(8, dtype="i64")], [_t(1, 3, 10, 10)],
                 values={1: np.array([0, 0, 1, 1, 0, 0, 1, 1])}, opset=13),
    "rnn": _view("LSTM", [_t(5, 2, 8), _t(1, 64, 8), _t(1, 64, 16), _t(1, 128)], [_t(5, 1, 2, 16)],
                 {"hidden_size": 16}),
    "resample": _view("Resize", [_t(1, 4, 8, 8), None, _t(4)], [_t(1, 4, 16, 16)], {"mode": "linear"},
                      values={2: np.array([1, 1, 2, 2], np.float32)}),
    "attention": _view("Attention", [_t(1, 2, 8, 16), _t(1, 2, 8, 16), _t(1, 2, 8, 16)], [_t(1, 2, 8, 16)],
                       opset=23),
    "rmsnorm": _view("RMSNormalization", [_t(2, 6, 32), _t(32)], [_t(2, 6, 32)], opset=23),
    "rope": _view("RotaryEmbedding", [_t(1, 4, 3, 16), _t(1, 3, 8), _t(1, 3, 8)], [_t(1, 4, 3, 16)], opset=23),
    "convert": _view("Cast", [_t(1, 1, 64, dtype="i32")], [_t(1, 1, 64)], {"to": 1}),
    "tobool": _view("Cast", [_t(1, 1, 1, 9, dtype="i64")], [_t(1, 1, 1, 9, dtype="b")], {"to": 9}),
    "matmulint": _view("MatMulInteger", [_t(1, 1, 64, dtype="u8"), _t(64, 32, dtype="i8"), _t(dtype="u8"),
                                         _t(dtype="i8")], [_t(1, 1, 32, dtype="i32")],
                       values={3: np.array(0, np.int8)}),
    "qmatmul": _view("QLinearMatMul", [_t(4, 64, dtype="u8"), _t(), _t(dtype="u8"), _t(64, 32, dtype="i8"),
                                             _t(), _t(dtype="i8"), _t(), _t(dtype="u8")],
                           [_t(4, 32, dtype="u8")], values={5: np.array(0, np.int8)}),
    "convint": _view("ConvInteger", [_t(1, 8, 9, 9, dtype="u8"), _t(16, 8, 3, 3, dtype="i8"), _t(dtype="u8")],
                     [_t(1, 16, 9, 9, dtype="i32")], {"pads": [1, 1, 1, 1]}),
    "qconv": _view("QLinearConv", [_t(1, 8, 9, 9, dtype="u8"), _t(), _t(dtype="u8"), _t(16, 8, 3, 3, dtype="i8"),
                                         _t(16), _t(16, dtype="i8"), _t(), _t(dtype="u8"), _t(16, dtype="i32")],
                         [_t(1, 16, 9, 9, dtype="u8")], {"pads": [1, 1, 1, 1]}, values={5: np.zeros(16, np.int8)}),
    "dynquant": _view("DynamicQuantizeLinear", [_t(1, 1, 64)], [_t(1, 1, 64, dtype="u8"), _t(), _t(dtype="u8")]),
    "quant": _view("QuantizeLinear", [_t(4, 64), _t(), _t(dtype="i8")], [_t(4, 64, dtype="i8")],
                   values={2: np.array(3, np.int8)}),
    "dequant": _view("DequantizeLinear", [_t(64, 32, dtype="i8"), _t(32)], [_t(64, 32)]),
    "nbitsmatmul": _view("MatMulNBits", [_t(1, 64), _t(32, 2, 16, dtype="u8"), _t(64)], [_t(1, 32)],
                         {"K": 64, "N": 32, "bits": 4, "block_size": 32}),
}


def test_every_family_has_an_example() -> None:
    assert {f.name for f in FAMILIES} == set(EXAMPLES)


def test_no_two_families_share_a_name_or_a_record() -> None:
    assert len({f.name for f in FAMILIES}) == len(FAMILIES)
    assert len(PROBLEM_TYPES) == len(FAMILIES)


def _gaps(family: Family, view: NodeView) -> list[str]:
    """What ``family`` lacks that a user of the registry relies on, walked from one node it
    recognises: its own problem record, a FLOP formula of its own (Problem's default, 2·MACs with
    no MACs, would silently cost it 0), a key that parses back to the same problem, a lowering
    for every call it names on a backend, whose row is a typed record of named fields, and with a
    oneDNN lowering, the reference ``benanza check`` compares its benchmarks with."""
    gaps = []
    if view.op not in family.ops or not family.when(view):
        gaps.append(f"does not recognise its example {view.op}")
    p = family.build(view)
    if not isinstance(p, family.problem) or p.family != family.name:
        gaps.append(f"builds a {type(p).__name__} of family {p.family!r}")
    if type(p).flops is Problem.flops and type(p).macs is Problem.macs:
        gaps.append("no FLOP formula")
    flops = p.flops()
    if not isinstance(flops, int) or flops < 0:
        gaps.append(f"FLOPs {flops!r}")
    text = p.text()
    back = family.problem.parse_tokens(parse_key(text), text)
    if back != p or back.text() != text:
        gaps.append(f"key {text!r} reads back as {back!r}")
    api = family.cudnn_api(p)
    if api is not None:
        if api not in family.cudnn:
            gaps.append(f"names {api} but has no cuDNN lowering for it")
        else:
            row = family.cudnn[api].row(p, api)
            if not (dataclasses.is_dataclass(row) and dataclasses.fields(row)):
                gaps.append(f"the cuDNN row of {api} is no typed record")
    if family.onednn is not None and family.onednn.reference is None:
        gaps.append("has a oneDNN lowering but no reference for benanza check")
    primitive = family.onednn_api(p)
    if primitive is not None:
        if family.onednn is None:
            gaps.append(f"names {primitive} but has no oneDNN lowering")
        else:
            row = family.onednn.table(family.name, primitive)[1](p, primitive)
            if not (dataclasses.is_dataclass(row) and dataclasses.fields(row)):
                gaps.append(f"the oneDNN row of {primitive} is no typed record")
    return gaps


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_family_recognises_builds_and_round_trips(family) -> None:
    view = EXAMPLES[family.name]
    assert _gaps(family, view) == []
    # and through the registry: the node reaches this family, its key through the key parser
    layer = build_layer(view)
    assert type(layer.problem) is family.problem
    text = layer.problem.text()
    assert parse_problem(text) == layer.problem and parse_problem(text).text() == text


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_every_claimed_call_has_a_lowering(family) -> None:
    """A family with no call on a backend is not covered there, explicitly; its cuDNN lowerings
    name runtime tables."""
    layer = build_layer(EXAMPLES[family.name])
    if layer.cudnn_api is None:
        assert family.name == "prelu" or not family.cudnn
    for lowering in family.cudnn.values():
        assert lowering.table.name and lowering.table.add.startswith("add_")
    if layer.onednn_primitive is None:
        assert family.onednn is None


@dataclasses.dataclass(frozen=True)
class _Unmodelled(PoolProblem):
    """A pool record that forgot its FLOP formula and keeps a field its key grammar lacks."""

    extra: int = 0
    flops = Problem.flops


def test_the_walk_fails_a_family_that_lacks_a_part() -> None:
    """Each part a family can miss makes the walk above fail, naming it."""
    pool = next(f for f in FAMILIES if f.name == "pool")
    gemm = next(f for f in FAMILIES if f.name == "gemm")
    assert _gaps(pool, EXAMPLES["pool"]) == [] and _gaps(gemm, EXAMPLES["gemm"]) == []
    no_onednn = dataclasses.replace(pool, onednn=None)
    assert _gaps(no_onednn, EXAMPLES["pool"]) == ["names pooling but has no oneDNN lowering"]
    no_reference = dataclasses.replace(pool, onednn=dataclasses.replace(pool.onednn, reference=None))
    assert _gaps(no_reference, EXAMPLES["pool"]) == ["has a oneDNN lowering but no reference for benanza check"]
    no_cudnn = dataclasses.replace(gemm, cudnn={})
    assert _gaps(no_cudnn, EXAMPLES["gemm"]) == [f"names {build_layer(EXAMPLES['gemm']).cudnn_api} but has no "
                                                 "cuDNN lowering for it"]

    def build(view: NodeView) -> Problem:
        p = pool.build(view)
        return _Unmodelled(**{f.name: getattr(p, f.name) for f in dataclasses.fields(p)}, extra=1)

    unmodelled = dataclasses.replace(pool, problem=_Unmodelled, build=build)
    gaps = _gaps(unmodelled, EXAMPLES["pool"])
    assert gaps[0] == "no FLOP formula" and gaps[1].startswith("key 'pool:") and len(gaps) == 2, gaps


def test_family_apis_match_lowerings_over_every_alg() -> None:
    """The calls a family can name, over the variants of its problem, all have lowerings (an
    eltwise op on each of its algs: the activation, OpTensor's sqrt and pointwise tables)."""
    eltwise = next(f for f in FAMILIES if f.name == "eltwise")
    for op in eltwise.ops:
        view = _view(op, [_t(2, 16)], [_t(2, 16)], {"min": 0.0, "max": 6.0} if op == "Clip" else {}, opset=6
                     if op == "Clip" else 17)
        layer = build_layer(view)
        if layer.cudnn_api is not None:
            assert layer.cudnn_api in eltwise.cudnn, op
        if layer.onednn_primitive is not None:
            assert eltwise.onednn is not None
    binary = next(f for f in FAMILIES if f.name == "binary")
    for op in binary.ops:
        layer = build_layer(_view(op, [_t(2, 16), _t(2, 16)], [_t(2, 16)]))
        assert layer.cudnn_api is None or layer.cudnn_api in binary.cudnn, op


def test_every_fusion_with_a_fused_form_is_lowered() -> None:
    """Each DAG pattern has a node finder; each pattern lowered on a backend names a table the
    backend has."""
    for name, pattern in FUSION_PATTERNS.items():
        if pattern.dag:
            assert name in NODE_FINDERS
    from benanza.backends import onednn
    for lowering in PATTERN_LOWERINGS.values():
        assert lowering.pattern in FUSION_PATTERNS
        if lowering.onednn is not None:
            assert lowering.onednn[0] in onednn.FAMILIES


def test_a_primitive_of_another_family_renders_that_familys_struct() -> None:
    """A primitive a family runs through another family's runtime function (``via``) names a
    family the oneDNN backend has, and its row is the struct that family's function takes: an
    outer-product Mul (both operands broadcast, [.., M, 1]·[.., 1, N]) is a K = 1 matmul, its
    [.., M, 1] operand the source; any other both-broadcast Mul stays the binary primitive's."""
    from benanza.backends import onednn
    for family in FAMILIES:
        for target, _ in (family.onednn.via.values() if family.onednn is not None else ()):
            assert target in onednn.FAMILIES, family.name
    binary = next(f for f in FAMILIES if f.name == "binary")
    matmul = next(f for f in FAMILIES if f.name == "matmul")
    assert binary.onednn is not None and matmul.onednn is not None
    own = matmul.onednn.row(build_layer(EXAMPLES["matmul"]).problem, "matmul")
    for a, b, src, weights in (((1, 1, 8), (1, 4, 1), (1, 4, 1), (1, 1, 8)), ((4, 1), (8,), (4, 1), (1, 8)),
                               ((2, 1, 8), (1, 4, 1), (1, 4, 1), (2, 1, 8))):
        layer = build_layer(_view("Mul", [_t(*a), _t(*b)], [_t(*np.broadcast_shapes(a, b))]))
        assert layer.onednn_primitive == "matmul", (a, b)
        target, row = binary.onednn.table("binary", "matmul")
        assert target == "matmul" and row(layer.problem, "matmul") == type(own)(a=src, b=weights)
    # one operand the output's shape; both broadcast, but neither is [.., M, 1] against [.., 1, N]
    for a, b in (((1, 1, 4), (4, 4)), ((4, 1, 8), (1, 3, 8))):
        layer = build_layer(_view("Mul", [_t(*a), _t(*b)], [_t(*np.broadcast_shapes(a, b))]))
        assert layer.onednn_primitive == "binary", (a, b)
    less = build_layer(_view("Less", [_t(1, 1, 4), _t(4, 1)], [_t(1, 4, 4, dtype="b")]))
    assert less.onednn_primitive == "binary"


def test_lowering_rows_name_the_runtime_structs() -> None:
    """Every row class is named for a struct the runtime declares, with its fields in order."""
    headers = (REPO / "runtime_cpp" / "onednn" / "benanza" / "onednn.hpp").read_text() + \
        (REPO / "runtime_cpp" / "cudnn" / "benanza_cudnn" / "tables.hpp").read_text()
    seen = set()
    for family in FAMILIES:
        layer = build_layer(EXAMPLES[family.name])
        rows = []
        if family.onednn is not None and layer.onednn_primitive is not None:
            rows.append(family.onednn.row(layer.problem, layer.onednn_primitive))
        if layer.cudnn_api is not None:
            rows.append(family.cudnn[layer.cudnn_api].row(layer.problem, layer.cudnn_api))
        for row in rows:
            name = type(row).__name__
            seen.add(name)
            assert f"struct {name} " in headers, name
    assert len(seen) >= 25


# --- generated code: order-independent, whole-file goldens -----------------------------------

def _model(path: Path, names: tuple[str, ...]) -> Path:
    """A tiny CNN + MLP: conv → relu → pool → flatten → gemm → softmax, with a per-model name."""
    rng = np.random.default_rng(7)
    inits = [helper.make_tensor(n, TensorProto.FLOAT, s, rng.standard_normal(math.prod(s)).astype(np.float32))
             for n, s in (("w", (4, 3, 3, 3)), ("b", (4,)), ("fc", (6, 64)), ("fb", (6,)))]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name=names[0]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "fc", "fb"], ["g"], transB=1, name=names[1]),
             helper.make_node("Softmax", ["g"], ["y"])]
    graph = helper.make_graph(nodes, path.stem, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


def _other(path: Path) -> Path:
    """A second model whose layers differ from the first's: a transformer-ish MLP block."""
    rng = np.random.default_rng(8)
    inits = [helper.make_tensor("w1", TensorProto.FLOAT, (16, 32), rng.standard_normal(512).astype(np.float32)),
             helper.make_tensor("b1", TensorProto.FLOAT, (32,), rng.standard_normal(32).astype(np.float32)),
             helper.make_tensor("s", TensorProto.FLOAT, (32,), np.ones(32, np.float32)),
             helper.make_tensor("t", TensorProto.FLOAT, (32,), np.zeros(32, np.float32))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m"]),
             helper.make_node("Add", ["m", "b1"], ["a"]),
             helper.make_node("Gelu", ["a"], ["g"], domain=""),
             helper.make_node("LayerNormalization", ["g", "s", "t"], ["n"], axis=-1),
             helper.make_node("Transpose", ["n"], ["y"], perm=[1, 0])]
    graph = helper.make_graph(nodes, path.stem, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [32, 4])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), path)
    return path


def _generate(models: list[Path], out: Path, backend: str) -> dict[str, str]:
    """The generated sources by file name; the onnxruntime backend's subgraphs in ONNX's text
    form (``<file>.txt``), beside its index."""
    result = CliRunner().invoke(main, ["generate", *map(str, models), "--out", str(out), "--backend", backend])
    assert result.exit_code == 0, result.output
    folder = out / backend
    got = {p.name: p.read_text() for p in sorted(folder.iterdir())
           if p.is_file() and p.suffix in (".cpp", ".txt", ".json") and p.name not in ("CMakeLists.txt",
                                                                                      "variants.json")}
    for p in sorted(folder.glob("models/*.onnx")):
        got[p.name + ".txt"] = onnx.printer.to_text(onnx.load(p)) + "\n"
    return got


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("models")
    return [_model(root / "a.onnx", ("conv_a", "fc_a")), _other(root / "b.onnx")]


@pytest.mark.parametrize("backend", ["onednn", "cudnn", "onnxruntime"])
def test_generated_code_does_not_depend_on_model_order(models, tmp_path, backend) -> None:
    # a third model holding the first one's layers under other node names: which model a shared
    # layer's benchmark comes from must not depend on the order either
    models = [*models, _model(tmp_path / "c.onnx", ("conv_c", "fc_c"))]
    forward = _generate(models, tmp_path / "abc", backend)
    backward = _generate(models[::-1], tmp_path / "cba", backend)
    assert forward and forward == backward


@pytest.mark.parametrize("backend", ["onednn", "cudnn", "onnxruntime"])
def test_generated_code_matches_golden(models, tmp_path, backend) -> None:
    """Whole generated sources for the two small models. After an intended change, regenerate
    with ``BENANZA_REGEN_GOLDEN=1 pytest tests/ops/test_registry.py -k golden`` and review the diff."""
    import os

    got = _generate(models, tmp_path / "out", backend)
    folder = GOLDEN / backend
    if os.environ.get("BENANZA_REGEN_GOLDEN"):
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.iterdir():
            old.unlink()
        for name, text in got.items():
            (folder / name).write_text(text)
    want = {p.name: p.read_text() for p in sorted(folder.iterdir())}
    assert got.keys() == want.keys()
    for name in want:
        assert got[name] == want[name], f"{backend}/{name} differs from tests/fixtures/golden/{backend}/{name}"


@pytest.mark.parametrize("family", [f for f in FAMILIES if f.onednn is not None and isinstance(f.onednn.reference,
                                                                                                Fills)],
                         ids=lambda f: f.name)
def test_reference_fills_name_the_nodes_inputs(family) -> None:
    """A family's check hook names distinct inputs the node has, the data input first."""
    view = EXAMPLES[family.name]
    fills = family.onednn.reference.order(build_layer(view).problem)
    assert fills[0] == 0 and len(set(fills)) == len(fills)
    assert all(i < len(view.inputs) and view.inputs[i] is not None for i in fills)


def _pattern_gaps(pattern: FusionPattern) -> list[str]:
    """What a fusion pattern lacks: the oneDNN backend benchmarks every pattern fused unless the
    pattern names why it cannot, and ``benanza check`` compares each with its reference."""
    lowering = PATTERN_LOWERINGS.get(pattern.name)
    if lowering is not None and "onednn" in lowering.gaps:
        return []
    return [] if callable(pattern.reference) else ["no reference for benanza check"]


@pytest.mark.parametrize("pattern", FUSION_PATTERNS.values(), ids=lambda p: p.name)
def test_every_fusion_pattern_has_a_check_reference(pattern) -> None:
    assert _pattern_gaps(pattern) == []
    lowering = PATTERN_LOWERINGS.get(pattern.name)
    if lowering is None or "onednn" not in lowering.gaps:
        assert _pattern_gaps(dataclasses.replace(pattern, reference=None)) == ["no reference for benanza check"]
