"""Every command under bad input: a missing or corrupt model, a file that is not a database, a
folder without a manifest, malformed option values. Each gets exactly one error line on stderr
that names the file or value and the problem, no traceback, and a non-zero exit status; a bug
in Benanza is an "internal error" line instead, with the traceback only at -vv.

(tests/contract/test_cli.py covers the per-backend variant options, int64 overflows, broken
profile bundles, foreign and read-only databases; they are not repeated here.)"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner
from helpers import conv_net
from onnx import helper

from benanza.cli import INTERNAL_ERROR_STATUS, main
from benanza.perfdb import PerfDB


def refused(args: list[str], *named: str, status: int = 1) -> str:
    """Runs the command; returns its one error line after checking it names ``named``."""
    out = CliRunner().invoke(main, args)
    assert out.exception is None or isinstance(out.exception, SystemExit), out.exception
    assert out.exit_code == status, (out.exit_code, out.output)
    assert "Traceback" not in out.output, out.output
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    if status == 2:  # click's usage errors: "Usage: …", "Try …", then the one "Error: …" line
        lines = [ln for ln in lines if ln.startswith("Error: ")]
    assert len(lines) == 1, out.stderr
    line = lines[0]
    for text in named:
        assert text in line, line
    return line


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    net = tmp_path / "net.onnx"
    onnx.save(conv_net(), str(net))
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"\x08\x07garbage, not a protobuf\x00\xff" * 8)
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(net.read_bytes()[:200])
    notdb = tmp_path / "notes.db"
    notdb.write_text("a text file that the user mistook for a database\n")
    empty_dir = tmp_path / "nothing"
    empty_dir.mkdir()
    PerfDB(tmp_path / "real.db").close()
    return {"db": str(tmp_path / "real.db"), "net": str(net), "corrupt": str(corrupt), "truncated": str(truncated),
            "notdb": str(notdb), "missing": str(tmp_path / "missing.onnx"), "dir": str(empty_dir),
            "out": str(tmp_path / "out"), "nodb": str(tmp_path / "none.db")}


MODEL_COMMANDS = [
    ["generate", "{model}", "--out", "{out}"],
    ["check", "{model}", "--bench-dir", "{out}"],
    ["db", "lookup", "{model}", "--system", "box", "--backend", "onednn", "--db", "{nodb}", "--generate-missing",
     "--bench-dir", "{out}"],
]


@pytest.mark.parametrize("command", MODEL_COMMANDS, ids=lambda c: " ".join(c[:2]))
@pytest.mark.parametrize("model, problem", [
    ("missing", "no such file"),
    ("dir", "is a directory, not an ONNX file"),
    ("corrupt", "not a readable ONNX model"),
    ("truncated", "not a readable ONNX model"),
])
def test_models_that_cannot_be_read(files, command, model, problem):
    args = [a.format(model=files[model], **files) for a in command]
    refused(args, f"{files[model]}: {problem}")
    assert not Path(files["out"]).exists()


@pytest.mark.parametrize("command", [["profile", "{model}", "--out", "{out}"],
                                     ["analyze", "{model}", "--system", "box", "--db", "{notdb}"]],
                         ids=["profile", "analyze"])
def test_existing_paths_are_click_usage_errors(files, command):
    args = [a.format(model=files["missing"], **files) for a in command]
    refused(args, "missing.onnx", "does not exist", status=2)


def test_profile_of_a_corrupt_model(files):
    refused(["profile", files["corrupt"], "--out", files["out"]], "corrupt.onnx: not a readable ONNX model")


@pytest.mark.parametrize("command", [
    ["db", "info", "--db", "{notdb}"],
    ["db", "list", "--system", "box", "--db", "{notdb}"],
    ["db", "export", "--db", "{notdb}", "--out", "{out}.csv"],
    ["db", "merge", "{nodb}", "{notdb}"],
    ["db", "serve", "--db", "{notdb}"],
    ["db", "lookup", "{net}", "--system", "box", "--db", "{notdb}"],
    ["analyze", "{net}", "--system", "box", "--db", "{notdb}"],
    ["peaks", "--system", "box", "--backend", "onednn", "--db", "{notdb}"],
], ids=lambda c: " ".join(c[:2]))
def test_a_file_that_is_not_a_database(files, command):
    refused([a.format(**files) for a in command], f"{files['notdb']}: not a usable SQLite database")


@pytest.mark.parametrize("command", [
    ["db", "list", "--system", "box", "--db", "{nodb}"],
    ["db", "export", "--db", "{nodb}", "--out", "{out}.csv"],
    ["analyze", "{net}", "--system", "box", "--db", "{nodb}"],
], ids=lambda c: " ".join(c[:2]))
def test_reading_commands_name_the_missing_database(files, command):
    refused([a.format(**files) for a in command], f"{files['nodb']}: no such database file")
    assert not Path(files["nodb"]).exists()


def test_run_and_check_without_generated_benchmarks(files):
    refused(["run", "--system", "box", "--bench-dir", files["dir"], "--backend", "onednn", "--db", files["nodb"]],
            f"{files['dir']}/layers.json: no manifest here")
    refused(["check", files["net"], "--bench-dir", files["dir"]],
            f"{files['dir']}/onednn/variants.json: no generated benchmarks here")
    assert not Path(files["nodb"]).exists()


@pytest.mark.parametrize("text, problem", [
    ('{"version": 2, "layers": [', "unreadable manifest (Expecting value"),
    ("[1, 2]", "not a manifest (a JSON list, not an object)"),
    ('{"version": 1}', "manifest version 1, expected 2"),
    ('{"version": 2, "batch_size": 1, "models": [{}], "layers": []}', "malformed manifest (KeyError: 'path')"),
    ('{"version": 2, "batch_size": 1, "models": [], "layers": [{"key": 5}]}', "malformed manifest"),
])
def test_a_corrupt_manifest(files, text, problem):
    (Path(files["dir"]) / "layers.json").write_text(text)
    refused(["run", "--system", "box", "--bench-dir", files["dir"], "--backend", "onednn", "--db", files["nodb"]],
            f"{files['dir']}/layers.json: {problem}")


@pytest.mark.parametrize("args, named", [
    (["generate", "{net}", "--out", "{out}", "--input-shape", "x=abc"], "--input-shape 'x=abc'"),
    (["generate", "{net}", "--out", "{out}", "--input-shape", "nosuch=1x2"],
     "--input-shape nosuch: no given model has such an input"),
    (["profile", "{net}", "--out", "{out}", "--input-shape", "nosuch=1x2"], "names no graph input: nosuch"),
    (["db", "export", "--db", "{db}", "--out", "{out}.txt"], "{out}.txt: choose a .csv or .parquet file name"),
    (["db", "list", "--db", "{db}", "--system", "nobody"], "'nobody'"),
    (["campaign", "submit", "{net}", "--dir", "{out}", "--system", "a100:partition"],
     "--system 'a100:partition'"),
    (["campaign", "submit", "{net}", "--dir", "{out}", "--system", "a100:partition=gpu", "--slurm", "bogus"],
     "--slurm 'bogus': expected KEY=VALUE"),
    (["campaign", "status", "--dir", "{dir}"], "campaign.json: no campaign here"),
    (["campaign", "resume", "--dir", "{dir}"], "campaign.json: no campaign here"),
    (["zoo", "--only", "nosuch", "--out", "{out}"], "unknown zoo model 'nosuch'"),
    (["zoo", "--table", "--only", "nosuch"], "unknown zoo model 'nosuch'"),
    (["profile", "--command", "definitely-not-a-command-xyz", "--out", "{out}"],
     "cannot run `definitely-not-a-command-xyz`"),
], ids=lambda a: " ".join(a[:2]) if isinstance(a, list) else "")
def test_bad_values(files, args, named):
    refused([a.format(**files) for a in args], named.format(**files))


@pytest.mark.parametrize("args", [["generate", "{net}", "--backend", "bogus"], ["run", "--l2", "warm"],
                                  ["analyze", "{net}", "--system", "x", "--math", "fast"],
                                  ["db", "list", "--system", "x", "--status", "great"],
                                  ["check", "{net}", "--seed", "-1"], ["profile", "{net}", "--iterations", "0"]],
                         ids=lambda a: " ".join(a[:2]))
def test_wrong_flag_values_are_usage_errors(files, args):
    refused([a.format(**files) for a in args], "Invalid value", status=2)


def _conv2(m: onnx.ModelProto) -> onnx.NodeProto:
    return next(n for n in m.graph.node if n.name == "conv2")


def _group_zero(m: onnx.ModelProto) -> None:
    _conv2(m).attribute.append(helper.make_attribute("group", 0))


def _weight_rank_five(m: onnx.ModelProto) -> None:
    # ONNX's own inference does not compare the ranks once kernel_shape is given
    _conv2(m).attribute.append(helper.make_attribute("kernel_shape", [3, 3]))
    next(t for t in m.graph.initializer if t.name == "W2").dims.append(1)


def _attribute_of_no_type(m: onnx.ModelProto) -> None:
    next(n for n in m.graph.node if n.name == "softmax").attribute[0].type = onnx.AttributeProto.UNDEFINED


@pytest.mark.parametrize("mutate, problem", [
    (_group_zero, "node 'conv2' (Conv): group 0 does not divide the 8 input channels"),
    (_weight_rank_five, "node 'conv2' (Conv): input 1 has 5 dims, Conv here needs 4"),
    (_attribute_of_no_type, "node 'softmax' (Softmax): type field and data field mismatch in attribute axis"),
])
def test_invalid_nodes_are_model_errors_naming_the_node(files, tmp_path, mutate, problem):
    m = conv_net()
    mutate(m)
    path = tmp_path / "bad-node.onnx"
    onnx.save(m, str(path))
    refused(["generate", str(path), "--out", files["out"]], f"{path}: {problem}")


# --- bugs are bugs ------------------------------------------------------------------------

def _bug(view):
    raise AttributeError("'NoneType' object has no attribute 'shape'")


def test_a_bug_in_the_op_code_is_an_internal_error_not_a_model_error(files, monkeypatch):
    from benanza import processor

    monkeypatch.setattr(processor, "build_layer", _bug)
    line = refused(["generate", files["net"], "--out", files["out"]],
                   "internal error: AttributeError: 'NoneType' object has no attribute 'shape' "
                   "(rerun with -vv for the traceback)", status=INTERNAL_ERROR_STATUS)
    assert "net.onnx" not in line  # the model is fine: nothing blames it
    out = CliRunner().invoke(main, ["-vv", "generate", files["net"], "--out", files["out"]])
    assert out.exit_code == INTERNAL_ERROR_STATUS
    assert "Traceback (most recent call last)" in out.stderr and "in _bug" in out.stderr
    assert out.stderr.rstrip().splitlines()[-1].startswith("internal error: AttributeError: ")


def test_file_system_refusals_name_the_path(files, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    refused(["generate", files["net"], "--out", str(blocker / "out")], str(blocker))


def test_a_failed_campaign_job_is_styled_not_printed_as_markup(capsys):
    from benanza.campaign import JobReport
    from benanza.cli import _print_job_reports

    _print_job_reports([JobReport("a100", "42", "failed", "TIMEOUT", "time limit [1h] reached", 3, "/logs/42.err",
                                  "last [/] line")])
    err = capsys.readouterr().err
    assert "[bold red]" not in err and "[/]" not in err.replace("last [/] line", "")
    assert "a100: job 42 failed (TIMEOUT): time limit [1h] reached; 3 partial results merged; log: /logs/42.err" \
        in err and "last [/] line" in err
