"""Fault suite, input side: models and command-line values a user can hand `benanza`, each of
which must be refused up front in one line naming the file and the problem (never a traceback,
never a benchmark that fails only at run time)."""

from __future__ import annotations

from pathlib import Path

import pytest
from faultprobe import benanza
from helpers import conv_net


def invalid_utf8_model(tmp_path: Path) -> Path:
    """conv_net with its first node's name replaced, in the serialized bytes, by invalid UTF-8."""
    m = conv_net()
    m.graph.node[0].name = "QQQQ"
    path = tmp_path / "badutf.onnx"
    path.write_bytes(m.SerializeToString().replace(b"QQQQ", b"\xff\xfeQQ"))
    return path


def test_invalid_utf8_node_name_is_one_line(tmp_path):
    path = invalid_utf8_model(tmp_path)
    p = benanza("generate", str(path), "--out", str(tmp_path / "out"), "--backend", "none")
    assert p.clean_error and p.error == f"error: {path}: node 0 has a name that is not valid UTF-8: b'\\xff\\xfeQQ'"
    assert not (tmp_path / "out" / "layers.json").exists()


# --- campaign submit ---------------------------------------------------------------------------

def campaign_probes(tmp_path: Path) -> dict:
    """`campaign submit` where sbatch has no cluster (an empty slurm.conf: it refuses at once)."""
    import os

    import onnx

    good, corrupt = tmp_path / "conv.onnx", tmp_path / "corrupt.onnx"
    onnx.save(conv_net(), good)
    corrupt.write_bytes(b"garbage, not a protobuf")
    (tmp_path / "slurm.conf").write_text("")
    env = dict(os.environ, SLURM_CONF=str(tmp_path / "slurm.conf"))
    return {
        "setup line": benanza("campaign", "submit", str(good), "--dir", str(tmp_path / "D1"), "--system",
                              "a:partition=x", "--slurm", "setup=echo one", "--slurm", "setup=echo two", env=env),
        "corrupt model, unknown system": benanza("campaign", "submit", str(corrupt), "--dir", str(tmp_path / "D2"),
                                                 "--system", "a:partition=x", env=env),
        "additional_parameters": benanza("campaign", "submit", str(good), "--dir", str(tmp_path / "D3"), "--system",
                                         "a:partition=x", "--slurm", "additional_parameters=x", env=env),
    }


@pytest.mark.slow  # a `benanza campaign` process per case
def test_campaign_submit_errors_are_one_line_and_bad_models_never_reach_sbatch(tmp_path):
    probes = campaign_probes(tmp_path)
    setup = probes["setup line"]
    # the setup lines reached the sbatch script; sbatch's own complaint is in the one error line
    assert setup.clean_error and setup.err.count("\n") == 1 and "sbatch refused the job: sbatch:" in setup.error
    (script,) = (tmp_path / "D1" / "slurm").glob(".submission_file_*.sh")
    assert "# setup\necho one\necho two\n" in script.read_text()
    bad = probes["corrupt model, unknown system"]
    assert bad.clean_error and str(tmp_path / "corrupt.onnx") in bad.error and "sbatch" not in bad.err
    assert not list((tmp_path / "D2").rglob("*.sh"))  # nothing was written for sbatch
    extra = probes["additional_parameters"]
    assert extra.clean_error and "additional_parameters is a mapping" in extra.error


# --- bench folders CMake cannot build in ----------------------------------------------------------

CMAKE_SYNTAX = ['a"b', "a\\b", "a$(b)", "a${b}", "a$<b>", "a;b"]


def bench_path_probes(tmp_path: Path) -> dict:
    import onnx

    onnx.save(conv_net(), tmp_path / "conv.onnx")
    out = {}
    for name in CMAKE_SYNTAX:
        bench = tmp_path / name / "B"
        gen = benanza("generate", str(tmp_path / "conv.onnx"), "--backend", "onednn", "--out", str(bench))
        assert gen.rc == 0, gen.err
        out[name] = benanza("run", "--system", "s", "--bench-dir", str(bench), "--backend", "onednn",
                            "--db", str(tmp_path / "x.db"))
    return out


@pytest.mark.slow  # `benanza generate` and `run` processes per hostile path
def test_bench_paths_cmake_reads_as_syntax_are_refused_before_cmake_runs(tmp_path):
    probes = bench_path_probes(tmp_path)
    for name, p in probes.items():
        bad = {'a"b': '"', "a\\b": "\\", "a$(b)": "$(", "a${b}": "${", "a$<b>": "$<", "a;b": ";"}[name]
        assert p.clean_error and f"path contains {bad!r}" in p.error, (name, p.err)
        assert not (tmp_path / name / "B" / "onednn" / "build").exists()  # CMake never ran
    # nothing was written beside the folders (CMake once built `a\b` in a sibling `a/b`)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*CMAKE_SYNTAX, "conv.onnx"])


# --- numbers that are no numbers --------------------------------------------------------------------

def number_probes(tmp_path: Path) -> dict:
    import onnx

    onnx.save(conv_net(), tmp_path / "conv.onnx")
    analyze = ("analyze", str(tmp_path / "conv.onnx"), "--system", "box", "--db", str(tmp_path / "none.db"))
    run = ("run", "--system", "s", "--bench-dir", str(tmp_path / "none"), "--db", str(tmp_path / "none.db"))
    return {f"{opt} {v}": benanza(*(analyze if opt == "--measured-ms" else run), opt, v, "--json"
                                  if opt == "--measured-ms" else "--dry-run")
            for opt in ("--measured-ms", "--timeout", "--min-time", "--max-rsd") for v in ("nan", "inf", "1e400")}


@pytest.mark.slow  # twelve `benanza` processes
def test_non_finite_numbers_are_usage_errors(tmp_path):
    for case, p in number_probes(tmp_path).items():
        assert p.rc == 2 and p.clean_error and "is not a finite number" in p.error, (case, p.err)
        assert not (tmp_path / "none.db").exists()


# --- models that are not valid ONNX -----------------------------------------------------------------

def invalid_models(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Models ONNX itself defines as invalid, each with the problem the error must name."""
    import numpy as np
    import onnx
    from helpers import io, model, tensor
    from onnx import helper, numpy_helper

    def save(m, name: str) -> Path:
        onnx.save(m, tmp_path / name)
        return tmp_path / name

    opset99, ir = conv_net(), conv_net()
    opset99.opset_import[0].version = 99
    ir.ir_version = 2**62
    def conv(g: int, w: tuple[int, ...]):
        return model([helper.make_node("Conv", ["x", "W"], ["y"], group=g, name="c")], [io("x", [1, 3, 8, 8])],
                     [io("y", None)], [tensor("W", w)])

    deconv = model([helper.make_node("ConvTranspose", ["x", "W"], ["y"], group=2, name="d")], [io("x", [1, 3, 8, 8])],
                   [io("y", None)], [tensor("W", (3, 2, 3, 3))])
    expand = model([helper.make_node("Expand", ["x", "s"], ["y"], name="e")], [io("x", [1])], [io("y", None)],
                   [numpy_helper.from_array(np.array([10**13], np.int64), "s")])
    strings, bools = conv(1, (4, 3, 3, 3)), conv(1, (4, 3, 3, 3))
    strings.graph.input[0].type.tensor_type.elem_type = onnx.TensorProto.STRING
    bools.graph.input[0].type.tensor_type.elem_type = onnx.TensorProto.BOOL
    # a contrib op leaves ONNX's inference short, so ONNX Runtime's symbolic inference multiplies
    # 4 by 2^62 on numpy scalars: it wrapped to a dim of 0 and printed a RuntimeWarning
    tile = model([helper.make_node("Gelu", ["x"], ["g"], domain="com.microsoft", name="gelu"),
                  helper.make_node("Tile", ["g", "r"], ["y"], name="t")], [io("x", [1, 4])], [io("y", None)],
                 [numpy_helper.from_array(np.array([1, 2**62], np.int64), "r")])
    tile.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return {
        "Conv group=2 over 3 channels": (save(conv(2, (4, 1, 3, 3)), "group.onnx"),
                                         "node 'c' (Conv): group 2 does not divide the 3 input channels"),
        "Conv weights for other channels": (save(conv(1, (4, 2, 3, 3)), "weights.onnx"),
                                            "take 2 input channels in 1 groups, the input has 3"),
        "ConvTranspose group=2 over 3 channels": (save(deconv, "deconv.onnx"),
                                                  "divisible by group for ConvTranspose. C=3 group=2"),
        "opset 99": (save(opset99, "opset99.onnx"), "opset 99 is newer than the installed ONNX"),
        "IR version 2^62": (save(ir, "ir.onnx"), f"IR version {2**62} is newer than the installed ONNX"),
        "Expand to 10^13 elements": (save(expand, "expand.onnx"), "has a dim of 10000000000000"),
        "Conv on a STRING input": (save(strings, "strings.onnx"),
                                   "node 'c' (Conv): input 0 'x' is string, which Conv does not take (it takes "
                                   "double, float, float16)"),
        "Conv on a BOOL input": (save(bools, "bools.onnx"), "node 'c' (Conv): input 0 'x' is bool, which Conv"),
        "Tile past int64 in symbolic inference": (save(tile, "tile.onnx"),
                                                  "Integer overflow while multiplying dimension values 4 and "
                                                  f"{2**62}"),
    }


@pytest.mark.slow  # one `benanza generate` process per invalid model
def test_invalid_models_are_refused_at_generate_not_at_run(tmp_path):
    for case, (path, why) in invalid_models(tmp_path).items():
        p = benanza("generate", str(path), "--backend", "onednn", "--out", str(tmp_path / path.stem))
        assert p.clean_error and str(path) in p.error and why in p.error, (case, p.err)
        # the error line is all the user sees: no library's RuntimeWarning or log line before it
        assert p.err == p.error + "\n" and p.out == "", (case, p.out, p.err)
        assert not (tmp_path / path.stem / "onednn").exists()  # no benchmark that could fail later
