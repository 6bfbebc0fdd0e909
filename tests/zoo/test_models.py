"""Tests of the reference model zoo (benanza.zoo): the paper's 30 models (Table I).

Every model is built once per session (in memory; ~20 s for all 30) and checked for its layer
count, MACs, validity (onnx.checker full_check), a symbolic batch input and batch-agnostic
Reshapes.  A few small models are also run in onnxruntime.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re

import numpy as np
import onnx
import pytest

from benanza import zoo
from benanza.errors import UsageError
from benanza.model_stats import model_stats
from benanza.processor import load_model

# Table I of the paper, transcribed independently of the registry: id -> (MACs, layers).
TABLE_I = {
    1: (12.08e9, 412), 2: (656e6, 24), 3: (721e6, 24), 4: (1.59e9, 143), 5: (718e6, 23),
    6: (2.87e9, 910), 7: (34.94e9, 355), 8: (877e6, 52), 9: (1.44e9, 144), 10: (2.03e9, 509),
    11: (796e3, 12), 12: (437e6, 155), 13: (1.82e9, 69), 14: (1.82e9, 69), 15: (3.67e9, 125),
    16: (3.67e9, 125), 17: (3.87e9, 175), 18: (4.10e9, 174), 19: (7.58e9, 345),
    20: (7.81e9, 344), 21: (11.30e9, 515), 22: (11.53e9, 514), 23: (127e6, 203),
    24: (352e6, 66), 25: (3.13e9, 32), 26: (15.38e9, 54), 27: (15.38e9, 41), 28: (19.55e9, 63),
    29: (19.55e9, 47), 30: (1.48e9, 22),
}

ORT_MODELS = ["lenet", "squeezenet-v1.1", "mobilenet-v2", "inception-v1", "resnet18-v1"]
NAMES = [m.name for m in zoo.MODELS]


def _inspect(model: onnx.ModelProto) -> dict:
    g = model.graph
    init = {t.name: t for t in g.initializer}
    consts = set(init) | {o for n in g.node if n.op_type == "Constant" for o in n.output}
    try:
        onnx.checker.check_model(model, full_check=True)
        checker_error = None
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        checker_error = f"{type(e).__name__}: {e}"
    bad_reshapes = []
    for n in g.node:
        if n.op_type == "Reshape" and n.input[0] not in consts:
            target = onnx.numpy_helper.to_array(init[n.input[1]])
            if target[0] not in (0, -1):
                bad_reshapes.append((n.name, target.tolist()))
    inputs = [i for i in g.input if i.name not in init]
    return {
        # counted by the project's own processor, as `benanza generate` reports them
        "summary": model_stats(load_model(model, name=g.name)),
        "checker_error": checker_error,
        "inputs": [(i.name, i.type.tensor_type.elem_type,
                    [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim])
                   for i in inputs],
        "bad_reshapes": bad_reshapes,
        "opsets": [(o.domain, o.version) for o in model.opset_import],
        "ir_version": model.ir_version,
        "float_types": {t.data_type for t in g.initializer if t.data_type not in
                        (onnx.TensorProto.INT64,)},
        "n_outputs": len(g.output),
    }


@pytest.fixture(scope="session")
def reports() -> dict[str, dict]:
    out = {}
    for m in zoo.MODELS:
        model = m.build()
        out[m.name] = _inspect(model)
        del model
    return out


# ----------------------------------------------------------------------------- registry
def test_registry_order_and_fields():
    assert [m.id for m in zoo.MODELS] == list(range(1, 31))
    assert len(set(NAMES)) == 30
    for m in zoo.MODELS:
        assert re.fullmatch(r"[a-z0-9]+(?:[-.][a-z0-9]+)*", m.name), m.name
        assert (m.paper_macs, m.paper_layers) == TABLE_I[m.id], m.name
        assert m.task in {"IC", "OD", "FR", "ER", "SS", "HR"}
        assert isinstance(m.paper_macs, float) and isinstance(m.paper_layers, int)
        assert callable(m.build)
    for expected in ["resnet50-v1", "bvlc-googlenet", "inception-v1", "densenet-121", "lenet"]:
        assert expected in NAMES
    with pytest.raises(dataclasses.FrozenInstanceError):
        zoo.MODELS[0].id = 5


def test_get_lookup():
    assert zoo.get("ResNet50-v1.onnx").id == 17
    with pytest.raises(UsageError, match="unknown zoo model 'resnet51-v1'; known: "):
        zoo.get("resnet51-v1")


def test_deviations_are_documented():
    for m in zoo.MODELS:
        if m.expected_layers != m.paper_layers:
            assert len(m.layers_note) > 40, m.name
        if abs(m.expected_macs - m.paper_macs) / m.paper_macs > 0.05:
            assert len(m.macs_note) > 40, m.name
    # the documented deviations, no more
    assert {m.name for m in zoo.MODELS if m.expected_layers != m.paper_layers} == {"inception-v1"}
    assert {m.name for m in zoo.MODELS if m.macs_note} == {"mobilenet-v2", "duc"}


# ----------------------------------------------------------------------------- per model
@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_layer_count(reports, name):
    m = zoo.get(name)
    assert reports[name]["summary"].layers == m.expected_layers
    assert abs(m.expected_layers - m.paper_layers) <= 1


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_macs(reports, name):
    m = zoo.get(name)
    macs = reports[name]["summary"].macs
    assert abs(macs - m.expected_macs) / m.expected_macs < 0.05, (macs, m.expected_macs)
    if not m.macs_note:
        assert abs(macs - m.paper_macs) / m.paper_macs < 0.05, (macs, m.paper_macs)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_valid_onnx(reports, name):
    r = reports[name]
    assert r["checker_error"] is None, r["checker_error"]
    assert r["opsets"] == [("", zoo.OPSET)]
    assert r["ir_version"] == zoo.IR_VERSION
    assert r["float_types"] <= {onnx.TensorProto.FLOAT}
    assert r["n_outputs"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_single_input_with_symbolic_batch(reports, name):
    ((_, elem, dims),) = reports[name]["inputs"]
    assert elem == onnx.TensorProto.FLOAT
    assert dims[0] == "N"
    assert tuple(dims[1:]) == zoo.get(name).input_shape


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_reshapes_are_batch_agnostic(reports, name):
    assert reports[name]["bad_reshapes"] == []


@pytest.mark.slow
def test_resnet_v1_total_layers(reports):
    v1 = [m.name for m in zoo.MODELS if re.fullmatch(r"resnet\d+-v1", m.name)]
    assert len(v1) == 5
    assert sum(reports[n]["summary"].layers for n in v1) == 1229


@pytest.mark.slow
def test_structure_highlights(reports):
    s = {n: r["summary"] for n, r in reports.items()}
    ops = {n: dict(r.ops) for n, r in s.items()}
    # Inception-v2: 27% of the layers are Unsqueeze (paper, Section II)
    assert round(100 * ops["inception-v2"]["Unsqueeze"] / s["inception-v2"].layers) == 27
    # Caffe models keep LRN and Dropout; Gluon ResNets have no Conv bias but BN
    assert ops["bvlc-alexnet"]["LRN"] == 2 and ops["bvlc-alexnet"]["Dropout"] == 2
    assert ops["resnet50-v1"]["BatchNormalization"] == 53
    assert ops["arcface"]["PRelu"] == 50
    assert ops["tiny-yolo-v2"]["LeakyRelu"] == 8
    assert ops["duc"]["Sum"] == 34


# ----------------------------------------------------------------------------- runtime
@pytest.mark.slow
@pytest.mark.parametrize("name", ORT_MODELS)
def test_runs_in_onnxruntime(name):
    ort = pytest.importorskip("onnxruntime")
    m = zoo.get(name)
    sess = ort.InferenceSession(m.build().SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((1, *m.input_shape), dtype=np.float32)
    (y,) = sess.run(None, {sess.get_inputs()[0].name: x})
    assert y.shape[0] == 1
    assert np.isfinite(y).all()


def test_batch_override_runs():
    ort = pytest.importorskip("onnxruntime")
    m = zoo.get("squeezenet-v1.1")
    sess = ort.InferenceSession(m.build().SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((3, *m.input_shape), dtype=np.float32)
    (y,) = sess.run(None, {sess.get_inputs()[0].name: x})
    assert y.shape == (3, 1000)


# ----------------------------------------------------------------------------- build_all
def test_deterministic_bytes():
    a = zoo.get("lenet").build().SerializeToString()
    b = zoo.get("lenet").build().SerializeToString()
    assert a == b


def test_build_all_writes_files(tmp_path):
    seen = []
    paths = zoo.build_all(tmp_path, names=["lenet", "shufflenet"], progress=seen.append)
    assert seen == ["lenet", "shufflenet"]
    assert [p.name for p in paths] == ["lenet.onnx", "shufflenet.onnx"]
    assert not list(tmp_path.glob("*.tmp"))
    first = [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]
    loaded = onnx.load(str(paths[0]))
    assert len(loaded.graph.node) == 12
    # same bytes on a second run
    again = zoo.build_all(tmp_path / "again", names=["lenet", "shufflenet"])
    assert [hashlib.sha256(p.read_bytes()).hexdigest() for p in again] == first


def test_build_all_rejects_unknown_names(tmp_path):
    with pytest.raises(UsageError, match="unknown zoo model 'no-such-model'"):
        zoo.build_all(tmp_path, names=["lenet", "no-such-model"])
    assert not list(tmp_path.iterdir())  # validated before building anything
