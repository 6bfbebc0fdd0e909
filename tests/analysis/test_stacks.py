"""An analysis reads one backend and one stack of a system, under one math mode, and says how
much of its bound rests on unstable measurements and which fusions do not pay off. Variants
come from the generator, results go through the database, bounds are recomputed with an
independent SQL query."""

from __future__ import annotations

import hashlib
import json

import helpers
import pytest
from click.testing import CliRunner

from benanza.cli import main
from benanza.errors import BenanzaError
from benanza.generator import GenOptions, expand_variants, get_backend
from benanza.layers import unique_layers
from benanza.manifest import build_manifest
from benanza.perfdb import PerfDB
from benanza.processor import load_model
from benanza.records import Result, Status, System, Variant
from benanza.sweep import SweepRequest, run_sweep

CPU = (("compiler", "c++ 12"), ("cpu", "Test CPU"), ("threads", "2"))
OLD = System("box", "onednn", "Test CPU", tuple(sorted(CPU + (("onednn", "2.6.3"),))))
NEW = System("box", "onednn", "Test CPU", tuple(sorted(CPU + (("onednn", "3.2.0"),))))
GPU = System("box", "cudnn", "Test GPU", (("cudnn", "9.1.0"), ("driver", "550.1")))


def spread(name: str) -> float:
    """A latency between 1 and 2 ms that differs per variant and is the same on every run."""
    return 1.0 + int(hashlib.sha256(name.encode()).hexdigest()[:6], 16) / 0xFFFFFF


@pytest.fixture
def setup(save, tmp_path):
    path = save(helpers.conv_net(), "convnet.onnx")
    model = load_model(path, 1)
    manifest = build_manifest([model], unique_layers([model]))
    cpu = expand_variants(manifest, get_backend("onednn"), GenOptions(dtypes=("f32",)))
    gpu = expand_variants(manifest, get_backend("cudnn"), GenOptions(dtypes=("f32",), math=("fma", "tf32_allowed")))
    db = PerfDB(tmp_path / "p.db")
    db.insert_results(OLD, [Result(v, "box", Status.OK, median_ms=50.0) for v in cpu])
    db.insert_results(NEW, [Result(v, "box", Status.OK, median_ms=spread(v.name)) for v in cpu
                            if v.fusion == "none"])
    db.insert_results(GPU, [Result(v, "box", Status.OK, median_ms=0.001 if v.math == "tf32_allowed" else 0.01)
                            for v in gpu])
    yield path, model, db
    db.close()


def oracle_sequential(db: PerfDB, model, system: System, tf32: bool = False) -> float:
    """Sum over the model's covered nodes of the fastest unfused f32 result on that stack."""
    rows = db.db.execute(
        "SELECT r.layer_key, min(r.median_ms) FROM results r JOIN variants v ON v.name = r.variant "
        "WHERE r.stack_id = ? AND v.backend = ? AND r.status = 'ok' AND v.fusion = 'none' AND v.dtype = 'f32' "
        "AND (? OR v.math != 'tf32_allowed') GROUP BY r.layer_key", (system.stack_id, system.backend, tf32)).fetchall()
    best = dict(rows)
    return sum(best.get(n.layer.key, 0.0) for n in model.nodes)


def sweep(path, db, **kw):
    (a,) = run_sweep(SweepRequest(model=str(path), systems=("box",), **kw), db)
    return a


def test_default_is_the_newest_stack_of_the_newest_backend_and_nothing_mixes(setup):
    path, model, db = setup
    a = sweep(path, db)  # the cuDNN stack was used last
    assert a.backend == "cudnn" and a.stack == GPU
    assert a.bounds.sequential_ms == pytest.approx(oracle_sequential(db, model, GPU))
    assert {r.variant.split("/backend=")[1].split("/")[0] for r in a.rows if r.variant} == {"cudnn"}
    cpu = sweep(path, db, backend="onednn")
    assert cpu.stack == NEW  # not the old oneDNN, whose 50 ms results would otherwise mix in
    assert cpu.bounds.sequential_ms == pytest.approx(oracle_sequential(db, model, NEW))
    old = sweep(path, db, backend="onednn", stack=OLD.stack_id[:8])
    assert old.stack == OLD and old.bounds.sequential_ms == pytest.approx(oracle_sequential(db, model, OLD))
    assert any(f"1 other onednn stack(s) ({NEW.stack_id})" in n for n in old.notes)
    with pytest.raises(BenanzaError, match="no stack 0000"):
        sweep(path, db, stack="0000")


def test_tf32_counts_only_when_the_bound_says_it_assumes_it(setup):
    path, model, db = setup
    exact = sweep(path, db, backend="cudnn")
    tf32 = sweep(path, db, backend="cudnn", math="tf32")
    assert exact.math == "exact" and all("math=tf32_allowed" not in r.variant for r in exact.rows)
    assert exact.bounds.sequential_ms == pytest.approx(oracle_sequential(db, model, GPU))
    assert tf32.bounds.sequential_ms == pytest.approx(oracle_sequential(db, model, GPU, tf32=True))
    assert tf32.bounds.sequential_ms < exact.bounds.sequential_ms


def test_unstable_layers_are_counted_in_every_output(setup, tmp_path):
    path, _, db = setup
    a = sweep(path, db, backend="onednn")
    chosen = next(r for r in a.rows if r.status == "ok")
    (res,) = [r for r in db.results(NEW) if r.variant.name == chosen.variant]
    db.insert_results(NEW, [Result(res.variant, "box", Status.OK, median_ms=res.median_ms, mean_ms=8.5,
                                   stddev_ms=12.3, unstable=True)])
    a = sweep(path, db, backend="onednn")
    same_key = [r.index for r in a.rows if r.key == chosen.key]
    assert [r.index for r in a.unstable_rows] == same_key
    assert any(w.startswith(f"{len(same_key)} of the bound's") and "unstable" in w for w in a.warnings)
    db.close()
    out = CliRunner().invoke(main, ["analyze", str(path), "--system", "box", "--backend", "onednn", "--db",
                                    str(db.path), "--json", "--report", str(tmp_path / "r.html")])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output[out.output.index("{"):])["analyses"][0]
    assert doc["unstable_layers"] == same_key and doc["stack"]["id"] == NEW.stack_id
    assert doc["stack"]["components"]["onednn"] == "3.2.0" and doc["math"] == "exact"
    html = (tmp_path / "r.html").read_text()
    assert f"unstable layers in the bound: {len(same_key)} of" in html and NEW.stack_id in html
    text = CliRunner().invoke(main, ["analyze", str(path), "--system", "box", "--backend", "onednn", "--db",
                                     str(db.path)])
    assert NEW.stack_id in text.output and f"{len(same_key)} of" in text.output


def test_fusions_slower_than_their_layers_are_unprofitable_and_not_applied(setup):
    path, model, db = setup
    fused = [v for v in expand_variants(build_manifest([model], unique_layers([model])), get_backend("onednn"),
                                        GenOptions(dtypes=("f32",))) if v.fusion != "none"]
    # the demo's case: a fused conv measured 4× slower than conv + bn + relu
    db.insert_results(NEW, [Result(v, "box", Status.OK, median_ms=1e-4 if v.fusion == "bias_relu" else 8.0)
                            for v in fused])
    a = sweep(path, db, backend="onednn")
    assert [u.pattern for u in a.fusion.applied] == ["bias_relu"]
    assert a.fusion.unprofitable and all(u.fused_ms == 8.0 and u.fused_ms > u.unfused_ms
                                         for u in a.fusion.unprofitable)
    (use,) = a.fusion.applied
    assert a.fusion.bounds.sequential_ms == pytest.approx(a.bounds.sequential_ms - use.unfused_ms + 1e-4)
    assert a.fusion.bounds.sequential_ms <= a.bounds.sequential_ms
    assert any("unprofitable" in w for w in a.warnings)
    from benanza.report import analysis_json, render_html

    doc = analysis_json(a)["fusion"]
    assert [u["fused_ms"] for u in doc["unprofitable"]] == [8.0] * len(a.fusion.unprofitable)
    assert "Q5 unprofitable fusions" in render_html([a])


# --- Q3 across library versions and layouts -------------------------------------------------------


def _log_time(problem: str) -> float:
    """The exec time oneDNN logged for a problem, read from the fixture with plain splitting."""
    lines = [ln.split(",") for ln in (helpers.FIXTURES / "onednn_v3.log").read_text().splitlines() if ",exec," in ln]
    return next(float(f[-1]) for f in lines if f[-2] == problem)


def _conv1_results(model, stddev: float = 0.001) -> list[Result]:
    problem = model.nodes[0].layer.problem

    def r(algo, layout, impl, ms):
        return Result(Variant(problem, "onednn", "convolution", algo, "f32", layout, "default", "bias_relu"),
                      "box", Status.OK, median_ms=ms, stddev_ms=stddev, implementation=impl)

    # the log's conv1 ran brg:avx512_core on nhwc (acdb) with its bias and a ReLU post-op: results of
    # the conv+bias+ReLU fusion; the fastest result of all is nchw
    return [r("direct", "nchw", "gemm:jit", 0.001), r("direct", "nhwc", "brg:avx512_core", 0.05),
            r("auto", "nhwc", "jit:avx512_core", 0.02)]


def _q3(save, onednn_version: str, stddev: float = 0.001):
    from benanza.analyzer import analyze
    from benanza.parsers import load_file

    model = load_model(save(helpers.conv_net(), "convnet.onnx"), 1)
    stack = System("box", "onednn", "Test CPU", (("onednn", onednn_version),))
    a = analyze(model, _conv1_results(model, stddev), "box", "onednn",
                profile=load_file(helpers.FIXTURES / "onednn_v3.log"), stack=stack)
    (lib,) = a.libraries
    return a, lib, {c.name: c for c in lib.algorithms}["conv1"]


def test_q3_compares_within_the_calls_layout_on_the_same_version(save):
    _, lib, c = _q3(save, "3.2.0")
    assert lib.framework_version == "3.2.0" and not lib.versions_differ
    assert c.layout == "nhwc" and c.used == "brg:avx512_core" and c.used_ms == 0.05
    assert c.best == "jit:avx512_core" and c.best_ms == 0.02  # not the nchw 0.001 ms
    assert c.suboptimal and c.gain_ms == pytest.approx(0.03) and lib.algorithm_gain_ms == pytest.approx(0.03)
    assert c.framework_ms == pytest.approx(_log_time("mb1_ic3oc8_ih8oh8kh3sh1dh0ph1_iw8ow8kw3sw1dw0pw1"))


def test_q3_calls_nothing_suboptimal_within_the_noise(save):
    _, lib, c = _q3(save, "3.2.0", stddev=0.05)
    assert c.gain_ms == pytest.approx(0.03) and not c.suboptimal and lib.algorithm_gain_ms == 0


def test_q3_across_versions_judges_nothing_and_shows_the_framework_time(save):
    a, lib, c = _q3(save, "2.6.3")
    assert lib.versions_differ and lib.benchmark_version == "2.6.3"
    assert c.used_ms is None and not c.suboptimal and lib.suboptimal == []
    assert c.framework_ms == pytest.approx(_log_time("mb1_ic3oc8_ih8oh8kh3sh1dh0ph1_iw8ow8kw3sw1dw0pw1"))
    assert any("3.2.0" in n and "2.6.3" in n and "do not compare" in n for n in a.notes)
    from rich.console import Console

    from benanza.report import print_analysis

    console = Console(record=True, width=200)
    print_analysis(a, console)
    text = console.export_text()
    assert "Q3: not judged" in text and "sub-optimal layers" not in text
    from benanza.report import render_html

    assert "not judged: the framework's onednn 3.2.0 is not the benchmarks' 2.6.3" in render_html([a])
