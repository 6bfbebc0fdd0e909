"""A framework whose f32 library calls ran with TF32 Tensor Core math allowed, against a bound of
exact f32 math: one warning, with the counts the logs hold. Real logs of PyTorch 2.11 on an H200
(tests/fixtures) in a bundle as `benanza profile` writes it; variants from the generator, results
through the database; the expected counts are grepped from the logs, not taken from the parsers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import helpers
import pytest
from click.testing import CliRunner
from onnx import helper

from benanza.cli import main
from benanza.generator import GenOptions, expand_variants, get_backend
from benanza.layers import unique_layers
from benanza.manifest import build_manifest
from benanza.parsers import latency_stats, load_profile
from benanza.parsers.bundle import model_identity, write_index
from benanza.perfdb import PerfDB
from benanza.processor import load_model
from benanza.records import Result, Status, System
from benanza.sweep import SweepRequest, run_sweep

H200 = System("h200", "cudnn", "NVIDIA H200", (("cublas", "13.1.0"), ("cudnn", "9.19.0"), ("driver", "580.0")))
TF32_MS, FMA_MS = 0.01, 0.04  # every TF32 variant, every other one (the ReLU has no TF32 variant)
EXACT_MS, TF32_BOUND_MS = 2 * FMA_MS, TF32_MS + FMA_MS  # conv + ReLU under each math
CUDNN_TF32 = "cudnn_v9_19_h200.log"  # PyTorch's default: convolutions with TF32 allowed


def conv_relu():
    """``F.relu(F.conv2d(x, w, b, stride=2, padding=3))``, the computation the H200 cuDNN log ran."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[2, 2], pads=[3, 3, 3, 3], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    return helpers.model(nodes, [helpers.io("x", [1, 3, 224, 224])], [helpers.io("y", None)],
                         [helpers.tensor("w", (64, 3, 7, 7)), helpers.tensor("b", (64,))])


def grep(log: str, text: str) -> int:
    return sum(line.count(text) for line in (helpers.FIXTURES / log).read_text().splitlines())


@pytest.fixture
def setup(save, tmp_path):
    path = save(conv_relu(), "conv.onnx")
    model = load_model(path, 1)
    variants = expand_variants(build_manifest([model], unique_layers([model])), get_backend("cudnn"),
                               GenOptions(dtypes=("f32",), math=("fma", "tf32_allowed")))
    db = PerfDB(tmp_path / "p.db")
    db.insert_results(H200, [Result(v, "h200", Status.OK, median_ms=TF32_MS if v.math == "tf32_allowed" else FMA_MS)
                             for v in variants])
    yield path, db
    db.close()


def bundle(folder: Path, model: Path, latency_ms: float, **logs: str) -> Path:
    """A `benanza profile` bundle of ``model`` holding the fixture logs (kind → fixture name)."""
    folder.mkdir()
    for name in logs.values():
        shutil.copy(helpers.FIXTURES / name, folder / name)
    write_index(folder, {"framework": "torch", "model_identity": model_identity(model, 1), "batch_size": 1,
                         "latency_ms": latency_stats([latency_ms] * 5).to_json(), "files": logs})
    return folder


def analyse(path: Path, db: PerfDB, folder: Path, math: str = "exact"):
    (a,) = run_sweep(SweepRequest(model=str(path), systems=("h200",), backend="cudnn", math=math), db,
                     load_profile([folder]))
    return a


def tf32_warnings(a) -> list[str]:
    return [w for w in a.warnings if w.startswith("the framework ran") and "TF32" in w]


def test_tf32_calls_against_an_exact_bound_are_one_warning_with_the_logs_counts(setup, tmp_path):
    path, db = setup
    tf32 = grep(CUDNN_TF32, "enable_tf32: type=bool; val=true")
    f32 = grep(CUDNN_TF32, "OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR")
    assert (tf32, f32) == (2, 2) and grep(CUDNN_TF32, "CUDNN_DATA_HALF") == 0  # every call f32
    # measured between the TF32 bound and the exact one: the framework beats the exact bound only
    folder = bundle(tmp_path / "b", path, (EXACT_MS + TF32_BOUND_MS) / 2, cudnn_log=CUDNN_TF32)
    a = analyse(path, db, folder)
    assert a.math == "exact" and a.bounds.sequential_ms == pytest.approx(EXACT_MS)
    t = a.framework_tf32
    assert t is not None and (t.calls, t.of, t.by_library) == (tf32, f32, (("cudnn", "tf32_allowed", tf32),))
    (said,) = tf32_warnings(a)
    assert said.startswith(f"the framework ran {tf32} of its {f32} f32 library calls with TF32 Tensor Core math "
                           f"allowed (cudnn {tf32} tf32_allowed): the exact-f32 bound does not bound that run")
    assert "`benanza analyze --math tf32`" in said and "`benanza generate --math fma --math tf32_allowed`" in said
    (above,) = [w for w in a.warnings if w.startswith("bound above measured")]
    assert f"the framework ran {tf32} of its {f32} f32 library calls with TF32 Tensor Core math allowed" in above

    b = analyse(path, db, folder, math="tf32")  # the bound assumes TF32 itself: nothing to say
    assert b.framework_tf32 == t and not tf32_warnings(b)
    assert b.bounds.sequential_ms == pytest.approx(TF32_BOUND_MS)
    assert not [w for w in b.warnings if w.startswith("bound above measured")]


@pytest.mark.parametrize("logs", [{"cublas_log": "cublaslt_v13_linear_h200.log"}, {"cudnn_log": "cudnn_v7.log"}],
                         ids=["cublaslt COMPUTE_32F", "cudnn 7 legacy"])
def test_a_framework_of_exact_f32_calls_gets_no_warning(setup, tmp_path, logs):
    path, db = setup
    a = analyse(path, db, bundle(tmp_path / "b", path, TF32_BOUND_MS, **logs))  # below the exact bound
    assert not tf32_warnings(a)
    assert a.framework_tf32 is not None and a.framework_tf32.calls == 0 and not a.framework_tf32.by_library
    (above,) = [w for w in a.warnings if w.startswith("bound above measured")]
    assert "TF32" not in above


def test_cublaslt_f32_calls_are_counted_from_its_trace_lines(setup, tmp_path):
    path, db = setup
    log = "cublaslt_v13_linear_h200.log"
    a = analyse(path, db, bundle(tmp_path / "b", path, 1.0, cublas_log=log))
    assert grep(log, "FAST_TF32") == 0 and grep(log, "type=R_32F") > 0
    assert a.framework_tf32 is not None and a.framework_tf32.of == grep(log, "[Trace][cublasLtMatmul]")


def test_json_and_html_carry_the_counts_and_the_warning(setup, tmp_path):
    path, db = setup
    folder = bundle(tmp_path / "b", path, 1.0, cudnn_log=CUDNN_TF32)
    tf32 = grep(CUDNN_TF32, "enable_tf32: type=bool; val=true")
    args = ["analyze", str(path), "--system", "h200", "--db", str(db.path), "--profile", str(folder), "--json"]
    r = CliRunner().invoke(main, [*args, "--report", str(tmp_path / "r.html")])
    assert r.exit_code == 0, r.output
    (a,) = json.loads(r.stdout)["analyses"]
    assert a["framework_tf32"] == {"calls": tf32, "of": tf32,
                                   "by_library": [{"library": "cudnn", "math": "tf32_allowed", "calls": tf32}]}
    (said,) = [w for w in a["warnings"] if w.startswith("the framework ran") and "TF32" in w]
    assert said in (tmp_path / "r.html").read_text()
    r = CliRunner().invoke(main, [*args, "--math", "tf32"])
    assert r.exit_code == 0, r.output
    (a,) = json.loads(r.stdout)["analyses"]
    assert a["framework_tf32"]["calls"] == tf32 and not [w for w in a["warnings"] if "TF32" in w]


def test_the_gpu_results_page_gives_no_ratio_of_an_exact_bound_to_a_tf32_run(setup, tmp_path):
    """scripts/gpu-results.py's bounds table, from `analyze --json` of bundles with the H200's
    logs: an exact row against PyTorch's TF32 run has no BR (it bounds another run), its TF32 row
    has one; an exact row against a run of exact f32 calls keeps its BR."""
    import subprocess
    import sys

    path, db = setup
    runs = {"tf32": bundle(tmp_path / "t", path, 1.0, cudnn_log=CUDNN_TF32),
            "exact": bundle(tmp_path / "e", path, 1.0, cudnn_log="cudnn_v7.log")}
    files = []
    for (run, math), name in {("tf32", "exact"): "a", ("tf32", "tf32"): "b", ("exact", "exact"): "c"}.items():
        args = ["analyze", str(path), "--system", "h200", "--db", str(db.path), "--profile", str(runs[run]),
                "--json", "--math", math]
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 0, r.output
        (tmp_path / f"{name}.json").write_text(r.stdout)
        files.append(tmp_path / f"{name}.json")
    page = tmp_path / "page.md"
    subprocess.run([sys.executable, str(helpers.REPO / "scripts" / "gpu-results.py"), "--db", str(db.path),
                    "--system", "h200", "--out", str(page), "--campaign-seconds", "1", *map(str, files)],
                   check=True, capture_output=True, env={"PYTHONPATH": str(helpers.REPO), "PATH": ""})
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in page.read_text().splitlines()
            if line.startswith("| conv | 1 |")][:3]  # the bounds table's; the what-ifs follow
    assert [r[2] for r in rows] == ["exact", "tf32", "exact"]
    assert rows[0][7:9] == ["— (TF32 run)"] * 2
    for row, bound in zip(rows[1:], [TF32_BOUND_MS, EXACT_MS]):  # measured 1.0 ms in both bundles
        assert row[4] == "1.000" and float(row[5]) == pytest.approx(bound, abs=5e-4)
        assert row[7] == f"{bound / 1.0:.2f}", row
