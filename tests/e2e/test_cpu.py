"""End to end on CPU: zoo models → oneDNN benchmarks → ONNX Runtime and torch profiles → analyze → HTML.

Uses the real commands (`benanza zoo|generate|run|profile|analyze`) in a scratch folder; the
models are small (LeNet, Inception-v1) and the benchmarks run briefly (f32, 10 ms each).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.analysis.test_bounds_e2e import JSON_MS
from tests.test_report import dump_dom, needs_chromium

pytestmark = pytest.mark.slow
MODELS = ("lenet", "inception-v1")
HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed (pip install torch): no torch profile")


def benanza(*args: str, cwd: Path) -> str:
    proc = subprocess.run([str(Path(sys.executable).parent / "benanza"), *args],
                          cwd=cwd, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, f"benanza {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    if not (Path(sys.executable).parent / "benanza").exists():
        pytest.skip("the benanza console script is not installed in this environment")
    d = tmp_path_factory.mktemp("e2e")
    benanza("zoo", "--out", "models", *[a for m in MODELS for a in ("--only", m)], cwd=d)
    benanza("generate", *[f"models/{m}.onnx" for m in MODELS], "--out", "bench", "--backend", "onednn",
            "--dtype", "f32", cwd=d)
    # the figures of the pipeline are checked here, not how quiet the machine is (test_measurement)
    benanza("run", "--bench-dir", "bench", "--system", "ci-cpu", "--db", "perf.db", "--backend", "onednn",
            "--min-time", "0.01", "--repetitions", "1", "--max-contention", "1", cwd=d)
    for m in MODELS:
        benanza("profile", f"models/{m}.onnx", "--framework", "onnxruntime", "--out", f"prof-{m}",
                "--warmup", "2", "--iterations", "10", "--trace-iterations", "3", cwd=d)
        if HAS_TORCH:  # Benanza's torch executor: layer-named ranges plus torch's oneDNN verbose log
            benanza("profile", f"models/{m}.onnx", "--framework", "torch", "--out", f"torch-{m}",
                    "--warmup", "2", "--iterations", "10", "--trace-iterations", "3", cwd=d)
    return d


def analyze(d: Path, model: str, profile: str = "prof") -> dict:
    out = benanza("analyze", f"models/{model}.onnx", "--system", "ci-cpu", "--db", "perf.db",
                  "--profile", f"{profile}-{model}", "--json", "--report", f"{profile}-{model}.html", cwd=d)
    (a,) = json.loads(out)["analyses"]
    return a


@pytest.mark.parametrize("model", MODELS)
def test_bounds_and_ratio(workdir, model):
    a = analyze(workdir, model)
    b = a["bounds"]
    assert b["sequential_ms"] > 0 and b["parallel_ms"] > 0
    assert b["parallel_ms"] <= b["sequential_ms"] + 1e-9
    assert a["measured_ms"] > 0 and a["measured_source"] == "onnxruntime trimmed mean"
    assert b["br_sequential"] == pytest.approx(b["sequential_ms"] / a["measured_ms"], rel=1e-3)
    fw = a["framework"]
    assert fw["framework"] == "onnxruntime" and fw["fused_groups"], "ORT fuses Conv+Relu on CPU"
    assert fw["bounds_same_fusions"]["br_sequential"] is not None
    said = [w for w in a["warnings"] if w.startswith("bound above measured")]
    assert len(said) == (1 if b["br_sequential"] > 1 or b["br_parallel"] > 1 else 0)
    assert any("MLAS" in n for n in a["notes"])


def test_inception_has_parallel_modules(workdir):
    a = analyze(workdir, "inception-v1")
    # the branches shorten the critical path (a one-thread stack's work floor may bind over it)
    assert a["floors"]["critical_path_ms"] < a["bounds"]["sequential_ms"]
    assert len(a["parallel_modules"]) >= 9  # one per inception module
    assert all(m["branches"] == 4 for m in a["parallel_modules"][:9])


@needs_chromium
def test_report_renders_in_chromium(workdir):
    a = analyze(workdir, "inception-v1")
    dom = dump_dom(workdir / "prof-inception-v1.html")
    assert dom.count('<g class="node') == len(a["layers"])
    assert dom.count('class="node critical') == len(a["bounds"]["critical_path"])
    assert "inception_3a" in dom and "Benanza ratio" in dom


@needs_torch
@pytest.mark.parametrize("model", MODELS)
def test_torch_profile_maps_layers_and_names_onednn_algorithms(workdir, model):
    a = analyze(workdir, model, "torch")
    assert a["measured_source"] == "torch trimmed mean" and a["measured_ms"] > 0
    fw = a["framework"]
    assert fw is not None and fw["framework"] == "torch", a["notes"]
    assert not fw["inserted"] and not fw["fused_groups"]  # one range per layer, nothing else
    convs = {la["name"] for la in a["layers"] if la["op"] == "Conv"}
    per_layer = {g["name"]: g for g in fw["layers"]}
    assert convs <= per_layer.keys()
    assert all(per_layer[c]["op"] == "aten::conv2d" and per_layer[c]["framework_ms"] > 0 for c in convs)

    (lib,) = [lib for lib in a["libraries"] if lib["library"] == "onednn"]
    assert lib["calls"] > 0 and lib["out_of_order"] == []  # the executor runs layers in model order
    not_called = {a["layers"][i]["name"] for i in lib["missing"]}
    algos = {x["name"]: x for x in lib["algorithms"]}
    # Q3: every conv torch sent to oneDNN, with the implementation it used next to the fastest benchmarked
    assert set(algos) == convs - not_called
    assert len(algos) > len(convs) / 2  # torch runs only small batch-1 3x3 convs with its own kernels
    if model == "lenet":
        assert set(algos) == convs
    log = (workdir / f"torch-{model}" / "onednn.log").read_text()
    # a layer every result of which the speed-of-light check flagged impossible (the peaks of a
    # loaded machine can be that low) has no fastest variant: only then
    keys = {la["name"]: la["key"] for la in a["layers"]}
    flagged = {f["layer_key"] for f in (a["speed_of_light"] or {}).get("impossible", [])}
    for x in algos.values():
        assert f",convolution,{x['used']}," in log  # the implementation torch's oneDNN reported
        assert (x["best"] and x["best_ms"] > 0) or (x["best"] is None and keys[x["name"]] in flagged), x
    conv_times = [float(line.split(",")[-1]) for line in log.splitlines()
                  if ",exec," in line and ",convolution," in line]
    lo, hi = min(conv_times) - JSON_MS["abs"], max(conv_times) + JSON_MS["abs"]  # the JSON's 6-decimal rounding
    assert all(lo <= x["framework_ms"] <= hi for x in algos.values())  # the log's own times
    if lib["framework_version"] == lib["benchmark_version"]:
        assert any(x["used_ms"] is not None for x in algos.values())  # torch's choice is in the database
    else:  # torch 2.13's oneDNN 3.12 vs Debian's 2.6: implementation names do not compare
        assert lib["framework_version"] and lib["benchmark_version"]
        assert all(x["used_ms"] is None and not x["suboptimal"] for x in algos.values())
        assert any("do not compare across versions" in n for n in a["notes"])


@pytest.mark.parametrize("model", MODELS)
def test_bounds_equal_the_database(workdir, model):
    """Real oneDNN measurements: the bounds equal an independent SQL query and a DP over the ONNX edges."""
    from tests.analysis.test_bounds_e2e import best_by_key, floored, longest_path, node_keys

    (a,) = json.loads(benanza("analyze", f"models/{model}.onnx", "--system", "ci-cpu", "--db", "perf.db",
                              "--json", cwd=workdir))["analyses"]
    keys = node_keys(workdir / "bench", model, "f32")
    # a result the analysis found faster than the machine's peaks allow is kept out of the bound
    flagged = [f["variant"] for f in (a["speed_of_light"] or {}).get("impossible", [])]
    best = best_by_key(workdir / "perf.db", "ci-cpu", "f32", exclude=flagged)
    weight = {name: best.get(key, 0.0) for name, key in keys.items()}
    assert not a["bounds"]["partial"]
    assert a["bounds"]["sequential_ms"] == pytest.approx(sum(weight.values()), **JSON_MS)
    assert a["bounds"]["parallel_ms"] == pytest.approx(
        floored(a, longest_path(workdir / "models" / f"{model}.onnx", weight)), **JSON_MS)
