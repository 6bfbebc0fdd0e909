"""Reports: the documented JSON schema, terminal output, and the HTML page in a real browser."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from helpers import FIXTURES, REPO
from rich.console import Console

from benanza.analyzer import analyze
from benanza.parsers import load_file
from benanza.processor import load_model
from benanza.report import SCHEMA_VERSION, dag_layout, document, print_analysis, render_html
from tests.analysis.test_analyzer import inception_like, ok, results_for

DOC = REPO / "docs" / "analyze-json.md"


@pytest.fixture
def analysis(save):
    model = load_model(save(inception_like(), "inception_like.onnx"), 1)
    res = results_for(model, lambda n: 0.1 * (n.index + 1))
    res.append(ok(model.nodes[0].layer, 0.05, fusion="relu"))
    return analyze(model, res, "sys", "onednn", measured_ms=2.0)


def test_json_document_follows_the_documented_schema(analysis):
    doc = json.loads(json.dumps(document([analysis])))
    assert doc["schema_version"] == SCHEMA_VERSION
    (a,) = doc["analyses"]
    documented = set(re.findall(r"^\| `([a-z][a-z0-9_]*)` \|", DOC.read_text(), re.M))
    assert set(a) <= documented, f"undocumented keys: {set(a) - documented}"
    assert {"bounds", "layers", "edges", "coverage", "parallel_modules", "fusion", "warnings"} <= set(a)
    b = a["bounds"]
    assert b["parallel_ms"] < b["sequential_ms"]
    assert b["br_sequential"] == pytest.approx(b["sequential_ms"] / 2.0, rel=1e-4)
    assert a["speedup"]["parallel"] == pytest.approx(1 / b["br_parallel"], rel=1e-3)
    assert [lay["index"] for lay in a["layers"]] == list(range(len(a["layers"])))
    assert a["fusion"]["applied"][0]["pattern"] == "relu"
    assert a["parallel_modules"][0]["branches"] == 3


def test_terminal_output_names_layers_and_ratio(analysis):
    console = Console(record=True, width=140)
    print_analysis(analysis, console)
    text = console.export_text()
    assert "Benanza ratio" in text and "branch_b" in text and "parallel modules" in text


def test_dag_layout_puts_branches_side_by_side():
    # 0 → {1, 2, 3} → 4
    pos = dag_layout(5, [(0, 1), (0, 2), (0, 3), (1, 4), (2, 4), (3, 4)])
    assert {pos[i][1] for i in (1, 2, 3)} == {1} and pos[4][1] == 2
    assert len({pos[i][0] for i in (1, 2, 3)}) == 3


def test_html_is_self_contained(analysis):
    html = render_html([analysis])
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in html and "<script src" not in html and "<link" not in html
    assert html.count("<svg") >= 3  # graph + charts


needs_chromium = pytest.mark.skipif(
    shutil.which("chromium") is None,
    reason="headless Chromium not installed (apt-get install chromium); CI should have it")


def dump_dom(page: Path) -> str:
    """The DOM a real headless Chromium builds from the page (no network, throwaway profile)."""
    with tempfile.TemporaryDirectory() as profile_dir:
        proc = subprocess.run(
            ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile_dir}",
             "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.slow  # renders the page in headless Chromium
@needs_chromium
def test_html_renders_in_headless_chromium(tmp_path, save):
    model = load_model(save(__import__("helpers").conv_net(), "convnet.onnx"), 1)
    prof = load_file(FIXTURES / "ort_convnet.json")
    a = analyze(model, results_for(model, lambda n: 0.01), "sys", "onednn", profile=prof)
    page = tmp_path / "report.html"
    page.write_text(render_html([a]))
    dom = dump_dom(page)
    # the browser parsed the table and the SVG graph: every layer is a row and a node
    assert dom.count("<g class=\"node") == len(a.rows)
    assert "class=\"layers\"" in dom and ">conv1<" in dom
    assert dom.count("class=\"node critical") == len(a.bounds.critical_path)
    assert "Benanza ratio" in dom and "<svg" in dom


def test_markup_in_node_names_prints_as_itself(save):
    """A node named `[/]` used to crash the terminal table; `[link=…]` rendered as a link."""
    m = inception_like()
    hostile = ["[/]", "[link=https://example.com]x[/link]", "[bold red]", "é 🚀"]
    for node, name in zip(m.graph.node, hostile):
        node.name = name
    model = load_model(save(m, "[b] é.onnx"), 1)
    a = analyze(model, results_for(model), "sys", "onednn", measured_ms=2.0)
    a.warnings.append("warning text with [/] in it")
    console = Console(record=True, width=400)  # markup on, as any caller's console may have it
    print_analysis(a, console, max_layers=0)
    text = console.export_text()
    for name in hostile:
        assert name in text, name
    assert "[b] é on sys" in text and "warning text with [/] in it" in text
    assert "\x1b]8;" not in console.export_text(styles=True)  # no OSC 8 hyperlink anywhere
    assert len([ln for ln in text.splitlines() if ln.startswith("│")]) >= len(a.rows)  # --limit 0: every layer


def test_layers_csv_has_every_layer(analysis):
    import csv
    import io

    from benanza.report import LAYER_COLUMNS, layers_csv

    rows = list(csv.DictReader(io.StringIO(layers_csv([analysis]))))
    assert tuple(rows[0]) == LAYER_COLUMNS
    assert [int(r["index"]) for r in rows] == [r.index for r in analysis.rows]
    for r, row in zip(analysis.rows, rows):
        assert row["name"] == r.name and row["key"] == r.key
        assert (float(row["latency_ms"]) == r.latency_ms) if r.status == "ok" else row["latency_ms"] == ""
