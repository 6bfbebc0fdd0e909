"""Decode steps of a tiny Llama/Qwen2-style decoder (tests/llm_models.py: RMSNorm, rotary
embeddings from the position ids, grouped-query attention over a KV cache given as inputs),
exported in the test with both of torch.onnx.export's exporters, and ONNX Runtime's dynamic int8
quantization of it: coverage of the layers that run, then generator → oneDNN runner → database →
analyzer for the int8 model, its bound recomputed from SQL, and every int8 benchmark's output
compared with ONNX Runtime by `benanza check`."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import llm_models
import onnx
import pytest
from click.testing import CliRunner
from helpers import REPO

from benanza.cli import main
from benanza.fusion import match_fusions
from benanza.processor import load_model

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
    for name in (exports["torchscript"].stem, exports["dynamo"].stem):
        assert stats[name]["backends"]["cudnn"]["covered_pct"] >= 95.0, stats[name]["backends"]["cudnn"]
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
                            "WHERE v.fusion IN ('rmsnorm', 'mmint_scale', 'mmint_scale_bias')").fetchall()
    fused = {f for _, _, f in rows}
    assert fused == {"rmsnorm", "mmint_scale", "mmint_scale_bias"}
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
