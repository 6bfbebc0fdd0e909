"""The generator's indexes: `benanza generate` over the same models in any order writes the same
layers.json and <backend>/variants.json, byte for byte, as it writes the same sources
(tests/ops/test_registry.py)."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner
from helpers import conv_net

from benanza.cli import main


@pytest.mark.parametrize("backend", ["onednn", "cudnn", "onnxruntime"])
def test_indexes_do_not_depend_on_model_order(save, zoo_model, tmp_path, backend) -> None:
    # the same network under two names (each of its layers occurs in both) and LeNet (layers of
    # its own): the order given decides which model and which layer the processor meets first
    models = [save(conv_net(), "a.onnx"), zoo_model("lenet"), save(conv_net(), "c.onnx")]
    out = tmp_path / "out"  # one folder for both runs: the paths written into the files are the same
    written = []
    for order in (models, models[::-1]):
        shutil.rmtree(out, ignore_errors=True)
        result = CliRunner().invoke(main, ["generate", *map(str, order), "--out", str(out), "--backend", backend])
        assert result.exit_code == 0, result.output
        written.append({name: (out / name).read_bytes() for name in ("layers.json", f"{backend}/variants.json")})
    assert written[0] == written[1]
    manifest = json.loads(written[0]["layers.json"])
    # what makes the order matter: a layer occurs in two models, and there are variants to order
    assert any({o["model"] for o in u["occurrences"]} == {"a", "c"} for u in manifest["layers"])
    assert len(json.loads(written[0][f"{backend}/variants.json"])["variants"]) > 1
