"""The in-model side of benchmarks/fidelity_torch.py's fidelity, on a real torch profile.

Each layer's per-run times (its ``record_function`` range) average to the time the analysis's
trace matching gives its op; the time of the aten ops inside each range is recomputed as the
length of the union of the operator intervals that fall in it, a different reading of the same
raw Chrome trace (nested operators lie inside their caller, so the union counts each once).
Each layer's oneDNN time in the model (LeNet, whose convolutions torch sends to oneDNN at one
thread) is recomputed from the raw verbose lines of the profile, by the dims the lines name."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import invoke
from torch_models import export

from benanza.analysis.matching import align_calls, match_trace
from benanza.parsers import load_profile
from benanza.processor import load_model
from benanza.zoo import build_all

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from fidelity_common import fidelity, op_samples_ms, repeatability  # noqa: E402
from fidelity_torch import aten_samples_ms, onednn_samples_ms  # noqa: E402

RUNS = 6


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("fidelity")
    model = export("encoder", 17, out)
    prof = out / "prof"
    invoke("profile", str(model), "--framework", "torch", "--threads", "1", "--iterations", "3",
           "--trace-iterations", str(RUNS), "--out", str(prof))
    return model, prof


def _union_us(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


@pytest.mark.slow  # a torch export and a torch profile
def test_a_layers_range_times_average_to_the_analysis_time_of_its_op(profiled):
    model, prof = profiled
    bundle = load_profile([str(prof)])
    assert bundle is not None and bundle.trace is not None
    samples = op_samples_ms(bundle.trace, 1)
    groups = [g for g in match_trace(load_model(model), bundle.trace).groups if g.nodes]
    assert groups
    for g in groups:
        assert len(samples[g.name]) == RUNS - 1, g.name
        assert float(np.mean(samples[g.name])) == pytest.approx(g.time_ms, rel=1e-9), g.name


@pytest.mark.slow  # a torch export and a torch profile
def test_a_layers_aten_time_is_the_union_of_the_operators_in_its_range(profiled):
    _, prof = profiled
    events = [e for e in json.loads((prof / "torch_trace.json").read_text())["traceEvents"] if e.get("ph") == "X"]
    runs = sorted(e["ts"] for e in events if e.get("cat") == "user_annotation" and e["name"] == "benanza_run")
    ops = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "cpu_op"]
    want: dict[str, list[float]] = {}
    for r in events:
        if r.get("cat") == "user_annotation" and r["name"] != "benanza_run" and r["ts"] >= runs[1]:
            end = r["ts"] + r["dur"]
            want.setdefault(r["name"], []).append(
                _union_us([(a, min(b, end)) for a, b in ops if r["ts"] <= a <= end]) / 1e3)
    got = aten_samples_ms(prof / "torch_trace.json", 1)
    assert set(got) == set(want) and want
    for name, times in want.items():
        assert got[name] == pytest.approx(times, rel=1e-9, abs=1e-9), name
        assert all(0 < t for t in times), name  # every layer called an aten op


@pytest.fixture(scope="module")
def lenet_profiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("fidelity-onednn")
    (model,) = build_all(out, names=["lenet"])
    prof = out / "prof"
    invoke("profile", str(model), "--framework", "torch", "--threads", "1", "--iterations", "3",
           "--trace-iterations", str(RUNS), "--out", str(prof))
    return model, prof


def _conv_lines(model: Path) -> dict[str, tuple[str, set[str]]]:
    """Per Conv node of the ONNX graph, the problem its oneDNN convolution line starts with and
    the dims (``1x8x28x28``) of its input, weights and output, which its reorder lines name."""
    graph = onnx.shape_inference.infer_shapes(onnx.load(model)).graph
    # a dim without a value is the graph's symbolic batch: the profile ran batch 1
    shapes = {v.name: [d.dim_value or 1 for d in v.type.tensor_type.shape.dim]
              for v in [*graph.input, *graph.value_info, *graph.output]}
    shapes.update({t.name: list(t.dims) for t in graph.initializer})
    out = {}
    for n in graph.node:
        if n.op_type == "Conv":
            x, w, y = shapes[n.input[0]], shapes[n.input[1]], shapes[n.output[0]]
            out[n.name] = (f"mb{x[0]}_ic{x[1]}oc{w[0]}_ih{x[2]}", {"x".join(map(str, s)) for s in (x, w, y)})
    return out


@pytest.mark.slow  # a torch profile
def test_a_layers_onednn_time_in_the_model_is_its_calls_in_the_raw_verbose_log(lenet_profiled):
    model, prof = lenet_profiled
    # the oracle: the raw log's exec lines, one run after the other, each run the same calls
    lines = [ln.split(",") for ln in (prof / "onednn.log").read_text().splitlines() if ",exec," in ln]
    assert lines and len(lines) % RUNS == 0
    per_run = len(lines) // RUNS
    runs = [lines[r * per_run:(r + 1) * per_run] for r in range(RUNS)]
    assert all([(f[f.index("exec") + 2], f[-2]) for f in run] == [(f[f.index("exec") + 2], f[-2]) for f in runs[0]]
               for run in runs)
    convs = _conv_lines(model)
    want: dict[str, list[float]] = {name: [] for name in convs}
    for run in runs[1:]:  # the first is the trace's warm-up run
        for name in want:
            want[name].append(0.0)
        for f in run:
            owners = [name for name, (problem, dims) in convs.items()
                      if (f[-2].startswith(problem) if f[f.index("exec") + 2] == "convolution" else f[-2] in dims)]
            assert len(owners) == 1, f  # every line names the dims of one conv alone
            want[owners[0]][-1] += float(f[-1])
    bundle = load_profile([str(prof)])
    assert bundle is not None
    calls = bundle.library_calls["onednn"]
    loaded = load_model(model)
    got = onednn_samples_ms(loaded, align_calls(loaded, calls, "torch", "onednn"), calls, 1)
    assert set(got) == set(want)
    for name, times in want.items():
        assert got[name] == pytest.approx(times, rel=1e-9), name


def test_fidelity_on_a_clock_of_whole_steps_counts_a_pair_one_step_apart(tmp_path):
    """ORT's profiler records whole microseconds: a 3 µs op read as 2 µs is 33 % off on that
    clock alone. The share within ±10 % or one step holds the pairs one step apart, never two."""
    pairs = [{"isolated_ms": i, "in_model_ms": m} for i, m in
             ((0.002, 0.003), (0.004, 0.002), (0.0105, 0.010), (0.012, 0.010), (0.003, 0.003))]
    f = fidelity(pairs, tmp_path / "pairs.json", step_ms=0.001)
    assert (f["ops"], f["within_10pct"], f["within_10pct_or_step"]) == (5, 0.4, 0.6)
    # the two within ±10 % take 10 + 3 of the 28 µs the five take in the model
    assert f["within_10pct_of_time"] == round(13 / 28, 3)
    assert "within_10pct_or_step" not in fidelity(pairs, tmp_path / "pairs.json")
    assert json.loads((tmp_path / "pairs.json").read_text()) == pairs


def test_fidelity_at_equal_speed_keeps_the_pairs_whose_sides_read_one_machine_speed(tmp_path):
    """A pair's ``speed_ratio`` (the profile's reading of the machine over its benchmark's) within
    the readings' own spread (±15 % core, ±30 % memory): its two sides ran at one speed. Of the
    three such pairs here, two are within ±10 %; the pair read on a 1.3× slower core and the one
    without readings are left out."""
    pairs = [{"isolated_ms": 1.0, "in_model_ms": 1.05, "speed_ratio": [1.02, 0.97]},
             {"isolated_ms": 1.0, "in_model_ms": 1.3, "speed_ratio": [1.3, 1.0]},
             {"isolated_ms": 1.0, "in_model_ms": 1.2, "speed_ratio": [0.9, 1.25]},
             {"isolated_ms": 2.0, "in_model_ms": 2.1, "speed_ratio": [1.0, 1.0]},
             {"isolated_ms": 1.0, "in_model_ms": 1.0}]
    f = fidelity(pairs, tmp_path / "pairs.json")
    assert f["equal_speed"] == {"ops": 3, "within_10pct": round(2 / 3, 3)}
    assert "equal_speed" not in fidelity(pairs[4:], tmp_path / "pairs.json")


def test_repeatability_compares_two_runs_kept_pairs_op_by_op(tmp_path):
    """Two runs' pairs as the scripts keep them (fidelity() writes them): the ops both compared,
    matched by name whatever their order; each side's share that repeats within ±10 %, by count
    and by the first run's in-model time; the ops whose verdict flips."""
    first = [{"op": "conv", "isolated_ms": 1.00, "in_model_ms": 1.00},   # both sides repeat
             {"op": "lrn", "isolated_ms": 14.7, "in_model_ms": 15.1},    # isolated 19 % slower next time
             {"op": "concat", "isolated_ms": 0.023, "in_model_ms": 0.057},  # in-model 19 % faster
             {"op": "gone", "isolated_ms": 0.5, "in_model_ms": 0.5}]     # not in the second run
    second = [{"op": "concat", "isolated_ms": 0.021, "in_model_ms": 0.046},
              {"op": "lrn", "isolated_ms": 17.5, "in_model_ms": 14.8},
              {"op": "conv", "isolated_ms": 1.05, "in_model_ms": 0.98}]
    runs = []
    for name, pairs in (("a", first), ("b", second)):
        fidelity(pairs, tmp_path / f"{name}.json")
        runs.append(json.loads((tmp_path / f"{name}.json").read_text()))
    r = repeatability(*runs)
    total = 1.00 + 15.1 + 0.057
    assert r["ops"] == 3
    assert r["isolated"] == {"within_10pct": round(2 / 3, 3), "within_10pct_of_time": round((1.00 + 0.057) / total, 3)}
    assert r["in_model"] == {"within_10pct": round(2 / 3, 3), "within_10pct_of_time": round((1.00 + 15.1) / total, 3)}
    assert r["verdict_changes"] == 1  # the LRN: 0.97 of its in-model time, then 1.18
    assert repeatability(first, []) == {"ops": 0}


def test_fidelity_repeat_names_a_file_that_holds_no_pairs_in_one_line(tmp_path):
    import subprocess

    bad = tmp_path / "summary.json"
    bad.write_text(json.dumps({"ops": 3}))  # a row's fidelity object, not its kept pairs
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "fidelity_repeat.py"
    out = subprocess.run([sys.executable, str(script), str(bad), str(bad)], capture_output=True, text=True,
                         cwd=script.parent)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        f"fidelity_repeat: {bad}: not a fidelity pairs file (a list of objects with op, isolated_ms and in_model_ms, "
        "as fidelity_onnxruntime.py and fidelity_torch.py keep them)"]
