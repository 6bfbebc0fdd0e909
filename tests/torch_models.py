"""Small transformer models exported by torch.onnx.export (TorchScript exporter): real exporter
output, with the shape subgraphs, Mod-based slicing and causal masks that exporter writes."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

D_MODEL, HEADS, SEQ = 32, 4, 16


class Encoder(nn.Module):
    """nn.TransformerEncoderLayer, batch first. ``is_causal`` is passed explicitly: left to its
    default the tracer turns it into a tensor and the export fails inside MultiheadAttention."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, 2 * D_MODEL, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x, is_causal=False)


class GptBlock(nn.Module):
    """A GPT-2 style pre-LN decoder block: causal SDPA and an erf-GELU MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D_MODEL), nn.LayerNorm(D_MODEL)
        self.qkv, self.proj = nn.Linear(D_MODEL, 3 * D_MODEL), nn.Linear(D_MODEL, D_MODEL)
        self.fc, self.out = nn.Linear(D_MODEL, 4 * D_MODEL), nn.Linear(4 * D_MODEL, D_MODEL)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


MODELS = {"encoder": Encoder, "gpt": GptBlock}


def export(name: str, opset: int, out_dir: Path, dynamic: bool = False) -> Path:
    """The model exported at ``opset`` with the TorchScript exporter (the dynamo exporter needs
    onnxscript, which is not installed), input ``x`` of shape 1×SEQ×D_MODEL; with ``dynamic``,
    batch and sequence length are symbolic (``batch``, ``seq``)."""
    path = out_dir / f"{name}{opset}{'-dyn' if dynamic else ''}.onnx"
    if not path.exists():
        torch.manual_seed(0)
        module = MODELS[name]().eval()
        axes = {"x": {0: "batch", 1: "seq"}, "y": {0: "batch", 1: "seq"}} if dynamic else None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
            torch.onnx.export(module, (torch.randn(1, SEQ, D_MODEL),), str(path), opset_version=opset,
                              dynamo=False, input_names=["x"], output_names=["y"], dynamic_axes=axes)
    return path
