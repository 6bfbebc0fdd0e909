"""Hostile names (rich markup, a link, non-ASCII, emoji, quotes, shell metacharacters) in node
names, the model's file name and its folder, through generate → run (real oneDNN build) →
analyze → report. Every name prints as itself; the failed benchmark's reproduce line, pasted
into a shell, runs exactly that benchmark."""

from __future__ import annotations

import csv
import io
import re
import subprocess

import onnx
import pytest
from click.testing import CliRunner
from helpers import conv_net

from benanza.backends.base import BuildError, build
from benanza.cli import main
from benanza.runner import RunOptions, run
from tests.backends.test_onednn import HAVE_TOOLCHAIN

NAMES = ["[/]", "[link=https://example.com]click[/link]", "é-ñ", "🚀 rocket", "quo\"te's", "$HOME;rm -rf x",
         "back\\slash", "[bold red]x", "tab\there"]


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_TOOLCHAIN, reason="needs cmake, libdnnl-dev and libbenchmark-dev")
def test_hostile_names_survive_the_whole_pipeline(tmp_path):
    folder = tmp_path / "dir [b] é 🚀 $x 'q'"  # no ';': CMake itself cannot build under one
    folder.mkdir()
    m = conv_net()
    for node, name in zip([n for n in m.graph.node], NAMES):
        node.name = name
    model = folder / "m [link=x] é.onnx"
    onnx.save(m, str(model))
    bench, db = folder / "bench", folder / "perf.db"

    gen = CliRunner().invoke(main, ["generate", str(model), "--out", str(bench), "--backend", "onednn",
                                    "--dtype", "f32", "--layout", "nchw", "--no-fusion"])
    assert gen.exit_code == 0, gen.output
    assert "m [link=x] é" in gen.output

    semi = tmp_path / "a;b" / "onednn"
    semi.mkdir(parents=True)
    (semi / "CMakeLists.txt").write_bytes((bench / "onednn" / "CMakeLists.txt").read_bytes())
    with pytest.raises(BuildError, match="path contains ';'"):
        build(semi)

    dry = run(bench, "box", "onednn", db, RunOptions(dry_run=True)).to_run
    crash = next(n for n in dry if n.startswith("conv:"))
    # the names are what is checked here, not how quiet the machine is (test_measurement)
    summary = run(bench, "box", "onednn", db, RunOptions(min_time=0.01, repetitions=1, timeout=120,
                                                         max_contention=1.0, remeasure=0,
                                                         env=(("BENANZA_FAULT_ABORT", crash),)))
    assert summary.failed == 1 and summary.ok + summary.unsupported == summary.total - 1
    (failure,) = summary.failures
    assert failure.name == crash and "SIGABRT" in failure.message
    pasted = subprocess.run(["bash", "-c", failure.reproduce], capture_output=True, text=True, timeout=120)
    assert pasted.returncode in (-6, 128 + 6)  # the abort reproduces (bash may exec it directly)
    assert re.findall(r"^BENANZA_START (.*)$", pasted.stdout, re.MULTILINE) == [crash]

    ana = CliRunner().invoke(main, ["analyze", str(model), "--system", "box", "--db", str(db), "--limit", "0",
                                    "--report", str(folder / "r [i].html"), "--csv", str(folder / "layers.csv")],
                             env={"COLUMNS": "400"})
    assert ana.exit_code == 0, ana.output
    for name in NAMES[:8]:  # the tab becomes a space in a table cell
        assert name in ana.output, name
    rows = list(csv.DictReader(io.StringIO((folder / "layers.csv").read_text())))
    assert [r["name"] for r in rows] == NAMES
    assert {r["status"] for r in rows if r["op"] == "Conv"} == {"ok"}
    html = (folder / "r [i].html").read_text()
    assert "[link=https://example.com]click[/link]" in html and "quo&#34;te&#39;s" in html
