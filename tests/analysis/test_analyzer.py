"""Analyzer: bounds, critical path, parallel modules, fusion, framework view and Q3–Q6 on real
models (onnx.helper graphs) with Results constructed for them."""

from __future__ import annotations

import itertools
import json
import re

import helpers
import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

from benanza.analysis.bounds import between, critical_path, parallel_modules, post_dominators
from benanza.analysis.matching import align_calls
from benanza.analysis.questions import TENSOR_CORE_RE
from benanza.analyzer import analyze
from benanza.errors import BenanzaError
from benanza.layers import Dag
from benanza.parsers import ExecutionProfile, load_file, parse_cudnn_log
from benanza.processor import load_model
from benanza.records import Result, Status, Variant


def ok(layer, ms: float, backend: str = "onednn", algo: str = "direct", dtype: str | None = None,
       fusion: str = "none", layout: str = "nchw", impl: str = "") -> Result:
    """An OK result of the layer's problem, in its own dtype unless another is given."""
    return Result(Variant(layer.problem, backend, "api", algo, dtype or layer.dtype, layout, "default", fusion),
                  "sys", Status.OK, median_ms=ms, implementation=impl)


def results_for(model, ms_of=lambda node: 0.1 * (node.index + 1), backend="onednn"):
    out = []
    for n in model.nodes:
        api = n.layer.onednn_primitive if backend == "onednn" else n.layer.cudnn_api
        if api:
            out.append(ok(n.layer, ms_of(n), backend))
    return out


# --- critical path -------------------------------------------------------------------------------

@st.composite
def dags(draw):
    n = draw(st.integers(1, 9))
    edges = draw(st.sets(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)).filter(lambda e: e[0] < e[1]),
                         max_size=20))
    weights = draw(st.lists(st.floats(0, 100, allow_nan=False), min_size=n, max_size=n))
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    g.add_edges_from(edges)
    return g, dict(enumerate(weights))


def as_dag(g: nx.DiGraph) -> Dag:
    return Dag.of(g.nodes, g.edges)


def brute_force(g: nx.DiGraph, w: dict) -> float:
    best = 0.0
    sources = [v for v in g if g.in_degree(v) == 0]
    sinks = [v for v in g if g.out_degree(v) == 0]
    for s, t in itertools.product(sources, sinks):
        for path in nx.all_simple_paths(g, s, t) if s != t else [[s]]:
            best = max(best, sum(w[v] for v in path))
    return best


@settings(max_examples=200, deadline=None)
@given(dags())
def test_critical_path_matches_brute_force(dag):
    g, w = dag
    length, path = critical_path(as_dag(g), w)
    assert length == pytest.approx(brute_force(g, w))
    assert sum(w[v] for v in path) == pytest.approx(length)
    assert all(g.has_edge(a, b) for a, b in zip(path, path[1:]))
    assert length <= sum(w.values()) + 1e-9


def test_critical_path_counts_the_last_layer():
    # the paper's edge weights would give 1 + 2 = 3 for a chain 1 → 2 → 10; node weights give 13
    g = Dag.of((), [(0, 1), (1, 2)])
    assert critical_path(g, {0: 1.0, 1: 2.0, 2: 10.0}) == (13.0, [0, 1, 2])


@settings(max_examples=200, deadline=None)
@given(dags())
def test_post_dominators_and_modules_match_networkx(dag):
    # the oracle: networkx's dominators of the reversed graph from a virtual sink, and the
    # fork's descendants that are ancestors of its join
    g, _ = dag
    rev = g.reverse()
    rev.add_edges_from((-1, v) for v in g if g.out_degree(v) == 0)
    want = {v: d for v, d in nx.immediate_dominators(rev, -1).items() if v != -1}
    got = post_dominators(as_dag(g))
    assert got == {v: None if d == -1 else d for v, d in want.items()}
    for fork, join in got.items():
        if join is not None:
            assert between(as_dag(g), fork, join) == nx.descendants(g, fork) & nx.ancestors(g, join)


def test_dag_keeps_edge_order_and_refuses_a_cycle():
    g = Dag.of([2, 0, 1], [(0, 2), (1, 2), (0, 2), (0, 1)])
    assert g.nodes == (2, 0, 1) and g.preds[2] == (0, 1) and g.succs[0] == (2, 1)
    assert g.order == (0, 1, 2) and g.subgraph([0, 2]).preds[2] == (0,)
    with pytest.raises(BenanzaError, match="cycle"):
        Dag.of((), [(0, 1), (1, 0)])


# --- a branchy model: an Inception-style module ---------------------------------------------------

def inception_like():
    t, io = helpers.tensor, helpers.io
    inits = [t("W0", (8, 3, 3, 3)), t("Wa", (8, 8, 1, 1)), t("Wb1", (4, 8, 1, 1)), t("Wb2", (8, 4, 3, 3)),
             t("Wc", (6, 8, 1, 1))]
    nodes = [
        helper.make_node("Conv", ["x", "W0"], ["s"], pads=[1, 1, 1, 1], name="stem"),
        helper.make_node("Relu", ["s"], ["sr"], name="stem_relu"),
        helper.make_node("Conv", ["sr", "Wa"], ["a"], name="branch_a"),
        helper.make_node("Conv", ["sr", "Wb1"], ["b1"], name="branch_b_reduce"),
        helper.make_node("Conv", ["b1", "Wb2"], ["b2"], pads=[1, 1, 1, 1], name="branch_b"),
        helper.make_node("MaxPool", ["sr"], ["c0"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="branch_c_pool"),
        helper.make_node("Conv", ["c0", "Wc"], ["c"], name="branch_c"),
        helper.make_node("Concat", ["a", "b2", "c"], ["y0"], axis=1, name="concat"),
        helper.make_node("GlobalAveragePool", ["y0"], ["y"], name="gap"),
    ]
    return helpers.model(nodes, [io("x", [1, 3, 8, 8])], [io("y", None)], inits)


@pytest.fixture
def branchy(save):
    return load_model(save(inception_like(), "inception_like.onnx"), 1)


def test_bounds_parallel_below_sequential_on_a_parallel_module(branchy):
    ms = {"stem": 1.0, "stem_relu": 0.1, "branch_a": 0.5, "branch_b_reduce": 0.3, "branch_b": 2.0,
          "branch_c_pool": 0.2, "branch_c": 0.4, "concat": 0.05, "gap": 0.05}
    res = results_for(branchy, lambda n: ms[n.name])
    a = analyze(branchy, res, "sys", "onednn")
    assert a.bounds.sequential_ms == pytest.approx(sum(ms.values()))
    assert a.bounds.parallel_ms == pytest.approx(1.0 + 0.1 + 0.3 + 2.0 + 0.05 + 0.05)
    names = [a.rows[i].name for i in a.bounds.critical_path]
    assert names == ["stem", "stem_relu", "branch_b_reduce", "branch_b", "concat", "gap"]
    assert {r.name for r in a.rows if r.critical} == set(names)
    (module,) = a.modules
    assert a.rows[module.fork].name == "stem_relu" and a.rows[module.join].name == "concat"
    assert module.branches == 3 and len(module.nodes) == 5
    assert module.parallel_ms == pytest.approx(2.3) and module.sequential_ms == pytest.approx(3.4)
    assert not a.bounds.partial and a.measured_ms is None and a.br_sequential is None


def test_missing_results_make_the_bound_partial_and_named(branchy):
    res = [r for r in results_for(branchy) if not r.variant.layer_key.startswith("conv:mb1_ic4")]
    a = analyze(branchy, res, "sys", "onednn")
    assert a.bounds.partial
    missing = [r.name for r in a.missing]
    assert missing == ["branch_b"]
    assert any("PARTIAL" in w and "conv:mb1_ic4" in w for w in a.warnings)


def test_best_variant_is_the_fastest_ok_one(branchy):
    stem = branchy.nodes[0].layer
    res = results_for(branchy) + [
        ok(stem, 0.01, algo="winograd"),
        Result(Variant(stem.problem, "onednn", "api", "gemm"), "sys", Status.FAILED, "crashed"),
        ok(stem, 0.001, dtype="bf16"),  # another dtype never counts for an f32 bound
    ]
    a = analyze(branchy, res, "sys", "onednn")
    assert a.rows[0].latency_ms == 0.01 and a.rows[0].algo == "winograd"
    assert a.rows[0].failed_variants == 1
    assert "bf16" in a.tensor_cores.bounds


def test_not_covered_layers_are_listed_not_silent(save):
    n = helper.make_node
    path = save(helpers.model([n("Relu", ["x"], ["r"], name="relu"), n("HardSwish", ["r"], ["y"], name="gate")],
                              [helpers.io("x", [1, 4, 8, 8])], [helpers.io("y", None)], opset=14), "gate.onnx")
    gate = load_model(path, 1)
    a = analyze(gate, results_for(gate, backend="cudnn"), "sys", "cudnn")
    # HardSwish has no cuDNN call (no pointwise mode computes it, and no chain is built); oneDNN has one
    assert [r.name for r in a.not_covered] == ["gate"]
    assert any("not covered: HardSwish" in w for w in a.warnings)
    assert not analyze(gate, results_for(gate), "sys", "onednn").not_covered


# --- fusion (Q5) -----------------------------------------------------------------------------------

@pytest.fixture
def convnet(save):
    m = helpers.conv_net()
    return load_model(save(m, "convnet.onnx"), 1)


def test_fusion_substitutes_fused_latency_and_falls_back(convnet):
    res = results_for(convnet, lambda n: 1.0)
    conv1, conv2 = convnet.nodes[0].layer, convnet.nodes[2].layer
    res += [ok(conv1, 1.2, fusion="bias_relu"),
            Result(Variant(conv2.problem, "onednn", "api", "direct", fusion="bn_relu"), "sys", Status.FAILED, "boom")]
    a = analyze(convnet, res, "sys", "onednn")
    assert a.fusion.matches == 2
    (use,) = a.fusion.applied
    assert use.pattern == "bias_relu" and use.nodes == (0, 1) and use.fused_ms == 1.2 and use.unfused_ms == 2.0
    # conv1+relu1 (2 ms) became 1.2 ms; conv2's failed fused benchmark falls back to unfused
    assert a.fusion.bounds.sequential_ms == pytest.approx(a.bounds.sequential_ms - 0.8)
    assert a.fusion.layers_fused == 2


# --- framework view: ONNX Runtime's fusions and insertions ------------------------------------------

def test_ort_trace_fusions_insertions_and_ratio_explained(convnet):
    prof = load_file(helpers.FIXTURES / "ort_convnet.json")
    res = results_for(convnet, lambda n: 1.0)
    res.append(ok(convnet.nodes[2].layer, 1.5, fusion="bn_relu"))
    a = analyze(convnet, res, "sys", "onednn", profile=prof)
    f = a.framework
    assert f is not None and f.framework == "onnxruntime"
    fused = {g.name: g.nodes for g in f.match.fused}
    assert fused == {"r1_nchwc": (0, 1), "r2_nchwc": (2, 3, 4)}
    assert [g.op for g in f.match.inserted] == ["ReorderOutput"] and f.inserted_ms > 0
    assert f.match.runs == 4  # the first of five runs is dropped as warm-up
    # with ORT's fusions: conv2+bn2+relu2 is the fused 1.5 ms benchmark instead of 3 ms
    assert f.bounds_same_fusions.sequential_ms == pytest.approx(a.bounds.sequential_ms - 1.5)
    # the measured latency (µs) is far below these synthetic bounds: BR > 1 is explained
    assert a.measured_ms == pytest.approx(prof.measured_ms)
    assert a.br_sequential > 1
    (said,) = [w for w in a.warnings if w.startswith("bound above measured")]
    assert "framework ops ran faster than the best benchmarked variant" in said and "fused or folded" in said
    assert any("fused 2 layer groups" in e for e in f.explanations)
    assert any("ReorderOutput" in e for e in f.explanations)
    over = {o.group: o for o in f.overheads}
    assert over["r2_nchwc"].bound_ms == pytest.approx(1.5) and over["r2_nchwc"].covered
    assert 0 < f.kernel_share <= 1


def test_measured_ms_overrides_the_profile(convnet):
    prof = load_file(helpers.FIXTURES / "ort_convnet.json")
    a = analyze(convnet, results_for(convnet, lambda n: 0.01), "sys", "onednn", profile=prof, measured_ms=1.0)
    assert a.measured_ms == 1.0 and a.measured_source == "--measured-ms"
    assert a.br_sequential == pytest.approx(a.bounds.sequential_ms)


# --- Q3/Q4: library calls ------------------------------------------------------------------------------

def test_cudnn_log_algorithms_and_gain(convnet):
    calls = parse_cudnn_log(helpers.FIXTURES / "cudnn_v7.log")
    conv1, conv2 = convnet.nodes[0].layer, convnet.nodes[2].layer
    res = results_for(convnet, lambda n: 1.0, backend="cudnn") + [
        ok(conv1, 0.50, "cudnn", "IMPLICIT_PRECOMP_GEMM"), ok(conv1, 0.30, "cudnn", "IMPLICIT_GEMM"),
        ok(conv2, 0.20, "cudnn", "WINOGRAD"), ok(conv2, 0.40, "cudnn", "FFT")]
    prof = ExecutionProfile(path="x", library_calls={"cudnn": calls})
    a = analyze(convnet, res, "sys", "cudnn", profile=prof)
    (lib,) = a.libraries
    assert len(lib.alignment.passes) == 2 and lib.alignment.missing == [] and lib.alignment.extra == []
    choices = {c.name: c for c in lib.algorithms}
    assert choices["conv1"].used == "IMPLICIT_PRECOMP_GEMM" and choices["conv1"].best == "IMPLICIT_GEMM"
    assert choices["conv1"].gain_ms == pytest.approx(0.2) and not choices["conv1"].optimal
    assert choices["conv2"].optimal and choices["conv2"].gain_ms == 0
    assert lib.algorithm_gain_ms == pytest.approx(0.2)
    # the Gemm's cuBLAS call and the BN/pool calls are absent from a cuDNN-only log
    assert lib.alignment.api_counts["cudnnConvolutionForward"] == (2, 2)
    assert lib.alignment.api_counts["cudnnAddTensor"] == (0, 1)


def test_alignment_reports_parameter_deviation_and_missing(convnet):
    # a framework that pads explicitly (MXNet's ONNX loader, paper §IV-C1) calls conv2 with pad 0 on 10x10
    calls = parse_cudnn_log(helpers.FIXTURES / "cudnn_v7.log")[:1]
    from dataclasses import replace
    first = calls[0]
    padded = replace(first, index=1, conv=replace(first.conv, ic=8, ih=10, iw=10, ph=0, pw=0))
    al = align_calls(convnet, [first, padded], "cudnn", "onednn")
    (p,) = al.passes
    assert [m.node for m in p] == [0, 2]
    assert p[1].deviations == ("ih: expected 8, called 10", "iw: expected 8, called 10",
                               "ph: expected 1, called 0", "pw: expected 1, called 0")
    assert al.missing == [7]  # oneDNN runs the Gemm too, and this log never shows it


def test_onednn_log_against_model(convnet):
    prof = load_file(helpers.FIXTURES / "onednn_v2.log")
    conv1 = convnet.nodes[0].layer
    unfused = results_for(convnet, lambda n: 1.0) + [ok(conv1, 0.02, impl="brg:avx512_core"),
                                                     ok(conv1, 0.05, impl="jit:avx512_core", algo="winograd")]
    # the log's conv1 call fuses a ReLU (attr-post-ops:eltwise_relu): unfused benchmarks do not compare
    a = analyze(convnet, unfused, "sys", "onednn", profile=prof)
    (lib,) = a.libraries
    c = {x.name: x for x in lib.algorithms}["conv1"]
    assert c.post_ops == ("eltwise_relu",) and not c.comparable and c.used_ms is None and not c.suboptimal
    assert any("fuses eltwise_relu and no benchmark" in n for n in a.notes)
    fused = unfused + [ok(conv1, 0.03, impl="brg:avx512_core", fusion="bias_relu"),
                       ok(conv1, 0.06, impl="jit:avx512_core", algo="winograd", fusion="bias_relu")]
    a = analyze(convnet, fused, "sys", "onednn", profile=prof)
    (lib,) = a.libraries
    c = {x.name: x for x in lib.algorithms}["conv1"]
    assert c.fusion == "bias_relu" and c.used == "jit:avx512_core" and c.used_ms == 0.06
    assert c.best == "brg:avx512_core" and c.best_ms == 0.03 and c.gain_ms == pytest.approx(0.03)
    assert [m.node for m in lib.alignment.passes[0]] == [0, 2, 7]


# --- Q6 ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, tc", [
    ("volta_h884cudnn_256x64_ldg8_relu_exp_small_nhwc_tn_v1", True),
    ("turing_fp16_s1688gemm_fp16_128x128_ldg8_f2f_tn", True),
    ("sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize64x32x64", True),
    ("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn", True),
    ("cutlass_tensorop_f16_s16816gemm_f16_256x128_32x3_nn_align8", True),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_"
     "execute_segment_k_off_kernel__5x_cublas", True),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_h161616gemm_32x32_128x2_nn_align8>", True),
    ("volta_sgemm_128x64_nn", False),
    ("implicit_convolve_sgemm", False),
    ("void cudnn::cnn::conv2d_grouped_direct_kernel<false, true>", False),
    ("sm80_sgemm_128x64_nn", False),
])
def test_tensor_core_kernel_names(name, tc):
    assert bool(TENSOR_CORE_RE.search(name)) is tc


def test_tensor_cores_from_kineto_and_fp16_bounds(convnet):
    prof = load_file(helpers.FIXTURES / "kineto_cuda.json")
    res = results_for(convnet, lambda n: 1.0, backend="cudnn")
    res += [ok(n.layer, 0.5, "cudnn", dtype="f16", layout="nhwc") for n in convnet.nodes if n.layer.cudnn_api]
    a = analyze(convnet, res, "sys", "cudnn", profile=prof)
    assert a.tensor_cores.kernels == 8 and a.tensor_cores.tc_kernels == 2
    assert a.tensor_cores.bounds["f16"].sequential_ms == pytest.approx(a.bounds.sequential_ms / 2)
    assert "f16/nchw" not in a.tensor_cores.bounds and "f16/nhwc" in a.tensor_cores.bounds
    assert a.joint is not None and a.joint_label.endswith("f16") or a.joint_label.endswith("f16/nhwc")
    assert a.joint.parallel_ms <= a.tensor_cores.bounds["f16"].parallel_ms + 1e-12
    assert a.kernel_gaps and a.kernel_gaps[0].mean_us > 0


def test_parallel_modules_of_a_chain_are_none():
    g = Dag.of((), [(0, 1), (1, 2)])
    assert parallel_modules(g, {0: 1, 1: 1, 2: 1}) == []


# --- through the CLI and the performance database --------------------------------------------------

def _db_with(path, model, system_name="cpu-a", ms_of=lambda n: 0.1):
    from benanza.perfdb import PerfDB
    from benanza.records import System

    db = PerfDB(path)
    system = System(system_name, "onednn", "test CPU", (("onednn", "3.2"),))
    db.insert_results(system, [Result(r.variant, system_name, r.status, median_ms=r.median_ms)
                               for r in results_for(model, ms_of)], command="test")
    return db


def test_analyze_cli_json_and_missing_warning(tmp_path, save):
    from click.testing import CliRunner

    from benanza.cli import main

    path = save(inception_like(), "inc.onnx")
    model = load_model(path, 1)
    _db_with(tmp_path / "p.db", model)
    r = CliRunner().invoke(main, ["analyze", str(path), "--system", "cpu-a", "--db", str(tmp_path / "p.db"),
                                  "--measured-ms", "2", "--json", "--report", str(tmp_path / "r.html")])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    (a,) = doc["analyses"]
    assert a["bounds"]["sequential_ms"] == pytest.approx(0.1 * 9) and not a["bounds"]["partial"]
    assert a["bounds"]["br_sequential"] == pytest.approx(0.45)
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")
    # batch 2 has no results at all: partial, with the command that fills the database
    r = CliRunner().invoke(main, ["analyze", str(path), "--system", "cpu-a", "--db", str(tmp_path / "p.db"),
                                  "-b", "1", "-b", "2", "--json"])
    assert r.exit_code == 0, r.output
    one, two = json.loads(r.stdout)["analyses"]
    assert not one["bounds"]["partial"] and two["bounds"]["partial"]
    assert any("benanza generate" in w and "--batch-size 2" in w for w in two["warnings"])


def test_analyze_cli_unknown_system_is_one_clean_line(tmp_path, save):
    from click.testing import CliRunner

    from benanza.cli import main

    path = save(inception_like(), "inc.onnx")
    _db_with(tmp_path / "p.db", load_model(path, 1))
    r = CliRunner().invoke(main, ["analyze", str(path), "--system", "nope", "--db", str(tmp_path / "p.db")])
    assert r.exit_code == 1 and "system 'nope' is not in the performance database (known: cpu-a)" in r.output


def test_analyze_sweep_over_systems(tmp_path, save):
    from benanza.sweep import SweepRequest, run_sweep

    path = save(inception_like(), "inc.onnx")
    model = load_model(path, 1)
    db = _db_with(tmp_path / "p.db", model, "fast", lambda n: 0.1)
    from benanza.records import System
    slow = System("slow", "onednn", "old CPU", ())
    db.insert_results(slow, [Result(r.variant, "slow", r.status, median_ms=1.0) for r in results_for(model)])
    a_fast, a_slow = run_sweep(SweepRequest(str(path), ("fast", "slow")), db)
    assert a_slow.bounds.sequential_ms == pytest.approx(10 * a_fast.bounds.sequential_ms)


def test_unmatchable_trace_is_said_not_misread(convnet):
    # torch's aten:: ops carry no ONNX node names: no fake "inserted ops" view
    prof = load_file(helpers.FIXTURES / "kineto_cpu.json")
    a = analyze(convnet, results_for(convnet), "sys", "onednn", profile=prof)
    assert a.framework is None
    assert any("could not be matched" in n for n in a.notes)
    assert a.measured_ms is not None  # the trace's runs still give a latency


@pytest.mark.slow
def test_generate_missing_fills_the_database_through_the_library(tmp_path, save, monkeypatch):
    """`analyze --generate-missing` generates and runs the benchmarks itself (the library's generator
    and runner, not Benanza's command line in a shell: with no `benanza` on PATH that would fail), and
    its bound is the database's: the fastest OK unfused result per layer, recomputed in SQL."""
    from click.testing import CliRunner

    from benanza.cli import main
    from tests.analysis.test_bounds_e2e import JSON_MS, best_by_key, node_keys

    path = save(helpers.conv_net(), "net.onnx")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # the compilers and CMake, not the venv's `benanza`
    cli = CliRunner()
    # the system is known with one result; the fill reuses this build (unchanged sources are not rewritten)
    for args in (["generate", str(path), "--backend", "onednn", "--dtype", "f32"],
                 ["run", "--system", "box", "--backend", "onednn", "--db", "p.db", "--filter", "^eltwise:relu",
                  "--min-time", "0.01", "--repetitions", "1"]):
        r = cli.invoke(main, args)
        assert r.exit_code == 0, r.output
    # not a terminal: progress as lines, the last one at the last benchmark
    assert re.search(r"^run: (\d+)/\1 benchmarks \(ok \1, unsupported 0, failed 0\), \S+ spent, about 0s left$",
                     r.output, re.M), r.output
    # the fill's own contention judgement is tested in test_measurement; a loaded machine must not
    # turn this test of the library path into a refusal
    r = cli.invoke(main, ["analyze", str(path), "--system", "box", "--db", "p.db", "--generate-missing", "--json",
                          "--allow-contended"])
    assert r.exit_code == 0, r.output
    (a,) = json.loads(r.stdout)["analyses"]
    assert not a["coverage"]["missing"] and not a["bounds"]["partial"]
    best = best_by_key(tmp_path / "p.db", "box", "f32")
    keys = node_keys(tmp_path / "out" / "bench", "net", "f32")
    assert a["bounds"]["sequential_ms"] == pytest.approx(sum(best.get(k, 0.0) for k in keys.values()), **JSON_MS)
    assert a["bounds"]["sequential_ms"] > 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d"]),
                          st.one_of(st.sampled_from([0.5, 1.0, 2.0, float("inf")]), st.just(float("nan"))),
                          st.booleans()), max_size=8))
def test_best_picks_what_keying_on_latency_then_name_picks(specs):
    """``best`` names only the equally fast candidates; the choice is the one a min over (latency,
    name) of every OK candidate makes, ties, infinities and a NaN included."""
    from benanza.analysis.bounds import best, candidates
    from benanza.ops.conv import ConvProblem

    problem = load_model(helpers.conv_net()).nodes[0].layer.problem
    assert isinstance(problem, ConvProblem)
    results = [Result(Variant(problem, "onednn", "convolution", algo), "box", Status.OK if ok else Status.FAILED,
                      median_ms=latency if ok else None) for algo, latency, ok in specs]
    ok = candidates(results, "f32")
    want = min(ok, key=lambda r: (r.latency_ms, r.variant.name)) if ok else None
    assert best(results, "f32") is want
