"""`benanza analyze --phase`: the prefill and decode bounds of the tiny Llama-style decoder
(tests/llm_models.py) exported in the test with symbolic sequence and KV-cache axes. Generator →
oneDNN runner → database → analyzer, the phases' bounds recomputed from the database's SQL at the
shapes the test gives each phase itself, tokens/s = new tokens / bound, the per-layer byte split
against the ONNX file's initializers and the KV inputs' shapes, the time shares against hand-made
peaks, and the HTML's decode plot."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
from pathlib import Path

import llm_models
import onnx
import pytest
from click.testing import CliRunner
from helpers import io, model
from onnx import helper, numpy_helper

from benanza.analysis.phases import DECODE, PREFILL, Phase, graph_inputs, parse_phase, phase_shapes
from benanza.cli import main
from benanza.errors import ModelError, UsageError
from benanza.model_inputs import parse_input_shapes

# the phases of the end-to-end test: (label, new tokens S, KV length L)
PHASES = (("prefill:4", 4, 0), ("decode:8", 1, 8), ("decode:32", 1, 32))
KV = [n for n in llm_models.input_names() if n.startswith("past_")]


def shapes_of(seq: int, past: int) -> dict[str, tuple[int, ...]]:
    """The inputs of one step as tests/llm_models.example builds them."""
    return {"ids": (1, seq), "pos": (1, seq), "mask": (1, 1, seq, past + seq),
            **{n: (1, llm_models.KV_HEADS, past, llm_models.HEAD_DIM) for n in KV}}


@pytest.fixture(scope="module")
def dynamic(tmp_path_factory) -> Path:
    return llm_models.export(tmp_path_factory.mktemp("dyn"), dynamic=True)


# --- the phase spec and the shapes it gives ---------------------------------------------------


@pytest.mark.parametrize("spec", ["decode", "decode:", "prefill:0", "decode:-1", "chat:4", "prefill:4x", "decode:1.5"])
def test_bad_phase_spec_is_one_usage_error(spec):
    with pytest.raises(UsageError, match=re.escape(f"--phase {spec!r}")):
        parse_phase(spec)


def test_phases_set_the_exported_axes(dynamic):
    inputs = graph_inputs(onnx.load(str(dynamic), load_external_data=False).graph)
    for label, seq, past in PHASES:
        applied = phase_shapes(str(dynamic), inputs, parse_phase(label), 1, {})
        assert dict(applied.shapes) == shapes_of(seq, past), label
        assert applied.kv_inputs == frozenset(KV)
    # what the user gives keeps its shape
    given = {"mask": (1, 1, 1, 99)}
    applied = phase_shapes(str(dynamic), inputs, Phase(DECODE, 8), 1, given)
    assert dict(applied.shapes)["mask"] == (1, 1, 1, 99) and dict(applied.shapes)["ids"] == (1, 1)
    assert Phase(PREFILL, 4).new_tokens == 4 and Phase(DECODE, 8).new_tokens == 1
    # the prefill's empty cache as --input-shape writes it (the command printed to fill a miss)
    empty = {n: s for n, s in phase_shapes(str(dynamic), inputs, Phase(PREFILL, 4), 1, {}).shapes if n in KV}
    flags = [f"{n}={'x'.join(map(str, s))}" for n, s in empty.items()]
    assert parse_input_shapes(flags) == empty and all(s[2] == 0 for s in empty.values())


def test_phase_of_a_model_without_the_axes_is_one_line(tmp_path, dynamic):
    static = llm_models.export(tmp_path, seq=1, past=8)  # every axis fixed at export
    relu = tmp_path / "relu.onnx"
    onnx.save(model([helper.make_node("Relu", ["x"], ["y"])], [io("x", [1, 4])], [io("y", [1, 4])]), str(relu))
    # a sum-named mask axis (dynamo's s0 + s1) is new tokens plus cache
    sym = graph_inputs(onnx.load(str(dynamic), load_external_data=False).graph)
    inputs = [i if i.name != "mask" else type(i)(i.name, (1, 1, "seq", "past + seq"), i.dtype) for i in sym]
    assert dict(phase_shapes("m", inputs, Phase(DECODE, 5), 1, {}).shapes)["mask"] == (1, 1, 1, 6)
    cases = [(static, "decode:8", "the KV-cache inputs have a fixed length"),
             (relu, "prefill:4", "no input has a symbolic sequence axis"),
             (relu, "decode:4", "no KV-cache inputs")]
    for path, spec, problem in cases:
        with pytest.raises(ModelError, match=problem):
            phase_shapes(str(path), graph_inputs(onnx.load(str(path)).graph), parse_phase(spec), 1, {})
        r = CliRunner().invoke(main, ["analyze", str(path), "--system", "cpu", "--db", str(tmp_path / "none.db"),
                                      "--phase", spec])
        assert r.exit_code != 0 and "Traceback" not in r.output, r.output
        lines = [ln for ln in r.output.splitlines() if ln.strip()]
        assert len(lines) == 1 and problem in lines[0] and path.name in lines[0], r.output
    r = CliRunner().invoke(main, ["analyze", str(dynamic), "--system", "cpu", "--phase", "decode"])
    assert r.exit_code != 0 and r.output.count("\n") == 1 and "--phase 'decode'" in r.output, r.output


# --- end to end -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def measured(dynamic, tmp_path_factory) -> tuple[Path, dict]:
    """One copy of the export per phase, generated at that phase's shapes as given here; run
    through oneDNN into one database; hand-made peaks stored for the time shares (a loaded test
    machine's own may be too contended to judge by); then `analyze --phase` for all three."""
    from benanza.perfdb import PerfDB
    from tests.analysis.test_speed_of_light import PEAKS

    d = tmp_path_factory.mktemp("phases")
    shapes = []
    for label, seq, past in PHASES:
        copy = d / f"{label.replace(':', '_')}.onnx"
        shutil.copy(dynamic, copy)
        shapes += [f"--input-shape={copy.stem}:{n}={'x'.join(map(str, s))}" for n, s in shapes_of(seq, past).items()]
    copies = [str(d / f"{label.replace(':', '_')}.onnx") for label, _, _ in PHASES]
    r = CliRunner().invoke(main, ["generate", *copies, "--out", str(d / "bench"), "--backend", "onednn",
                                  "--dtype", "f32", "--layout", "nchw", *shapes])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["run", "--system", "cpu", "--bench-dir", str(d / "bench"), "--db", str(d / "p.db"),
                                  "--min-time", "0.01", "--repetitions", "1", "--no-peaks", "--threads", "1"])
    assert r.exit_code == 0, r.output
    with PerfDB(d / "p.db") as pdb:
        ((system, _, _),) = pdb.stacks("cpu")
        pdb.store_peaks(system, PEAKS)
    r = CliRunner().invoke(main, ["analyze", str(dynamic), "--system", "cpu", "--db", str(d / "p.db"), "--json",
                                  "--allow-contended", "--report", str(d / "r.html"),
                                  *(a for label, _, _ in PHASES for a in ("--phase", label))])
    assert r.exit_code == 0, r.output
    return d, json.loads(r.stdout)


@pytest.mark.slow  # builds and runs oneDNN benchmarks
def test_phase_bounds_are_the_database_sums(measured):
    from tests.analysis.test_bounds_e2e import JSON_MS, best_by_key, node_keys

    d, doc = measured
    analyses = doc["analyses"]
    assert [a["phase"]["label"] for a in analyses] == [label for label, _, _ in PHASES]
    with sqlite3.connect(d / "p.db") as conn:
        apis = dict(conn.execute("SELECT layer_key, api FROM variants WHERE dtype = 'f32'").fetchall())
    for a, (label, seq, past) in zip(analyses, PHASES):
        p = a["phase"]
        assert (p["new_tokens"], p["kv_length"]) == (seq, past)
        flagged = [f["variant"] for f in a["speed_of_light"]["impossible"]]
        best = best_by_key(d / "p.db", "cpu", "f32", exclude=flagged)
        keys = node_keys(d / "bench", label.replace(":", "_"), "f32")  # the copy generated at these shapes
        layers = {la["name"]: la for la in a["layers"]}
        ok = [n for n in keys if layers[n]["status"] == "ok"]
        assert ok and all(keys[n] in best for n in ok)
        assert p["sequential_ms"] == pytest.approx(sum(best[keys[n]] for n in ok), **JSON_MS)
        assert p["sequential_ms"] == a["bounds"]["sequential_ms"] and p["parallel_ms"] == a["bounds"]["parallel_ms"]
        assert max(best[keys[n]] for n in ok) <= p["parallel_ms"] + 1e-6 <= p["sequential_ms"] + 2e-6
        assert p["tokens_per_s"]["sequential"] == pytest.approx(seq / (p["sequential_ms"] / 1e3), rel=1e-5)
        assert p["tokens_per_s"]["parallel"] == pytest.approx(seq / (p["parallel_ms"] / 1e3), rel=1e-5)
        assert {la["index"] for la in p["layers"]} == {layers[n]["index"] for n in ok}
        # the RMSNorms' Div(1, ·) over [1, S, 1] (TorchScript's rsqrt) broadcasts its first operand
        # in the prefill: it runs swapped (ops/binary.py), measured in every phase
        one_over = [n for n in keys if keys[n].startswith(f"binary:div_in_in1x{seq}x1_")]
        assert len(one_over) == 2 * llm_models.LAYERS + 1 and all(layers[n]["status"] == "ok" for n in one_over)
        # the rotary frequencies' outer product pos [1, S, 1] · inv_freq [1, 1, 8] has both operands
        # broadcast in the prefill: oneDNN runs it as a matmul with K = 1 (ops/binary.py), a binary
        # Mul in a decode step, where pos is [1, 1, 1]; every covered layer has a result
        outer = [n for n in keys if keys[n].startswith(f"binary:mul_in1x1x{llm_models.HEAD_DIM // 2}_in1x{seq}x1_")]
        assert outer and all(layers[n]["status"] == "ok" for n in outer), (label, outer)
        assert {apis[keys[n]] for n in outer} == {"matmul" if seq > 1 else "binary"}
        missing = {keys[n] for n in keys if layers[n]["status"] == "missing"}
        assert not missing and not p["partial"], (label, missing)


@pytest.mark.slow  # builds and runs oneDNN benchmarks
def test_layer_shares_against_the_onnx_file_and_the_peaks(measured, dynamic):
    d, doc = measured
    graph = onnx.load(str(dynamic)).graph
    weights = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    nodes = {n.name: n for n in graph.node}
    h, inter, kvh, hd = llm_models.HIDDEN, llm_models.INTER, llm_models.KV_HEADS, llm_models.HEAD_DIM
    for a, (_, seq, past) in zip(doc["analyses"], PHASES):
        p = a["phase"]
        by_name = {la["name"]: la for la in p["layers"]}
        # the MLP's down projection reads its weight whole, and no cache
        down = by_name["/layers.0/down/MatMul"]
        (w,) = [weights[t] for t in nodes["/layers.0/down/MatMul"].input if t in weights]
        assert w.shape == (inter, h) and down["weight_bytes"] == w.nbytes
        assert down["kv_bytes"] == 0 and down["activation_bytes"] == 4 * seq * (inter + h)
        # attention's probabilities·V reads the whole present V: the cache and the new tokens' V,
        # repeated over the query heads (grouped-query attention), and no weight
        pv = by_name["/layers.0/MatMul_1"]
        assert pv["weight_bytes"] == 0
        assert pv["kv_bytes"] == 4 * llm_models.HEADS * (past + seq) * hd
        # the KV inputs' own bytes are all in the cache's column
        assert p["bytes"]["kv_cache"] >= 4 * len(KV) * kvh * past * hd
        # per layer the append of K and V, then the attention: fused, one read of the present K
        # and V; unfused, per the bound's layers, repeat_kv's Expand reads the present and writes
        # its G copies, K's Transpose reads and writes those and the MatMuls read them (1 + 4G
        # presents of K, 1 + 2G of V)
        group, token = llm_models.HEADS // kvh, 4 * kvh * hd
        layers = llm_models.LAYERS
        assert p["fused_bytes"]["kv_cache"] == _kv_closed_form(layers, token, past, seq, [2] * layers)
        assert p["bytes"]["kv_cache"] == _kv_closed_form(layers, token, past, seq, [2 + 6 * group] * layers)
        # time shares from PEAKS (test_speed_of_light): 100 GFLOP/s; 400 GB/s under 4000 bytes,
        # 200 GB/s to 1 MiB
        for la in (down, pv):
            nbytes = la["weight_bytes"] + la["kv_bytes"] + la["activation_bytes"]
            bw = 4e11 if nbytes < 4000 else 2e11
            c, m = 1e3 * la["flops"] / 1e11, 1e3 * nbytes / bw
            s = la["time_shares"]
            assert s["compute"] == pytest.approx(c / (c + m), abs=1e-4)
            assert s["weights"] == pytest.approx(m / (c + m) * la["weight_bytes"] / nbytes, abs=1e-4)
            assert s["kv_cache"] == pytest.approx(m / (c + m) * la["kv_bytes"] / nbytes, abs=1e-4)
            assert sum(s.values()) == pytest.approx(1, abs=1e-3)
        assert down["flops"] == 2 * seq * inter * h
        assert pv["flops"] == 2 * llm_models.HEADS * seq * (past + seq) * hd
        att = p["attributed_ms"]
        assert sum(att.values()) == pytest.approx(p["sequential_ms"], rel=1e-4)
    decode = [a["phase"] for a in doc["analyses"] if a["phase"]["phase"] == "decode"]
    assert decode[1]["attributed_ms"]["kv_cache"] > 0  # the cache's share grows with its length
    assert decode[1]["bytes"]["kv_cache"] > decode[0]["bytes"]["kv_cache"]
    assert decode[1]["bytes"]["weights"] == decode[0]["bytes"]["weights"]


@pytest.mark.slow  # builds and runs oneDNN benchmarks
def test_report_plots_the_decode_bound(measured):
    d, doc = measured
    html = (d / "r.html").read_text()
    assert "decode bound (ms) against KV-cache length" in html and html.count("<polyline") == 2
    decode = [a["phase"] for a in doc["analyses"] if a["phase"]["phase"] == "decode"]
    for p in decode:
        # the chart prints 4 digits of the bound, the JSON 6 decimals: compare the numbers, not
        # their texts (rounding twice may end one digit apart)
        (shown,) = re.findall(rf"decode:{p['kv_length']} on cpu: ([0-9.e+-]+) ms sequential", html)
        assert float(shown) == pytest.approx(p["sequential_ms"], rel=1e-3)
    assert html.count('<h3 class="phase">') == len(PHASES)


@pytest.mark.slow  # builds and runs oneDNN benchmarks
def test_terminal_names_the_phases(measured, dynamic):
    d, _ = measured
    r = CliRunner().invoke(main, ["analyze", str(dynamic), "--system", "cpu", "--db", str(d / "p.db"),
                                  "--allow-contended", "--limit", "3", "--phase", "decode:8"])
    assert r.exit_code == 0, r.output
    assert "phases (shares of the sequential bound" in r.output and "decode:8" in r.output
    assert "the 10 slowest layers, shares of their time" in r.output


# --- the KV cache's bytes against the config --------------------------------------------------


def _kv_closed_form(layers: int, token_bytes: int, past: int, seq: int, attention: list[int]) -> int:
    """KV-cache bytes of a step, per kernel that reads or writes the cache: per layer, K's and
    V's append (the past read, the present of ``past + seq`` tokens written) and what the layer's
    attention reads of the present, ``attention[layer]`` times the present's bytes of K and V
    together (2: a fused call reading K and V once per KV head)."""
    present = past + seq
    return token_bytes * sum(2 * (past + present) + reads * present for reads in attention[:layers])


@pytest.mark.slow  # exports transformers' Llama, builds and runs its oneDNN benchmarks
def test_fused_kv_bytes_of_a_grouped_decode_step(tmp_path):
    """transformers' Llama (4 query heads over 2 KV heads), the TorchScript exporter's decode step
    with the cache length symbolic (pack_gqa: Q's heads folded into rows over K and V
    unrepeated), `analyze --phase decode:L`: with attention fused, the KV-cache bytes are each
    kernel's reads and writes of the cache, counted from the config: per layer, K's and V's
    append (L read, L + 1 written) and the fused attention's one read of the present K and V; the
    unfused layers read K twice more (its Transpose reads and writes it, the scale's Mul reads
    the copy)."""
    import hf_models

    past, step = 12, hf_models.Step("llama", 1, 8)
    path = hf_models.export(step, "torchscript", tmp_path, dynamic=True)
    cfg = hf_models.config("llama")
    layers, kvh, hd = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
    token = 4 * kvh * hd  # one token's K (or V) of a layer, f32
    shapes = {"input_ids": (1, 1), "attention_mask": (1, past + 1), "position_ids": (1, 1),
              **{n: (1, kvh, past, hd) for n in hf_models.input_names(step) if n.startswith("past_")}}
    flags = [f"--input-shape={n}={'x'.join(map(str, s))}" for n, s in shapes.items()]
    r = CliRunner().invoke(main, ["generate", str(path), "--out", str(tmp_path / "bench"), "--backend", "onednn",
                                  "--dtype", "f32", "--layout", "nchw", *flags])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["run", "--system", "cpu", "--bench-dir", str(tmp_path / "bench"), "--db",
                                  str(tmp_path / "p.db"), "--min-time", "0.01", "--repetitions", "1", "--no-peaks",
                                  "--threads", "1"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["analyze", str(path), "--system", "cpu", "--db", str(tmp_path / "p.db"), "--json",
                                  "--allow-contended", "--phase", f"decode:{past}"])
    assert r.exit_code == 0, r.output
    (a,) = json.loads(r.stdout)["analyses"]
    p = a["phase"]
    assert not p["partial"]
    # the TorchScript export copies the first layer's past K alone once (a Concat of one input):
    # a kernel that reads and writes the cache, L tokens each way
    graph = onnx.load(str(path), load_external_data=False).graph
    alone = sum(1 for n in graph.node if n.op_type == "Concat" and len(n.input) == 1 and n.input[0].startswith("past_"))
    copies = alone * 2 * past * token
    assert p["fused_bytes"]["kv_cache"] == copies + _kv_closed_form(layers, token, past, 1, [2] * layers)
    # unfused: K's Transpose reads and writes the present K, the scale's Mul reads that copy
    assert p["bytes"]["kv_cache"] == copies + _kv_closed_form(layers, token, past, 1, [4] * layers)
    # Q5 weighs each layer's grouped attention (its fused benchmark, keyed as no node is, is
    # among the analysis's results), applied where it measured faster than its pieces
    uses = [u for u in a["fusion"]["applied"] + a["fusion"]["unprofitable"] if u["pattern"].startswith("sdpa")]
    assert len(uses) == layers, a["fusion"]
    # each weighed against its pieces, Q's fold (a view) costing 0 among them
    assert all((u in a["fusion"]["applied"]) == (u["fused_ms"] < u["unfused_ms"]) for u in uses), uses
