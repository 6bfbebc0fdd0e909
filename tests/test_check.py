"""benanza check: what the oneDNN benchmarks compute, against ONNX Runtime running the real layers
(and fusion patterns) of real exporter output on the same generated inputs."""

import dataclasses
import re
import shlex

import numpy as np
import pytest
from click.testing import CliRunner
from helpers import generate_bench
from torch_models import export

from benanza.backends.base import build
from benanza.check import CheckOptions, CheckStatus, check, generated
from benanza.cli import main
from benanza.generator import GenOptions
from benanza.layers import UniqueLayer, unique_layers
from benanza.problems import CopyProblem
from benanza.processor import load_model
from tests.backends.test_onednn import small_cnn
from tests.e2e.test_transformers import attention_model, attention_op_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """The encoder, GPT block and ViT at opsets 14 and 17, the attention pattern and the opset-23
    Attention op, and a small CNN (conv fusions, pools, LRN, BN, Gemm): every oneDNN family, plus
    one wrong layer (``wrong_split``), built once for the module (-j1)."""
    import onnx

    d = tmp_path_factory.mktemp("check")
    paths = [export(n, o, d) for n in ("encoder", "gpt", "vit") for o in (14, 17)]
    for name, m in (("attention", attention_model()), ("attention_op", attention_op_model())):
        onnx.save(m, str(d / f"{name}.onnx"))
        paths.append(d / f"{name}.onnx")
    paths.append(small_cnn(d / "small.onnx"))
    models = [load_model(p) for p in paths]
    out = d / "bench"
    _, gen = generate_bench(models, "onednn", out, GenOptions(),
                            layers=unique_layers(models) + [UniqueLayer(wrong_split(models)[1])])
    build(out / "onednn", jobs=1)
    wrong = wrong_split(models)[1].problem
    return out, paths, models, [v for v in gen.variants if v.problem != wrong]


def wrong_split(models):
    """GPT's Split with its second output copied from the first one's offset, as a bug in the copy
    family's key building would generate it: (the right layer, the wrong one)."""
    gpt = next(m for m in models if m.name == "gpt14")
    split = next(n.layer for n in gpt.nodes if isinstance(n.layer.problem, CopyProblem)
                 and n.layer.problem.op == "split")
    p = split.problem
    offsets = (p.offsets[0], p.offsets[0], p.offsets[2])
    return split, dataclasses.replace(split, problem=dataclasses.replace(p, offsets=offsets))


def test_generator_matches_the_runtime_definition():
    # runtime.hpp's formula, step by step in Python integers for the first elements of two streams
    def one(seed, stream, i):
        z = (((seed * 256 + stream) << 32) + i + 0x9E3779B97F4A7C15) % 2**64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
        z ^= z >> 31
        return ((z >> 56) - 128) / 128

    for seed, stream in ((0, 0), (0, 3), (7, 1)):
        want = [one(seed, stream, i) for i in range(40)]
        assert generated(stream, (5, 8), seed).reshape(-1).tolist() == want
    x = generated(0, (4096,))
    assert x.min() >= -1 and x.max() < 1 and len(np.unique(x)) > 200  # 1/128 steps, spread over [-1, 1)
    assert not np.array_equal(generated(0, (64,)), generated(1, (64,)))  # each input its own values


def test_every_family_computes_what_its_layer_computes(bench):
    out, _, models, variants = bench
    by_name = {v.name: v for v in variants}
    results = check(out, models, CheckOptions(build_jobs=1))
    # the wrong Split is in none of the models: not checked (and said so), never passed
    stray = [r for r in results if r.name not in by_name]
    assert len(stray) == 2 and all(r.status is CheckStatus.NOT_CHECKED and "none of the given models" in r.compared
                                   for r in stray)
    results = [r for r in results if r.name in by_name]
    assert len(results) == len(variants)
    bad = [(r.name, r.status.value, r.compared, r.where) for r in results
           if r.status not in (CheckStatus.OK, CheckStatus.UNSUPPORTED)]
    assert not bad
    ok = [by_name[r.name] for r in results if r.status is CheckStatus.OK]
    # every layer and fusion ran correctly in at least one variant (a layout or dtype the CPU
    # lacks is unsupported, not wrong)
    assert {(v.problem, v.fusion) for v in ok} == {(v.problem, v.fusion) for v in variants}
    families = {v.problem.family for v in ok}
    assert {"copy", "transpose", "matmul", "attention", "lnorm", "eltwise", "reduce", "binary", "softmax", "gemm",
            "conv", "concat", "pool", "lrn"} <= families
    fusions = {v.fusion for v in ok}
    assert {"sdpa_qk_scale", "sdpa_qk_scale_mask", "sdpa_scale_mask", "mm_bias", "layernorm", "gelu_erf", "bias_relu",
            "bn_relu"} <= fusions
    # what was compared is said: the dense copies check the bytes they move, never the op's values
    for r in results:
        v = by_name[r.name]
        if r.status is CheckStatus.OK and isinstance(v.problem, CopyProblem) and v.problem.how == "dense":
            assert "does not compute" in r.compared and r.error == 0.0
        if r.status is CheckStatus.OK and "causal" in v.layer_key:
            assert "is_causal=0" in r.compared  # the causal mask is run as an additive mask


def test_a_perturbed_input_is_caught_with_a_line_that_reproduces_it(bench, monkeypatch):
    out, paths, _, variants = bench
    split = next(v for v in variants if isinstance(v.problem, CopyProblem) and v.problem.op == "split"
                 and v.dtype == "f32")
    sdpa = next(v for v in variants if v.fusion == "sdpa_qk_scale_mask" and v.dtype == "f32")
    args = ["check", *map(str, paths), "--bench-dir", str(out), "-j", "1", "--filter",
            f"^({re.escape(split.name)}|{re.escape(sdpa.name)})$"]
    for wrong in (split, sdpa):
        # the runtime's fault hook adds 0.5 to one element of the benchmark's first input
        monkeypatch.setenv("BENANZA_FAULT_PERTURB", wrong.name)
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 1, r.output
        lines = [ln for ln in r.stderr.splitlines() if ln.startswith("mismatch: ")]
        assert len(lines) == 1 and lines[0].startswith(f"mismatch: {wrong.name}: "), r.stderr
        assert "checked 2 benchmarks (seed 0): 1 ok, 1 mismatch" in r.stdout
        repro = r.stderr.split("  reproduce: ")[1].splitlines()[0]
        monkeypatch.delenv("BENANZA_FAULT_PERTURB")
        again = CliRunner().invoke(main, shlex.split(repro)[1:])  # pasted without the fault: it passes
        assert again.exit_code == 0 and "1 ok, 0 mismatch" in again.stdout, again.output


def test_a_wrong_offset_from_the_generator_is_caught(bench):
    """The wrong Split went through the real generator and build; the check compares it with
    the model's real Split node (the model given holds that node under the wrong layer)."""
    out, _, models, _ = bench
    right, wrong = wrong_split(models)
    gpt = next(m for m in models if m.name == "gpt14")
    name = f"^{re.escape(wrong.problem.text())}_f32/"
    (r,) = check(out, [_with_problem(gpt, right, wrong)], CheckOptions(filter=name, build_jobs=1))
    assert r.status is CheckStatus.MISMATCH and r.where.startswith("output 1 "), r  # read at output 0's offset
    assert r.reproduce.startswith("benanza check") and "--filter" in r.reproduce


def _with_problem(model, old, new):
    """The model with the node of layer ``old`` holding ``new`` (the same node, a wrong key)."""
    nodes = [dataclasses.replace(n, layer=new) if n.layer == old else n for n in model.nodes]
    return dataclasses.replace(model, nodes=nodes)


def test_a_crashing_benchmark_and_bad_input_are_one_line_each(bench, monkeypatch, tmp_path):
    out, paths, _, variants = bench
    first, second = [v for v in variants if v.problem.family == "softmax" and v.dtype == "f32"][:2]
    monkeypatch.setenv("BENANZA_FAULT_ABORT", first.name)
    r = CliRunner().invoke(main, ["check", *map(str, paths), "--bench-dir", str(out), "-j", "1", "--filter",
                                  f"^({re.escape(first.name)}|{re.escape(second.name)})$"])
    assert r.exit_code == 1 and "Traceback" not in r.output
    failed = [ln for ln in r.stderr.splitlines() if ln.startswith("failed: ")]
    assert failed[0].startswith(f"failed: {first.name}: the benchmark died") and len(failed) == 2
    assert "reproduce: benanza check" in r.stderr
    monkeypatch.delenv("BENANZA_FAULT_ABORT")
    r = CliRunner().invoke(main, ["check", str(paths[0]), "--bench-dir", str(tmp_path / "none")])
    assert r.exit_code != 0 and "Traceback" not in r.output and "run `benanza generate` first" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


# --- binary layers whose first operand broadcasts ------------------------------------------

def broadcast_first(path):
    """Binary layers whose first operand broadcasts into the output, as exports write them:
    ``1 − x`` with a scalar constant, the RMSNorm's ``Div(1, ·)`` with a [1] one, an attention
    mask [1, 1, 1, 4] left of Sub, Div, Greater and Less over x [1, 2, 4, 4], an Add whose full
    operand has the lower rank (commutative: its canonical order puts the broadcast one first),
    a Less whose operands both broadcast (no single oneDNN binary call computes it), and Muls
    whose operands both broadcast as an outer product: the rotary frequencies' pos [1, 4, 1] ·
    inv_freq [1, 1, 8], one with the [.., 1, N] operand first and a batch of its own [2, 1, 8],
    and one whose batch comes from the [.., M, 1] operand [3, 4, 1] (matmul's source)."""
    from helpers import io, model, tensor
    from onnx import TensorProto, helper

    n = helper.make_node
    nodes = [n("Sub", ["one", "x"], ["inv"], name="one_minus"), n("Div", ["one1", "x"], ["rcp"], name="one_over"),
             n("Sub", ["mask", "x"], ["sub"], name="sub"), n("Div", ["mask", "x"], ["div"], name="div"),
             n("Greater", ["mask", "x"], ["gt"], name="gt"), n("Less", ["mask", "x"], ["lt"], name="lt"),
             n("Add", ["row", "cols"], ["add"], name="add"), n("Less", ["row", "col"], ["both"], name="both"),
             n("Mul", ["pos", "freq"], ["outer"], name="outer"),
             n("Mul", ["freqs", "pos"], ["outer_wb"], name="outer_weights_batched"),
             n("Mul", ["poss", "freq"], ["outer_sb"], name="outer_source_batched")]
    inputs = [io("x", [1, 2, 4, 4]), io("mask", [1, 1, 1, 4]), io("row", [1, 1, 4]), io("cols", [4, 4]),
              io("col", [4, 1]), io("pos", [1, 4, 1]), io("freq", [1, 1, 8]), io("freqs", [2, 1, 8]),
              io("poss", [3, 4, 1])]
    outputs = [io(o, [1, 2, 4, 4]) for o in ("inv", "rcp", "sub", "div")]
    outputs += [io(o, [1, 2, 4, 4], TensorProto.BOOL) for o in ("gt", "lt")]
    outputs += [io("add", [1, 4, 4]), io("both", [1, 4, 4], TensorProto.BOOL)]
    outputs += [io("outer", [1, 4, 8]), io("outer_wb", [2, 4, 8]), io("outer_sb", [3, 4, 8])]
    import onnx

    onnx.save(model(nodes, inputs, outputs, [tensor("one", (), 1.0), tensor("one1", (1,), 1.0)]), str(path))
    return path


def test_a_broadcast_first_operand_runs_swapped_and_computes_the_layer(tmp_path):
    """oneDNN's binary primitive broadcasts only its second source: the generator swaps the
    operands and the runtime mirrors the operation (−(b − a), (b / a)^−1, a flipped comparison);
    an outer-product Mul runs as oneDNN's matmul with K = 1, its key the binary layer's.
    Generate → run → database → analyze, and `benanza check` against ONNX Runtime running the
    model's node on the same inputs for every one of them; the layer neither helps is stored
    unsupported, with why."""
    import json
    import sqlite3

    from tests.analysis.test_bounds_e2e import node_keys

    path = broadcast_first(tmp_path / "bfirst.onnx")
    bench, db = tmp_path / "bench", tmp_path / "p.db"
    r = CliRunner().invoke(main, ["generate", str(path), "--out", str(bench), "--backend", "onednn"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["run", "--system", "cpu", "--bench-dir", str(bench), "--db", str(db), "--min-time",
                                  "0.01", "--repetitions", "1", "--no-peaks", "--threads", "1", "-j", "1"])
    assert r.exit_code == 0, r.output
    keys = node_keys(bench, path.stem, "f32")
    assert keys["one_minus"].startswith("binary:sub_in_in1x2x4x4") and keys["gt"].startswith("binary:gt_in1x1x1x4_")
    outer = ("outer", "outer_weights_batched", "outer_source_batched")
    assert keys["outer"] == "binary:mul_in1x1x8_in1x4x1_f32"
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT layer_key, dtype, status, message FROM results").fetchall()
        apis = dict(conn.execute("SELECT layer_key, api FROM variants WHERE dtype = 'f32'").fetchall())
    assert {n: apis[keys[n]] for n in outer} == dict.fromkeys(outer, "matmul")
    assert {apis[k] for n, k in keys.items() if n not in outer} == {"binary"}
    f32 = {k: (s, m) for k, d, s, m in rows if d == "f32"}
    assert set(f32) == set(keys.values())
    for name, key in keys.items():
        status, message = f32[key]
        if name == "both":
            assert status == "unsupported" and "broadcasts both inputs" in message, message
        else:
            assert status == "ok", (name, message)
    assert all(s in ("ok", "unsupported") for _, d, s, _ in rows if d != "f32")
    r = CliRunner().invoke(main, ["analyze", str(path), "--system", "cpu", "--db", str(db), "--json",
                                  "--allow-contended"])
    assert r.exit_code == 0, r.output
    (a,) = json.loads(r.output)["analyses"]
    status = {la["name"]: la["status"] for la in a["layers"]}
    assert status == {name: "missing" if name == "both" else "ok" for name in keys}
    r = CliRunner().invoke(main, ["check", str(path), "--bench-dir", str(bench), "--show-ok", "-j", "1"])
    assert r.exit_code == 0, r.output
    ok = {ln.split(": ")[1].split("/")[0]: ln.rpartition("(error ")[2].split()[0] for ln in r.output.splitlines()
          if ln.startswith("ok: ")}
    assert {k for n, k in keys.items() if n != "both"} <= set(ok), r.output
    assert keys["both"] not in ok and "mismatch" not in r.stderr
    # K = 1: one product per output, no sum, so the matmul's f32 result is ONNX Runtime's Mul's
    assert {ok[keys[n]] for n in outer} == {"0"}, r.output


def test_check_reads_only_the_weights_its_references_use(tmp_path):
    """A model whose weights lie in external files: `benanza check` maps each benchmark back to the
    graph without loading the weights, and runs a reference over the part of the model it needs
    (the embedding Gather's real output, for its dense copy's size, reads the table's file through
    ONNX Runtime; the folded Shape of the projection's output, which the Reshape reads, is taken
    from a stand-in of that shape, not by running the projection). The projection's weight, which
    no reference reads (its benchmark's operands are generated), is deleted from disk: every layer
    still checks ok (it failed with the file missing when check loaded the whole model)."""
    import onnx
    from helpers import io, model, tensor
    from onnx import TensorProto, helper, numpy_helper

    n = helper.make_node
    nodes = [n("Gather", ["E", "ids"], ["h"], name="embed"), n("MatMul", ["h", "W"], ["y"], name="proj"),
             n("Constant", [], ["two"], value=numpy_helper.from_array(np.array(2.0, np.float32))),
             n("Pow", ["y", "two"], ["z"], name="square"), n("Shape", ["y"], ["shape"], name="shape"),
             n("Reshape", ["z", "shape"], ["out"], name="view")]
    m = model(nodes, [io("ids", [1, 8], TensorProto.INT64)], [io("out", None)],
              [tensor("E", (1000, 64)), tensor("W", (64, 256))])
    path = tmp_path / "m.onnx"
    onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=False, size_threshold=0)
    assert {p.name: p.stat().st_size for p in tmp_path.iterdir() if p != path} == {"E": 1000 * 64 * 4,
                                                                                 "W": 64 * 256 * 4}
    (tmp_path / "W").unlink()
    bench = tmp_path / "bench"
    r = CliRunner().invoke(main, ["generate", str(path), "--out", str(bench), "--backend", "onednn", "--dtype", "f32"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["check", str(path), "--bench-dir", str(bench), "--show-ok", "-j", "1"])
    assert r.exit_code == 0, r.output
    ok = {ln.split(": ")[1].split(":")[0]: ln for ln in r.output.splitlines() if ln.startswith("ok: ")}
    assert set(ok) == {"binary", "copy", "matmul"}, r.output
    assert "Gather node 'embed' as a dense copy" in ok["copy"] and "sizes against the op's real outputs" in ok["copy"]
    assert "checked 3 benchmarks (seed 0): 3 ok, 0 mismatch" in r.output
