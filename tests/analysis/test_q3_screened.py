"""Q3 when the framework ran a variant racing only screened, end to end through the real pipeline:
a conv net → `benanza generate` (oneDNN, f32) → `benanza run --precision` (racing stops the variants
that cannot be their layer's best: stored eliminated, with their screening estimate) → as the
framework's log, the oneDNN verbose lines of an eliminated variant's own benchmark (the benchmarks'
own library, so implementation names compare) → `benanza analyze`. The figure is labelled a
screened estimate in the terminal, the JSON and the HTML, the layer is not judged, and the command
analyze prints, once run, leaves Q3 reading full measurements equal to the database's newest rows
(SQL, independently of the analyzer).
"""

from __future__ import annotations

import html
import json
import os
import re
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import io, model, tensor
from onnx import helper

from tests.analysis.test_bounds_e2e import JSON_MS

pytestmark = pytest.mark.slow
SYSTEM = "race"
C, HW = 32, 28
# a precision no screening reaches (a 10 µs kernel reaches 1e-4 in the screening's 0.05 s): every
# variant that cannot win is stopped at its estimate
PRECISION, MAX_TIME = 1e-5, 0.2
BIN = Path(sys.executable).parent
# the printed command names `benanza`, as a user's shell finds it
ENV = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "COLUMNS": "400"}


def conv_model():
    """Conv 3×3 (bias) → depthwise Conv 3×3 (bias): layers whose layouts run different kernels."""
    inits = [tensor("W1", (C, C, 3, 3)), tensor("B1", (C,)), tensor("W2", (C, 1, 3, 3)), tensor("B2", (C,))]
    nodes = [helper.make_node("Conv", ["x", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Conv", ["c1", "W2", "B2"], ["y"], pads=[1, 1, 1, 1], group=C, name="depthwise")]
    return model(nodes, [io("x", [1, C, HW, HW])], [io("y", None)], inits)


def shell(command: str, cwd: Path) -> str:
    proc = subprocess.run(["bash", "-c", command], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, f"{command} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def benanza(*args: str, cwd: Path) -> str:
    return shell(shlex.join(["benanza", *args]), cwd)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    import onnx

    if not (BIN / "benanza").exists():
        pytest.skip("the benanza console script is not installed in this environment")
    d = tmp_path_factory.mktemp("q3screened")
    onnx.save(conv_model(), str(d / "convs.onnx"))
    # out/bench: where the command analyze prints generates, so running it rebuilds nothing
    benanza("generate", "convs.onnx", "--out", "out/bench", "--backend", "onednn", "--dtype", "f32", cwd=d)
    # the figures of the pipeline are checked here, not how quiet the machine is (test_measurement)
    benanza("run", "--bench-dir", "out/bench", "--system", SYSTEM, "--db", "perf.db", "--backend", "onednn",
            "--threads", "1", "--precision", str(PRECISION), "--max-time", str(MAX_TIME), "--remeasure", "0",
            "--max-contention", "1", cwd=d)
    return d


def newest(d: Path) -> dict[str, dict]:
    """Each variant's newest row (the highest id: the one perfdb reads), by name."""
    with sqlite3.connect(d / "perf.db") as conn:
        conn.row_factory = sqlite3.Row
        rows = conn.execute(
            "SELECT r.id, r.variant, r.layer_key, r.status, r.implementation, r.eliminated, r.command, v.layout, "
            "v.fusion, coalesce(r.low_ms, r.median_ms) AS ms FROM results r JOIN variants v ON v.name = r.variant "
            "WHERE r.system = ? AND r.id IN (SELECT max(id) FROM results GROUP BY stack_id, variant)", (SYSTEM,))
        return {r["variant"]: dict(r) for r in rows}


def candidates(rows: dict[str, dict], call: dict, same_kernel: bool) -> list[dict]:
    """What a plain biased call of ``call``'s layer in its layout computes the same as: the layer's
    OK results in that layout, unfused or with the bias fused (``same_kernel``: of its implementation)."""
    return [r for r in rows.values() if r["layer_key"] == call["layer_key"] and r["layout"] == call["layout"]
            and r["fusion"] in ("none", "bias") and r["status"] == "ok"
            and (not same_kernel or r["implementation"] == call["implementation"])]


def fastest(rows: list[dict]) -> dict:
    return min(rows, key=lambda r: (r["ms"], r["variant"]))


def framework_log(d: Path, variant: str) -> Path:
    """The benchmark's own oneDNN verbose lines as a framework's log: three calls, one per pass."""
    from benanza.backends.base import build

    names = d / "call.txt"
    names.write_text(variant + "\n")
    binary = build(d / "out" / "bench" / "onednn")
    out = subprocess.run([str(binary), f"--benanza_names={names}", "--benchmark_min_time=0.001",
                          "--benchmark_repetitions=1"], capture_output=True, text=True, check=True, timeout=300,
                         env={"DNNL_VERBOSE": "1", "ONEDNN_VERBOSE": "1", "OMP_NUM_THREADS": "1",
                              "PATH": "/usr/bin:/bin"}).stdout.splitlines()
    verbose = [ln for ln in out if ln.startswith(("dnnl_verbose,", "onednn_verbose,"))]
    calls = [ln for ln in verbose if ",exec," in ln and ",convolution," in ln]
    assert len(calls) >= 3, out[-20:]
    log = d / "framework.log"
    log.write_text("".join(ln + "\n" for ln in [*(ln for ln in verbose if ",info," in ln), *calls[:3]]))
    return log


def analyze(d: Path, *args: str) -> str:
    return benanza("analyze", "convs.onnx", "--system", SYSTEM, "--db", "perf.db", "--profile", "framework.log",
                   "--measured-ms", "100", *args, cwd=d)


def q3(d: Path) -> tuple[dict, dict]:
    (a,) = json.loads(analyze(d, "--json", "--report", "q3.html"))["analyses"]
    (lib,) = [x for x in a["libraries"] if x["library"] == "onednn"]
    assert lib["framework_version"] == lib["benchmark_version"], "the benchmarks' own log names another oneDNN"
    (choice,) = lib["algorithms"]  # the log calls one layer
    return a, choice


def test_a_screened_framework_choice_is_labelled_then_measured_in_full_on_demand(work):
    rows = newest(work)
    # the framework's call: a plain-layout unfused variant racing stopped, which Q3 takes as the
    # call's measurement (the fastest result of its layer, layout and kernel is a screened one)
    calls = [r for _, r in sorted(rows.items()) if r["eliminated"] and r["status"] == "ok" and r["fusion"] == "none"
             and r["layout"] in ("nchw", "nhwc") and fastest(candidates(rows, r, True))["eliminated"]]
    assert calls, ("racing eliminated no plain-layout conv variant: "
                   + ", ".join(f"{n} {r['ms']:.4g} ms" for n, r in sorted(rows.items()) if r["eliminated"]))
    call = calls[0]
    used, best = fastest(candidates(rows, call, True)), fastest(candidates(rows, call, False))
    screened = {r["variant"] for r in candidates(rows, call, True) if r["eliminated"]}
    if best["eliminated"]:
        screened |= {r["variant"] for r in candidates(rows, call, False) if r["eliminated"]}
    framework_log(work, call["variant"])

    a, x = q3(work)
    assert (x["used"], x["layout"], x["fusion"]) == (call["implementation"], call["layout"], best["fusion"])
    assert x["used_variant"] == used["variant"] and x["used_ms"] == pytest.approx(used["ms"], **JSON_MS)
    assert x["best_variant"] == best["variant"] and x["best_ms"] == pytest.approx(best["ms"], **JSON_MS)
    assert x["used_screened"] and x["best_screened"] == bool(best["eliminated"])
    assert set(x["screened"]) == screened and not x["suboptimal"]  # not judged on an estimate
    # the command: exactly those variants, sampled in full as the race would have, on the same stack
    command = a["screened_command"]
    assert any(w.endswith(command) for w in a["warnings"])
    argv = shlex.split(command.split(" && ")[-1])
    flag = {k: v for k, v in zip(argv, argv[1:]) if k.startswith("--")}
    assert {n for n in rows if re.search(flag["--filter"], n)} == screened
    assert "--force" in argv and "--no-race" in argv and "--race" not in argv
    assert (float(flag["--precision"]), float(flag["--max-time"]), flag["--threads"]) == (PRECISION, MAX_TIME, "1")
    assert (flag["--system"], flag["--db"], flag["--bench-dir"]) == (SYSTEM, "perf.db", "out/bench")
    # the terminal and the report say it too
    text = analyze(work)
    assert "(screened estimate)" in text
    assert "1 not judged: compared with a screened estimate" in text and command in text
    page = html.unescape((work / "q3.html").read_text())
    assert "(screened estimate)" in page and "1 layers not judged" in page and command in page

    # run it (contention tolerated as above: the figures are checked here, not the machine)
    shell(f"{command} --max-contention 1", work)
    after = newest(work)
    for n in screened:
        assert not after[n]["eliminated"] and after[n]["id"] > rows[n]["id"] and "--no-race" in after[n]["command"]
    used, best = fastest(candidates(after, call, True)), fastest(candidates(after, call, False))
    assert not used["eliminated"] and not best["eliminated"]
    a, x = q3(work)
    assert a["screened_command"] is None and not x["screened"]
    assert not x["used_screened"] and not x["best_screened"]
    assert x["used_variant"] == used["variant"] and x["used_ms"] == pytest.approx(used["ms"], **JSON_MS)
    assert x["best_variant"] == best["variant"] and x["best_ms"] == pytest.approx(best["ms"], **JSON_MS)
    assert "screened estimate" not in analyze(work)
