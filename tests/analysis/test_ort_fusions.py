"""ONNX Runtime's own fused ops (Gemm from MatMul+Add, FusedMatMul, LayerNormalization,
SkipLayerNormalization, Gelu, Split from Gathers) map back to the model layers they replace, and
so do those of its offline transformer optimizer (``onnxruntime.transformers.optimizer``:
Attention, MultiHeadAttention, FastGelu, BiasGelu, SkipLayerNormalization with its bias).

Profiles are real: ``benanza profile --framework onnxruntime`` of PyTorch exports, or ORT's own
profiler over the optimizer's output, as a user runs it. The oracle is the graph ONNX Runtime
runs (``SessionOptions.optimized_model_filepath``, the same default optimisation level as the
profile): the original tensors a fused node (with the Reshapes and Squeezes ORT puts around it)
reads and writes bound the original nodes it replaced.
"""

from __future__ import annotations

import functools
from pathlib import Path

import onnx
import onnxruntime as ort
import pytest
from torch_models import export

from benanza.analysis.matching import match_trace
from benanza.parsers import load_bundle, load_file
from benanza.processor import load_model
from benanza.profiler import ProfileSpec, profile_model

# ORT ops that stand for several original nodes; the Reshapes/Squeezes ORT adds are glue
FUSED = {"Gemm", "FusedMatMul", "LayerNormalization", "SkipLayerNormalization", "Gelu", "BiasGelu", "FastGelu",
         "Split", "Attention", "MultiHeadAttention", "FusedGemm", "FusedConv"}
GLUE = {"Reshape", "Squeeze", "Unsqueeze", "ReorderInput", "ReorderOutput"}
CASES = [("encoder", 14), ("encoder", 17), ("gpt", 14), ("gpt", 17)]
# the transformer optimizer over these exports: (model, opset, model_type, opt_level, MultiHeadAttention).
# opt_level 0 is its Python fusions alone (the only level at which it fuses BERT's attention: level 1
# first turns MatMul+Add into Gemms between Reshapes, which its attention pattern does not know);
# None is its default for the model type. What each produces is asserted in OFFLINE_OPS.
OFFLINE = [("bert", 17, "bert", 0, False), ("bert", 14, "bert", 0, True), ("bert-tanh", 17, "bert", 0, False),
           ("encoder", 17, "bert", None, False), ("gpt", 17, "bert", None, False), ("gpt", 14, "bert", 0, False),
           ("vit", 17, "vit", None, False), ("vit", 17, "vit", 99, False), ("gpt", 17, "gpt2", None, False)]
OFFLINE_OPS = {"Attention", "MultiHeadAttention", "FastGelu", "BiasGelu", "Gelu", "SkipLayerNormalization"}


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("ortfuse")
    done: dict[tuple[str, int], tuple[Path, Path, Path]] = {}

    def get(name: str, opset: int) -> tuple[Path, Path, Path]:
        if (name, opset) not in done:
            path = export(name, opset, out)
            bundle = profile_model(ProfileSpec(str(path), "onnxruntime", str(out / f"prof-{name}{opset}"),
                                               warmup=1, iterations=3, trace_iterations=2))
            so = ort.SessionOptions()
            so.optimized_model_filepath = str(out / f"{name}{opset}.opt.onnx")
            ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
            done[(name, opset)] = (path, bundle, Path(so.optimized_model_filepath))
        return done[(name, opset)]
    return get


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    """The export, ORT's profile of its transformer-optimized form (ORT's own profiler at the
    default session level, as a user runs it), the graph that session runs, and the original
    tensor of each tensor the optimizer renamed."""
    import numpy as np
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model
    from torch_models import D_MODEL, HEADS

    out = tmp_path_factory.mktemp("ortxf")

    @functools.cache
    def get(name: str, opset: int, model_type: str, level: int | None, mha: bool) -> tuple[Path, Path, Path, dict]:
        path = export(name, opset, out)
        stem = f"{name}{opset}-{model_type}-{level}{'-mha' if mha else ''}"
        options = FusionOptions(model_type)
        options.use_multi_head_attention = mha
        optimized = optimize_model(str(path), model_type=model_type, num_heads=HEADS, hidden_size=D_MODEL,
                                   opt_level=level, use_gpu=False, optimization_options=options)
        opt = out / f"{stem}.onnx"
        optimized.save_model_to_file(str(opt))
        so = ort.SessionOptions()
        so.optimized_model_filepath = str(out / f"{stem}.ran.onnx")
        so.enable_profiling, so.profile_file_prefix = True, str(out / stem)
        sess = ort.InferenceSession(str(opt), so, providers=["CPUExecutionProvider"])
        x = np.random.default_rng(0).random(sess.get_inputs()[0].shape).astype(np.float32)
        for _ in range(3):
            sess.run(None, {"x": x})
        ran = Path(so.optimized_model_filepath)
        return path, Path(sess.end_profiling()), ran, renamed_tensors(path, ran, {"x": x})
    return get


def renamed_tensors(original: Path, ran: Path, feed: dict) -> dict[str, str]:
    """The tensors of the graph ORT ran that the original lacks (the optimizer renames some, e.g.
    ``FullyConnect_MatMul_1_input``), each to the original tensor of the same shape and values:
    both graphs run unoptimized with every node output fetched."""
    import numpy as np

    def values(path: Path) -> dict[str, np.ndarray]:
        m = onnx.load(str(path))
        have = {o.name for o in m.graph.output}
        m.graph.output.extend(onnx.ValueInfoProto(name=t) for n in m.graph.node for t in n.output
                              if t and t not in have)
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        return dict(zip(names, sess.run(names, feed), strict=True)) | feed

    before, after = values(original), values(ran)
    out = {}
    for t, v in after.items():
        if t not in before:
            same = [u for u, w in before.items() if w.shape == v.shape and w.dtype == v.dtype
                    and np.allclose(w, v, rtol=1e-4, atol=1e-5)]
            if same:
                out[t] = same[0]
    return out


def replaced_nodes(original: onnx.ModelProto, optimized: onnx.ModelProto,
                   renamed: dict[str, str] | None = None) -> dict[str, set[str]]:
    """Per fused or renamed node of the optimized graph (by name), the original nodes it replaced
    that compute data: those between the original tensors its segment reads and writes (``renamed``
    names the original tensor of a tensor the optimizer renamed), without views and without shape
    arithmetic (ORT folds it into constants)."""
    g = original.graph
    renamed = renamed or {}
    known = {t for n in g.node for t in n.output} | {i.name for i in g.input} | {i.name for i in g.initializer}
    producer = {t: n for n in g.node for t in n.output}
    names = {n.name for n in g.node}
    opt_producer = {t: n for n in optimized.graph.node for t in n.output}
    opt_readers: dict[str, list[onnx.NodeProto]] = {}
    for n in optimized.graph.node:
        for t in n.input:
            opt_readers.setdefault(t, []).append(n)

    def boundary_in(n: onnx.NodeProto) -> set[str]:
        out = set()
        for t in n.input:
            if t in known or t in renamed:
                out.add(renamed.get(t, t))
            elif t in opt_producer and opt_producer[t].op_type in GLUE:
                out |= boundary_in(opt_producer[t])
        return out

    def boundary_out(n: onnx.NodeProto) -> set[str]:
        out = set()
        for t in n.output:
            if t in known or t in renamed:
                out.add(renamed.get(t, t))
            for r in opt_readers.get(t, []):
                if t not in known and t not in renamed and r.op_type in GLUE:
                    out |= boundary_out(r)
        return out

    inits = {i.name for i in g.initializer}

    def folded(n: onnx.NodeProto, memo: dict[str, bool]) -> bool:
        """Constants and shape arithmetic: what ORT computes once at load time."""
        if n.name not in memo:
            memo[n.name] = n.op_type == "Shape" or all(
                i in inits or (i in producer and folded(producer[i], memo)) for i in n.input if i)
        return memo[n.name]

    memo: dict[str, bool] = {}
    result = {}
    for node in optimized.graph.node:
        if node.name in names or node.op_type in GLUE:
            continue
        stop, region, todo = boundary_in(node), set(), [producer[t] for t in boundary_out(node) if t in producer]
        while todo:
            n = todo.pop()
            if n.name in region or folded(n, memo):
                continue
            region.add(n.name)
            todo += [producer[t] for t in n.input if t and t not in stop and t in producer]
        result[node.name] = {r for r in region if next(n for n in g.node if n.name == r).op_type not in
                             GLUE | {"Flatten", "Identity"}}
    return result


def _assert_fused_as_the_oracle_says(model, match, oracle) -> None:
    """Every fused node of the optimized graph ran in the profile, mapped to exactly the original
    nodes (views aside) the oracle says it replaced."""
    groups = {g.name: g for g in match.groups}
    assert set(oracle) <= set(groups), "every fused node of the optimized graph ran in the profile"
    for fused, want in oracle.items():
        got = {model.nodes[i].name for i in groups[fused].nodes if not model.nodes[i].layer.view}
        assert got == want, (fused, groups[fused].op)


@pytest.mark.slow
@pytest.mark.parametrize("name,opset", CASES)
def test_ort_fused_ops_cost_the_layers_they_replace(profiled, name, opset):
    path, bundle, optimized = profiled(name, opset)
    model = load_model(path)
    match = match_trace(model, load_bundle(bundle).trace)
    oracle = replaced_nodes(onnx.load(str(path)), onnx.load(str(optimized)))
    assert oracle, "ORT fused nothing: the oracle would test nothing"
    _assert_fused_as_the_oracle_says(model, match, oracle)
    assert not [g for g in match.inserted if g.op in FUSED]
    assert {g.op for g in match.inserted} <= GLUE  # what stays inserted is ORT's own reshaping


@pytest.mark.parametrize("case", OFFLINE, ids=lambda c: "-".join(map(str, c)))
def test_transformer_optimizer_fused_ops_cost_the_layers_they_replace(offline, case):
    """Each fused kernel of the optimizer's output maps to exactly the original nodes it replaced;
    nothing it runs is left unmapped."""
    path, trace, ran, renamed = offline(*case)
    model = load_model(path)
    match = match_trace(model, load_file(trace).trace)
    ran_model = onnx.load(str(ran))
    oracle = replaced_nodes(onnx.load(str(path)), ran_model, renamed)
    assert oracle, "the optimizer fused nothing: the oracle would test nothing"
    _assert_fused_as_the_oracle_says(model, match, oracle)
    assert not match.unmapped, [(g.name, g.op) for g in match.unmapped]
    assert {g.op for g in match.inserted} <= GLUE
    # every original node that computes runs in exactly one op of the profile, or ORT folded it
    names = {n.name for n in ran_model.graph.node}
    claimed = {model.nodes[i].name for g in match.groups for i in g.nodes}
    for n in model.nodes:
        if not n.layer.view and n.name not in claimed:
            assert n.name not in names, f"{n.name} ran but no profile op claims it"


def test_transformer_optimizer_produces_the_fused_ops_covered(offline):
    """Which fused kernels the optimizer really writes for these exports (ORT 1.32, CPU): the
    cases above cover each of them."""
    made = set()
    for case in OFFLINE:
        made |= {n.op_type for n in onnx.load(str(offline(*case)[2])).graph.node} & OFFLINE_OPS
    assert made == OFFLINE_OPS


@pytest.fixture(scope="module")
def perf_db(tmp_path_factory, profiled, offline) -> Path:
    """oneDNN results for the session-profiled encoder and the optimizer-profiled BERT layer:
    one generate, one build, one run."""
    out = tmp_path_factory.mktemp("ortdb")
    db = out / "perf.db"
    models = (str(profiled("encoder", 14)[0]), str(offline(*BERT)[0]))
    cli("generate", *models, "--out", str(out / "bench"), "--backend", "onednn", "--dtype", "f32")
    # the figures of the pipeline are checked here, not how quiet the machine is (test_measurement)
    cli("run", "--bench-dir", str(out / "bench"), "--system", "ci-cpu", "--db", str(db), "--backend", "onednn",
        "--min-time", "0.01", "--repetitions", "1", "--threads", "1", "--max-contention", "1")
    return db


BERT = ("bert", 17, "bert", 0, False)  # Attention, SkipLayerNormalization with bias, BiasGelu


def cli(*args: str) -> str:
    from click.testing import CliRunner

    from benanza.cli import main

    r = CliRunner().invoke(main, list(args))
    assert r.exit_code == 0, r.output
    return r.stdout


@pytest.mark.slow
@pytest.mark.parametrize("flow", ["session", "optimizer"])
def test_end_to_end_costs_onnxruntimes_fused_ops(perf_db, profiled, offline, flow, monkeypatch):
    """export → oneDNN benchmarks (generate + run) → ONNX Runtime profile → analyze. "session":
    the encoder under ORT's default session (``benanza profile``); "optimizer": the BERT layer
    rewritten by ORT's transformer optimizer, run and profiled by ORT itself as a user does, its
    trace analyzed against the ORIGINAL model. The bound with ORT's fusions is recomputed here
    from the database's rows and the nodes the graph ORT ran replaced: each layer's fastest
    unfused result, less what each Benanza fusion saves whose layers one fused ORT op runs."""
    import json
    import sqlite3

    if flow == "session":
        path, profile, ran_path = profiled("encoder", 14)
        renamed: dict[str, str] = {}
    else:
        path, profile, ran_path, renamed = offline(*BERT)
    args = ("analyze", str(path), "--system", "ci-cpu", "--db", str(perf_db), "--profile", str(profile), "--json")
    (a,) = json.loads(cli(*args))["analyses"]
    b, fw = a["bounds"], a["framework"]
    assert not b["partial"] and a["measured_ms"] > 0
    same = fw["bounds_same_fusions"]["sequential_ms"]
    if same > a["measured_ms"]:
        assert any(w.startswith("bound above measured") for w in a["warnings"]), a["warnings"]
    assert not [g for g in fw["inserted"] if g["op"] in FUSED]
    assert not [w for w in a["warnings"] if "cannot map back" in w]

    ran_graph = onnx.load(str(ran_path))
    groups = replaced_nodes(onnx.load(str(path)), ran_graph, renamed)
    ran = {n.name for n in ran_graph.graph.node} | set().union(*groups.values())
    with sqlite3.connect(perf_db) as con:
        rows = con.execute("SELECT r.layer_key, v.fusion, MIN(coalesce(r.low_ms, r.median_ms)) FROM results r "
                           "JOIN variants v ON v.name = r.variant WHERE r.status = 'ok' AND r.dtype = 'f32' "
                           "GROUP BY r.layer_key, v.fusion").fetchall()
    fastest = {(key, fusion): ms for key, fusion, ms in rows}
    layers = a["layers"]
    weight = {la["name"]: fastest.get((la["key"], "none"), 0.0) for la in layers}
    expected = sum(w for name, w in weight.items() if name in ran)
    for use in a["fusion"]["applied"] + a["fusion"]["unprofitable"]:
        names = {layers[i]["name"] for i in use["nodes"]}
        if any(names <= g for g in groups.values()):
            fused = fastest[(layers[use["nodes"][0]]["key"], use["pattern"])]
            expected -= sum(weight[n] for n in names) - fused
    assert same == pytest.approx(expected, rel=1e-4)
    # the fused ops' layers cost their time: what ORT fused is not counted 0
    fused_cost = sum(weight[n] for g in groups.values() for n in g)
    assert fused_cost > 0 and same >= fused_cost - sum(
        u["unfused_ms"] - u["fused_ms"] for u in a["fusion"]["applied"] + a["fusion"]["unprofitable"])
    if flow == "optimizer":
        # a fused kernel the analyzer does not know (as a newer ORT's would be) is named, never silent
        from benanza.analysis import matching

        monkeypatch.delitem(matching.COVERS, "Attention")
        monkeypatch.delitem(matching.CANDIDATES, "Attention")
        (a,) = json.loads(cli(*args))["analyses"]
        assert [w for w in a["warnings"] if "cannot map back" in w and "Attention_0 (Attention)" in w], a["warnings"]


@pytest.mark.slow  # exports transformers' Phi with both exporters
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_fast_gelu_of_transformers_phi_costs_its_gelu_tanh_nodes(tmp_path, exporter):
    """ONNX Runtime's default session fuses Phi's tanh GELU (``gelu_new``: ½·x computed apart,
    x³ as Pow) into FastGelu ops it names by type alone (``GPT2Gelu``): each maps to exactly the
    original nodes the oracle says it replaced, and nothing fused stays unmapped."""
    import hf_models

    path = hf_models.export(hf_models.Step("phi", 8, 0), exporter, tmp_path)
    bundle = profile_model(ProfileSpec(str(path), "onnxruntime", str(tmp_path / "prof"), warmup=1, iterations=3,
                                       trace_iterations=2))
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "phi.opt.onnx")
    ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    model = load_model(path)
    match = match_trace(model, load_bundle(bundle).trace)
    oracle = replaced_nodes(onnx.load(str(path)), onnx.load(so.optimized_model_filepath))
    fast = {g.name: g for g in match.groups if g.op == "FastGelu"}
    assert len(fast) == hf_models.config("phi").num_hidden_layers
    _assert_fused_as_the_oracle_says(model, match, {k: v for k, v in oracle.items() if k in fast})
    assert not match.unmapped, [(g.name, g.op) for g in match.unmapped]


@pytest.mark.slow
@pytest.mark.parametrize("name,opset", CASES)
def test_the_generator_predicts_the_fused_ops_ort_runs(profiled, name, opset):
    """The fusion variants the onnxruntime backend benchmarks are the fused ops ORT's session runs:
    each op of its profile that computes several of the model's nodes (mapped back by the matcher
    the test above holds to the optimized graph) is a library pattern's match or a predicted ORT
    fusion of its op type, node for node, and every predicted fusion ran."""
    from benanza.fusion import match_fusions
    from benanza.ort_fusions import PREDICTED, match_ort_fusions

    path, bundle, _ = profiled(name, opset)
    model = load_model(path)
    match = match_trace(model, load_bundle(bundle).trace)
    ran = {tuple(sorted(g.nodes)): g.op for g in match.groups
           if sum(not model.nodes[i].layer.view for i in g.nodes) > 1}
    assert ran, "ORT fused nothing: nothing to predict"
    library = match_fusions(model)
    predicted = match_ort_fusions(model, library)
    op_of = {p.name: op for p, op in PREDICTED}
    named = {tuple(sorted(m.nodes)): m.pattern.name for m in library + predicted}
    for nodes, op in ran.items():
        assert nodes in named, (op, [model.nodes[i].name for i in nodes])
    for m in predicted:
        nodes = tuple(sorted(m.nodes))
        assert ran.get(nodes) == op_of[m.pattern.name], (m.pattern.name, [model.nodes[i].name for i in nodes])
    assert predicted, "no ORT fusion predicted: the test would test nothing"


def test_only_the_onnxruntime_backend_benchmarks_orts_own_fusions(tmp_path):
    """ORT's fusions are variants of its own backend; a library backend (oneDNN, torch's eager
    executor, which fuses nothing) keeps the library patterns alone."""
    from benanza.generator import GenOptions, expand_variants, get_backend
    from benanza.layers import unique_layers
    from benanza.manifest import build_manifest
    from benanza.ort_fusions import PATTERNS

    loaded = [load_model(export("encoder", 17, tmp_path))]
    manifest = build_manifest(loaded, unique_layers(loaded))
    own = {p.name for p in PATTERNS}
    fusions = {b: {v.fusion for v in expand_variants(manifest, get_backend(b), GenOptions())}
               for b in ("onnxruntime", "onednn", "torch")}
    assert fusions["onnxruntime"] >= {"ort_split", "ort_fused_matmul", "ort_skip_layernorm", "ort_gemm", "mm_bias"}
    assert not (fusions["onednn"] | fusions["torch"]) & own
    assert "mm_bias_relu" in fusions["onednn"] & fusions["onnxruntime"]


def test_nchwc_convolutions_take_the_residual_add_and_are_predicted(tmp_path):
    """ORT's NCHWc transform gives a convolution the residual Add as its sum input and the Relu
    after it as its activation: the profile's conv op maps to exactly the nodes the graph ORT ran
    says it computes (its sum input and activation attribute, oracle), no node of the model is left
    as never run, and the generator predicts each such group (a Conv with a bias and its BN are no
    library pattern either) as ORT's own fusion."""
    import numpy as np
    from helpers import residual_net

    from benanza.fusion import match_fusions
    from benanza.ort_fusions import match_ort_fusions
    from benanza.parsers.ort import NCHWC_SUFFIX

    path = tmp_path / "res.onnx"
    onnx.save(residual_net(), path)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.enable_profiling, so.profile_file_prefix = True, str(tmp_path / "prof")
    so.optimized_model_filepath = str(tmp_path / "ran.onnx")
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((1, 32, 28, 28)).astype(np.float32)
    for _ in range(3):
        sess.run(None, {"x": x})
    model = load_model(path)
    match = match_trace(model, load_file(sess.end_profiling()).trace)
    groups = {g.name: g for g in match.groups}
    ran = [n for n in onnx.load(so.optimized_model_filepath).graph.node if n.name.endswith(NCHWC_SUFFIX)
           and n.op_type == "Conv"]
    assert len(ran) == 5 and sum(len(n.input) == 4 for n in ran) == 2, "ORT fused two Adds as conv sums"
    for n in ran:
        ops = [model.nodes[i].layer.op for i in groups[n.name].nodes]
        activation = any(a.name == "activation" for a in n.attribute)
        assert ops.count("Conv") == 1 and ("Add" in ops) == (len(n.input) == 4), (n.name, ops)
        assert ("Relu" in ops) == activation, (n.name, ops)
    assert not match.eliminated, [model.nodes[i].name for i in match.eliminated]
    computed = {tuple(sorted(g.nodes)) for g in match.groups if len(g.nodes) > 1}
    library = match_fusions(model)
    predicted = match_ort_fusions(model, library)
    assert {tuple(sorted(m.nodes)) for m in predicted} | {tuple(sorted(m.nodes)) for m in library} >= computed
    assert sorted(tuple(sorted(model.nodes[i].layer.op for i in m.nodes)) for m in predicted) == [
        ("Add", "BatchNormalization", "Conv", "Relu")] * 2 + [("BatchNormalization", "Conv", "Relu")]
    assert {tuple(sorted(m.nodes)) for m in predicted} <= computed
