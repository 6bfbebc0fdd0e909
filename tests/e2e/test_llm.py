"""Decode steps of a tiny Llama/Qwen2-style decoder (tests/llm_models.py: RMSNorm, rotary
embeddings from the position ids, grouped-query attention over a KV cache given as inputs),
exported in the test with both of torch.onnx.export's exporters, and ONNX Runtime's dynamic int8
quantization of it: coverage of the layers that run, then generator → oneDNN runner → database →
analyzer for the int8 model, its bound recomputed from SQL, and every int8 benchmark's output
compared with ONNX Runtime by `benanza check`; the int8 model's cuDNN/cuBLASLt project compiled,
linked and its graphs validated by the cuDNN frontend (no GPU here)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import llm_models
import onnx
import pytest
from click.testing import CliRunner
from helpers import REPO

from benanza.cli import main
from benanza.fusion import match_fusions
from benanza.generator import GenOptions, generate
from benanza.layers import unique_layers
from benanza.manifest import build_manifest
from benanza.processor import load_model
from tests.backends.test_cudnn import NEED_TOOLCHAIN, _build, _lines, _run_without_gpu

pytestmark = pytest.mark.slow  # exports with torch, builds and runs oneDNN benchmarks

QUANTIZED_FAMILIES = ("matmulint", "dynquant", "dequant", "convert")


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("llm")
    ts = llm_models.export(d, seq=1, past=8, opset=17, exporter="torchscript")
    dyn = llm_models.export(d, seq=1, past=8, opset=18, exporter="dynamo")
    return {"torchscript": ts, "dynamo": dyn, "int8": llm_models.quantize(ts, d / "llama_int8.onnx")}


def _generate(paths: list[Path], out: Path, *extra: str) -> dict:
    r = CliRunner().invoke(main, ["generate", *map(str, paths), "--out", str(out), "--json", *extra])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_decode_steps_are_costed(exports, tmp_path) -> None:
    stats = {m["model"]: m for m in _generate(list(exports.values()), tmp_path / "b", "--dtype", "f32")["models"]}
    ops = {name: {n.op_type for n in onnx.load(str(p), load_external_data=False).graph.node}
           for name, p in zip(stats, exports.values())}
    int8 = stats[exports["int8"].stem]
    assert {"MatMulInteger", "DynamicQuantizeLinear"} <= ops[exports["int8"].stem]
    for name, s in stats.items():
        onednn = s["backends"]["onednn"]
        assert onednn["covered_pct"] >= 95.0, (name, onednn["not_covered"])
        # what is left names itself: oneDNN has no sin/cos, no int64 (the position ids' Cast)
        assert set(onednn["not_covered"]) <= {"Cos", "Sin", "Cast", "Gather"}, (name, onednn["not_covered"])
    for name in stats:
        assert stats[name]["backends"]["cudnn"]["covered_pct"] >= 95.0, stats[name]["backends"]["cudnn"]
    # on the GPU the int8 layers are cuBLASLt's int8 GEMM and cuDNN graph nodes, the position ids'
    # int64 Cast a graph node on an INT64 tensor; what is left: the Gather of the u8 embedding
    # table (copies move float data only)
    assert int8["backends"]["cudnn"]["not_covered"] == {"Gather": 1}, int8["backends"]["cudnn"]
    # every RMSNorm of every export (two per layer and the final one) is one RMS normalization
    for path in exports.values():
        matches = [m.pattern.name for m in match_fusions(load_model(path))]
        assert matches.count("rmsnorm") == 2 * llm_models.LAYERS + 1, (path.name, matches)
    # every integer matmul costed: the model's matrix work is all MatMulInteger but attention's
    assert "MatMulInteger" not in int8["backends"]["onednn"]["not_covered"]
    # docs/quantized.md's table is these numbers
    doc = (REPO / "docs" / "quantized.md").read_text()
    labels = {"torchscript": "TorchScript, opset 17", "dynamo": "dynamo, opset 18", "int8": "int8 (`quantize_dynamic`)"}
    for kind, path in exports.items():
        s = stats[path.stem]
        row = (f"| {labels[kind]} | {s['running_layers']} | {s['backends']['onednn']['covered_pct']:.1f}% | "
               f"{s['backends']['cudnn']['covered_pct']:.1f}% |")
        assert row in doc, row


@pytest.fixture(scope="module")
def int8_run(exports, tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("int8run")
    _generate([exports["int8"]], d / "bench", "--backend", "onednn", "--dtype", "f32", "--layout", "nchw")
    r = CliRunner().invoke(main, ["run", "--system", "cpu", "--bench-dir", str(d / "bench"), "--db", str(d / "p.db"),
                                  "--min-time", "0.01", "--repetitions", "1", "--no-peaks", "--threads", "1"])
    assert r.exit_code == 0, r.output
    return d, exports["int8"]


def test_int8_bound_is_the_database_sum(int8_run) -> None:
    from tests.analysis.test_bounds_e2e import JSON_MS, best_by_key, node_keys

    d, model = int8_run
    r = CliRunner().invoke(main, ["analyze", str(model), "--system", "cpu", "--db", str(d / "p.db"), "--json",
                                  "--allow-contended"])
    assert r.exit_code == 0, r.output
    (a,) = json.loads(r.output)["analyses"]
    assert not a["coverage"]["missing"]
    keys = node_keys(d / "bench", model.stem, "f32")
    best = {**best_by_key(d / "p.db", "cpu", "f32"), **best_by_key(d / "p.db", "cpu", "u8")}
    layers = {la["name"]: la for la in a["layers"]}
    ints = [n for n, k in keys.items() if k.startswith("matmulint:")]
    assert len(ints) == 15 and all(keys[n].endswith("_u8") and layers[n]["status"] == "ok" for n in ints)
    ok = {n: best[k] for n, k in keys.items() if layers[n]["status"] == "ok"}
    assert a["bounds"]["sequential_ms"] == pytest.approx(sum(ok.values()), **JSON_MS)
    with sqlite3.connect(d / "p.db") as conn:
        stored = {k for (k,) in conn.execute("SELECT DISTINCT layer_key FROM results WHERE status = 'ok'")}
    assert {keys[n] for n in ints} <= stored
    # the fused bound runs each MatMulInteger→Cast→Mul(→Add) as one int8 GEMM
    assert a["fusion"] is not None
    with sqlite3.connect(d / "p.db") as conn:
        rows = conn.execute("SELECT r.status, r.message, v.fusion FROM results r JOIN variants v ON v.name = r.variant "
                            "WHERE v.fusion IN ('rmsnorm', 'mmint_scale', 'mmint_scale_bias', 'rope')").fetchall()
    fused = {f for _, _, f in rows}
    assert fused == {"rmsnorm", "mmint_scale", "mmint_scale_bias", "rope"}
    for status, message, fusion in rows:
        if fusion != "rmsnorm":
            assert status == "ok", message
        elif onednn_version(d / "p.db") < (3, 4):  # layer normalization's RMS mode came in oneDNN 3.4
            assert status == "unsupported" and "has no RMS mode of layer normalization" in message, message


def onednn_version(db: Path) -> tuple[int, ...]:
    """The oneDNN the results were measured with, as the runtime reported it into the stack."""
    with sqlite3.connect(db) as conn:
        (stack,) = conn.execute("SELECT stack FROM systems WHERE backend = 'onednn' LIMIT 1").fetchone()
    return tuple(int(x) for x in json.loads(stack)["onednn"].split(".")[:2])


def test_int8_outputs_match_onnx_runtime(int8_run) -> None:
    d, model = int8_run
    r = CliRunner().invoke(main, ["check", str(model), "--bench-dir", str(d / "bench"), "--show-ok",
                                  "--filter", "^(" + "|".join(QUANTIZED_FAMILIES) + "):"])
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.output.splitlines() if ln.startswith(("ok:", "mismatch:", "not checked:", "failed:"))]
    assert lines and all(ln.startswith("ok:") for ln in lines), r.output
    checked = {ln.split(":", 2)[1].strip() for ln in lines}
    assert checked >= set(QUANTIZED_FAMILIES)
    assert any("fusion=mmint_scale_bias" in ln for ln in lines) and any("fusion=mmint_scale:" in ln for ln in lines)


# The int8 export's GEMMs, by hand from tests/llm_models.py (one token): q, o HIDDEN→HIDDEN; k, v
# HIDDEN→KV_HEADS·HEAD_DIM; gate, up HIDDEN→INTER and the head HIDDEN→VOCAB (both 128 here); down
# INTER→HIDDEN. u8 activations with their zero point, s8 weights without one (QInt8 is symmetric).
INT8_GEMMS = {(llm_models.HIDDEN, llm_models.HIDDEN), (llm_models.HIDDEN, llm_models.KV_HEADS * llm_models.HEAD_DIM),
              (llm_models.HIDDEN, llm_models.INTER), (llm_models.HIDDEN, llm_models.VOCAB),
              (llm_models.INTER, llm_models.HIDDEN)}


@pytest.mark.slow  # builds a cuDNN project
@NEED_TOOLCHAIN
def test_int8_cudnn_project_builds_and_validates(exports, tmp_path, cudnn_runtime) -> None:
    """MatMulInteger as cuBLASLt's int8 GEMM (its own u8 type, one variant per heuristic rank),
    Cast int32→float, DequantizeLinear and DynamicQuantizeLinear as cuDNN graph nodes: the project
    compiles and links, every benchmark fails cleanly without a GPU, and the cuDNN frontend's own
    validation for an sm_90 GPU accepts every quantization graph."""
    models = [load_model(exports["int8"])]
    g = generate(build_manifest(models, unique_layers(models)), "cudnn", tmp_path, GenOptions(dtypes=("f32",)))
    gemms = [v for v in g.variants if v.problem.family == "matmulint"]
    assert {v.layer_key for v in gemms} == {f"matmulint:a1x{k}_b{k}x{n}_ws1_azp1_u8" for k, n in INT8_GEMMS}
    assert {(v.api, v.dtype, v.math) for v in gemms} == {("cublasLtMatmul", "u8", "default")}
    assert len(gemms) == 8 * len(INT8_GEMMS)
    blas = "".join(p.read_text() for p in g.out_dir.glob("tables_blas_*.cpp"))
    for k, n in INT8_GEMMS:  # the row cuBLASLt reads: M = 1 token, the layer's N and K
        assert f"{{.m = 1, .n = {n}, .k = {k}, .trans_a = false, .trans_b = false, .batch = 1" in blas
    assert blas.count(".call = kLtInt8") == len(gemms) and blas.count(".dtype = DType::U8") == len(gemms)
    quant = {v.layer_key.split(":")[0] for v in g.variants if v.api == "cudnn_frontend.quant"}
    assert quant == {"convert", "dequant", "dynquant"}

    binary = _build(g.out_dir, runtime=cudnn_runtime)
    _run_without_gpu(binary, g.variants)  # the device is needed first: the CUDA error, nothing else

    done = subprocess.run([str(binary), "--benanza_check_graphs=90"], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = {ln["name"]: ln for ln in _lines(done.stdout, "BENANZA_GRAPH") if "api=cudnn_frontend.quant" in ln["name"]}
    # one graph per Cast and DequantizeLinear, three per DynamicQuantizeLinear (max, min, quantization)
    keys = {v.layer_key for v in g.variants if v.api == "cudnn_frontend.quant"}
    assert len(lines) == sum(3 if k.startswith("dynquant:") else 1 for k in keys)
    assert all(ln["ok"] for ln in lines.values()), {n: ln["message"] for n, ln in lines.items() if not ln["ok"]}
