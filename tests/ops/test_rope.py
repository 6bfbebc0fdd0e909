"""Rotary position embeddings as one layer: the rotate-half decomposition of Hugging Face's
Llama/Qwen2/Phi code (the ``rope`` pattern, in hand-built graphs and in real exports of both
exporters), opset 23's RotaryEmbedding and ONNX Runtime's com.microsoft RotaryEmbedding; keys,
FLOPs and bytes recomputed from the shapes, the rotation checked against ONNX Runtime running the
nodes, and generate → run → database → analyze → ``check`` on oneDNN."""

from __future__ import annotations

import math
import subprocess

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers import generate_bench, io, model
from onnx import helper, numpy_helper

from benanza.backends import cudnn, onednn
from benanza.fusion import BY_NAME, match_fusions
from benanza.ops.registry import PATTERN_LOWERINGS, parse_layer_key
from benanza.ops.rope import RopeProblem
from benanza.processor import load_model
from tests.backends.test_cudnn import NEED_TOOLCHAIN, _build, _lines

B, H, S, D = 1, 4, 3, 16
X, CS = (B, H, S, D), (B, 1, S, D)


def _decomposition(swap: bool = False) -> list:
    """x·cos + Concat(−x[½:], x[:½])·sin, as both exporters write transformers' apply_rotary_pos_emb
    (``swap``: the halves the other way round, which is no rotation)."""
    n = helper.make_node
    lo, hi = ("hi", "lo") if swap else ("lo", "hi")
    return [n("Mul", ["x", "cos"], ["xc"]),
            n("Slice", ["x", "zero", "mid", "last"], [lo]), n("Slice", ["x", "mid", "end", "last"], [hi]),
            n("Neg", ["hi"], ["nhi"]), n("Concat", ["nhi", "lo"], ["rot"], axis=-1),
            n("Mul", ["rot", "sin"], ["rs"]), n("Add", ["xc", "rs"], ["y"])]


def _inits() -> list:
    return [numpy_helper.from_array(np.array([v], np.int64), name)
            for name, v in (("zero", 0), ("mid", D // 2), ("end", D), ("last", -1))]


def _decomposition_model(swap: bool = False) -> onnx.ModelProto:
    return model(_decomposition(swap), [io("x", list(X)), io("cos", list(CS)), io("sin", list(CS))],
                 [io("y", None)], _inits(), opset=17)


def rope_reference(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, rot: int, interleaved: bool) -> np.ndarray:
    """The rotation by its definition, pair by pair: (a, b) ↦ (a·cos − b·sin, b·cos + a·sin) over the
    first ``rot`` features (pairs: the halves, or adjacent features), cos/sin one value per pair."""
    y = x.astype(np.float64).copy()
    half = rot // 2
    for j in range(half):
        ia, ib = (2 * j, 2 * j + 1) if interleaved else (j, j + half)
        c, s = cos[..., j], sin[..., j]
        a, b = x[..., ia].astype(np.float64), x[..., ib].astype(np.float64)
        y[..., ia], y[..., ib] = a * c - b * s, b * c + a * s
    return y


def _run(m: onnx.ModelProto, feed: dict) -> np.ndarray:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feed)[0]


def test_decomposition_is_one_rope_with_its_key_and_work() -> None:
    m = load_model(_decomposition_model(), name="rope")
    (match,) = match_fusions(m)
    assert match.pattern is BY_NAME["rope"] and sorted(match.nodes) == list(range(len(m.nodes)))
    assert [m.nodes[i].layer.op for i in match.nodes] == ["Mul", "Slice", "Slice", "Neg", "Concat", "Mul", "Add"]
    assert m.nodes[match.nodes[0]].outputs == ("rs",)  # the anchor: the Mul by sin
    assert match.conv_key == f"binary:mul_in{B}x{H}x{S}x{D}_in{B}x1x{S}x{D}_f32"
    lowering = PATTERN_LOWERINGS["rope"]
    assert lowering.onednn is not None and lowering.cudnn is not None
    table, row = lowering.onednn
    params = row(match.conv.problem, "binary")
    assert table == "rope" and (params.x, params.cs, params.rot, params.interleaved) == (X, CS, D, False)
    layer = lowering.cudnn.row(match.conv.problem, "cudnn_frontend.rope")
    assert (layer.rank, layer.x[:4], layer.cs[:4], layer.rot) == (4, X, CS, D)
    # the work, counted from the decomposition's nodes: two products and a sum per element (x·cos,
    # rotated·sin, their Add) and the Neg of half of them, which the fused kernel folds into the sum
    fused = RopeProblem(X, CS, D)
    unfused = sum(m.nodes[i].layer.flops for i in match.nodes)
    assert unfused == 3 * math.prod(X) + math.prod(X) // 2
    assert fused.flops() == unfused - math.prod(X) // 2
    # x read and y written once, cos and sin read once: f32
    assert fused.compulsory_bytes(4 * math.prod(X) * 3, 4 * math.prod(X)) == 4 * (2 * math.prod(X) + 2 * math.prod(CS))
    # what the nodes compute is the rotation (ONNX Runtime runs them)
    rng = np.random.default_rng(3)
    feed = {k: rng.standard_normal(s).astype(np.float32) for k, s in (("x", X), ("cos", CS), ("sin", CS))}
    want = rope_reference(feed["x"], feed["cos"][..., : D // 2], feed["sin"][..., : D // 2], D, False)
    # transformers' cos/sin repeat their halves (Concat(freqs, freqs)); with other values the second
    # half is multiplied by the second half's cos and sin
    feed["cos"][..., D // 2:] = feed["cos"][..., : D // 2]
    feed["sin"][..., D // 2:] = feed["sin"][..., : D // 2]
    np.testing.assert_allclose(_run(_decomposition_model(), feed), want, rtol=1e-5, atol=1e-6)


def test_the_pattern_needs_the_rotation() -> None:
    assert not match_fusions(load_model(_decomposition_model(swap=True), name="swapped"))
    nodes = _decomposition()
    nodes[-1] = helper.make_node("Sub", ["xc", "rs"], ["y"])  # x·cos − rotated·sin
    m = model(nodes, [io("x", list(X)), io("cos", list(CS)), io("sin", list(CS))], [io("y", None)], _inits(), opset=17)
    assert not match_fusions(load_model(m, name="sub"))


def _op_models() -> dict[str, tuple[onnx.ModelProto, RopeProblem]]:
    """RotaryEmbedding as opset 23 and ONNX Runtime write it: 4-d and 3-d inputs, position ids or a
    cache per token, interleaved pairs, a partial rotation."""
    n = helper.make_node
    max_pos, seq, heads, head = 12, S, H, D
    out: dict[str, tuple[onnx.ModelProto, RopeProblem]] = {}
    # opset 23, 4-d [B, heads, S, D], a cache per (batch, token), full rotation
    node = n("RotaryEmbedding", ["x", "cos", "sin"], ["y"], name="rope")
    out["onnx23_4d"] = (model([node], [io("x", [2, heads, seq, head]), io("cos", [2, seq, head // 2]),
                                       io("sin", [2, seq, head // 2])], [io("y", None)], opset=23),
                        RopeProblem((2, heads, seq, head), (2, 1, seq, head // 2), head))
    # opset 23, 3-d [B, S, hidden], position ids into a cache, interleaved, half the head rotated
    node = n("RotaryEmbedding", ["x", "cos", "sin", "pos"], ["y"], name="rope", num_heads=heads,
             rotary_embedding_dim=head // 2, interleaved=1)
    out["onnx23_3d"] = (model([node], [io("x", [1, seq, heads * head]), io("cos", [max_pos, head // 4]),
                                       io("sin", [max_pos, head // 4]), io("pos", [1, seq], onnx.TensorProto.INT64)],
                              [io("y", None)], opset=23),
                        RopeProblem((1, seq, heads, head), (1, seq, 1, head // 4), head // 2, True))
    # ONNX Runtime's: (input, position_ids, cos_cache, sin_cache), 3-d
    node = n("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], name="rope", domain="com.microsoft",
             num_heads=heads)
    inputs = [io("x", [1, seq, heads * head]), io("pos", [1, seq], onnx.TensorProto.INT64),
              io("cos", [max_pos, head // 2]), io("sin", [max_pos, head // 2])]
    graph = helper.make_graph([node], "g", inputs, [io("y", None)])
    out["ort"] = (helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                          helper.make_opsetid("com.microsoft", 1)]),
                  RopeProblem((1, seq, heads, head), (1, seq, 1, head // 2), head))
    return out


@pytest.mark.parametrize("form", ["onnx23_4d", "onnx23_3d", "ort"])
def test_rotary_embedding_ops_are_one_rope(form) -> None:
    proto, want = _op_models()[form]
    (node,) = load_model(proto, name=form).nodes
    layer = node.layer
    assert layer.problem == want and parse_layer_key(layer.key) == (want, "f32")
    assert layer.flops == 3 * math.prod(want.x[:-1]) * want.rot
    assert layer.onednn_primitive == "binary" and onednn.covers(layer)
    assert layer.cudnn_api == "cudnn_frontend.rope" and cudnn.family_of(layer) is not None
    # the op's output is the rotation of its input by the cos/sin rows its position ids pick
    rng = np.random.default_rng(4)
    feed = {}
    for i in proto.graph.input:
        dims = [d.dim_value for d in i.type.tensor_type.shape.dim]
        feed[i.name] = (np.arange(math.prod(dims)).reshape(dims) if i.name == "pos"
                        else rng.standard_normal(dims).astype(np.float32))
    rows = feed["cos"] if "pos" not in feed else feed["cos"][feed["pos"]]  # [B, S, rot/2]
    sin = feed["sin"] if "pos" not in feed else feed["sin"][feed["pos"]]
    x = feed["x"].reshape(want.x)
    if form == "onnx23_4d":  # [B, heads, S, D]: one cos row per (batch, token), for every head
        c, s = rows[:, None], sin[:, None]
    else:  # [B, S, heads, D]
        c, s = rows[:, :, None], sin[:, :, None]
    expected = rope_reference(x, c, s, want.rot, want.interleaved).reshape(feed["x"].shape)
    np.testing.assert_allclose(_run(proto, feed), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # exports the tiny decoder with both exporters
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_found_in_decoder_exports(tmp_path, exporter) -> None:
    """tests/llm_models.py's decoder (transformers' rotate_half; grouped-query attention: K has
    fewer heads than Q): a rope match for Q and for K in every layer, one unfused Neg left."""
    import llm_models

    opset = {"torchscript": 17, "dynamo": 18}[exporter]
    m = load_model(llm_models.export(tmp_path, seq=1, past=8, opset=opset, exporter=exporter))
    ropes = [f for f in match_fusions(m) if f.pattern.name == "rope"]
    hd = llm_models.HEAD_DIM
    want = {f"binary:mul_in1x{llm_models.HEADS}x1x{hd}_in1x1x1x{hd}_f32",
            f"binary:mul_in1x{llm_models.KV_HEADS}x1x{hd}_in1x1x1x{hd}_f32"}
    assert len(ropes) == 2 * llm_models.LAYERS and {f.conv_key for f in ropes} == want
    negs = {nd.index for nd in m.nodes if nd.layer.op == "Neg" and nd.runs}
    assert negs <= {i for f in ropes for i in f.nodes}


@pytest.mark.slow  # builds and runs a oneDNN project
def test_generate_run_check_on_onednn(tmp_path) -> None:
    """The fused variant and the ops through the real pipeline: generated, built, run into the
    database (every result OK), substituted by Q5 for the pattern's 7 layers, and computing what
    ONNX Runtime computes of the model's own nodes (``benanza check``)."""
    from benanza.analyzer import analyze
    from benanza.check import CheckOptions, CheckStatus, check
    from benanza.generator import GenOptions
    from benanza.perfdb import PerfDB
    from benanza.runner import RunOptions, run

    paths = []
    for name, proto in [("decomposition", _decomposition_model())] + [(k, v[0]) for k, v in _op_models().items()]:
        paths.append(tmp_path / f"{name}.onnx")
        onnx.save(proto, paths[-1])
    models = [load_model(p) for p in paths]
    out = tmp_path / "bench"
    _, gen = generate_bench(models, "onednn", out, GenOptions(dtypes=("f32",)))
    fused = [v for v in gen.variants if v.fusion == "rope"]
    assert {v.layer_key for v in fused} == {f"binary:mul_in{B}x{H}x{S}x{D}_in{B}x1x{S}x{D}_f32"}
    ops = [v for v in gen.variants if v.problem.family == "rope"]
    assert {v.problem for v in ops} == {p for _, p in _op_models().values()}
    summary = run(out, "ci", "onednn", tmp_path / "r.db", RunOptions(min_time=0.01, repetitions=1, build_jobs=1))
    assert summary.failed == 0, summary.failures
    with PerfDB(tmp_path / "r.db") as pdb:
        results = pdb.results("ci")
    mine = [r for r in results if r.variant.fusion == "rope" or r.variant.problem.family == "rope"]
    assert len(mine) == len(fused) + len(ops) and all(r.ok for r in mine), [(r.variant.name, r.message) for r in mine]
    # four binary primitives (and one reorder for a partial rotation), their implementations joined
    assert all(r.implementation.count(" + ") in (3, 4) for r in mine), [r.implementation for r in mine]
    a = analyze(models[0], results, "ci", "onednn")
    uses = [u for u in a.fusion.applied + a.fusion.unprofitable if u.pattern == "rope"]
    assert len(uses) == 1 and len(uses[0].nodes) == 7
    assert uses[0].fused_ms == pytest.approx(min(r.latency_ms for r in results if r.variant.fusion == "rope"))
    checked = {r.name: r for r in check(out, models, CheckOptions(build_jobs=1))}
    for v in fused + ops:
        r = checked[v.name]
        assert r.status is CheckStatus.OK, (v.name, r.status, r.compared, r.where)


@pytest.mark.slow  # builds a cuDNN project
@NEED_TOOLCHAIN
def test_cudnn_graphs_validate(tmp_path, cudnn_runtime) -> None:
    """The fused form and the ops as graphs of pointwise nodes over strided views, accepted by the
    cuDNN frontend's own validation for an sm_90 GPU (no GPU needed)."""
    from benanza.generator import GenOptions, generate
    from benanza.layers import unique_layers
    from benanza.manifest import build_manifest

    paths = []
    for name, proto in [("decomposition", _decomposition_model())] + [(k, v[0]) for k, v in _op_models().items()]:
        paths.append(tmp_path / f"{name}.onnx")
        onnx.save(proto, paths[-1])
    models = [load_model(p) for p in paths]
    g = generate(build_manifest(models, unique_layers(models)), "cudnn", tmp_path, GenOptions(dtypes=("f32", "f16")))
    mine = [v for v in g.variants if v.fusion == "rope" or v.problem.family == "rope"]
    assert len({(v.problem, v.dtype) for v in mine}) == 2 * 4
    binary = _build(g.out_dir, runtime=cudnn_runtime)
    done = subprocess.run([str(binary), "--benanza_check_graphs=90"], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [ln for ln in _lines(done.stdout, "BENANZA_GRAPH") if "rope" in ln["name"]]
    assert len(lines) == 2 * 4 and all(ln["ok"] for ln in lines), lines
