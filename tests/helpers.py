"""Small ONNX graphs for tests, built with onnx.helper (no committed blobs), and where the
repository's folders lie."""

from __future__ import annotations

import sqlite3
import zlib
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# Test files sit in folders of different depths (docs/contributing.md): they find the repository
# and the fixtures through these, never by counting parents of their own path.
TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
FIXTURES = TESTS / "fixtures"


def tensor(name: str, shape, value: float | None = None, dtype=np.float32) -> onnx.TensorProto:
    # crc32, not hash(): str hashes change with every process (PYTHONHASHSEED), the weights must not
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    arr = np.full(shape, value, dtype) if value is not None else rng.standard_normal(shape).astype(dtype)
    return numpy_helper.from_array(arr, name)


def model(nodes, inputs, outputs, initializers=(), opset: int = 13, ir_version: int | None = None):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    if ir_version is not None:
        m.ir_version = ir_version
    return m


def io(name: str, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def conv_net(weights_as: str = "initializer", opset: int = 13) -> onnx.ModelProto:
    """Conv(bias)→Relu→Conv(no bias)→BN→Relu→MaxPool→Flatten→Gemm→Softmax.

    ``weights_as``: "initializer", "constant" (Constant nodes) or "constant_of_shape"
    (BN scale from ConstantOfShape, the rest Constant nodes) — same layers either way.
    """
    consts = {
        "W1": tensor("W1", (8, 3, 3, 3)), "B1": tensor("B1", (8,)),
        "W2": tensor("W2", (8, 8, 3, 3)), "mean": tensor("mean", (8,), 0.0),
        "var": tensor("var", (8,), 1.0), "bias": tensor("bias", (8,), 0.0),
        "Wfc": tensor("Wfc", (10, 8 * 4 * 4)), "Bfc": tensor("Bfc", (10,)),
    }
    pre = []
    inits = []
    if weights_as == "initializer":
        inits = list(consts.values()) + [tensor("scale", (8,), 1.0)]
    else:
        for name, t in consts.items():
            pre.append(helper.make_node("Constant", [], [name], value=t))
        if weights_as == "constant_of_shape":
            pre.append(helper.make_node("Constant", [], ["scale_shape"],
                                        value=numpy_helper.from_array(np.array([8], np.int64))))
            pre.append(helper.make_node("ConstantOfShape", ["scale_shape"], ["scale"],
                                        value=numpy_helper.from_array(np.array([1.0], np.float32))))
        else:
            pre.append(helper.make_node("Constant", [], ["scale"], value=tensor("scale", (8,), 1.0)))
    nodes = pre + [
        helper.make_node("Conv", ["x", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "W2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("BatchNormalization", ["c2", "scale", "bias", "mean", "var"], ["b2"], name="bn2"),
        helper.make_node("Relu", ["b2"], ["r2"], name="relu2"),
        helper.make_node("MaxPool", ["r2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2], name="pool2"),
        helper.make_node("Flatten", ["p2"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "Wfc", "Bfc"], ["logits"], transB=1, name="fc"),
        helper.make_node("Softmax", ["logits"], ["y"], axis=1, name="softmax"),
    ]
    return model(nodes, [io("x", ["N", 3, 8, 8])], [io("y", None)], inits, opset=opset)


def generate_bench(models, backend: str, root, options, layers=None):
    """What `benanza generate` leaves in ``root`` for ``models``: the manifest, written there for
    run and check to read, and the backend's project, as (manifest, Generated). ``layers``: the
    unique layers to benchmark, the models' own by default."""
    from benanza.generator import generate
    from benanza.layers import unique_layers
    from benanza.manifest import build_manifest, write_manifest

    manifest = build_manifest(models, unique_layers(models) if layers is None else layers)
    write_manifest(manifest, root)
    return manifest, generate(manifest, backend, root, options)


def generated_conv_net(root):
    """`benanza generate` output in ``root`` (manifest and oneDNN f32 NCHW variants, no fusions)
    for conv_net: the small real model the fault and measurement tests run."""
    from benanza.generator import GenOptions
    from benanza.processor import load_model

    models = [load_model(conv_net(), batch_size=1, name="conv_net")]
    generate_bench(models, "onednn", root, GenOptions(dtypes=("f32",), layouts=("nchw",), fusion=False))
    return root


def assert_faults_isolated(bench, system, backend: str, crash: str, hang: str, variants: str, timeout: float,
                           db) -> None:
    """One crashing and one hanging benchmark of ``backend`` (the runtime's fault hooks) cost only
    themselves: each fails with its cause and a line that reproduces it, the rest of the batch runs."""
    from benanza import runner
    from benanza.generator import BACKEND_MODULES

    options = runner.RunOptions(filter=variants, threads=1, min_time=0.01, repetitions=1, timeout=timeout,
                                remeasure=0, env=(("BENANZA_FAULT_ABORT", crash), ("BENANZA_FAULT_HANG", hang)))
    summary = runner.run(bench, system, backend, db, options)
    failed = {f.name: f for f in summary.failures}
    assert set(failed) == {crash, hang}
    assert failed[crash].message.startswith("crashed (SIGABRT)")
    assert failed[hang].message == f"timed out after {timeout:g}s"
    assert f"-m {BACKEND_MODULES[backend]}" in failed[crash].reproduce
    assert summary.ok == summary.total - 2 > 0


def best_low_ms(db, backend: str, layer_key: str, dtype: str = "f32") -> float | None:
    """The bound's latency of a layer, recomputed in SQL: the lowest low percentile among the
    newest OK unfused results of the layer's variants of ``dtype`` on the backend."""
    con = sqlite3.connect(db)
    row = con.execute(
        "SELECT MIN(r.low_ms) FROM results r JOIN variants v ON v.name = r.variant "
        "WHERE v.backend = ? AND r.layer_key = ? AND v.fusion = 'none' AND r.status = 'ok' AND v.dtype = ? "
        "AND r.id = (SELECT MAX(id) FROM results WHERE variant = r.variant)", (backend, layer_key, dtype)).fetchone()
    con.close()
    return row[0]


def newest_row(db, name: str) -> sqlite3.Row:
    """The newest measurement of a variant, straight from SQL."""
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    row = con.execute("SELECT * FROM results WHERE variant = ? ORDER BY id DESC LIMIT 1", (name,)).fetchone()
    con.close()
    assert row is not None, name
    return row


def invoke(*args: str) -> str:
    """The CLI's stdout for ``args``, which must succeed."""
    from click.testing import CliRunner

    from benanza.cli import main

    out = CliRunner().invoke(main, list(args))
    assert out.exit_code == 0, (out.exit_code, out.output, out.exception)
    return out.stdout


def residual_net() -> onnx.ModelProto:
    """A ResNet v1 in small: a stem Conv→Relu, a block whose second Conv(bias)→BN meets the stem's
    output in the residual Add, and a downsampling-style block whose two Conv→BN branches meet in
    the Add; a Relu after each Add. 32 channels: a whole number of NCHWc blocks on AVX2 and AVX-512."""
    def bn(name: str, x: str) -> tuple[onnx.NodeProto, list[onnx.TensorProto]]:
        return (helper.make_node("BatchNormalization", [x, f"{name}_s", f"{name}_b", f"{name}_m", f"{name}_v"],
                                 [name], name=name),
                [tensor(f"{name}_s", (32,)), tensor(f"{name}_b", (32,)), tensor(f"{name}_m", (32,), 0.1),
                 tensor(f"{name}_v", (32,), 1.5)])

    nodes, inits = [], []

    def conv(name: str, x: str, k: int, bias: bool) -> str:
        nodes.append(helper.make_node("Conv", [x, f"{name}_w", *([f"{name}_b"] if bias else [])], [name],
                                      pads=[k // 2] * 4, name=name))
        inits.extend([tensor(f"{name}_w", (32, 32, k, k)), *([tensor(f"{name}_b", (32,))] if bias else [])])
        return name

    def norm(name: str, x: str) -> str:
        node, ts = bn(name, x)
        nodes.append(node)
        inits.extend(ts)
        return name

    def op(kind: str, name: str, *xs: str) -> str:
        nodes.append(helper.make_node(kind, list(xs), [name], name=name))
        return name

    stem = op("Relu", "stem_relu", conv("stem", "x", 3, False))
    a = op("Relu", "a_relu", norm("a_bn", conv("a", stem, 3, True)))
    r1 = op("Relu", "r1", op("Add", "add1", norm("b_bn", conv("b", a, 3, True)), stem))
    c = norm("c_bn", conv("c", r1, 3, True))
    d = norm("d_bn", conv("d", r1, 1, False))
    op("Relu", "y", op("Add", "add2", c, d))
    return model(nodes, [io("x", [1, 32, 28, 28])], [io("y", [1, 32, 28, 28])], inits)
