"""Grouped-query attention as one layer: the attention patterns through transformers' repeat_kv
(Unsqueeze → Expand → Reshape of K and V to Q's head count) in real exports of
tests/llm_models.py's decoder (4 query heads over 2 KV heads, both exporters) and of
transformers' own Llama (dynamo), and through its pack_gqa (Q's heads folded into rows over K and
V unrepeated) in the TorchScript exporter's decode steps of that Llama, opset 23's Attention with
fewer K/V heads than Q's, and ONNX Runtime's com.microsoft GroupQueryAttention: keys, FLOPs and
bytes recomputed from the shapes, generate → run → database → analyze on oneDNN, the fused
benchmark's output checked against ONNX Runtime running the model's own nodes, and cuDNN's SDPA
graphs with 2 KV heads validated."""

from __future__ import annotations

import subprocess

import hf_models
import llm_models
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers import generate_bench, io, model
from onnx import helper

from benanza.fusion import match_fusions
from benanza.ops.attention import AttentionProblem
from benanza.ops.registry import parse_layer_key
from benanza.processor import load_model
from tests.backends.test_cudnn import NEED_TOOLCHAIN, _build, _lines, _run_without_gpu

SEQ, PAST = 1, 8
HEADS, KV, D = llm_models.HEADS, llm_models.KV_HEADS, llm_models.HEAD_DIM
KEYS = PAST + SEQ
GQA_KEY = f"attention:q1x{HEADS}x{SEQ}x{D}_k1x{KV}x{KEYS}x{D}_v1x{KV}x{KEYS}x{D}_mask1x1x{SEQ}x{KEYS}_f32"


def _export(tmp_path, exporter: str):
    return llm_models.export(tmp_path, seq=SEQ, past=PAST, opset={"torchscript": 17, "dynamo": 18}[exporter],
                             exporter=exporter)


def _attention_matches(m):
    return [f for f in match_fusions(m) if f.pattern.attention]


@pytest.mark.slow  # exports the tiny decoder
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_attention_matches_through_repeat_kv(tmp_path, exporter) -> None:
    """Every layer's attention is one match that takes in both repeats (no Expand of K or V is
    left to cost), keyed as the attention with K and V's own 2 heads; its work is what the
    model's own two MatMuls compute for all 4 query heads plus the per-score steps, and its
    bytes read K and V once per KV head (the present K/V the export returns)."""
    path = _export(tmp_path, exporter)
    m = load_model(path)
    matches = _attention_matches(m)
    assert len(matches) == llm_models.LAYERS
    assert {f.conv_key for f in matches} == {GQA_KEY}
    assert parse_layer_key(GQA_KEY) == (matches[0].conv.problem, "f32")
    inside = {i for f in matches for i in f.nodes}
    expands = [n.index for n in m.nodes if n.layer.op == "Expand" and n.runs and n.layer.dtype == "f32"]
    assert len(expands) == 2 * llm_models.LAYERS and set(expands) <= inside
    for f in matches:
        p = f.conv.problem
        assert isinstance(p, AttentionProblem) and p.group == HEADS // KV
        # the work: the model's own scores and PV MatMuls (over the repeated K/V, so every query
        # head) and, per score, the scale, the mask's add and the softmax's 5
        matmuls = [m.nodes[i].layer for i in f.nodes if m.nodes[i].layer.op == "MatMul"]
        assert len(matmuls) == 2
        scores = HEADS * SEQ * KEYS
        assert f.conv.macs == sum(mm.macs for mm in matmuls) == scores * 2 * D
        assert f.conv.flops == 2 * f.conv.macs + 7 * scores
    # the bytes, from what ONNX Runtime returns: Q and the output [1, 4, 1, 16], the present K
    # and V (2 KV heads, read once each), the [1, 1, 1, 9] mask, f32
    feeds = dict(zip(llm_models.input_names(), (t.numpy() for t in llm_models.example(SEQ, PAST))))
    names = [o.name for o in onnx.load(path, load_external_data=False).graph.output]
    out = dict(zip(names, ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)))
    kv = out["present_k0"].size + out["present_v0"].size
    assert out["present_k0"].shape == (1, KV, KEYS, D)
    assert matches[0].conv.bytes == 4 * (2 * HEADS * SEQ * D + kv + feeds["mask"].size)


@pytest.mark.slow  # exports transformers' Llama
@pytest.mark.parametrize("step", [hf_models.Step("llama", 1, PAST), hf_models.Step("llama", 4, 0, masked=False)],
                         ids=["decode_masked", "prefill"])
def test_transformers_exports_match(tmp_path, step) -> None:
    """Hugging Face's own Llama (dynamo exporter): transformers' repeat_kv, the exported SDPA's
    Q and Kᵀ scales and its NaN guard Where(IsNaN(p), 0, p) after the softmax, all one match per
    layer, keyed with the 2 KV heads."""
    m = load_model(hf_models.export(step, "dynamo", tmp_path))
    matches = _attention_matches(m)
    cfg = hf_models.config("llama")
    assert len(matches) == cfg.num_hidden_layers
    keys = step.past + step.seq
    mask = f"1x1x{step.seq}x{keys}"
    assert {f.conv_key for f in matches} == {
        f"attention:q1x{HEADS}x{step.seq}x{D}_k1x{KV}x{keys}x{D}_v1x{KV}x{keys}x{D}_mask{mask}_f32"}
    for f in matches:
        ops = [m.nodes[i].layer.op for i in f.nodes]
        assert f.pattern.name == "sdpa_qk_scale_mask" and ops.count("Expand") == 2
        assert {"IsNaN", "Where"} <= set(ops)


FOLDED = [hf_models.Step("llama", 1, PAST), hf_models.Step("llama", 1, PAST, masked=False)]


@pytest.mark.slow  # exports transformers' Llama
@pytest.mark.parametrize("step", FOLDED, ids=["masked", "unmasked"])
def test_torchscript_folded_decode_matches(tmp_path, step) -> None:
    """The TorchScript exporter's decode step of transformers' own Llama: transformers'
    ``pack_gqa`` folds Q's 4 heads into rows of its 2 KV heads (Q [1, 2, 2, 16]) over K and V
    unrepeated, with the padding mask (or the positions' causal mask, a constant) as [1, 1, 1, 9]
    broadcast over the rows. One match per layer, keyed as the attention of 4 query heads over
    the 2 KV heads (the dynamo step's key), taking in Q's fold and K's Transpose; its MACs those
    of the model's own two MatMuls and of the attention recomputed from the config."""
    m = load_model(hf_models.export(step, "torchscript", tmp_path))
    matches = _attention_matches(m)
    cfg = hf_models.config("llama")
    assert len(matches) == cfg.num_hidden_layers
    assert {f.conv_key for f in matches} == {GQA_KEY}
    # nothing repeated (the masked step expands its boolean padding mask only)
    assert not [n for n in m.nodes if n.layer.op == "Expand" and n.runs and n.layer.dtype == "f32"]
    for f in matches:
        ops = [m.nodes[i].layer.op for i in f.nodes]
        assert f.pattern.name == "sdpa_qk_scale_mask" and {"Reshape", "Transpose", "IsNaN", "Where"} <= set(ops)
        # the unfused pieces: a KV head's G·S rows of scores and PV, the same MACs as the
        # attention of every query head
        assert f.conv.macs == sum(m.nodes[i].layer.macs for i in f.nodes if m.nodes[i].layer.op == "MatMul")
    assert sum(f.conv.macs for f in matches) == hf_models.attention_macs("llama", step.seq, step.past)


def _generated(models, out):
    """The models' oneDNN f32 project in ``out``, as `benanza generate` writes it."""
    from benanza.generator import GenOptions

    return generate_bench(models, "onednn", out, GenOptions(dtypes=("f32",)))[1]


def _run_attention(out, db):
    """`benanza run` of the project's attention benchmarks into ``db``: every result, and the
    attention ones."""
    from benanza.perfdb import PerfDB
    from benanza.runner import RunOptions, run

    summary = run(out, "ci", "onednn", db, RunOptions(filter="^attention:", min_time=0.01, repetitions=1,
                                                       build_jobs=1, threads=1, peaks=False))
    assert summary.failed == 0, summary.failures
    with PerfDB(db) as pdb:
        results = pdb.results("ci")
    return results, [r for r in results if r.variant.problem.family == "attention"]


@pytest.mark.slow  # exports transformers' Llama twice, builds and runs a oneDNN project
def test_folded_decode_run_and_check_on_onednn(tmp_path) -> None:
    """Both TorchScript decode steps through the real pipeline: the one fused benchmark they share
    (the grouped attention), run into the database (OK), substituted by Q5 for each layer's
    match, and computing what ONNX Runtime computes of each model's own folded nodes (``benanza
    check`` at each model's first match: the masked step's Where output, the unmasked step's
    constant mask, both fed the benchmark's mask)."""
    from benanza.analyzer import analyze
    from benanza.check import CheckOptions, CheckStatus, check

    models = [load_model(hf_models.export(step, "torchscript", tmp_path)) for step in FOLDED]
    out = tmp_path / "bench"
    gen = _generated(models, out)
    fused = [v for v in gen.variants if v.problem.family == "attention" and v.fusion != "none"]
    assert {(v.layer_key, v.fusion) for v in fused} == {(GQA_KEY, "sdpa_qk_scale_mask")}
    results, got = _run_attention(out, tmp_path / "r.db")
    assert {r.variant.name for r in got} == {v.name for v in fused} and all(r.ok for r in got)
    for m in models:
        a = analyze(m, results, "ci", "onednn")
        uses = [u for u in a.fusion.applied + a.fusion.unprofitable if u.pattern.startswith("sdpa")]
        assert len(uses) == hf_models.config("llama").num_hidden_layers
        assert all(u.fused_ms == pytest.approx(min(r.latency_ms for r in got)) for u in uses)
        checked = {r.name: r for r in check(out, [m], CheckOptions(build_jobs=1, filter="^attention:"))}
        for v in fused:
            r = checked[v.name]
            assert r.status is CheckStatus.OK, (m.name, v.name, r.status, r.compared, r.where)


def _op_model(kv_heads: int) -> onnx.ModelProto:
    """Opset 23's Attention over Q [1, 4, 3, 16] and K/V with ``kv_heads`` heads and 5 keys, a
    float [3, 5] mask."""
    q, k = [1, HEADS, 3, D], [1, kv_heads, 5, D]
    node = helper.make_node("Attention", ["q", "k", "v", "mask"], ["y"], name="attention")
    return model([node], [io("q", q), io("k", k), io("v", k), io("mask", [3, 5])], [io("y", None)], opset=23)


def test_grouped_attention_op_is_covered() -> None:
    (node,) = load_model(_op_model(2), name="gqa_op").nodes
    p = node.layer.problem
    assert node.layer.key == f"attention:q1x{HEADS}x3x{D}_k1x2x5x{D}_v1x2x5x{D}_mask3x5_f32" and p.group == 2
    assert node.layer.onednn_primitive == "matmul_softmax_matmul"
    assert node.layer.cudnn_api == "cudnn_frontend.sdpa"
    assert node.layer.macs == HEADS * 3 * 5 * 2 * D
    assert node.layer.bytes == 4 * (2 * HEADS * 3 * D + 2 * 2 * 5 * D + 3 * 5)


def _ort_gqa(seq: int, past: int) -> onnx.ModelProto:
    """ONNX Runtime's com.microsoft GroupQueryAttention as its transformer optimizer and
    onnxruntime-genai write it: query/key/value [1, S, heads·D], the past K/V [1, 2, P, D], the
    total length a constant."""
    n = helper.make_node("GroupQueryAttention", ["q", "k", "v", "past_k", "past_v", "seqlens", "total"],
                         ["y", "present_k", "present_v"], domain="com.microsoft", num_heads=HEADS, kv_num_heads=KV)
    i32 = onnx.TensorProto.INT32
    inputs = [io("q", [1, seq, HEADS * D]), io("k", [1, seq, KV * D]), io("v", [1, seq, KV * D]),
              io("past_k", [1, KV, past, D]), io("past_v", [1, KV, past, D]), io("seqlens", [1], i32)]
    total = helper.make_tensor("total", i32, [], [past + seq])
    graph = helper.make_graph([n], "g", inputs, [io("y", None), io("present_k", None), io("present_v", None)],
                              [total])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def _gqa_reference(q, k, v, past: int) -> np.ndarray:
    """softmax(Q·Kᵀ/√D, causal from the past's end)·V per query head h, reading KV head h // G."""
    heads, kv_heads, d = q.shape[1], k.shape[1], q.shape[-1]
    s, t = q.shape[2], k.shape[2]
    allowed = np.arange(t)[None, :] <= past + np.arange(s)[:, None]
    out = np.empty(q.shape[:3] + (v.shape[-1],))
    for h in range(heads):
        g = h // (heads // kv_heads)
        scores = np.where(allowed, q[0, h].astype(np.float64) @ k[0, g].T / np.sqrt(d), -np.inf)
        p = np.exp(scores - scores.max(-1, keepdims=True))
        out[0, h] = (p / p.sum(-1, keepdims=True)) @ v[0, g]
    return out


@pytest.mark.parametrize("seq, past, mask", [(1, 8, ""), (3, 5, "_mask1x1x3x8")])
def test_ort_group_query_attention_is_one_attention(seq, past, mask) -> None:
    """Keyed and costed as the attention of 4 query heads over the 2 KV heads' past + new keys;
    what ONNX Runtime computes is that attention (recomputed here head by head), so the shapes
    the problem records are the op's. Its causal mask ends at the last key: one new token sees
    them all (no mask), new tokens after a past need an explicit mask (a causal one would start
    at the first key and skip keys the op attends)."""
    proto = _ort_gqa(seq, past)
    (node,) = load_model(proto, name="ort_gqa").nodes
    keys = past + seq
    want = AttentionProblem((1, HEADS, seq, D), (1, KV, keys, D), (1, KV, keys, D),
                            (1, 1, seq, keys) if mask else None)
    assert node.layer.problem == want and parse_layer_key(node.layer.key) == (want, "f32")
    assert node.layer.key == f"attention:q1x{HEADS}x{seq}x{D}_k1x{KV}x{keys}x{D}_v1x{KV}x{keys}x{D}{mask}_f32"
    assert node.layer.macs == HEADS * seq * keys * 2 * D
    assert node.layer.flops == 2 * node.layer.macs + (7 if mask else 6) * HEADS * seq * keys  # the mask's add
    assert node.layer.onednn_primitive == "matmul_softmax_matmul"
    rng = np.random.default_rng(5)
    feed = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
            for i in proto.graph.input if i.name != "seqlens"}
    feed["seqlens"] = np.array([keys - 1], np.int32)
    y, pk, pv = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
    assert pk.shape == pv.shape == want.k  # the K/V the op attends: past and new, 2 heads
    q = feed["q"].reshape(1, seq, HEADS, D).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(y.reshape(1, seq, HEADS, D).transpose(0, 2, 1, 3), _gqa_reference(q, pk, pv, past),
                               rtol=1e-4, atol=1e-5)


@pytest.mark.slow  # exports and builds and runs a oneDNN project
def test_generate_run_check_on_onednn(tmp_path) -> None:
    """Both exporters' decoders, transformers' Llama (dynamo) and the grouped ops through the real
    pipeline: one fused benchmark per pattern for the 2 layers of each, run into the database
    (OK), substituted by Q5 for each match's
    nodes (the repeats' copies included), and computing what ONNX Runtime computes of the
    model's own nodes (``benanza check``); opset 23's op against ONNX Runtime's Attention; ONNX
    Runtime's GroupQueryAttention benchmarked through the same chain (no reference)."""
    from benanza.analyzer import analyze
    from benanza.check import CheckOptions, CheckStatus, check

    op, ort_op = tmp_path / "gqa_op.onnx", tmp_path / "ort_gqa.onnx"
    onnx.save(_op_model(2), op)
    onnx.save(_ort_gqa(SEQ, PAST), ort_op)
    hf = hf_models.export(hf_models.Step("llama", SEQ, PAST), "dynamo", tmp_path)
    decoders = [load_model(_export(tmp_path, e)) for e in ("torchscript", "dynamo")] + [load_model(hf)]
    models = decoders + [load_model(op), load_model(ort_op)]
    out = tmp_path / "bench"
    gen = _generated(models, out)
    mine = [v for v in gen.variants if v.problem.family == "attention"]
    fused = [v for v in mine if v.fusion != "none"]
    assert {v.layer_key for v in fused} == {GQA_KEY}
    assert {v.fusion for v in fused} == {"sdpa_scale_mask", "sdpa_qk_scale_mask"}  # ours; transformers' SDPA
    results, got = _run_attention(out, tmp_path / "r.db")
    assert len(got) == len(mine) and all(r.ok for r in got), [(r.variant.name, r.message) for r in got]
    for m in decoders:
        a = analyze(m, results, "ci", "onednn")
        uses = [u for u in a.fusion.applied + a.fusion.unprofitable if u.pattern.startswith("sdpa")]
        assert len(uses) == llm_models.LAYERS
        # with both repeats' copies: the fused bound counts them 0
        assert all([m.nodes[i].layer.op for i in u.nodes].count("Expand") == 2 for u in uses)
        assert all(u.fused_ms == pytest.approx(min(r.latency_ms for r in got if r.variant.fusion == u.pattern))
                   for u in uses)
    checked = {r.name: r for r in check(out, models, CheckOptions(build_jobs=1, filter="^attention:"))}
    # ONNX Runtime's op masks causally from its seqlens_k, the benchmark with generated values:
    # no reference (said why), never counted as passing
    ort_key = f"attention:q1x{HEADS}x{SEQ}x{D}_k1x{KV}x{KEYS}x{D}_v1x{KV}x{KEYS}x{D}_f32"  # one new token: no mask
    for v in mine:
        r = checked[v.name]
        want = CheckStatus.NOT_CHECKED if v.layer_key == ort_key else CheckStatus.OK
        assert r.status is want, (v.name, r.status, r.compared, r.where)


@pytest.mark.slow  # exports the decoder and builds a cuDNN project
@NEED_TOOLCHAIN
def test_cudnn_sdpa_takes_the_kv_heads(tmp_path, cudnn_runtime) -> None:
    """The grouped fused form and op as the frontend's SDPA with K/V of 2 heads under Q's 4,
    accepted by its validation for sm_90 without a GPU; run without one, a clean failure."""
    from benanza.generator import GenOptions, generate
    from benanza.layers import unique_layers
    from benanza.manifest import build_manifest

    op = tmp_path / "gqa_op.onnx"
    onnx.save(_op_model(2), op)
    models = [load_model(_export(tmp_path, "dynamo")), load_model(op)]
    g = generate(build_manifest(models, unique_layers(models)), "cudnn", tmp_path, GenOptions(dtypes=("f16",)))
    mine = [v for v in g.variants if v.problem.family == "attention"]
    assert {(v.layer_key, v.fusion) for v in mine} == {(GQA_KEY.replace("_f32", "_f16"), "sdpa_scale_mask"),
                                                      (f"attention:q1x{HEADS}x3x{D}_k1x2x5x{D}_v1x2x5x{D}_mask3x5_f16",
                                                       "none")}
    table = next(g.out_dir.glob("tables_sdpa_*.cpp")).read_text()
    assert f".h = {HEADS}, .h_kv = {KV}," in table
    binary = _build(g.out_dir, runtime=cudnn_runtime)
    done = subprocess.run([str(binary), "--benanza_check_graphs=90"], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [ln for ln in _lines(done.stdout, "BENANZA_GRAPH") if ln["name"].startswith("attention:")]
    # one graph per problem and fusion (its plan slots share it)
    assert len(lines) == len({(v.problem, v.fusion) for v in mine}) == 2 and all(ln["ok"] for ln in lines), lines
    # run here, without a GPU: every variant a clean failure naming the missing driver or device
    _run_without_gpu(binary, mine, "--benchmark_filter=^attention:")
