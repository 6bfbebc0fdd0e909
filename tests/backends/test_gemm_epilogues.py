"""GEMM epilogues: MatMul→Add(bias)[→Gelu|→Relu] on the cuDNN/cuBLAS backend as one cublasLtMatmul
per heuristic algorithm, on real TorchScript exports of an encoder and a GPT block; the plain
MatMul's GEMM shapes against NumPy; a real build run to the clean no-device failure; Q5 over
results stored by the runner from the runtime's line protocol; and the ReLU epilogue on oneDNN,
checked in oneDNN's own verbose log."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from helpers import REPO, generate_bench, io, model, tensor
from onnx import helper, numpy_helper
from torch_models import export

from benanza.backends import cudnn
from benanza.cli import main
from benanza.fusion import BY_NAME as FUSION_PATTERNS
from benanza.fusion import match_fusions
from benanza.generator import GenOptions, generate, read_variants
from benanza.layers import unique_layers
from benanza.manifest import build_manifest
from benanza.ops.attention import CUDNN_SDPA
from benanza.perfdb import PerfDB
from benanza.processor import load_model
from benanza.records import System, Variant
from benanza.runner import RunOptions, RunSummary, _execute
from tests.backends.test_cudnn import NEED_TOOLCHAIN, _build, _run_without_gpu
from tests.e2e.test_transformers import verbose_execs

EXPORTS = (("encoder", 17), ("gpt", 23))  # ReLU MLP (nn.TransformerEncoderLayer), exact-GELU MLP (opset 20+ Gelu)
# what each pattern's activation must run as (runtime_cpp/cudnn/benanza_cudnn/tables.hpp)
EPILOGUE_CALL = {"mm_bias": "kLtBias", "mm_bias_relu": "kLtBiasRelu", "mm_bias_gelu": "kLtBiasGelu"}
DTYPES, MATHS = ("f32", "f16", "bf16"), ("fma", "tf32_allowed", "tensor_op")


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> list[Path]:
    d = tmp_path_factory.mktemp("exports")
    return [export(name, opset, d) for name, opset in EXPORTS]


@pytest.fixture(scope="module")
def generated(exports, tmp_path_factory):
    models = [load_model(p) for p in exports]
    return models, *generate_bench(models, "cudnn", tmp_path_factory.mktemp("bench"),
                                   GenOptions(dtypes=DTYPES, math=MATHS))


def _table_rows(out_dir: Path) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """The blas tables' layer rows (field → C++ literal) and variant rows, layer indexes made global."""
    layers: list[dict[str, str]] = []
    variants: list[dict[str, str]] = []
    for path in sorted(out_dir.glob("tables_blas_*.cpp")):
        text = path.read_text()
        base = len(layers)
        body = text.split("const BlasLayer kLayers[] = {", 1)[1].split("};", 1)[0]
        layers += [dict(re.findall(r"\.(\w+) = ([^,{}]+)", row.split(".work", 1)[0]))
                   for row in body.splitlines() if row.strip().startswith("{")]
        for line in text.split("const Variant kVariants[] = {", 1)[1].splitlines():
            if ".name = " in line:
                row = dict(re.findall(r"\.(\w+) = (\"[^\"]*\"|[^,{}]+)", line))
                row["name"] = json.loads(row["name"])
                row["layer"] = str(base + int(row["layer"]))
                variants.append(row)
    return layers, variants


def _initializers(path: Path) -> dict[str, tuple[int, ...]]:
    graph = onnx.load(str(path)).graph
    return {t.name: tuple(t.dims) for t in graph.initializer}


# --- the fused variants of real exports --------------------------------------------------------

def test_every_gemm_epilogue_of_the_exports_has_its_cublaslt_variants(generated, exports):
    models, _, g = generated
    layers, rows = _table_rows(g.out_dir)
    by_name = {r["name"]: r for r in rows}
    lt = [v for v in g.variants if v.api == cudnn.LT_API]
    seen = set()
    for path, m in zip(exports, models):
        inits = _initializers(path)
        onnx_nodes = {node.name: node for node in onnx.load(str(path)).graph.node}
        for match in match_fusions(m):
            if match.pattern.anchor != "MatMul" or match.pattern.attention:
                continue
            seen.add(match.pattern.name)
            mm, add = (onnx_nodes[m.nodes[i].name] for i in match.nodes[:2])
            # the ONNX file's own shapes: the weight [K, N], the bias [N] (an initializer of the Add)
            k, n = inits[mm.input[1]]
            assert [inits[i] for i in add.input if i in inits] == [(n,)]
            mine = [v for v in lt if v.problem == match.conv.problem and v.fusion == match.pattern.name]
            # every heuristic rank × dtype × the math modes each dtype has
            want = {(a, d, mt) for a in cudnn.LT_ALGOS for d in DTYPES for mt in cudnn.TENSOR_MATH[d]}
            assert {(v.algo, v.dtype, v.math) for v in mine} == want, match.pattern.name
            for v in mine:
                row = by_name[v.name]
                assert row["call"] == EPILOGUE_CALL[match.pattern.name]
                assert int(row["algo"]) == cudnn.LT_ALGOS.index(v.algo)
                layer = layers[int(row["layer"])]
                # one GEMM over every row of the [1, SEQ, D] activations
                assert (int(layer["m"]), int(layer["n"]), int(layer["k"])) == (16, n, k)
                assert (layer["batch"], layer["a_count"], layer["b_count"]) == ("1", "1", "1")
    assert seen == set(EPILOGUE_CALL)
    # nothing else gets an epilogue: attention's batched MatMuls and unfused layers have none
    # (an attention pattern anchored on a batched MatMul is a cuDNN graph-API SDPA, not a GEMM)
    fused_problems = {v.problem for v in lt}
    assert all(len(p.a) == 2 and len(p.b) == 2 for p in fused_problems)
    gemms = [v for v in g.variants if v.api in ("cublasGemmEx", "cublasGemmStridedBatchedEx", "cublasSgemv")]
    assert {v.fusion for v in gemms} == {"none"}
    assert all(FUSION_PATTERNS[v.fusion].attention for v in g.variants if v.api == CUDNN_SDPA and v.fusion != "none")


def test_gelu_and_relu_activations_decide_the_pattern(generated, exports):
    """The GPT block's fc Linear is followed by Gelu, the encoder's linear1 by Relu (the ONNX
    files' own consumer ops); each gets its own epilogue and no other."""
    models, _, _ = generated
    for path, m in zip(exports, models):
        graph = onnx.load(str(path)).graph
        onnx_nodes = {node.name: node for node in graph.node}
        consumers: dict[str, list[str]] = {}
        for node in graph.node:
            for i in node.input:
                consumers.setdefault(i, []).append(node.op_type)
        for match in match_fusions(m):
            if match.pattern.name not in EPILOGUE_CALL:
                continue
            add = onnx_nodes[m.nodes[match.nodes[1]].name]
            after = consumers.get(add.output[0], [])
            expect = {"Gelu": "mm_bias_gelu", "Relu": "mm_bias_relu"}.get(after[0] if len(after) == 1 else "",
                                                                           "mm_bias")
            assert match.pattern.name == expect


# --- the plain MatMul: one GEMM for a broadcast weight, strided-batched when truly batched -----

def _gemm_like_the_runtime(layer: dict[str, str], a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """What blas.cpp computes from a table row: ``batch`` products of m×k by k×n matrices, A/B
    advancing by one matrix per product when stored ``batch`` times, by 0 when stored once."""
    m, n, k, batch = (int(layer[f]) for f in ("m", "n", "k", "batch"))
    a_count, b_count = int(layer["a_count"]), int(layer["b_count"])
    assert a.size == a_count * m * k and b.size == b_count * k * n
    a3, b3 = a.reshape(a_count, m, k), b.reshape(b_count, k, n)
    return np.stack([a3[i if a_count > 1 else 0] @ b3[i if b_count > 1 else 0] for i in range(batch)])


@pytest.mark.parametrize("a_shape,b_shape,call", [
    ((4, 3, 8), (8, 6), "kGemmEx"),  # a broadcast 2-D weight: one GEMM with M = 12
    ((2, 3, 5, 8), (1, 8, 6), "kGemmEx"),  # [1, K, N] is a weight without a batch of its own
    ((5, 2, 8), (5, 8, 12), "kGemmStridedBatchedEx"),  # truly batched
    ((2, 8), (5, 8, 12), "kGemmStridedBatchedEx"),  # A broadcast over B's batch: stride 0
])
def test_plain_matmul_rows_compute_what_numpy_does(tmp_path, save, a_shape, b_shape, call):
    rng = np.random.default_rng(0)
    w = rng.standard_normal(b_shape).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["a", "w"], ["y"])]
    path = save(model(nodes, [io("a", list(a_shape))], [io("y", None)], [numpy_helper.from_array(w, "w")]))
    m = load_model(path)
    g = generate(build_manifest([m], unique_layers([m])), "cudnn", tmp_path, GenOptions(dtypes=("f32",)))
    (layer,), rows = _table_rows(g.out_dir)
    assert {r["call"] for r in rows} == {call}
    a = rng.standard_normal(a_shape).astype(np.float32)
    got = _gemm_like_the_runtime(layer, a, w)
    want = np.matmul(a, w)
    assert got.size == want.size
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-5, atol=1e-5)
    if call == "kGemmEx":
        assert int(layer["m"]) == int(np.prod(a_shape[:-1])) and layer["batch"] == "1"


# --- a real build, run to the clean no-device failure -----------------------------------------

@pytest.mark.slow
@NEED_TOOLCHAIN
def test_epilogue_variants_build_and_report_no_gpu(exports, tmp_path, cudnn_runtime):
    models = [load_model(p) for p in exports]
    manifest = build_manifest(models, unique_layers(models))
    g = generate(manifest, "cudnn", tmp_path, GenOptions(dtypes=("f32", "bf16")))
    binary = _build(g.out_dir, runtime=cudnn_runtime)
    lt = [v for v in g.variants if v.api == cudnn.LT_API]
    assert lt
    listed = subprocess.run([str(binary), "--benanza_list"], capture_output=True, text=True, check=True)
    assert sorted(listed.stdout.split()) == sorted(v.name for v in g.variants)
    _run_without_gpu(binary, lt, "--benchmark_filter=cublasLtMatmul")


# --- Q5 through the pipeline: generator → runner (line protocol) → database → analyze ----------

def _unit(text: str) -> float:
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF


def _runtime_line(v: Variant) -> dict:
    """A BENANZA_RESULT record as blas.cpp prints it (made-up latencies: there is no GPU here).
    Unfused layers take 0.01–0.02 ms; the fused Linear epilogues less, the ReLU one far more (so
    Q5 must call it unprofitable); TF32 is fastest of all (an f32 bound must not use it); the
    heuristic offers five algorithms, so ranks 5–7 are refused as the runtime refuses them."""
    ms = 0.01 + 0.01 * _unit(v.name)
    line = {"name": v.name, "status": "ok", "iterations": 100, "repetitions": 3, "implementation": v.api,
            "counters": {"flops": 1.0, "workspace_bytes": 0}}
    if v.api == cudnn.LT_API:
        rank = cudnn.LT_ALGOS.index(v.algo)
        if rank >= 5:
            return {"name": v.name, "status": "unsupported", "implementation": "",
                    "message": f"cublasLtMatmulAlgoGetHeuristic offered 5 algorithms for this GEMM, "
                               f"none of rank {rank}"}
        ms = (1.0 if v.fusion == "mm_bias_relu" else 0.002) + 0.001 * _unit(v.name)
        line["counters"] |= {"algo": rank, "heuristic_algos": 5, "workspace_bytes": 1 << 20}
    if v.math == "tf32_allowed":
        ms = 0.0005
    return line | {"median_ms": ms, "mean_ms": ms, "stddev_ms": 0.0, "min_ms": ms}


def test_q5_reports_the_cublaslt_epilogues(generated, exports, tmp_path):
    _, manifest, g = generated
    variants = read_variants(g.out_dir)
    assert {v.name for v in variants} == {v.name for v in g.variants}
    # a stand-in for the built binary, speaking the runtime's line protocol
    (tmp_path / "lines.json").write_text(json.dumps({v.name: _runtime_line(v) for v in variants}))
    fake = tmp_path / "benanza_bench"
    fake.write_text(f"""#!{sys.executable}
import json, sys
lines = json.load(open({str(tmp_path / "lines.json")!r}))
for n in open(sys.argv[1].split("=", 1)[1]).read().split():
    print("BENANZA_START", n, flush=True)
    print("BENANZA_RESULT", json.dumps(lines[n]), flush=True)
""")
    fake.chmod(0o755)
    db_path = tmp_path / "gpu.db"
    system = System("gpu-box", "cudnn", "stand-in", (("cuda", "13.0"),))
    summary = RunSummary(system, "cudnn", db_path, total=len(variants), already=0)
    with PerfDB(db_path) as db:
        db.record_models(manifest)
        db.upsert_system(system)
        _execute(fake, variants, dict(os.environ), RunOptions(timeout=60), db, system, summary, None)
    assert summary.failed == 0

    def best(key: str, fusion: str) -> float | None:
        """The independent oracle: the fastest stored ok result of the key under the fusion, TF32
        excluded (an f32 bound assumes f32 arithmetic)."""
        with sqlite3.connect(db_path) as conn:
            (ms,) = conn.execute(
                "SELECT min(r.median_ms) FROM results r JOIN variants v ON v.name = r.variant WHERE r.system = ? "
                "AND r.layer_key = ? AND r.status = 'ok' AND v.fusion = ? AND v.math != 'tf32_allowed'",
                (system.name, key, fusion)).fetchone()
        return ms

    applied_all: set[str] = set()
    for path in exports:
        out = CliRunner().invoke(main, ["analyze", str(path), "--system", system.name, "--db", str(db_path),
                                        "--json"])
        assert out.exit_code == 0, out.output
        (a,) = json.loads(out.output)["analyses"]
        rows = a["layers"]
        assert [r["index"] for r in rows] == list(range(len(rows)))
        fusion = a["fusion"]
        uses = fusion["applied"] + fusion["unprofitable"]
        gemm_uses = [u for u in uses if u["pattern"] in EPILOGUE_CALL]
        assert gemm_uses, path.name
        for u in gemm_uses:
            anchor = rows[u["nodes"][0]]
            assert anchor["op"] == "MatMul"
            assert u["fused_ms"] == pytest.approx(best(anchor["key"], u["pattern"]), abs=5e-7)
            assert "/api=cublasLtMatmul/" in u["variant"] and u["variant"].endswith(f"/fusion={u['pattern']}")
            unfused = sum(rows[i]["latency_ms"] for i in u["nodes"])
            assert u["unfused_ms"] == pytest.approx(unfused, abs=5e-6)
        assert {u["pattern"] for u in fusion["unprofitable"]} <= {"mm_bias_relu"}
        applied = {u["pattern"] for u in fusion["applied"] if u["pattern"] in EPILOGUE_CALL}
        assert "mm_bias_relu" not in applied
        applied_all |= applied
        if path.stem.startswith("encoder"):
            assert [u["pattern"] for u in fusion["unprofitable"]] == ["mm_bias_relu"]
    assert applied_all == {"mm_bias", "mm_bias_gelu"}


# --- the ReLU epilogue on oneDNN ---------------------------------------------------------------

@pytest.mark.slow
def test_relu_epilogue_runs_as_a_onednn_post_op(save, tmp_path):
    from benanza.backends.base import build

    n = helper.make_node
    nodes = [n("MatMul", ["x", "w1"], ["h"], name="fc"), n("Add", ["h", "b1"], ["hb"], name="fc_bias"),
             n("Relu", ["hb"], ["r"], name="relu"), n("MatMul", ["r", "w2"], ["y"], name="out")]
    inits = [tensor("w1", (32, 64)), tensor("b1", (64,)), tensor("w2", (64, 32))]
    m = load_model(save(model(nodes, [io("x", [1, 16, 32])], [io("y", [1, 16, 32])], inits)))
    assert [(f.pattern.name, [m.nodes[i].name for i in f.nodes]) for f in match_fusions(m)] == \
        [("mm_bias_relu", ["fc", "fc_bias", "relu"])]
    g = generate(build_manifest([m], unique_layers([m])), "onednn", tmp_path, GenOptions(dtypes=("f32",)))
    (fused,) = [v for v in g.variants if v.fusion == "mm_bias_relu"]
    (plain,) = [v for v in g.variants if v.problem == fused.problem and v.fusion == "none"]
    binary = build(g.out_dir)
    # oneDNN's record of what ran: the fused matmul has the bias and the ReLU post-op, on 16 rows
    want = ("bia_f32", "attr-post-ops:eltwise_relu", ",16x32:32x64:16x64,")
    lines = [ln for ln in verbose_execs(binary, [fused.name], tmp_path) if ",matmul," in ln]
    assert any(all(w in ln for w in want) for ln in lines), lines[-2:]
    lines = [ln for ln in verbose_execs(binary, [plain.name], tmp_path) if ",matmul," in ln]
    assert lines and not any("post-ops" in ln or "bia_f32" in ln for ln in lines), lines[-2:]


def test_runtime_asks_the_heuristic_for_one_answer_per_generated_rank():
    """blas.cpp's request size is what the generator names variants after: a rank it never asks
    for would be stored as unsupported forever, an answer it asks for but nobody times is lost."""
    source = (REPO / "runtime_cpp" / "cudnn" / "blas.cpp").read_text()
    (count,) = re.findall(r"constexpr int kLtAlgos = (\d+);", source)
    assert int(count) == len(cudnn.LT_ALGOS)
