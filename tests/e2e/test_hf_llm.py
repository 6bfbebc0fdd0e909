"""A decode step of a Llama-style model from transformers' own modeling code (tests/hf_models.py:
LlamaForCausalLM at a tiny config, transformers' DynamicCache fed a KV cache of 8 tokens as inputs,
one unpadded sequence), exported in the test with the TorchScript exporter. The export computes what the transformers
module computes (ONNX Runtime against torch); `benanza generate` processes it, costs at least 95% of
the layers that run on oneDNN and on cuDNN/cuBLAS, and counts the multiply-adds the config implies:
every weight of every projection and of the head once per token, and attention's scores and
weighting of V over the cache's keys and the new one. benchmarks/llm_exports.py measures the three
families, both exporters, the padding mask as an input (whose boolean arithmetic leaves a decode
step below 95% on oneDNN) and the int8 forms (docs/transformers.md)."""

from __future__ import annotations

import json

import hf_models
import numpy as np
import onnxruntime as ort
import pytest
import torch
from click.testing import CliRunner

from benanza.cli import main

pytestmark = pytest.mark.slow  # a torch export of a transformers model

STEP = hf_models.Step("llama", seq=1, past=8, masked=False)


def test_llama_decode_step_from_transformers_is_costed(tmp_path) -> None:
    path = hf_models.export(STEP, "torchscript", tmp_path)
    args = hf_models.inputs(STEP)
    with torch.no_grad():
        expected = hf_models.Forward(hf_models.model("llama"), STEP.masked)(*args)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, dict(zip(hf_models.input_names(STEP), (a.numpy() for a in args))))
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e.numpy(), rtol=1e-4, atol=1e-5)

    r = CliRunner().invoke(main, ["generate", str(path), "--out", str(tmp_path / "bench"), "--backend", "onednn",
                                  "--dtype", "f32", "--json"])
    assert r.exit_code == 0, r.output
    (stats,) = json.loads(r.output)["models"]
    for backend in ("onednn", "cudnn"):
        coverage = stats["backends"][backend]
        assert coverage["covered_pct"] >= 95.0, (backend, coverage["not_covered"])
    assert stats["macs"] == hf_models.linear_macs("llama", 1) + hf_models.attention_macs("llama", 1, STEP.past)
