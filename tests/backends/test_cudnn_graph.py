"""cuDNN graph API families (the cuDNN frontend): layer normalization, SDPA and pointwise nodes.

Exported transformer models give the shapes; the torch modules' own constants (heads, sequence,
width) are the oracle for the graph rows. There is no GPU here: the build compiles and links the
frontend's graphs for real, the binary must fail every benchmark cleanly with the CUDA error, and
the frontend itself validates every graph for compute capability 9.0 (its support checks need no
device when the target is given).
"""

from __future__ import annotations

import logging
import math
import subprocess
from collections import defaultdict

import pytest
from helpers import io, model, tensor
from onnx import helper
from torch_models import D_MODEL, HEADS, SEQ, export

from benanza.backends import cudnn
from benanza.generator import GenOptions, expand_variants, generate
from benanza.layers import unique_layers
from benanza.manifest import build_manifest
from benanza.ops.registry import FAMILIES, PATTERN_LOWERINGS
from benanza.processor import load_model
from tests.backends.test_cudnn import NEED_TOOLCHAIN, _build, _lines, _run_without_gpu
from tests.e2e.test_transformers import attention_op_model

GRAPH_APIS = ("cudnn_frontend.layernorm", "cudnn_frontend.sdpa", "cudnn_frontend.pointwise", "cudnn_frontend.quant")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("torch")
    return lambda name, opset: load_model(export(name, opset, out))


def odd_head_attention():
    """An Attention op with head size 12: cuDNN's flash attention takes multiples of 8 only."""
    nodes = [helper.make_node("Attention", ["q", "k", "v"], ["y"], name="odd")]
    shape = [1, 2, 16, 12]
    return model(nodes, [io("q", shape), io("k", shape), io("v", shape)], [io("y", None)], opset=23)


def _fields(layer, api) -> dict[str, str]:
    """The layer's row in the table of ``api``: its own call's, or a graph-API pattern's fused
    form on its anchor (the scores' MatMul of an attention pattern)."""
    family = next(f for f in FAMILIES if f.name == layer.problem.family)
    lowering = family.cudnn.get(api) or next(p.cudnn for p in PATTERN_LOWERINGS.values()
                                             if p.cudnn is not None and cudnn._API_OF.get(p.cudnn.table.name) == api)
    return dict(cudnn.fields_of(lowering.row(layer.problem, api), layer))


def test_graph_layers_and_patterns_get_one_variant_per_plan_slot(exported, save, caplog):
    enc14, gpt17 = exported("encoder", 14), exported("gpt", 17)
    attn = load_model(save(attention_op_model()))
    models = [enc14, gpt17, attn]
    manifest = build_manifest(models, unique_layers(models))
    with caplog.at_level(logging.WARNING, logger="benanza.backends.cudnn"):
        variants = expand_variants(manifest, cudnn.BACKEND, GenOptions(dtypes=("f32", "f16")))
    slots: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for v in variants:
        if v.api in GRAPH_APIS:
            slots[v.layer_key, v.api, v.fusion].append(v.algo)
            assert (v.layout, v.math) == ("nchw", "default")
    assert all(sorted(a) == sorted(cudnn.PLAN_ALGOS) for a in slots.values())
    got = {(key.rsplit("_", 1)[1], api.split(".")[1], fusion) for key, api, fusion in slots}
    by_op = {n.layer.op: n.layer for m in models for n in m.nodes}
    # opset 17's LayerNormalization, in both dtypes, over SEQ rows of D_MODEL
    assert {("f32", "layernorm", "none"), ("f16", "layernorm", "none")} <= got
    assert _fields(by_op["LayerNormalization"], cudnn.CUDNN_LAYERNORM)["rows"] == str(SEQ)
    assert _fields(by_op["LayerNormalization"], cudnn.CUDNN_LAYERNORM)["cols"] == str(D_MODEL)
    # opset 14's decomposition: one layer norm on its first ReduceMean (both of the encoder's)
    fused_ln = {k for k, _, f in slots if f == "layernorm"}
    assert fused_ln == {f"reduce:mean_in1x{SEQ}x{D_MODEL}_axes2_{d}" for d in ("f32", "f16")}
    # the GPT block's erf GELU: Div, Erf alone, and the decomposition as one GELU node
    assert {k for k, _, f in slots if f == "gelu_erf"} == {f"binary:div_in1x{SEQ}x{4 * D_MODEL}_in_{d}"
                                                           for d in ("f32", "f16")}
    assert any(k.startswith("eltwise:erf_") for k, _, _ in slots)
    # attention: the encoder's chain and the GPT block's causal one (its mask added as a tensor),
    # fp16 only; the exporter scales Q and Kᵀ first, which the prescaled patterns take in
    sdpa = {(k, f) for k, api, f in slots if api == cudnn.CUDNN_SDPA}
    head = D_MODEL // HEADS
    scores = f"matmul:a1x{HEADS}x{SEQ}x{head}_b1x{HEADS}x{head}x{SEQ}_f16"
    assert {(scores, "sdpa_qk_scale"), (scores, "sdpa_qk_scale_mask")} <= sdpa
    assert not any(k.endswith("_f32") for k, _ in sdpa)
    assert "no cuDNN SDPA variant in f32" in caplog.text and "flash attention takes fp16/bf16" in caplog.text
    row = _fields(next(n.layer for n in enc14.nodes if n.layer.key == scores.replace("_f16", "_f32")),
                  cudnn.CUDNN_SDPA)
    assert [row[f] for f in ("b", "h", "s_q", "s_kv", "d_qk", "d_v")] == ["1", str(HEADS), str(SEQ), str(SEQ),
                                                                       str(head), str(head)]
    # the Attention op: its mask, its causal flag and scale, its own V head size
    ops = {n.name: n.layer for n in attn.nodes}
    masked, causal = _fields(ops["masked"], cudnn.CUDNN_SDPA), _fields(ops["causal"], cudnn.CUDNN_SDPA)
    assert (masked["mask"], masked["causal"], float(masked["scale"])) == ("true", "false", 1 / math.sqrt(8))
    assert (causal["mask"], causal["causal"], causal["scale"], causal["d_v"]) == ("false", "true", "0.25", "16")
    # fewer K/V heads than Q's: the frontend's SDPA takes K and V with their own head count
    grouped = _fields(ops["grouped"], cudnn.CUDNN_SDPA)
    assert (grouped["h"], grouped["h_kv"], masked["h"], masked["h_kv"]) == ("4", "2", "4", "4")


@pytest.mark.slow
@NEED_TOOLCHAIN
def test_graph_benchmarks_build_fail_cleanly_without_gpu_and_validate(tmp_path, exported, save, cudnn_runtime):
    models = [exported("encoder", 14), exported("gpt", 17), load_model(save(attention_op_model())),
              load_model(save(odd_head_attention(), "odd.onnx"))]
    manifest = build_manifest(models, unique_layers(models))
    g = generate(manifest, "cudnn", tmp_path, GenOptions(dtypes=("f32", "f16")))
    graph = [v for v in g.variants if v.api in GRAPH_APIS]
    binary = _build(g.out_dir, runtime=cudnn_runtime)

    # the device is needed before any graph is lowered: the CUDA error, nothing else
    _run_without_gpu(binary, g.variants, needing_gpu=graph)

    # the frontend's own validation, one line per graph (layer, dtype, form): for an sm_90 GPU
    # every graph but the odd head size's; for sm_75 (Turing) no flash attention at all
    def check(sm: int) -> dict[str, str]:
        done = subprocess.run([str(binary), f"--benanza_check_graphs={sm}"], capture_output=True, text=True,
                              timeout=300, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        lines = {ln["name"]: ln for ln in _lines(done.stdout, "BENANZA_GRAPH")}
        assert len(lines) == len({(v.layer_key, v.fusion) for v in graph})
        assert set(lines) <= {v.name for v in graph if v.algo == "plan0"}
        return {n: ln["message"] for n, ln in lines.items() if not ln["ok"]}

    refused = check(90)
    (odd,) = [n for n in {v.name for v in graph if v.algo == "plan0"} if "q1x2x16x12" in n]
    assert set(refused) == {odd} and "hidden_dim should be multiple of 8" in refused[odd], refused
    turing = check(75)
    sdpa = {v.name for v in graph if v.api == cudnn.CUDNN_SDPA and v.algo == "plan0"} - {odd}
    # the two chains and the three Attention ops (masked, causal, grouped), f16
    assert set(turing) - {odd} == sdpa and len(sdpa) == 5
    assert all("requires SM80 (Ampere) or newer" in turing[n] for n in sdpa)


# --- convolutions through the graph API (as PyTorch runs them) --------------------------------

def test_every_conv_of_a_real_model_gets_graph_plan_slots(zoo_model):
    """ResNet-50's convolutions: the graph API's plan slots in every dtype, layout and math the
    legacy algorithms get, on the qconv table's rows with the layer's own pads."""
    m = load_model(zoo_model("resnet50-v1"))
    manifest = build_manifest([m], unique_layers([m]))
    variants = expand_variants(manifest, cudnn.BACKEND, GenOptions(dtypes=("f32", "f16")))
    convs = {u.layer.problem for u in manifest.layers if u.layer.cudnn_api == "cudnnConvolutionForward"}
    slots: dict[tuple, set[str]] = defaultdict(set)
    legacy: dict[object, set[tuple[str, str, str]]] = defaultdict(set)
    for v in variants:
        if v.api == cudnn.CUDNN_CONV_GRAPH:
            assert v.fusion == "none"
            slots[v.problem, v.dtype, v.layout, v.math].add(v.algo)
        elif v.api == "cudnnConvolutionForward":
            legacy[v.problem].add((v.dtype, v.layout, v.math))
    assert {k[0] for k in slots} == convs and len(convs) > 10
    assert all(a == set(cudnn.PLAN_ALGOS) for a in slots.values())
    assert all({k[1:] for k in slots if k[0] == p} == legacy[p] for p in convs)
    layer = next(u.layer for u in manifest.layers if u.layer.problem in convs)
    row = _fields(layer, cudnn.CUDNN_CONV_GRAPH)
    assert (row["requant"], row["bscales"], row["pad_b"]) == ("false", "1", str(layer.problem.pb))


def conv_graph_model():
    """Convolutions of the shapes CNNs have: the 7x7 stride-2 stem with a bias, a 1x1, a
    depthwise 3x3 and an asymmetrically padded 3x3 without a bias."""
    nodes = [helper.make_node("Conv", ["x", "W1", "B1"], ["c1"], strides=[2, 2], pads=[3, 3, 3, 3]),
             helper.make_node("Conv", ["c1", "W2"], ["c2"]),
             helper.make_node("Conv", ["c2", "W3"], ["c3"], group=16, pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["c3", "W4"], ["y"], pads=[0, 0, 1, 1], strides=[2, 2])]
    inits = [tensor("W1", [16, 3, 7, 7]), tensor("B1", [16]), tensor("W2", [16, 16, 1, 1]),
             tensor("W3", [16, 1, 3, 3]), tensor("W4", [8, 16, 3, 3])]
    return model(nodes, [io("x", [1, 3, 32, 32])], [io("y", None)], inits)


@pytest.mark.slow
@NEED_TOOLCHAIN
def test_conv_graphs_build_fail_cleanly_without_gpu_and_validate(tmp_path, save, cudnn_runtime):
    m = load_model(save(conv_graph_model(), "convs.onnx"))
    manifest = build_manifest([m], unique_layers([m]))
    g = generate(manifest, "cudnn", tmp_path, GenOptions(dtypes=("f32", "f16"), math=("fma", "tf32_allowed",
                                                                                        "tensor_op")))
    graph = [v for v in g.variants if v.api == cudnn.CUDNN_CONV_GRAPH]
    assert {(v.dtype, v.math) for v in graph} == {("f32", "fma"), ("f32", "tf32_allowed"), ("f16", "tensor_op"),
                                                  ("f16", "fma")}
    binary = _build(g.out_dir, runtime=cudnn_runtime)
    _run_without_gpu(binary, g.variants, needing_gpu=graph)
    # the frontend validates each graph (layer, dtype, layout, math) for an sm_90 GPU without one
    done = subprocess.run([str(binary), "--benanza_check_graphs=90"], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = {ln["name"]: ln for ln in _lines(done.stdout, "BENANZA_GRAPH")}
    assert set(lines) == {v.name for v in graph if v.algo == "plan0"}
    assert all(ln["ok"] for ln in lines.values()), [ln for ln in lines.values() if not ln["ok"]]
