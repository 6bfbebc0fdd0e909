"""Fault suite, input side: models and command-line values a user can hand `benanza`, each of
which must be refused up front in one line naming the file and the problem (never a traceback,
never a benchmark that fails only at run time)."""

from __future__ import annotations

from pathlib import Path

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
