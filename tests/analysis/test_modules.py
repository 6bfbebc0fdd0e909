"""The module tree on real exports: a stack of three identical GPT blocks between two Linears,
exported by torch's dynamo exporter (modules in each node's metadata) and by the TorchScript
exporter (modules in ``/``-separated node names), and a hand-built CNN with neither.

The database is the pipeline's own (the generator's oneDNN variants, runner.parse_result,
PerfDB.insert_measurements) with made-up latencies (a hash of the benchmark name, as in
test_bounds_e2e); the ORT profile is ONNX Runtime's own profiler over the TorchScript export. The
oracles are the per-layer rows of the same `analyze --json` (module sums recomputed from them),
the other exporter's tree, and the framework's per-op rows (module time recomputed from them).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from click.testing import CliRunner
from helpers import conv_net
from torch import nn
from torch_models import D_MODEL, SEQ, GptBlock

from benanza import runner
from benanza.cli import main
from benanza.generator import read_variants
from benanza.perfdb import PerfDB
from benanza.records import System
from tests.analysis.test_bounds_e2e import runtime_line

SYSTEM = System("ci-cpu", "onednn", "fabricated latencies", (("onednn", "3.0"),))
BLOCKS = 3
JSON_MS = {"rel": 1e-6, "abs": 5e-6}  # analyze --json rounds ms to 6 decimals, sums add the errors


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Linear(D_MODEL, D_MODEL)
        self.layers = nn.ModuleList(GptBlock() for _ in range(BLOCKS))
        self.head = nn.Linear(D_MODEL, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.emb(x)
        for block in self.layers:
            x = block(x)
        return self.head(x)


def _export(out: Path) -> dict[str, Path]:
    torch.manual_seed(0)
    module, x = Stack().eval(), torch.randn(1, SEQ, D_MODEL)
    paths = {"dynamo": out / "stack-dynamo.onnx", "torchscript": out / "stack-ts.onnx"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(module, (x,), dynamo=True, opset_version=18, input_names=["x"],
                                    output_names=["y"], verbose=False)
        assert program is not None
        program.save(str(paths["dynamo"]))
        torch.onnx.export(module, (x,), str(paths["torchscript"]), opset_version=17, dynamo=False,
                          input_names=["x"], output_names=["y"])
    return paths


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    d = tmp_path_factory.mktemp("modules")
    models = _export(d)
    models["cnn"] = d / "cnn.onnx"
    onnx.save(conv_net(), str(models["cnn"]))
    r = CliRunner().invoke(main, ["generate", *map(str, models.values()), "--out", str(d / "bench"),
                                  "--backend", "onednn", "--dtype", "f32"])
    assert r.exit_code == 0, r.output
    variants = read_variants(d / "bench" / "onednn")
    with PerfDB(d / "perf.db") as db:
        db.insert_measurements(SYSTEM, [(runner.parse_result(v, SYSTEM.name, line), line)
                                        for v in variants for line in [runtime_line(v)]], command="test")
    return d, models, {name: _ort_profile(models[name], d / name) for name in ("torchscript", "dynamo")}


def _ort_profile(model: Path, prefix: Path) -> Path:
    so = ort.SessionOptions()
    so.enable_profiling, so.profile_file_prefix = True, str(prefix)
    sess = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).random((1, SEQ, D_MODEL)).astype(np.float32)
    for _ in range(3):
        sess.run(None, {"x": x})
    return Path(sess.end_profiling())


def analyze(d: Path, model: Path, *extra: str) -> str:
    r = CliRunner().invoke(main, ["analyze", str(model), "--system", SYSTEM.name, "--db", str(d / "perf.db"),
                                  *extra])
    assert r.exit_code == 0, r.output
    return r.stdout


def analysis(d: Path, model: Path, *extra: str) -> dict:
    (a,) = json.loads(analyze(d, model, "--json", *extra))["analyses"]
    return a


def modules(tree: dict) -> list[dict]:
    out = [tree]
    for c in tree["children"]:
        out += modules(c)
    return out


def _runs(a: dict, m: dict) -> list[tuple[str, str]]:
    """(op, key) of the module's layers that run (free views and folded shape arithmetic excluded:
    the exporters write different amounts of those)."""
    rows = a["layers"]
    return sorted((rows[i]["op"], rows[i]["key"]) for i in m["layers"]
                  if rows[i]["status"] in ("ok", "missing", "not_covered"))


@pytest.mark.slow  # exports torch models and profiles them in ONNX Runtime (the `pipeline` fixture)
def test_both_torch_exporters_give_one_tree(pipeline):
    d, models, _ = pipeline
    dyn, ts = analysis(d, models["dynamo"]), analysis(d, models["torchscript"])
    assert dyn["module_source"] == "torch exporter metadata" and ts["module_source"] == "node names"
    trees = {name: {tuple(m["path"]): m for m in modules(a["modules"])} for name, a in (("d", dyn), ("t", ts))}
    assert set(trees["d"]) == set(trees["t"])
    assert {("emb",), ("head",), ("layers.0",), ("layers.2", "layers.2.qkv")} <= set(trees["d"])
    leaves = 0
    for path, m in trees["d"].items():
        other = trees["t"][path]
        mine, theirs = _runs(dyn, m), _runs(ts, other)
        # the same ops in every module; the exporters decompose attention with different
        # transposes, so the blocks' own layers differ in keys, their submodules do not
        assert sorted(op for op, _ in mine) == sorted(op for op, _ in theirs), path
        if not m["children"] and path:
            leaves += 1
            assert mine == theirs, path
            assert m["sequential_ms"] == pytest.approx(other["sequential_ms"], **JSON_MS), path
    assert leaves == 2 + 6 * BLOCKS  # emb, head; ln1, qkv, proj, ln2, fc, out per block
    # only the dynamo exporter records classes
    assert trees["d"][("layers.1",)]["class"] == "torch_models.GptBlock" and trees["t"][("layers.1",)]["class"] is None


@pytest.mark.slow  # exports torch models and profiles them in ONNX Runtime (the `pipeline` fixture)
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_folded_blocks_sum_to_their_layers(pipeline, exporter):
    d, models, _ = pipeline
    a = analysis(d, models[exporter])
    latency = {r["index"]: r["latency_ms"] or 0.0 for r in a["layers"]}
    root = a["modules"]
    assert root["sequential_ms"] == pytest.approx(a["bounds"]["sequential_ms"], **JSON_MS)
    assert root["parallel_ms"] == pytest.approx(a["floors"]["critical_path_ms"], **JSON_MS)
    blocks = [c for c in root["children"] if c["path"][0].startswith("layers.")]
    assert [c["repeats"] for c in blocks] == [BLOCKS] * BLOCKS
    assert [c["repeat_of"] for c in blocks] == [None] + [["layers.0"]] * (BLOCKS - 1)
    for m in modules(root):
        assert m["sequential_ms"] == pytest.approx(sum(latency[i] for i in m["layers"]), **JSON_MS)
    unfolded = sum(latency[i] for c in blocks for i in c["layers"])
    assert sum(c["sequential_ms"] for c in blocks) == pytest.approx(unfolded, **JSON_MS)
    assert blocks[0]["sequential_ms"] * BLOCKS == pytest.approx(unfolded, **JSON_MS)

    text = analyze(d, models[exporter], "--limit", "8", "--depth", "1")
    each = f"{blocks[0]['sequential_ms']:.4g} each"
    assert f"layers.0–{BLOCKS - 1} ×{BLOCKS}, identical" in text and each in text
    assert "qkv" not in text.split("the 8 slowest")[0]  # depth 1 stops at the blocks
    # the slowest-layers table lists the blocks' layers once, under the first block, with their count
    table = text.split("the 8 slowest")[1].split("parallel modules")[0]
    first = [line for line in table.splitlines() if "layers.0" in line]
    assert first and all("│ 3 │" in line for line in first), table
    assert not any(f"layers.{k}" in table for k in range(1, BLOCKS)), table
    assert f"({len(a['layers'])} with repeats)" in text
    # the parallel-modules table: a fork/join inside one block is one row for all blocks (×3)
    parallel = text.split("parallel modules")[1].split("Q5 ")[0]
    counts = [int(c.split("│")[3].strip() or 1) for c in parallel.splitlines() if c.startswith("│")]
    assert sum(counts) == len(a["parallel_modules"])
    inside = [sum(1 for p in a["parallel_modules"] if {p["fork"], p["join"]} <= set(c["layers"])) for c in blocks]
    assert inside[0] and inside == [inside[0]] * BLOCKS
    assert counts.count(BLOCKS) == inside[0]
    if exporter == "dynamo":  # its node names (node_add_1) say nothing of where the fork is: the module does
        assert all(" in layers." in c.split("│")[1] or " in emb" in c.split("│")[1]
                   for c in parallel.splitlines() if c.startswith("│")), parallel


@pytest.mark.slow  # exports torch models and profiles them in ONNX Runtime (the `pipeline` fixture)
def test_module_time_from_the_ort_profile(pipeline):
    d, models, profiles = pipeline
    a = analysis(d, models["torchscript"], "--profile", str(profiles["torchscript"]))
    ops = [o for o in a["framework"]["layers"] if o["nodes"]]
    assert ops
    for m in modules(a["modules"]):
        inside = set(m["layers"])
        straddle = [o for o in ops if inside & set(o["nodes"]) and not set(o["nodes"]) <= inside]
        expected = None if straddle else sum(o["framework_ms"] for o in ops if set(o["nodes"]) <= inside)
        if expected is None:
            assert m["measured_ms"] is None, m["path"]
        else:
            assert m["measured_ms"] == pytest.approx(expected, rel=1e-5, abs=1e-5), m["path"]
            assert m["ratio"] == (pytest.approx(m["sequential_ms"] / m["measured_ms"], rel=1e-3)
                                  if m["measured_ms"] else None)
    root = a["modules"]
    assert root["measured_ms"] == pytest.approx(a["framework"]["op_ms"] - a["framework"]["inserted_ms"], rel=1e-4)
    assert any(m["measured_ms"] for m in modules(root) if len(m["path"]) == 2)


@pytest.mark.slow  # exports torch models and profiles them in ONNX Runtime (the `pipeline` fixture)
def test_model_without_module_records_groups_by_op_type(pipeline, tmp_path):
    d, models, _ = pipeline
    a = analysis(d, models["cnn"], "--report", str(tmp_path / "r.html"))
    assert a["module_source"] == "op types"
    rows = a["layers"]
    by_op: dict[str, list[int]] = {}
    for r in rows:
        by_op.setdefault(r["op"], []).append(r["index"])
    kids = a["modules"]["children"]
    assert {c["name"]: c["layers"] for c in kids} == by_op
    assert sum(c["sequential_ms"] for c in kids) == pytest.approx(a["bounds"]["sequential_ms"], **JSON_MS)
    text = analyze(d, models["cnn"])
    assert "modules (from op types" in text and "Conv" in text
    html = (tmp_path / "r.html").read_text()
    assert "class='icicle'" in html and "http" not in html.split("<body>")[1].replace("http://www.w3.org/2000/svg", "")


@pytest.mark.slow  # exports torch models and profiles them in ONNX Runtime (the `pipeline` fixture)
def test_advice_names_the_module(pipeline):
    """The dynamo exporter's node names (``node_view_1``) say nothing of where a layer is: per-layer
    advice adds its module."""
    d, models, profiles = pipeline
    a = analysis(d, models["dynamo"], "--profile", str(profiles["dynamo"]))
    (line,) = [e for e in a["framework"]["explanations"] if "never ran as separate ops" in e]
    listed = line.split(": ", 1)[1].split(", ")
    assert listed and all(" in " in x for x in listed), line
    name, module = listed[0].split(" in ")
    (row,) = [r for r in a["layers"] if r["name"] == name]
    assert module in {m["name"] for m in modules(a["modules"]) if row["index"] in m["layers"]}


class _Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(), nn.Sequential(nn.Conv2d(4, 4, 1)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + x)


class _Nested(nn.Module):
    """Sequentials in Sequentials: TorchScript names their scopes ``blocks/blocks.0/body/body.2/body.2.0``."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.blocks = nn.Conv2d(3, 4, 3, padding=1), nn.Sequential(_Residual(), _Residual())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.stem(x))


def _tree_of(path: Path):
    from benanza.analysis.bounds import layer_rows
    from benanza.analysis.modules import module_tree
    from benanza.processor import load_model

    model = load_model(path)
    return model, module_tree(model, layer_rows(model, {}, "onednn", "f32"), model.dag())


def _paths(m) -> set[tuple[str, ...]]:
    return {m.path}.union(*(_paths(c) for c in m.children))


@pytest.mark.slow  # exports a torch model with both exporters
def test_nested_containers_qualify_alike(tmp_path):
    torch.manual_seed(0)
    module, x = _Nested().eval(), torch.randn(1, 3, 8, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (x,), dynamo=True, opset_version=18, verbose=False).save(str(tmp_path / "d.onnx"))
        torch.onnx.export(module, (x,), str(tmp_path / "t.onnx"), opset_version=17, dynamo=False)
    (_, dyn), (_, ts) = _tree_of(tmp_path / "d.onnx"), _tree_of(tmp_path / "t.onnx")
    assert _paths(dyn) == _paths(ts)
    assert ("blocks", "blocks.1", "blocks.1.body", "blocks.1.body.2", "blocks.1.body.2.0") in _paths(ts)
    (blocks,) = [c for c in ts.children if c.name == "blocks"]
    from benanza.analysis.modules import fold

    assert [f.label for f in fold(blocks.children)] == ["blocks.0–1 ×2"]


def test_local_function_calls_are_modules(tmp_path):
    """``export_modules_as_functions``: each call of the block's function is one module (the processor
    keeps a call as one layer), named by the call node when no other record exists."""
    torch.manual_seed(0)
    module, x = Stack().eval(), torch.randn(1, SEQ, D_MODEL)
    path = tmp_path / "f.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (x,), str(path), opset_version=17, dynamo=False,
                          export_modules_as_functions={GptBlock})
    proto = onnx.load(str(path))
    calls = [n for n in proto.graph.node if n.op_type == "GptBlock"]
    assert len(calls) == BLOCKS and proto.functions
    for k, n in enumerate(calls):
        n.name = f"call{k}"  # no "/" scopes left: the function calls are the only record
    for n in proto.graph.node:
        n.name = n.name.replace("/", "_")
    onnx.save(proto, str(path))
    model, tree = _tree_of(path)
    assert model.scope_source == "local functions"
    blocks = [c for c in tree.children if c.kind == "torch_models.GptBlock"]
    assert [c.name for c in blocks] == [f"call{k}" for k in range(BLOCKS)]
    assert all(len(c.layers) == 1 for c in blocks)  # the Linears around them stay in the model
    from benanza.analysis.modules import fold

    assert [f.label for f in fold(tree.children)] == [f"call0–{BLOCKS - 1} ×{BLOCKS}"]
